#!/usr/bin/env bash
# Installs what tpusim needs from Debian's packages, only what is missing (quick when all present).
# Usage (as root): bash scripts/setup.sh [--with-reference] [--with-reports] [--with-browser]
#   --with-reference  also installs python3-torch (with OpenBLAS), the independent numerical
#                     reference of the tests.
#   --with-reports    also installs python3-matplotlib, for the plots of
#                     benchmarks/make_reports.py.
#   --with-browser    also installs Debian's chromium, which loads the HTML step pages in the
#                     test suite (tests/browser).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config
          libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libboost-graph-dev libeigen3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
          libsentencepiece-dev sentencepiece libgoogle-perftools-dev libdnnl-dev)
for option in "$@"; do
  case "$option" in
    --with-reference) packages+=(python3-torch python3-numpy libopenblas0) ;;
    --with-reports) packages+=(python3-matplotlib) ;;
    --with-browser) packages+=(chromium) ;;
    *) echo "setup: unknown option '$option' (known: --with-reference, --with-reports, --with-browser)" >&2; exit 2 ;;
  esac
done

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
