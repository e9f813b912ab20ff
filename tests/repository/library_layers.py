#!/usr/bin/env python3
"""Checks that each library of sim/ uses only what its layer may (issue 36).

sim/ is built as one static library per layer (sim/CMakeLists.txt):

    tpusim_html       html/                                  nothing else of sim/
    tpusim_perf       accounting/ memory/ perf/ estimate/    html
    tpusim_processes  transport/process_group.h              nothing else of sim/
    tpusim_explore    explore/                               perf, processes, html
    tpusim_plan       plan/                                  explore, perf, processes, html
    tpusim_functional functional/ transport/                 perf, processes
    tpusim_train      train/                                 functional, perf, processes, html
    tpusim_cli_lib    cli/                                   everything

Two checks, each failing with the file and the include that breaks the rule:
- sources: every `#include "sim/..."` of a file points into its own library or one below it;
- the build (when a Ninja build directory is given): the timing model and the search
  (tpusim_html, tpusim_perf, tpusim_explore) were compiled without Eigen, SentencePiece, oneDNN
  or MPI: no such header in Ninja's dependency log of their objects, and no such include path or
  definition on their compile lines.

Example:
  python3 tests/repository/library_layers.py --build-dir build     # exit 0, or 1 with the faults
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The library of each folder (or file) of sim/, and the libraries each may include from.
LIBRARY_OF = {
    "html": "tpusim_html",
    "accounting": "tpusim_perf", "memory": "tpusim_perf", "perf": "tpusim_perf",
    "estimate": "tpusim_perf",
    "transport/process_group.h": "tpusim_processes",
    "explore": "tpusim_explore",
    "plan": "tpusim_plan",
    "functional": "tpusim_functional", "transport": "tpusim_functional",
    "train": "tpusim_train",
    "cli": "tpusim_cli_lib",
}
MAY_USE = {
    "tpusim_html": set(),
    "tpusim_perf": {"tpusim_html"},
    "tpusim_processes": set(),
    "tpusim_explore": {"tpusim_perf", "tpusim_processes", "tpusim_html"},
    "tpusim_plan": {"tpusim_explore", "tpusim_perf", "tpusim_processes", "tpusim_html"},
    "tpusim_functional": {"tpusim_perf", "tpusim_processes"},
    "tpusim_train": {"tpusim_functional", "tpusim_perf", "tpusim_processes", "tpusim_html"},
    "tpusim_cli_lib": set(LIBRARY_OF.values()),
}
# Libraries that must build without the functional engine's third-party code.
LEAN = {"tpusim_html", "tpusim_perf", "tpusim_explore", "tpusim_plan"}
HEAVY_HEADERS = re.compile(r"/(eigen3|sentencepiece[^/]*|oneapi|openmpi|mpich)/|/mpi\.h$|"
                           r"/sentencepiece_processor\.h$|/dnnl[^/]*\.h(pp)?$")
HEAVY_FLAGS = re.compile(r"eigen3|sentencepiece|oneapi|openmpi|TPUSIM_WITH_MPI|TPUSIM_WITH_DNNL")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(sim/[^"]+)"', re.MULTILINE)


def library_of(relative):
    """The library of a path relative to sim/ ("perf/op_cost.cpp" -> "tpusim_perf")."""
    if relative in LIBRARY_OF:
        return LIBRARY_OF[relative]
    folder = relative.split("/", 1)[0]
    if folder not in LIBRARY_OF:
        raise SystemExit(f"sim/{relative}: its folder is in no library of library_layers.py")
    return LIBRARY_OF[folder]


def source_faults(root=ROOT):
    faults = []
    files = sorted(p for p in (root / "sim").rglob("*") if p.suffix in (".h", ".cpp"))
    for path in files:
        own = library_of(str(path.relative_to(root / "sim")))
        for included in INCLUDE.findall(path.read_text()):
            other = library_of(included[len("sim/"):])
            if other != own and other not in MAY_USE[own]:
                faults.append(f"{path.relative_to(root)} ({own}) includes {included} ({other})")
    return faults, len(files)


def self_test():
    """The source check finds a timing-model file that includes the functional engine, and a
    search file that includes the transport rather than process_group.h."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, text in {"perf/op_cost.cpp": '#include "sim/functional/executor.h"\n',
                           "explore/explorer.cpp": '#include "sim/transport/transport.h"\n'
                                                   '#include "sim/transport/process_group.h"\n',
                           "train/trainer.cpp": '#include "sim/functional/executor.h"\n'}.items():
            (root / "sim" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "sim" / name).write_text(text)
        faults, _ = source_faults(root)
    expected = ["sim/explore/explorer.cpp (tpusim_explore) includes sim/transport/transport.h "
                "(tpusim_functional)",
                "sim/perf/op_cost.cpp (tpusim_perf) includes sim/functional/executor.h "
                "(tpusim_functional)"]
    if faults != expected:
        print("self-test: expected", expected, "got", faults)
        return 1
    print("self-test: the two broken layers were found, the allowed include was not flagged")
    return 0


def object_library(object_path):
    match = re.search(r"CMakeFiles/(tpusim_[a-z_]+)\.dir/", object_path)
    return match.group(1) if match else None


def build_faults(build):
    faults, objects = [], 0
    deps = subprocess.run(["ninja", "-C", str(build), "-t", "deps"], capture_output=True,
                          text=True, check=True).stdout
    library = None
    for line in deps.splitlines():
        if not line.startswith(" "):
            library = object_library(line.split(":", 1)[0]) if line.strip() else None
            objects += library in LEAN
        elif library in LEAN and HEAVY_HEADERS.search(line.strip()):
            faults.append(f"an object of {library} read {line.strip()}")
    with open(build / "compile_commands.json") as handle:
        for entry in json.load(handle):
            library = object_library(entry.get("output", "") or entry["command"])
            if library in LEAN and HEAVY_FLAGS.search(entry["command"]):
                flag = HEAVY_FLAGS.search(entry["command"]).group(0)
                faults.append(f"{entry['file']} ({library}) is compiled with '{flag}'")
    return faults, objects


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=Path, help="a Ninja build directory to check too")
    parser.add_argument("--self-test", action="store_true",
                        help="check that the source check catches a broken layer")
    options = parser.parse_args()
    if options.self_test:
        return self_test()
    faults, files = source_faults()
    report = f"{files} sources of sim/ include only their own library or one below it"
    if options.build_dir:
        build = options.build_dir.resolve()
        if not (build / ".ninja_deps").exists():
            print(f"{build}: no Ninja build to check (sources only)")
        else:
            more, objects = build_faults(build)
            if objects == 0:
                more.append("no object of tpusim_html, tpusim_perf or tpusim_explore in the "
                            "dependency log: build first")
            faults += more
            report += (f"; {objects} objects of {', '.join(sorted(LEAN))} built without Eigen, "
                       "SentencePiece, oneDNN and MPI")
    for fault in faults:
        print("FAULT:", fault)
    if faults:
        return 1
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
