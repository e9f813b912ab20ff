"""The module's results equal the CLI's --json, field by field (floats bit for bit): every row of
validation/published.csv, the validation of the whole file, an explore search, a plan, a topology and
the hardware catalog."""

import csv

import pytest
import tpusim
from conftest import ROOT, differences

PUBLISHED = ROOT / "validation" / "published.csv"


def published_rows():
    with open(PUBLISHED, newline="") as table:
        return [(row["id"], row["args"].split()) for row in csv.DictReader(table)]


def test_published_has_its_27_rows():
    assert len(published_rows()) == 27


@pytest.mark.filterwarnings("ignore::tpusim.NotModeledWarning")  # the rows set such keys
@pytest.mark.parametrize("row_id,args", published_rows(), ids=[row[0] for row in published_rows()])
def test_estimate_of_a_published_row_equals_the_cli(cli, row_id, args):
    code, expected = cli(["estimate", *args, "--json"])
    assert code == 0, expected
    estimate = tpusim.estimate(args)
    assert differences(expected, estimate.to_dict()) == []
    # The typed attributes read the same fields.
    assert estimate.step_time_s == expected["step_time_s"]
    assert estimate.mfu == expected["mfu"]
    assert estimate.breakdown == expected["breakdown"]
    assert estimate.fits == expected["fits"]
    assert estimate.mesh == expected["mesh"]
    assert estimate.hbm.peak_bytes_per_device == expected["hbm_peak_bytes_per_device"]
    assert estimate.hbm.memory["weights_bytes"] == expected["memory"]["weights_bytes"]


def test_a_dict_with_overrides_is_the_same_config_as_the_cli_arguments(cli):
    code, expected = cli(["estimate", "model_name=llama3.1-8b", "compile_topology=v5p-8",
                          "per_device_batch_size=2", "remat_policy=full",
                          "override_model_config=true",
                          "mlp_activations=[silu, linear]", "--without",
                          "bf16_attention,in_place_buffers", "--json"])
    assert code == 0, expected
    estimate = tpusim.estimate({"model_name": "llama3.1-8b", "compile_topology": "v5p-8"},
                               per_device_batch_size=2, remat_policy="full",
                               override_model_config=True, mlp_activations=["silu", "linear"],
                               without=["bf16_attention", "in_place_buffers"])
    assert differences(expected, estimate.to_dict()) == []
    assert estimate.mechanisms_off == expected["mechanisms_off"]


def test_an_override_replaces_the_same_key_of_the_config(cli):
    """overrides are applied last: a key the config dict (or a key=value string) also sets takes
    the override's value, as the CLI's one command line with that value."""
    code, expected = cli(["estimate", "model_name=llama3.1-8b", "compile_topology=v5p-16",
                          "per_device_batch_size=1", "--json"])
    assert code == 0, expected
    base = {"model_name": "llama3.1-8b", "compile_topology": "v5p-8", "per_device_batch_size": 2}
    for config in (base, [f"{key}={value}" for key, value in base.items()]):
        estimate = tpusim.estimate(config, compile_topology="v5p-16", per_device_batch_size=1)
        assert differences(expected, estimate.to_dict()) == []


def test_a_yaml_file_then_overrides_as_on_the_command_line(cli, tmp_path):
    config = tmp_path / "run.yml"
    config.write_text("model_name: llama2-7b\ncompile_topology: v5e-16\nper_device_batch_size: 1\n")
    code, expected = cli(["estimate", str(config), "max_target_length=4096", "--json"])
    assert code == 0, expected
    assert differences(expected, tpusim.estimate(config, max_target_length=4096).to_dict()) == []


def test_xla_flags_reach_the_same_switches(cli):
    flags = "--xla_tpu_enable_async_collective_fusion=false --xla_unknown_flag=1"
    args = ["model_name=llama2-7b", "compile_topology=v5p-16"]
    code, expected = cli(["estimate", *args, "--xla-flags", flags, "--json"])
    assert code == 0, expected
    estimate = tpusim.estimate(args, xla_flags=flags)
    assert differences(expected, estimate.to_dict()) == []
    assert estimate.xla_flags["not_modeled"], "the unknown flag is listed"


