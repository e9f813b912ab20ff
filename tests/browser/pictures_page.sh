#!/usr/bin/env bash
# Issue 42's pictures in headless Chromium (Debian's `chromium`): the estimate page of one device of
# llama3.1-70b on v6e-256, a compare page and an explore page. Each page gets pictures_check.js
# injected after its own script (every lane's drawn ops sum to its busy time within 1%, legends,
# one colour per resource, hover shows FLOPs and bytes, both configurations listed, the explore
# x axis within 1.2 x usable HBM); each must also not scroll sideways at 400 px. Saves screenshots
# at 1400 and 400 px wide (the README's, under reports/images/, come from this script).
# Usage: pictures_page.sh TPUSIM_BINARY OUTPUT_DIR
set -euo pipefail
tpusim=$1
out=$2
mkdir -p "$out"
test_name=pictures_page
source "$(dirname "$0")/chromium.sh"
check_script="$(dirname "$0")/pictures_check.js"
failures=0

# load NAME KIND: the page $out/NAME.html with the check injected, at 1400 and at 400 px.
load() {
  local name=$1 kind=$2 width dom
  local checked="$out/$name.checked.html"
  python3 - "$out/$name.html" "$check_script" "$kind" "$checked" << 'PY'
import sys
page, script, kind, out = sys.argv[1:]
html = open(page, encoding="utf-8").read()
check = open(script, encoding="utf-8").read()
html = html.replace("<body>", '<body data-check-page="%s">' % kind, 1)
html = html.replace("</body>", "<script>\n%s\n</script>\n</body>" % check, 1)
open(out, "w", encoding="utf-8").write(html)
PY
  for width in 1400 400; do
    if ! dom=$("$browser" "${browser_flags[@]}" --window-size=$width,1000 --dump-dom \
      "file://$checked" 2> "$out/$name.$width.console.txt"); then
      echo "pictures_page: $name: chromium failed" >&2
      failures=$((failures + 1))
      continue
    fi
    if ! grep -q 'data-rendered="1"' <<< "$dom" || grep -q Uncaught "$out/$name.$width.console.txt"; then
      echo "pictures_page: $name at $width px: script error: $(grep -m1 Uncaught "$out/$name.$width.console.txt")" >&2
      failures=$((failures + 1))
      continue
    fi
    local verdict
    # The body tag's attribute (no check run: no attribute, a failure).
    verdict=$(grep -o '<body[^>]*>' <<< "$dom" | head -n 1 | grep -o 'data-check="[^"]*"' || true)
    if [[ "$verdict" != 'data-check="ok"' ]]; then
      echo "pictures_page: $name at $width px: $verdict" >&2
      failures=$((failures + 1))
    fi
    local scroll view
    local body
    body=$(grep -o '<body[^>]*>' <<< "$dom" | head -n 1)
    scroll=$(grep -o 'data-scroll-width="[0-9]*"' <<< "$body" | grep -o '[0-9]*' || echo 999999)
    view=$(grep -o 'data-view-width="[0-9]*"' <<< "$body" | grep -o '[0-9]*' || echo 0)
    if ((scroll > view)); then
      echo "pictures_page: $name at $width px: the page is $scroll px wide, the window $view" >&2
      failures=$((failures + 1))
    fi
    # Tall enough for the op profile and the roofline (a screenshot is the window).
    "$browser" "${browser_flags[@]}" --window-size=$width,$((width > 1000 ? 2600 : 3400)) --hide-scrollbars \
      --screenshot="$out/$name-$width.png" "file://$out/$name.html" 2> /dev/null
    [[ -s "$out/$name-$width.png" ]] || { echo "pictures_page: $name: no screenshot" >&2; failures=$((failures + 1)); }
  done
  echo "pictures_page: $name checked ($out/$name-1400.png, $out/$name-400.png)"
}

"$tpusim" estimate model_name=llama3.1-70b compile_topology=v6e-256 --html "$out/estimate.html" > /dev/null
load estimate step
# Gradient accumulation: the other microbatches repeat the simulated one.
"$tpusim" estimate model_name=llama2-7b compile_topology=v5p-32 gradient_accumulation_steps=4 \
  --html "$out/estimate_accumulation.html" > /dev/null
load estimate_accumulation step
"$tpusim" compare model_name=llama3.1-70b compile_topology=v6e-256 \
  --a "remat_policy=full" --b "remat_policy=full per_device_batch_size=2" \
  --html "$out/compare.html" > /dev/null
load compare compare
"$tpusim" explore model_name=llama2-7b compile_topology=v5p-32 --top 5 --html "$out/explore.html" \
  > /dev/null
load explore explore

if ((failures > 0)); then
  echo "pictures_page: $failures failure(s)" >&2
  exit 1
fi
echo "pictures_page: every page passes its checks at 1400 and 400 px"
