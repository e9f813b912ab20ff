#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ with clang, libFuzzer, ASan and UBSan into build-fuzz/, and
# runs one for a given time. The repository is not modified: the seed corpus fuzz/corpus/<target>
# is read, new inputs go to the work corpus build-fuzz/corpus/<target> (kept between runs, so a
# second run continues where the first stopped), crash/timeout/leak/oom reproducers to
# build-fuzz/artifacts/<target>/, the log to build-fuzz/logs/<target>-<time>.log. One process on
# one core (no -fork/-jobs). Ends with a summary line: time, executions, exec/s, coverage
# (cov/ft), corpus size, new units, reproducers written.
#
# Usage:
#   bash scripts/fuzz.sh TARGET [SECONDS] [libFuzzer flags...]   # TARGET: config cli checkpoint dataset
#   bash scripts/fuzz.sh --build                                   # only configure and build
#   bash scripts/fuzz.sh --replay TARGET FILE...                   # rerun reproducers, with the message
# Examples:
#   bash scripts/fuzz.sh config 1800
#   bash scripts/fuzz.sh checkpoint 600 -use_value_profile=1
#   bash scripts/fuzz.sh --replay config build-fuzz/artifacts/config/crash-0123abcd
# Environment: JOBS (build parallelism, default 2), FUZZ_TIMEOUT (seconds one input may take
# before libFuzzer calls it a hang, default 20), FUZZ_RSS_MB (memory limit, default 2048).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-fuzz
targets=(config cli checkpoint dataset)

build() {
  # The sanitizer flags of scripts/build.sh --sanitize (TPUSIM_SANITIZE), at -O2 for speed, plus
  # libFuzzer's coverage instrumentation (TPUSIM_LIBFUZZER). Tests, benchmarks and MPI are off.
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPUSIM_SANITIZE=ON -DTPUSIM_LIBFUZZER=ON \
    -DTPUSIM_BUILD_TESTS=OFF -DTPUSIM_BUILD_BENCHMARKS=OFF -DTPUSIM_WITH_MPI=OFF >/dev/null
  cmake --build "$build_dir" -j "${JOBS:-2}" --target "${@/%/_fuzz}"
}

known_target() {
  local target
  for target in "${targets[@]}"; do
    [[ "$1" == "$target" ]] && return 0
  done
  echo "fuzz.sh: unknown target '$1' (one of: ${targets[*]})" >&2
  exit 2
}

case "${1:-}" in
  "" | -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  --build)
    build "${targets[@]}"
    exit 0
    ;;
  --replay)
    known_target "${2:?--replay TARGET FILE...}"
    target=$2
    shift 2
    build "$target"
    exec "$build_dir/fuzz/${target}_fuzz" -runs=1 "$@"
    ;;
esac

target=$1
known_target "$target"
seconds=${2:-600}
shift $(($# >= 2 ? 2 : 1))
build "$target"

corpus=$build_dir/corpus/$target
artifacts=$build_dir/artifacts/$target
mkdir -p "$corpus" "$artifacts" "$build_dir/logs"
log=$build_dir/logs/$target-$(date -u +%Y%m%dT%H%M%SZ).log
before=$(find "$artifacts" -type f | wc -l)

# From the repository root: the cli seeds name configs/ and fuzz/corpus/config/ files.
status=0
"$build_dir/fuzz/${target}_fuzz" "$corpus" "fuzz/corpus/$target" -dict="fuzz/$target.dict" \
  -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" \
  -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" >"$log" 2>&1 ||
  status=$?

last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
final_stat() { grep -E "^stat::$1:" "$log" | awk '{print $2}' || true; }
runs=$(final_stat number_of_executed_units)
elapsed=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | awk '{print $5}' || true)
cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | awk '{print $2}' || true)
ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | awk '{print $2}' || true)
corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last" | awk '{print $2}' || true)
new_units=$(final_stat new_units_added)
eps=$(final_stat average_exec_per_sec)
found=$(($(find "$artifacts" -type f | wc -l) - before))
echo "fuzz $target: ${elapsed:-?} s, ${runs:-?} executions (${eps:-?}/s), cov ${cov:-?} ft ${ft:-?}," \
  "corpus ${corp:-?}, ${new_units:-?} new units, $found new reproducer(s) in $artifacts," \
  "libFuzzer exit $status; log $log"
exit "$status"
