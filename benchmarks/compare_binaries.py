#!/usr/bin/env python3
"""Checks that two tpusim binaries print the same results over a broad set of configs.

For refactors that must not change behaviour (speed work): every row of the published calibration
set (with and without the perf switches), every model preset on several slices, and a few hundred
seeded random mixes of presets x slices x remat policies x meshes (tensor, context, expert,
sequence, multislice over DCN) x perf switches (collective_matmul, sparse_core_collective_offload,
attention, quantization, gradient accumulation, vocab tiling, scan_layers). For each config it
compares, byte for byte: `estimate --json`, the Chrome trace (`--trace`), the per-op profile
(`--profile 100000`), `program` (the per-device program as text) and, once, `validate` on the
published set. A config that fails (bad mesh, ...) must fail the same way in both.

Also every public recipe of validation/recipes_public.json as pasted (its args, topology and XLA
flags: `estimate --json`), and a set of small `tpusim train` runs over the trained families,
meshes, remat policies, gradient accumulation, functional dtypes, --verify, checkpoints and a text
dataset: their printed losses, metrics files and checkpoint tensors must match bit for bit (the
wall-clock fields, tokens/s, are left out).

With --explore it compares `explore` instead (nothing else): for each of the 27 published rows,
the searched keys are removed from the row's args (as benchmarks/make_reports.py explore does) and
both binaries run `explore <row> --global-batch-size <row's> --top 1 --json`; their top 1 must be
the same per-device program (`tpusim program` of each top 1's args, read without the mesh axes'
names, so two spellings of one program agree) with the same step time, bit for bit.
--explore-top 10 searches the top 10 instead and also requires every row's args and step time to
be the same. Each row's search time is printed for both. --explore-405b adds the exhaustive llama3.1-405b search on
tpu7x-18432 (minutes on a loaded machine). --explore-top5 instead checks the new binary alone: on
each published row no two of `explore --top 5`'s rows print the same program (as above).
--explore-rows V4-1,R-12 limits either to those rows; --explore-cache FILE keeps each binary's
results (keyed by its path, size and mtime), so a slow parent runs once (--explore-only-old fills
the file for the parent alone, e.g. while the new binary builds).

Example:
  python3 benchmarks/compare_binaries.py old/tpusim build/sim/tpusim [--random 300] [--jobs 2]
      [--no-train] [--no-recipes]
  python3 benchmarks/compare_binaries.py old/tpusim build/sim/tpusim --explore [--explore-405b]
prints the differing configs (and the first differing lines) and exits 1 if there is any.
"""
import argparse
import concurrent.futures
import csv
import difflib
import hashlib
import json
import re
import itertools
import os
import random
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join(ROOT, "validation", "published.csv")
RECIPES = os.path.join(ROOT, "validation", "recipes_public.json")

# Small training runs, one per line (the sizes of the train tests: a few seconds in all).
TINY = "per_device_batch_size=1 max_target_length=32 steps=3"
SMALL_DIMS = ("override_model_config=true base_num_decoder_layers=2 base_emb_dim=64 "
              "base_num_query_heads=2 base_num_kv_heads=1 head_dim=32 base_mlp_dim=128 "
              "vocab_size=256")
TRAIN_RUNS = [
    f"model_name=tiny-llama compile_topology=v5e-4 {TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 {TINY} --verify",
    f"model_name=tiny-llama compile_topology=v5e-8 ici_fsdp_parallelism=4 ici_data_parallelism=2 "
    f"{TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 remat_policy=minimal "
    f"gradient_accumulation_steps=2 {TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 functional_dtype=bfloat16_matmul {TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 num_vocab_tiling=4 {TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 dataset_type=text "
    f"dataset_path=/usr/share/common-licenses/GPL-3 {TINY}",
    f"model_name=tiny-moe compile_topology=v5e-8 ici_expert_parallelism=2 {TINY}",
    f"model_name=tiny-moe compile_topology=v5e-4 {TINY} --verify",
    f"model_name=tiny-mla compile_topology=v5e-4 {TINY}",
    f"model_name=tiny-qwen3 compile_topology=v5e-4 {TINY}",
    f"model_name=tiny-gpt3 compile_topology=v5e-4 {TINY}",
    f"model_name=gemma-2b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=gemma2-2b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=mistral-7b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=qwen3-8b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=mixtral-8x7b {SMALL_DIMS} num_experts=4 compile_topology=v5e-4 {TINY}",
    f"model_name=qwen3-30b-a3b {SMALL_DIMS} num_experts=4 base_moe_mlp_dim=64 "
    f"compile_topology=v5e-4 {TINY}",
    # Refused the same way (exit 2, same message).
    f"model_name=gemma3-4b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=deepseek3-tiny compile_topology=v5e-4 {TINY}",
    f"model_name=olmo3-7b {SMALL_DIMS} compile_topology=v5e-4 {TINY}",
    f"model_name=llama4-17b-16e {SMALL_DIMS} num_experts=4 compile_topology=v5e-4 {TINY}",
    f"model_name=tiny-llama compile_topology=v5e-4 dtype=bfloat16 {TINY}",
]

