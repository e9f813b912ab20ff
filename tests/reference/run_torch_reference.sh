#!/usr/bin/env bash
# One tpusim training step against the independent fp64 PyTorch reference (torch_reference.py):
# loss, every gradient, the gradient norm and clipping factor, and the AdamW update, for the tiny
# llama, gpt3 (also with a chunked head, num_vocab_tiling) and moe presets (capacity and dropless,
# the latter also on a deliberately unbalanced router), all in MaxText's conventions (no run-time
# query scale outside GPT-3 and qk-norm), tiny-qwen3 (qk-norm); then the Hugging Face export and
# import of tiny-llama, tiny-gpt3 and tiny-qwen3; one step of a circular pipeline (2 stages); and
# deepseek4-tiny (also with mHC, and two steps with the router bias's update) and
# qwen3-custom-30b-a3b (tiny) as train computes them.
# Exits 0 only if every model passes; 77 (ctest: skipped) when python3-torch is not installed
# (bash scripts/setup.sh --with-reference installs it).
# Usage: bash tests/reference/run_torch_reference.sh [path/to/tpusim]   (default build/sim/tpusim)
set -uo pipefail

source "$(dirname "$0")/reference_setup.sh" run_torch_reference "${1:-}" "torch, numpy"
# shellcheck source=tests/reference/two_step_reference.sh
source "$here/two_step_reference.sh"

# The reference numerics (double accumulation), which the 1e-5 tolerance against fp64 is for; the
# default fast kernels are checked against them in tests/sim/functional/fast_kernels_test.cpp.
placement=(compile_topology=v5e-1 per_device_batch_size=2)
common=(max_target_length=16 steps=1 functional_precision=reference)
failed=()

