#!/usr/bin/python3
"""Checks that scripts/setup.sh installs everything the build and the tests really use.

A package installed by hand on a developer's machine (or on CI's, which is the same machine) hides
a missing install step: the build passes there and fails on a fresh Debian machine. This audit
reads what a finished build actually used and maps each file to the Debian package that owns it:

  - the headers every object was compiled with (Ninja's dependency log: `ninja -t deps`),
  - the libraries on every link line (absolute paths and -lNAME, as the linker would find them),
  - the shared libraries the executables and the Python module (build/python) load (ldd),
  - the tools the build and the tests run (compiler, ninja, cmake, mpirun, chromium, clang-format,
    python3),
  - the Python modules the tests, the fuzz runs and the Python package import (tests/, fuzz/,
    python/), as Debian's /usr/bin/python3 finds them.

Each owning package must be named by `scripts/setup.sh --list-packages <options>` or be in the
Depends/Pre-Depends closure of those (never Recommends: setup.sh installs without them), or be an
Essential package of Debian's base system. A file no package owns (pyenv's python3, a library in
/usr/local) is an error too.

Usage:
  /usr/bin/python3 scripts/dependency_audit.py [--build-dir build] [--without PACKAGE ...]
--without drops a package from setup.sh's list, to show that the audit then fails (the test suite
does so with libyaml-cpp-dev). Exit 0: clean; 1: a finding; 77: nothing to audit (no Ninja build).

Example output:
  dependency audit: 2,311 files from 41 packages; all named in scripts/setup.sh (23) or in the
  Depends closure of those (488 packages)
"""

import argparse
import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP_OPTIONS = ["--with-reference", "--with-browser", "--with-reports"]  # what scripts/test.sh installs
PYTHON = "/usr/bin/python3"


def run(command, **kwargs):
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def setup_packages(without):
    listed = run(["bash", str(ROOT / "scripts/setup.sh"), "--list-packages", *SETUP_OPTIONS])
    return {name for name in listed.split() if name not in without}


def installed_packages():
    """Installed packages: name -> (essential, [alternatives groups], provides)."""
    fields = "${Package}\t${db:Status-Abbrev}\t${Essential}\t${Pre-Depends}\t${Depends}\t${Provides}\n"
    packages = {}
    for line in run(["dpkg-query", "-W", "-f", fields]).splitlines():
        name, status, essential, pre_depends, depends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        groups = []
        for clause in filter(None, (pre_depends + "," + depends).split(",")):
            groups.append([dependency_name(alternative) for alternative in clause.split("|")])
        provided = [dependency_name(item) for item in provides.split(",") if item.strip()]
        packages[name] = (essential == "yes", groups, provided)
    return packages


def dependency_name(text):
    """'libc6 (>= 2.34)' -> 'libc6'; 'python3:any' -> 'python3'."""
    return re.split(r"[\s(]", text.strip(), maxsplit=1)[0].split(":")[0]


def depends_closure(roots, packages):
    """Every installed package reachable from `roots` through Depends and Pre-Depends."""
    providers = {}
    for name, (_, _, provided) in packages.items():
        for virtual in provided:
            providers.setdefault(virtual, []).append(name)
    closure = set()
    pending = [name for name in roots if name in packages]
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        closure.add(name)
        for group in packages[name][1]:
            for alternative in group:
                for real in [alternative] if alternative in packages else providers.get(alternative, []):
                    if real not in closure:
                        pending.append(real)
    return closure


def header_files(build):
    """System headers (outside the source and build trees) that Ninja recorded as read."""
    files = set()
    for line in run(["ninja", "-C", str(build), "-t", "deps"]).splitlines():
        if line.startswith("    "):
            # Relative paths (ccache's base_dir rewrites them so) are relative to the build
            # directory, where Ninja runs the compiler, not to this script's working directory.
            files.add(os.path.realpath(os.path.join(build, line.strip())))
    return {path for path in files if not within_project(path, build)}


@functools.lru_cache(maxsize=None)
def source_dir(build):
    """The source tree the build was configured from (CMakeCache's CMAKE_HOME_DIRECTORY)."""
    match = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.+)$",
                      (build / "CMakeCache.txt").read_text(), re.MULTILINE)
    return Path(match.group(1)) if match else ROOT


def within_project(path, build):
    resolved = os.path.realpath(path)
    return any(resolved.startswith(str(tree.resolve()) + os.sep)
               for tree in (ROOT, source_dir(build), build))


def linker_search_path():
    output = run(["g++", "-print-search-dirs"])
    for line in output.splitlines():
        if line.startswith("libraries: ="):
            return [os.path.realpath(part) for part in line[len("libraries: ="):].split(":") if part]
    return []


def link_files(build):
    """Libraries named on the link lines: absolute paths and -lNAME (found as the linker would)."""
    commands = run(["ninja", "-C", str(build), "-t", "commands"]).splitlines()
    search = None
    files = set()
    for command in commands:
        if " -o " not in command or " -c " in command:
            continue  # compile lines (their headers come from the dependency log)
        for token in re.split(r"[\s,]+", command):
            if token.startswith("/") and re.search(r"\.(so(\.\d+)*|a)$", token):
                files.add(token)
            elif token.startswith("-l") and len(token) > 2:
                search = search if search is not None else linker_search_path()
                found = find_library(token[2:], search)
                if found:
                    files.add(found)
    return {path for path in files if not within_project(path, build)}