MODELS = ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "llama2-7b", "mixtral-8x7b",
          "deepseek3-671b", "gemma2-9b", "gpt3-175b", "qwen3-30b-a3b", "qwen3-8b", "gpt-oss-20b",
          "mistral-7b", "deepseek2-16b", "gemma-7b", "tiny-llama", "tiny-moe", "tiny-mla",
          "tiny-gpt3", "qwen3-235b-a22b", "mixtral-8x22b"]
SLICES = ["v5e-256", "v5p-128", "v6e-256", "tpu7x-128", "tpu7x-18432", "v4-128", "v5p-8", "v6e-8",
          "tpu7x-2048"]
REMATS = ["full", "minimal", "save_qkv_proj", "save_dot_except_mlpwi", "minimal_offloaded",
          "qkv_proj_offloaded", "none", "save_out_proj"]
MESHES = ["", "ici_tensor_parallelism=4", "ici_tensor_parallelism=2 ici_context_parallelism=2",
          "ici_expert_parallelism=4", "ici_tensor_sequence_parallelism=2", "ici_data_parallelism=2",
          "compile_topology_num_slices=2 dcn_data_parallelism=2",
          "compile_topology_num_slices=4 dcn_fsdp_parallelism=4 dcn_data_parallelism=1"]
PERF = ["", "collective_matmul=false", "sparse_core_collective_offload=on",
        "sparse_core_collective_offload=off", "attention=dot_product", "quantization=int8",
        "gradient_accumulation_steps=4", "per_device_batch_size=4", "max_target_length=2048",
        "num_vocab_tiling=4", "scan_layers=false", "attention=flash sa_block_q=1024"]


def published_rows():
    with open(PUBLISHED) as table:
        return [row["args"] for row in csv.DictReader(table)]


def configs(random_count):
    """The override lines to compare, in a fixed order (seeded)."""
    lines = []
    for args in published_rows():
        lines.append(args)
        for extra in ["collective_matmul=false", "sparse_core_collective_offload=on",
                      "sparse_core_collective_offload=off", "gradient_accumulation_steps=2"]:
            lines.append(args + " " + extra)
    for model, slice_name in itertools.product(MODELS, SLICES):
        lines.append(f"model_name={model} compile_topology={slice_name} per_device_batch_size=1 "
                     "max_target_length=4096 remat_policy=full")
    rng = random.Random(7)
    for _ in range(random_count):
        parts = [f"model_name={rng.choice(MODELS)}", f"compile_topology={rng.choice(SLICES)}",
                 f"remat_policy={rng.choice(REMATS)}",
                 f"per_device_batch_size={rng.choice([1, 2, 3])}",
                 f"max_target_length={rng.choice([512, 1024, 4096, 8192])}",
                 rng.choice(MESHES), rng.choice(PERF), rng.choice(PERF)]
        values = {}
        for part in " ".join(parts).split():
            key, value = part.split("=", 1)
            values[key] = value  # the last choice of a key wins
        lines.append(" ".join(f"{key}={value}" for key, value in values.items()))
    return lines


def run(binary, args, workdir):
    result = subprocess.run([binary] + args, capture_output=True, text=True, cwd=workdir)
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def outputs(binary, line):
    """Everything the binary prints for one config."""
    args = line.split()
    with tempfile.TemporaryDirectory() as workdir:
        trace = os.path.join(workdir, "trace.json")
        texts = {
            "estimate --json": run(binary, ["estimate"] + args + ["--json", "--trace", trace],
                                   workdir),
            "estimate --profile": run(binary, ["estimate"] + args + ["--profile", "100000"],
                                      workdir),
            "program": run(binary, ["program"] + args, workdir),
        }
        texts["trace"] = open(trace).read() if os.path.exists(trace) else "(no trace)"
    return texts


