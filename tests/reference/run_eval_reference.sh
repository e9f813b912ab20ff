#!/usr/bin/env bash
# `tpusim eval` against an independent fp64 forward pass (eval_reference.py): trains tiny-llama on
# a text for a few steps (evaluating as it goes), exports the last checkpoint with export-hf
# (float32), evaluates the export with `tpusim eval` and checks that
#   * tpusim eval of the checkpoint and of its export both equal the eval_loss train recorded
#     for that step, bitwise;
#   * the fp64 Transformers-Llama forward pass on the export's weights, over the held-out windows
#     rebuilt from the text file, gives the same loss within 1e-6 relative.
# Exits 0 when all hold, 77 (ctest: skipped) when python3-torch is not installed.
# Usage: bash tests/reference/run_eval_reference.sh [path/to/tpusim]   (default build/sim/tpusim)
set -uo pipefail

source "$(dirname "$0")/reference_setup.sh" run_eval_reference "${1:-}" "torch, numpy"

# A text from the repository (its README), held-out windows at its end.
text="$work/text.txt"
cp "$root/README.md" "$text"
# The reference numerics (double accumulation), which the 1e-6 tolerance against fp64 is for.
keys=(model_name=tiny-llama compile_topology=v5e-4 ici_fsdp_parallelism=2
      ici_tensor_parallelism=2 per_device_batch_size=1 max_target_length=32
      functional_precision=reference dataset_type=text "dataset_path=$text" eval_steps=3)
"$tpusim" train "${keys[@]}" steps=4 eval_interval=2 learning_rate=1e-2 \
  enable_checkpointing=true checkpoint_period=2 "base_output_directory=$work" run_name=r \
  "metrics_file=$work/metrics.jsonl" --quiet || { echo "FAIL tpusim train"; exit 1; }
"$tpusim" export-hf "$work/r/checkpoints/4" "$work/hf" || { echo "FAIL export-hf"; exit 1; }
"$tpusim" eval "$work/r/checkpoints/4" "${keys[@]}" --json >"$work/checkpoint.json" ||
  { echo "FAIL tpusim eval of the checkpoint"; exit 1; }
"$tpusim" eval "$work/hf" "${keys[@]}" --json >"$work/hf.json" ||
  { echo "FAIL tpusim eval of the export"; exit 1; }
failed=0
"$python" - "$work" <<'PY' || failed=1
import json, sys
work = sys.argv[1]
recorded = [json.loads(line) for line in open(f"{work}/metrics.jsonl")]
train = next(r["eval_loss"] for r in recorded if r["step"] == 4)
for name in ("checkpoint", "hf"):
    loss = json.load(open(f"{work}/{name}.json"))["loss"]
    same = loss == train
    print(f"{'ok  ' if same else 'FAIL'} tpusim eval of the {name} {loss!r} vs train's eval_loss "
          f"at step 4 {train!r} (bitwise)")
    if not same:
        sys.exit(1)
PY
"$python" "$here/eval_reference.py" "$work/hf" "$text" "$work/hf.json" || failed=1
if [[ $failed -ne 0 ]]; then
  echo "run_eval_reference: FAILED"
  exit 1
fi
echo "run_eval_reference: passed"
