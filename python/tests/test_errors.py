"""Every kind of bad input the CLI refuses with exit 2 raises tpusim.ConfigError (a ValueError)
carrying the CLI's message and key (its --json error object); the module's own argument checks
raise ConfigError too, and no bad input kills the interpreter."""

import pytest
import tpusim
from conftest import ROOT

MODEL = ["model_name=llama3.1-8b", "compile_topology=v5p-8"]
NOT_BUILT = next(line.split("\t")[0] for line in
                 (ROOT / "configs/maxtext/presets_not_built.tsv").read_text().splitlines()
                 if line and not line.startswith(("#", "preset\t")))

# (what is wrong, the CLI's arguments, the same call through the module)
CASES = [
    ("unknown key, with a did-you-mean", ["estimate", *MODEL, "stesp=3"],
     lambda: tpusim.estimate(MODEL, stesp=3)),
    ("value of the wrong type", ["estimate", *MODEL, "per_device_batch_size=abc"],
     lambda: tpusim.estimate(MODEL, per_device_batch_size="abc")),
    ("unknown model", ["estimate", "model_name=llama9"],
     lambda: tpusim.estimate({"model_name": "llama9"})),
    ("preset tpusim does not build", ["estimate", "model_name=" + NOT_BUILT],
     lambda: tpusim.estimate(model_name=NOT_BUILT)),
    ("slice that cannot exist", ["estimate", "model_name=llama3.1-8b", "compile_topology=v5p-7"],
     lambda: tpusim.estimate({"model_name": "llama3.1-8b", "compile_topology": "v5p-7"})),
    ("mesh that does not fill the slice", ["estimate", *MODEL, "ici_fsdp_parallelism=3"],
     lambda: tpusim.estimate(MODEL, ici_fsdp_parallelism=3)),
    ("argument neither key=value nor a YAML file", ["estimate", *MODEL, "oops"],
     lambda: tpusim.estimate([*MODEL, "oops"])),
    ("config file that cannot be read", ["estimate", "/nonexistent/x.yml"],
     lambda: tpusim.estimate("/nonexistent/x.yml")),
    ("malformed YAML in a value", ["estimate", *MODEL, "steps={a: [1}"],
     lambda: tpusim.estimate(MODEL, steps="{a: [1}")),
    ("malformed rule list", ["estimate", *MODEL, "logical_axis_rules=[[a]]"],
     lambda: tpusim.estimate(MODEL, logical_axis_rules=[["a"]])),
    ("key the preset sets", ["estimate", *MODEL, "mlp_activations=[relu]"],
     lambda: tpusim.estimate(MODEL, mlp_activations=["relu"])),
    ("unknown cost mechanism", ["estimate", *MODEL, "--without", "nope"],
     lambda: tpusim.estimate(MODEL, without="nope")),
    ("unknown explore objective", ["explore", *MODEL, "--objective", "speed"],
     lambda: tpusim.explore(MODEL, objective="speed")),
    ("negative thread count", ["explore", *MODEL, "--threads", "-1"],
     lambda: tpusim.explore(MODEL, threads=-1)),
    ("top out of range", ["explore", *MODEL, "--top", "0"],
     lambda: tpusim.explore(MODEL, top=0)),
    ("HBM headroom out of range", ["explore", *MODEL, "--min-hbm-headroom", "2"],
     lambda: tpusim.explore(MODEL, min_hbm_headroom=2)),
    ("per-device batch out of range", ["explore", *MODEL, "--max-per-device-batch", "-1"],
     lambda: tpusim.explore(MODEL, max_per_device_batch=-1)),
    ("validate without a file", ["validate"], lambda: tpusim.validate()),
    ("validate of a missing file", ["validate", "/nonexistent.csv"],
     lambda: tpusim.validate("/nonexistent.csv")),
    ("pairs file that cannot be read", ["validate", "--pairs", "/nonexistent.csv"],
     lambda: tpusim.validate(pairs="/nonexistent.csv")),
    ("unknown slice for topology", ["topology", "v5p-7"], lambda: tpusim.topology("v5p-7")),
    ("slice count out of range", ["topology", "v5p-8", "--num-slices", "0"],
     lambda: tpusim.topology("v5p-8", num_slices=0)),
    ("unknown chip", ["hw", "v9"], lambda: tpusim.hw("v9")),
    ("bytes that are not UTF-8", ["estimate", *MODEL, "model_name=\udcff"],
     lambda: tpusim.estimate(MODEL, model_name="\udcff")),
]


