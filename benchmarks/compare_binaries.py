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

Example:
  python3 benchmarks/compare_binaries.py old/tpusim build/sim/tpusim [--random 300] [--jobs 2]
prints the differing configs (and the first differing lines) and exits 1 if there is any.
"""
import argparse
import concurrent.futures
import csv
import difflib
import itertools
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join(ROOT, "validation", "published.csv")

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


def compare(old, new, line):
    """The differences between the two binaries' outputs, and whether the estimate succeeded."""
    first, second = outputs(old, line), outputs(new, line)
    problems = []
    for what in first:
        if first[what] != second[what]:
            diff = list(difflib.unified_diff(first[what].splitlines(), second[what].splitlines(),
                                             lineterm="", n=0))[:8]
            problems.append(f"  {what}:\n    " + "\n    ".join(diff))
    return problems, first["estimate --json"].startswith("exit 0")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--random", type=int, default=300, help="random configs (default 300)")
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    old, new = os.path.abspath(options.old), os.path.abspath(options.new)
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
    validate = [run(binary, ["validate", PUBLISHED], ROOT) for binary in (old, new)]
    if validate[0] != validate[1]:
        differing += 1
        print("DIFFERENT: validate " + PUBLISHED)
    print(f"{len(lines)} configs ({succeeded} estimate without error) + validate: "
          f"{differing} differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
