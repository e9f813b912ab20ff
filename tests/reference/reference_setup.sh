# tests/reference/reference_setup.sh: the start every fp64 reference script shares, sourced with
# the script's name, its binary argument and the Python modules it needs:
#   source "$(dirname "$0")/reference_setup.sh" run_eval_reference "${1:-}" "torch, numpy"
# It sets `here` (this folder), `root` (the checkout), `tpusim` (the binary, default
# build/sim/tpusim, relative to the checkout when not found as given), `python` (Debian's
# /usr/bin/python3, which sees python3-torch; TPUSIM_REFERENCE_PYTHON overrides it) and `work` (a
# temporary directory removed on exit). Exits 2 without a binary, 77 (ctest: skipped) when the
# interpreter cannot import the modules (bash scripts/setup.sh --with-reference installs them).
reference_name="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tpusim="${2:-build/sim/tpusim}"
if [[ ! -x "$tpusim" && -x "$root/$tpusim" ]]; then
  tpusim="$root/$tpusim"
fi
if [[ ! -x "$tpusim" ]]; then
  echo "$reference_name: no tpusim binary at '$tpusim' (build with bash scripts/build.sh)" >&2
  exit 2
fi
python="${TPUSIM_REFERENCE_PYTHON:-/usr/bin/python3}"
if ! OPENBLAS_NUM_THREADS=1 "$python" -c "import $3" 2>/dev/null; then
  echo "$reference_name: SKIPPED, $python cannot import $3" \
       "(install them with: bash scripts/setup.sh --with-reference)"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/tpusim_${reference_name#run_}.XXXXXX")"
trap 'rm -rf "$work"' EXIT
