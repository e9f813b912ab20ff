#!/usr/bin/python3
"""bf16 matmuls on a CPU without native bf16 dot products, against fp32, side by side (issue 34).

`tpusim train functional_dtype=bfloat16_matmul` multiplies bf16 operands with fp32 accumulation.
Where the CPU has AVX512-BF16 (or AMX) oneDNN's bf16 kernels do it; elsewhere tpusim rounds the
operands to bf16 and runs the fp32 kernels (sim/functional/kernels/library_gemm.h), since
oneDNN's emulated bf16 kernels ran 2.4x slower than fp32 on such a Xeon. This benchmark runs
fp32 and bf16 alternately, run after run, with oneDNN capped at AVX512_CORE (ONEDNN_MAX_CPU_ISA,
which hides AVX512-BF16 and AMX as on that Xeon) and, for comparison, as this CPU is; each run's
rate is the median of its steps after the first, and the table gives the median over the runs
and the ratio of the medians (bf16 over fp32 of the same setting).

Run:
  /usr/bin/python3 benchmarks/bf16_fallback.py [--tpusim build/sim/tpusim] [--runs 5]
      [--models small,large] [--markdown out.md]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_torch import MODELS, tpusim_args  # noqa: E402

SETTINGS = {"no native bf16 (ONEDNN_MAX_CPU_ISA=AVX512_CORE)": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
            "this CPU as it is": {}}


def gemm_line(binary, environment, dtype):
    """The `gemm:` line train prints first: which GEMM path runs."""
    args = [binary, "train", "model_name=tiny-llama", "compile_topology=v5e-1", "steps=1",
            "per_device_batch_size=1", "max_target_length=16", f"functional_dtype={dtype}"]
    result = subprocess.run(args, capture_output=True, text=True, check=True,
                            env={**os.environ, **environment})
    return next(line for line in result.stderr.splitlines() if line.startswith("gemm: "))


def rate(binary, model, dtype, environment):
    with tempfile.TemporaryDirectory() as work:
        metrics = os.path.join(work, "metrics.jsonl")
        subprocess.run([binary, "train", *tpusim_args(model, 1, dtype=dtype),
                        f"metrics_file={metrics}", "--quiet"], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, **environment})
        with open(metrics) as f:
            rates = [json.loads(line)["tokens_per_s"] for line in f if line.strip()]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tpusim", default="build/sim/tpusim")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", default="small,large")
    parser.add_argument("--markdown", help="write the section's table here")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        model = MODELS[name]
        for setting, environment in SETTINGS.items():
            rates = {"float32": [], "bfloat16_matmul": []}
            for run in range(args.runs):
                order = ["float32", "bfloat16_matmul"]
                if run % 2:
                    order.reverse()
                for dtype in order:
                    rates[dtype].append(rate(args.tpusim, model, dtype, environment))
                    print(f"  {name} {setting} run {run + 1}: {dtype} {rates[dtype][-1]:.0f} "
                          "tokens/s", file=sys.stderr, flush=True)
            fp32 = statistics.median(rates["float32"])
            bf16 = statistics.median(rates["bfloat16_matmul"])
            path = gemm_line(args.tpusim, environment, "bfloat16_matmul")
            rows.append((name, setting, fp32, bf16, bf16 / fp32, path))
            print(f"{name}, {setting}: fp32 {fp32:.0f}, bf16 {bf16:.0f} tokens/s, "
                  f"bf16/fp32 {bf16 / fp32:.2f} ({path})", flush=True)
    lines = ["| model | oneDNN sees | fp32 tokens/s | bf16 matmuls tokens/s | bf16 / fp32 | "
             "bf16 GEMM path (train's first line) |", "|---|---|---|---|---|---|"]
    for name, setting, fp32, bf16, ratio, path in rows:
        lines.append(f"| {name} | {setting} | {fp32:.1f} | {bf16:.1f} | {ratio:.3f} | "
                     f"`{path}` |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
