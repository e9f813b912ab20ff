#!/usr/bin/env bash
# Configures and builds tpusim into build/ (or build-asan/ with --sanitize).
# Usage: bash scripts/build.sh [--sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [[ "${1:-}" == "--sanitize" ]]; then
  build_dir=build-asan
  cmake_args+=(-DTPUSIM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
fi
cmake -S . -B "$build_dir" "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
