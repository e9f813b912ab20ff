// MaxText configs load as MaxText writes them. The fixtures under tests/data/maxtext are key/value
// facts read from MaxText's repository (base.yml: key, default, type; every model preset: key,
// value), not produced by tpusim: from them the tests rebuild MaxText's base.yml and each preset
// YAML and load them unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/csv.h"
#include "common/error.h"
#include "common/yaml_text.h"
#include "model/config.h"
#include "model/config_node.h"
#include "model/maxtext_keys.h"
#include "support/run_command.h"

namespace tpusim {
namespace {

// Rows of a tab-separated fixture (header dropped, no quoting: values are YAML text).
std::vector<std::vector<std::string>> read_tsv(const std::string& relative_path) {
  const std::string path = testing::source_dir() + "/" + relative_path;
  return parse_tsv(read_text_file(path), path).rows;
}

// A scratch directory for YAML files, removed with the test.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("tpusim_compat_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

// The same YAML value whatever its quoting or spacing ("llama2" == llama2, 1e-5 == 1.0e-5 stays
// text: numbers are compared as numbers).
std::string canonical(const YAML::Node& node) {
  if (node.IsScalar()) {
    std::string text = node.Scalar();
    std::string digits = text;
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    try {
      size_t used = 0;
      const double number = std::stod(digits, &used);
      if (used == digits.size()) {
        std::ostringstream out;
        out << number;
        return out.str();
      }
    } catch (const std::exception&) {
    }
    for (char& character : text) {
      character = static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
    }
    return text;
  }
  if (node.IsSequence()) {
    std::string text = "[";
    for (const YAML::Node& item : node) {
      text += canonical(item) + ",";
    }
    return text + "]";
  }
  return node.IsNull() ? "" : "{map}";
}

std::string maxtext_base_yml() {
  std::string text;
  for (const auto& row : read_tsv("tests/data/maxtext/maxtext_keys.tsv")) {
    text += row[0] + ": " + (row.size() > 1 ? row[1] : "") + "\n";
  }
  return text;
}

TEST(MaxTextBaseYml, LoadsUnchangedWithEveryKeyKnown) {
  TempDir dir;
  const std::string path = dir.write("base.yml", maxtext_base_yml());
  const Config config = Config::load_files({path}, {});
  const std::vector<Config::PassthroughKey> passthrough = config.passthrough_keys();
  size_t maxtext_only = 0;
  for (const auto& row : read_tsv("tests/data/maxtext/maxtext_keys.tsv")) {
    if (!config.has(row[0])) {
      ++maxtext_only;
    }
  }
  // tpusim's own keys the estimate does not read are listed only away from MaxText's defaults,
  // which this file keeps.
  EXPECT_EQ(passthrough.size(), maxtext_only);
  EXPECT_GT(maxtext_only, 400U);  // MaxText's base.yml has ~700 keys; tpusim models ~190
  // At their defaults, the keys tpusim does not model change nothing.
  for (const Config::PassthroughKey& key : passthrough) {
    EXPECT_TRUE(key.effect == MaxTextKeyEffect::kNoEffect || key.is_maxtext_default)
        << key.key << "=" << key.value;
  }
}

TEST(MaxTextBaseYml, EveryTpusimKeyIsAMaxTextKeyOrDocumentedAsTpusimOnly) {
  // tpusim's own switches: no MaxText key says the same.
  const std::set<std::string> tpusim_only = {"collective_matmul",
                                             "collective_timeout_seconds",
                                             "cosine_learning_rate_final_fraction",
                                             "dataset_cache_dir",
                                             "functional_dtype",
                                             "functional_precision",
                                             "hbm_headroom_fraction",
                                             "mesh_placement_first",
                                             "moe_mlpwi",
                                             "num_threads",
                                             "sparse_core_collective_offload",
                                             "token_viz_file",
                                             "verify_tolerance"};
  const Config config = Config::load("", {});
  for (const std::string& key : config.keys()) {
    const MaxTextKey* maxtext = find_maxtext_key(key);
    if (tpusim_only.contains(key)) {
      EXPECT_EQ(maxtext, nullptr) << key;
    } else {
      // (Its effect is "modeled" unless the estimate does not read it: SCHEMA_NOT_READ of
      // scripts/make_maxtext_key_table.py, listed when a config sets it, as the test above checks.)
      EXPECT_NE(maxtext, nullptr) << key << " is neither a MaxText key nor listed as tpusim's own";
    }
  }
}

TEST(MaxTextPresets, EveryTextPresetLoadsAndMatchesMaxTextKeyByKey) {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> presets;
  for (const auto& row : read_tsv("tests/data/maxtext/maxtext_presets.tsv")) {
    presets[row[0]].emplace_back(row[1], row[2]);
  }
  std::map<std::string, std::string> not_built;
  for (const auto& row : read_tsv("configs/maxtext/presets_not_built.tsv")) {
    not_built[row[0]] = row[1];
  }
  int built = 0;
  for (const auto& [name, items] : presets) {
    SCOPED_TRACE(name);
    if (not_built.contains(name)) {
      try {
        Config::load("", {"model_name=" + name});
        ADD_FAILURE() << "a preset tpusim does not build loaded";
      } catch (const UserError& error) {
        EXPECT_NE(std::string(error.what()).find("does not build yet: " + not_built[name]),
                  std::string::npos)
            << error.what();
      }
      continue;
    }
    const Config config = Config::load("", {"model_name=" + name});
    std::map<std::string, std::string> passthrough;
    for (const Config::PassthroughKey& key : config.passthrough_keys()) {
      passthrough[key.key] = key.value;
    }
    for (const auto& [key, value] : items) {
      const YAML::Node expected = parse_yaml(value, name + ":" + key);
      if (key == "logical_axis_rules") {
        // Merged by name into the base rules (LogicalAxisRules test below): every name the
        // preset gives has exactly the preset's rules.
        for (const YAML::Node& rule : expected) {
          std::vector<std::string> want;
          std::vector<std::string> have;
          for (const YAML::Node& other : expected) {
            if (other[0].Scalar() == rule[0].Scalar()) {
              want.push_back(canonical(other[1]));
            }
          }
          for (const YAML::Node& other : config_node(config, key)) {
            if (other[0].Scalar() == rule[0].Scalar()) {
              have.push_back(canonical(other[1]));
            }
          }
          EXPECT_EQ(have, want) << "logical_axis_rules " << rule[0].Scalar();
        }
      } else if (config.has(key)) {
        EXPECT_EQ(canonical(config_node(config, key)), canonical(expected)) << key;
      } else {
        ASSERT_TRUE(passthrough.contains(key)) << key << " is dropped";
        EXPECT_EQ(canonical(parse_yaml(passthrough[key], key)), canonical(expected)) << key;
      }
    }
    ++built;
  }
  // 78 presets: what is built and what is refused with its reason add up to all of them.
  EXPECT_EQ(built + static_cast<int>(not_built.size()), static_cast<int>(presets.size()));
  EXPECT_GE(built, 50);
}

// MaxText's llama2 presets add one rule, ['norm', 'fsdp']: it replaces the base rules named "norm"
// and leaves every other rule as it was.
TEST(LogicalAxisRules, PresetRulesMergeByNameUnlessOverridden) {
  const Config base = Config::load("", {});
  const Config llama = Config::load("", {"model_name=llama2-7b"});
  auto rules_named = [](const Config& config, const std::string& name) {
    std::vector<std::string> found;
    for (const YAML::Node& rule : config_node(config, "logical_axis_rules")) {
      if (rule[0].Scalar() == name) {
        found.push_back(canonical(rule[1]));
      }
    }
    return found;
  };
  EXPECT_EQ(rules_named(llama, "norm"), (std::vector<std::string>{"fsdp"}));
  for (const char* other : {"embed", "mlp", "activation_batch", "heads"}) {
    EXPECT_EQ(rules_named(llama, other), rules_named(base, other)) << other;
  }
  const size_t base_rules = config_node(base, "logical_axis_rules").size();
  EXPECT_EQ(config_node(llama, "logical_axis_rules").size(),
            base_rules - rules_named(base, "norm").size() + 1);

  // A config file's rules always merge by name (the override is about presets, as in MaxText):
  // the embedded base names logical axes a MaxText base.yml does not.
  TempDir dir;
  const std::string file = dir.write("rules.yml", "logical_axis_rules: [['norm', 'fsdp']]\n");
  EXPECT_EQ(config_node(Config::load_files({file}, {"override_logical_axis_rules=true"}),
                        "logical_axis_rules")
                .size(),
            config_node(llama, "logical_axis_rules").size());
}

// MaxText's deepseek3-671b-2dfsdp preset sets override_logical_axis_rules: its list replaces the
// rules of every logical axis MaxText names; only tpusim's own axes (activation_batch_no_exp, for
// tokens grouped by expert), which no MaxText list can name, keep the base rules.
TEST(LogicalAxisRules, PresetOverrideReplacesEveryMaxTextNamedRule) {
  const Config config = Config::load("", {"model_name=deepseek3-671b-2dfsdp"});
  std::set<std::string> preset_names;
  size_t preset_rules = 0;
  for (const auto& row : read_tsv("tests/data/maxtext/maxtext_presets.tsv")) {
    if (row[0] == "deepseek3-671b-2dfsdp" && row[1] == "logical_axis_rules") {
      for (const YAML::Node& rule : parse_yaml(row[2], "preset")) {
        preset_names.insert(rule[0].Scalar());
        ++preset_rules;
      }
    }
  }
  ASSERT_EQ(preset_rules, 24U);
  size_t kept = 0;
  for (const YAML::Node& rule : config_node(config, "logical_axis_rules")) {
    const std::string name = rule[0].Scalar();
    if (!preset_names.contains(name)) {
      EXPECT_FALSE(is_maxtext_logical_axis(name)) << name << " survived the override";
      ++kept;
    }
  }
  EXPECT_EQ(config_node(config, "logical_axis_rules").size(), preset_rules + kept);
  EXPECT_GT(kept, 0U);  // activation_batch_no_exp and its kin
}

TEST(ConfigYaml, NullUnderscoresAndBoolCaseAsMaxTextWritesThem) {
  TempDir dir;
  const std::string path = dir.write("run.yml",
                                     "run_name: null\n"              // string: ""
                                     "rope_max_timescale: 10_000\n"  // YAML 1.1 digit groups
                                     "scan_layers: True\n"
                                     "profiler: null\n"  // a MaxText key tpusim does not model
                                     "mu_dtype: \n");    // empty = null
  const Config config = Config::load_files({path}, {"learning_rate=3_000.5e-7"});
  EXPECT_EQ(config.get_string("run_name"), "");
  EXPECT_EQ(config.get_int("rope_max_timescale"), 10000);
  EXPECT_TRUE(config.get_bool("scan_layers"));
  EXPECT_DOUBLE_EQ(config.get_float("learning_rate"), 3000.5e-7);
  EXPECT_EQ(config.get_string("mu_dtype"), "");
}

TEST(ConfigYaml, SeveralFilesApplyInOrderAndBaseConfigChains) {
  TempDir dir;
  dir.write("configs/base.yml", "per_device_batch_size: 3\nmax_target_length: 1024\n");
  const std::string model = dir.write("configs/models/gpu/run.yml",
                                      "base_config: ../../base.yml\nmax_target_length: 4096\n");
  const std::string extra = dir.write("extra.yml", "max_target_length: 8192\nsteps: 7\n");
  const Config config = Config::load_files({model, extra}, {"steps=9"});
  EXPECT_DOUBLE_EQ(config.get_float("per_device_batch_size"), 3.0);  // from the base_config
  EXPECT_EQ(config.get_int("max_target_length"), 8192);              // the later file wins
  EXPECT_EQ(config.get_int("steps"), 9);                             // the command line wins

  // A model YAML copied alone names MaxText's base.yml: tpusim's embedded base stands for it.
  const std::string alone = dir.write("alone/llama.yml", "base_config: base.yml\nsteps: 5\n");
  EXPECT_EQ(Config::load_files({alone}, {}).get_int("steps"), 5);
  const std::string missing = dir.write("missing.yml", "base_config: other.yml\n");
  EXPECT_THROW(Config::load_files({missing}, {}), UserError);
  const std::string cycle = dir.write("cycle.yml", "base_config: cycle.yml\n");
  EXPECT_THROW(Config::load_files({cycle}, {}), UserError);
  const std::string two_documents = dir.write("two.yml", "steps: 1\n---\nsteps: 2\n");
  EXPECT_THROW(Config::load_files({two_documents}, {}), UserError);
}

TEST(ConfigKeys, UnknownToBothIsAnErrorNamingTheKeyWithASuggestion) {
  try {
    Config::load("", {"profilr=xplane"});
    ADD_FAILURE() << "no error";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "profilr");
    EXPECT_NE(std::string(error.what()).find("did you mean 'profiler'"), std::string::npos)
        << error.what();
  }
  // A MaxText key with a value of the wrong type is refused too.
  EXPECT_THROW(Config::load("", {"use_random_routing=maybe"}), UserError);
  EXPECT_THROW(Config::load("", {"wi_tile_fwd_batch_seq=big"}), UserError);
}

TEST(ConfigKeys, MaxTextKeysAreKeptAsideWithTheirEffect) {
  const Config config =
      Config::load("", {"profiler=xplane", "use_random_routing=True", "float32_qk_product=false"});
  std::map<std::string, Config::PassthroughKey> kept;
  for (const Config::PassthroughKey& key : config.passthrough_keys()) {
    kept[key.key] = key;
  }
  ASSERT_EQ(kept.size(), 3U);
  EXPECT_EQ(kept["profiler"].effect, MaxTextKeyEffect::kNoEffect);
  EXPECT_EQ(kept["use_random_routing"].effect, MaxTextKeyEffect::kNotModeled);
  EXPECT_FALSE(kept["use_random_routing"].is_maxtext_default);
  EXPECT_TRUE(kept["float32_qk_product"].is_maxtext_default);  // MaxText's default is false
  EXPECT_EQ(kept["profiler"].origin, "command line");
}

TEST(ConfigKeys, MultimodalTrainingIsRefusedNotEstimatedAsTextOnly) {
  EXPECT_THROW(Config::load("", {"use_multimodal=true"}), UserError);
  EXPECT_NO_THROW(Config::load("", {"use_multimodal=false"}));
}

}  // namespace
}  // namespace tpusim
