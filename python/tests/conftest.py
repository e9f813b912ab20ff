"""Shared by the tests of `import tpusim`: where the sources and the tpusim binary are, and the
CLI run as a subprocess (the reference every module result is compared with).

ctest runs them as `/usr/bin/python3 -m pytest python/tests` with PYTHONPATH=build/python,
TPUSIM_SOURCE_DIR and TPUSIM_BINARY set (python/CMakeLists.txt); by hand, from the project root:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests -m "not slow"
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("TPUSIM_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BINARY = Path(os.environ.get("TPUSIM_BINARY", ROOT / "build" / "sim" / "tpusim")).resolve()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long runs, in ctest's slow tier only")


def run_cli(args, cwd=None):
    """(exit code, the JSON object the CLI printed on stdout or None) of `tpusim ARGS`."""
    result = subprocess.run([str(BINARY), *args], capture_output=True, cwd=cwd, timeout=600)
    text = result.stdout.decode("utf-8", "replace").strip()
    return result.returncode, (json.loads(text) if text else None)


@pytest.fixture(scope="session")
def cli():
    if not BINARY.exists():
        pytest.skip(f"no tpusim binary at {BINARY} (set TPUSIM_BINARY)")
    return run_cli


def differences(expected, actual, path="$"):
    """Every path at which two JSON values differ (exactly: floats bit for bit), for a failure
    message that names the fields."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in sorted(set(expected) | set(actual)):
            if key not in actual or key not in expected:
                found.append(f"{path}.{key}: only in {'CLI' if key in expected else 'module'}")
            else:
                found += differences(expected[key], actual[key], f"{path}.{key}")
        return found
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        found = []
        for index, (left, right) in enumerate(zip(expected, actual)):
            found += differences(left, right, f"{path}[{index}]")
        return found
    if type(expected) is not type(actual) or expected != actual:
        return [f"{path}: CLI {expected!r}, module {actual!r}"]
    return []
