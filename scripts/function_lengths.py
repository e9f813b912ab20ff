#!/usr/bin/env python3
"""Lists the C++ functions longer than a limit (default 120 lines), longest first.

A function is a brace block whose opening `{` follows a parameter list `)` (with qualifiers, a
trailing return type or a constructor's initializer list), outside any other function: lambdas
and local blocks count toward the function that holds them. Comments, strings and raw strings are
blanked first so their braces do not count. A function's length runs from the first line of its
signature to its closing brace. It is a brace matcher, not a parser: good enough to keep the
code's functions short (docs/design.md), not to judge the code.

Example:
  python3 scripts/function_lengths.py                 # sim model hw sharding common tests, > 120
  python3 scripts/function_lengths.py --limit 80 sim  # one folder, another limit
prints "LINES path:line name" per function over the limit, then the longest function, and exits 1
if any function is over the limit.
"""
import argparse
import os
import re
import sys

FOLDERS = ["sim", "model", "hw", "sharding", "common", "tests"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNATURE_END = re.compile(r"\)\s*(const|override|noexcept|final|mutable|->\s*[\w:<>,\s*&]+)*\s*$")
CONTROL = re.compile(r"\b(if|for|while|switch|catch)\s*\([^;{}]*\)\s*$")
INITIALIZER_LIST = re.compile(r"\w+\([^;{}]*\)\s*:")


def blank_comments_and_strings(text):
    """The text with comments and string/char literals replaced by spaces (newlines kept)."""
    out = []
    i = 0
    while i < len(text):
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i) + 2
        elif text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            delimiter = re.match(r'R"([^(]*)\(', text[i:]).group(1)
            end = text.find(")" + delimiter + '"', i) + len(delimiter) + 2
        elif text[i] in "\"'" and not (text[i] == "'" and i > 0 and text[i - 1].isalnum()):
            end = i + 1
            while end < len(text) and text[end] != text[i]:
                end += 2 if text[end] == "\\" else 1
            end += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def functions(path):
    """(lines, first line, name) of every function defined in the file."""
    text = blank_comments_and_strings(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # per open brace: its offset if it opens a function body, else None
    for match in re.finditer(r"[{}]", text):
        if match.group() == "{":
            before = text[max(0, match.start() - 400):match.start()].rstrip()
            is_function = bool(SIGNATURE_END.search(before)) or (
                before.endswith(")") and bool(INITIALIZER_LIST.search(before)))
            inside_function = any(offset is not None for offset in stack)
            is_function = is_function and not CONTROL.search(before) and not inside_function
            stack.append(match.start() if is_function else None)
            continue
        start = stack.pop() if stack else None
        if start is None:
            continue
        cut = max(text.rfind(";", 0, start), text.rfind("}", 0, start), text.rfind("{", 0, start))
        head = text[cut + 1:start]
        head_start = cut + 1 + len(head) - len(head.lstrip())
        first = text.count("\n", 0, head_start) + 1
        last = text.count("\n", 0, match.start()) + 1
        names = re.findall(r"([\w:~]+)\s*\(", head)
        found.append((last - first + 1, first, names[0] if names else "?"))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", default=FOLDERS)
    parser.add_argument("--limit", type=int, default=120)
    options = parser.parse_args()
    results = []
    for folder in options.folders:
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if name.endswith((".cpp", ".h")):
                    path = os.path.join(directory, name)
                    relative = os.path.relpath(path, ROOT)
                    results += [(lines, relative, first, function)
                                for lines, first, function in functions(path)]
    results.sort(key=lambda result: -result[0])
    over = [result for result in results if result[0] > options.limit]
    for lines, path, first, function in over:
        print(f"{lines:5d} {path}:{first} {function}")
    if results:
        lines, path, first, function = results[0]
        print(f"longest: {lines} lines, {path}:{first} {function}; "
              f"{len(over)} of {len(results)} functions over {options.limit}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
