"""The README's Python examples, run as a new user runs them: its ```python block under "## Python",
unchanged, in an empty directory (scripts/test.sh installs matplotlib with --with-reports). It
must print the sweep's frame and write sweep.png."""

import contextlib
import io
import os
import re
import subprocess

from conftest import BINARY, ROOT


def readme_example():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Python section has one example"
    return blocks[0]


def test_the_readme_example_runs_and_plots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_example(), "README.md", "exec"), {"__name__": "__main__"})
    assert (tmp_path / "sweep.png").stat().st_size > 0
    rows = [line for line in printed.getvalue().splitlines() if re.match(r"^\d+\s", line)]
    assert len(rows) == 4, printed.getvalue()  # one per batch of the sweep


def readme_path_lines():
    """The indented lines the README gives after the two Quickstart commands to reach the module
    (the path, then a one-line estimate), exactly as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    after = readme.split("the one extra line is the path:\n\n", 1)[1]
    lines = []
    for line in after.splitlines():
        if not line.startswith("    "):
            break
        lines.append(line[4:])
    assert any("import tpusim" in line for line in lines), lines
    return lines


def test_the_readme_one_liner_prints_the_cli_step_time(tmp_path, cli):
    # The lines run from a project root whose build/ is the build under test (scripts/test.sh
    # builds in build/; a sanitizer build elsewhere is linked in under that name).
    build = BINARY.parent.parent
    (tmp_path / "build").symlink_to(build, target_is_directory=True)
    script = "set -e\n" + "\n".join(readme_path_lines()) + "\n"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env={k: v for k, v in os.environ.items()
                                              if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    code, estimate = cli(["estimate", "model_name=llama3.1-8b", "compile_topology=v5p-8", "--json"])
    assert code == 0
    assert float(result.stdout.strip()) == estimate["step_time_s"], result.stdout
