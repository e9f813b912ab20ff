#!/usr/bin/env python3
"""Config keys are read only in from_config factories (issue 36: one typed config).

The rule, over common/ hw/ model/ sharding/ sim/ (*.h and *.cpp), comments left out: a call of a
Config reader -- get_int, get_float, get_bool, get_string, get_string_list, get_named_lists or
value_text on any object, has on an object named config or config_ -- appears only
  * in model/config.cpp and model/config_rules.cpp (the loader and its validation), or
  * in the body of a function named from_config or ending in _from_config: its definition starts
    at column 0 on a line that names `from_config(` and does not end with ';', and its body ends
    at the next line that is exactly `}` (clang-format puts a definition's braces there).
Files whose reads are not moved yet are listed in STILL_TO_MOVE with their count: the test fails
when a file reads more than listed, and when it reads fewer (lower the count as reads move).

Usage: config_reads.py SOURCE_DIR
"""

import re
import sys
from pathlib import Path

ROOTS = ["common", "hw", "model", "sharding", "sim"]
LOADER_FILES = {"model/config.cpp", "model/config_rules.cpp"}
READ = re.compile(
    r"\b\w+\s*(?:\.|->)\s*(?:get_int|get_float|get_bool|get_string|get_string_list|"
    r"get_named_lists|value_text)\s*\(|\bconfig_?\s*(?:\.|->)\s*has\s*\(")
FACTORY_START = re.compile(r"^[A-Za-z].*(?<!\w)(?:\w*_)?from_config\(")

# Reads outside from_config factories that are still to move, by file.
STILL_TO_MOVE = {}


def without_comments(line):
    """The line up to a // that is not inside a string literal."""
    quotes = 0
    for index, char in enumerate(line):
        if char == '"' and (index == 0 or line[index - 1] != "\\"):
            quotes += 1
        elif line.startswith("//", index) and quotes % 2 == 0:
            return line[:index]
    return line


def reads_outside_factories(text):
    """Line numbers (1-based) of reads outside from_config functions."""
    lines = text.split("\n")
    code = []
    inside = []
    in_factory = False
    for line in lines:
        stripped = without_comments(line)
        if not in_factory and FACTORY_START.match(stripped) and not stripped.rstrip().endswith(";"):
            in_factory = True
        code.append(stripped)
        inside.append(in_factory)
        if in_factory and line == "}":
            in_factory = False
    joined = "\n".join(code)
    found = []
    for match in READ.finditer(joined):
        line_index = joined.count("\n", 0, match.start())
        if not inside[line_index]:
            found.append(line_index + 1)
    return found


# The rule on small examples: (source, lines of the reads it must report).
EXAMPLES = [
    ('int64_t f(const Config& config) {\n  return config.get_int("x");\n}\n', [2]),
    ('Foo Foo::from_config(const Config& config) {\n  return {config.get_int("x")};\n}\n', []),
    ('Foo foo_from_config(const Config& config) {\n  auto g = [&] { return config.has("y"); };\n'
     '}\nint h(const Config& config) {\n  return config_.get_bool("z");\n}\n', [5]),
    ('// config.get_int("x") in a comment\nint y = 0;  // config_.get_float("y")\n', []),
    ('Slice slice_from_config(const Config& config);\nint f(const Config& config) {\n'
     '  return config.get_int("x");\n}\n', [3]),
    ('void f(const Config& config) {\n  g(config\n        .get_string("x"));\n}\n', [2]),
    ('Foo mesh_value_from_config(const Config& c) {\n  return c->get_int("x");\n}\n'
     'int g(const Config* c) {\n  return c->get_named_lists("r").size();\n}\n', [5]),
]


def check_examples():
    """Failures of the rule's own examples (a broken checker would pass everything)."""
    failures = []
    for text, expected in EXAMPLES:
        found = reads_outside_factories(text)
        if found != expected:
            failures.append(f"config_reads.py itself: {text!r} gives lines {found}, not {expected}")
    return failures


def main():
    source = Path(sys.argv[1])
    counts = {}
    where = {}
    for root in ROOTS:
        for path in sorted((source / root).rglob("*")):
            if path.suffix not in (".h", ".cpp") or not path.is_file():
                continue
            name = path.relative_to(source).as_posix()
            if name in LOADER_FILES:
                continue
            found = reads_outside_factories(path.read_text(encoding="utf-8"))
            if found:
                counts[name] = len(found)
                where[name] = found
    failures = check_examples()
    for name in sorted(set(counts) | set(STILL_TO_MOVE)):
        have = counts.get(name, 0)
        allowed = STILL_TO_MOVE.get(name, 0)
        if have > allowed:
            lines = ", ".join(str(line) for line in where[name])
            failures.append(f"{name}: {have} config read(s) outside a from_config factory "
                            f"(lines {lines}); allowed {allowed}: read the key in the subsystem's "
                            "from_config factory and pass the typed value down")
        elif have < allowed:
            failures.append(f"{name}: {have} read(s) left but STILL_TO_MOVE allows {allowed}: "
                            "lower it in tests/repository/config_reads.py")
    for failure in failures:
        print(failure)
    if "--counts" in sys.argv:
        for name in sorted(counts):
            print(f'    "{name}": {counts[name]},')
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
