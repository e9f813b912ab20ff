#!/usr/bin/env bash
# `tpusim generate` against an independent decoding loop (generate_reference.py): a tiny-llama
# trained briefly on text (the byte tokenizer, then a SentencePiece model; then tiny Mixtral and
# Qwen3-MoE models, for their Hugging Face names), exported with
# export-hf, decoded greedily for 32 tokens from the export and from the checkpoint, on one device
# and on four (batch over fsdp, heads and vocab over tensor), each compared with fp64 decoding
# of the exported weights; the SentencePiece tokenizer.model through Debian's
# python3-sentencepiece. Exits 0 only if all pass; 77 (ctest: skipped) without python3-torch or
# python3-sentencepiece (bash scripts/setup.sh --with-reference installs them).
# Usage: bash tests/reference/run_generate_reference.sh [path/to/tpusim]   (default build/sim/tpusim)
set -uo pipefail

source "$(dirname "$0")/reference_setup.sh" run_generate_reference "${1:-}" "torch, numpy, sentencepiece"
text=/usr/share/common-licenses/GPL-3  # on every Debian machine
prompt="This program is free software"
failed=()

# check <label> "<model and train overrides>" "<export overrides>" [--sentencepiece]
check() {
  local label="$1" train="$2" export_args="$3" extra="${4:-}"
  local dir="$work/$label"
  echo "=== $label"
  # shellcheck disable=SC2086  # word lists
  if ! "$tpusim" train compile_topology=v5e-1 per_device_batch_size=4 \
      max_target_length=64 steps=40 learning_rate=3e-3 dataset_type=text dataset_path="$text" \
      enable_checkpointing=true base_output_directory="$dir" run_name=r $train --quiet ||
     ! "$tpusim" export-hf "$dir/r/checkpoints/40" "$dir/hf" $export_args; then
    failed+=("$label")
    return
  fi
  local generate=(--prompt "$prompt" --max-tokens 32 --json --with-logits)
  # shellcheck disable=SC2086
  "$tpusim" generate "$dir/hf" "${generate[@]}" > "$dir/export-1-device.json" &&
    "$tpusim" generate "$dir/r/checkpoints/40" $export_args "${generate[@]}" \
      compile_topology=v5e-4 ici_tensor_parallelism=2 > "$dir/checkpoint-4-devices.json" &&
    "$python" "$here/generate_reference.py" "$dir/hf" "$dir/export-1-device.json" \
      "$dir/checkpoint-4-devices.json" --prompt "$prompt" $extra || failed+=("$label")
}

check bytes "model_name=tiny-llama" ""
# The MoE families' names (Mixtral; Qwen3-MoE with qk-norm, tied logits, unnormalized top-k).
check mixtral "model_name=tiny-moe override_model_config=true norm_topk_prob=true" ""
check qwen3-moe "model_name=tiny-qwen3 override_model_config=true decoder_block=qwen3_moe \
  num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=64" ""
spm="$work/spm"
mkdir -p "$spm"
spm_train --input="$text" --model_prefix="$spm/text" --vocab_size=200 --model_type=unigram \
  --character_coverage=1.0 > /dev/null 2>&1 || failed+=(spm_train)
check sentencepiece "model_name=tiny-llama tokenizer_path=$spm/text.model" "tokenizer_path=$spm/text.model" --sentencepiece

if ((${#failed[@]})); then
  echo "run_generate_reference: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_generate_reference: passed"
