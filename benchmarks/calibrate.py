#!/usr/bin/env python3
"""Sweeps one hardware-catalog parameter (the same value on every chip) and reports how well
`tpusim validate` fits validation/published.csv at each value.

Usage: python3 benchmarks/calibrate.py [--key program_efficiency] [--values 0.80,0.82,...]
           [--binary build/sim/tpusim] [--csv validation/published.csv]
Prints one line per value: median, mean and max absolute step-time error, and the sum of squared
log errors (what a least-squares fit minimizes). Nothing is written to the catalog: copy the
chosen value into configs/hw/*.yml by hand, with its note.
"""
import argparse
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="program_efficiency")
    parser.add_argument("--values", default="0.80,0.82,0.84,0.85,0.86,0.88,0.90")
    parser.add_argument("--binary", default=str(ROOT / "build/sim/tpusim"))
    parser.add_argument("--csv", default=str(ROOT / "validation/published.csv"))
    args = parser.parse_args()
    pattern = re.compile(r"^(\s*" + re.escape(args.key) + r":\s*\{value:\s*)([^,]+)(,.*)$", re.M)
    print(f"{args.key:>22} {'median':>8} {'mean':>8} {'max':>8} {'sum log^2':>10}")
    for value in args.values.split(","):
        with tempfile.TemporaryDirectory() as directory:
            for source in (ROOT / "configs/hw").glob("*.yml"):
                text = source.read_text()
                if not pattern.search(text):
                    raise SystemExit(f"{source}: no key {args.key}")
                (pathlib.Path(directory) / source.name).write_text(pattern.sub(r"\g<1>" + value + r"\g<3>", text))
            env = dict(os.environ, TPUSIM_HW_DIR=directory)
            result = subprocess.run([args.binary, "validate", args.csv, "--json"], env=env,
                                    check=True, capture_output=True, text=True)
        rows = json.loads(result.stdout)["rows"]
        errors = [abs(row["error"]) for row in rows]
        log_squares = sum(math.log(row["predicted_step_s"] / row["measured_step_s"]) ** 2 for row in rows)
        print(f"{value:>22} {100 * statistics.median(errors):7.2f}% {100 * statistics.mean(errors):7.2f}%"
              f" {100 * max(errors):7.2f}% {log_squares:10.4f}")


if __name__ == "__main__":
    main()
