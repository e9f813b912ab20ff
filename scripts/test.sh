#!/usr/bin/env bash
# Quickstart 2: set up, build, and run the test suite.
# Usage: bash scripts/test.sh [--slow] [--sanitize]
#   default     the fast tier (what CI runs)
#   --slow      also the slow tier (long training and sweep runs)
#   --sanitize  build with ASan+UBSan into build-asan/ and run the tests there
set -euo pipefail
cd "$(dirname "$0")/.."

slow=0
sanitize=0
for arg in "$@"; do
  case "$arg" in
    --slow) slow=1 ;;
    --sanitize) sanitize=1 ;;
    *) echo "test.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh --with-reference --with-browser
build_dir=build
if ((sanitize)); then
  bash scripts/build.sh --sanitize
  build_dir=build-asan
else
  bash scripts/build.sh
fi

ctest_args=(--test-dir "$build_dir" --output-on-failure -j "$(nproc)")
if ((!slow)); then
  ctest_args+=(-LE slow)
fi
ctest "${ctest_args[@]}"
