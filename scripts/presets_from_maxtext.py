#!/usr/bin/env python3
"""Writes configs/models/<name>.yml for every MaxText text-decoder preset whose decoder block
tpusim builds, key by key as MaxText's configs/models/<name>.yml has it (the fixture
tests/data/maxtext/maxtext_presets.tsv), values written as MaxText writes them.

An existing preset keeps its header comment (what the model is, its sources) and the keys tpusim
adds that MaxText's preset does not have (marked "tpusim:"). Presets of decoder blocks tpusim does
not build yet are listed in configs/maxtext/presets_not_built.tsv instead: `model_name=` one of
them exits 2 naming the block.

Usage: python3 scripts/presets_from_maxtext.py [--check]
  --check  write nothing; exit 1 when a preset file differs from what would be written
"""
import collections
import csv
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/data/maxtext/maxtext_presets.tsv"
MODELS = ROOT / "configs/models"
# Decoder blocks the model builder (model/builder) lays out.
BUILT_BLOCKS = {"llama2", "qwen2", "mistral", "mixtral", "gemma", "gemma2", "gemma3", "gpt3", "qwen3",
                "qwen3_moe", "deepseek", "gpt_oss", "gemma4", "gemma4_small", "llama4", "olmo3",
                "qwen3_next", "qwen3_5", "envy", "deepseek4", "qwen3_custom_moe"}


def read_presets():
    presets = collections.OrderedDict()
    with open(FIXTURE, newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            presets.setdefault(row["preset"], []).append((row["key"], row["value"]))
    return presets


def existing_parts(path):
    """Header comment lines and the tpusim-only keys (with their comment) of a preset file."""
    header, extra = [], []
    if not path.exists():
        return header, extra
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines) and (lines[index].startswith("#") or not lines[index].strip()):
        if lines[index].startswith("#"):
            header.append(lines[index])
        index += 1
    in_extra = False
    for line in lines[index:]:
        if line.startswith("# tpusim:"):
            in_extra = True
        if in_extra:
            extra.append(line)
    return header, extra


def render(name, items, header, extra):
    if not header:
        header = [f"# {name}: MaxText's configs/models/{name}.yml, key by key."]
    lines = header + ["# Keys and values as MaxText's preset has them (scripts/presets_from_maxtext.py).", ""]
    lines += [f"{key}: {value}" for key, value in items]
    if extra:
        lines += [""] + extra
    return "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    differing, skipped = [], []
    for name, items in read_presets().items():
        settings = dict(items)
        block = settings.get("decoder_block", '"llama2"').strip("\"'")
        if block not in BUILT_BLOCKS:
            skipped.append(f"{name} (decoder_block {block})")
            continue
        if settings.get("use_multimodal", "false").lower() == "true":
            encoder = settings.get("vision_encoder_block", "?").strip("\"'")
            skipped.append(f"{name} (multimodal: the {encoder} vision encoder)")
            continue
        path = MODELS / f"{name}.yml"
        header, extra = existing_parts(path)
        header = [line for line in header
                  if not line.startswith("# Keys and values as MaxText's preset")]
        text = render(name, items, header, extra)
        if path.exists() and path.read_text() == text:
            continue
        differing.append(name)
        if not check:
            path.write_text(text)
    table = "# MaxText presets tpusim does not build yet, and why (scripts/presets_from_maxtext.py)\n"
    table += "preset\twhat is missing\n" + "".join(
        f"{entry.split(' (')[0]}\t{entry.split(' (')[1].rstrip(')')}\n" for entry in skipped)
    table_path = ROOT / "configs/maxtext/presets_not_built.tsv"
    if not table_path.exists() or table_path.read_text() != table:
        differing.append(table_path.name)
        if not check:
            table_path.write_text(table)
    print(f"{'differ' if check else 'written'}: {len(differing)} ({', '.join(differing)})")
    print(f"not built yet: {len(skipped)} ({', '.join(skipped)})")
    return 1 if check and differing else 0


if __name__ == "__main__":
    sys.exit(main())
