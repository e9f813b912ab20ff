#!/usr/bin/env bash
# Quickstart 2: set up, build, and run the test suite.
# Usage: bash scripts/test.sh [--slow] [--sanitize]
#   default     the fast tier (what CI runs)
#   --slow      also the slow tier (long training and sweep runs)
#   --sanitize  build with ASan+UBSan into build-asan/ and run the tests there
# The tests of `import tpusim` run in ctest too (Python.*): /usr/bin/python3 -m pytest python/tests
# with PYTHONPATH=build/python (the sanitizer build has no Python module).
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

bash scripts/setup.sh --with-reference --with-browser --with-reports
build_dir=build
if ((sanitize)); then
  bash scripts/build.sh --sanitize
  build_dir=build-asan
  # OpenMPI's own allocations, never freed, are not tpusim's leaks (tests/sanitizer/).
  export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizer/lsan_suppressions.txt:print_suppressions=0"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
else
  bash scripts/build.sh
fi

ctest_args=(--test-dir "$build_dir" --output-on-failure -j "$(nproc)")
if ((!slow)); then
  ctest_args+=(-LE slow)
fi
ctest "${ctest_args[@]}"
