#!/usr/bin/env bash
# Configures and builds tpusim into build/ (or build-asan/ with --sanitize), the way a user or a
# packager builds it (CMAKE_BUILD_TYPE=Release), with warnings as errors because this script is
# what developers and CI use (plain `cmake` builds leave -Werror off: TPUSIM_WERROR).
# Usage: bash scripts/build.sh [--sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DTPUSIM_WERROR=ON)
if [[ "${1:-}" == "--sanitize" ]]; then
  build_dir=build-asan
  cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPUSIM_WERROR=ON -DTPUSIM_SANITIZE=ON)
fi
cmake -S . -B "$build_dir" "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
