#!/usr/bin/python3
"""Fits the catalog's routed_row_hbm_fraction (one value for every TPU) to the public dropless-MoE
recipes, and reports each source's error when it is left out of the fit.

The mechanism (routed_row_gathers, sim/perf/op_cost.cpp): a dropless MoE's dispatch and combine
and their gradients move the routed token rows (one row per token and chosen expert) at a fraction
of the HBM roofline, as XLA gathers and scatters ragged rows rather than streaming them. Nothing
public measures that fraction inside MaxText; it is fitted here, to the recipes whose arguments and
XLA flags are known exactly (validation/recipes_public.json), one value for every chip generation,
as program_efficiency is (benchmarks/calibrate.py). The published.csv rows that abbreviate those
recipes and the MoE pairs are reported, not fitted.

Each source (a model's recipes from one publisher) is left out in turn: the fraction is refitted on
the others and the left-out source's error at that fraction is what a new MoE model would see.

Usage: /usr/bin/python3 benchmarks/fit_routed_row_fraction.py [--binary build/sim/tpusim]
Output: one table (markdown) on stdout; about 2 minutes on two cores.
"""

import argparse
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

from hw_catalog import write_catalog

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "validation"
DROPLESS = ("deepseek3", "qwen3-235b", "gemma4-26b", "gpt-oss", "llama4")
GRID = [round(0.02 * 1.15 ** step, 4) for step in range(30)]  # 0.02 .. ~1.1, clipped to 1


def catalog_with(fraction, directory):
    """A copy of configs/hw whose TPUs carry `fraction` (the GPUs keep the roofline, 1)."""
    write_catalog(directory, "routed_row_hbm_fraction",
                  lambda chip, current: None if float(current) == 1 else fraction)


def recipe_errors(binary, env):
    """Dropless-MoE recipe id -> (source, predicted / measured - 1)."""
    errors = {}
    for recipe in json.loads((VALIDATION / "recipes_public.json").read_text()):
        source = next((name for name in DROPLESS if name in recipe["model_name"]), None)
        if source is None:
            continue
        command = [binary, "estimate", f"compile_topology={recipe['topology']}",
                   f"compile_topology_num_slices={recipe['num_slices']}", *recipe["args"],
                   "--xla-flags", " ".join(recipe["xla_flags"]), "--json"]
        completed = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        predicted = json.loads(completed.stdout)["step_time_s"]
        errors[recipe["id"]] = (source, predicted / recipe["measured_step_s"] - 1)
    return errors


def evaluate(binary, fraction):
    with tempfile.TemporaryDirectory() as directory:
        catalog_with(min(fraction, 1.0), Path(directory))
        env = {key: value for key, value in os.environ.items()
               if key not in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")}
        env["TPUSIM_HW_DIR"] = directory
        errors = recipe_errors(binary, env)
        pairs = json.loads(subprocess.run(
            [binary, "validate", "--pairs", str(VALIDATION / "pairs.csv"), "--json"],
            capture_output=True, text=True, env=env, check=True).stdout)
        rows = json.loads(subprocess.run(
            [binary, "validate", str(VALIDATION / "published.csv"), "--json"],
            capture_output=True, text=True, env=env, check=True).stdout)["rows"]
    return errors, pairs, rows


def best(grid_errors, sources):
    """The grid fraction with the least sum of squared log errors over `sources`."""
    def loss(errors):
        return sum(math.log1p(error) ** 2 for source, error in errors.values() if source in sources)
    return min(grid_errors, key=lambda fraction: loss(grid_errors[fraction][0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default=str(ROOT / "build" / "sim" / "tpusim"))
    binary = parser.parse_args().binary
    results = {fraction: evaluate(binary, fraction) for fraction in GRID}
    sources = sorted({source for source, _ in results[GRID[0]][0].values()})
    fitted = best(results, set(sources))
    print(f"routed_row_hbm_fraction fitted on all {len(sources)} sources: {fitted}\n")
    print("| recipe | source | error at the roofline (1.0) | fitted on all | left out: fraction | left out: error |")
    print("|---|---|---|---|---|---|")
    roofline = evaluate(binary, 1.0)[0]
    for source in sources:
        left_out = best(results, set(sources) - {source})
        for recipe, (recipe_source, error) in sorted(results[fitted][0].items()):
            if recipe_source == source:
                print(f"| {recipe} | {source} | {100 * roofline[recipe][1]:+.1f}% | "
                      f"{100 * error:+.1f}% | {left_out} | "
                      f"{100 * results[left_out][0][recipe][1]:+.1f}% |")
    _, pairs, rows = results[fitted]
    print("\nAt the fitted fraction, MoE pairs (points) and published rows:")
    for pair in pairs.get("pairs", []):
        if any(word in pair["id"] for word in ("moe", "deepseek", "mixtral", "guide-sc-offload-moe")):
            print(f"  pair {pair['id']}: {pair.get('error_points')}")
    for row in rows:
        if row["id"] in ("I-2", "I-3", "I-4", "I-11", "I-21", "R-19"):
            print(f"  row {row['id']}: {100 * row['error']:+.1f}%")


if __name__ == "__main__":
    main()