def recipe_lines():
    """Each public recipe as `estimate` arguments: its topology, args and XLA flags."""
    with open(RECIPES) as handle:
        recipes = json.load(handle)
    return [["estimate", f"compile_topology={recipe['topology']}",
             f"compile_topology_num_slices={recipe['num_slices']}", *recipe["args"],
             "--xla-flags", " ".join(recipe["xla_flags"]), "--json"] for recipe in recipes]


def recipe_outputs(binary, args):
    env = {key: value for key, value in os.environ.items()
           if key not in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")}
    result = subprocess.run([binary] + args, capture_output=True, text=True, env=env)
    return {"estimate --json": f"exit {result.returncode}\n{result.stdout}{result.stderr}"}


WALL_CLOCK = re.compile(r"\s+[0-9.]+ tok/s| in [0-9.]+ s\b")


def without_wall_clock(text):
    """A metrics line or state.json without the fields that time the run (tokens_per_s)."""
    def strip(value):
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items()
                    if key not in ("tokens_per_s", "fields_sha256", "metrics")}
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value
    try:
        return json.dumps(strip(json.loads(text)), sort_keys=True)
    except json.JSONDecodeError:
        return text


def train_outputs(binary, line):
    """What a small training run prints and writes: its output without tokens/s, the metrics
    file without tokens_per_s, and every checkpoint file (tensors by hash, state.json without
    the metrics it copies)."""
    with tempfile.TemporaryDirectory() as workdir:
        args = ["train"] + line.split() + ["metrics_file=metrics.jsonl",
                                           "base_output_directory=out", "run_name=run",
                                           "enable_checkpointing=true", "checkpoint_period=2"]
        texts = {"train": WALL_CLOCK.sub("", run(binary, args, workdir))}
        metrics = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(metrics):
            with open(metrics) as handle:
                texts["metrics"] = "\n".join(without_wall_clock(row) for row in handle)
        for folder, _, files in sorted(os.walk(os.path.join(workdir, "out"))):
            for name in sorted(files):
                path = os.path.join(folder, name)
                key = os.path.relpath(path, workdir)
                with open(path, "rb") as handle:
                    data = handle.read()
                texts[key] = (without_wall_clock(data.decode()) if name.endswith(".json")
                              else hashlib.sha256(data).hexdigest())
    return texts


def compare(old, new, line, produce=None):
    """The differences between the two binaries' outputs, and whether the first succeeded."""
    produce = produce or outputs
    first, second = produce(old, line), produce(new, line)
    problems = []
    for what in sorted(set(first) | set(second)):
        if first.get(what) != second.get(what):
            diff = list(difflib.unified_diff(first.get(what, "(missing)").splitlines(),
                                             second.get(what, "(missing)").splitlines(),
                                             lineterm="", n=0))[:8]
            problems.append(f"  {what}:\n    " + "\n    ".join(diff))
    return problems, next(iter(first.values())).startswith("exit 0")


# Keys explore searches: removed from a published row's args (benchmarks/make_reports.py explore).
EXPLORE_SEARCHED_PREFIXES = ("ici_", "dcn_")
EXPLORE_SEARCHED_KEYS = {
    "per_device_batch_size", "gradient_accumulation_steps", "remat_policy", "attention",
    "sa_block_q", "sa_block_kv", "sa_use_fused_bwd_kernel", "decoder_layer_input", "context",
    "mlpwi", "mlpwi_0", "mlpwi_1", "mlpwo", "query_proj", "key_proj", "value_proj", "qkv_proj",
    "out_proj", "sparse_core_collective_offload", "collective_matmul", "mesh_placement_first"}
EXPLORE_405B = ["model_name=llama3.1-405b", "compile_topology=tpu7x-18432",
                "max_target_length=8192"]
AXIS_NAMES = re.compile(r"@[a-z_+]+| over \{[a-z_,]*\}")


def explore_rows():
    """(label, explore arguments) for each published row: its unsearched keys and global batch."""
    rows = []
    with open(PUBLISHED) as table:
        for row in csv.DictReader(table):
            kept, per_device = [], 1.0
            for item in row["args"].split():
                key, value = item.split("=", 1)
                if key == "per_device_batch_size":
                    per_device = float(value)
                searched = key.startswith(EXPLORE_SEARCHED_PREFIXES) or key in EXPLORE_SEARCHED_KEYS
                if not searched:
                    kept.append(item)
            rows.append((row["id"], row["args"].split(), kept, per_device))
    return rows