def test_validation_of_the_published_file_equals_the_cli(cli):
    code, expected = cli(["validate", str(PUBLISHED), "--json"])
    assert code == 0, expected
    validation = tpusim.validate(PUBLISHED)
    assert differences(expected, validation.to_dict()) == []
    assert len(validation) == 27
    assert [row.id for row in validation] == [row["id"] for row in expected["rows"]]
    assert validation.summary["median_abs_error"] == expected["summary"]["median_abs_error"]


def test_validation_of_the_pairs_file_equals_the_cli(cli):
    pairs = ROOT / "validation" / "pairs.csv"
    code, expected = cli(["validate", "--pairs", str(pairs), "--json"])
    assert code == 0, expected
    validation = tpusim.validate(pairs=pairs)
    assert differences(expected, validation.to_dict()) == []
    assert len(validation) == len(expected["pairs"]) > 0


def test_explore_equals_the_cli_but_for_the_wall_clock(cli):
    args = ["model_name=tiny-llama", "compile_topology=v5e-4"]
    code, expected = cli(["explore", *args, "--threads", "1", "--top", "3", "--objective", "mfu",
                          "--json"])
    assert code == 0, expected
    result = tpusim.explore(args, threads=1, top=3, objective="mfu")
    actual = result.to_dict()
    for clock in ("elapsed_s", "candidates_per_s_per_core"):
        assert actual.pop(clock) > 0
        expected.pop(clock)
    # The seconds each phase took are wall-clock too; the phases named are not.
    assert set(actual.pop("phases")) == set(expected.pop("phases"))
    assert differences(expected, actual) == []
    assert [candidate.mesh for candidate in result.top] == [top["mesh"] for top in expected["top"]]
    # A candidate's overrides reproduce its estimate.
    best = result.top[0]
    assert tpusim.estimate(best.overrides).step_time_s == best.step_time_s


@pytest.mark.parametrize("name,num_slices", [("v5p-128", 1), ("tpu7x-256", 2), ("v6e-4x4", 1),
                                             ("a3", 4)])
def test_topology_equals_the_cli(cli, name, num_slices):
    code, expected = cli(["topology", name, "--num-slices", str(num_slices), "--json"])
    assert code == 0, expected
    topology = tpusim.topology(name, num_slices=num_slices)
    assert differences(expected, topology.to_dict()) == []
    assert topology.chips == expected["chips"]


def test_hw_equals_the_cli(cli):
    code, expected = cli(["hw", "--json"])
    assert code == 0, expected
    chips = tpusim.hw()
    assert differences(expected, [chip.to_dict() for chip in chips]) == []
    code, expected = cli(["hw", "v5p", "--json"])
    assert code == 0, expected
    chip = tpusim.hw("v5p")
    assert differences(expected, chip.to_dict()) == []
    assert chip.specs["peak_bf16_tflops"]["value"] == expected["specs"]["peak_bf16_tflops"]["value"]


def strip_clocks(plan):
    """A plan's JSON without its wall-clock fields (total, per slice, per point)."""
    plan.pop("elapsed_s")
    for item in plan["slices"]:
        item.pop("elapsed_s")
    for point in plan["points"]:
        point.pop("explore_s")
    return plan


def test_plan_equals_the_cli_but_for_the_wall_clock(cli):
    args = ["model_name=tiny-llama", "remat_policy=full", "attention=dot_product"]
    options = ["--tokens", "1e9", "--hardware", "v5e,v6e", "--max-chips", "8",
               "--global-batch-tokens", "65536", "--threads", "1"]
    code, expected = cli(["plan", *args, *options, "--json"])
    assert code == 0, expected
    actual = tpusim.plan(args, tokens="1e9", hardware="v5e,v6e", max_chips=8,
                         global_batch_tokens="65536", threads=1)
    assert differences(strip_clocks(expected), strip_clocks(actual)) == []
    assert actual["pick"] is not None
