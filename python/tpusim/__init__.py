"""tpusim from Python: estimate, explore, validate, topology and hw, as the CLI computes them.

The functions call the same C++ functions as the `tpusim` command (its --json output), in this
process: the hardware catalog and the embedded base.yml are read once, and each call costs the
C++ work plus the conversion of its result. Results are objects with attributes
(tpusim.results); `to_dict()` equals the CLI's --json, `to_frame()` gives a pandas DataFrame.
Bad input raises ConfigError (a ValueError) with the CLI's message and the key it names. The GIL
is released while tpusim computes.

Reach it with PYTHONPATH=build/python after `bash scripts/quickstart.sh`.

Example:
    import tpusim
    run = tpusim.estimate({"model_name": "llama3.1-8b", "compile_topology": "v5p-8"},
                          per_device_batch_size=2)
    run.step_time_s, run.mfu, run.hbm.fits, run.breakdown
    best = tpusim.explore({"model_name": "llama3.1-8b", "compile_topology": "v5p-8"}, top=3)
    tpusim.validate("validation/published.csv").summary["median_abs_error"]
"""

import warnings

from . import _tpusim
from .arguments import (INT32_MAX, INT64_MAX, bool_option, command_args, float_option,
                        int_option, list_option, text_option)
from .errors import ConfigError, NotModeledWarning
from .results import (Candidate, Chip, Estimate, ExploreResult, Hbm, Result, Row, Topology,
                      Validation, to_frame)

__all__ = ["estimate", "explore", "plan", "validate", "topology", "hw", "to_frame", "ConfigError",
           "NotModeledWarning", "Estimate", "ExploreResult", "Candidate", "Validation", "Row",
           "Topology", "Chip", "Hbm", "Result"]

_tpusim._set_config_error(ConfigError)


def estimate(config=None, /, *, xla_flags=None, without=None, **overrides):
    """One training step of a MaxText config on a slice: `tpusim estimate ARGS --json`.

    config: a dict of keys, a YAML file (str or path), a 'key=value' string, or a list of those
    in the CLI's order (None: the embedded base.yml alone). overrides: more keys, applied last.
    xla_flags: the recipe's XLA/libtpu flags (--xla-flags; LIBTPU_INIT_ARGS and XLA_FLAGS from
    the environment are read too, as by the CLI). without: cost mechanisms to switch off
    (--without), a list or a comma-separated string.
    """
    args = command_args(config, overrides)
    report, notes = _tpusim.estimate(args, text_option("xla_flags", xla_flags),
                                     list_option("without", without))
    if report["not_modeled_keys"]:
        items = ", ".join(f"{key}={value}" for key, value in report["not_modeled_keys"].items())
        warnings.warn("MaxText keys not modeled (the estimate ignores them): " + items,
                      NotModeledWarning, stacklevel=2)
    return Estimate(report, notes)


def explore(config=None, /, *, top=10, objective="tokens_per_s_per_chip", global_batch_size=0,
            max_per_device_batch=16, min_hbm_headroom=0, threads=0, branch_and_bound=True,
            exact_schedules=False, xla_flags=None, **overrides):
    """Search meshes, batch, remat, attention and perf switches; rank what fits:
    `tpusim explore ARGS --json` with the options of the same names. Keys given are pinned."""
    request = _tpusim.ExploreRequest()
    request.args = command_args(config, overrides)
    request.xla_flags = text_option("xla_flags", xla_flags)
    request.objective = text_option("objective", objective)
    request.top = int_option("top", top, -INT32_MAX - 1, INT32_MAX)
    request.global_batch_size = int_option("global_batch_size", global_batch_size,
                                           -INT64_MAX - 1, INT64_MAX)
    request.max_per_device_batch = float_option("max_per_device_batch", max_per_device_batch)
    request.min_hbm_headroom = float_option("min_hbm_headroom", min_hbm_headroom)
    request.threads = int_option("threads", threads, -INT32_MAX - 1, INT32_MAX)
    request.branch_and_bound = bool_option("branch_and_bound", branch_and_bound)
    request.exact_schedules = bool_option("exact_schedules", exact_schedules)
    report, notes = _tpusim.explore(request)
    return ExploreResult(report, notes)


def plan(config=None, /, *, tokens, deadline=None, hardware="v5e,v5p,v6e,tpu7x", max_chips=16384,
         max_slices=64, prices=None, consumption="on_demand", objective=None,
         global_batch_tokens=None, full_front=False, threads=0, xla_flags=None, **overrides):
    """From a model and a token budget to the slice, configuration, days and chip-hours (or
    cost): `tpusim plan ARGS --json` with the options of the same names, as a dict (its
    "recommendation", "points", "front", "pick", "slices"). tokens and deadline are text or
    numbers as on the command line ("2e12", "60d")."""
    request = _tpusim.PlanRequest()
    request.args = command_args(config, overrides)
    request.xla_flags = text_option("xla_flags", xla_flags)
    request.tokens = text_option("tokens", str(tokens))
    request.deadline = text_option("deadline", None if deadline is None else str(deadline))
    request.hardware = text_option("hardware", hardware)
    request.max_chips = int_option("max_chips", max_chips, -INT64_MAX - 1, INT64_MAX)
    request.max_slices = int_option("max_slices", max_slices, -INT32_MAX - 1, INT32_MAX)
    request.prices = text_option("prices", prices)
    request.consumption = text_option("consumption", consumption)
    request.objective = text_option("objective", objective)
    request.global_batch_tokens = text_option("global_batch_tokens", global_batch_tokens)
    request.full_front = bool_option("full_front", full_front)
    request.threads = int_option("threads", threads, -INT32_MAX - 1, INT32_MAX)
    report, _notes = _tpusim.plan(request)
    return report


def validate(csv=None, /, *, pairs=None, without=None):
    """Predict every row of a results CSV (validation/published.csv) against its measurements:
    `tpusim validate CSV --json`; with pairs=PAIRS.csv, `tpusim validate --pairs PAIRS.csv`."""
    if csv is not None and pairs is not None:
        raise ConfigError("validate: give a results CSV or pairs=, not both", "pairs")
    return Validation(_tpusim.validate(text_option("csv", csv), text_option("pairs", pairs),
                                       list_option("without", without)))


def topology(name, /, num_slices=1):
    """A slice's physical topology: `tpusim topology NAME --num-slices N --json`."""
    return Topology(_tpusim.topology(text_option("name", name),
                                     int_option("num_slices", num_slices, -INT32_MAX - 1,
                                                INT32_MAX)))


def hw(name=None, /):
    """One chip of the catalog with every number's source (`tpusim hw NAME --json`), or the
    list of every chip when no name is given."""
    report = _tpusim.hw(text_option("name", name))
    return [Chip(chip) for chip in report] if isinstance(report, list) else Chip(report)
