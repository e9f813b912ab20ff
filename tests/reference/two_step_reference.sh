# shellcheck shell=bash
# shellcheck disable=SC2154  # work, tpusim, python, here, placement: set by the sourcing script
# tests/reference/two_step_reference.sh: two tpusim training steps against the fp64 reference,
# sourced by run_torch_reference.sh and run_deepseek4_all_reference.sh (after reference_setup.sh,
# with `placement` and `failed` set):
#   check_two_steps <label> "<tpusim overrides>" "<torch_reference.py options>"
# Run a trains steps 1 and 2 (a checkpoint after each, the learning rate constant:
# cosine_learning_rate_final_fraction 1); run b resumes from a's step-1 checkpoint and dumps step
# 2. The reference checks step 1, then step 2 from its own fp64 state after step 1 (so the second
# step routes with the reference's updated router biases: deepseek4's routed_bias_update_rate
# 0.001, which the overrides must set); run b's step-2 weights must equal run a's byte for byte
# (resume); and the same dumps must FAIL against the reference with the bias update's sign flipped
# (the check sees the update).
check_two_steps() {
  local label="$1" overrides="$2" options="$3" runs="$work/$1-runs"
  overrides="$overrides cosine_learning_rate_final_fraction=1.0 enable_checkpointing=true \
checkpoint_period=1 base_output_directory=$runs"
  local two=(max_target_length=16 steps=2 functional_precision=reference)
  echo "=== $label: tpusim train ${two[*]} $overrides (runs a and b)"
  # shellcheck disable=SC2086  # the overrides are a word list
  if ! "$tpusim" train $overrides run_name=a "${placement[@]}" "${two[@]}" \
    --dump "$work/$label-1" --quiet || ! mkdir -p "$runs/b/checkpoints" ||
    ! cp -r "$runs/a/checkpoints/1" "$runs/b/checkpoints/" ||
    ! "$tpusim" train $overrides run_name=b "${placement[@]}" "${two[@]}" \
      --dump "$work/$label-2" --quiet; then
    echo "=== $label: tpusim train failed"
    failed+=("$label")
    return
  fi
  if ! cmp -s "$runs/a/checkpoints/2/model.safetensors" "$work/$label-2/updated/model.safetensors"
  then
    echo "=== $label: the resumed run's step 2 differs from the uninterrupted run's"
    failed+=("$label resume")
  fi
  # shellcheck disable=SC2086  # the options are a word list
  if "$python" "$here/torch_reference.py" "$work/$label-1" --second-step "$work/$label-2" \
    --learning-rate 3e-5 $options --routed-bias-update-rate 0.001; then
    echo "=== $label: passed"
  else
    echo "=== $label: FAILED"
    failed+=("$label")
  fi
  # shellcheck disable=SC2086
  if "$python" "$here/torch_reference.py" "$work/$label-1" --second-step "$work/$label-2" \
    --learning-rate 3e-5 $options --routed-bias-update-rate -0.001 > "$work/$label-flipped.log"
  then
    echo "=== $label: the reference with the update's sign flipped passed too: the check does not see it"
    failed+=("$label flipped")
  else
    echo "=== $label: the reference with the update's sign flipped fails, as it must: \
$(grep -c '^FAIL' "$work/$label-flipped.log") comparisons"
  fi
}
