#!/usr/bin/env python3
"""End-to-end tests of `mpirun -np R tpusim train` (ctest label "mpi").

Each case runs tpusim as a user would and compares against the one-process (threaded) run of the
same config: per-step loss, gradient norm and eval loss in the metrics file must be identical
(JSON keeps every bit of a double) and the final checkpoints' files identical byte for byte
(their SHA-256 as `sha256sum` computes it). Cases:

  ranks_match_threaded R MODEL  R ranks against the threaded run (MODEL: llama, moe or
                                pipeline)
  cross_resume                  a 2-rank run's checkpoint resumes in one process, a one-process
                                run's in 4 ranks; both continue bitwise like an uninterrupted run
  killed_rank                   rank 1 stalls at step 3, then is SIGKILLed: mpirun's default
                                ends the job and the survivor reports the collective it waited
                                in and the rank; the checkpoints left are all complete
  killed_rank_timeout           the same with mpirun told not to end the job: the survivors time
                                out (collective_timeout_seconds=6) and report, naming both
  bad_rank_count                3 ranks for 8 devices: exit 2 naming the rank count
  eval_ranks_match_threaded R   `tpusim eval` of a threaded run's checkpoint under R ranks
                                gives the eval_loss the run recorded at that step, bitwise

Usage: mpi_train_test.py CASE [ARGS] --tpusim BIN --mpirun MPIRUN
Exit 0 on success, 1 on failure (with what differed).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

COMMON = ["per_device_batch_size=1", "max_target_length=32", "learning_rate=1e-3"]
MODELS = {
    # Dense on data=2 x fsdp=2 x tensor=2: tensor stays inside a rank, data crosses ranks (and
    # fsdp too with 4 ranks); microbatches, evaluation and a text dataset on the way.
    "llama": ["model_name=tiny-llama", "compile_topology=v5e-8", "ici_data_parallelism=2",
              "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2",
              "gradient_accumulation_steps=2", "eval_interval=2", "dataset_type=text",
              "dataset_path=/usr/share/common-licenses/GPL-3"],
    # Mixture of experts over expert=4 x fsdp=2: with 4 ranks its all-to-alls cross ranks.
    "moe": ["model_name=tiny-moe", "compile_topology=v5e-8", "ici_expert_parallelism=4",
            "ici_fsdp_parallelism=2", "sparse_matmul=false", "capacity_factor=4.0"],
    # A circular pipeline: 4 layers on 2 stages (1 layer each, 2 repeats), 4 microbatches, with
    # data=2 x fsdp=2; with 2 or 4 ranks the stage hand-overs and the input stream cross ranks.
    "pipeline": ["model_name=tiny-llama", "override_model_config=true",
                 "base_num_decoder_layers=4", "compile_topology=v5e-8",
                 "ici_pipeline_parallelism=2", "ici_data_parallelism=2",
                 "ici_fsdp_parallelism=2", "num_pipeline_microbatches=4",
                 "num_layers_per_pipeline_stage=1", "per_device_batch_size=2"],
}


def model_overrides(model):
    """COMMON with the model's own values in place of the ones it sets again."""
    own = {item.split("=", 1)[0] for item in MODELS[model]}
    return [item for item in COMMON if item.split("=", 1)[0] not in own] + MODELS[model]
# Bounds a whole mpirun: well above a healthy run (a few seconds), below ctest's timeout; times
# --time-scale (10 in sanitizer builds, whose code runs several times slower).
RUN_LIMIT_S = 90


class Failure(Exception):
    pass


def mpirun_command(args, ranks, extra=()):
    return [args.mpirun, "--oversubscribe", "--bind-to", "none", *extra, "-np", str(ranks),
            args.tpusim]