EXPLORE_CACHE = {"path": None}
EXPLORE_ROWS = {"only": []}  # --explore-rows: these published rows only


def binary_identity(binary):
    """The binary's path, size and modification time: a rebuilt binary is another binary."""
    stat = os.stat(binary)
    return f"{binary}:{stat.st_size}:{stat.st_mtime_ns}"


def explore_top(binary, args):
    """explore_top_uncached, read from or stored in the --explore-cache file when one is given (a
    slow parent's searches run once, e.g. while the new binary builds)."""
    path = EXPLORE_CACHE["path"]
    if path is None:
        return explore_top_uncached(binary, args)
    top = EXPLORE_CACHE.get("top", 1)
    key = binary_identity(binary) + " " + " ".join(args) + ("" if top == 1 else f" --top {top}")
    stored = {}
    if os.path.exists(path):
        with open(path) as cache:
            stored = json.load(cache)
    if key in stored:
        return tuple(stored[key])
    found = explore_top_uncached(binary, args)
    with EXPLORE_CACHE["lock"]:
        if os.path.exists(path):
            with open(path) as cache:
                stored = json.load(cache)
        stored[key] = list(found)
        with open(path + ".tmp", "w") as cache:
            json.dump(stored, cache)
        os.replace(path + ".tmp", path)
    return found


def explore_top_uncached(binary, args):
    """explore --top N of `args` (N from --explore-top, default 1): (best step time, its program
    text without axis names, seconds, json)."""
    top = str(EXPLORE_CACHE.get("top", 1))
    result = subprocess.run([binary, "explore", *args, "--top", top, "--json"], capture_output=True,
                            text=True)
    if result.returncode != 0:
        return None, f"exit {result.returncode}: {result.stderr.strip()}", 0.0, {}
    found = json.loads(result.stdout)
    if not found["top"]:
        return None, "nothing fits", found["elapsed_s"], found
    best = found["top"][0]
    text = program_text(binary, best["args"].split())
    return best["step_time_s"], text, found["elapsed_s"], found


def program_text(binary, args):
    """`tpusim program` of `args` without the mesh axes' names (the header keeps the batch)."""
    program = subprocess.run([binary, "program", *args], capture_output=True, text=True)
    lines = program.stdout.splitlines()
    header = lines[0].split(", ", 2)[-1] if lines else ""
    return header + "\n" + AXIS_NAMES.sub("", "\n".join(lines[1:]))


