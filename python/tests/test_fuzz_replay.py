"""The command-line fuzzer's generated estimate, explore and validate inputs
(fuzz/command_lines.py), replayed through the module: no input crashes the interpreter, and the
only exception bad input raises is tpusim.ConfigError. A few hundred lines in the fast tier, a
few thousand in the slow; and plain estimate lines give what the CLI gives.

Each line's argv becomes the module call with the same arguments: tokens that are not options
are the config list, as the CLI takes them; --xla-flags, --without, --pairs and explore's
options become the keywords of the same names (their text as given: the module converts and
checks it); options that only write files or choose a format (--trace, --html, --profile,
--json, --csv, --progress) are left out, since the module writes no files.
"""

import os
import random
import sys

import pytest
import tpusim
from conftest import ROOT, differences

sys.path.insert(0, str(ROOT / "fuzz"))
import command_lines  # noqa: E402

# Options whose value the module does not take, and flags it has no use for.
DROPPED_WITH_VALUE = {"--trace", "--html", "--profile"}
DROPPED_FLAGS = {"--json", "--csv", "--progress"}
KEYWORDS = {"--xla-flags": "xla_flags", "--without": "without", "--pairs": "pairs",
            "--top": "top", "--objective": "objective",
            "--global-batch-size": "global_batch_size",
            "--max-per-device-batch": "max_per_device_batch",
            "--min-hbm-headroom": "min_hbm_headroom", "--threads": "threads"}
FLAGS = {"--no-branch-and-bound": ("branch_and_bound", False),
         "--exact-schedules": ("exact_schedules", True)}


def module_call(argv):
    """(function, positional tokens, keywords) for one fuzz line's argv."""
    command, tokens = argv[0], argv[1:]
    positional, keywords = [], {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        is_option = token.startswith("--")
        name, has_inline, inline = token.partition("=") if is_option else (token, "", "")
        if name in DROPPED_FLAGS and not has_inline:
            index += 1
        elif name in DROPPED_WITH_VALUE or name in KEYWORDS:
            value = inline if has_inline else (tokens[index + 1] if index + 1 < len(tokens) else "")
            index += 1 if has_inline else 2
            if name in KEYWORDS:
                keywords[KEYWORDS[name]] = value
        elif name in FLAGS and not has_inline:
            keywords[FLAGS[name][0]] = FLAGS[name][1]
            index += 1
        else:
            positional.append(token)
            index += 1
    if command == "validate":
        keywords.pop("xla_flags", None)
        csv = positional if len(positional) != 1 else positional[0]
        return tpusim.validate, ([] if not positional else [csv]), keywords
    return getattr(tpusim, command), [positional], keywords


def replay_lines(count, seed, sandbox):
    """`count` generated lines of estimate, explore or validate (the others are drawn and
    skipped, so the mix is the fuzzer's)."""
    rng = random.Random(seed)
    keys = command_lines.Keys(ROOT)
    box = command_lines.Sandbox(sandbox, ROOT)
    box.write_configs(rng, keys, 300)
    box.write_csvs(rng, 60)
    generator = command_lines.Generator(rng, keys, box)
    lines = []
    while len(lines) < count:
        label, argv = generator.line()
        if argv[0] in ("estimate", "explore", "validate"):
            lines.append((label, [command_lines.unescape_literal(token) for token in argv]))
    return box, lines


def replay(count, seed, tmp_path, monkeypatch):
    box, lines = replay_lines(count, seed, tmp_path)
    monkeypatch.chdir(box.work)  # the fuzzer's lines run in its sandbox, as the driver does
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    outcomes = {"ok": 0, "ConfigError": 0}
    unexpected = []
    for number, (label, argv) in enumerate(lines, start=1):
        function, positional, keywords = module_call(argv)
        try:
            function(*positional, **keywords)
            outcomes["ok"] += 1
        except tpusim.ConfigError as error:
            assert isinstance(error.message, str) and error.message
            outcomes["ConfigError"] += 1
        except Exception as error:  # noqa: BLE001 - the test's subject: anything else is a bug
            unexpected.append(f"line {number} ({label}) {argv!r}: {type(error).__name__}: {error}")
    print(f"replayed {len(lines)} lines: {outcomes}")
    assert unexpected == []
    # Both outcomes occur: the generator makes good and bad inputs alike.
    assert outcomes["ok"] > 0 and outcomes["ConfigError"] > 0
    return outcomes


@pytest.mark.filterwarnings("ignore::tpusim.NotModeledWarning")
def test_fuzz_estimates_end_as_on_the_command_line(cli, tmp_path, monkeypatch):
    """Estimate lines made of config arguments only (no option, no token the CLI's parser would
    read as one): the module's result is the CLI's --json, and its ConfigError the CLI's error
    object (message and key)."""
    box, lines = replay_lines(400, 13, tmp_path)
    monkeypatch.chdir(box.work)
    plain = [argv for _, argv in lines
             if argv[0] == "estimate" and not any(token.startswith("-") for token in argv[1:])]
    count = int(os.environ.get("TPUSIM_REPLAY_CLI_COUNT", "40"))
    assert len(plain) >= count
    outcomes = {"ok": 0, "ConfigError": 0}
    for argv in plain[:count]:
        tokens = [token.encode("utf-8", "surrogateescape") for token in argv]
        code, expected = cli([*tokens, b"--json"], cwd=box.work)
        try:
            actual = tpusim.estimate(argv[1:]).to_dict()
            assert code == 0 and differences(expected, actual) == [], argv
            outcomes["ok"] += 1
        except tpusim.ConfigError as error:
            assert code == 2, (argv, error)
            assert (error.message, error.key) == (expected["error"], expected["key"]), argv
            outcomes["ConfigError"] += 1
    print(f"{count} estimate lines against the CLI: {outcomes}")
    assert outcomes["ok"] > 0 and outcomes["ConfigError"] > 0


def test_module_call_reads_a_line_like_the_cli():
    function, positional, keywords = module_call(
        ["explore", "model_name=tiny-llama", "--threads", "1", "--top=3", "--json",
         "--html", "/dev/full", "--no-branch-and-bound"])
    assert function is tpusim.explore
    assert positional == [["model_name=tiny-llama"]]
    assert keywords == {"threads": "1", "top": "3", "branch_and_bound": False}
    function, positional, keywords = module_call(["validate", "--pairs", "p.csv", "--without", "x"])
    assert function is tpusim.validate and positional == []
    assert keywords == {"pairs": "p.csv", "without": "x"}


@pytest.mark.filterwarnings("ignore::tpusim.NotModeledWarning")
def test_replay_of_fuzz_lines_raises_only_config_error(tmp_path, monkeypatch):
    replay(int(os.environ.get("TPUSIM_REPLAY_FAST_COUNT", "300")), 11, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tpusim.NotModeledWarning")
def test_replay_of_many_fuzz_lines_raises_only_config_error(tmp_path, monkeypatch):
    replay(int(os.environ.get("TPUSIM_REPLAY_SLOW_COUNT", "3000")), 12, tmp_path, monkeypatch)
