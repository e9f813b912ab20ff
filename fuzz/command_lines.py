"""Generated tpusim command lines for the command-line fuzz (fuzz/run_command_line_fuzz.py).

Each generator class tries one kind of input a user can get wrong: a key's value at the edge of
its type (0, -1, 2^31, 2^63, NaN, 1.5, text, bytes that are not UTF-8, a newline), a mistyped or
unknown key, a malformed override, a wrong slice or mesh, a broken config file or CSV, an input
path that is not a regular file (a directory, a FIFO, /dev/zero, a symbolic link loop) or an output
path that must not be replaced (/dev/full, a symbolic link to a file outside the run's directory,
a directory), pipeline keys (a DCN pipeline on one slice), slice shapes and counts near 2^31,
2^32 and 2^63, a batch or length the mesh does not divide, a key train does not build, or an
output that names the line's own input (the runner checks the input's bytes after the line).
Every class starts from a command that works and changes one to three things, so the line
reaches the code behind the first check.

A line is the class label, then argv after "tpusim", tab-separated, with "\\t", "\\n", "\\\\" and
"\\xHH" escapes (fuzz/command_line_driver.cpp reads them).

Example:
    python3 fuzz/command_lines.py --repo . --sandbox /tmp/sb --count 1000 --seed 1 > lines.tsv
"""

import argparse
import csv
import os
import random
import stat
import sys
from pathlib import Path

# Sizes and numbers at the edges of int64, int32, float and of what tpusim accepts.
INT_EDGES = ["0", "-1", "-3", "1", "2", "3", "7", "1024", "65536", "1048577", "2147483647",
             "2147483648", "4294967296", "9223372036854775807", "9223372036854775808",
             "-9223372036854775808", "99999999999999999999999", "1e3", "1.5", "1.0", "0x10",
             "", "abc", ".nan", "nan", "inf", "-inf", "true", "null", "~", "[1, 2]", "{a: 1}",
             "+5", "05", "1_000", "\u0661", "\\xff", "1\\n2"]
FLOAT_EDGES = ["0", "-0.0", "-1", "1e-30", "1e308", "1e309", "-1e309", ".inf", "-.inf", ".nan",
               "nan", "0.5", "2", "1.5e3", "abc", "", "true", "[0.1]", "1,5", "\\xfe\\xff"]
TEXT_EDGES = ["", " ", "x", "none", "None", "NULL", "null", "~", "true", "0", "-1", "\\xff\\xfe",
              "a\\nb", "a\\tb", "\\x1b[31mred", "../..", "/", ".", "..", "~/x", "a/b", "é",
              "\u202e", "x" * 300, "'quoted'", '"dq"', "[a, b]", "{k: v}", "&anchor", "*alias",
              "!!binary aGk=", "- item", "# comment", "key: value", "%YAML 1.2"]
SLICES_GOOD = ["v4-8", "v4-16", "v4-64", "v5e-1", "v5e-4", "v5e-8", "v5e-16", "v5e-64",
               "v5e-256", "v5p-8", "v5p-16", "v5p-128", "v5p-1024", "v6e-1", "v6e-4", "v6e-8",
               "v6e-64", "v6e-256", "tpu7x-8", "tpu7x-64", "tpu7x-256", "tpu7x-9216", "v3-8",
               "a3", "a3high", "a3mega", "a3ultra", "a4", "h200-141gb-8", "b200-8"]
SLICES_BAD = ["v5p-0", "v5p-3", "v5p-7", "v5e-3", "v5e-512", "v6e-257", "v9-8", "tpu7x-999999",
              "v5e-256x", "V5E-8", "v5e", "v5e-", "-8", "v5e-8-8", "v5litepod-16", "tpu7x--8",
              "v5p-18446744073709551616", "v4-2147483648", "", "\\xff", "v5e-8\\n"]
SMALL_SLICES = ["v4-8", "v5e-1", "v5e-4", "v5e-8", "v5p-8", "v5p-16", "v6e-4", "v6e-8",
                "tpu7x-8"]
MESH_KEYS = ["ici_data_parallelism", "ici_fsdp_parallelism", "ici_fsdp_transpose_parallelism",
             "ici_sequence_parallelism", "ici_context_parallelism", "ici_tensor_parallelism",
             "ici_tensor_sequence_parallelism", "ici_expert_parallelism",
             "ici_pipeline_parallelism", "ici_autoregressive_parallelism", "dcn_data_parallelism",
             "dcn_fsdp_parallelism", "dcn_tensor_parallelism", "dcn_pipeline_parallelism",
             "dcn_expert_parallelism", "dcn_context_parallelism"]
# Options of each command that take a value, and their flags without one.
OPTIONS = {
    "estimate": (["--trace", "--html", "--profile", "--xla-flags", "--without"],
                 ["--json", "--require-fit"]),
    "explore": (["--top", "--xla-flags", "--objective", "--global-batch-size",
                 "--max-per-device-batch", "--min-hbm-headroom", "--threads", "--html"],
                ["--json", "--csv", "--no-branch-and-bound", "--progress"]),
    "topology": (["--num-slices", "--dot"], ["--json"]),
    "program": (["--xla-flags", "--layer"], ["--global"]),
    "config": (["--xla-flags"], ["--json"]),
    "validate": (["--without", "--pairs"], ["--json", "--list-mechanisms"]),
    "compare": (["--a", "--b", "--top", "--xla-flags", "--without"], ["--json"]),
    "op": ([], ["--json"]),
    "hw": ([], ["--json"]),
}
PIPELINE_KEYS = ["ici_pipeline_parallelism", "dcn_pipeline_parallelism",
                 "num_pipeline_microbatches", "num_layers_per_pipeline_stage",
                 "num_pipeline_repeats", "pipeline_fsdp_ag_once"]
PIPELINE_VALUES = ["1", "2", "3", "4", "8", "0", "-1", "16", "65536", "2147483648",
                   "4294967296", "1.5"]