def check_top5_programs(binary, jobs):
    """On each published row, the new binary's `explore --top 5` rows print different programs."""
    work = explore_work(binary, False)

    def rows_sharing_a_program(item):
        label, args = item
        result = subprocess.run([binary, "explore", *args, "--top", "5", "--json"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            return label, 0, 0
        top = json.loads(result.stdout)["top"]
        texts = [program_text(binary, row["args"].split()) for row in top]
        return label, len(top), len(texts) - len(set(texts))

    shared = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for label, rows, same in pool.map(rows_sharing_a_program, work):
            print(f"{label:44} top {rows}: {same} row(s) repeat a program above", flush=True)
            shared += same > 0
    print(f"{len(work)} rows: {shared} with two top-5 rows of one program")
    return shared


def explore_work(binary, with_405b):
    """(label, explore arguments) per published row (and the 405b search)."""
    work = []
    for label, args, kept, per_device in explore_rows():
        if EXPLORE_ROWS["only"] and label not in EXPLORE_ROWS["only"]:
            continue
        estimate = subprocess.run([binary, "estimate", *args, "--json"], capture_output=True,
                                  text=True, check=True)
        devices = json.loads(estimate.stdout)["devices"]
        work.append((label, kept + ["--global-batch-size", str(int(round(per_device * devices)))]))
    if with_405b:
        work.append(("llama3.1-405b tpu7x-18432 (exhaustive)", EXPLORE_405B))
    return work


def top_rows(found):
    """Every top row's args and step time (bit for bit, as JSON prints them)."""
    return [(row.get("args"), row.get("step_time_s")) for row in found.get("top", [])]


def compare_explore(old, new, with_405b, jobs, only_old=False):
    """The published rows' (and optionally 405b's) explore top 1 under both binaries."""
    work = explore_work(new, with_405b)

    def both(item):
        label, args = item
        first = explore_top(old, args)
        return label, first, first if only_old else explore_top(new, args)

    differing = 0
    print(f"{'row':44} {'old s':>8} {'new s':>8} {'ratio':>6}  top 1")
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for label, first, second in pool.map(both, work):
            same = (first[0] == second[0] and first[1] == second[1]
                    and top_rows(first[3]) == top_rows(second[3]))
            ratio = first[2] / second[2] if second[2] > 0 else float("nan")
            print(f"{label:44} {first[2]:8.2f} {second[2]:8.2f} {ratio:6.2f}  "
                  f"{'same' if same else 'DIFFERENT'} (step {first[0]} s)", flush=True)
            if not same:
                differing += 1
                print(f"  old: {first[3].get('top', [{}])[0].get('args', first[1])}\n"
                      f"  new: {second[3].get('top', [{}])[0].get('args', second[1])}\n"
                      f"  step times {first[0]} vs {second[0]}; program text "
                      f"{'same' if first[1] == second[1] else 'differs'}")
    count = EXPLORE_CACHE.get("top", 1)
    print(f"{len(work)} explore searches: {differing} differ in their top {count}"
          + ("" if count == 1 else " (every row's args and step time; the top 1's program text)"))
    return differing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--random", type=int, default=300, help="random configs (default 300)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-train", action="store_true", help="skip the training runs")
    parser.add_argument("--no-recipes", action="store_true", help="skip the public recipes")
    parser.add_argument("--explore", action="store_true",
                        help="compare explore's top 1 on the published rows instead")
    parser.add_argument("--explore-405b", action="store_true",
                        help="with --explore: also the exhaustive 405b search on tpu7x-18432")
    parser.add_argument("--explore-top5", action="store_true",
                        help="check that the new binary's explore --top 5 rows are different "
                             "programs on every published row (nothing else)")
    parser.add_argument("--explore-cache", metavar="FILE",
                        help="with --explore: keep each binary's explore results in FILE and "
                             "reuse them (keyed by the binary's path, size and mtime, and the "
                             "args); --explore-only-old fills it for the old binary alone")
    parser.add_argument("--explore-only-old", action="store_true",
                        help="with --explore and --explore-cache: run the old binary only")
    parser.add_argument("--explore-top", type=int, default=1, metavar="N",
                        help="with --explore: search the top N and compare every row's args and "
                        "step time (default 1)")
    parser.add_argument("--explore-rows", default="",
                        help="with --explore: only these published rows (ids, comma-separated)")
    options = parser.parse_args()
    EXPLORE_ROWS["only"] = [row for row in options.explore_rows.split(",") if row]
    EXPLORE_CACHE["path"] = options.explore_cache
    EXPLORE_CACHE["top"] = options.explore_top
    EXPLORE_CACHE["lock"] = threading.Lock()
    old, new = os.path.abspath(options.old), os.path.abspath(options.new)
    if options.explore_top5:
        sys.exit(1 if check_top5_programs(new, options.jobs) else 0)
    if options.explore:
        sys.exit(1 if compare_explore(old, new, options.explore_405b, options.jobs,
                                      options.explore_only_old) else 0)
    lines = configs(options.random)
    differing = 0
    succeeded = 0
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        for line, (problems, ok) in zip(lines,
                                        pool.map(lambda line: compare(old, new, line), lines)):
            succeeded += ok
            if problems:
                differing += 1
                print(f"DIFFERENT: {line}\n" + "\n".join(problems), flush=True)
    extra_counts = []
    for name, items, produce, label in (
            ("recipes", [] if options.no_recipes else recipe_lines(), recipe_outputs,
             lambda args: " ".join(args)),
            ("train runs", [] if options.no_train else TRAIN_RUNS, train_outputs,
             lambda line: "train " + line)):
        ran = 0
        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            for item, (problems, ok) in zip(items, pool.map(
                    lambda item, produce=produce: compare(old, new, item, produce), items)):
                ran += ok
                if problems:
                    differing += 1
                    print(f"DIFFERENT: {label(item)}\n" + "\n".join(problems), flush=True)
        extra_counts.append(f"{len(items)} {name} ({ran} without error)")
    validate = [run(binary, ["validate", PUBLISHED], ROOT) for binary in (old, new)]
    if validate[0] != validate[1]:
        differing += 1
        print("DIFFERENT: validate " + PUBLISHED)
    print(f"{len(lines)} configs ({succeeded} estimate without error), "
          + ", ".join(extra_counts) + f" + validate: {differing} differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
