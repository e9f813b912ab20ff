#!/usr/bin/python3
"""Fits the catalog's gmm_v2_grid_step_us per TPU generation to tokamax PR #1221's tile_m speed-ups,
reports each shape's error when it is left out of the fit, and checks the absolute gmm_v2 times of
validation/gmm_kernels.csv at the fitted values.

The mechanism (gmm_v2_grid_steps, sim/perf/op_cost.cpp; docs/reference/hardware.md §5.16): tokamax's
gmm_v2 kernel walks an (n tile, group x row tile, k tile) grid with emit_pipeline and pays a fixed
cost per step, on top of its MXU and HBM time; a row tile narrower than the MXU costs its rows; with
gmm_v2_weight_prefetch (§5.17) an expert's weight block streams only one step ahead (Pallas's
standard schedule), and with gmm_v2_one_tensorcore the kernel has one TensorCore of v5p's two. The
op pairs tokamax-1221-* of validation/pairs.csv (one chip, balanced groups, tile_m 128 against 256,
four shapes per chip) give the ratio only, so the cost is fitted per chip to those four ratios
(least squares on the log of predicted over measured ratio); each shape left out in turn is
refitted on the other three and its error at that value is what a new shape would see.

Usage: /usr/bin/python3 benchmarks/fit_gmm_v2_grid_step.py [--binary build/sim/tpusim]
Output: markdown tables on stdout; about two minutes on two cores.
"""

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from hw_catalog import write_catalog

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "validation"
CHIPS = {"v7x": "tpu7x-2", "v6e": "v6e-1", "v5p": "v5p-8"}
GRID = [round(0.05 * step, 2) for step in range(61)]  # 0 .. 3 us


def catalog_with(chip, value, directory):
    """A copy of configs/hw whose `chip` carries gmm_v2_grid_step_us = value."""
    write_catalog(directory, "gmm_v2_grid_step_us",
                  lambda stem, current: value if stem == chip else None)


def op_seconds(binary, args, directory, kernel_only=False):
    env = dict(os.environ, TPUSIM_HW_DIR=directory)
    completed = subprocess.run([binary, "op", *args, "--json"], check=True, capture_output=True,
                               text=True, env=env)
    result = json.loads(completed.stdout)
    return result["kernel_seconds"] if kernel_only else result["seconds"]


def tile_pairs():
    """{chip: [(shape, a args, b args, measured B/A)]} from the tokamax-1221 op pairs."""
    pairs = {chip: [] for chip in CHIPS}
    with open(VALIDATION / "pairs.csv") as handle:
        for row in csv.DictReader(handle):
            if not row["id"].startswith("tokamax-1221-"):
                continue
            chip = row["id"].split("-")[2]
            shape = row["id"].split(f"{chip}-", 1)[1]
            ratio = float(row["measured_b"]) / float(row["measured_a"])
            pairs[chip].append((shape, shlex.split(row["a"]), shlex.split(row["b"]), ratio))
    return pairs


def ratio_errors(binary, chip, cases, value):
    """log(predicted / measured B/A) of each case at gmm_v2_grid_step_us = value."""
    with tempfile.TemporaryDirectory() as directory:
        catalog_with(chip, value, directory)
        return [math.log(op_seconds(binary, b, directory) / op_seconds(binary, a, directory) /
                         measured) for _, a, b, measured in cases]


def best_value(table):
    """The grid value with the smallest sum of squared log errors in {value: [errors]}."""
    return min(table, key=lambda value: sum(error * error for error in table[value]))


def percent(log_error):
    return f"{(math.exp(log_error) - 1) * 100:+.1f}%"


def fit(binary):
    lines = ["| chip | fitted µs | errors per shape (predicted / measured B/A − 1) | "
             "left-out errors |", "|---|---:|---|---|"]
    fitted = {}
    for chip, cases in tile_pairs().items():
        table = {value: ratio_errors(binary, chip, cases, value) for value in GRID}
        value = best_value(table)
        fitted[chip] = value
        left_out = []
        for index, case in enumerate(cases):
            others = {grid: errors[:index] + errors[index + 1:] for grid, errors in table.items()}
            left_out.append(f"{case[0]} {percent(table[best_value(others)][index])}")
        lines.append(f"| {chip} | {value} | "
                     + ", ".join(f"{case[0]} {percent(error)}"
                                 for case, error in zip(cases, table[value]))
                     + " | " + ", ".join(left_out) + " |")
    return fitted, lines


def absolute_lines(binary, fitted):
    lines = ["| id | topology | measured µs | predicted kernel µs | error |", "|---|---|---:|---:|---:|"]
    with open(VALIDATION / "gmm_kernels.csv") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        chip = next(name for name, topology in CHIPS.items() if topology == row["topology"])
        with tempfile.TemporaryDirectory() as directory:
            catalog_with(chip, fitted[chip], directory)
            args = [*shlex.split(row["op_args"]), f"compile_topology={row['topology']}"]
            predicted = op_seconds(binary, args, directory, kernel_only=True) * 1e6
        measured = float(row["measured_us"])
        lines.append(f"| {row['id']} | {row['topology']} | {measured:.1f} | {predicted:.1f} | "
                     f"{(predicted / measured - 1) * 100:+.1f}% |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "build" / "sim" / "tpusim"))
    binary = parser.parse_args().binary
    fitted, lines = fit(binary)
    print("\n".join(lines))
    print()
    print("\n".join(absolute_lines(binary, fitted)))


if __name__ == "__main__":
    main()