def run(command, env_extra=None, expect_success=True):
    env = dict(os.environ)
    # mpirun refuses root without these (CI runs as root).
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    env.update(env_extra or {})
    start = time.monotonic()
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True,
                                timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired as error:
        raise Failure(f"did not end within {RUN_LIMIT_S} s: {' '.join(command)}\n"
                      f"{error.stderr}") from error
    elapsed = time.monotonic() - start
    if expect_success and result.returncode != 0:
        raise Failure(f"exit {result.returncode}: {' '.join(command)}\n{result.stderr}")
    return result, elapsed


def train(args, work, name, overrides, ranks=None, extra_mpirun=(), env=None,
          expect_success=True):
    """One training run; ranks None = one process without mpirun."""
    config = [*overrides, f"base_output_directory={work}", f"run_name={name}",
              f"metrics_file={work}/{name}.jsonl"]
    prefix = [args.tpusim] if ranks is None else mpirun_command(args, ranks, extra_mpirun)
    return run([*prefix, "train", *config, "--quiet"], env, expect_success)


def metrics(work, name):
    with open(f"{work}/{name}.jsonl") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def checkpoint_digests(work, name, step):
    """SHA-256 of the checkpoint's tensor files, checked against its state.json record."""
    directory = f"{work}/{name}/checkpoints/{step}"
    with open(f"{directory}/state.json") as stream:
        state = json.load(stream)
    digests = {}
    for file_name, record in state["files"].items():
        with open(f"{directory}/{file_name}", "rb") as stream:
            digest = hashlib.sha256(stream.read()).hexdigest()
        if digest != record["sha256"]:
            raise Failure(f"{directory}/{file_name}: sha256 differs from state.json's record")
        digests[file_name] = digest
    return digests


def compare_curves(actual, expected, what, steps=None):
    keys = ("step", "loss", "grad_norm", "learning_rate", "eval_loss")
    if steps is not None:
        expected = [line for line in expected if line["step"] in steps]
    if len(actual) != len(expected):
        raise Failure(f"{what}: {len(actual)} steps, expected {len(expected)}")
    for got, want in zip(actual, expected):
        for key in keys:
            if got.get(key) != want.get(key):
                raise Failure(f"{what}: step {want['step']} {key} {got.get(key)!r} != "
                              f"{want.get(key)!r} (threaded)")


def ranks_match_threaded(args, work):
    overrides = [*model_overrides(args.model), "steps=4", "enable_checkpointing=true",
                 "checkpoint_period=4"]
    train(args, work, "threaded", overrides)
    train(args, work, "mpi", overrides, ranks=args.ranks)
    threaded = metrics(work, "threaded")
    distributed = metrics(work, "mpi")
    compare_curves(distributed, threaded, f"{args.ranks} ranks")
    if checkpoint_digests(work, "mpi", 4) != checkpoint_digests(work, "threaded", 4):
        raise Failure(f"{args.ranks} ranks: the final checkpoint differs from the threaded run's")
    for line in distributed:
        if not line.get("mpi_bytes_sent", 0) > 0:
            raise Failure(f"step {line['step']}: no bytes went over MPI ({line})")
    print(f"{args.ranks} ranks ({args.model}): {len(threaded)} steps bitwise equal, final "
          f"checkpoint identical; {distributed[0]['mpi_bytes_sent']:.0f} B over MPI per step, "
          f"network model {distributed[0]['model_cross_rank_bytes_f32']:.0f} B (fp32)")


def cross_resume(args, work):
    overrides = [*COMMON, *MODELS["llama"], "enable_checkpointing=true", "checkpoint_period=2",
                 "learning_rate_schedule_steps=4"]
    train(args, work, "straight", [*overrides, "steps=4"])
    straight = metrics(work, "straight")
    final = checkpoint_digests(work, "straight", 4)
    for writer, reader in ((2, None), (None, 4)):
        name = f"from_{writer or 1}_to_{reader or 1}"
        train(args, work, name, [*overrides, "steps=2"], ranks=writer)
        train(args, work, name, [*overrides, "steps=4"], ranks=reader)
        # The resumed run carries the first half's metrics in its checkpoint: all 4 steps.
        compare_curves(metrics(work, name), straight, name)
        if checkpoint_digests(work, name, 4) != final:
            raise Failure(f"{name}: the final checkpoint differs from the uninterrupted run's")
        print(f"{name}: resumed at step 3, steps 1-4 and the final checkpoint bitwise equal")


