#!/usr/bin/env bash
# Installs what tpusim needs from Debian's packages, only what is missing (quick when all present).
# Usage (as root): bash scripts/setup.sh [--with-reference] [--with-reports] [--with-browser]
#                                        [--with-npm] [--list-packages]
#   --with-reference  also installs python3-torch (with OpenBLAS), the independent numerical
#                     reference of the tests, and python3-sentencepiece, which loads the
#                     tokenizer of an export-hf bundle in them.
#   --with-reports    also installs python3-matplotlib, for the plots of
#                     benchmarks/make_reports.py.
#   --with-browser    also installs Debian's chromium, which loads the HTML step pages in the
#                     test suite (tests/browser).
#   --with-npm        also installs node and npm (Debian's nodejs and npm, unless a node with npm
#                     is there already) and npm's @huggingface/transformers, pinned, into
#                     /var/cache/tpusim/npm (TPUSIM_NPM_CACHE), outside the checkout, without its
#                     install scripts (about 0.5 GB, mostly onnxruntime): the slow test that loads an export-hf
#                     tokenizer with its AutoTokenizer (tests/reference/transformers_js_tokenizer.mjs).
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
# Required by the tests: clang-format checks that every C++ file keeps the repository's style
# (tests/repository/clang_format.sh).
packages+=(clang-format)
list_only=0
with_npm=0
# The transformers.js release the tokenizer test was written against (npm registry, pinned).
npm_transformers="@huggingface/transformers@4.3.1"
npm_cache="${TPUSIM_NPM_CACHE:-/var/cache/tpusim/npm}"
for option in "$@"; do
  case "$option" in
    --with-reference) packages+=(python3-torch python3-numpy libopenblas0 python3-sentencepiece) ;;
    --with-reports) packages+=(python3-matplotlib) ;;
    --with-browser) packages+=(chromium) ;;
    --with-npm)
      with_npm=1
      # A node that brings its own npm (e.g. NodeSource's nodejs) conflicts with Debian's npm.
      if ! command -v npm >/dev/null 2>&1; then
        packages+=(nodejs npm)
      fi
      ;;
    --list-packages) list_only=1 ;;
    *) echo "setup: unknown option '$option' (known: --with-reference, --with-reports, --with-browser, --with-npm, --list-packages)" >&2; exit 2 ;;
  esac
done

# npm's @huggingface/transformers into the cache directory (after the packages: needs npm).
install_npm_module() {
  if [[ -f "$npm_cache/node_modules/@huggingface/transformers/package.json" ]] &&
     grep -q "\"version\": \"${npm_transformers##*@}\"" \
       "$npm_cache/node_modules/@huggingface/transformers/package.json"; then
    echo "setup: $npm_transformers present in $npm_cache"
    return
  fi
  echo "setup: npm install $npm_transformers into $npm_cache"
  mkdir -p "$npm_cache"
  # Optional dependencies stay: sharp's prebuilt binary is one, and the module does not load
  # without it.
  npm install --prefix "$npm_cache" --no-save --no-audit --no-fund --ignore-scripts \
    "$npm_transformers"
}
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
  if ((with_npm)); then
    install_npm_module
  fi
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
if ((with_npm)); then
  install_npm_module
fi