def find_library(name, search):
    for directory in search:
        for candidate in (f"lib{name}.so", f"lib{name}.a"):
            path = os.path.join(directory, candidate)
            if os.path.exists(path):
                return path
    return None


def loaded_libraries(build):
    """Shared libraries the built executables load at run time."""
    files = set()
    for executable in [build / "sim" / "tpusim", *sorted((build / "python").glob("tpusim/*.so"))]:
        if not executable.exists():
            continue
        for line in run(["ldd", str(executable)]).splitlines():
            match = re.search(r"=>\s+(/\S+)", line)
            if match:
                files.add(match.group(1))
    return files


def tool_files(build):
    """The programs the build and the tests run."""
    cache = (build / "CMakeCache.txt").read_text()
    tools = set()
    for key in ("CMAKE_CXX_COMPILER", "CMAKE_MAKE_PROGRAM", "CMAKE_COMMAND", "MPIEXEC_EXECUTABLE",
                "TPUSIM_CCACHE_PROGRAM"):
        match = re.search(rf"^{key}:\w+=(.+)$", cache, re.MULTILINE)
        if match and match.group(1).startswith("/"):
            tools.add(match.group(1))
    for program in ("chromium", "bash", "clang-format"):
        found = shutil.which(program, path="/usr/bin:/bin")
        if found:
            tools.add(found)
    tools.add(PYTHON)
    return tools


def python_modules():
    """Top-level modules imported by the Python files of the tests, the fuzz runs and the Python
    package (python/: `import tpusim` and its tests), outside the project itself."""
    modules = set()
    local = {path.name for path in (ROOT / "python").iterdir() if (path / "__init__.py").exists()}
    sources = [path for folder in ("tests", "fuzz", "python") for path in
               sorted((ROOT / folder).rglob("*.py"))]
    for source in sources + [Path(__file__)]:
        local.add(source.stem)
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return sorted(modules - local)


def module_files(modules):
    """Where Debian's python3 finds each module; a module it cannot find is returned in `missing`."""
    script = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    origin = spec.origin if spec else None\n"
        "    if origin in (None, 'built-in', 'frozen'):\n"
        "        origin = sys.executable if spec else '-'\n"
        "    print(name, origin)\n")
    files, missing = {}, []
    for line in run([PYTHON, "-c", script, *modules]).splitlines():
        name, origin = line.split(" ", 1)
        if origin == "-":
            missing.append(name)
        else:
            files[origin] = name
    return files, missing


def owners(paths):
    """path -> owning package (None when no package owns it), asked of dpkg in one call."""
    candidates = {}
    for path in paths:
        forms = [path, os.path.realpath(path)]
        for form in list(forms):
            # Debian 12 merges /usr: dpkg may know a file under /lib as /usr/lib, or the reverse.
            if form.startswith("/usr/"):
                forms.append(form[len("/usr"):])
            else:
                forms.append("/usr" + form)
        candidates[path] = list(dict.fromkeys(forms))
    every_form = sorted({form for forms in candidates.values() for form in forms})
    owner_of = {}
    for start in range(0, len(every_form), 500):
        result = subprocess.run(["dpkg", "-S", *every_form[start:start + 500]],
                                capture_output=True, text=True)
        for line in result.stdout.splitlines():
            if ": " not in line or line.startswith("diversion"):
                continue
            names, path = line.split(": ", 1)
            owner_of[path] = names.split(",")[0].strip().split(":")[0]
    return {path: next((owner_of[form] for form in forms if form in owner_of), None)
            for path, forms in candidates.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--without", action="append", default=[],
                        help="drop this package from setup.sh's list (to show the audit fails)")
    args = parser.parse_args()
    build = Path(args.build_dir)
    if not (build / ".ninja_deps").exists() or not (build / "CMakeCache.txt").exists():
        print(f"dependency audit: no Ninja build in {build} (bash scripts/build.sh makes one)")
        return 77

    named = setup_packages(set(args.without))
    packages = installed_packages()
    essential = [name for name, (is_essential, _, _) in packages.items() if is_essential]
    allowed = depends_closure(sorted(named) + essential, packages)

    used = {}  # path -> what it was used as
    for kind, paths in (("header", header_files(build)), ("link", link_files(build)),
                        ("loaded library", loaded_libraries(build)), ("tool", tool_files(build))):
        for path in paths:
            used.setdefault(path, kind)
    modules, missing_modules = module_files(python_modules())
    for path, module in modules.items():
        used.setdefault(path, f"python module {module}")

    findings = []
    for name in missing_modules:
        findings.append(f"python module '{name}' (imported by the tests) is not found by {PYTHON}")
    owner_of = owners(sorted(used))
    by_package = {}
    for path, package in owner_of.items():
        if package is None:
            findings.append(f"{path} ({used[path]}) belongs to no Debian package")
        else:
            by_package.setdefault(package, []).append(path)
    for package, paths in sorted(by_package.items()):
        if package not in allowed:
            example = sorted(paths)[0]
            findings.append(f"package '{package}' is used ({len(paths)} files, e.g. {example}, "
                            f"{used[example]}) but scripts/setup.sh neither names it nor pulls it "
                            f"in through Depends")
    if findings:
        print(f"dependency audit: FAILED ({len(findings)} findings)")
        for finding in findings:
            print("  " + finding)
        return 1
    print(f"dependency audit: {len(used):,} files from {len(by_package)} packages; all named in "
          f"scripts/setup.sh ({len(named)}) or in the Depends closure of those "
          f"({len(allowed)} packages with Debian's essential ones)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