# check <label> "<tpusim overrides>" "<reference options>"
check() {
  local label="$1" overrides="$2" options="$3"
  local dump="$work/$label"
  echo "=== $label: tpusim train ${common[*]} $overrides"
  # shellcheck disable=SC2086  # the overrides and options are word lists
  if ! "$tpusim" train $overrides "${placement[@]}" "${common[@]}" --dump "$dump" --quiet; then
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
# One pipelined step: 4 layers on 2 stages of 1 layer, 2 repeats (circular), with data=2 beside
# them, 4 microbatches of 2 sequences (a global batch of 8; the reference reads the dumped batch).
placement=(compile_topology=v5e-4 per_device_batch_size=2)
check tiny-llama-pipeline "model_name=tiny-llama override_model_config=true \
  base_num_decoder_layers=4 ici_pipeline_parallelism=2 ici_data_parallelism=2 \
  ici_fsdp_parallelism=1 num_pipeline_microbatches=4 \
  num_layers_per_pipeline_stage=1" ""
placement=(compile_topology=v5e-1 per_device_batch_size=2)
# qk-norm (the query and key RMSNorm of Qwen3), tied logits, rope 1e6, epsilon 1e-6.
check tiny-qwen3 "model_name=tiny-qwen3" "--eps 1e-6 --rope-max-timescale 1e6"
# gemma2's switches on tiny-llama: attention logits soft-capped at 0.5 (below the logits' size,
# so tanh is far from linear), logits tied, divided by sqrt(64) and soft-capped at 1.
check tiny-llama-soft-caps "model_name=tiny-llama override_model_config=true \
  logits_via_embedding=true normalize_embedding_logits=true attn_logits_soft_cap=0.5 \
  final_logits_soft_cap=1.0" \
  "--normalize-embedding-logits --attn-logits-soft-cap 0.5 --final-logits-soft-cap 1.0"
# ... and with the chunked head (num_vocab_tiling): every chunk's loss reads its logits capped.
check tiny-llama-soft-caps-vocab-tiling "model_name=tiny-llama override_model_config=true \
  logits_via_embedding=true normalize_embedding_logits=true attn_logits_soft_cap=0.5 \
  final_logits_soft_cap=1.0 num_vocab_tiling=4" \
  "--normalize-embedding-logits --attn-logits-soft-cap 0.5 --final-logits-soft-cap 1.0"
# The chunked head (num_vocab_tiling) against the same unchunked reference.
check tiny-gpt3-vocab-tiling "model_name=tiny-gpt3 num_vocab_tiling=4" ""
# MoE, dense dispatch with capacity: each expert takes at most tokens*k/E choices, the rest drop.
# tiny-moe's mixtral block weights its chosen experts by a softmax over their logits (MaxText
# moe.py get_topk), i.e. renormalized, whatever norm_topk_prob says.
check tiny-moe-capacity "model_name=tiny-moe sparse_matmul=false capacity_factor=1.0" \
  "--top-k 2 --renormalize-top-k --capacity-factor 1.0"
# MoE dropless (the default, sparse_matmul): every choice counts, from the initial router ...
check tiny-moe-dropless "model_name=tiny-moe" "--top-k 2 --renormalize-top-k"
# ... and from a router that sends every token to experts 0 and 1 (2x their balanced share).
if "$tpusim" train model_name=tiny-moe "${placement[@]}" "${common[@]}" --dump "$work/moe-initial" --quiet &&
  "$python" "$here/imbalance_router.py" "$work/moe-initial/initial" "$work/moe-unbalanced"; then
  check tiny-moe-dropless-unbalanced "model_name=tiny-moe load_parameters_path=$work/moe-unbalanced" \
    "--top-k 2 --renormalize-top-k --expect-expert-load 2.0"
else
  echo "=== tiny-moe-dropless-unbalanced: could not make the unbalanced checkpoint"
  failed+=(tiny-moe-dropless-unbalanced)
fi

# deepseek4-tiny as train computes it (docs/reference/deepseek4.md): 2 layers of sliding-window
# attention (window 8 of 16 tokens) with sinks, mHC off, no hash layers, the router on raw logits;
# and qwen3-custom-30b-a3b's latent MoE layer at tiny size. Both against MaxText's definitions.
check deepseek4-tiny "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=2 compress_ratios=[0,0] mhc_expansion_rate=1 first_num_hash_layers=0 \
  routed_score_func='' norm_topk_prob=true routed_bias=false load_balance_loss_weight=0 \
  mlp_activations_limit=-1 sliding_window_size=8 vocab_size=256" \
  "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k"
# ... with heavily compressed attention (compress_ratios entries above 4: MaxText's
# DeepseekV4HCACompressor): layers 1 and 2 pool blocks of 8 tokens (2 of 16) that join a window
# of 4 and the sinks in one softmax, rotated at compressed_rope_max_timescale.
check deepseek4-tiny-hca "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,8,8] mhc_expansion_rate=1 first_num_hash_layers=0 \
  routed_score_func='' norm_topk_prob=true routed_bias=false load_balance_loss_weight=0 \
  mlp_activations_limit=-1 sliding_window_size=4 vocab_size=256" \
  "--eps 1e-6 --sliding-window 4 --top-k 4 --renormalize-top-k --compress-ratios 0,8,8"
# ... and the preset's HCA ratio, 128, over 256 tokens (2 blocks) with the preset's window of 32,
# its hash-routed first layer, sqrtsoftplus scores and clip.
saved_common=("${common[@]}")
common=(max_target_length=256 steps=1 functional_precision=reference)
check deepseek4-tiny-hca128 "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,128,128] mhc_expansion_rate=1 \
  first_num_hash_layers=1 routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=false \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=32 vocab_size=256" \
  "--eps 1e-6 --sliding-window 32 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
  --first-num-hash-layers 1 --routed-score-func sqrtsoftplus --compress-ratios 0,128,128"
# ... and the preset's compressed sparse attention (compress ratio 4: overlapping windows, the
# indexer's top 16 of up to 64 blocks per query) beside an HCA layer of 128 and a window layer,
# in the preset's order of kinds, over 256 tokens. The same dump against the reference whose
# queries swap their last pick for the next-ranked block (--perturb-topk) must fail: the check
# sees which blocks the indexer picks.
csa_options="--eps 1e-6 --sliding-window 32 --top-k 4 --renormalize-top-k \
  --mlp-activations-limit 0.3 --first-num-hash-layers 1 --routed-score-func sqrtsoftplus \
  --compress-ratios 0,4,128 --indexer-topk 16"
check deepseek4-tiny-csa "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,4,128] mhc_expansion_rate=1 \
  first_num_hash_layers=1 routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=false \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=32 vocab_size=256" \
  "$csa_options"
# shellcheck disable=SC2086  # the options are a word list
if [[ -d "$work/deepseek4-tiny-csa" ]] &&
  "$python" "$here/torch_reference.py" "$work/deepseek4-tiny-csa" --learning-rate 3e-5 \
    $csa_options --perturb-topk > "$work/csa-perturbed.log" 2>&1; then
  echo "=== deepseek4-tiny-csa: the reference with --perturb-topk passed too: the check does not see it"
  failed+=("deepseek4-tiny-csa --perturb-topk")
else
  echo "=== deepseek4-tiny-csa: the reference with --perturb-topk fails, as it must: \
$(grep -c "^FAIL" "$work/csa-perturbed.log") comparisons"
fi
# ... and the preset's alternation of kinds (CSA, HCA, CSA, HCA after the window layer, as in
# compress_ratios [0, 0, 4, 128, 4, 128, ...]), which train computes in MaxText's order, each run
# of layers a region of its own (model/builder/layer_plan.h LayerOrder::kMaxText: csa_moe_layer_0,
# hca16_moe_layer_0, csa_moe_layer_1, hca16_moe_layer_1), over 32 tokens: HCA pools 2 blocks of
# 16, CSA 8 overlapping blocks of 4 of which each query keeps the indexer's top 3. The same dump
# against the reference that computes layers 2 and 3 in swapped order (--swap-layers) must fail.
common=(max_target_length=32 steps=1 functional_precision=reference)
order_options="--eps 1e-6 --sliding-window 4 --top-k 4 --renormalize-top-k \
  --mlp-activations-limit 0.3 --first-num-hash-layers 1 --routed-score-func sqrtsoftplus \
  --compress-ratios 0,4,16,4,16 --indexer-topk 3"
check deepseek4-tiny-alternating "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=5 compress_ratios=[0,4,16,4,16] mhc_expansion_rate=1 \
  first_num_hash_layers=1 routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=false \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=4 indexer_topk=3 \
  vocab_size=256" "$order_options"
# shellcheck disable=SC2086  # the options are a word list
if [[ -d "$work/deepseek4-tiny-alternating" ]] &&
  "$python" "$here/torch_reference.py" "$work/deepseek4-tiny-alternating" --learning-rate 3e-5 \
    $order_options --swap-layers 2,3 > "$work/alternating-swapped.log" 2>&1; then
  echo "=== deepseek4-tiny-alternating: the reference with --swap-layers passed too: the check \
does not see the order"
  failed+=("deepseek4-tiny-alternating --swap-layers")
else
  echo "=== deepseek4-tiny-alternating: the reference with layers 2 and 3 swapped fails, as it \
must: $(grep -c "^FAIL" "$work/alternating-swapped.log") comparisons"
fi
common=("${saved_common[@]}")
# ... and with the preset's SwiGLU clip (mlp_activations_limit, here 0.3, which cuts about 12% of
# the routed experts' gate entries and 23% of their up entries; the reference prints the shares)
# and its first layer hash-routed (first_num_hash_layers: MaxText's tid2eid table, zeros from
# initialization, so every choice goes to expert 0).
check deepseek4-tiny-clip-hash "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,0,0] mhc_expansion_rate=1 first_num_hash_layers=1 \
  routed_score_func='' norm_topk_prob=true routed_bias=false load_balance_loss_weight=0 \
  mlp_activations_limit=0.3 sliding_window_size=8 vocab_size=256" \
  "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
  --first-num-hash-layers 1"
# ... and with the preset's router score, routed_score_func sqrtsoftplus (MaxText's GateLogit:
# the top-k of sqrt(softplus(logit)), weighted by a softmax over the chosen scores), with the clip
# and a hash-routed first layer as above.
check deepseek4-tiny-sqrtsoftplus "model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,0,0] mhc_expansion_rate=1 first_num_hash_layers=1 \
  routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=false \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=8 vocab_size=256" \
  "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
  --first-num-hash-layers 1 --routed-score-func sqrtsoftplus"
# ... and with the preset's routed_bias (MaxText's GateLogit bias: the top-k of score + bias,
# weighted by the scores alone), from a checkpoint whose biases bias_router.py set to
# 0.05 x (e % 5 - 2), which changes the experts of about half the tokens (the reference prints
# how many; a zero bias would check nothing). The bias's update (routed_bias_update_rate) is off
# here (one step checks the bias as a parameter) and on in the two-step case below.
deepseek4_bias="model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,0,0] mhc_expansion_rate=1 first_num_hash_layers=1 \
  routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=true routed_bias_update_rate=0 \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=8 vocab_size=256"
# shellcheck disable=SC2086  # the overrides are a word list
if "$tpusim" train $deepseek4_bias "${placement[@]}" "${common[@]}" --dump "$work/bias-initial" \
  --quiet && "$python" "$here/bias_router.py" "$work/bias-initial/initial" "$work/biased"; then
  check deepseek4-tiny-routed-bias "$deepseek4_bias load_parameters_path=$work/biased" \
    "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
    --first-num-hash-layers 1 --routed-score-func sqrtsoftplus --routed-bias"
  # ... and with the preset's load-balance loss (load_balance_loss_weight 1e-4): each routed
  # layer's loss, from the softmax of score + bias, added to the step's loss (their mean), its
  # gradient reaching the scores and the bias (docs/reference/deepseek4.md section 6).
  check deepseek4-tiny-load-balance "${deepseek4_bias/load_balance_loss_weight=0/load_balance_loss_weight=0.0001} \
    load_parameters_path=$work/biased" \
    "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
    --first-num-hash-layers 1 --routed-score-func sqrtsoftplus --routed-bias \
    --load-balance-loss-weight 1e-4"
  # ... and with the preset's routed_bias_update_rate (0.001: MaxText's train.py adds moe.py's
  # calculate_load_balance_updates to each router bias after the optimizer step, rate x sign(T k /
  # E - the expert's choices over the batch)) beside the load-balance loss, over two steps
  # (two_step_reference.sh: the second routes with the updated biases; resume; the update's sign
  # flipped must fail).
  update="${deepseek4_bias/routed_bias_update_rate=0/routed_bias_update_rate=0.001}"
  check_two_steps deepseek4-tiny-bias-update \
    "${update/load_balance_loss_weight=0/load_balance_loss_weight=0.0001} \
    load_parameters_path=$work/biased" \
    "--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k --mlp-activations-limit 0.3 \
    --first-num-hash-layers 1 --routed-score-func sqrtsoftplus --routed-bias \
    --load-balance-loss-weight 1e-4"
else
  echo "=== deepseek4-tiny-routed-bias: could not make the biased checkpoint"
  failed+=(deepseek4-tiny-routed-bias)
fi
# ... and with mHC (the preset's 4 residual streams and 20 Sinkhorn iterations; MaxText mhc.py),
# with the clip, hash-routed first layer and sqrtsoftplus scores as above, from a checkpoint whose
# mHC scalars and biases mhc_checkpoint.py moved away from their initial values (at initialization
# the residual matrices are within about 1% of uniform, which would check little of Sinkhorn).
# The same dump must then FAIL against the reference without mHC's mixing (a plain residual on the
# streams' sum) and against the reference with no Sinkhorn iterations: the check sees both.
deepseek4_mhc="model_name=deepseek4-tiny override_model_config=true \
  base_num_decoder_layers=3 compress_ratios=[0,0,0] mhc_expansion_rate=4 first_num_hash_layers=1 \
  routed_score_func=sqrtsoftplus norm_topk_prob=true routed_bias=false \
  load_balance_loss_weight=0 mlp_activations_limit=0.3 sliding_window_size=8 vocab_size=256"
mhc_options="--eps 1e-6 --sliding-window 8 --top-k 4 --renormalize-top-k \
  --mlp-activations-limit 0.3 --first-num-hash-layers 1 --routed-score-func sqrtsoftplus \
  --mhc-expansion-rate 4"
# shellcheck disable=SC2086  # the overrides are a word list
if "$tpusim" train $deepseek4_mhc "${placement[@]}" "${common[@]}" --dump "$work/mhc-initial" \
  --quiet && "$python" "$here/mhc_checkpoint.py" "$work/mhc-initial/initial" "$work/mhc-moved"; then
  check deepseek4-tiny-mhc "$deepseek4_mhc load_parameters_path=$work/mhc-moved" "$mhc_options"
  for ablation in "--ignore-mhc" "--sinkhorn-iterations 0"; do
    # shellcheck disable=SC2086
    if "$python" "$here/torch_reference.py" "$work/deepseek4-tiny-mhc" --learning-rate 3e-5 \
      $mhc_options $ablation > "$work/mhc-ablation.log"; then
      echo "=== deepseek4-tiny-mhc: the reference with $ablation passed too: the check does not see it"
      failed+=("deepseek4-tiny-mhc $ablation")
    else
      echo "=== deepseek4-tiny-mhc: the reference with $ablation fails, as it must: \
$(grep -c '^FAIL' "$work/mhc-ablation.log") comparisons ($(grep '^FAIL loss' "$work/mhc-ablation.log"))"
    fi
  done
else
  echo "=== deepseek4-tiny-mhc: could not make the mHC checkpoint"
  failed+=(deepseek4-tiny-mhc)
fi
check qwen3-custom-tiny "model_name=qwen3-custom-30b-a3b override_model_config=true \
  base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 \
  base_num_decoder_layers=2 attention_output_dim=32 moe_expert_input_dim=32 num_experts=4 \
  num_experts_per_tok=2 base_moe_mlp_dim=32 base_mlp_dim=32 vocab_size=256" \
  "--eps 1e-6 --rope-max-timescale 1e7 --top-k 2 --renormalize-top-k"

# Hugging Face export and import (sim/train/hf_names.h): the weights of a --dump written by
# export-hf, read back by Transformers' names in torch (hf_reference.py), give tpusim's loss and
# the MaxText-convention logits; loaded by load_parameters_path they are the same weights again.
# check_hf <label> <model> [hf_reference.py options]
check_hf() {
  local label="$1" model="$2" options="${3:-}"
  local dump="$work/$label" hf="$work/$label-hf" imported="$work/$label-imported"
  echo "=== $label: export-hf, then load_parameters_path=<export>"
  if "$tpusim" train "model_name=$model" "${placement[@]}" "${common[@]}" --dump "$dump" --quiet &&
    "$tpusim" export-hf "$dump/initial" "$hf" &&
    "$tpusim" train "model_name=$model" "load_parameters_path=$hf" "${placement[@]}" "${common[@]}" \
      --dump "$imported" --quiet &&
    # shellcheck disable=SC2086  # the options are a word list
    "$python" "$here/hf_reference.py" "$hf" "$dump" --import-dump "$imported" $options; then
    echo "=== $label: passed"
  else
    echo "=== $label: FAILED"
    failed+=("$label")
  fi
}
check_hf hf-llama tiny-llama
check_hf hf-gpt2 tiny-gpt3
check_hf hf-qwen3 tiny-qwen3 "--eps 1e-6 --rope-max-timescale 1e6"

if ((${#failed[@]})); then
  echo "run_torch_reference: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_torch_reference: all models match the fp64 reference"