@pytest.mark.parametrize("what,argv,call", CASES, ids=[case[0] for case in CASES])
def test_bad_input_raises_config_error_with_the_cli_message_and_key(cli, tmp_path, what, argv,
                                                                    call):
    argv = [arg.encode("utf-8", "surrogateescape") for arg in argv]
    code, expected = cli([*argv, b"--json"])
    assert code == 2 and expected["exit"] == 2, (what, expected)
    with pytest.raises(tpusim.ConfigError) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    assert raised.value.message == str(raised.value) == expected["error"]
    assert raised.value.key == expected["key"]


def test_a_bad_csv_row_names_the_file_row_and_column(cli, tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text("id,hardware,args,measured_step_s\nr1,v5e,model_name=tiny-llama "
                     "compile_topology=v5e-4,-2\n")
    code, expected = cli(["validate", str(table), "--json"])
    assert code == 2
    with pytest.raises(tpusim.ConfigError, match="row 2") as raised:
        tpusim.validate(table)
    assert raised.value.message == expected["error"]


def test_a_malformed_config_file_names_the_file(cli, tmp_path):
    config = tmp_path / "broken.yml"
    config.write_text("model_name: [tiny-llama\n")
    code, expected = cli(["estimate", str(config), "--json"])
    assert code == 2
    with pytest.raises(tpusim.ConfigError) as raised:
        tpusim.estimate(config)
    assert raised.value.message == expected["error"]
    assert "broken.yml" in raised.value.message


@pytest.mark.parametrize("call,key", [
    (lambda: tpusim.estimate(42), "config"),
    (lambda: tpusim.estimate([[MODEL]]), "config"),
    (lambda: tpusim.estimate({"a=b": 1}), "a=b"),
    (lambda: tpusim.estimate({"": 1}), ""),
    (lambda: tpusim.estimate(MODEL, xla_flags=3), "xla_flags"),
    (lambda: tpusim.estimate(MODEL, without=5), "without"),
    (lambda: tpusim.estimate(MODEL, model_name="\ud800"), "model_name"),
    (lambda: tpusim.explore(MODEL, top="ten"), "top"),
    (lambda: tpusim.explore(MODEL, top=2**31), "top"),
    (lambda: tpusim.explore(MODEL, threads=1.5), "threads"),
    (lambda: tpusim.explore(MODEL, global_batch_size=2**63), "global_batch_size"),
    (lambda: tpusim.explore(MODEL, min_hbm_headroom="lots"), "min_hbm_headroom"),
    (lambda: tpusim.explore(MODEL, branch_and_bound="yes"), "branch_and_bound"),
    (lambda: tpusim.validate("a.csv", pairs="b.csv"), "pairs"),
    (lambda: tpusim.topology("v5p-8", num_slices=True), "num_slices"),
    (lambda: tpusim.topology(5), "name"),
])
def test_arguments_python_cannot_pass_on_raise_config_error(call, key):
    with pytest.raises(tpusim.ConfigError) as raised:
        call()
    assert raised.value.key == key


def test_not_modeled_keys_warn_as_the_cli_does():
    with pytest.warns(tpusim.NotModeledWarning, match="use_random_routing"):
        estimate = tpusim.estimate(MODEL, use_random_routing=True)
    assert estimate.not_modeled_keys == {"use_random_routing": "true"}
    assert "use_random_routing" in estimate.notes
