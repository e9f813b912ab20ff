// model/maxtext_keys.h: every key of MaxText's base.yml, and what tpusim does with the ones it does
// not model.
//
// tpusim's own schema is configs/base.yml (the keys it models). A MaxText config or recipe sets
// many more keys: output paths, profiler switches, kernel tile sizes, routing options. The table
// configs/maxtext/base_keys.tsv (embedded) lists all of MaxText's base.yml keys with their default
// and type, and classifies each key tpusim does not model:
//   - kNoEffect: cannot change a training step's time or memory (paths, logging, profiling,
//     checkpointing, data pipeline, inference, multimodal encoder dims): accepted and listed once
//     (use_multimodal=true itself is refused: the encoders are not modeled);
//   - kNotModeled: changes the step, but tpusim ignores it for now: accepted with a warning when
//     its value differs from MaxText's default.
// A key in neither schema is a config error (exit 2) with did-you-mean over both.
//
// Example:
//   const MaxTextKey* key = find_maxtext_key("profiler");  // effect kNoEffect, default ""
//   find_maxtext_key("use_random_routing")->effect;         // kNotModeled
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tpusim {

enum class MaxTextKeyEffect { kModeled, kNoEffect, kNotModeled };

struct MaxTextKey {
  std::string name;
  std::string default_text;  // as MaxText's base.yml writes it ("" for an empty value)
  std::string type;          // MaxText's parsed type: bool, int, float, str, list, map, null
  MaxTextKeyEffect effect = MaxTextKeyEffect::kNotModeled;
  std::string note;  // e.g. for keys of other MaxText revisions
};

// The key's row, or nullptr when MaxText's base.yml has no such key.
const MaxTextKey* find_maxtext_key(std::string_view name);

// Every key of the table, in base.yml order.
const std::vector<MaxTextKey>& maxtext_keys();

// True when `value_text` (a scalar or flow YAML text) means MaxText's default of `key`: the same
// text, the same number, the same bool, or null/None/"" for a default that is empty or None.
bool equals_maxtext_default(const MaxTextKey& key, std::string_view value_text);

// True when MaxText's default logical_axis_rules name this logical axis. tpusim's model also
// names a few of its own (activation_batch_no_exp for tokens grouped by expert), which a preset
// that replaces the whole list (override_logical_axis_rules) cannot know about.
bool is_maxtext_logical_axis(std::string_view name);

}  // namespace tpusim
