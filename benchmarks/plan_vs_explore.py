#!/usr/bin/env python3
"""`tpusim plan` against one `tpusim explore` of the slice it picks, side by side (issue 45).

Runs the plan (its JSON names the pick, its global batch and each slice's search time), then
`explore` on the picked slice with the same global batch, alternating the two `--runs` times so
both see the same machine load, and prints the median wall times and their ratio (the bar: plan
at most 3x the explore of its pick). The plan's slice table says where its time went.

Example:
  python3 benchmarks/plan_vs_explore.py build/sim/tpusim --runs 3 -- \\
      model_name=llama3.1-70b --tokens 1e12 --deadline 60d --hardware v5p,v6e,tpu7x
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def timed(command):
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)}\nexit {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--runs", type=int, default=3)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    plan_args = argv[split + 1:]
    plan_command = [args.binary, "plan", *plan_args, "--json"]
    plan_times, explore_times = [], []
    result = None
    for run in range(args.runs):
        elapsed, out = timed(plan_command)
        plan_times.append(elapsed)
        result = json.loads(out)
        if result["pick"] is None:
            sys.exit("the plan picked nothing: " + result["recommendation"])
        pick = result["points"][result["pick"]]
        config_args = [a for a in plan_args if "=" in a and not a.startswith("--")]
        explore_command = [args.binary, "explore", *config_args,
                           f"compile_topology={pick['compile_topology']}",
                           f"compile_topology_num_slices={pick['num_slices']}",
                           "--global-batch-size", str(result["global_batch"]["sequences"]),
                           "--top", "1", "--json"]
        elapsed, out = timed(explore_command)
        explore_times.append(elapsed)
        explored = json.loads(out)
        same = explored["top"][0]["args"] == pick["args"]
        print(f"run {run + 1}: plan {plan_times[-1]:.1f} s, explore {pick['slice']} "
              f"{explore_times[-1]:.1f} s, same pick as explore: {same}", flush=True)
    plan_median = statistics.median(plan_times)
    explore_median = statistics.median(explore_times)
    print(f"\nplan:    {' '.join(plan_command[1:])}")
    print(f"explore: {' '.join(explore_command[1:])}")
    print(f"median of {args.runs}: plan {plan_median:.1f} s, explore {explore_median:.1f} s, "
          f"ratio {plan_median / explore_median:.2f} (bar: 3)")
    print(f"recommendation: {result['recommendation']}")
    # Programs built and candidates evaluated per slice (absent from binaries before they were
    # reported): what each slice's search cost besides its seconds.
    print("\nslice            outcome            seconds  programs  evaluated")
    for item in result["slices"]:
        print(f"{item['slice']:<16} {item['outcome']:<18} {item['elapsed_s']:7.1f} "
              f"{item.get('programs_built', '-'):>9} {item.get('candidates_evaluated', '-'):>10}")


if __name__ == "__main__":
    main()
