#!/usr/bin/env python3
"""Sweeps one hardware-catalog parameter (the same value on every chip) and reports how well
`tpusim validate` fits validation/published.csv at each value.

Usage: python3 benchmarks/calibrate.py [--key program_efficiency] [--values 0.80,0.82,...]
           [--binary build/sim/tpusim] [--csv validation/published.csv]
Prints one line per value: median, mean and max absolute step-time error, the sum of squared
log errors (what a least-squares fit minimizes) and the sum of absolute log errors (a fit that one
far-off row cannot drag). Then the leave-one-out check: each row predicted with the value fitted
(least absolute log error, over the values swept) on the other rows, next to its in-sample error
at the catalog's value. Nothing is written to the catalog: copy the chosen value into
configs/hw/*.yml by hand, with its note.

Usage for the leave-one-out table alone: --values 0.78:0.90:0.005 (start:stop:step) --loo
"""
import argparse
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import tempfile

from hw_catalog import write_catalog

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="program_efficiency")
    parser.add_argument("--values", default="0.78:0.90:0.005",
                        help="comma-separated values, or start:stop:step")
    parser.add_argument("--loo", action="store_true", help="also print the leave-one-out table")
    parser.add_argument("--binary", default=str(ROOT / "build/sim/tpusim"))
    parser.add_argument("--csv", default=str(ROOT / "validation/published.csv"))
    args = parser.parse_args()
    pattern = re.compile(r"^(\s*" + re.escape(args.key) + r":\s*\{value:\s*)([^,]+)(,.*)$", re.M)
    if ":" in args.values:
        start, stop, step = (float(part) for part in args.values.split(":"))
        count = int(round((stop - start) / step)) + 1
        values = [f"{start + index * step:.4f}" for index in range(count)]
    else:
        values = args.values.split(",")
    catalog = None
    for source in (ROOT / "configs/hw").glob("*.yml"):
        match = pattern.search(source.read_text())
        if not match:
            raise SystemExit(f"{source}: no key {args.key}")
        catalog = match.group(2).strip()
    print(f"{args.key:>22} {'median':>8} {'mean':>8} {'max':>8} {'sum log^2':>10} {'sum |log|':>10}")
    predictions = {}  # value -> {row id: (predicted, measured)}
    for value in values + ([catalog] if catalog not in values else []):
        with tempfile.TemporaryDirectory() as directory:
            write_catalog(directory, args.key, lambda chip, current: value, require_key=True)
            env = dict(os.environ, TPUSIM_HW_DIR=directory)
            result = subprocess.run([args.binary, "validate", args.csv, "--json"], env=env,
                                    check=True, capture_output=True, text=True)
        rows = json.loads(result.stdout)["rows"]
        predictions[value] = {row["id"]: (row["predicted_step_s"], row["measured_step_s"]) for row in rows}
        if value not in values:
            continue
        errors = [abs(row["error"]) for row in rows]
        logs = [math.log(row["predicted_step_s"] / row["measured_step_s"]) for row in rows]
        print(f"{value:>22} {100 * statistics.median(errors):7.2f}% {100 * statistics.mean(errors):7.2f}%"
              f" {100 * max(errors):7.2f}% {sum(x * x for x in logs):10.4f} {sum(abs(x) for x in logs):10.4f}")
    if not args.loo:
        return
    ids = list(predictions[values[0]])

    def loss(value, excluded):
        return sum(abs(math.log(p / m)) for row, (p, m) in predictions[value].items() if row != excluded)

    print()
    print(f"leave-one-out: {args.key} fitted on the other rows (least sum |log error|), "
          f"catalog value {catalog}")
    print(f"{'id':>8} {'fitted':>8} {'held-out error':>15} {'in-sample error':>16}")
    held, inside = [], []
    for row in ids:
        best = min(values, key=lambda value: loss(value, row))
        predicted, measured = predictions[best][row]
        own, _ = predictions[catalog][row]
        held.append(abs(predicted / measured - 1))
        inside.append(abs(own / measured - 1))
        print(f"{row:>8} {best:>8} {100 * (predicted / measured - 1):+14.2f}% {100 * (own / measured - 1):+15.2f}%")
    print(f"{'median':>8} {'':>8} {100 * statistics.median(held):14.2f}% {100 * statistics.median(inside):15.2f}%")
    print(f"{'max':>8} {'':>8} {100 * max(held):14.2f}% {100 * max(inside):15.2f}%")


if __name__ == "__main__":
    main()
