"""A temporary copy of the chip catalog (configs/hw/*.yml) with one parameter changed, for the
fitting scripts: tpusim reads it through TPUSIM_HW_DIR.

Every catalog parameter is written `key: {value: V, ...}`. `value_for(chip, current)` gives the
new value (as text) for a chip file (its stem, e.g. "v6e") and its current value, or None to
leave that file as it is.

Example:
    with tempfile.TemporaryDirectory() as directory:
        write_catalog(directory, "routed_row_hbm_fraction",
                      lambda chip, current: None if float(current) == 1 else "0.07")
        env = dict(os.environ, TPUSIM_HW_DIR=directory)
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_catalog(directory, key, value_for, require_key=False):
    """Copies configs/hw/*.yml into `directory` with `key` set by value_for (see the module)."""
    pattern = re.compile(r"^(\s*" + re.escape(key) + r":\s*\{value:\s*)([^,}]+)", re.M)
    for source in (ROOT / "configs" / "hw").glob("*.yml"):
        text = source.read_text()
        match = pattern.search(text)
        if match is None:
            if require_key:
                raise SystemExit(f"{source}: no key {key}")
        else:
            value = value_for(source.stem, match.group(2).strip())
            if value is not None:
                text = text[:match.start(2)] + str(value) + text[match.end(2):]
        (Path(directory) / source.name).write_text(text)
