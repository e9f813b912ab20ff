#!/usr/bin/env bash
# Every DeepSeek-V4 piece `tpusim train` builds, together, over two steps against the fp64
# PyTorch reference (torch_reference.py): 3 layers of deepseek4-tiny with mHC (4 streams, 20
# Sinkhorn iterations), heavily compressed attention in layers 1 and 2 (ratio 8 over 16 tokens,
# window 4, the sinks), a hash-routed first layer, sqrtsoftplus router scores, the SwiGLU clip,
# the selection bias with its update after the optimizer step (routed_bias_update_rate 0.001)
# and the load-balance loss (1e-4). From a checkpoint whose router biases bias_router.py and whose
# mHC scalars and biases mhc_checkpoint.py moved (a check from initialization would see little of
# either). Two steps, resume and the flipped update as in two_step_reference.sh. Slow (about a
# minute on a loaded machine); exits 77 (ctest: skipped) without python3-torch.
# Usage: bash tests/reference/run_deepseek4_all_reference.sh [path/to/tpusim]
set -uo pipefail

source "$(dirname "$0")/reference_setup.sh" run_deepseek4_all_reference "${1:-}" "torch, numpy"
# shellcheck source=tests/reference/two_step_reference.sh
source "$here/two_step_reference.sh"

placement=(compile_topology=v5e-1 per_device_batch_size=2)
failed=()
model="model_name=deepseek4-tiny override_model_config=true base_num_decoder_layers=3 \
  compress_ratios=[0,8,8] mhc_expansion_rate=4 first_num_hash_layers=1 \
  routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=true \
  routed_bias_update_rate=0.001 load_balance_loss_weight=0.0001 mlp_activations_limit=0.3 \
  sliding_window_size=4 vocab_size=256"
# shellcheck disable=SC2086  # the model is a word list
if "$tpusim" train $model "${placement[@]}" max_target_length=16 steps=1 \
  functional_precision=reference --dump "$work/initial" --quiet &&
  "$python" "$here/bias_router.py" "$work/initial/initial" "$work/biased" &&
  "$python" "$here/mhc_checkpoint.py" "$work/biased" "$work/moved"; then
  check_two_steps deepseek4-tiny-all "$model load_parameters_path=$work/moved" \
    "--eps 1e-6 --sliding-window 4 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
    --first-num-hash-layers 1 --routed-score-func sqrtsoftplus --routed-bias \
    --load-balance-loss-weight 1e-4 --mhc-expansion-rate 4 --compress-ratios 0,8,8"
else
  echo "=== deepseek4-tiny-all: could not make the moved checkpoint"
  failed+=(deepseek4-tiny-all)
fi

if ((${#failed[@]})); then
  echo "run_deepseek4_all_reference: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_deepseek4_all_reference: every DeepSeek-V4 piece matches the fp64 reference over two steps"
