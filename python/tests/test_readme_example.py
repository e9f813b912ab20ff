"""The README's Python example, run as a new user runs it: its ```python block under "## Python",
unchanged, in an empty directory (scripts/test.sh installs matplotlib with --with-reports). It
must print the sweep's frame and write sweep.png."""

import contextlib
import io
import re

from conftest import ROOT


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
