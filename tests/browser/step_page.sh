#!/usr/bin/env bash
# Loads tpusim's HTML pages (estimate --html for four runs, explore --html for one search) in headless Chromium (Debian's `chromium`) and checks that each
# renders (its script ran to the end: <body data-rendered="1">, no uncaught error on the console)
# and shows every lane its run uses; saves a screenshot of each.
# Usage: step_page.sh TPUSIM_BINARY OUTPUT_DIR
set -euo pipefail
tpusim=$1
out=$2
mkdir -p "$out"
test_name=step_page
source "$(dirname "$0")/chromium.sh"
failures=0

# check NAME "LANE|LANE|..." ARGS...: estimate with --html, load the page, look for the lanes.
check() {
  local name=$1 lanes=$2
  shift 2
  local page="$out/$name.html"
  "$tpusim" estimate "$@" --html "$page" > /dev/null
  local dom
  if ! dom=$("$browser" "${browser_flags[@]}" --dump-dom "file://$page" 2> "$out/$name.console.txt"); then
    echo "step_page: $name: chromium failed: $(tail -n 3 "$out/$name.console.txt")" >&2
    failures=$((failures + 1))
  fi
  if ! grep -q 'data-rendered="1"' <<< "$dom"; then
    echo "step_page: $name: the page's script did not finish" >&2
    failures=$((failures + 1))
  fi
  if grep -q "Uncaught" "$out/$name.console.txt"; then
    echo "step_page: $name: script error: $(grep -m1 Uncaught "$out/$name.console.txt")" >&2
    failures=$((failures + 1))
  fi
  local lane
  IFS='|' read -ra wanted <<< "$lanes"
  for lane in "${wanted[@]}"; do
    if ! grep -q "data-lane=\"$lane" <<< "$dom"; then
      echo "step_page: $name: no lane starting '$lane'" >&2
      failures=$((failures + 1))
    fi
  done
  "$browser" "${browser_flags[@]}" --window-size=1100,900 --screenshot="$out/$name.png" \
    "file://$page" 2> /dev/null
  [[ -s "$out/$name.png" ]] || { echo "step_page: $name: no screenshot" >&2; failures=$((failures + 1)); }
  echo "step_page: $name checked ($out/$name.png)"
}

# A v7x run with SparseCore collective offload (on by default there) and the chiplet pair.
check v7x_offload "TensorCore|SparseCore|Host link" \
  model_name=llama3.1-70b compile_topology=tpu7x-256 per_device_batch_size=2 \
  remat_policy=custom decoder_layer_input=offload
# Multislice over DCN with tensor parallelism inside each slice.
check multislice "TensorCore|ICI fsdp|ICI tensor|DCN" \
  model_name=llama2-70b compile_topology=v5e-256 compile_topology_num_slices=2 \
  ici_fsdp_parallelism=64 ici_tensor_parallelism=4 dcn_data_parallelism=2
# GPU nodes: NVLink inside a node, InfiniBand between nodes.
check gpu_nodes "GPU SMs|NVLink fsdp|InfiniBand" \
  hardware=gpu compile_topology=a3 compile_topology_num_slices=2 model_name=llama2-7b \
  ici_fsdp_parallelism=8 dcn_fsdp_parallelism=2 attention=cudnn_flash_te
# A pipeline over DCN: a lane per stage (which microbatch and repeat, and the bubble).
check pipeline "TensorCore|Stage 0|Stage 3|DCN stage" \
  model_name=llama3.1-70b compile_topology=v5e-256 compile_topology_num_slices=4 \
  dcn_pipeline_parallelism=4 ici_fsdp_parallelism=-1 num_pipeline_microbatches=8 \
  num_layers_per_pipeline_stage=20 per_device_batch_size=2 max_target_length=2048

# Red-team item 17: a value echoed into the page's JSON that opens a comment and a script
# ("<!--<script>") swallowed the page's own script; the JSON escapes every '<'.
check hostile_run_name "TensorCore" \
  model_name=tiny-llama compile_topology=v5e-4 'run_name=<!--<script>'

# The explore page: the top N and a scatter of the evaluated candidates.
explore_page="$out/explore.html"
"$tpusim" explore model_name=llama2-7b compile_topology=v5p-32 --top 5 --html "$explore_page" \
  > /dev/null
dom=$("$browser" "${browser_flags[@]}" --dump-dom "file://$explore_page" 2> "$out/explore.console.txt")
grep -q 'data-rendered="1"' <<< "$dom" || { echo "step_page: explore: script did not finish" >&2; failures=$((failures + 1)); }
if grep -q "Uncaught" "$out/explore.console.txt"; then
  echo "step_page: explore: script error: $(grep -m1 Uncaught "$out/explore.console.txt")" >&2
  failures=$((failures + 1))
fi
samples=$(grep -o 'class="sample"' <<< "$dom" | wc -l)
rings=$(grep -o 'class="top-ring"' <<< "$dom" | wc -l)
if ((samples < 10 || rings != 5)); then
  echo "step_page: explore: $samples candidates and $rings top-N rings drawn (want >= 10 and 5)" >&2
  failures=$((failures + 1))
fi
"$browser" "${browser_flags[@]}" --window-size=1100,1000 --screenshot="$out/explore.png" \
  "file://$explore_page" 2> /dev/null
echo "step_page: explore checked: $samples candidates, $rings top rings ($out/explore.png)"

if ((failures > 0)); then
  echo "step_page: $failures failure(s)" >&2
  exit 1
fi
echo "step_page: all pages render with their lanes"
