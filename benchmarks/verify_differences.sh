#!/usr/bin/env bash
# The largest relative L2 difference `tpusim train --verify` reports (over 3 steps, loss, every
# gradient, every updated weight and moment) between sharded meshes and the unsharded reference,
# for each of the run's numerics: what verify_tolerance's defaults (sim/train/trainer.cpp) are set
# against. Prints a markdown table (reports/training.md, "--verify").
# Usage: bash benchmarks/verify_differences.sh [build/sim/tpusim]
set -euo pipefail
binary="${1:-build/sim/tpusim}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(max_target_length=32 steps=3 learning_rate=1e-3 dataset_type=synthetic num_threads=2
        per_device_batch_size=1 compile_topology=v5e-4 verify_tolerance=1 --verify --quiet)
meshes=("tiny-llama ici_fsdp_parallelism=1 ici_data_parallelism=4"
        "tiny-llama ici_fsdp_parallelism=4"
        "tiny-llama ici_fsdp_parallelism=2 ici_tensor_parallelism=2"
        "tiny-llama ici_fsdp_parallelism=1 ici_tensor_parallelism=4"
        "tiny-llama ici_fsdp_parallelism=2 ici_context_parallelism=2"
        "tiny-llama compile_topology_num_slices=2 ici_fsdp_parallelism=4"
        "tiny-gpt3 ici_fsdp_parallelism=2 ici_tensor_parallelism=2"
        "tiny-moe ici_fsdp_parallelism=2 ici_expert_parallelism=2"
        "tiny-mla ici_fsdp_parallelism=2 ici_tensor_parallelism=2"
        "tiny-qwen3 ici_fsdp_parallelism=4")
worst() {
  /usr/bin/python3 -c "import json,sys; print('%.1e' % max(json.loads(l)['verify_max_rel_diff'] for l in open(sys.argv[1])))" "$1"
}
echo "| model and mesh | fast, fp32 | reference, fp32 | fast, bf16 matmuls |"
echo "|---|---|---|---|"
for mesh in "${meshes[@]}"; do
  read -r model axes <<<"$mesh"
  cells=()
  for numerics in "functional_precision=fast functional_dtype=float32" \
                  "functional_precision=reference functional_dtype=float32" \
                  "functional_precision=fast functional_dtype=bfloat16_matmul"; do
    # shellcheck disable=SC2086
    "$binary" train "model_name=$model" $axes $numerics "${common[@]}" \
      "metrics_file=$work/metrics.jsonl" >/dev/null
    cells+=("$(worst "$work/metrics.jsonl")")
    rm -f "$work/metrics.jsonl"
  done
  echo "| $model $axes | ${cells[0]} | ${cells[1]} | ${cells[2]} |"
done
