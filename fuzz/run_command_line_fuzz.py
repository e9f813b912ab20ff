"""Command-line fuzz: N generated tpusim command lines, each checked against the CLI's contract.

The contract: every command ends with exit 0, or exit 2 and a one-line "tpusim: ..." message on
stderr (plus an error object on stdout under --json); never a crash, a hang (a command over
--timeout seconds), exit 1 (an internal error), or a file changed outside the run's directory.

fuzz/command_lines.py draws the lines (classes: see its header); fuzz/command_line_driver runs them
through tpusim::run_cli in chunks of --chunk lines, one process per chunk. When a driver process
dies (a crash or a hang), its progress file names the line, which is recorded; the chunk goes on
after it. At the end the runner checks that nothing outside the sandbox's work/ directory changed:
the files in outside/ (a symbolic link in work/ points at one), /dev/full still a device, the
repository's tracked and untracked files as they were. The inputs that lines also name as
outputs (work/alias/: a config file, a dataset, a checkpoint trained once before the run) are
checked after every chunk; when one changed, each line of the chunk naming it runs again alone,
with the inputs put back, and the line that changes it is the violation.

Writes a JSON summary (--summary) and exits 1 when the contract was broken anywhere.

Example (the default test tier runs 2,000 lines; the slow tier 1,000,000):
    python3 fuzz/run_command_line_fuzz.py --driver build/fuzz/command_line_driver --repo . \\
        --count 2000 --seed 1 --summary /tmp/cli_fuzz.json
"""

import argparse
import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import command_lines  # noqa: E402


def snapshot(directory):
    """Path -> (kind, content hash or link target) for everything under directory."""
    found = {}
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    found[path] = ("file", hashlib.sha256(handle.read()).hexdigest())
            else:
                found[path] = ("other", stat.S_IFMT(info.st_mode))
    return found


def aliased_inputs_changed(before, directory, checkpoint):
    """The files a line names as both input and output (sandbox work/alias/) whose bytes changed
    or that are gone, and new files inside the checkpoint directory."""
    after = snapshot(directory)
    problems = ["%s changed" % path for path, state in sorted(before.items())
                if after.get(path) != state]
    problems += ["%s is new inside the checkpoint" % path for path in sorted(after)
                 if path not in before and path.startswith(checkpoint + os.sep)]
    return problems


def restore_aliased_inputs(before, saved, directory):
    """Puts back the aliased inputs (before: their snapshot; saved: file path -> bytes) after a
    line changed them: removes what is new, rewrites the files."""
    for path in sorted(set(snapshot(directory)) - set(before), reverse=True):
        subprocess.run(["rm", "-rf", path], check=False)
    for path, (kind, _) in sorted(before.items()):
        if kind == "other" and not os.path.isdir(path):
            subprocess.run(["rm", "-rf", path], check=False)
            os.makedirs(path, exist_ok=True)
    for path, data in saved.items():
        if os.path.isdir(path) and not os.path.islink(path):
            subprocess.run(["rm", "-rf", path], check=False)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)


def repository_state(repo):
    """git status --porcelain (tracked changes and untracked files), or None outside git."""
    result = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--ignored=no"],
                            capture_output=True, text=True, check=False)
    return result.stdout if result.returncode == 0 else None


def run_chunk(driver, lines_path, work, timeout, progress_path):
    """Runs the driver over lines_path from its first line; returns (summary or None, rc)."""
    command = [str(driver), "--input", str(lines_path), "--progress-file", str(progress_path),
               "--timeout", str(timeout)]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False,
                            stdin=subprocess.DEVNULL, errors="replace")
    if result.returncode == 0:
        return json.loads(result.stdout), 0, result.stderr
    return None, result.returncode, result.stderr


def report(violation):
    """One violation on stderr as soon as it is found (a long run's log shows it at once)."""
    print("VIOLATION %s: %s\n  %s\n  %s" % (violation["class"], violation["problem"],
                                           violation["command"][:300],
                                           violation.get("stderr", "")[:300].strip()),
          file=sys.stderr, flush=True)


