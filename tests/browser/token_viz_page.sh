#!/usr/bin/env bash
# Trains tiny-llama for a few steps on a text with token_viz_file, loads the token-probability page
# in headless Chromium (Debian's `chromium`, launched as step_page.sh does) and checks that it
# renders (its script ran to the end, no uncaught error), shows a heatmap token per target of
# each sampled sequence with more than one colour and a hover text, a step per evaluation and the
# loss curves; saves a screenshot (OUTPUT_DIR/token_viz.png).
# Usage: token_viz_page.sh TPUSIM_BINARY OUTPUT_DIR
set -euo pipefail
tpusim=$1
out=$2
mkdir -p "$out"
test_name=token_viz_page
source "$(dirname "$0")/chromium.sh"
failures=0
fail() { echo "token_viz_page: $*" >&2; failures=$((failures + 1)); }

page="$out/token_viz.html"
rm -f "$page"
# 4 sequences of 64 tokens, evaluations at steps 3, 6 and 8.
"$tpusim" train model_name=tiny-llama compile_topology=v5e-4 ici_fsdp_parallelism=2 \
  ici_tensor_parallelism=2 per_device_batch_size=1 max_target_length=64 steps=8 \
  eval_interval=3 eval_steps=1 learning_rate=0.01 dataset_type=text \
  dataset_path=/usr/share/common-licenses/GPL-3 token_viz_file="$page" --quiet
[[ -s "$page" ]] || { echo "token_viz_page: no page written" >&2; exit 1; }
if grep -Eq '<(script|link|img)[^>]+(src|href)=' "$page"; then
  fail "the page loads something (it must be self-contained)"
fi

dom=$("$browser" "${browser_flags[@]}" --dump-dom "file://$page" 2> "$out/token_viz.console.txt") ||
  fail "chromium exited with $?: $(tail -n 3 "$out/token_viz.console.txt")"
grep -q 'data-rendered="1"' <<< "$dom" || fail "the page's script did not finish"
if grep -q "Uncaught" "$out/token_viz.console.txt"; then
  fail "script error: $(grep -m1 Uncaught "$out/token_viz.console.txt")"
fi
# The heatmap's spans, whatever the order Chromium serializes their attributes in (colours as
# rgb()); `|| true`: a count of 0 is a failure reported below, not the end of the script.
spans=$(grep -o '<span class="tok"[^>]*>' <<< "$dom" || true)
tokens=$(grep -c 'class="tok"' <<< "$spans" || true)
colours=$(grep -o 'background: [^;"]*' <<< "$spans" | sort -u | wc -l || true)
tips=$(grep -c 'data-tip="[^"]*p = [01]\.[0-9]*' <<< "$spans" || true)
options=$(grep -o '<option' <<< "$dom" | wc -l || true)
curves=$(grep -o '<polyline' <<< "$dom" | wc -l || true)
((tokens == 4 * 64)) || fail "$tokens heatmap tokens (want 4 sequences x 64)"
((colours >= 5)) || fail "$colours distinct token colours (want >= 5)"
((tips == tokens)) || fail "$tips of $tokens tokens show their probability on hover"
((options == 3)) || fail "$options steps in the selector (want 3 evaluations)"
((curves == 2)) || fail "$curves loss curves (want training and eval)"

"$browser" "${browser_flags[@]}" --window-size=1000,1100 --screenshot="$out/token_viz.png" \
  "file://$page" 2> /dev/null
[[ -s "$out/token_viz.png" ]] || fail "no screenshot"
if ((failures > 0)); then
  echo "token_viz_page: $failures failure(s)" >&2
  exit 1
fi
echo "token_viz_page: $tokens tokens in $colours colours, $options steps, $curves curves ($out/token_viz.png)"
