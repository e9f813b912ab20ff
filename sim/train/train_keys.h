// sim/train/train_keys.h: how `tpusim train` treats every config key, from the embedded table
// configs/maxtext/train_keys.tsv (one row per key of configs/maxtext/base_keys.tsv and of
// configs/base.yml):
//   - kNumbers: train builds it and it changes train's numbers (dims, optimizer, data, seeds);
//   - kPerformance: changes only speed or memory on a TPU (sharding, remat, kernels, tiles):
//     accepted, and listed once on stderr (after the run) when a config sets it away from its
//     default;
//   - kRefused: changes MaxText's numbers but train does not compute it: set away from MaxText's
//     default it is a UserError naming the key, its value and the table's note;
//   - kNone: cannot change a training step (paths, logging, profiling, checkpoints, inference).
// A key train refuses only in combination with others (use_qk_norm with MLA) keeps its own check
// in check_functional_support (trainer.cpp).
//
// Example:
//   find_train_key("quantization")->key_class;       // TrainKeyClass::kRefused
//   refuse_keys_train_does_not_build(config);          // UserError "quantization: int8 is not ..."
//   report_performance_keys(config, std::cerr);        // "... accepted, no effect on train's ..."
#pragma once

#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

class Config;

enum class TrainKeyClass { kNumbers, kPerformance, kRefused, kNone };

const char* train_key_class_name(TrainKeyClass key_class);  // "numbers", ..., as the table has it

struct TrainKey {
  std::string name;
  TrainKeyClass key_class = TrainKeyClass::kNone;
  // Other spellings of MaxText's default that train builds as it (routed_score_func "softmax"
  // for ""): not refused.
  std::vector<std::string> same_as_default;
  // A value away from the default (";key=value" parts add overrides it needs), for the test that
  // walks the table; "" for keys the test does not sample.
  std::string test_value;
  std::string note;  // why, where not obvious
};

// Every row, in the table's order.
const std::vector<TrainKey>& train_keys();

// The key's row, or nullptr when the table has none.
const TrainKey* find_train_key(std::string_view name);

struct TrainKeySetting {
  const TrainKey* row = nullptr;
  std::string value;  // as the config holds it (flow YAML for lists, "" for null)
};

// The keys of `key_class` that `config` sets away from their defaults, in table order. The
// default of a MaxText key is MaxText's (base_keys.tsv), compared as parsed values ("0.0" equals
// "0"); for performance keys of tpusim's schema it is configs/base.yml's (tpusim's own rules and
// topology are not a user's choice); for tpusim's own keys, base.yml's.
std::vector<TrainKeySetting> train_keys_away_from_default(const Config& config,
                                                          TrainKeyClass key_class);

// UserError naming every refused key the config sets away from MaxText's default (the first one
// is the error's key), with its value and the table's note. `checked_by_family`: refused keys the
// config's decoder family computes or refuses itself (DecoderFamily::train_checked_keys), skipped.
void refuse_keys_train_does_not_build(const Config& config,
                                      std::span<const std::string_view> checked_by_family = {});

// One line "tpusim: accepted, no effect on train's numbers: a=1, b=2" when the config sets
// performance keys away from their defaults; nothing otherwise.
void report_performance_keys(const Config& config, std::ostream& out);

}  // namespace tpusim