# Shapes and counts around 2^31, 2^32 and 2^63 (a product of dimensions that overflows).
LIMIT_SHAPES = ["v5p:1024x2048x2048", "v5p:100000x100000x100000", "v5p:2x2x1", "v5p:4x4x4",
                "v5p:2147483648x1x1", "v5p:65536x65536x1", "v5p:0x4x4", "v5p:-1x4x4",
                "v4:1024x2048x2048", "v5e:65536x65536", "v6e:4294967296x1", "v5p:1x1x1x1",
                "v5p:4x4", "tpu7x:2097152x2097152x2048", "v5p:3037000500x3037000500x1"]
LIMIT_SLICES = ["v5p-2147483648", "v5p-4294967296", "v5p-4294967298", "v5e-2147483647",
                "v4-9223372036854775807", "v5p-9223372036854775808", "v6e-4294967297",
                "tpu7x-2147483648", "v5p-1073741824"]
LIMIT_COUNTS = ["2147483647", "2147483648", "4294967295", "4294967296", "4294967298",
                "9223372036854775807", "9223372036854775808", "18446744073709551617", "65537"]
# Keys tpusim train does not build, each with a value that asks for it.
TRAIN_UNBUILT = ["quantization=int8", "quantization=fp8", "quantization=int4",
                 "quantization=fp8_full", "z_loss_multiplier=1e-4", "mtp_num_layers=1",
                 "opt_type=sgd", "opt_type=adafactor", "dropout_rate=0.1", "dropout_rate=0.5",
                 "mtp_num_layers=2", "z_loss_multiplier=0.5"]
MECHANISMS = ["grouped_matmul_tiles", "quantize_scale_pass", "bf16_attention", "bf16_logits",
              "chip_ingress_bound", "sparsecore_reduction", "tensorcore_driven_collectives",
              "dcn_shards_first", "dcn_step_latency", "in_place_buffers",
              "attention_subblock_pipelining", "reduction_reassociation",
              "gpu_attention_kernel_rates", "routed_row_gathers", "aqt_stochastic_rounding", "weight_scale_on_shard",
              "grouped_matmul_mxu_rows", "routing_scatter_gradients", "tokamax_gmm_tiles",
              "bf16_expert_matmuls", "grouped_matmul_quantize_pass", "quantized_residuals",
              "narrow_dense_moe_exchange", "gmm_v2_grid_steps",
              "gmm_v2_weight_prefetch", "expert_bias_scatter_gradients",
              "gmm_v2_one_tensorcore"]
XLA_FLAGS = ["--xla_tpu_enable_async_collective_fusion=true",
             "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true",
             "--xla_tpu_scoped_vmem_limit_kib=98304", "--xla_enable_async_all_gather=false",
             "--xla_tpu_enable_data_parallel_all_reduce_opt=true", "--xla_unknown_flag=1",
             "xla_no_dashes=1", "--xla_tpu_scoped_vmem_limit_kib=-1",
             "--xla_tpu_scoped_vmem_limit_kib=abc", "--", "--=", "=x", "--xla_tpu_x"]


def escape(token):
    """One argv token in the line format: tabs, newlines, backslashes and non-ASCII as escapes."""
    out = []
    for byte in token.encode("utf-8", "surrogateescape"):
        if byte == 0x5C:
            out.append("\\\\")
        elif byte == 0x09:
            out.append("\\t")
        elif byte == 0x0A:
            out.append("\\n")
        elif byte < 0x20 or byte >= 0x7F:
            out.append("\\x%02x" % byte)
        else:
            out.append(chr(byte))
    return "".join(out)


def unescape_literal(text):
    """The edge lists above write bytes as \\xHH; turn them into the real (surrogate) characters."""
    raw = bytearray()
    i = 0
    data = text.encode("utf-8", "surrogateescape")
    while i < len(data):
        if data[i:i + 2] == b"\\x" and i + 4 <= len(data):
            raw.append(int(data[i + 2:i + 4], 16))
            i += 4
        elif data[i:i + 2] == b"\\n":
            raw.append(0x0A)
            i += 2
        else:
            raw.append(data[i])
            i += 1
    return raw.decode("utf-8", "surrogateescape")


class Keys:
    """What the repository says about config keys, models and chips."""

    def __init__(self, repo):
        self.tpusim = {}  # key -> default text, from configs/base.yml
        for line in (repo / "configs/base.yml").read_text().splitlines():
            if line and not line.startswith((" ", "#", "-")) and ":" in line:
                key, _, value = line.partition(":")
                self.tpusim[key.strip()] = value.split(" #")[0].strip()
        self.maxtext = {}  # key -> (default, type)
        with open(repo / "configs/maxtext/base_keys.tsv") as table:
            rows = [line for line in table if not line.startswith("#")]
        for row in csv.DictReader(rows, delimiter="\t"):
            self.maxtext[row["key"]] = (row["default"], row["type"])
        self.models = sorted(path.stem for path in (repo / "configs/models").glob("*.yml"))
        self.small_models = [m for m in self.models if m.startswith("tiny")] or ["tiny-llama"]
        self.all_keys = sorted(set(self.tpusim) | set(self.maxtext))

    def type_of(self, key):
        if key in self.maxtext:
            return self.maxtext[key][1]
        default = self.tpusim.get(key, "")
        if default in ("true", "false"):
            return "bool"
        try:
            int(default)
            return "int"
        except ValueError:
            pass
        try:
            float(default)
            return "float"
        except ValueError:
            return "str"


