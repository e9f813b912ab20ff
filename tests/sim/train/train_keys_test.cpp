// Red-team item 3 (issue 35, "the class, not just the instance"): `tpusim train ...
// quantization=int8` trained bit-identically to bf16 with no word. Every key of MaxText's
// base.yml (configs/maxtext/base_keys.tsv) and of tpusim's (configs/base.yml) now has one row in
// configs/maxtext/train_keys.tsv, and the table is walked here:
//   (a) every key has exactly one row, and every row names a known key;
//   (b) every refused key, set to its test value, is a UserError naming it;
//   (c) a sample of performance keys leaves one training step's loss and gradients within fp32
//       rounding (1e-5 relative) of the default's;
//   (d) a sample of numbers keys changes the step's loss;
// and `tpusim train` lists the performance keys a config sets.
#include "sim/train/train_keys.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "model/config.h"
#include "model/maxtext_keys.h"
#include "sim/train/trainer.h"
#include "tests/support/one_step.h"

namespace tpusim {
namespace {

// A tiny MoE model on 4 devices (FSDP by default), one short step.
std::vector<std::string> tiny_overrides() {
  return {"model_name=tiny-moe",  "override_model_config=true", "compile_topology=v5e-4",
          "max_target_length=16", "per_device_batch_size=1",    "dataset_type=synthetic",
          "num_threads=2"};
}

// The tiny overrides with the row's test value ("value;key=value;...") applied.
std::vector<std::string> with_test_value(const TrainKey& row) {
  std::vector<std::string> overrides = tiny_overrides();
  std::stringstream parts(row.test_value);
  std::string part;
  bool first = true;
  while (std::getline(parts, part, ';')) {
    const std::string item = first ? row.name + "=" + part : part;
    first = false;
    // A test value replaces a tiny override of the same key.
    const std::string key = item.substr(0, item.find('='));
    std::erase_if(overrides, [&](const std::string& text) { return text.starts_with(key + "="); });
    overrides.push_back(item);
  }
  return overrides;
}

TEST(RedTeam, Item3_EveryKeyHasExactlyOneTrainKeysRow) {
  std::set<std::string> known;
  for (const MaxTextKey& key : maxtext_keys()) {
    known.insert(key.name);
  }
  const Config base = Config::load("", {});
  for (const std::string& key : base.keys()) {
    known.insert(key);
  }
  std::map<std::string, int> rows;
  for (const TrainKey& row : train_keys()) {
    ++rows[row.name];
    EXPECT_TRUE(known.contains(row.name)) << row.name << ": not a key of base_keys.tsv or base.yml";
    if (row.key_class == TrainKeyClass::kRefused) {
      EXPECT_FALSE(row.test_value.empty()) << row.name << ": a refused key needs a test value";
      EXPECT_FALSE(row.note.empty()) << row.name << ": a refused key needs a note (the why)";
    }
  }
  for (const std::string& key : known) {
    EXPECT_EQ(rows[key], 1) << key << ": rows in configs/maxtext/train_keys.tsv";
  }
  // tpusim's defaults and the tiny presets refuse nothing: every refused key of tpusim's schema has
  // MaxText's default in base.yml.
  for (const std::vector<std::string>& overrides :
       {std::vector<std::string>{}, tiny_overrides(),
        std::vector<std::string>{"model_name=tiny-llama"},
        std::vector<std::string>{"model_name=tiny-mla"},
        std::vector<std::string>{"model_name=tiny-qwen3"},
        std::vector<std::string>{"model_name=tiny-gpt3"}}) {
    const Config config = Config::load("", overrides);
    for (const TrainKeySetting& setting :
         train_keys_away_from_default(config, TrainKeyClass::kRefused)) {
      ADD_FAILURE() << setting.row->name << "=" << setting.value << " is refused by default";
    }
  }
}

TEST(RedTeam, Item3_EveryKeyTrainDoesNotBuildIsRefused) {
  int refused = 0;
  for (const TrainKey& row : train_keys()) {
    if (row.key_class != TrainKeyClass::kRefused) {
      continue;
    }
    ++refused;
    const std::vector<std::string> overrides = with_test_value(row);
    try {
      // A few are refused as the config loads (use_multimodal); the rest by train's check.
      const Config config = Config::load("", overrides);
      check_functional_support(config);
      ADD_FAILURE() << row.name << "=" << row.test_value << ": accepted by tpusim train";
    } catch (const UserError& error) {
      const std::string message = error.what();
      EXPECT_TRUE(error.key() == row.name || message.find(row.name + ":") != std::string::npos ||
                  message.find(row.name + "=") != std::string::npos)
          << row.name << "=" << row.test_value << ": the error names another key: " << message;
    }
  }
  EXPECT_GT(refused, 100);
  // quantization, the instance of issue 35, with its note.
  try {
    check_functional_support(Config::load("", {"model_name=tiny-llama", "quantization=int8"}));
    ADD_FAILURE() << "quantization=int8 accepted";
  } catch (const UserError& error) {
    EXPECT_EQ(error.key(), "quantization");
    EXPECT_NE(std::string(error.what()).find("quantization: int8 is not computed by tpusim train"),
              std::string::npos)
        << error.what();
  }
  // Values are compared parsed: MaxText's default written another way is the default.
  EXPECT_NO_THROW(check_functional_support(
      Config::load("", {"model_name=tiny-llama", "z_loss_multiplier=0", "dropout_rate=0",
                        "float32_weight_sum=True", "mtp_num_layers=0"})));
  // Another spelling of the default train builds as it (same_as_default).
  EXPECT_NO_THROW(check_functional_support(
      Config::load("", {"model_name=tiny-moe", "routed_score_func=softmax", "mu_dtype=float32"})));
}

TEST(RedTeam, Item3_PerformanceKeysLeaveTrainsNumbersAlone) {
  const testing::OneStep reference = testing::run_one_step(Config::load("", tiny_overrides()));
  int sampled = 0;
  for (const TrainKey& row : train_keys()) {
    if (row.key_class != TrainKeyClass::kPerformance || row.test_value.empty()) {
      continue;
    }
    ++sampled;
    const Config config = Config::load("", with_test_value(row));
    check_functional_support(config);
    const testing::OneStep step = testing::run_one_step(config);
    EXPECT_NEAR(step.loss, reference.loss, 1e-5 * std::abs(reference.loss)) << row.name;
    std::string worst;
    EXPECT_LE(testing::worst_relative_difference(step.gradients, reference.gradients, &worst), 1e-5)
        << row.name << "=" << row.test_value << ": gradient " << worst;
  }
  EXPECT_GE(sampled, 8);
}

TEST(RedTeam, Item3_NumbersKeysChangeTheStep) {
  const testing::OneStep reference = testing::run_one_step(Config::load("", tiny_overrides()));
  int sampled = 0;
  for (const TrainKey& row : train_keys()) {
    if (row.key_class != TrainKeyClass::kNumbers || row.test_value.empty()) {
      continue;
    }
    ++sampled;
    const Config config = Config::load("", with_test_value(row));
    check_functional_support(config);
    const testing::OneStep step = testing::run_one_step(config);
    EXPECT_GT(std::abs(step.loss - reference.loss), 1e-6 * std::abs(reference.loss))
        << row.name << "=" << row.test_value << ": the loss did not change (" << step.loss << ")";
  }
  EXPECT_GE(sampled, 8);
}

TEST(RedTeam, Item3_TrainListsPerformanceKeysItAccepts) {
  std::ostringstream quiet;
  report_performance_keys(Config::load("", tiny_overrides()), quiet);
  EXPECT_EQ(quiet.str(), "");
  std::vector<std::string> overrides = tiny_overrides();
  overrides.insert(overrides.end(), {"remat_policy=minimal", "sa_block_q=256", "sa_block_kv=512",
                                     "sa_q_layout=SEQ_MINOR", "ici_tensor_parallelism=2"});
  std::ostringstream listed;
  report_performance_keys(Config::load("", overrides), listed);
  EXPECT_EQ(listed.str(),
            "tpusim: accepted, no effect on train's numbers: remat_policy=minimal, "
            "ici_tensor_parallelism=2, sa_block_q=256, sa_q_layout=SEQ_MINOR\n");
}

}  // namespace
}  // namespace tpusim
