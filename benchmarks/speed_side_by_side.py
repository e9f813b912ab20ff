#!/usr/bin/env python3
"""Times two tpusim binaries on the same commands, alternately, and prints the median ratios.

For changes that must not make estimate or explore slower (the structure redesign of issue 36):
each round runs every command once with the old binary and once with the new one, in alternating
order (old first in even rounds), so a machine that is busier for a while slows both. The table
gives the median wall time of each binary over the rounds and new/old, the ratio of the medians.

Example:
  python3 benchmarks/speed_side_by_side.py /tmp/old/tpusim build/sim/tpusim --rounds 5
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMANDS = {
    "validate (27 published rows)": ["validate", "validation/published.csv"],
    "estimate llama3.1-70b v5p-128": ["estimate", "model_name=llama3.1-70b",
                                      "compile_topology=v5p-128", "per_device_batch_size=2"],
    "estimate deepseek3-671b v5p-1024": ["estimate", "model_name=deepseek3-671b",
                                         "compile_topology=v5p-1024", "per_device_batch_size=1"],
    "explore llama2-7b v5p-32": ["explore", "model_name=llama2-7b", "compile_topology=v5p-32",
                                 "--top", "5"],
    "explore mixtral-8x7b v5p-16": ["explore", "model_name=mixtral-8x7b",
                                    "compile_topology=v5p-16", "--top", "5"],
}


def timed(binary, args):
    start = time.perf_counter()
    result = subprocess.run([binary] + args, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{binary} {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    binaries = [os.path.abspath(options.old), os.path.abspath(options.new)]
    times = {name: ([], []) for name in COMMANDS}
    for round_index in range(options.rounds):
        order = [0, 1] if round_index % 2 == 0 else [1, 0]
        for name, args in COMMANDS.items():
            for which in order:
                times[name][which].append(timed(binaries[which], args))
    print(f"| command | old median (s) | new median (s) | new / old |  ({options.rounds} "
          "alternating rounds)")
    print("|---|---:|---:|---:|")
    ratios = []
    for name, (old, new) in times.items():
        ratio = statistics.median(new) / statistics.median(old)
        ratios.append(ratio)
        print(f"| {name} | {statistics.median(old):.3f} | {statistics.median(new):.3f} | "
              f"{ratio:.3f} |")
    print(f"| median of the ratios | | | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