class Sandbox:
    """Files the lines point at, made once: the run's directory (work/, the driver's cwd), files
    outside it that no command may change (outside/), and hostile inputs and outputs."""

    def __init__(self, root, repo):
        self.root = root
        self.work = root / "work"
        self.outside = root / "outside"
        for directory in (self.work, self.outside, self.work / "adir", self.work / "out",
                          self.work / "configs", self.work / "csv"):
            directory.mkdir(parents=True, exist_ok=True)
        (self.outside / "victim.txt").write_text("must not change\n")
        self._link(self.work / "link_to_outside", self.outside / "victim.txt")
        self._link(self.work / "loop_a", self.work / "loop_b")
        self._link(self.work / "loop_b", self.work / "loop_a")
        self._link(self.work / "dangling", self.work / "missing" / "file")
        fifo = self.work / "fifo"
        if not fifo.exists():
            os.mkfifo(fifo)
        (self.work / "empty.txt").write_text("")
        (self.work / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
        (self.work / "doc.jsonl").write_text('{"text": "hello world"}\n{"text": 5}\n{"nope": 1}\n')
        self.hostile_inputs = ["/dev/zero", "/dev/null", "/dev/full", "/proc/self/mem",
                               str(fifo), str(self.work / "adir"), str(self.work / "loop_a"),
                               str(self.work / "dangling"), str(self.work / "empty.txt"),
                               "/nonexistent/x", "", "\\xff", str(self.work / "text.txt"),
                               str(self.work / "doc.jsonl"), str(repo / "configs/base.yml"),
                               str(repo / "README.md")]
        self.hostile_outputs = ["/dev/full", "/dev/null", str(self.work / "link_to_outside"),
                                str(self.work / "adir"), str(self.work / "fifo"),
                                str(self.work / "missing_dir" / "x.html"), "",
                                str(self.work / "out" / "page.html"),
                                str(self.work / "dangling"), "/proc/self/status"]
        self.configs = []
        self.csvs = []
        self.pair_csvs = []
        # Inputs that lines also name as outputs (class alias_output): no line may change them.
        alias = self.work / "alias"
        (alias / "checkpoint").mkdir(parents=True, exist_ok=True)
        (alias / "config.yml").write_text("model_name: tiny-llama\ncompile_topology: v5e-4\n")
        (alias / "dataset.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
        (alias / "checkpoint" / "state.bin").write_bytes(bytes(range(256)))
        (alias / "checkpoint" / "meta.json").write_text('{"step": 1, "model_name": "tiny-llama"}\n')
        self.alias_dir = alias
        self.alias = {"config": str(alias / "config.yml"), "dataset": str(alias / "dataset.txt"),
                      "checkpoint": str(alias / "checkpoint"), "config_dir": str(alias)}

    @staticmethod
    def _link(path, target):
        if not os.path.lexists(path):
            os.symlink(target, path)

    def write_configs(self, rng, keys, count):
        """A pool of broken and valid config files."""
        bodies = [
            "model_name: tiny-llama\ncompile_topology: v5e-4\n",
            "model_name: tiny-llama\n---\nsteps: 3\n",
            "model_name: [tiny-llama\n",
            "steps: abc\n", "steps: '150001'\n", "adam_b1: .nan\n", "remat_policy: true\n",
            "steps: 1.5\n", "\xff\xfe: 1\n", "base_config: base.yml\n", "base_config: self.yml\n",
            "a: &x [*x]\n", "model_name: !!binary aGk=\n", "", "# only a comment\n", "null\n",
            "- a\n- b\n", "key\n", "ici_fsdp_parallelism: {a: 1}\n", "steps: 1e400\n",
            "model_name: tiny-llama\nmodel_name: llama2-7b\n", "\t bad indent: 1\n",
            "mesh_axes: notalist\n", "logical_axis_rules: [[a]]\n", "logical_axis_rules: 5\n",
            "data_sharding: [[1, 2]]\n", "compile_topology: v5e-3\n",
        ]
        for index in range(count):
            if index < len(bodies):
                body = bodies[index]
            else:
                lines = []
                for _ in range(rng.randint(1, 6)):
                    key = rng.choice(keys.all_keys + ["unknown_key", "stesp", "model-name"])
                    lines.append("%s: %s" % (key, rng.choice(INT_EDGES + FLOAT_EDGES + TEXT_EDGES)))
                body = "\n".join(lines) + "\n"
            path = self.work / "configs" / ("c%04d.yml" % index)
            path.write_bytes(body.encode("utf-8", "surrogateescape"))
            self.configs.append(str(path))
        self.configs.append(str(self.work / "fifo"))
        self.configs.append(str(self.work / "adir") + "/x.yml")

    def write_csvs(self, rng, count):
        header = "id,model_name,compile_topology,per_device_batch_size,measured_step_s,args"
        good = "r1,tiny-llama,v5e-4,1,0.5,"
        bodies = ["", header + "\n", header + "\n" + good + "\n", "id\n1\n",
                  header + "\nr1,tiny-llama,v5e-4,1,0,\n", header + "\nr1,tiny-llama,v5e-4,1,-2,\n",
                  header + "\nr1,tiny-llama,v5e-4,1,abc,\n", header + '\n"r1,tiny\n',
                  header + "\nr1,tiny-llama,v5e-4\n", header + "\n" + good + "x,y,z\n"]
        for index in range(count):
            body = bodies[index] if index < len(bodies) else header + "\n" + ",".join(
                rng.choice(TEXT_EDGES + INT_EDGES) for _ in range(rng.randint(1, 8))) + "\n"
            path = self.work / "csv" / ("v%03d.csv" % index)
            path.write_bytes(unescape_literal(body).encode("utf-8", "surrogateescape"))
            self.csvs.append(str(path))
        # A/B pairs files (validate --pairs): bad levels, quantities, runs and numbers.
        header = "id,level,quantity,a,b,measured_a,measured_b,source,config_note"
        run = "model_name=tiny-llama compile_topology=v5e-4"
        rows = [f"p,step,step_s,{run},{run},1,1.1,s,", f"p,op,seconds,matmul m=8 n=8 k=8,{run},1,2,s,",
                f"p,step,mfu,published:V4-1,recipe:nope,1,2,s,", f"p,kernel,step_s,{run},{run},1,2,s,",
                f"p,step,seconds,{run},{run},1,2,s,", f"p,step,step_s,{run},{run},0,-1,s,",
                f"p,step,step_s,,{run},1,2,s,", f"p,op,seconds,all_gather bytes=-1 axes=x,{run},1,2,s,",
                f"p,step,step_s,{run} steps=abc,{run},1e400,2,s,", "p,step\n"]
        for index in range(count):
            body = header + "\n" + (rows[index] if index < len(rows) else ",".join(
                rng.choice(TEXT_EDGES + INT_EDGES) for _ in range(rng.randint(1, 10)))) + "\n"
            path = self.work / "csv" / ("p%03d.csv" % index)
            path.write_bytes(unescape_literal(body).encode("utf-8", "surrogateescape"))
            self.pair_csvs.append(str(path))


class Generator:
    """Draws command lines; each method is one class of input and returns (label, argv)."""

    def __init__(self, rng, keys, sandbox):
        self.rng = rng
        self.keys = keys
        self.sandbox = sandbox
        self.classes = [
            (30, self.valid_estimate), (12, self.int_edge), (8, self.float_edge),
            (8, self.text_edge), (6, self.bool_edge), (6, self.mistyped_key),
            (8, self.maxtext_key), (5, self.override_syntax), (6, self.slice_name),
            (8, self.mesh), (5, self.config_file), (4, self.input_path), (3, self.output_path),
            (4, self.topology), (2, self.hardware_and_op), (3, self.program), (1, self.explore),
            (2, self.validate), (3, self.xla_flags), (3, self.option_values), (3, self.noise),
            (1, self.train),
            # Issue 35 (red-team pass): pipeline keys, slice shapes near integer limits,
            # batches and lengths that do not divide, keys train does not build, outputs that
            # alias inputs. The train and explore parts are classes of their own, kept small.
            (4, self.pipeline), (3, self.int_limit_shape), (3, self.uneven_batch),
            (0.5, self.train_unbuilt), (2, self.alias_output), (0.5, self.explore_edges),
            (0.5, self.train_edges),
            # Stop 49: compare's two sides (shared arguments, --a and --b overrides, --top).
            (2, self.compare),
            # Stop 50: --require-fit on models that may not fit their slice (exit 3 allowed).
            (1, self.require_fit),
            # plan's options, and eval / generate / export-hf on paths that hold no model.
            (1, self.plan_edges), (1, self.model_path_edges),
        ]
        self.total_weight = sum(weight for weight, _ in self.classes)

    def line(self):
        pick = self.rng.uniform(0, self.total_weight)
        for weight, method in self.classes:
            pick -= weight
            if pick <= 0:
                return method()
        return self.classes[-1][1]()

    # Helpers.
    def base(self, small=False):
        rng = self.rng
        model = rng.choice(self.keys.small_models if small else self.keys.models)
        slice_name = rng.choice(SMALL_SLICES if small else SLICES_GOOD)
        args = ["model_name=" + model, "compile_topology=" + slice_name]
        if rng.random() < 0.5:
            args.append("per_device_batch_size=" + rng.choice(["1", "2", "4", "0.5", "0.25"]))
        if rng.random() < 0.3:
            args.append("max_target_length=" + rng.choice(["128", "1024", "2048", "8192"]))
        if rng.random() < 0.3:
            args.append("remat_policy=" + rng.choice(["full", "minimal", "save_qkv_proj",
                                                      "custom", "save_dot_except_mlp"]))
        return args

    def value_for(self, key):
        kind = self.keys.type_of(key)
        if kind == "int":
            return self.rng.choice(INT_EDGES)
        if kind == "float":
            return self.rng.choice(FLOAT_EDGES)
        if kind == "bool":
            return self.rng.choice(["true", "false", "True", "1", "0", "yes", "", "maybe"])
        return self.rng.choice(TEXT_EDGES + INT_EDGES[:4])

    def keys_of_type(self, kind):
        return [key for key in self.keys.all_keys if self.keys.type_of(key) == kind]

    def mutate(self, text):
        rng = self.rng
        if not text:
            return "x"
        position = rng.randrange(len(text))
        action = rng.randrange(4)
        if action == 0:
            return text[:position] + text[position + 1:]
        if action == 1:
            return text[:position] + rng.choice("abcdefghijklmnopqrstuvwxyz_-.") + text[position:]
        if action == 2 and len(text) > 1:
            chars = list(text)
            other = min(position + 1, len(text) - 1)
            chars[position], chars[other] = chars[other], chars[position]
            return "".join(chars)
        return text.upper() if rng.random() < 0.5 else text + rng.choice(["s", "_", "2"])

    def command(self):
        return "estimate" if self.rng.random() < 0.8 else self.rng.choice(["config", "program"])

    # Classes.
    def valid_estimate(self):
        args = self.base()
        if self.rng.random() < 0.3:
            args.append("--json")
        return "valid_estimate", ["estimate"] + args

    def int_edge(self):
        key = self.rng.choice(self.keys_of_type("int"))
        return "int_edge", [self.command()] + self.base() + [key + "=" + self.value_for(key)]

    def float_edge(self):
        key = self.rng.choice(self.keys_of_type("float"))
        return "float_edge", [self.command()] + self.base() + [key + "=" + self.value_for(key)]

    def text_edge(self):
        key = self.rng.choice(self.keys_of_type("str") + ["model_name", "compile_topology",
                                                          "remat_policy", "attention",
                                                          "quantization", "dtype"])
        value = self.rng.choice(TEXT_EDGES) if self.rng.random() < 0.6 else self.mutate(
            self.keys.tpusim.get(key, "x").strip('"'))
        if key.endswith("_quantization_calibration_method") and self.rng.random() < 0.5:
            # qwix's forms and their near misses (model/config_rules.cpp).
            value = self.rng.choice(["absmax", "minmax,2", "rms", "rms,3", "fixed", "fixed,224",
                                     "fixed,-224,224", "fixed,1,-1", "FIXED,-8,8", "absmax,x",
                                     "fixed,,", "fixed,-224,224,1"])
        return "text_edge", [self.command()] + self.base() + [key + "=" + value]

    def bool_edge(self):
        key = self.rng.choice(self.keys_of_type("bool"))
        return "bool_edge", [self.command()] + self.base() + [key + "=" + self.value_for(key)]

    def mistyped_key(self):
        key = self.mutate(self.rng.choice(self.keys.all_keys))
        return "mistyped_key", [self.command()] + self.base() + [key + "=1"]

    def maxtext_key(self):
        args = self.base()
        for _ in range(self.rng.randint(1, 3)):
            key = self.rng.choice(sorted(self.keys.maxtext))
            default = self.keys.maxtext[key][0].strip('"')
            value = default if self.rng.random() < 0.4 else self.value_for(key)
            args.append(key + "=" + value)
        return "maxtext_key", [self.command()] + args + (["--json"] if self.rng.random() < 0.2 else [])

    def override_syntax(self):
        bad = self.rng.choice(["=x", "model_name", "model_name==tiny-llama", "=", "==",
                               "model_name=tiny-llama=x", " model_name=tiny-llama",
                               "model_name =tiny-llama", "-model_name=x", "--model_name=x",
                               "model_name=tiny-llama model_name=llama2-7b", "x.yml", ".yml",
                               "--", "-", "--json=1", "--unknown", "-h", "--help", "estimate"])
        return "override_syntax", [self.command()] + self.base() + [bad]

    def slice_name(self):
        name = self.rng.choice(SLICES_BAD) if self.rng.random() < 0.7 else self.rng.choice(
            SLICES_GOOD)
        args = ["model_name=" + self.rng.choice(self.keys.models), "compile_topology=" + name]
        if self.rng.random() < 0.5:
            args.append("compile_topology_num_slices=" + self.rng.choice(
                ["0", "1", "2", "4", "32", "-1", "10001", "1000000", "2147483648"]))
        return "slice_name", ["estimate"] + args

    def mesh(self):
        args = self.base()
        for _ in range(self.rng.randint(1, 3)):
            value = self.rng.choice(["-1", "1", "2", "4", "8", "16", "0", "-3", "3", "65536",
                                     "4294967296", "1048576", "1048577"])
            args.append(self.rng.choice(MESH_KEYS) + "=" + value)
        return "mesh", [self.rng.choice(["estimate", "estimate", "program", "config"])] + args

    def config_file(self):
        args = [self.rng.choice(self.sandbox.configs)]
        if self.rng.random() < 0.5:
            args += self.base()
        return "config_file", [self.rng.choice(["config", "estimate", "program"])] + args

    def input_path(self):
        key = self.rng.choice(["dataset_path", "tokenizer_path", "load_parameters_path",
                               "load_full_state_path", "base_config", "hardware_catalog"])
        path = self.rng.choice(self.sandbox.hostile_inputs)
        if key in ("dataset_path", "tokenizer_path"):
            args = ["train", "model_name=tiny-llama", "compile_topology=v5e-1", "steps=1",
                    "per_device_batch_size=1", "max_target_length=8", "dataset_type=" +
                    self.rng.choice(["text", "jsonl", "synthetic", "hf", "tfds"]), "--quiet"]
            return "input_path", args + [key + "=" + path]
        if self.rng.random() < 0.5:
            return "input_path", ["config", path] + self.base()
        return "input_path", ["estimate"] + self.base() + [key + "=" + path]

    def output_path(self):
        path = self.rng.choice(self.sandbox.hostile_outputs)
        if self.rng.random() < 0.3:
            return "output_path", ["topology", self.rng.choice(SMALL_SLICES), "--dot", path]
        return "output_path", ["estimate"] + self.base(small=True) + [
            self.rng.choice(["--trace", "--html"]), path]

    def topology(self):
        slice_name = self.rng.choice(SLICES_GOOD + SLICES_BAD)
        # MaxText's spelling of the slice (compile_topology=...) is accepted as the slice.
        args = ["topology", ("compile_topology=" if self.rng.random() < 0.2 else "") + slice_name]
        if self.rng.random() < 0.5:
            args += ["--num-slices", self.rng.choice(["0", "1", "2", "-1", "64", "10000",
                                                      "10001", "2147483648", "x", "1e3"])]
        if self.rng.random() < 0.3:
            args.append("--json")
        if self.rng.random() < 0.1:
            args.append("--dot")
        return "topology", args

    def hardware_and_op(self):
        if self.rng.random() < 0.2:
            return "hardware_and_op", ["hw"] + (["--json"] if self.rng.random() < 0.5 else [])
        kind = self.rng.choice(["matmul", "all_gather", "reduce_scatter", "all_reduce",
                                "all_to_all", "conv", ""])
        args = ["op", kind] + [self.rng.choice(INT_EDGES[:12] + ["fsdp", "data", "x"])
                               for _ in range(self.rng.randint(0, 4))]
        if kind == "matmul" and self.rng.random() < 0.4:
            # A grouped (megablox) matmul: groups at and past the row count, and its tile keys.
            args += ["m=" + self.rng.choice(["4096", "65536", "1", "x"]),
                     "groups=" + self.rng.choice(["1", "8", "128", "4096", "65537", "0", "-1",
                                                  "2147483648", "1.5", "x", ""])]
            if self.rng.random() < 0.5:
                args.append("wi_tile_fwd_batch_seq=" + self.rng.choice(["128", "256", "0", "-8",
                                                                        "100000000000"]))
        if self.rng.random() < 0.2:
            # Keys of the other op kind, repeated axes, and the quantization formats.
            args.append(self.rng.choice(["bytes=64", "axes=fsdp,fsdp", "axes=fsdp", "m=8",
                                         "quantization=intmp", "quantization=nanoo_fp8",
                                         "quantization=int4", "quantization=fp4"]))
        args.append("compile_topology=" + self.rng.choice(SMALL_SLICES + SLICES_BAD[:4]))
        return "hardware_and_op", args

    def program(self):
        args = ["program"] + self.base(small=self.rng.random() < 0.5)
        if self.rng.random() < 0.5:
            args += ["--layer", self.rng.choice(["0", "1", "-1", "99", "2147483648", "x"])]
        if self.rng.random() < 0.2:
            args.append("--global")
        return "program", args

    def explore(self):
        args = ["explore", "model_name=" + self.rng.choice(self.keys.small_models + ["llama2-7b"]),
                "compile_topology=" + self.rng.choice(["v5e-4", "v5e-8", "v5p-8", "v4-8"]),
                "--threads", "1"]
        if self.rng.random() < 0.5:
            key = self.rng.choice(MESH_KEYS[:8] + ["per_device_batch_size", "max_target_length"])
            args.append(key + "=" + self.rng.choice(["-1", "0", "-3", "2", "3", "4294967296"]))
        if self.rng.random() < 0.5:
            option = self.rng.choice(OPTIONS["explore"][0][:7])
            args += [option, self.rng.choice(INT_EDGES[:10] + FLOAT_EDGES[:8] + ["mfu", "x"])]
        return "explore", args

    def validate(self):
        if self.rng.random() < 0.3:
            args = ["validate", "--pairs",
                    self.rng.choice(self.sandbox.pair_csvs + self.sandbox.hostile_inputs)]
        else:
            args = ["validate", self.rng.choice(self.sandbox.csvs + self.sandbox.hostile_inputs)]
        if self.rng.random() < 0.3:
            args += ["--without", self.rng.choice(MECHANISMS + ["x", "", ","])]
        if self.rng.random() < 0.1:
            # --list-mechanisms alone, or with what it excludes (a CSV, --pairs, --without).
            args = ["validate", "--list-mechanisms"] + (args[1:] if self.rng.random() < 0.5 else [])
        return "validate", args

    def compare(self):
        """`compare` with shared arguments and two sides drawn like estimate's overrides."""
        def side():
            if self.rng.random() < 0.2:
                return self.rng.choice(["", "=", "x=1", "remat_policy", " "] + INT_EDGES[:4])
            key = self.rng.choice(["remat_policy", "per_device_batch_size", "quantization",
                                   "ici_fsdp_parallelism", "compile_topology_num_slices"])
            return key + "=" + self.value_for(key)
        args = ["compare"] + self.base(small=True) + ["--a", side(), "--b", side()]
        if self.rng.random() < 0.3:
            args += ["--top", self.rng.choice(INT_EDGES[:10])]
        if self.rng.random() < 0.5:
            args.append("--json")
        return "compare", args

    def xla_flags(self):
        flags = " ".join(self.rng.choice(XLA_FLAGS) for _ in range(self.rng.randint(1, 3)))
        return "xla_flags", [self.rng.choice(["estimate", "config", "program"])] + self.base() + [
            "--xla-flags", flags]

    def option_values(self):
        command = self.rng.choice(["estimate", "topology", "program", "config", "validate"])
        with_value, flags = OPTIONS[command]
        args = [command]
        args += [self.rng.choice(SMALL_SLICES)] if command == "topology" else self.base(small=True)
        if with_value:
            option = self.rng.choice(with_value)
            if option in ("--trace", "--html", "--dot"):
                value = self.rng.choice(self.sandbox.hostile_outputs)
            elif option == "--without":
                value = ",".join(self.rng.choice(MECHANISMS + ["nope"]) for _ in range(2))
            else:
                value = self.rng.choice(INT_EDGES)
            args += [option, value]
        if flags and self.rng.random() < 0.5:
            args.append(self.rng.choice(flags))
        return "option_values", args

    def plan_edges(self):
        """`plan` on a tiny model and at most 8 chips, one option drawn from its edges."""
        edges = {
            "--tokens": ["2e12", "1.5T", "4M", "0", "-1", "x", "1Q", "inf", "nan", "", " 5", "+5",
                         "0x10"],
            "--deadline": ["30d", "12h", "8w", "0d", "-1d", "5y", "x", ""],
            "--hardware": ["v5e", "v5e,v6e", "v9", "", "a3", "v5e,,v6e", "tpu7x"],
            "--max-slices": INT_EDGES[:8],
            "--global-batch-tokens": ["1M-16M", "16M-1M", "0", "1T", "x-y", "4194304", "-"],
            "--objective": ["time", "chip_hours", "cost", "nope", ""],
            "--consumption": ["on_demand", "spot", "committed", "free"],
            "--prices": ["configs/prices.example.yml", "/nonexistent/prices.yml", "/etc/hostname"],
            "--min-hbm-headroom": ["0", "0.2", "1", "1.5", "-0.1", "nan", "x"],
            "--max-per-device-batch": ["1", "0.5", "0", "-1", "1e309", "x"],
        }
        option = self.rng.choice(sorted(edges))
        args = ["plan", "model_name=tiny-llama", "--max-chips", "8"]
        if option != "--tokens":
            args += ["--tokens", "1e9"]
        if option != "--hardware":
            args += ["--hardware", "v5e"]
        args += [option, self.rng.choice(edges[option])]
        if self.rng.random() < 0.3:
            args.append("--json")
        return "plan_edges", args

    def model_path_edges(self):
        """eval, generate and export-hf of paths that are no checkpoint, or with bad options."""
        path = self.rng.choice(["/nonexistent/checkpoints/8", "/", "/etc/hostname", "", "."])
        command = self.rng.choice(["eval", "generate", "export-hf"])
        args = [command, path]
        if command == "eval":
            args += [self.rng.choice(["dataset_path=/nonexistent.txt", "eval_steps=0",
                                      "eval_steps=-1", "model_name=tiny-llama"])]
        elif command == "generate":
            args += ["--prompt", self.rng.choice(["", "abc", "a b"])]
            option = self.rng.choice(["--max-tokens", "--temperature", "--top-k", "--seed"])
            args += [option, self.rng.choice(["0", "-1", "70000", "0.5", "x"])]
        else:
            args += [str(self.sandbox.work / "out" / "hf"),
                     *self.rng.choice([[], ["--dtype", "bfloat16"], ["--dtype", "int4"]])]
        return "model_path_edges", args

    def require_fit(self):
        """estimate --require-fit with a model from tiny to 405B on a small or large slice: runs
        that fit exit 0, those that do not exit 3 with the verdict (the driver checks which)."""
        model = self.rng.choice(["tiny-llama", "llama2-7b", "llama3.1-70b", "llama3.1-405b",
                                 "mixtral-8x7b", "deepseek3-671b"])
        args = ["estimate", f"model_name={model}",
                f"compile_topology={self.rng.choice(SMALL_SLICES + ['v5p-1024', 'tpu7x-256'])}",
                "--require-fit"]
        if self.rng.random() < 0.3:
            args.append("--json")
        return "require_fit", args

    def noise(self):
        """Random bytes in place of a token: control characters, invalid UTF-8, long strings."""
        args = [self.rng.choice(["estimate", "config", "topology", "program", "explore", "x"])]
        args += self.base()
        token = "".join(chr(self.rng.choice([0x01, 0x09, 0x0A, 0x1B, 0x7F, 0xDCFF, 0xDC80,
                                             0x41, 0x3D, 0x2D, 0x20]))
                        for _ in range(self.rng.randint(1, 40)))
        args.insert(self.rng.randint(1, len(args)), token)
        return "noise", args

    def train(self):
        args = ["train", "model_name=" + self.rng.choice(self.keys.small_models),
                "compile_topology=" + self.rng.choice(["v5e-1", "v5e-4"]), "per_device_batch_size=1",
                "max_target_length=8", "steps=" + self.rng.choice(["0", "1", "2", "-1", "abc"]),
                "--quiet", "base_output_directory=" + str(self.sandbox.work / "runs")]
        key = self.rng.choice(["run_name", "checkpoint_period", "eval_interval", "learning_rate",
                               "metrics_file", "token_viz_file", "gradient_accumulation_steps",
                               "data_shuffle_seed", "init_weights_seed", "dataset_cache_dir"])
        if key in ("metrics_file", "token_viz_file", "dataset_cache_dir"):
            value = self.rng.choice(self.sandbox.hostile_outputs)
        elif key == "gradient_accumulation_steps":
            # A valid count trains that many microbatches for real (65,536 take minutes on a CPU:
            # work the user asked for, not a hang); the edges around the valid range are tried.
            value = self.rng.choice(["0", "-1", "1", "2", "1048577", "2147483648", "1.5", "abc"])
        elif key == "run_name":
            value = self.rng.choice(["ok", "../..", "..", "/abs", "a/b", "", "\\xff", "a\\nb"])
        else:
            value = self.value_for(key) if self.rng.random() < 0.7 else "1"
        return "train", args + [key + "=" + value]


    # Issue 35 classes.
    def pipeline_args(self):
        """One to three distinct pipeline keys; mostly small sizes that can work, so the line
        reaches the pipeline schedule, sometimes the integer edges."""
        args = []
        for key in self.rng.sample(PIPELINE_KEYS, self.rng.randint(1, 3)):
            if key == "pipeline_fsdp_ag_once":
                value = self.rng.choice(["true", "false", "1", "maybe"])
            elif self.rng.random() < 0.7:
                value = self.rng.choice(["1", "2", "2", "4", "4", "8", "3"])
            else:
                value = self.rng.choice(PIPELINE_VALUES)
            args.append(key + "=" + value)
        return args

    def uneven_args(self):
        """A per-device batch or a length the mesh does not divide, on a mesh that mostly does
        fit the slice (so the batch, not the mesh, is what is wrong)."""
        rng = self.rng
        args = ["per_device_batch_size=" + rng.choice(["1.25", "0.75", "0.125", "0.3", "1.5",
                                                        "0.0625", "3"])]
        if rng.random() < 0.15:
            axis = rng.choice(["dcn_data_parallelism", "dcn_fsdp_parallelism"])
            args += [axis + "=" + rng.choice(["2", "3", "4"]),
                     "compile_topology_num_slices=" + rng.choice(["2", "4"])]
        elif rng.random() < 0.3:
            args += ["max_target_length=65", "ici_context_parallelism=4"]
            return args
        else:
            axis = rng.choice(["ici_fsdp_parallelism", "ici_data_parallelism",
                               "ici_context_parallelism", "ici_tensor_parallelism"])
            args.append(axis + "=" + rng.choice(["2", "4", "4", "-1", "3", "8"]))
        if rng.random() < 0.6:
            args.append("max_target_length=" + rng.choice(["65", "63", "17", "1", "7"]))
            if rng.random() < 0.5 and not any(a.startswith("ici_context_parallelism=")
                                               for a in args):
                args.append("ici_context_parallelism=" + rng.choice(["4", "3", "2"]))
        return args

    def pipeline(self):
        """Pipeline keys in estimate, config and program (explore and train: explore_edges,
        train_edges), also a DCN pipeline pinned on a single slice."""
        args = self.base(small=self.rng.random() < 0.7) + self.pipeline_args()
        if self.rng.random() < 0.3:
            args.append("compile_topology_num_slices=" + self.rng.choice(["1", "2", "4"]))
        command = self.rng.choice(["estimate", "estimate", "estimate", "config", "program"])
        return "pipeline", [command] + args

    def int_limit_shape(self):
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            args = ["topology", rng.choice(LIMIT_SHAPES + LIMIT_SLICES)]
            if rng.random() < 0.4:
                args += ["--num-slices", rng.choice(LIMIT_COUNTS)]
            if rng.random() < 0.3:
                args.append("--json")
            return "int_limit_shape", args
        slice_arg = "compile_topology=" + rng.choice(LIMIT_SLICES + LIMIT_SHAPES + ["v5e-4"])
        extra = [slice_arg]
        if rng.random() < 0.5:
            extra.append("compile_topology_num_slices=" + rng.choice(LIMIT_COUNTS + ["2"]))
        if kind == 1:
            command = rng.choice(["estimate", "estimate", "config", "program"])
            return "int_limit_shape", [command, "model_name=" + rng.choice(
                self.keys.small_models)] + extra
        if kind == 2:
            return "int_limit_shape", ["op", rng.choice(["matmul", "all_gather", "all_reduce"]),
                                       rng.choice(["1024", "4096"]), rng.choice(
                                           ["1024", "fsdp", "data"])] + extra
        return "int_limit_shape", ["config", "model_name=tiny-llama"] + extra + ["--json"]

    def uneven_batch(self):
        """Batches and lengths the mesh does not divide, in estimate, config and program."""
        args = self.base(small=self.rng.random() < 0.7)
        args = [a for a in args if not a.startswith(("per_device_batch_size=",
                                                      "max_target_length="))]
        return "uneven_batch", [self.rng.choice(["estimate", "estimate", "config", "program"])
                                ] + args + self.uneven_args()

    def train_base(self):
        return ["train", "model_name=" + self.rng.choice(self.keys.small_models),
                "compile_topology=" + self.rng.choice(["v5e-1", "v5e-4"]), "steps=1",
                "max_target_length=" + self.rng.choice(["8", "16"]), "--quiet",
                "base_output_directory=" + str(self.sandbox.work / "runs")]

    def train_unbuilt(self):
        """A key train does not build: exit 2 naming the key, before any step."""
        args = self.train_base() + ["per_device_batch_size=1", self.rng.choice(TRAIN_UNBUILT)]
        if self.rng.random() < 0.2:
            args.append(self.rng.choice(TRAIN_UNBUILT))
        return "train_unbuilt", args

    def explore_edges(self):
        """explore on tiny models and slices with pipeline keys, uneven batches, limit slices."""
        rng = self.rng
        args = ["explore", "model_name=" + rng.choice(self.keys.small_models),
                "compile_topology=" + rng.choice(["v4-8", "v5e-4", "v5p-8", "v5e-8"]),
                "--threads", "1", "--top", rng.choice(["1", "3"])]
        kind = rng.randrange(3)
        if kind == 0:
            args += self.pipeline_args()
            if rng.random() < 0.3:
                args.append("compile_topology_num_slices=" + rng.choice(["1", "2"]))
        elif kind == 1:
            args += self.uneven_args()
        else:
            # Not v5p:4x4x4: a valid 64-chip slice, which explore searches for seconds.
            args[2] = "compile_topology=" + rng.choice(
                LIMIT_SLICES + [shape for shape in LIMIT_SHAPES if shape != "v5p:4x4x4"])
            if rng.random() < 0.5:
                args.append("compile_topology_num_slices=" + rng.choice(LIMIT_COUNTS))
        return "explore_edges", args

    def train_edges(self):
        """train on tiny-llama, v5e-4, one step: pipeline keys, uneven batches and lengths,
        limit counts; a tenth with --verify."""
        rng = self.rng
        args = ["train", "model_name=tiny-llama", "compile_topology=v5e-4", "steps=1",
                "--quiet", "base_output_directory=" + str(self.sandbox.work / "runs")]
        kind = rng.randrange(3)
        if kind == 0:
            args += ["per_device_batch_size=1", "max_target_length=16"] + self.pipeline_args()
        elif kind == 1:
            uneven = self.uneven_args()
            if not any(a.startswith("max_target_length=") for a in uneven):
                uneven.append("max_target_length=16")
            args += uneven
        else:
            args += ["per_device_batch_size=1", "max_target_length=16",
                     rng.choice(["compile_topology_num_slices=", "dcn_pipeline_parallelism=",
                                 "dcn_data_parallelism="]) + rng.choice(LIMIT_COUNTS)]
        if rng.random() < 0.1:
            args.append("--verify")
        return "train_edges", args

    def alias_output(self):
        """An output path naming one of the line's own inputs (a config file, the dataset, the
        checkpoint). The runner checks the aliased files' bytes after every chunk."""
        rng = self.rng
        inputs = self.sandbox.alias
        kind = rng.randrange(10)
        if kind < 5:
            config = inputs["config"]
            option = rng.choice(["--html", "--trace", "--profile"])
            if option == "--profile":  # both outputs over the input
                return "alias_output", ["estimate", config, "--trace", config, "--html", config]
            return "alias_output", ["estimate", config] + (
                self.base(small=True) if rng.random() < 0.3 else []) + [option, config]
        if kind < 7:
            return "alias_output", ["export-hf", inputs["checkpoint"], rng.choice(
                [inputs["checkpoint"], inputs["checkpoint"] + "/.", inputs["config_dir"]])]
        if kind < 8:
            return "alias_output", ["explore", inputs["config"], "--threads", "1", "--top", "1",
                                    "--html", inputs["config"]]
        if kind < 9:
            return "alias_output", ["train", inputs["config"], "steps=1", "max_target_length=8",
                                    "per_device_batch_size=1", "--quiet", "base_output_directory="
                                    + str(self.sandbox.work / "runs"), rng.choice(
                                        ["metrics_file=", "token_viz_file="]) + inputs["config"]]
        args = self.train_base() + ["per_device_batch_size=1", "dataset_type=text",
                                    "dataset_path=" + inputs["dataset"]]
        target = rng.choice(["metrics_file=" + inputs["dataset"],
                             "token_viz_file=" + inputs["dataset"],
                             "metrics_file=" + inputs["config_dir"] + "/../alias/./dataset.txt",
                             "dataset_cache_dir=" + inputs["config_dir"]])
        return "alias_output", args + [target]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--sandbox", type=Path, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    rng = random.Random(options.seed)
    keys = Keys(options.repo)
    sandbox = Sandbox(options.sandbox, options.repo)
    sandbox.write_configs(rng, keys, 300)
    sandbox.write_csvs(rng, 60)
    generator = Generator(rng, keys, sandbox)
    out = sys.stdout
    for _ in range(options.count):
        label, argv = generator.line()
        argv = [unescape_literal(token) for token in argv]
        out.write("\t".join([label] + [escape(token) for token in argv]) + "\n")


if __name__ == "__main__":
    main()
