#include "model/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/embedded_files.h"
#include "common/error.h"
#include "model/config_node.h"
#include "model/config_rules.h"

namespace tpusim {
namespace {

std::string load_error(const std::vector<std::string>& files,
                       const std::vector<std::string>& overrides) {
  try {
    Config::load_files(files, overrides);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    Config::load("", overrides);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(Config, EmbeddedBaseLoadsWithMaxTextDefaults) {
  const Config config = Config::load("", {});
  EXPECT_EQ(config.get_int("base_emb_dim"), 2048);
  EXPECT_DOUBLE_EQ(config.get_float("per_device_batch_size"), 12.0);
  EXPECT_EQ(config.get_int("ici_fsdp_parallelism"), -1);
  EXPECT_EQ(config.get_int("dcn_data_parallelism"), -1);
  EXPECT_EQ(config.get_string("remat_policy"), "full");
  EXPECT_EQ(config.get_string_list("mlp_activations"),
            (std::vector<std::string>{"silu", "linear"}));
  EXPECT_TRUE(config.get_bool("scan_layers"));
  EXPECT_EQ(config.origin("base_emb_dim"), "configs/base.yml");
}

// get_int reads the stored decimal text directly; it must agree with yaml-cpp's conversion for
// every way an int can be written.
// The embedded base is parsed once per process; a load that changes values (a preset replacing
// logical_axis_rules, overrides of lists) must not leak into the next load.
TEST(Config, LoadsInOneProcessDoNotShareValues) {
  const nlohmann::json first = Config::load("", {"model_name=tiny-llama"}).to_json();
  Config::load("", {"model_name=deepseek3-671b-2dfsdp"});
  const std::string mesh_axes =
      "mesh_axes=[data, fsdp, tensor, stage, expert, context, sequence, tensor_transpose, "
      "tensor_sequence, autoregressive, fsdp_transpose]";
  Config::load("", {"model_name=tiny-llama", "override_model_config=true", "mlp_activations=[gelu]",
                    mesh_axes, "data_sharding=[[data, fsdp]]"});
  EXPECT_EQ(Config::load("", {"model_name=tiny-llama"}).to_json(), first);
}

TEST(Config, IntsReadAsYamlConvertsThem) {
  Config config = Config::load("", {});
  for (const char* text : {"0", "-0", "7", "-1", "007", "+5", "4096", "-9223372036854775808",
                           "9223372036854775807", "1e3"}) {
    try {
      config.set("base_emb_dim", text, "test");
    } catch (const UserError&) {
      continue;  // not an integer (1e3)
    }
    EXPECT_EQ(config.get_int("base_emb_dim"), config_node(config, "base_emb_dim").as<int64_t>())
        << text;
  }
  EXPECT_EQ(config.get_int("base_emb_dim"), 9223372036854775807);
}

// MaxText's presets write some integers with a zero fraction (qwen2.5: rope_max_timescale
// 1000000.0); pydantic takes them as integers, and so does tpusim. A real fraction is an error.
TEST(Config, IntsWithAZeroFractionAreIntegers) {
  Config config = Config::load("", {});
  config.set("rope_max_timescale", "1000000.0", "test");
  EXPECT_EQ(config.get_int("rope_max_timescale"), 1000000);
  config.set("rope_max_timescale", "-7.00", "test");
  EXPECT_EQ(config.get_int("rope_max_timescale"), -7);
  for (const char* text : {"1.5", "1000000.01", ".0", "1e3", "1.0e3"}) {
    EXPECT_THROW(config.set("rope_max_timescale", text, "test"), UserError) << text;
  }
}

// get_float reads the stored text with from_chars; it must agree with yaml-cpp's conversion.
TEST(Config, FloatsReadAsYamlConvertsThem) {
  Config config = Config::load("", {});
  for (const char* text : {"0", "12", "-0.5", "0.1", "1e-6", "3.0000000000000004", "1.5E+20",
                           "2.2250738585072014e-308", "123456789012345678901234567890", ".5"}) {
    config.set("learning_rate", text, "test");
    EXPECT_EQ(config.get_float("learning_rate"), config_node(config, "learning_rate").as<double>())
        << text;
  }
}

TEST(Config, LoadingOrderBaseThenPresetThenCommandLine) {
  const Config config = Config::load(
      "", {"model_name=llama3.1-70b", "per_device_batch_size=4", "remat_policy=minimal"});
  EXPECT_EQ(config.get_int("base_emb_dim"), 8192);
  EXPECT_EQ(config.origin("base_emb_dim"), "configs/models/llama3.1-70b.yml");
  EXPECT_EQ(config.get_int("base_num_kv_heads"), 8);
  EXPECT_EQ(config.get_int("vocab_size"), 128256);
  EXPECT_DOUBLE_EQ(config.get_float("per_device_batch_size"), 4.0);
  EXPECT_EQ(config.origin("per_device_batch_size"), "command line");
  EXPECT_EQ(config.get_string("remat_policy"), "minimal");
  EXPECT_EQ(config.get_int("max_target_length"), 2048);  // untouched: from base
}

TEST(Config, PresetKeyOnCommandLineNeedsOverrideModelConfig) {
  const std::string message = error_of({"model_name=llama2-7b", "base_emb_dim=1024"});
  EXPECT_NE(message.find("base_emb_dim"), std::string::npos) << message;
  EXPECT_NE(message.find("override_model_config"), std::string::npos) << message;
  const Config config =
      Config::load("", {"model_name=llama2-7b", "override_model_config=true", "base_emb_dim=1024"});
  EXPECT_EQ(config.get_int("base_emb_dim"), 1024);
}

TEST(Config, ListsAndBoolsParseAsInMaxText) {
  const Config config =
      Config::load("", {"mlp_activations=[relu]", "scan_layers=False", "logits_via_embedding=true",
                        "per_device_batch_size=0.125", "max_target_length=1048576"});
  EXPECT_EQ(config.get_string_list("mlp_activations"), std::vector<std::string>{"relu"});
  EXPECT_FALSE(config.get_bool("scan_layers"));
  EXPECT_TRUE(config.get_bool("logits_via_embedding"));
  EXPECT_DOUBLE_EQ(config.get_float("per_device_batch_size"), 0.125);
}

TEST(Config, UnknownKeySuggestsClosest) {
  const std::string message = error_of({"ici_fsdp_paralelism=4"});
  EXPECT_NE(message.find("ici_fsdp_paralelism"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'ici_fsdp_parallelism'"), std::string::npos) << message;
}

TEST(Config, WrongTypesAreRejectedNamingTheKey) {
  for (const std::vector<std::string>& overrides : std::vector<std::vector<std::string>>{
           {"base_emb_dim=4096.5"},
           {"base_emb_dim=big"},
           {"per_device_batch_size=four"},
           {"scan_layers=maybe"},
           {"mlp_activations=silu"},
           {"steps=1e400"},
           {"learning_rate=nan"},
       }) {
    const std::string key = overrides[0].substr(0, overrides[0].find('='));
    const std::string message = error_of(overrides);
    EXPECT_NE(message.find(key), std::string::npos) << overrides[0] << " -> " << message;
  }
}

TEST(Config, OutOfRangeAndAbsurdValuesAreRejected) {
  for (const std::string text :
       {"base_emb_dim=0", "base_emb_dim=100000000", "per_device_batch_size=0",
        "per_device_batch_size=-1.0", "base_num_decoder_layers=-3", "vocab_size=1000000000",
        "adam_b1=1.5", "num_experts_per_tok=4", "base_num_kv_heads=5", "global_parameter_scale=3",
        "remat_policy=ful", "attention=flesh", "dtype=fp7", "decoder_layer_input=somewhere",
        "mlp_activations=[silu,tanhh]"}) {
    const std::string key = text.substr(0, text.find('='));
    const std::string message = error_of({text});
    EXPECT_NE(message.find(key), std::string::npos) << text << " -> " << message;
  }
}

// The calibration methods are qwix's (calibrate() in qwix/_src/core/qarray.py): a value qwix
// would refuse is refused by its key, and the forms the published fp8 recipes use load.
TEST(Config, QuantizationCalibrationMethodsAreQwixs) {
  for (const std::string text :
       {"weight_quantization_calibration_method=bogus", "act_quantization_calibration_method=fixed",
        "bwd_quantization_calibration_method=rms",
        "weight_quantization_calibration_method=fixed,1,-1",
        "act_quantization_calibration_method=absmax,x", "quantization=int4", "quantization=fp4"}) {
    const std::string key = text.substr(0, text.find('='));
    const std::string message = error_of({text});
    EXPECT_NE(message.find(key), std::string::npos) << text << " -> " << message;
  }
  for (const std::string text : {"weight_quantization_calibration_method=fixed,-224,224",
                                 "act_quantization_calibration_method=FIXED,224",
                                 "bwd_quantization_calibration_method=rms,3",
                                 "weight_quantization_calibration_method=minmax"}) {
    EXPECT_EQ(error_of({text}), "") << text;
  }
}

// Red-team item 7: compile_topology_num_slices=4294967298 was narrowed to an int (2 slices). Every
// int key is range-checked before any use narrows it: the slice count against parse_slice's bound,
// the rest against 32 bits unless they are step counts or seeds, read as 64-bit.
TEST(RedTeam, Item7_ParsedIntsAreRangeCheckedBeforeNarrowing) {
  for (const std::string text :
       {"compile_topology_num_slices=4294967298", "compile_topology_num_slices=10001",
        "num_slices=4294967298", "num_pipeline_microbatches=4294967297",
        "num_layers_per_pipeline_stage=-4294967295", "rope_max_timescale=4294967296",
        "pipeline_parallel_layers=2147483648"}) {
    const std::string key = text.substr(0, text.find('='));
    const std::string value = text.substr(text.find('=') + 1);
    const std::string message = error_of({text});
    EXPECT_NE(message.find(key), std::string::npos) << text << " -> " << message;
    EXPECT_NE(message.find(value), std::string::npos) << text << " -> " << message;
  }
  // The largest 32-bit value and a 64-bit seed still load.
  EXPECT_EQ(error_of({"rope_max_timescale=2147483647"}), "");
  EXPECT_EQ(Config::load("", {"data_shuffle_seed=4294967298"}).get_int("data_shuffle_seed"),
            4294967298);
}

// Red-team item 13: mlp_activations is one activation per gated MLP branch; 20,000 of them
// overflowed the stack and 10,000 took 4.6 s and 500 MB. More than 8 is refused.
TEST(RedTeam, Item13_MlpActivationsLengthIsBounded) {
  // From a file: on the command line the list is one value, past the 64 KiB value bound.
  const std::string path = ::testing::TempDir() + "/item13_activations.yml";
  {
    std::ofstream file(path);
    file << "mlp_activations:\n";
    for (int index = 0; index < 20000; ++index) {
      file << "  - silu\n";
    }
  }
  const std::string message = load_error({path}, {});
  EXPECT_NE(message.find("mlp_activations: 20000 activations, more than 8"), std::string::npos)
      << message.substr(0, 300);
  EXPECT_NE(error_of({"mlp_activations=[silu,linear,silu,linear,silu,linear,silu,linear,silu]"})
                .find("9 activations"),
            std::string::npos);
  EXPECT_EQ(error_of({"mlp_activations=[silu,linear,silu,linear,silu,linear,silu,linear]"}), "");
}

// Red-team item 19: a 200 MB value took 47 s and 1.6 GB; values, config files and the keys shown
// in messages are bounded, and the error names the limit.
TEST(RedTeam, Item19_ValueAndConfigFileSizesAreBounded) {
  const std::string long_value(size_t{64} << 10, 'r');
  EXPECT_EQ(error_of({"run_name=" + long_value}), "");  // at the limit
  const std::string message = error_of({"run_name=" + long_value + "r"});
  EXPECT_NE(message.find("'run_name' (command line): the value is 65537 bytes"), std::string::npos)
      << message.substr(0, 300);
  EXPECT_NE(message.find("65536 bytes"), std::string::npos);
  EXPECT_LT(message.size(), 300u);
  const std::string numeric = error_of({"base_emb_dim=" + std::string(size_t{1} << 20, '1')});
  EXPECT_NE(numeric.find("65536 bytes"), std::string::npos) << numeric.substr(0, 300);

  const std::string directory = ::testing::TempDir();
  const std::string big = directory + "/item19_big.yml";
  {
    std::ofstream file(big);
    file << "run_name: \"" << std::string((size_t{4} << 20) + 1, 'x') << "\"\n";
  }
  const std::string file_message = load_error({big}, {});
  EXPECT_NE(file_message.find(big), std::string::npos) << file_message.substr(0, 300);
  EXPECT_NE(file_message.find("4 MiB"), std::string::npos) << file_message.substr(0, 300);

  // A 2 MB unknown key: no suggestion computed (common/suggest.h), shown cut short.
  const std::string long_key = directory + "/item19_key.yml";
  // An explicit key ("? key"): yaml-cpp refuses a plain one over 1024 characters itself.
  std::ofstream(long_key) << "? " << std::string(size_t{2} << 20, 'k') << "\n: 1\n";
  const std::string key_message = load_error({long_key}, {});
  EXPECT_NE(key_message.find("a key of 2097152 bytes"), std::string::npos)
      << key_message.substr(0, 300);
  EXPECT_LT(key_message.size(), 500u);
}

// Red-team item 20: a config file giving a key twice was read with the last value winning, and of
// several unknown keys only the first was reported.
TEST(RedTeam, Item20_DuplicateYamlKeysAndAllUnknownKeysAreReported) {
  const std::string directory = ::testing::TempDir();
  const std::string duplicated = directory + "/item20_dup.yml";
  std::ofstream(duplicated) << "steps: 5\nrun_name: a\nsteps: 7\n";
  const std::string message = load_error({duplicated}, {});
  EXPECT_NE(message.find(duplicated + ": key 'steps' appears twice"), std::string::npos) << message;
  EXPECT_NE(message.find(duplicated + ":3"), std::string::npos) << message;  // the second one

  const std::string typos = directory + "/item20_typos.yml";
  std::ofstream(typos) << "remat_polcy: full\nici_fsdp_paralelism: 4\n";
  const std::string all = load_error({typos}, {"model_name=tiny-llama", "stpes=3"});
  for (const char* part :
       {"3 unknown config keys", "'remat_polcy' in ", "did you mean 'remat_policy'",
        "'ici_fsdp_paralelism' in ", "did you mean 'ici_fsdp_parallelism'",
        "'stpes' in command line", "did you mean 'steps'"}) {
    EXPECT_NE(all.find(part), std::string::npos) << part << "\n" << all;
  }
}

TEST(Config, EnumErrorsSuggest) {
  const std::string message = error_of({"remat_policy=minmal"});
  EXPECT_NE(message.find("did you mean 'minimal'"), std::string::npos) << message;
}

TEST(Config, UnknownModelSuggests) {
  const std::string message = error_of({"model_name=llama3.1-7b"});
  EXPECT_NE(message.find("llama3.1-7b"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean"), std::string::npos) << message;
}

TEST(Config, MalformedOverridesAndFiles) {
  EXPECT_NE(error_of({"=4"}).find("key=value"), std::string::npos);
  EXPECT_NE(error_of({"steps=1", "steps=2"}).find("twice"), std::string::npos);
  EXPECT_THROW(Config::load("/nonexistent/base.yml", {}), UserError);
  EXPECT_THROW(Config::load_from_texts("a: [1, 2\n", "bad.yml", {}, {}), UserError);
  EXPECT_THROW(Config::load_from_texts("- a\n- b\n", "list.yml", {}, {}), UserError);
  EXPECT_THROW(Config::load_from_texts("a: 1\na: 2\n", "dup.yml", {}, {}), UserError);
  EXPECT_THROW(Config::load_from_texts("a: null\n", "null.yml", {}, {}), UserError);
}

TEST(Config, TypesAreInferredFromBaseDefaults) {
  const Config config = Config::load_from_texts("i: 3\nf: 3.0\nb: false\ns: \"3\"\nl: [x, y]\n",
                                                "t.yml", {}, {"f=2", "s=abc"});
  EXPECT_EQ(config.type("i"), ConfigType::kInt);
  EXPECT_EQ(config.type("f"), ConfigType::kFloat);
  EXPECT_EQ(config.type("b"), ConfigType::kBool);
  EXPECT_EQ(config.type("s"), ConfigType::kString);
  EXPECT_EQ(config.type("l"), ConfigType::kList);
  EXPECT_DOUBLE_EQ(config.get_float("f"), 2.0);
  EXPECT_EQ(config.get_string("s"), "abc");
}

TEST(Config, EveryPresetLoadsAndOnlySetsModelKeys) {
  const std::vector<std::string> presets = available_model_presets("");
  ASSERT_GE(presets.size(), 15u);
  for (const std::string& name : presets) {
    SCOPED_TRACE(name);
    const Config config = Config::load("", {"model_name=" + name});
    for (const std::string& key : config.keys()) {
      if (config.origin(key) != "configs/base.yml") {
        EXPECT_TRUE(key.find("parallelism") == std::string::npos && key != "compile_topology" &&
                    key != "per_device_batch_size")
            << key;
      }
    }
  }
}

TEST(Config, RequiredPresetsExist) {
  for (const char* name :
       {"llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b",
        "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "gpt3-175b", "gemma-7b", "qwen3-235b-a22b",
        "deepseek3-671b", "gpt-oss-120b", "tiny-llama", "tiny-gpt3", "tiny-moe"}) {
    EXPECT_TRUE(embedded_file(std::string("configs/models/") + name + ".yml").has_value()) << name;
  }
}

TEST(ConfigRules, EveryRuleKeyIsInBase) {
  const Config config = Config::load("", {});
  for (const std::string& key : config_rule_keys()) {
    EXPECT_TRUE(config.has(key)) << key;
  }
}

// A copy is independent: setting a key on it leaves the original as it was (the verify
// reference of `tpusim train` is such a copy).
TEST(Config, SettingACopyLeavesTheOriginal) {
  const Config original =
      Config::load("", {"model_name=tiny-llama", "per_device_batch_size=2", "num_vocab_tiling=4"});
  Config copy = original;
  copy.set("per_device_batch_size", "8", "test");
  copy.set("num_vocab_tiling", "1", "test");
  EXPECT_EQ(copy.get_float("per_device_batch_size"), 8.0);
  EXPECT_EQ(copy.get_int("num_vocab_tiling"), 1);
  EXPECT_EQ(original.get_float("per_device_batch_size"), 2.0);
  EXPECT_EQ(original.get_int("num_vocab_tiling"), 4);
  EXPECT_EQ(original.origin("num_vocab_tiling"), "command line");
}

TEST(Config, CommandLineOverridesRoundTrip) {
  const Config config = Config::load("", {"steps=7", "mlp_activations=[relu]"});
  const std::vector<std::string> overrides = config.command_line_overrides();
  const Config again = Config::load("", overrides);
  EXPECT_EQ(again.get_int("steps"), 7);
  EXPECT_EQ(again.get_string_list("mlp_activations"), std::vector<std::string>{"relu"});
}

// A copy is independent: yaml-cpp nodes are shared references, and setting a key on a copy
// (explore, the unsharded reference of train --verify) once wrote through to the original.
TEST(Config, SettingAKeyOnACopyLeavesTheOriginal) {
  const Config original = Config::load("", {"model_name=tiny-llama"});
  const double batch = original.get_float("per_device_batch_size");
  const std::string policy = original.get_string("remat_policy");
  Config copy = original;
  copy.set("per_device_batch_size", "7", "test");
  copy.set("remat_policy", "minimal", "test");
  EXPECT_EQ(copy.get_float("per_device_batch_size"), 7.0);
  EXPECT_EQ(copy.get_string("remat_policy"), "minimal");
  EXPECT_EQ(original.get_float("per_device_batch_size"), batch);
  EXPECT_EQ(original.get_string("remat_policy"), policy);
}

}  // namespace
}  // namespace tpusim
