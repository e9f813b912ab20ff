#!/usr/bin/python3
"""Speed of `import tpusim`: 1,000 estimates of distinct configs from Python against the same
estimates called in-process from C++ (benchmarks/estimate_batch.cpp, which calls run_estimate, the
function the module calls). The bar (issue 46): Python costs at most 1.2x the C++ calls.

Both sides run in fresh processes, alternating, several rounds; each times its 1,000 estimates
after one warm-up estimate (the catalog and the embedded base.yml are read once per process) and
the script reports the median of the rounds and the ratio of the medians. Both sides run with
the C library's malloc (what python3 has) and again with tcmalloc_minimal preloaded into both
(the allocator the tpusim binary links), when it is installed. The step times must agree to the
bit (their sums are compared).

Usage (from the project root, after a build):
    /usr/bin/python3 benchmarks/python_module_benchmark.py [--build-dir build] [--count 1000]
        [--rounds 5]
"""

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["llama2-7b", "llama3.1-8b", "mistral-7b", "qwen3-8b", "gemma2-9b", "llama2-13b",
          "qwen3-14b", "mixtral-8x7b"]
SLICES = ["v5e-16", "v5e-64", "v5p-8", "v5p-32", "v6e-8", "v6e-64", "tpu7x-16"]
BATCHES = ["1", "2", "4"]
LENGTHS = ["1024", "2048", "4096"]
REMATS = ["full", "minimal", "save_qkv_proj"]
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

PYTHON_SIDE = """
import json, sys, time
import tpusim
configs = [line.split() for line in open(sys.argv[1]) if line.strip()]
tpusim.estimate(configs[0])  # warm-up, as the C++ side's
total, errors = 0.0, 0
started = time.perf_counter()
for args in configs:
    try:
        total += tpusim.estimate(args).step_time_s
    except tpusim.ConfigError:
        errors += 1
seconds = time.perf_counter() - started
print(json.dumps({"count": len(configs), "errors": errors, "seconds": seconds,
                  "step_time_sum": total}))
"""


def distinct_configs(count, seed):
    combos = list(itertools.product(MODELS, SLICES, BATCHES, LENGTHS, REMATS))
    if count > len(combos):
        sys.exit(f"only {len(combos)} distinct configs; ask for fewer")
    random.Random(seed).shuffle(combos)
    return [f"model_name={model} compile_topology={slice_name} per_device_batch_size={batch} "
            f"max_target_length={length} remat_policy={remat}"
            for model, slice_name, batch, length, remat in combos[:count]]


def run_side(command, environment):
    output = subprocess.run(command, check=True, capture_output=True, text=True,
                            env=environment).stdout
    return json.loads(output.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=46)
    options = parser.parse_args()
    driver = options.build_dir / "benchmarks" / "estimate_batch"
    if not driver.exists() or not (options.build_dir / "python" / "tpusim").exists():
        sys.exit(f"build {driver} and the Python module first (ninja -C {options.build_dir} "
                 "estimate_batch _tpusim)")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(distinct_configs(options.count, options.seed)) + "\n")
        configs_path = handle.name
    base_env = {key: value for key, value in os.environ.items()
                if key not in ("LIBTPU_INIT_ARGS", "XLA_FLAGS", "LD_PRELOAD")}
    base_env["PYTHONPATH"] = str(options.build_dir / "python")
    allocators = [("glibc malloc", {})]
    if os.path.exists(TCMALLOC):
        allocators.append(("tcmalloc (preloaded)", {"LD_PRELOAD": TCMALLOC}))
    sides = {"C++": [str(driver), configs_path],
             "Python": ["/usr/bin/python3", "-c", PYTHON_SIDE, configs_path]}
    report = []
    try:
        for allocator, extra in allocators:
            environment = {**base_env, **extra}
            seconds = {side: [] for side in sides}
            checks = {}
            for _ in range(options.rounds):
                for side, command in sides.items():
                    result = run_side(command, environment)
                    seconds[side].append(result["seconds"])
                    checks[side] = (result["count"], result["errors"], result["step_time_sum"])
            if checks["C++"] != checks["Python"]:
                sys.exit(f"the two sides disagree: {checks}")
            medians = {side: statistics.median(values) for side, values in seconds.items()}
            report.append({"allocator": allocator, "count": checks["C++"][0],
                           "errors": checks["C++"][1], "rounds": options.rounds,
                           "seconds": seconds, "median_s": medians,
                           "ratio": medians["Python"] / medians["C++"]})
    finally:
        os.unlink(configs_path)
    for row in report:
        per_call = {side: 1e3 * value / row["count"] for side, value in row["median_s"].items()}
        print(f"{row['allocator']}: {row['count']} estimates ({row['errors']} refused), median of "
              f"{row['rounds']} rounds: C++ {row['median_s']['C++']:.2f} s "
              f"({per_call['C++']:.2f} ms each), Python {row['median_s']['Python']:.2f} s "
              f"({per_call['Python']:.2f} ms each): ratio {row['ratio']:.3f}")
    print(json.dumps(report))
    return 0 if all(row["ratio"] <= 1.2 for row in report) else 1


if __name__ == "__main__":
    sys.exit(main())
