#!/usr/bin/env bash
# One tpusim training step against the independent fp64 PyTorch reference (torch_reference.py):
# loss, every gradient, the gradient norm and clipping factor, and the AdamW update, for the tiny
# llama, gpt3 and moe presets. Exits 0 only if every model passes; 77 (ctest: skipped) when
# python3-torch is not installed (bash scripts/setup.sh --with-reference installs it).
# Usage: bash tests/reference/run_torch_reference.sh [path/to/tpusim]   (default build/sim/tpusim)
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tpusim="${1:-build/sim/tpusim}"
if [[ ! -x "$tpusim" && -x "$root/$tpusim" ]]; then
  tpusim="$root/$tpusim"
fi
if [[ ! -x "$tpusim" ]]; then
  echo "run_torch_reference: no tpusim binary at '$tpusim' (build with bash scripts/build.sh)" >&2
  exit 2
fi
# Only Debian's interpreter sees python3-torch (not a pyenv python3 on PATH).
python="${TPUSIM_REFERENCE_PYTHON:-/usr/bin/python3}"
if ! OPENBLAS_NUM_THREADS=1 "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "run_torch_reference: SKIPPED, $python cannot import torch and numpy" \
       "(install them with: bash scripts/setup.sh --with-reference)"
  exit 77
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tpusim_torch_reference.XXXXXX")"
trap 'rm -rf "$work"' EXIT

common=(compile_topology=v5e-1 per_device_batch_size=2 max_target_length=16 steps=1)
failed=()

# check <label> "<tpusim overrides>" "<reference options>"
check() {
  local label="$1" overrides="$2" options="$3"
  local dump="$work/$label"
  echo "=== $label: tpusim train ${common[*]} $overrides"
  # shellcheck disable=SC2086  # the overrides and options are word lists
  if ! "$tpusim" train $overrides "${common[@]}" --dump "$dump" --quiet; then
    echo "=== $label: tpusim train failed"
    failed+=("$label")
    return
  fi
  # shellcheck disable=SC2086
  if "$python" "$here/torch_reference.py" "$dump" --learning-rate 3e-5 $options; then
    echo "=== $label: passed"
  else
    echo "=== $label: FAILED"
    failed+=("$label")
  fi
}

check tiny-llama "model_name=tiny-llama" ""
check tiny-gpt3 "model_name=tiny-gpt3" ""
# MoE "dropless" (sparse_matmul=true) is not checked: the program sizes each expert's buffer at
# the average tokens*k/E (what MaxText's FLOP count and the performance model assume), so the
# functional engine drops overflow choices where a real ragged matmul would not.
# MoE, dense dispatch with capacity: each expert takes at most tokens*k/E choices, the rest drop.
check tiny-moe-capacity "model_name=tiny-moe sparse_matmul=false capacity_factor=1.0" \
  "--top-k 2 --capacity-factor 1.0"

if ((${#failed[@]})); then
  echo "run_torch_reference: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_torch_reference: all models match the fp64 reference"