def check_checkpoints_complete(work, name):
    """Every checkpoint left behind is whole (no half-written one is visible)."""
    directory = f"{work}/{name}/checkpoints"
    steps = sorted(int(entry) for entry in os.listdir(directory) if entry.isdigit())
    for step in steps:
        checkpoint_digests(work, name, step)
    return steps


# Long enough that a rank merely slowed down (a loaded machine, a sanitizer build: 30 s was seen
# to pass before the killed rank even reached its fault) is not taken for a dead one.
KILLED_RANK_TIMEOUT_S = 6


def killed_rank(args, work, timeout_mode):
    overrides = [*COMMON, *MODELS["llama"], "steps=6", "enable_checkpointing=true",
                 "checkpoint_period=1", f"collective_timeout_seconds={KILLED_RANK_TIMEOUT_S}"]
    extra = ("--mca", "orte_abort_on_non_zero_status", "0") if timeout_mode else ()
    result, elapsed = train(args, work, "killed", overrides, ranks=2, extra_mpirun=extra,
                            env={"TPUSIM_FAULT_KILL_RANK": "1", "TPUSIM_FAULT_AT_STEP": "3"},
                            expect_success=False)
    stderr = result.stderr
    if result.returncode == 0:
        raise Failure(f"the job with a killed rank exited 0\n{stderr}")
    if "rank 1: TPUSIM_FAULT_KILL_RANK" not in stderr:
        raise Failure(f"the fault hook did not fire\n{stderr}")
    if timeout_mode:
        # Sanitizer builds scale collective waits as they scale the test limits.
        expected = ["tpusim: rank 0: collective ",
                    f"timed out after {KILLED_RANK_TIMEOUT_S * args.time_scale} s waiting for rank(s) 1"]
    elif args.time_scale == 1:
        expected = ["tpusim: rank 0: stopped by SIGTERM", "while waiting in collective ",
                    "for rank(s) 1", "rank 1 with PID"]
    else:
        # Several times slower, rank 0 may still be computing when mpirun's SIGTERM comes.
        expected = ["tpusim: rank 0: stopped by SIGTERM", "rank 1 with PID"]
    for text in expected:
        if text not in stderr:
            raise Failure(f"stderr lacks {text!r}\n{stderr}")
    # Rank 0 may be stopped while it writes step 2's checkpoint: then only step 1's is there.
    steps = check_checkpoints_complete(work, "killed")
    if steps not in ([1], [1, 2]):
        raise Failure(f"checkpoints {steps}, expected complete ones of steps 1 (and 2)")
    report = [line for line in stderr.splitlines() if line.startswith("tpusim: rank 0")]
    print(f"exit {result.returncode} after {elapsed:.1f} s; {report[0]}")


def bad_rank_count(args, work):
    result, _ = train(args, work, "bad", [*COMMON, *MODELS["llama"], "steps=1"], ranks=3,
                      expect_success=False)
    if result.returncode != 2:
        raise Failure(f"exit {result.returncode}, expected 2\n{result.stderr}")
    for text in ("mpirun -np 3", "8 simulated devices", "do not divide"):
        if text not in result.stderr:
            raise Failure(f"stderr lacks {text!r}\n{result.stderr}")
    print("exit 2: " + next(line for line in result.stderr.splitlines() if "-np 3" in line))


