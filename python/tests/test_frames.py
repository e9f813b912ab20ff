"""to_frame() gives a pandas DataFrame with one row per result, nested objects flattened to dotted
columns whose values are the results' own."""

import pytest
import tpusim
from conftest import ROOT

pandas = pytest.importorskip("pandas")

BASE = {"model_name": "llama2-7b", "compile_topology": "v5e-16"}


def test_one_estimate_is_one_row():
    estimate = tpusim.estimate(BASE)
    frame = estimate.to_frame()
    assert len(frame) == 1
    assert frame.loc[0, "step_time_s"] == estimate.step_time_s
    assert frame.loc[0, "breakdown.compute_mxu"] == estimate.breakdown["compute_mxu"]
    assert frame.loc[0, "memory.weights_bytes"] == estimate.hbm.memory["weights_bytes"]
    assert frame.loc[0, "mesh"] == estimate.mesh


def test_a_sweep_is_one_row_per_estimate_in_order():
    batches = [1, 2, 4]
    runs = [tpusim.estimate(BASE, per_device_batch_size=batch) for batch in batches]
    frame = tpusim.to_frame(runs)
    assert len(frame) == len(batches)
    assert list(frame["step_time_s"]) == [run.step_time_s for run in runs]
    assert list(frame["global_batch_sequences"]) == [16 * batch for batch in batches]


def test_explore_is_one_row_per_candidate_ranked():
    result = tpusim.explore({"model_name": "tiny-llama", "compile_topology": "v5e-4"}, top=3,
                            threads=1)
    frame = result.to_frame()
    assert len(frame) == len(result.top) == 3
    assert list(frame["rank"]) == [1, 2, 3]
    assert list(frame["mesh"]) == [candidate.mesh for candidate in result.top]
    assert list(frame["step_time_s"]) == [candidate.step_time_s for candidate in result.top]


def test_validation_is_one_row_per_published_row():
    validation = tpusim.validate(ROOT / "validation" / "published.csv")
    frame = validation.to_frame()
    assert len(frame) == len(validation) == 27
    assert list(frame["id"]) == [row.id for row in validation]
    assert list(frame["error"]) == [row.error for row in validation]


def test_an_empty_sweep_is_an_empty_frame():
    assert len(tpusim.to_frame([])) == 0