def markdown(result):
    """The summary as a Markdown section: one row per class, then what broke the contract."""
    doc = command_lines.__doc__.split("\n\n")[1].replace("\n", " ")
    lines = ["## Generated command lines", "",
             "%d command lines (seed %d) in %.0f s of wall time (one driver process at a time, "
             "on a shared 2-core machine), %.1f ms each; peak memory of a driver process "
             "%.0f MiB. %s" % (result["commands"], result["seed"], result["seconds"],
                                               1000 * result["seconds"] / result["commands"],
                                               result["peak_rss_mib"], doc), "",
             "| class | commands | exit 0 | exit 2 | other | slowest (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, stats in sorted(result["classes"].items()):
        codes = stats["exit_codes"]
        other = sum(count for code, count in codes.items() if code not in ("0", "2"))
        lines.append("| %s | %d | %d | %d | %d | %.2f |" % (
            label, stats["count"], codes.get("0", 0), codes.get("2", 0), other,
            stats["slowest_seconds"]))
    lines += ["", "Contract violations (crash, hang, exit 1, a multi-line or missing message): "
              "**%d**." % len(result["violations"])]
    for violation in result["violations"][:20]:
        lines.append("- %s, %s: `%s`" % (violation["class"], violation["problem"],
                                         violation["command"][:200].replace("\t", " ")))
    lines += ["", "Files changed outside the run's directory: **%d**." %
              len(result["files_changed_outside"])]
    lines += ["%s" % problem for problem in result["files_changed_outside"]]
    if result["memory_jumps"]:
        lines += ["", "Commands that raised a driver's peak memory by more than 256 MiB:"]
        lines += ["- `%s` (%.0f MiB)" % (jump["command"][:160].replace("\t", " "),
                                        jump["peak_mib"]) for jump in result["memory_jumps"][:10]]
    lines += ["", "Reproduce: `%s` (after `bash scripts/build.sh`)." % result["reproduce"], ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", type=Path, required=True)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=20000)
    parser.add_argument("--timeout", type=int, default=60, help="seconds per command")
    parser.add_argument("--sandbox", type=Path, help="default: a new temporary directory")
    parser.add_argument("--summary", type=Path, help="write the JSON summary here")
    parser.add_argument("--markdown", type=Path,
                        help="write the summary as a Markdown section (for reports/reliability.md)")
    parser.add_argument("--markdown-from", type=Path,
                        help="only turn this JSON summary into --markdown, run nothing")
    options = parser.parse_args()
    if options.markdown_from:
        options.markdown.write_text(markdown(json.loads(options.markdown_from.read_text())))
        return 0
    options.driver = options.driver.resolve()
    options.repo = options.repo.resolve()

    sandbox_root = options.sandbox or Path(tempfile.mkdtemp(prefix="tpusim-cli-fuzz-"))
    sandbox_root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    keys = command_lines.Keys(options.repo)
    sandbox = command_lines.Sandbox(sandbox_root, options.repo)
    sandbox.write_configs(rng, keys, 300)
    sandbox.write_csvs(rng, 60)
    generator = command_lines.Generator(rng, keys, sandbox)
    # A real checkpoint for the aliasing lines (export-hf CK CK), trained once by the driver.
    setup_line = "\t".join(["setup", "train", "model_name=tiny-llama", "compile_topology=v5e-1",
                             "steps=1", "per_device_batch_size=1", "max_target_length=8",
                             "checkpoint_period=1", "enable_checkpointing=true", "--quiet",
                             "run_name=ck", "base_output_directory=" +
                             str(sandbox.alias_dir / "runs")])
    (sandbox_root / "setup.tsv").write_text(setup_line + "\n")
    run_chunk(options.driver, sandbox_root / "setup.tsv", sandbox.work, options.timeout,
              progress_path=sandbox_root / "progress")
    trained = sandbox.alias_dir / "runs" / "ck" / "checkpoints" / "1"
    if trained.is_dir():
        sandbox.alias["checkpoint"] = str(trained)
    else:
        print("cli fuzz: the setup train wrote no checkpoint; export-hf lines use a stand-in",
              file=sys.stderr)
    alias_before = snapshot(sandbox.alias_dir)
    alias_saved = {path: Path(path).read_bytes() for path, (kind, _) in alias_before.items()
                   if kind == "file"}
    outside_before = snapshot(sandbox.outside)
    repo_before = repository_state(options.repo)
    dev_full_before = stat.S_ISCHR(os.stat("/dev/full").st_mode)

    classes = {}
    violations = []
    memory_jumps = []
    start = time.monotonic()
    done = 0
    lines_path = sandbox_root / "chunk.tsv"
    progress_path = sandbox_root / "progress"
    peak_rss = 0.0

    def run_lines(lines):
        lines_path.write_text("\n".join(lines) + "\n")
        return run_chunk(options.driver, lines_path, sandbox.work, options.timeout, progress_path)

    def add_summary(summary, chunk, first):
        nonlocal peak_rss
        for label, stats in summary["classes"].items():
            total = classes.setdefault(label, {"count": 0, "exit_codes": {},
                                               "slowest_seconds": 0.0})
            total["count"] += stats["count"]
            for exit_code, count in stats["exit_codes"].items():
                total["exit_codes"][exit_code] = total["exit_codes"].get(exit_code, 0) + count
            total["slowest_seconds"] = max(total["slowest_seconds"], stats["slowest_seconds"])
        for violation in summary["violations"]:
            violation["command"] = chunk[first + violation["line"] - 1]
            violations.append(violation)
            report(violation)
        peak_rss = max(peak_rss, summary["peak_rss_mib"])
        for jump in summary["memory_jumps"]:
            jump["command"] = chunk[first + jump["line"] - 1]
            memory_jumps.append(jump)

    while done < options.count:
        size = min(options.chunk, options.count - done)
        chunk = []
        for _ in range(size):
            label, argv = generator.line()
            argv = [command_lines.unescape_literal(token) for token in argv]
            chunk.append("\t".join([label] + [command_lines.escape(t) for t in argv]))
        first = 0
        while first < len(chunk):
            summary, code, errors = run_lines(chunk[first:])
            if summary is not None:
                add_summary(summary, chunk, first)
                break
            # The driver died on a line: run the lines before it again (their outcomes died with
            # the process), record the culprit, go on after it.
            text = progress_path.read_text().strip() if progress_path.exists() else "0"
            line = max(int(text or "0"), 1)
            if line > 1:
                before, _, _ = run_lines(chunk[first:first + line - 1])
                if before is not None:
                    add_summary(before, chunk, first)
            what = "hang" if code == 3 else ("signal %d" % -code if code < 0 else "exit %d" % code)
            culprit = chunk[first + line - 1]
            label = culprit.split("\t", 1)[0]
            violations.append({"class": label, "problem": what, "command": culprit,
                               "stderr": errors[-400:]})
            report(violations[-1])
            total = classes.setdefault(label, {"count": 0, "exit_codes": {},
                                               "slowest_seconds": 0.0})
            total["count"] += 1
            total["exit_codes"][what] = total["exit_codes"].get(what, 0) + 1
            first += line
        if aliased_inputs_changed(alias_before, str(sandbox.alias_dir),
                                  sandbox.alias["checkpoint"]):
            # Some line wrote over an input it also read: run each line that names an aliased
            # file again on its own, with the inputs put back, to find which.
            restore_aliased_inputs(alias_before, alias_saved, str(sandbox.alias_dir))
            suspects = [text for text in chunk if str(sandbox.alias_dir) in text]
            found = len(violations)
            for text in suspects[:500]:
                run_lines([text])
                problems = aliased_inputs_changed(alias_before, str(sandbox.alias_dir),
                                                  sandbox.alias["checkpoint"])
                if problems:
                    violations.append({"class": text.split("\t", 1)[0],
                                       "problem": "input changed: " + "; ".join(problems)[:300],
                                       "command": text, "stderr": ""})
                    report(violations[-1])
                    restore_aliased_inputs(alias_before, alias_saved, str(sandbox.alias_dir))
            if len(violations) == found:
                violations.append({"class": "alias_output", "problem": "an aliased input "
                                   "changed in this chunk; no line changes it alone",
                                   "command": "chunk from line %d" % (done + 1), "stderr": ""})
                report(violations[-1])
                restore_aliased_inputs(alias_before, alias_saved, str(sandbox.alias_dir))
        done += size
        print("cli fuzz: %d of %d commands, %d violations, %.0f s" %
              (done, options.count, len(violations), time.monotonic() - start), file=sys.stderr)

    changed = []
    outside_after = snapshot(sandbox.outside)
    if outside_after != outside_before:
        changed.append("files outside the run directory changed: %s" % sorted(
            set(outside_after.items()) ^ set(outside_before.items())))
    if stat.S_ISCHR(os.stat("/dev/full").st_mode) != dev_full_before:
        changed.append("/dev/full is no longer a character device")
    if not os.path.islink(sandbox.work / "link_to_outside"):
        changed.append("work/link_to_outside was replaced")
    repo_after = repository_state(options.repo)
    if repo_after != repo_before:
        changed.append("the repository changed: %r -> %r" % (repo_before, repo_after))
    extra = sorted(str(p) for p in sandbox_root.iterdir()
                   if p.name not in ("work", "outside", "chunk.tsv", "progress", "setup.tsv"))
    if extra:
        changed.append("new files beside work/: %s" % extra)

    result = {
        "commands": options.count, "seed": options.seed, "seconds": time.monotonic() - start,
        "peak_rss_mib": peak_rss, "memory_jumps": memory_jumps, "classes": classes, "violations": violations,
        "files_changed_outside": changed,
        "reproduce": "python3 fuzz/run_command_line_fuzz.py --driver build/fuzz/command_line_driver"
                     " --repo . --count %d --seed %d" % (options.count, options.seed),
    }
    if options.summary:
        temporary = options.summary.with_suffix(".tmp")
        temporary.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, options.summary)
    if options.markdown:
        temporary = options.markdown.with_suffix(".tmp")
        temporary.write_text(markdown(result))
        os.replace(temporary, options.markdown)
    for problem in changed:
        print("FILES: " + problem, file=sys.stderr)
    exit_zero = sum(c["exit_codes"].get("0", 0) for c in classes.values())
    print("cli fuzz: %d commands in %.0f s (%d classes): %d exit 0, %d exit 2, %d violations, "
          "%d file problems" % (options.count, result["seconds"], len(classes), exit_zero,
                                sum(c["exit_codes"].get("2", 0) for c in classes.values()),
                                len(violations), len(changed)))
    if not options.sandbox:
        subprocess.run(["rm", "-rf", str(sandbox_root)], check=False)
    return 1 if violations or changed else 0


if __name__ == "__main__":
    sys.exit(main())