def explore_ranks_match_one_process(args, work):
    """tpusim explore under mpirun splits the meshes over the ranks and merges: the same top
    candidates and the same counts as one process (branch and bound's own count aside)."""
    explore_args = ["explore", "model_name=tiny-llama", "compile_topology=v5e-4",
                    "max_target_length=256", "--global-batch-size", "8", "--top", "3", "--json"]
    one, _ = run([args.tpusim, *explore_args])
    split, _ = run(mpirun_command(args, args.ranks) + [*explore_args, "--threads", "1"])
    expected, actual = json.loads(one.stdout), json.loads(split.stdout)
    if actual["ranks"] != args.ranks:
        raise Failure(f"ranks {actual['ranks']}, expected {args.ranks}")
    for reason in ("axis_does_not_divide", "weights_exceed_hbm", "does_not_fit_hbm"):
        if expected["pruned"].get(reason, 0) != actual["pruned"].get(reason, 0):
            raise Failure(f"pruned {reason}: {actual['pruned']} vs {expected['pruned']}")
    timed = lambda result: result["candidates_evaluated"] + result["pruned"].get("cannot_beat_top", 0)
    if timed(expected) != timed(actual):
        raise Failure(f"evaluated or bounded {timed(actual)} vs {timed(expected)}")
    for rank, (mine, theirs) in enumerate(zip(actual["top"], expected["top"])):
        if mine["args"] != theirs["args"] or mine["step_time_s"] != theirs["step_time_s"]:
            raise Failure(f"top {rank}: {mine['args']} vs {theirs['args']}")
    if len(actual["top"]) != len(expected["top"]):
        raise Failure("different number of top candidates")
    print(f"{args.ranks} ranks: same top {len(actual['top'])} and counts as one process")


def eval_ranks_match_threaded(args, work):
    overrides = [*model_overrides("llama"), "steps=2", "enable_checkpointing=true",
                 "checkpoint_period=2", "eval_steps=2"]
    train(args, work, "threaded", overrides)
    recorded = metrics(work, "threaded")[-1]["eval_loss"]
    keys = [item for item in overrides if not item.startswith(("steps=", "enable_checkpointing",
                                                               "checkpoint_period"))]
    result, _ = run(mpirun_command(args, args.ranks) +
                    ["eval", f"{work}/threaded/checkpoints/2", *keys, "--json"])
    loss = json.loads(result.stdout)["loss"]
    if loss != recorded:
        raise Failure(f"{args.ranks} ranks: eval loss {loss!r} != train's eval_loss {recorded!r}")
    print(f"{args.ranks} ranks: tpusim eval of step 2 = train's eval_loss {loss!r}, bitwise")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["ranks_match_threaded", "cross_resume", "killed_rank",
                                         "killed_rank_timeout", "bad_rank_count",
                                         "explore_ranks_match_one_process",
                                         "eval_ranks_match_threaded"])
    parser.add_argument("ranks", nargs="?", type=int, default=2)
    parser.add_argument("model", nargs="?", default="llama", choices=sorted(MODELS))
    parser.add_argument("--tpusim", required=True)
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--time-scale", type=int, default=1)
    args = parser.parse_args()
    global RUN_LIMIT_S
    RUN_LIMIT_S *= args.time_scale
    work = tempfile.mkdtemp(prefix=f"tpusim_mpi_{args.case}_")
    try:
        if args.case == "ranks_match_threaded":
            ranks_match_threaded(args, work)
        elif args.case == "cross_resume":
            cross_resume(args, work)
        elif args.case == "killed_rank":
            killed_rank(args, work, timeout_mode=False)
        elif args.case == "killed_rank_timeout":
            killed_rank(args, work, timeout_mode=True)
        elif args.case == "explore_ranks_match_one_process":
            explore_ranks_match_one_process(args, work)
        elif args.case == "eval_ranks_match_threaded":
            eval_ranks_match_threaded(args, work)
        else:
            bad_rank_count(args, work)
    except Failure as failure:
        print(f"FAIL {args.case}: {failure}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
