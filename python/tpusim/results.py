"""tpusim's results as Python objects: each holds the JSON object the CLI prints with --json,
and reads it through attributes.

Every key of that object is an attribute (`estimate.tokens_per_s_per_chip`,
`estimate.memory["weights_bytes"]`); the main ones are named properties with a docstring.
`to_dict()` returns the CLI's --json object (a copy), `to_frame()` a pandas DataFrame with one row
per result (nested objects flattened to `breakdown.compute_mxu`, `memory.weights_bytes`, ...).

Example:
    run = tpusim.estimate({"model_name": "llama3.1-8b", "compile_topology": "v5p-8"})
    run.step_time_s, run.mfu, run.hbm.peak_bytes_per_device, run.breakdown["compute_mxu"]
    tpusim.to_frame([run, other_run])   # two rows
"""

import copy


def _json_field(key, doc):
    """A read-only attribute that reads `key` of the result's --json object."""
    return property(lambda self: self._json[key], doc=doc)


class Result:
    """The --json object of one result, read through attributes."""

    __slots__ = ("_json",)

    def __init__(self, json):
        self._json = json

    def to_dict(self):
        """The CLI's --json object, field by field (a copy)."""
        return copy.deepcopy(self._json)

    def to_frame(self):
        """A one-row pandas DataFrame (nested objects flattened, `breakdown.compute_mxu`)."""
        return to_frame([self])

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._json[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r} "
                                 f"(fields: {', '.join(sorted(self._json))})") from None

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._json))

    def __eq__(self, other):
        return type(self) is type(other) and self._json == other._json

    __hash__ = None

    def __repr__(self):
        return f"{type(self).__name__}({self._summary()})"

    def _summary(self):
        return ", ".join(f"{key}={self._json[key]!r}" for key in list(self._json)[:4])


class Hbm:
    """HBM per device: the peak, the capacity, whether it fits, and what the peak holds."""

    __slots__ = ("peak_bytes_per_device", "capacity_bytes", "fits", "peak_at", "memory")

    def __init__(self, json):
        self.peak_bytes_per_device = json["hbm_peak_bytes_per_device"]
        self.capacity_bytes = json["hbm_capacity_bytes"]
        self.fits = json["fits"]
        memory = json.get("memory", {})
        self.peak_at = memory.get("peak_at")
        # weights_bytes, optimizer_state_bytes, gradients_bytes, saved_activations_bytes, ...
        self.memory = {key: value for key, value in memory.items() if key != "peak_at"}

    @property
    def used_fraction(self):
        return self.peak_bytes_per_device / self.capacity_bytes

    def __repr__(self):
        gib = 1024.0**3
        return (f"Hbm({self.peak_bytes_per_device / gib:.2f} of {self.capacity_bytes / gib:.2f} "
                f"GiB per device, {'fits' if self.fits else 'OUT OF MEMORY'})")



class _StepResult(Result):
    """The fields an estimate and an explore candidate share."""

    __slots__ = ()

    step_time_s = _json_field("step_time_s", "Seconds per training step.")
    mfu = _json_field("mfu", "Model FLOP utilization (MaxText's FLOP convention), 0..1.")
    breakdown = _json_field(
        "breakdown",
        'Seconds per step by cost: {"compute_mxu": ..., "exposed_ici_fsdp": ..., ...}.')
    fits = _json_field("fits", "Whether the peak HBM per device fits the chip's capacity.")
    mesh = _json_field("mesh", 'The device mesh, e.g. "fsdp=4" or "data=2 fsdp=64".')


class Estimate(_StepResult):
    """One training step of a config on a slice (`tpusim estimate --json`)."""

    __slots__ = ("notes",)

    def __init__(self, json, notes=""):
        super().__init__(json)
        self.notes = notes  # what the CLI prints on stderr (keys with no effect, XLA flags)

    @property
    def hbm(self):
        """HBM per device (Hbm)."""
        return Hbm(self._json)

    def _summary(self):
        return (f"{self._json['model_name']} on {self._json['slice']}, mesh {self.mesh}: "
                f"step {self.step_time_s:.4g} s, MFU {100 * self.mfu:.1f}%, "
                f"{'fits' if self.fits else 'OUT OF MEMORY'}")


class Candidate(_StepResult):
    """One ranked configuration of an explore search."""

    @property
    def overrides(self):
        """The key=value arguments that reproduce it (tpusim.estimate(candidate.overrides))."""
        return self._json["args"].split()

    def _summary(self):
        return f"mesh {self.mesh}: step {self.step_time_s:.4g} s, MFU {100 * self.mfu:.1f}%"


class ExploreResult(Result):
    """An explore search (`tpusim explore --json`); `top` lists its best candidates."""

    __slots__ = ("notes",)

    def __init__(self, json, notes=""):
        super().__init__(json)
        self.notes = notes

    @property
    def top(self):
        """The best candidates, best first (Candidate)."""
        return [Candidate(candidate) for candidate in self._json["top"]]

    def to_frame(self):
        """One row per candidate of `top`, with its rank (1 = best)."""
        frame = to_frame(self.top)
        frame.insert(0, "rank", range(1, len(frame) + 1))
        return frame

    def _summary(self):
        return (f"{len(self._json['top'])} candidates of {self._json['candidates_in_space']}, "
                f"{self._json['elapsed_s']:.2f} s")


class Row(Result):
    """One row of a validation: predicted against measured."""

    def _summary(self):
        keys = ("id", "predicted_step_s", "measured_step_s", "error")
        return ", ".join(f"{key}={self._json[key]!r}" for key in keys if key in self._json)


class Validation(list):
    """`tpusim validate --json`: a list of Row, with the summary (median, mean, max |error|)."""

    def __init__(self, json):
        super().__init__(Row(row) for row in json.get("rows", json.get("pairs", [])))
        self._json = json
        self.summary = json["summary"]
        self.mechanisms_off = json["mechanisms_off"]

    def to_dict(self):
        return copy.deepcopy(self._json)

    def to_frame(self):
        """One row per validated row."""
        return to_frame(self)


class Topology(Result):
    """A slice's physical topology (`tpusim topology --json`)."""

    def _summary(self):
        shape = "x".join(str(size) for size in self._json["shape"])
        return (f"{self._json['slice']} ({self._json['chip']}) x {self._json['num_slices']}: "
                f"{self._json['chips']} chips, {self._json['devices']} devices, shape {shape}")


class Chip(Result):
    """One chip of the hardware catalog with every number's source (`tpusim hw CHIP --json`)."""

    def _summary(self):
        return f"{self._json['name']}: {self._json['display_name']}"


def to_frame(results):
    """A pandas DataFrame with one row per result (Estimate, Candidate, Row, ...), nested objects
    flattened to dotted columns ("breakdown.compute_mxu"). Needs pandas."""
    try:
        import pandas
    except ImportError as error:
        raise ImportError("to_frame needs pandas (Debian: python3-pandas)") from error
    results = list(results)
    return pandas.json_normalize([result._json for result in results])
