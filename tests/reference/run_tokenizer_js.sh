#!/usr/bin/env bash
# The tokenizer of an export-hf bundle through npm's @huggingface/transformers AutoTokenizer
# (transformers_js_tokenizer.mjs), from the local directory: the byte-level tokenizer and
# SentencePiece unigram and BPE models, each against tpusim's own encoding of a few texts.
# Exits 0 only if all agree; 77 (ctest: skipped) when node or the module is absent
# (bash scripts/setup.sh --with-npm installs them into /var/cache/tpusim/npm, TPUSIM_NPM_CACHE).
# Usage: bash tests/reference/run_tokenizer_js.sh [path/to/tpusim]   (default build/sim/tpusim)
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tpusim="${1:-build/sim/tpusim}"
if [[ ! -x "$tpusim" && -x "$root/$tpusim" ]]; then
  tpusim="$root/$tpusim"
fi
module="${TPUSIM_NPM_CACHE:-/var/cache/tpusim/npm}/node_modules/@huggingface/transformers/dist/transformers.node.mjs"
if ! command -v node > /dev/null || [[ ! -f "$module" ]]; then
  echo "run_tokenizer_js: SKIPPED, no node or no $module" \
       "(install them with: bash scripts/setup.sh --with-npm)"
  exit 77
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tpusim_tokenizer_js.XXXXXX")"
trap 'rm -rf "$work"' EXIT
text=/usr/share/common-licenses/GPL-3  # on every Debian machine
failed=()

# check <label> "<tokenizer_path=... or empty>" <text> ...
check() {
  local label="$1" tokenizer="$2"
  shift 2
  local dir="$work/$label"
  echo "=== $label"
  # shellcheck disable=SC2086  # an empty or one-word list
  if ! "$tpusim" train model_name=tiny-llama compile_topology=v5e-1 per_device_batch_size=1 \
      max_target_length=16 steps=1 dataset_type=text dataset_path="$text" $tokenizer \
      enable_checkpointing=true base_output_directory="$dir" run_name=r --quiet ||
     ! "$tpusim" export-hf "$dir/r/checkpoints/1" "$dir/hf" $tokenizer 2> /dev/null; then
    failed+=("$label")
    return
  fi
  local cases="["
  for sample in "$@"; do
    local ids
    ids="$("$tpusim" generate "$dir/hf" --prompt "$sample" --max-tokens 1 --json 2> /dev/null |
           /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["prompt_tokens"])')" ||
      { failed+=("$label"); return; }
    cases+="$(/usr/bin/python3 -c 'import json, sys; print(json.dumps({"text": sys.argv[1], "ids": json.loads(sys.argv[2])}))' "$sample" "$ids"),"
  done
  echo "${cases%,}]" > "$dir/cases.json"
  node "$here/transformers_js_tokenizer.mjs" "$module" "$dir/hf" "$dir/cases.json" ||
    failed+=("$label")
}

ascii=("This program is free software" "the GNU General Public License, version 3."
       "you can redistribute it and/or modify it")
check bytes "" "${ascii[@]}" "caf$(printf '\xc3\xa9') and  two  spaces" "tab	and"$'\n'"newline"
for type in unigram bpe; do
  mkdir -p "$work/spm-$type"
  spm_train --input="$text" --model_prefix="$work/spm-$type/text" --vocab_size=200 \
    --model_type="$type" --character_coverage=1.0 > /dev/null 2>&1 || failed+=("spm_train $type")
  check "sentencepiece-$type" "tokenizer_path=$work/spm-$type/text.model" "${ascii[@]}"
done

if ((${#failed[@]})); then
  echo "run_tokenizer_js: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_tokenizer_js: passed"
