#!/usr/bin/env bash
# Installs what tpusim needs from Debian's packages, only what is missing (quick when all present).
# Usage (as root): bash scripts/setup.sh [--with-reference] [--with-reports] [--with-browser]
#                                        [--list-packages]
#   --with-reference  also installs python3-torch (with OpenBLAS), the independent numerical
#                     reference of the tests.
#   --with-reports    also installs python3-matplotlib, for the plots of
#                     benchmarks/make_reports.py.
#   --with-browser    also installs Debian's chromium, which loads the HTML step pages in the
#                     test suite (tests/browser).
#   --list-packages   prints the packages these options name, one a line, and installs nothing
#                     (read by scripts/dependency_audit.py).
#
# Packages are installed without their Recommends, so every package the build or the tests use
# must be named here or be in the Depends closure of one named here; the dependency audit
# (scripts/dependency_audit.py, run by the test suite) checks that against what the build really
# read and linked.
set -euo pipefail

# Required: the compiler, build tools and the libraries every build links or includes.
packages=(build-essential cmake ninja-build pkg-config python3
          libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libboost-graph-dev libeigen3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev sentencepiece)
# Required: the Python module `import tpusim` (python/), built by default with pybind11 against
# Debian's python3 (whose headers are python3-dev's; pybind11-dev does not depend on them), and
# its tests, run by Debian's /usr/bin/python3 -m pytest (DataFrames through python3-pandas).
packages+=(pybind11-dev python3-pybind11 python3-dev python3-pytest python3-pandas)
# Optional to CMake (the build goes on without them), installed because they make tpusim whole:
# OpenMPI (train under mpirun), tcmalloc (explore's allocator), oneDNN (train's GEMMs; found by
# its header and library, so its OpenCL GPU runtime, which it only recommends, is not needed).
packages+=(libopenmpi-dev openmpi-bin libgoogle-perftools-dev libdnnl-dev)
# Optional to CMake: ccache, the compiler cache CMake puts in front of the compiler when found
# (TPUSIM_CCACHE), so a rebuild of sources compiled before (another checkout of the same commit,
# a CI rerun, a branch switch) reuses the objects instead of recompiling ~600 files.
packages+=(ccache)
list_only=0
for option in "$@"; do
  case "$option" in
    --with-reference) packages+=(python3-torch python3-numpy libopenblas0) ;;
    --with-reports) packages+=(python3-matplotlib) ;;
    --with-browser) packages+=(chromium) ;;
    --list-packages) list_only=1 ;;
    *) echo "setup: unknown option '$option' (known: --with-reference, --with-reports, --with-browser, --list-packages)" >&2; exit 2 ;;
  esac
done
if ((list_only)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: need root to install packages (run as root or with sudo)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
