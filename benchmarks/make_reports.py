#!/usr/bin/env python3
"""Regenerates the measured reports in reports/ from the built binaries.

Usage (from the project root, after `bash scripts/build.sh`):
  python3 benchmarks/make_reports.py validation    # reports/validation.md
  python3 benchmarks/make_reports.py performance   # reports/performance.md (runs the benchmarks)
  python3 benchmarks/make_reports.py train_speed   # its "tpusim train" section only (vs PyTorch, ~15 min)
  python3 benchmarks/make_reports.py training      # reports/training.md (trains tiny-llama, ~40 s)
  python3 benchmarks/make_reports.py explore       # reports/explore.md (explorer speed, published rows)
  python3 benchmarks/make_reports.py mpi           # reports/mpi.md (mpirun with 1, 2, 4 ranks, ~2 min)
  python3 benchmarks/make_reports.py compat        # reports/compat.md (public recipes as pasted)
  python3 benchmarks/make_reports.py token_cache   # reports/token_cache.md (start-up, ~10 min)
Files are written atomically (temporary file + rename).
"""
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BINARY = pathlib.Path(os.environ.get("TPUSIM_BINARY", ROOT / "build/sim/tpusim"))
VALIDATION = ROOT / "validation"


def write_atomically(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as handle:
        handle.write(text)
        temporary = handle.name
    os.chmod(temporary, 0o644)  # NamedTemporaryFile creates 0600; reports are for everyone
    os.replace(temporary, path)


def run_json(args):
    return json.loads(subprocess.run([str(BINARY), *args, "--json"], check=True,
                                     capture_output=True, text=True).stdout)


def mechanism_summaries():
    """{name: what it models} of every cost mechanism, in the binary's order (common/mechanisms.cpp
    is the one list: `tpusim validate --list-mechanisms --json`)."""
    listed = json.loads(subprocess.run([str(BINARY), "validate", "--list-mechanisms", "--json"],
                                       check=True, capture_output=True, text=True).stdout)
    return {item["name"]: item["summary"] for item in listed}


def recipe_predictions(without=()):
    """Each public recipe as pasted (args and XLA flags): {recipe id: (predicted, measured, fits)}."""
    with open(VALIDATION / "recipes_public.json") as handle:
        recipes = json.load(handle)
    env = {key: value for key, value in os.environ.items()
           if key not in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")}
    results = {}
    for recipe in recipes:
        args = [str(BINARY), "estimate", f"compile_topology={recipe['topology']}",
                f"compile_topology_num_slices={recipe['num_slices']}", *recipe["args"],
                "--xla-flags", " ".join(recipe["xla_flags"]), "--json"]
        if without:
            args += ["--without", ",".join(without)]
        completed = subprocess.run(args, capture_output=True, text=True, env=env)
        if completed.returncode == 0:
            data = json.loads(completed.stdout)
            results[recipe["id"]] = (data["step_time_s"], recipe["measured_step_s"], data["fits"],
                                     recipe["generation"])
    return results


def published_models():
    """published.csv row id -> the model_name its args set ("" for the custom 2023 models)."""
    import csv
    models = {}
    with open(VALIDATION / "published.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            names = [arg.split("=", 1)[1] for arg in row["args"].split() if arg.startswith("model_name=")]
            models[row["id"]] = names[0] if names else ""
    return models


def recipe_of_row(row, recipes, models):
    """The public recipe whose measurement a published.csv row is: same chip, model, step time."""
    with open(VALIDATION / "recipes_public.json") as handle:
        recipe_models = {recipe["id"]: recipe["model_name"] for recipe in json.load(handle)}
    for recipe_id, (_, measured, _, generation) in recipes.items():
        if (generation == row["hardware"] and recipe_models[recipe_id] == models.get(row["id"])
                and abs(measured - row["measured_step_s"]) < 0.01):
            return recipe_id
    return None


def run_classes():
    """{published row id or recipe id: the classes of its run}: "moe" when its model has more than
    one expert, "low precision" when it quantizes (quantization set), from `tpusim config` of the
    row's or recipe's args."""
    import csv
    runs = {}
    with open(VALIDATION / "published.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            runs[row["id"]] = row["args"].split()
    with open(VALIDATION / "recipes_public.json") as handle:
        for recipe in json.load(handle):
            runs[recipe["id"]] = [f"compile_topology={recipe['topology']}",
                                  f"compile_topology_num_slices={recipe['num_slices']}",
                                  *recipe["args"]]
    classes = {}
    for run_id, args in runs.items():
        completed = subprocess.run([str(BINARY), "config", *args, "--json"], capture_output=True,
                                   text=True)
        config = json.loads(completed.stdout)["config"] if completed.returncode == 0 else {}
        classes[run_id] = set()
        if int(config.get("num_experts", 1)) > 1:
            classes[run_id].add("moe")
        if str(config.get("quantization", "")) not in ("", "none"):
            classes[run_id].add("low precision")
    return classes


CLASSES = ("moe", "low precision")


def class_cell(errors, classes, name):
    """median / max |error| over the runs of class `name` (errors: {run id: error})."""
    picked = [abs(error) for run_id, error in errors.items() if name in classes.get(run_id, ())]
    return error_summary(picked) if picked else "-"


def scatter_plot(rows, recipes, path, gpu_rows=()):
    """predicted vs measured step time, log-log; returns False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(figsize=(6.4, 6.0))
    colors = {"v4": "tab:gray", "v5e": "tab:green", "v5p": "tab:blue", "v6e": "tab:orange",
              "v7x": "tab:red"}
    for chip, color in colors.items():
        chosen = [row for row in rows if row["hardware"] == chip]
        if chosen:
            axes.scatter([row["measured_step_s"] for row in chosen],
                         [row["predicted_step_s"] for row in chosen], color=color, s=28,
                         label=f"{chip} (published.csv)")
    axes.scatter([measured for _, measured, _, _ in recipes.values()],
                 [predicted for predicted, _, _, _ in recipes.values()], marker="x", color="black",
                 s=30, label="public recipes, as pasted")
    if gpu_rows:
        axes.scatter([row["measured_step_s"] for row in gpu_rows],
                     [row["predicted_step_s"] for row in gpu_rows], marker="s", color="tab:purple",
                     s=26, label="H100 (gpu_published.csv)")
    low, high = 0.5, 200.0
    axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    axes.fill_between([low, high], [low / 1.05, high / 1.05], [low * 1.05, high * 1.05],
                      color="tab:green", alpha=0.12, linewidth=0, label="±5%")
    for factor, style in ((1.1, ":"), (1 / 1.1, ":")):
        axes.plot([low, high], [low * factor, high * factor], color="gray", linestyle=style,
                  linewidth=0.8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    axes.set_xlabel("measured step time (s)")
    axes.set_ylabel("predicted step time (s)")
    axes.set_title("tpusim estimate vs published MaxText runs (band ±5%, dotted ±10%)",
                   fontsize=10)
    axes.legend(loc="upper left", fontsize=8)
    save_figure(figure, path)
    return True


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None when python3-matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(figure, path):
    """Writes a figure as PNG atomically (temporary file, then rename), readable by all."""
    figure.tight_layout()
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as handle:
        temporary = handle.name
    figure.savefig(temporary, dpi=110)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def biggest_part(row):
    """The largest entry of a validated row's step breakdown, and its exposed communication."""
    breakdown = row["breakdown"]
    top = max(breakdown.items(), key=lambda item: item[1])
    exposed = sum(v for k, v in breakdown.items() if k.startswith("exposed"))
    return f"{top[0]} {top[1]:.2f} s; exposed comm {exposed:.2f} s"


def error_summary(errors):
    return f"{100 * statistics.median(errors):.1f}% / {100 * max(errors):.1f}%"


def pairs_scatter(pairs, path):
    """Predicted against measured change of step time for the step-level pairs: all of them, and
    the band within +-35% where most pairs lie, labelled."""
    plt = pyplot()
    if plt is None:
        return False
    figure, (whole, band) = plt.subplots(1, 2, figsize=(11.0, 5.4))
    measured = [100 * (pair["measured_ratio"] - 1) for pair in pairs]
    predicted = [100 * (pair["predicted_ratio"] - 1) for pair in pairs]
    for axes, limit in ((whole, None), (band, 35.0)):
        axes.scatter(measured, predicted, color="tab:blue", s=30)
        low = -limit if limit else min(measured + predicted) - 5
        high = limit if limit else max(measured + predicted) + 5
        axes.plot([low, high], [low, high], color="gray", linewidth=0.8,
                  label="predicted = measured")
        axes.set_xlim(low, high)
        axes.set_ylim(low, high)
        axes.set_xlabel("measured change of step time, B vs A (%)")
        axes.set_ylabel("predicted change (%)")
    # Numbered as the table's # column: names would overlap where most pairs sit, near zero.
    for number, (x, y) in enumerate(zip(measured, predicted), start=1):
        if abs(x) <= 35 and abs(y) <= 35:
            band.annotate(str(number), (x, y), fontsize=7, xytext=(3, 3),
                          textcoords="offset points")
        else:
            whole.annotate(str(number), (x, y), fontsize=7, xytext=(3, 3),
                           textcoords="offset points")
    whole.set_title("A/B pairs (validation/pairs.csv)")
    band.set_title("within +-35%")
    whole.legend(loc="upper left", fontsize=8)
    save_figure(figure, path)
    return True


def pairs_lines():
    """The A/B pairs table and plot of reports/validation.md."""
    result = run_json(["validate", "--pairs", str(VALIDATION / "pairs.csv")])
    lines = ["## A/B pairs: the predicted change against the measured one", "",
             "`tpusim validate --pairs validation/pairs.csv`: each pair is two runs that differ in "
             "one choice (slice count, slice size, precision, an XLA switch); the error is in "
             "points, 100 x (predicted ratio - measured ratio) of step times, and the direction is "
             "judged where the measured change is at least 3%. The v7x guide's ablations give "
             "relative step times only (measured A = 1); their configurations were fixed in "
             "pairs.csv before any mechanism was measured against them (its config_note column "
             "says why each matches the guide). Op pairs (one op timed alone) are a table of "
             "their own.", ""]
    for level in ("step", "op"):
        chosen = [pair for pair in result["pairs"] if pair["level"] == level]
        lines += [f"| # | {level} pair | quantity | measured change | predicted change | points | "
                  "direction |", "|---|---|---|---|---|---|---|"]
        for number, pair in enumerate(chosen, start=1):
            lines.append(f"| {number} | {pair['id']} | {pair['quantity']} | "
                         f"{100 * (pair['measured_ratio'] - 1):+.1f}% | "
                         f"{100 * (pair['predicted_ratio'] - 1):+.1f}% | "
                         f"{pair['error_points']:+.1f} | {pair['direction']} |")
        summary = result["summary"][level]
        lines += ["", f"**{level.capitalize()} pairs:** median |error| "
                  f"{summary['median_abs_points']:.1f} points, max {summary['max_abs_points']:.1f}; "
                  f"{summary['directions_wrong']} of {summary['directions_judged']} judged "
                  "directions wrong.", ""]
    step_pairs = [pair for pair in result["pairs"] if pair["level"] == "step"]
    if pairs_scatter(step_pairs, ROOT / "reports/pairs_scatter.png"):
        lines += ["![predicted vs measured change of the step-level pairs, numbered as in the "
                  "table](pairs_scatter.png)", ""]
    return lines, result


def gpu_validation_lines(gpu):
    """The GPU section of reports/validation.md from `tpusim validate validation/gpu_published.csv`
    (`gpu`), with each row's prediction without the GPU attention kernel table beside it."""
    lines = ["## NVIDIA GPUs (validation/gpu_published.csv)", "",
             "MaxText on 8-GPU nodes (`hardware=gpu`, nodes = `compile_topology_num_slices`): four "
             "rows on H100 SXM nodes (`compile_topology=a3`: NVSwitch inside a node, one 400 Gb/s "
             "InfiniBand NIC per GPU between nodes, configs/hw/h100-sxm.yml) and one on Google "
             "Cloud A3 Ultra (`compile_topology=a3ultra`: 8 x H200, RoCE, configs/hw/h200-sxm.yml). "
             "No parameter was fitted to these rows: `program_efficiency` is the TPU value. Three "
             "mechanisms are GPU-only, each with its reason in the catalog: "
             "`matmul_output_fusion = 0` (a cuBLAS matmul writes its result to HBM, so the SiLU, "
             "gating, residual and gradient sums that read it are HBM passes of their own; about "
             "+1% on each row), `collective_compute_share = 0.152` (NCCL kernels hold 20 of the "
             "132 SMs while they run, so the compute they overlap runs on the rest: the last "
             "column's *SMs lent to NCCL*; +3% to +10%) and `gpu_attention_kernel_rates` "
             "(`attention=cudnn_flash_te` runs at cuDNN's measured rate for its sequence length "
             "and mask, from the FlashAttention-3 paper's H100 figures, docs/reference/gpu.md §3: "
             "518 TFLOP/s for the causal forward at 4k tokens and about 424 for its backward, "
             "where GEMMs get 0.8 x 989 = 791; not at the GEMM rate). All are assumptions or "
             "figures from NVIDIA/XLA/DeepSeek-V3/FlashAttention-3 sources, not fitted. Before the "
             "first two the H100 rows were -3.0%, -5.4%, -6.3% and -11.1% (all too fast). The "
             "column *without the attention kernel table* is the prediction with the third "
             "switched off (`--without gpu_attention_kernel_rates`; on the H100 rows, the numbers "
             "before it): it moves every row by +2% to +4%, the 7B row from -7.1% to -3.6% and "
             "the A3 Ultra row (added after the mechanism was built, so held out) from -6.2% to "
             "-3.2%, but the two llama2-70b rows further slow, +3.9% to +6.0% (bf16) and +5.6% to "
             "+8.9% (fp8). They are reported, not offset: see the GPU notes under the calibration "
             "parameters below.", "",
             "| id | measured s | predicted s | error | without the attention kernel table | predicted MFU | HBM peak GiB | biggest part of the step |",
             "|---|---|---|---|---|---|---|---|"]
    # Before/after of the GPU attention mechanism (cuDNN's measured rates, docs/reference/gpu.md §3).
    gpu_without_table = run_json(["validate", str(VALIDATION / "gpu_published.csv"),
                                  "--without", "gpu_attention_kernel_rates"])
    table_off = {row["id"]: row for row in gpu_without_table["rows"]}
    for row in gpu["rows"]:
        verdict = "" if row.get("fits", True) else " (predicted OOM)"
        off = table_off[row["id"]]
        lines.append(f"| {row['id']} | {row['measured_step_s']:.3f} | {row['predicted_step_s']:.3f}{verdict} | "
                     f"{100 * row['error']:+.1f}% | {off['predicted_step_s']:.3f} s, "
                     f"{100 * off['error']:+.1f}% | {100 * row['predicted_mfu']:.1f}% | "
                     f"{row['hbm_peak_bytes_per_device'] / 2**30:.1f} | {biggest_part(row)}; SMs lent "
                     f"to NCCL {row['breakdown'].get('compute_shared_with_collectives', 0):.2f} s |")
    gpu_summary = gpu["summary"]
    off_summary = gpu_without_table["summary"]
    lines += ["", f"**GPU summary over {gpu_summary['rows']} rows:** median |error| "
              f"{100 * gpu_summary['median_abs_error']:.1f}%, max {100 * gpu_summary['max_abs_error']:.1f}% "
              f"(without the attention kernel table: {100 * off_summary['median_abs_error']:.1f}%, "
              f"{100 * off_summary['max_abs_error']:.1f}%).", ""]
    return lines


def validation():
    result = run_json(["validate", str(VALIDATION / "published.csv")])
    recipes = recipe_predictions()
    models = published_models()
    lines = ["# Validation against published MaxText step times", "",
             "Generated by `python3 benchmarks/make_reports.py validation` (runs "
             "`tpusim validate validation/published.csv --json`, every public recipe of "
             "validation/recipes_public.json as pasted, each again with one mechanism switched "
             "off (`--without`), and `benchmarks/calibrate.py --loo`). Step times are the "
             "published ones (`measured_step_s`); predictions use one set of catalog parameters "
             "per chip (configs/hw/*.yml), identical across rows.", "",
             "The **recipe** column predicts the same measurement from the full recipe it came "
             "from (validation/recipes_public.json: every arg and XLA flag the run used). The "
             "published.csv rows of 2025-2026 abbreviate those recipes: they leave out the "
             "splash block sizes, megablox tiles, fixed fp8 calibration and remat/offload "
             "choices the runs used, which tpusim now models, so the two columns differ where "
             "those settings matter.", "",
             "| id | chip | measured s | predicted s | error | recipe error | tokens/s/chip measured | predicted | predicted MFU | biggest part of the step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        biggest = biggest_part(row)
        recipe = recipe_of_row(row, recipes, models)
        recipe_error = ""
        if recipe:
            predicted, measured, _, _ = recipes[recipe]
            recipe_error = f"{100 * (predicted / measured - 1):+.1f}%"
        verdict = "" if row.get("fits", True) else " (predicted OOM)"
        lines.append(f"| {row['id']} | {row['hardware']} | {row['measured_step_s']:.3f} | "
                     f"{row['predicted_step_s']:.3f}{verdict} | {100 * row['error']:+.1f}% | {recipe_error} | "
                     f"{row.get('measured_tokens_s_chip', 0):.1f} | {row['predicted_tokens_s_chip']:.1f} | "
                     f"{100 * row['predicted_mfu']:.1f}% | {biggest} |")
    summary = result["summary"]
    recipe_errors = [abs(p / m - 1) for p, m, _, _ in recipes.values()]
    out_of_memory = [row["id"] for row in result["rows"] if not row.get("fits", True)]
    lines += ["", f"**Summary over {summary['rows']} rows:** median |error| "
              f"{100 * summary['median_abs_error']:.1f}%, mean {100 * summary['mean_abs_error']:.1f}%, "
              f"max {100 * summary['max_abs_error']:.1f}%; predicted out of memory: "
              f"{', '.join(out_of_memory) if out_of_memory else 'none'}. "
              f"**Over the {len(recipes)} public recipes as pasted** (reports/compat.md): median "
              f"{100 * statistics.median(recipe_errors):.1f}%, max {100 * max(recipe_errors):.1f}%.", ""]
    gpu = run_json(["validate", str(VALIDATION / "gpu_published.csv")])
    if scatter_plot(result["rows"], recipes, ROOT / "reports/validation_scatter.png", gpu["rows"]):
        lines += ["![predicted vs measured step time](validation_scatter.png)", ""]
    else:
        lines += ["(The scatter plot needs python3-matplotlib: `bash scripts/setup.sh --with-reports`.)", ""]
    more, pairs = pairs_lines()
    lines += more
    lines += gpu_validation_lines(gpu)
    # Ablation: each mechanism switched off, over the published rows and the recipes.
    baseline = {row["id"]: row["error"] for row in result["rows"]}
    baseline_fits = {row["id"]: row.get("fits", True) for row in result["rows"]}
    classes = run_classes()
    run_errors_on = dict(baseline)
    run_errors_on.update({recipe_id: predicted / measured - 1
                          for recipe_id, (predicted, measured, _, _) in recipes.items()})
    class_lines = []
    summaries = mechanism_summaries()
    lines += ["## What each mechanism contributes (ablation)", "",
              "Each line switches one mechanism off (`tpusim validate --without NAME`, the same for "
              "every recipe) and keeps everything else. *Rows it moves* lists the published rows "
              "whose prediction changes by more than 0.5%, with their error on → off. Errors are "
              "median / max of |step error|.", "",
              "| mechanism | what it models | 27 rows, on | 27 rows, off | recipes, on | recipes, off | rows it moves (on → off) |",
              "|---|---|---|---|---|---|---|"]
    for name, what_it_models in summaries.items():
        ablated = run_json(["validate", str(VALIDATION / "published.csv"), "--without", name])
        ablated_recipes = recipe_predictions([name])
        off_errors = [abs(row["error"]) for row in ablated["rows"]]
        moved = []
        for row in ablated["rows"]:
            before = baseline[row["id"]]
            if abs((1 + row["error"]) / (1 + before) - 1) > 0.005:
                moved.append(f"{row['id']} {100 * before:+.0f}→{100 * row['error']:+.0f}%")
            if row.get("fits", True) != baseline_fits[row["id"]]:
                moved.append(f"{row['id']} {'fits' if baseline_fits[row['id']] else 'OOM'}→"
                             f"{'fits' if row.get('fits', True) else 'OOM'}")
        for recipe_id, (predicted, measured, _, _) in ablated_recipes.items():
            before = recipes[recipe_id][0] / recipes[recipe_id][1] - 1
            after = predicted / measured - 1
            if abs((1 + after) / (1 + before) - 1) > 0.005:
                moved.append(f"{recipe_id} {100 * before:+.0f}→{100 * after:+.0f}%")
        off_recipe_errors = [abs(p / m - 1) for p, m, _, _ in ablated_recipes.values()]
        run_errors_off = {row["id"]: row["error"] for row in ablated["rows"]}
        run_errors_off.update({recipe_id: p / m - 1
                               for recipe_id, (p, m, _, _) in ablated_recipes.items()})
        class_lines.append(f"| `{name}` | " + " | ".join(
            f"{class_cell(run_errors_on, classes, cls)} | {class_cell(run_errors_off, classes, cls)}"
            for cls in CLASSES) + " |")
        lines.append(f"| `{name}` | {what_it_models} | "
                     f"{error_summary([abs(e) for e in baseline.values()])} | {error_summary(off_errors)} | "
                     f"{error_summary(recipe_errors)} | {error_summary(off_recipe_errors)} | "
                     f"{'; '.join(moved) if moved else 'none of these runs (see tests/sim/perf/mechanisms_test.cpp)'} |")
    lines += [""]
    counts = {cls: sum(1 for run_id in run_errors_on if cls in classes.get(run_id, ()))
              for cls in CLASSES}
    lines += ["The same switches by class of run: the MoE runs (num_experts > 1) and the "
              "low-precision runs (quantization set: fp8, fp8_full, int8, ...), over the published "
              "rows and the public recipes together (a recipe and the abbreviated published row of "
              f"the same measurement both count): {counts['moe']} MoE runs, "
              f"{counts['low precision']} low-precision runs. Median / max |step error|, with the "
              "mechanism on and off.", "",
              "| mechanism | MoE, on | MoE, off | low precision, on | low precision, off |",
              "|---|---|---|---|---|", *class_lines, ""]
    # The same ablation on the step-level A/B pairs.
    step_points = {pair["id"]: pair["error_points"] for pair in pairs["pairs"]
                   if pair["level"] == "step"}
    lines += ["The same switches on the step-level A/B pairs (`tpusim validate --pairs "
              "validation/pairs.csv --without NAME`): median / max |points|, and the pairs whose "
              "error moves by more than 1 point.", "",
              "| mechanism | pairs, on | pairs, off | pairs it moves (points on → off) |",
              "|---|---|---|---|"]
    for name in summaries:
        ablated = run_json(["validate", "--pairs", str(VALIDATION / "pairs.csv"), "--without", name])
        off = {pair["id"]: pair["error_points"] for pair in ablated["pairs"]
               if pair["level"] == "step"}
        moved = [f"{key} {step_points[key]:+.1f}→{off[key]:+.1f}" for key in step_points
                 if abs(off[key] - step_points[key]) > 1]
        on_abs = [abs(value) for value in step_points.values()]
        off_abs = [abs(value) for value in off.values()]
        lines.append(f"| `{name}` | {statistics.median(on_abs):.1f} / {max(on_abs):.1f} | "
                     f"{statistics.median(off_abs):.1f} / {max(off_abs):.1f} | "
                     f"{'; '.join(moved) if moved else 'none'} |")
    lines += [""]
    loo = subprocess.run([sys.executable, str(ROOT / "benchmarks/calibrate.py"), "--loo",
                          "--binary", str(BINARY)], check=True, capture_output=True, text=True).stdout
    lines += ["## Calibration sweep and leave-one-out", "",
              "`python3 benchmarks/calibrate.py --loo`: the one fitted parameter "
              "(`program_efficiency`, one value for every chip) swept, then each row predicted "
              "with the value fitted on the other 26 rows.", "", "```", loo.rstrip(), "```", ""]
    lines += ["## Kernels (validation/kernels.csv)", "",
              "| id | case | measured | predicted | difference |", "|---|---|---|---|---|"]
    for row_id, size, measured in (("K-1", 1024, 9.1), ("K-2", 4096, 84.3), ("K-3", 8192, 92.3)):
        predicted = run_json(["op", "matmul", f"m={size}", f"n={size}", f"k={size}",
                              "compile_topology=v5e-1"])["percent_of_peak"]
        lines.append(f"| {row_id} | v5e bf16 matmul {size}^3 | {measured:.1f}% of peak | "
                     f"{predicted:.1f}% | {predicted - measured:+.1f} points |")
    gather = run_json(["op", "all_gather", "bytes=33554432", "axes=fsdp", "compile_topology=v5e-32",
                       "ici_fsdp_parallelism=4", "ici_data_parallelism=-1"])
    predicted_us = gather["seconds"] * 1e6
    lines.append(f"| C-1 | v5e all-gather bf16[2048,8192] over 4 chips, no wraparound | 680 us | "
                 f"{predicted_us:.0f} us | {100 * (predicted_us - 680) / 680:+.1f}% |")
    lines += ["", (ROOT / "benchmarks/validation_notes.md").read_text()]
    write_atomically(ROOT / "reports/validation.md", "\n".join(lines))
    print(f"wrote reports/validation.md (median {100 * summary['median_abs_error']:.1f}%, "
          f"max {100 * summary['max_abs_error']:.1f}%)")




def performance():
    benchmark = ROOT / "build/benchmarks/estimate_benchmark"
    output = subprocess.run([str(benchmark), "--benchmark_repetitions=7",
                             "--benchmark_format=json"], check=True, capture_output=True,
                            text=True).stdout
    runs = json.loads(output)["benchmarks"]
    times = {}
    for run in runs:
        if run.get("run_type") == "iteration":
            times.setdefault(run["run_name"], []).append(run["real_time"])
    medians = {name: statistics.median(values) for name, values in times.items()}
    smallest = medians["estimate_405b/tpu7x_16_8chips"]
    lines = ["# Performance of tpusim itself", "",
             "Generated by `python3 benchmarks/make_reports.py performance`, which runs "
             "`build/benchmarks/estimate_benchmark --benchmark_repetitions=7` (Google Benchmark) and "
             "reports the median of the 7 repetitions. Machine: "
             f"{platform.machine()}, {os.cpu_count()} cores (shared and noisy: compare the ratios, "
             "which are measured side by side in one run).", "",
             "| benchmark | median ms | ratio to 8 chips |", "|---|---|---|"]
    for name, value in medians.items():
        ratio = f"{value / smallest:.2f}" if name.startswith("estimate_405b") else "-"
        lines.append(f"| {name} | {value:.2f} | {ratio} |")
    plt = pyplot()
    scaling = sorted((int(re.search(r"_(\d+)chips", name).group(1)), value)
                     for name, value in medians.items()
                     if name.startswith("estimate_405b") and re.search(r"_(\d+)chips", name))
    if plt is not None and scaling:
        figure, axes = plt.subplots(figsize=(6.0, 3.6))
        axes.plot([chips for chips, _ in scaling], [ms for _, ms in scaling], "o-")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("chips in the slice (llama3.1-405b on tpu7x)")
        axes.set_ylabel("one estimate, median ms")
        axes.set_ylim(bottom=0)
        axes.set_title("tpusim estimate time against slice size", fontsize=10)
        save_figure(figure, ROOT / "reports/performance_scaling.png")
        lines += ["", "![estimate time against slice size](performance_scaling.png)"]
    lines += ["", "One full `estimate` is config → per-device program (IR, autodiff, partitioner) → "
              "memory liveness → step simulation; the config load (YAML) is measured separately "
              "(`load_config_only`). The bar: llama3.1-405b on tpu7x-18432 (9216 chips) well under "
              "a second, and flat (within 2x) from 8 to 9216 chips."]
    lines += phase_table()
    lines += train_speed_lines()
    path = ROOT / "reports/performance.md"
    write_atomically(path, "\n".join(lines) + "\n" + kept_sections(path))
    print("wrote reports/performance.md")


def phase_table():
    """Per-phase medians of benchmarks/phase_probe (the work `tpusim explore` repeats)."""
    output = subprocess.run([str(ROOT / "build/benchmarks/phase_probe"), "--benchmark_repetitions=5",
                             "--benchmark_format=json"], check=True, capture_output=True,
                            text=True).stdout
    runs = [run for run in json.loads(output)["benchmarks"] if run.get("run_type") == "iteration"]
    names = list(dict.fromkeys(run["run_name"] for run in runs))
    lines = ["", "## One estimate, phase by phase", "",
             "`build/benchmarks/phase_probe --benchmark_repetitions=5` (medians): each phase of an "
             "estimate of llama3.1-405b on tpu7x-18432 (data 9 x fsdp 2048, "
             "per_device_batch_size=1, 8192 tokens, remat_policy=full) timed alone on inputs built "
             "once. `simulate_step_lean` is the "
             "scheduler with `PerfOptions::record_details = false` (times and FLOPs only, no "
             "breakdown, trace or profile): what `tpusim explore` runs per candidate.", "",
             "| phase | median µs (CPU) | median µs (wall) |", "|---|---|---|"]
    for name in names:
        cpu = statistics.median(run["cpu_time"] for run in runs if run["run_name"] == name)
        real = statistics.median(run["real_time"] for run in runs if run["run_name"] == name)
        lines.append(f"| {name.removeprefix('phase_')} | {cpu:.1f} | {real:.1f} |")
    return lines


# Hand-measured sections (one-off comparisons against an older build) that a regeneration keeps:
# everything from this heading to the end of the file.
KEPT_HEADING = "## Speed-up of the estimate phases"
EXPLORE_KEPT_HEADING = "## Earlier runs (kept)"


TRAIN_HEADING = "## tpusim train"


def train_speed_lines():
    """The "## tpusim train" section: train_benchmark (einsum rate against the GEMM rate, 8
    devices against 1) and benchmarks/train_vs_torch.py (tokens/s against PyTorch)."""
    train = subprocess.run([str(ROOT / "build/benchmarks/train_benchmark"),
                            "--benchmark_repetitions=5", "--benchmark_format=json"], check=True,
                           capture_output=True, text=True).stdout
    runs = [run for run in json.loads(train)["benchmarks"] if run.get("run_type") == "iteration"]

    def median_of(name, key):
        return statistics.median(run[key] for run in runs if run["run_name"] == name)

    cores = os.cpu_count()

    def best_rate(kind):
        rates = [median_of(f"{kind}/{shape}/real_time", "flops_per_s")
                 for shape in ("512/512/512", "2048/256/1024")
                 if any(run["run_name"] == f"{kind}/{shape}/real_time" for run in runs)]
        return max(rates) if rates else 0.0

    def label_of(kind):
        return next((run.get("label", "") for run in runs if run["run_name"].startswith(kind)), "")

    eigen, onednn, onednn_bf16 = (best_rate(kind) for kind in
                                  ("eigen_gemm", "onednn_fp32_gemm", "onednn_bf16_gemm"))
    gemm = max(eigen, onednn)
    one = "one_device_1_thread/real_time"
    one_bf16 = "one_device_1_thread_bf16/real_time"
    one_all = "one_device_all_threads/real_time"
    eight = "eight_devices_all_threads/real_time"
    einsum = median_of(one, "einsum_flops_per_s")
    einsum_bf16 = median_of(one_bf16, "einsum_flops_per_s")
    with tempfile.TemporaryDirectory() as directory:
        result = pathlib.Path(directory) / "vs_torch.json"
        subprocess.run(["/usr/bin/python3", str(ROOT / "benchmarks/train_vs_torch.py"),
                        "--tpusim", str(BINARY), "--runs", "3", "--json", str(result)],
                       check=True)
        versus = json.loads(result.read_text())
    lines = ["", TRAIN_HEADING, "",
             "Generated by `python3 benchmarks/make_reports.py train_speed` (also part of "
             "`performance`), with the default `functional_precision=fast`.", "",
             "**Against PyTorch**, `/usr/bin/python3 benchmarks/train_vs_torch.py --runs 3`: "
             "`tpusim train` (1 simulated device, synthetic data) and an independent fp32 PyTorch "
             f"{versus.get('torch_version', '')} loop of the same Llama (RMSNorm, RoPE, causal GQA "
             "attention, SwiGLU, untied head, AdamW with clipping), written in the script from the "
             "model's definition, all alternating run after run with the same thread count "
             "(torch.set_num_threads, OMP/OpenBLAS threads; tpusim num_threads). tpusim runs "
             "twice: `functional_dtype=float32` (fp32 GEMMs) and `bfloat16_matmul` (bf16 operands, "
             "fp32 accumulation: MaxText's default numerics on a TPU). PyTorch runs fp32, its "
             "fastest mode on this CPU (its bf16 CPU matmuls are slower than its fp32 ones). Each "
             "run's rate is the median over its steps after the first; the table gives the median "
             "over the runs and the ratio of the medians. tpusim runs `remat_policy=none` here "
             "(PyTorch keeps the activations too; MaxText's default, full, recomputes the forward "
             "pass, a third more FLOPs). On a machine shared with other tenants the all-core rows "
             "measure how each copes with contended cores (PyTorch's OpenMP threads collapse "
             "when a core is taken away) more than its parallel speed-up.", "",
             "| model | threads | torch fp32 tokens/s | tpusim fp32 tokens/s | tpusim / torch | "
             "tpusim bf16 matmuls tokens/s | tpusim / torch |",
             "|---|---|---|---|---|---|---|"]
    for name, entry in versus["models"].items():
        for threads, row in entry.items():
            if threads == "config":
                continue
            fp32 = row["tpusim"].get("float32", {})
            bf16 = row["tpusim"].get("bfloat16_matmul", {})
            cells = [f"{fp32.get('tokens_per_s', 0):.0f}", f"{fp32.get('ratio', 0):.2f}",
                     f"{bf16.get('tokens_per_s', 0):.0f}", f"{bf16.get('ratio', 0):.2f}"]
            lines.append(f"| {name} | {threads} | {row['torch_tokens_per_s']:.0f} | "
                         + " | ".join(cells) + " |")
    for name, entry in versus["models"].items():
        c = entry["config"]
        lines.append(f"\n{name}: emb {c['emb']}, {c['heads']} query / {c['kv_heads']} kv heads "
                     f"of {c['head_dim']}, mlp {c['mlp']}, {c['layers']} layers, vocab "
                     f"{c['vocab']}, batch {c['batch']} x {c['length']} tokens, {c['steps']} "
                     "steps per run.")
    devices = versus.get("devices")
    lines += ["", "**GEMM library, einsum rate and simulated devices**, "
              "`build/benchmarks/train_benchmark --benchmark_repetitions=5` (medians).", "",
              "| single-threaded GEMM (better of 512^3 and the step's 2048 x 256 x 1024) | GFLOP/s |",
              "|---|---|",
              f"| Eigen 3.4, fp32 | {eigen / 1e9:.1f} |",
              f"| {label_of('onednn_fp32_gemm') or 'oneDNN'}, fp32 | {onednn / 1e9:.1f} |",
              f"| {label_of('onednn_bf16_gemm') or 'oneDNN'}, bf16 inputs, fp32 accumulation | "
              f"{onednn_bf16 / 1e9:.1f} |", "",
              "The fast einsum takes the faster library by this measurement: oneDNN's JIT kernels "
              "(sim/functional/kernels/library_gemm.h) where the machine has them, else Eigen.", "",
              "One step of the small model (MaxText's default remat_policy=full):", "",
              "| run | ms per step | tokens/s | einsum kernels GFLOP/s |", "|---|---|---|---|"]
    for label, name in (("1 device, 1 thread", one), ("1 device, 1 thread, bf16 matmuls", one_bf16),
                        (f"1 device, {cores} threads", one_all),
                        (f"8 devices (fsdp=4 x tensor=2), {cores} threads", eight)):
        ms = median_of(name, "real_time")
        lines.append(f"| {label} | {ms:.1f} | {median_of(name, 'tokens_per_s'):.0f} | "
                     f"{median_of(name, 'einsum_flops_per_s') / 1e9:.1f} |")
    lines += ["", f"The einsum kernels of a 1-thread fp32 step (their FLOPs over the time inside "
              f"them, packing and layout included) run at {einsum / 1e9:.1f} GFLOP/s, "
              f"{100 * einsum / gemm:.0f}% of the faster fp32 GEMM; with bf16 matmuls at "
              f"{einsum_bf16 / 1e9:.1f} GFLOP/s"
              + (f", {100 * einsum_bf16 / onednn_bf16:.0f}% of the bf16 GEMM" if onednn_bf16 else "")
              + ". 8 simulated devices take "
              f"{median_of(eight, 'real_time') / median_of(one_all, 'real_time'):.2f}x the wall "
              "time of 1 device at the same global batch and threads"
              + (f" (train_vs_torch.py, whole runs: {devices['wall_time_ratio']:.2f}x)"
                 if devices else "") + ".",
              "", "`functional_precision=reference` (double accumulation; what `--verify`'s "
              "unsharded reference and the fp64 PyTorch test use) is about half as fast."]
    return lines + bf16_fallback_lines()


BF16_HEADING = "### bf16 matmuls on a CPU without native bf16 dot products"


def bf16_fallback_lines():
    """benchmarks/bf16_fallback.py: bf16 matmuls against fp32 with oneDNN capped below AVX512-BF16
    (the rounded operands on the fp32 kernels) and as the CPU is."""
    with tempfile.TemporaryDirectory() as directory:
        table = pathlib.Path(directory) / "bf16.md"
        subprocess.run(["/usr/bin/python3", str(ROOT / "benchmarks/bf16_fallback.py"), "--tpusim",
                        str(BINARY), "--runs", "5", "--markdown", str(table)], check=True)
        text = table.read_text().strip()
    return ["", BF16_HEADING, "",
            "`/usr/bin/python3 benchmarks/bf16_fallback.py --runs 5`: the PyTorch comparison's "
            "models, 1 thread, `remat_policy=none`, fp32 and `functional_dtype=bfloat16_matmul` "
            "alternating run after run. `ONEDNN_MAX_CPU_ISA=AVX512_CORE` hides AVX512-BF16 and "
            "AMX from oneDNN, as on a Xeon without them; there tpusim rounds the operands to bf16 "
            "and multiplies them on the fp32 kernels (oneDNN's emulated bf16 kernels ran 2.4x "
            "slower than fp32 on such a Xeon, issue 34). Medians of 5 runs, each the median of its "
            "steps after the first.", "", text]


def train_speed():
    path = ROOT / "reports/performance.md"
    text = path.read_text()
    start = text.index(TRAIN_HEADING)
    end = text.find("\n## ", start + len(TRAIN_HEADING))
    section = "\n".join(train_speed_lines()).lstrip("\n")
    write_atomically(path, text[:start] + section + "\n" + (text[end:] if end >= 0 else ""))
    print("wrote reports/performance.md (tpusim train)")


def kept_sections(path, heading=KEPT_HEADING):
    if not path.exists():
        return ""
    text = path.read_text()
    start = text.find(heading)
    return "" if start < 0 else "\n" + text[start:]


TRAIN_ARGS = ["model_name=tiny-llama", "compile_topology=v5e-4", "ici_fsdp_parallelism=2",
              "ici_tensor_parallelism=2", "per_device_batch_size=4", "max_target_length=64",
              "steps=400", "learning_rate=1e-3", "warmup_steps_fraction=0.05", "dataset_type=text",
              "dataset_path=/usr/share/common-licenses/GPL-3", "eval_interval=50", "eval_steps=4"]


def training():
    import collections
    import math
    text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_bytes()
    # The text is less than one era (2^20 tokens): its last tenth of windows is held out.
    windows = (len(text) - 1) // 64
    train_bytes = text[: (windows - max(1, windows // 10)) * 64]
    counts = collections.Counter(train_bytes)
    unigram = -sum(c / len(train_bytes) * math.log(c / len(train_bytes)) for c in counts.values())
    with tempfile.TemporaryDirectory() as directory:
        metrics = pathlib.Path(directory) / "metrics.jsonl"
        page = pathlib.Path(directory) / "token_viz.html"
        subprocess.run([str(BINARY), "train", *TRAIN_ARGS, f"metrics_file={metrics}",
                        f"token_viz_file={page}", "--quiet"], check=True)
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        screenshot = screenshot_page(page, ROOT / "reports/token_viz.png", directory)
    lines = ["# Training learns: tiny-llama on a real text", "",
             "Generated by `python3 benchmarks/make_reports.py training`, which runs",
             "", "```", "tpusim train " + " ".join(TRAIN_ARGS), "```", "",
             "on 4 simulated v5e devices (fsdp=2 x tensor=2, each holding only its shards), with the",
             "byte-level tokenizer on /usr/share/common-licenses/GPL-3 (35 KB, on every Debian "
             "machine; less than one era of 2^20 tokens, so its last tenth of windows is held out and the "
             "rest shuffled).", "",
             f"Unigram entropy of the training bytes: **{unigram:.3f} nats** (the loss of a model that "
             "only knows byte frequencies). A uniform guess over 256 bytes is 5.545 nats.", "",
             "| step | train loss | eval loss | grad norm | learning rate | tokens/s |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        if "eval_loss" in row or row["step"] in (1, 10, 25):
            eval_loss = f"{row['eval_loss']:.3f}" if "eval_loss" in row else ""
            lines.append(f"| {row['step']} | {row['loss']:.3f} | {eval_loss} | {row['grad_norm']:.3f} | "
                         f"{row['learning_rate']:.2e} | {row['tokens_per_s']:.0f} |")
    best = min(row["eval_loss"] for row in rows if "eval_loss" in row)
    lines += ["", f"Best held-out loss **{best:.3f} nats**, {unigram - best:.3f} nats below the unigram "
              "entropy. The training loss keeps falling below the held-out loss: a 35 KB text is "
              "small for even this model (it starts to memorize). The losses are bitwise the same "
              "on every run; the tokens/s column depends on the machine and its load (2 shared "
              "cores here).", ""]
    plt = pyplot()
    if plt is not None:
        figure, axes = plt.subplots(figsize=(6.4, 3.8))
        axes.plot([row["step"] for row in rows], [row["loss"] for row in rows], label="train loss")
        evals = [row for row in rows if "eval_loss" in row]
        axes.plot([row["step"] for row in evals], [row["eval_loss"] for row in evals], "o-",
                  label="held-out loss")
        axes.axhline(unigram, color="gray", linestyle=":", label=f"unigram entropy {unigram:.2f}")
        axes.set_xlabel("step")
        axes.set_ylabel("loss (nats per byte)")
        axes.set_title("tiny-llama, 4 simulated v5e devices (fsdp=2 x tensor=2)", fontsize=10)
        axes.legend(fontsize=8)
        save_figure(figure, ROOT / "reports/training_loss.png")
        lines += ["![training and held-out loss by step](training_loss.png)", ""]
    lines += ["## Token probabilities", "",
              "The same run with `token_viz_file=token_viz.html` writes, at every evaluation, the "
              "probability the model gives each byte of 4 fixed held-out sequences "
              "(sim/train/token_viz.h). Below, the page in headless Chromium at the last step: "
              "red bytes are surprises (p <= 0.001), yellow p ~ 0.03, green ones predicted (p near "
              "1; the colour follows log p); the selector "
              "goes back to earlier evaluations, and hovering a byte shows its probability.", ""]
    if screenshot:
        lines += ["![the token-probability page of the run at step 400](token_viz.png)", ""]
    else:
        lines += ["(No Chromium here: `bash scripts/setup.sh --with-browser`, then regenerate.)", ""]
    lines += verify_lines()
    write_atomically(ROOT / "reports/training.md", "\n".join(lines))
    print(f"wrote reports/training.md (best eval {best:.3f}, unigram {unigram:.3f})")


VERIFY_HEADING = "## --verify: sharded steps against the unsharded reference"


def verify_lines():
    """The largest differences --verify reports on ten sharded meshes, by numerics: what
    verify_tolerance's defaults are set against."""
    table = subprocess.run(["bash", str(ROOT / "benchmarks/verify_differences.sh"), str(BINARY)],
                           check=True, capture_output=True, text=True).stdout.strip()
    return [VERIFY_HEADING, "",
            "`bash benchmarks/verify_differences.sh`: each row trains 3 steps (synthetic data, "
            "max_target_length 32, learning rate 1e-3) with `--verify`, which starts the unsharded "
            "reference (`functional_precision=reference`) from the sharded run's weights at every "
            "step; the cell is the largest relative L2 difference over the loss, every gradient "
            "and every updated weight and Adam moment. `verify_tolerance`'s defaults, 1e-3 in fp32 "
            "and 2e-2 with bf16 matmuls (sim/train/trainer.cpp), stand 14x and 3x above the "
            "largest; a batch split wrongly was off by 5.9, a sequence split wrongly by 0.07 to "
            "0.15 (issue 35).", "", table, ""]


def screenshot_page(page, png, scratch):
    """Screenshots an HTML page with headless Chromium (as tests/browser/*.sh do); False when
    there is no Chromium."""
    import shutil
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return False
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={scratch}/profile",
                    "--window-size=1000,1000", f"--screenshot={png}", f"file://{page}"],
                   check=True, capture_output=True)
    return png.exists()


STARTUP_BYTES = 50 * 2**20
STARTUP_ARGS = ["model_name=tiny-llama", "compile_topology=v5e-1", "per_device_batch_size=1",
                "max_target_length=64", "steps=1", "dataset_type=text"]


def startup_corpus(path):
    """A >= 50 MiB text, the same on every Debian machine with the same packages: the licences
    and the packages' copyright files, in sorted order, repeated."""
    sources = sorted(pathlib.Path("/usr/share/common-licenses").iterdir())
    sources += sorted(pathlib.Path("/usr/share/doc").glob("*/copyright"))
    parts = [p.read_bytes() for p in sources if p.is_file() and not p.is_symlink()]
    block = b"".join(parts)
    with open(path, "wb") as out:
        written = 0
        while written < STARTUP_BYTES:
            out.write(block)
            written += len(block)
    return written, len(parts)


def timed_train(args):
    """Runs `tpusim train`; returns (seconds to its first step line, seconds to exit, stderr)."""
    start = time.perf_counter()
    process = subprocess.Popen([str(BINARY), "train", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    first_step, lines = None, []
    for line in process.stderr:
        lines.append(line)
        if first_step is None and line.startswith("step "):
            first_step = time.perf_counter() - start
    if process.wait() != 0:
        raise RuntimeError("tpusim train failed: " + "".join(lines))
    assert first_step is not None, "".join(lines)
    return first_step, time.perf_counter() - start, "".join(lines)


def token_cache():
    """Start-up of `tpusim train` on a >= 50 MiB text without the token cache (tokenizing, and
    writing the cache) and with it (mapping the cached tokens), bytes and SentencePiece."""
    import shutil
    runs_cold, runs_warm = 3, 5
    with tempfile.TemporaryDirectory() as directory:
        scratch = pathlib.Path(directory)
        corpus = scratch / "corpus.txt"
        size, files = startup_corpus(corpus)
        # A SentencePiece model learned on a sample of the corpus (the tokenizer, not the point).
        subprocess.run(["spm_train", f"--input={corpus}", f"--model_prefix={scratch}/spm",
                        "--vocab_size=2000", "--model_type=bpe", "--input_sentence_size=200000",
                        "--shuffle_input_sentence=false", "--character_coverage=1.0"],
                       check=True, capture_output=True)
        rows = []
        for name, extra in (("bytes", []),
                            ("SentencePiece (bpe, 2000 pieces)",
                             [f"tokenizer_path={scratch}/spm.model", "vocab_size=2048",
                              "override_model_config=true"])):
            cache = scratch / "cache"
            args = [*STARTUP_ARGS, f"dataset_path={corpus}", *extra]
            # Interleaved, so that the load of the shared machine falls on both kinds alike.
            uncached, building, cached = [], [], []
            for _ in range(runs_cold):
                uncached.append(timed_train(args)[:2])
                shutil.rmtree(cache, ignore_errors=True)
                building.append(timed_train([*args, f"dataset_cache_dir={cache}"])[:2])
            for _ in range(runs_warm):
                first, whole, err = timed_train([*args, f"dataset_cache_dir={cache}"])
                assert "nothing tokenized" in err, err
                cached.append((first, whole))
            rows.append((name, uncached, building, cached))
            shutil.rmtree(cache, ignore_errors=True)
    lines = ["# Start-up of tpusim train with the token cache", "",
             "Generated by `python3 benchmarks/make_reports.py token_cache`. The text: "
             f"{size / 2**20:.1f} MiB ({files} licence and copyright files of /usr/share, in sorted "
             "order, repeated; built in a temporary directory, not committed). Each run is",
             "", "```", "tpusim train " + " ".join(STARTUP_ARGS) + " dataset_path=corpus.txt "
             "[tokenizer_path=spm.model vocab_size=2048 override_model_config=true] "
             "[dataset_cache_dir=cache]", "```", "",
             "timed twice: to its first step line (process start to `step 1`: the time a user "
             "waits for training to start) and whole (to exit; the run waits at its end for the "
             "background tokenizer and the cache it writes). One step of tiny-llama on one device "
             "is a few ms. Building the cache is tokenizing plus writing the chunks (fsync'ed). "
             f"Medians of {runs_cold} runs without a cache and {runs_cold} building it (the cache "
             f"removed before each), and of {runs_warm} runs reading it.", "",
             "Medians, with the range of the runs in parentheses; the speed-up is the ratio of the "
             "medians to the first step without and with the cache.", "",
             "| tokenizer | | no cache (s) | building the cache (s) | from the cache (s) | speed-up |",
             "|---|---|---|---|---|---|"]
    def runs(times):
        return f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})"
    for name, uncached, building, cached in rows:
        for column, label in ((0, "to the first step"), (1, "to exit")):
            pick = lambda pairs: [pair[column] for pair in pairs]
            speedup = statistics.median(pick(uncached)) / statistics.median(pick(cached))
            lines.append(f"| {name if column == 0 else ''} | {label} | {runs(pick(uncached))} | "
                         f"{runs(pick(building))} | {runs(pick(cached))} | {speedup:.0f}x |")
    lines += ["", "Without the cache, training starts once the first 1 MiB piece is tokenized (its "
              "era of 2^20 tokens; the tokenizer goes on in the background on every core): the "
              "first step comes after a fraction of the whole tokenizing time. From the cache "
              "nothing is tokenized: the source is only stat()ed (size and mtime match the index), "
              "and the chunks are memory-mapped and checked against their content hashes "
              "(sim/train/token_cache.h). Times depend on the machine and its load (2 shared cores "
              "here, machine: " + platform.machine() + ").", ""]
    write_atomically(ROOT / "reports/token_cache.md", "\n".join(lines))
    print("wrote reports/token_cache.md: " +
          ", ".join(f"{name} first step {statistics.median(p[0] for p in u):.2f}s uncached, "
                    f"{statistics.median(p[0] for p in c):.2f}s cached" for name, u, _, c in rows))


# Keys the explorer searches: stripped from a published row's args so that the explorer searches
# them at the row's model, slice and global batch.
SEARCHED_PREFIXES = ("ici_", "dcn_")
SEARCHED_KEYS = {"per_device_batch_size", "gradient_accumulation_steps", "remat_policy",
                 "attention", "sa_block_q", "sa_block_kv", "sa_use_fused_bwd_kernel",
                 "decoder_layer_input", "context", "mlpwi", "mlpwi_0", "mlpwi_1", "mlpwo",
                 "query_proj", "key_proj", "value_proj", "qkv_proj", "out_proj",
                 "sparse_core_collective_offload", "collective_matmul", "mesh_placement_first"}


def explore_row_args(args):
    kept, batch = [], 1.0
    for item in args.split():
        key, value = item.split("=", 1)
        if key == "per_device_batch_size":
            batch = float(value)
        if key.startswith(SEARCHED_PREFIXES) or key in SEARCHED_KEYS:
            continue
        kept.append(item)
    return kept, batch


def run_timed_json(args):
    completed = subprocess.run([str(BINARY), *args, "--json"], check=True, capture_output=True,
                               text=True)
    return json.loads(completed.stdout)


def explore():
    import csv
    lines = ["# tpusim explore: speed and the published configurations", "",
             "Generated by `python3 benchmarks/make_reports.py explore`. Machine: "
             f"{platform.machine()}, {os.cpu_count()} cores, shared and noisy (medians of 3 runs).", ""]
    # The machine's speed at the time (shared and noisy): the partition phase of one estimate,
    # which reports/performance.md also gives, so that the timings below can be put in context.
    probe = subprocess.run([str(ROOT / "build/benchmarks/phase_probe"),
                            "--benchmark_filter=phase_partition", "--benchmark_repetitions=3",
                            "--benchmark_format=json"], check=True, capture_output=True,
                           text=True).stdout
    partition_us = statistics.median(
        run["cpu_time"] for run in json.loads(probe)["benchmarks"]
        if run.get("run_type") == "iteration")
    lines += [f"Machine speed when this ran: the `partition` phase of `benchmarks/phase_probe` took "
              f"{partition_us:.0f} µs (median of 3; compare reports/performance.md). The same "
              "binary has measured from about 115 µs (quiet machine) to over 300 µs (loaded by "
              "other tenants), and explore's timings scale with it.", ""]
    # Speed: an exhaustive search of llama3.1-405b on tpu7x-18432, and a mid-size case.
    lines += ["## Speed", "",
              "| search | candidates in space | evaluated | pruned | programs built | threads | "
              "elapsed s (median of 3; 405b: 1 run) | evaluations/s/core |", "|---|---|---|---|---|---|---|---|"]
    cases = [("llama3.1-405b on tpu7x-18432, seq 8192",
              ["explore", "model_name=llama3.1-405b", "compile_topology=tpu7x-18432",
               "max_target_length=8192", "--top", "3"]),
             ("llama2-7b on v5p-32, seq 2048",
              ["explore", "model_name=llama2-7b", "compile_topology=v5p-32",
               "max_target_length=2048", "--top", "3"]),
             ("llama2-7b on v5p-32, seq 2048, every fitting candidate timed "
              "(`--no-branch-and-bound`)",
              ["explore", "model_name=llama2-7b", "compile_topology=v5p-32",
               "max_target_length=2048", "--top", "3", "--no-branch-and-bound"])]
    for index, (label, args) in enumerate(cases):
        # The exhaustive 405b search takes minutes: once, on every core; the small one 3 times.
        for threads in ((os.cpu_count(),) if index == 0 else (1, os.cpu_count())):
            runs = [run_timed_json(args + ["--threads", str(threads)])
                    for _ in range(1 if index == 0 else 3)]
            elapsed = statistics.median(run["elapsed_s"] for run in runs)
            first = runs[0]
            pruned = ", ".join(f"{k} {v}" for k, v in sorted(first["pruned"].items()))
            lines.append(f"| {label} | {first['candidates_in_space']} | "
                         f"{first['candidates_evaluated']} | {pruned} | {first['programs_built']} | "
                         f"{threads} | {elapsed:.2f} | "
                         f"{first['candidates_evaluated'] / elapsed / threads:.0f} |")
    lines += ["", "Evaluations/s/core = candidates fully timed by the performance engine / elapsed "
              "/ threads (pruned candidates are not counted as evaluations; a candidate is one "
              "mesh, batch split, remat policy, placement, attention kind, block size and perf "
              "switch setting). With branch and bound most built programs serve only to bound "
              "candidates out, so its rate is lower than when every fitting candidate is timed; "
              "both searches return the same top N. Reproduce: "
              "`build/sim/tpusim explore model_name=llama3.1-405b compile_topology=tpu7x-18432 "
              "max_target_length=8192 --json`.", ""]
    # Published rows: the explorer at the row's model, slice and global batch.
    lines += ["## Published configurations (validation/published.csv)", "",
              "For each row the searched keys (mesh, batch split, remat and per-tensor remat keys, "
              "attention and block sizes, perf switches) are removed from the published args, and "
              "the explorer searches them at the row's model, slice and global batch "
              "(`--global-batch-size` = per_device_batch_size x devices). Both columns are "
              "tpusim predictions, so they compare configurations, not the model's accuracy "
              "(reports/validation.md has that).", "",
              "| id | published config, predicted tokens/s/chip | explorer best, tokens/s/chip | "
              "speed-up | explore s | best configuration found |", "|---|---|---|---|---|---|"]
    with open(VALIDATION / "published.csv") as handle:
        rows = list(csv.DictReader(handle))
    worse = 0
    speedups = []
    for row in rows:
        published = run_timed_json(["estimate", *row["args"].split()])
        kept, batch = explore_row_args(row["args"])
        devices = published["devices"]
        global_batch = int(round(batch * devices))
        result = run_timed_json(["explore", *kept, "--global-batch-size", str(global_batch),
                                 "--top", "1"])
        if not result["top"]:
            lines.append(f"| {row['id']} | {published['tokens_per_s_per_chip']:.1f} | nothing fits | "
                         f"- | {result['elapsed_s']:.1f} | - |")
            worse += 1
            continue
        best = result["top"][0]
        ratio = best["tokens_per_s_per_chip"] / published["tokens_per_s_per_chip"]
        worse += ratio < 1 - 1e-9
        speedups.append((row["id"], ratio))
        found = " ".join(item for item in best["args"].split() if item not in kept)
        lines.append(f"| {row['id']} | {published['tokens_per_s_per_chip']:.1f} | "
                     f"{best['tokens_per_s_per_chip']:.1f} | {ratio:.3f}x | {result['elapsed_s']:.1f} | "
                     f"`{found}` |")
    lines += ["", f"Rows where the explorer's best is predicted slower than the published "
              f"configuration: {worse} of {len(rows)}."]
    plt = pyplot()
    if plt is not None and speedups:
        figure, axes = plt.subplots(figsize=(7.2, 3.6))
        axes.bar(range(len(speedups)), [ratio for _, ratio in speedups], color="tab:blue")
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.set_xticks(range(len(speedups)))
        axes.set_xticklabels([row_id for row_id, _ in speedups], rotation=70, fontsize=7)
        axes.set_ylabel("explorer best / published (tokens/s/chip)")
        axes.set_title("What the explorer finds at each published row's model, slice and batch",
                       fontsize=10)
        save_figure(figure, ROOT / "reports/explore_speedup.png")
        lines += ["", "![explorer best over the published configuration, per row](explore_speedup.png)"]
    path = ROOT / "reports/explore.md"
    write_atomically(path, "\n".join(lines) + "\n" + kept_sections(path, EXPLORE_KEPT_HEADING))
    print("wrote reports/explore.md")


PIPELINE_BASE = ["model_name=llama3.1-70b", "compile_topology=v5e-256",
                 "compile_topology_num_slices=4", "ici_fsdp_parallelism=-1"]


def pipeline():
    lines = ["# Pipeline parallelism: MaxText's schedule in the estimate and the explorer", "",
             "Generated by `python3 benchmarks/make_reports.py pipeline`. Every number is a "
             "tpusim prediction (no published pipelined run is in validation/published.csv, so "
             "none is validated against a measurement yet).", "",
             "## What is modeled", "",
             "MaxText's SPMD pipeline (`layers/pipeline.py`): with S stages (the `stage` mesh axis, "
             "`ici_pipeline_parallelism` x `dcn_pipeline_parallelism`) every device runs a loop of "
             "M R + (S - 1) d iterations, each running `num_layers_per_pipeline_stage` (k) layers "
             "on one microbatch (global batch / M sequences), with R = layers / (S k) circular "
             "repeats and d = 2 with `pipeline_delay_activation_forwarding`. In tpusim's per-device "
             "program that loop is the decoder layers' region, repeated iterations x k times at "
             "microbatch size; after every k layers the residual stream moves to the next stage "
             "(a collective permute over `stage`, which the next iteration waits for unless "
             "forwarding is delayed), and beside it the input stream and, with circular storage, "
             "the storage mover (two more permutes nothing waits for). The (S - 1) d iterations a "
             "stage computes on nothing are the bubble (`pipeline_bubble` in the breakdown; the "
             "trace has a lane per stage). A device holds its stage's R k layers; the embedding and "
             "the logits shard the batch over the stages too (`activation_embed_and_logits_batch`). "
             "MaxText's checks are errors naming the key (exit 2): microbatches a multiple of the "
             "stages and dividing the batch, S k R = layers.", "",
             "`pipeline_fsdp_ag_once` gathers the stage's weights once per held layer instead of "
             "every iteration (and reduce-scatters their gradients once), and keeps all of them "
             "gathered, with their gathered gradients, through the loops.", "",
             "`tpusim train` runs the same loop on the simulated devices (threads or MPI ranks) "
             "and equals the unsharded step (below); it refuses delayed forwarding "
             "and microbatches that would leave a device part of a sequence.", "",
             "Not modeled yet: `pipeline_parallel_layers` other than all layers and models whose "
             "decoder layers are of several kinds (gemma3, gpt-oss, deepseek's dense + MoE) are "
             "refused; the remat policy applies per layer, not to a whole iteration of k layers "
             "(`set_remat_policy_on_pipeline_iterations`), which matters for k > 1.", "",
             "## llama3.1-70b on 4 x v5e-256, stages over DCN", "",
             "Each row is `tpusim estimate " + " ".join(PIPELINE_BASE) + " <row>`.", "",
             "| schedule | args | iterations | bubble | step s | bubble s | exposed stage "
             "transfers s | exposed DCN gradient reduction s | HBM GiB (of 15.75) |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = [("issue command (default per_device_batch_size)",
             ["dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8"]),
            ("issue command, one pass", ["dcn_pipeline_parallelism=4",
                                         "num_pipeline_microbatches=8",
                                         "num_layers_per_pipeline_stage=20"])]
    small = ["per_device_batch_size=2", "max_target_length=2048"]
    rows += [("no pipeline: data over DCN", ["dcn_data_parallelism=4", *small]),
             ("no pipeline: fsdp over DCN", ["dcn_fsdp_parallelism=4", *small])]
    for microbatches in (4, 8):
        rows.append((f"circular, M={microbatches}",
                     ["dcn_pipeline_parallelism=4", f"num_pipeline_microbatches={microbatches}",
                      *small]))
    rows.append(("circular, M=8, delayed forwarding",
                 ["dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8",
                  "pipeline_delay_activation_forwarding=true", *small]))
    rows.append(("circular, M=8, weights gathered once",
                 ["dcn_pipeline_parallelism=4", "num_pipeline_microbatches=8",
                  "pipeline_fsdp_ag_once=true", *small]))
    for microbatches in (4, 8):
        rows.append((f"one pass (20 layers per stage), M={microbatches}",
                     ["dcn_pipeline_parallelism=4", f"num_pipeline_microbatches={microbatches}",
                      "num_layers_per_pipeline_stage=20", *small]))
    for label, args in rows:
        result = run_json(["estimate", *PIPELINE_BASE, *args])
        breakdown = result["breakdown"]
        schedule = result.get("pipeline")
        stage = sum(v for k, v in breakdown.items() if k.startswith("exposed_") and k.endswith("_stage"))
        lines.append(
            f"| {label} | `{' '.join(args)}` | {schedule['iterations'] if schedule else '-'} | "
            f"{100 * schedule['bubble_fraction']:.1f}% | " if schedule else
            f"| {label} | `{' '.join(args)}` | - | - | ")
        lines[-1] += (f"{result['step_time_s']:.2f} | {breakdown.get('pipeline_bubble', 0):.2f} | "
                      f"{stage:.2f} | {breakdown.get('exposed_dcn_gradient_reduction', 0):.2f} | "
                      f"{result['hbm_peak_bytes_per_device'] / 2**30:.1f}"
                      f"{'' if result['fits'] else ' (OOM)'} |")
    lines += ["", "M = 16 is left out: 2048 sequences in 16 microbatches are 128 per microbatch, "
              "fewer than the 256 fsdp shards, so each device's microbatch is padded to one "
              "sequence (as XLA pads an uneven split) and the step doubles; the explorer keeps "
              "such candidates, and they lose.", "",
              "The bubble is (S - 1) d / iterations of the loop's time: 3 of 163 iterations "
              "circular, 3 of 11 in one pass. `tests/sim/estimate/pipeline_estimate_test.cpp` derives it "
              "by hand: with the microbatch fixed, step = X + (iterations x k) tau + iterations x "
              "pi (tau one layer forward and backward, pi one iteration's hand-overs); k = 1, 2, 4 "
              "give X, tau, pi, k = 5 must follow within 0.5%, and every schedule's bubble must be "
              "3 (k tau + pi) within 1%.", ""]
    lines += pipeline_training()
    # The explorer: PP over DCN against data/FSDP over DCN.
    args = ["explore", *PIPELINE_BASE[:3], "ici_fsdp_parallelism=256", "max_target_length=2048",
            "--top", "5", "--exact-schedules"]
    started = time.monotonic()
    result = run_json(args)
    elapsed = time.monotonic() - started
    lines += ["## The explorer: pipeline over DCN or data/FSDP over DCN?", "",
              f"`tpusim {' '.join(args)}` ({elapsed:.0f} s on {os.cpu_count()} cores, "
              f"{result['candidates_in_space']} candidates, {result['candidates_evaluated']} "
              "timed): one search per schedule, each from nothing (`--exact-schedules`; without it the "
              "later schedules are searched only for what can enter the top N, and the top N is "
              "the same) (no pipeline; 2 or 4 stages over DCN, circular or "
              "one pass, 1, 2 or 4 microbatches per stage), merged by tokens/s/chip. The best of "
              "each schedule, and what it loses time to:", "",
              "| schedule | best step s | tokens/s/chip of the best | bubble s | exposed stage "
              "transfers s | exposed DCN gradient reduction s |", "|---|---|---|---|---|---|"]
    for option in result.get("pipeline_options", []):
        if not option["fits"]:
            lines.append(f"| {option['schedule']} | nothing fits | | | | |")
            continue
        lines.append(f"| {option['schedule']} | {option['best_step_time_s']:.2f} | "
                     f"{option['best_objective']:.0f} | {option['pipeline_bubble_s']:.2f} | "
                     f"{option['exposed_stage_transfers_s']:.2f} | "
                     f"{option['exposed_dcn_gradient_reduction_s']:.2f} |")
    found = [o for o in result.get("pipeline_options", []) if o["fits"]]
    plain = [o for o in found if o["stages"] == 1]
    piped = [o for o in found if o["stages"] > 1]
    if plain and piped:
        best_plain = max(plain, key=lambda o: o["best_objective"])
        best_piped = max(piped, key=lambda o: o["best_objective"])
        lines += ["", f"The best pipeline ({best_piped['schedule']}) reaches "
                  f"{best_piped['best_objective'] / best_plain['best_objective']:.2f}x the "
                  f"tokens/s/chip of the best run without one: of its {best_piped['best_step_time_s']:.2f} s "
                  f"step, {best_piped['exposed_stage_transfers_s']:.2f} s are stage hand-overs over "
                  f"DCN left exposed and {best_piped['pipeline_bubble_s']:.2f} s bubble, while "
                  f"FSDP/data over DCN leaves {best_plain['exposed_dcn_gradient_reduction_s']:.2f} s "
                  "of cross-slice gradient reduction exposed."]
    lines += ["", "Top 5 overall:", "", "| # | step s | tokens/s/chip | mesh | args searched |",
              "|---|---|---|---|---|"]
    for rank, item in enumerate(result["top"], 1):
        searched = " ".join(a for a in item["args"].split()
                            if a.split("=")[0] in ("dcn_data_parallelism", "dcn_fsdp_parallelism",
                                                   "dcn_pipeline_parallelism",
                                                   "num_pipeline_microbatches",
                                                   "num_layers_per_pipeline_stage",
                                                   "per_device_batch_size", "remat_policy"))
        lines.append(f"| {rank} | {item['step_time_s']:.2f} | {item['tokens_per_s_per_chip']:.0f} | "
                     f"{item['mesh']} | `{searched}` |")
    write_atomically(ROOT / "reports/pipeline.md", "\n".join(lines) + "\n")
    print("wrote reports/pipeline.md")


PIPELINE_TRAIN_BASE = ["model_name=tiny-llama", "override_model_config=true",
                       "base_num_decoder_layers=4", "compile_topology=v5e-4",
                       "max_target_length=64", "learning_rate=1e-3"]
PIPELINE_TRAIN_MESHES = [
    ("2 stages x fsdp 2, one pass (2 layers per stage), M=4",
     ["ici_pipeline_parallelism=2", "ici_fsdp_parallelism=2", "num_pipeline_microbatches=4",
      "num_layers_per_pipeline_stage=2", "per_device_batch_size=2"]),
    ("2 stages x fsdp 2, circular (R=2), M=4 (circular storage)",
     ["ici_pipeline_parallelism=2", "ici_fsdp_parallelism=2", "num_pipeline_microbatches=4",
      "num_layers_per_pipeline_stage=1", "per_device_batch_size=2"]),
    ("2 stages x tensor 2, circular, M=2 (around the ring)",
     ["ici_pipeline_parallelism=2", "ici_fsdp_parallelism=1", "ici_tensor_parallelism=2",
      "num_pipeline_microbatches=2", "num_layers_per_pipeline_stage=1",
      "per_device_batch_size=2"]),
    ("4 stages of one layer, M=8",
     ["ici_pipeline_parallelism=4", "ici_fsdp_parallelism=1", "num_pipeline_microbatches=8",
      "num_layers_per_pipeline_stage=1", "per_device_batch_size=4"]),
    ("2 stages x fsdp 2, circular, M=4, weights gathered once",
     ["ici_pipeline_parallelism=2", "ici_fsdp_parallelism=2", "num_pipeline_microbatches=4",
      "num_layers_per_pipeline_stage=1", "per_device_batch_size=2",
      "pipeline_fsdp_ag_once=true"]),
]
PIPELINE_CURVE_STEPS = 100


def train_metrics(args):
    """Runs tpusim train with a metrics file; returns its JSON lines."""
    with tempfile.TemporaryDirectory() as directory:
        metrics = pathlib.Path(directory) / "metrics.jsonl"
        subprocess.run([str(BINARY), "train", *args, f"metrics_file={metrics}", "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def pipeline_training():
    """tpusim train on pipelined meshes: --verify against the unsharded step, and a training
    curve against the same model and batch without stages."""
    lines = ["## tpusim train: the stages run for real", "",
             "Each row is `tpusim train " + " ".join(PIPELINE_TRAIN_BASE) +
             " dataset_type=synthetic steps=3 --verify <row>`: 4 simulated devices each run "
             "their stage's loop (sim/functional/pipeline_loop.cpp), hand microbatches over with "
             "permutes, and the unsharded reference runs beside it. The largest per-tensor "
             "relative L2 difference over the 3 steps (fp32; only the order of summation "
             "differs; the test suite's bound is 1e-5):", "",
             "| mesh | args | loss | gradients | weights and Adam moments |", "|---|---|---|---|---|"]
    for label, args in PIPELINE_TRAIN_MESHES:
        rows = train_metrics([*PIPELINE_TRAIN_BASE, "dataset_type=synthetic", "steps=3",
                              "--verify", *args])
        worst = {key: max(row[key] for row in rows)
                 for key in ("verify_loss_rel_diff", "verify_gradient_rel_diff",
                             "verify_weight_rel_diff")}
        lines.append(f"| {label} | `{' '.join(args)}` | "
                     f"{worst['verify_loss_rel_diff']:.1e} | "
                     f"{worst['verify_gradient_rel_diff']:.1e} | "
                     f"{worst['verify_weight_rel_diff']:.1e} |")
    text = ["dataset_type=text", "dataset_path=/usr/share/common-licenses/GPL-3",
            f"steps={PIPELINE_CURVE_STEPS}", "warmup_steps_fraction=0.05"]
    staged_args = PIPELINE_TRAIN_MESHES[1][1]
    staged = train_metrics([*PIPELINE_TRAIN_BASE, *text, *staged_args])
    plain = train_metrics([*PIPELINE_TRAIN_BASE, *text, "ici_fsdp_parallelism=4",
                           "per_device_batch_size=2"])
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(staged, plain))
    lines += ["", f"Trained {PIPELINE_CURVE_STEPS} steps on GPL-3 (byte tokens) with "
              f"`{' '.join(staged_args)}` and, as the comparison, the same model and batch on "
              "`ici_fsdp_parallelism=4` without stages:", "",
              "| step | loss, 2 stages circular | loss, fsdp 4 |", "|---|---|---|"]
    for index in (0, 9, 24, 49, PIPELINE_CURVE_STEPS - 1):
        lines.append(f"| {staged[index]['step']} | {staged[index]['loss']:.6f} | "
                     f"{plain[index]['loss']:.6f} |")
    lines += ["", f"Largest relative loss difference over the {PIPELINE_CURVE_STEPS} steps: "
              f"{worst:.1e} (fp32 summation order, compounding over the steps).", ""]
    return lines


MPI_ARGS = ["model_name=tiny-llama", "compile_topology=v5e-8", "ici_data_parallelism=2",
            "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "per_device_batch_size=4",
            "max_target_length=128", "steps=10", "learning_rate=1e-3"]
MPI_WARMUP_STEPS = 2  # left out of the step-time median
MPI_REPEATS = 5


def mpi():
    """Step time of the same run in one process and over 1, 2 and 4 MPI ranks, and the bytes the
    ranks sent each other against the network model's count for those collectives."""
    import resource
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    layouts = [("1 process, threads", None), ("mpirun -np 1", 1), ("mpirun -np 2", 2),
               ("mpirun -np 4", 4)]
    tokens = 4 * 8 * 128  # per_device_batch_size x devices x max_target_length
    step_times = {name: [] for name, _ in layouts}
    cpu_times = {name: [] for name, _ in layouts}
    lines_of = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory:
        # Interleaved repeats: the machine's background load hits every layout alike.
        for repeat in range(MPI_REPEATS):
            for name, ranks in layouts:
                metrics = pathlib.Path(directory) / f"{repeat}_{ranks}.jsonl"
                prefix = [str(BINARY)] if ranks is None else [
                    "mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
                    str(BINARY)]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([*prefix, "train", *MPI_ARGS, f"metrics_file={metrics}", "--quiet"],
                               check=True, env=env)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_times[name].append(after.ru_utime + after.ru_stime - before.ru_utime -
                                       before.ru_stime)
                rows = [json.loads(line) for line in metrics.read_text().splitlines()]
                step_times[name].append(statistics.median(
                    tokens / row["tokens_per_s"] for row in rows[MPI_WARMUP_STEPS:]))
                lines_of[name] = rows
    load = max(load, os.getloadavg()[0])
    reference = lines_of["1 process, threads"]
    identical = all(
        [(r["loss"], r["grad_norm"]) for r in rows] ==
        [(r["loss"], r["grad_norm"]) for r in reference] for rows in lines_of.values())
    base = statistics.median(step_times["1 process, threads"])
    base_cpu = statistics.median(cpu_times["1 process, threads"])
    steps = len(reference)
    lines = ["# OpenMPI transport: step time and bytes over MPI", "",
             "Generated by `python3 benchmarks/make_reports.py mpi`. Each layout trains", "",
             "```", "tpusim train " + " ".join(MPI_ARGS), "```", "",
             f"({tokens} tokens per step on 8 simulated v5e devices, data=2 x fsdp=2 x tensor=2) "
             f"{MPI_REPEATS} times, the layouts interleaved; a run's step time is the median of its "
             f"steps after the first {MPI_WARMUP_STEPS} (wall clock of rank 0), the table shows the "
             "median over the runs, and the CPU time of the whole run (all ranks, start-up "
             f"included). `mpirun --oversubscribe --bind-to none -np R`; num_threads=0, so each "
             "rank computes with the host's cores divided among its ranks (at least one).", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, shared with other engineers' "
             f"builds (load average up to {load:.1f} during the measurement): the wall-clock "
             "ratios are noisy, the CPU times less so.", "",
             "| layout | devices per rank | step ms (median) | ratio to 1 process | runs (ms) | "
             "CPU s per run | CPU ratio |", "|---|---|---|---|---|---|---|"]
    for name, ranks in layouts:
        median = statistics.median(step_times[name])
        cpu = statistics.median(cpu_times[name])
        runs = ", ".join(f"{1e3 * t:.0f}" for t in step_times[name])
        lines.append(f"| {name} | {8 // (ranks or 1)} | {1e3 * median:.0f} | "
                     f"{median / base:.2f} | {runs} | {cpu:.1f} | {cpu / base_cpu:.2f} |")
    lines += ["", f"Losses and gradient norms of all {steps} steps of every run bitwise identical "
              f"to the one-process run: **{'yes' if identical else 'NO'}**.", "",
              "On one machine the ranks share the cores the threads of one process use. On this "
              "loaded machine the wall-clock step time mostly says how large a share of the cores "
              "a layout won against the other work (a layout that keeps more threads runnable, as "
              "MPI's polling waits do, wins more), so it swings between runs of the same layout; "
              "the CPU time of a run is the fairer comparison. What MPI costs there: every rank "
              "builds the program and reads the data again, and the parts that cross ranks are "
              "packed, sent and unpacked instead of read from another thread's memory. The point "
              "of the transport is the other direction: a model or mesh too large for one "
              "machine, spread over hosts.", "",
              "## Bytes over MPI per step against the network model", "",
              "`mpi_bytes_sent` (metrics file): the payload all ranks sent each other for the "
              "step's collectives. The model columns are what the network model "
              "(sim/perf/collective_cost.h) charges the collectives whose group spans ranks, summed "
              "over their devices: (N-1)/N x V per device for all-gather, reduce-scatter and "
              "all-to-all, 2 (N-1)/N x V for all-reduce, with V in the IR's dtypes (what `tpusim "
              "program` prints: bf16 activations and weight casts) and again with V in fp32, as the "
              "functional engine carries every value.", "",
              "| layout | MPI bytes | messages | model bytes (IR dtypes) | model bytes (fp32) | "
              "MPI / model fp32 |", "|---|---|---|---|---|---|"]
    ratios = {}
    for name, ranks in layouts:
        if ranks is None:
            continue
        row = lines_of[name][MPI_WARMUP_STEPS]
        model = row["model_cross_rank_bytes_f32"]
        ratios[ranks] = row["mpi_bytes_sent"] / model if model > 0 else None
        ratio = f"{ratios[ranks]:.4f}" if model > 0 else "-"
        lines.append(f"| {name} | {row['mpi_bytes_sent']:.0f} | {row['mpi_messages']} | "
                     f"{row['model_cross_rank_bytes']:.0f} | {model:.0f} | {ratio} |")
    fp32_over_ir = (lines_of["mpirun -np 4"][MPI_WARMUP_STEPS]["model_cross_rank_bytes_f32"] /
                    lines_of["mpirun -np 4"][MPI_WARMUP_STEPS]["model_cross_rank_bytes"])
    lines += ["", f"With 4 ranks (MPI / model = {ratios[4]:.4f}) each rank holds one (data, fsdp) "
              "position and its two tensor devices, so every group that crosses ranks has one "
              "device per rank: the exchange of the parts read sends a device's (N-1)/N share of "
              "a gather or scatter, the chunked all-reduce 2 (N-1)/N, exactly what a ring moves "
              "(tests/mpi/mpi_communicator_test.cpp checks the equality for an all-gather, a "
              "reduce-scatter and an all-reduce with one device per rank). With 2 "
              f"ranks (ratio {ratios[2]:.4f}) the groups over data x fsdp keep two devices on each "
              "rank; what those two exchange stays in memory, which the model, knowing no ranks, "
              "still counts. Against the model in the IR's dtypes MPI carries "
              f"{fp32_over_ir:.2f}x the bytes: the engine computes and moves fp32 where the "
              "program's activations are bf16. With 1 rank nothing crosses a process."]
    write_atomically(ROOT / "reports/mpi.md", "\n".join(lines) + "\n")
    print("wrote reports/mpi.md")

def compat():
    """Every public MaxText recipe of validation/recipes_public.json run as pasted: its args with
    the topology as xpk writes it, and its XLA flags (--xla-flags), against the measured step."""
    with open(VALIDATION / "recipes_public.json") as handle:
        recipes = json.load(handle)
    rows, errors, ran = [], [], 0
    for recipe in recipes:
        args = [str(BINARY), "estimate", f"compile_topology={recipe['topology']}",
                f"compile_topology_num_slices={recipe['num_slices']}", *recipe["args"],
                "--xla-flags", " ".join(recipe["xla_flags"]), "--json"]
        env = {key: value for key, value in os.environ.items()
               if key not in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")}
        result = subprocess.run(args, capture_output=True, text=True, env=env)
        measured = recipe["measured_step_s"]
        if result.returncode != 0:
            message = json.loads(result.stdout)["error"] if result.stdout.strip() else result.stderr
            rows.append(f"| {recipe['id']} | {recipe['topology']} | {measured:.2f} | exit "
                        f"{result.returncode} | | {message} |")
            continue
        ran += 1
        data = json.loads(result.stdout)
        predicted = data["step_time_s"]
        error = predicted / measured - 1
        errors.append(abs(error))
        not_modeled = sorted(data["not_modeled_keys"])
        flags = data["xla_flags"]
        notes = []
        if flags["overrides"]:
            notes.append("flags set " + ", ".join(flags["overrides"]))
        if not_modeled:
            notes.append("not modeled: " + ", ".join(not_modeled))
        if not data["fits"]:
            notes.append("predicted OUT OF MEMORY")
        rows.append(f"| {recipe['id']} | {recipe['topology']} | {measured:.2f} | {predicted:.2f} | "
                    f"{100 * error:+.1f}% | {'; '.join(notes)} |")
    lines = ["# Public MaxText recipes, run as pasted", "",
             "Generated by `python3 benchmarks/make_reports.py compat`: each recipe of "
             "validation/recipes_public.json (22 real recipes: Ironwood `run_recipe.sh` lines, "
             "Trillium and v5p recipes) runs as `tpusim estimate compile_topology=<as written> "
             "<args as written> --xla-flags '<its XLA flags>'`, nothing dropped or renamed. "
             "The test suite runs the same commands (tests/sim/cli/, "
             "EstimateCommand.PublishedRecipesRunAsPasted).", "",
             f"**{ran} of {len(recipes)} run**"
             + ("; the others exit 2 naming the model tpusim does not build yet"
                if ran < len(recipes) else "")
             + ". Over the runs: median |step error| "
             f"{100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}%. These recipes "
             "are not the calibration set (validation/published.csv); several share a "
             "measurement with it. The notes list the MaxText keys set off their default that the "
             "estimate ignores (\"not modeled\"): where a recipe's error is large, they are "
             "the first suspects.", "",
             "| recipe | topology | measured s | predicted s | error | notes |",
             "|---|---|---|---|---|---|", *rows, ""]
    write_atomically(ROOT / "reports/compat.md", "\n".join(lines))
    print(f"wrote reports/compat.md ({ran}/{len(recipes)} run, median "
          f"{100 * statistics.median(errors):.1f}%)")


if __name__ == "__main__":
    REPORTS = {"validation": validation, "performance": performance, "training": training,
               "explore": explore, "mpi": mpi, "compat": compat, "token_cache": token_cache,
               "train_speed": train_speed, "pipeline": pipeline}
    targets = sys.argv[1:] or ["validation", "performance", "training", "mpi"]
    unknown = [target for target in targets if target not in REPORTS]
    if unknown:
        print(f"make_reports: unknown report {', '.join(unknown)} (known: {', '.join(REPORTS)}; "
              "none given: validation, performance, training, mpi)", file=sys.stderr)
        sys.exit(2)
    for target in targets:
        REPORTS[target]()
