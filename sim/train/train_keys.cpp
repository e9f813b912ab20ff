#include "sim/train/train_keys.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

#include "common/csv.h"
#include "common/embedded_files.h"
#include "common/error.h"
#include "common/name_index.h"
#include "model/config.h"
#include "model/maxtext_keys.h"

namespace tpusim {
namespace {

constexpr const char* kTablePath = "configs/maxtext/train_keys.tsv";

TrainKeyClass parse_class(const std::string& text) {
  for (const TrainKeyClass key_class : {TrainKeyClass::kNumbers, TrainKeyClass::kPerformance,
                                        TrainKeyClass::kRefused, TrainKeyClass::kNone}) {
    if (text == train_key_class_name(key_class)) {
      return key_class;
    }
  }
  throw std::logic_error(std::string(kTablePath) + ": unknown class '" + text + "'");
}

std::vector<TrainKey> load_table() {
  const auto text = embedded_file(kTablePath);
  if (!text) {
    throw std::logic_error(std::string(kTablePath) + " is not embedded");
  }
  // key, class, same_as_default, test_value, note
  const CsvTable table = parse_tsv(*text, kTablePath);
  std::vector<TrainKey> keys;
  keys.reserve(table.rows.size());
  for (const std::vector<std::string>& row : table.rows) {
    TrainKey key;
    key.name = row[table.column("key")];
    key.key_class = parse_class(row[table.column("class")]);
    std::stringstream spellings(row[table.column("same_as_default")]);
    for (std::string spelling; std::getline(spellings, spelling, ',');) {
      key.same_as_default.push_back(spelling);
    }
    key.test_value = row[table.column("test_value")];
    key.note = row[table.column("note")];
    keys.push_back(std::move(key));
  }
  return keys;
}

// tpusim's own defaults (configs/base.yml), loaded once.
const Config& base_config() {
  static const Config config = Config::load("", {});
  return config;
}

// True when `value` of schema key `key` equals `fallback` as a parsed value.
bool same_value(const std::string& key, const std::string& value, const std::string& fallback,
                const std::string& type) {
  MaxTextKey as_default;
  as_default.name = key;
  as_default.default_text = fallback;
  as_default.type = type;
  return equals_maxtext_default(as_default, value);
}

// True when `value` is one of the row's other spellings of the default.
bool is_same_as_default(const TrainKey& row, const std::string& value) {
  for (const std::string& spelling : row.same_as_default) {
    if (same_value(row.name, value, spelling, "")) {
      return true;
    }
  }
  return false;
}

// A table key's value as a config holds it.
struct TableKeyValue {
  bool in_schema = false;  // a key of configs/base.yml; else a MaxText key tpusim does not model
  std::string text;        // Config::value_text, or the passthrough value
  bool is_bool = false;
};
using TableKeyValues = std::map<std::string, TableKeyValue, std::less<>>;

// The table's keys as `config` holds them, by name: every schema key, and the MaxText keys outside
// the schema that the config sets away from MaxText's default.
TableKeyValues table_values_from_config(const Config& config) {
  TableKeyValues values;
  for (const Config::PassthroughKey& key : config.passthrough_keys()) {
    if (!config.has(key.key) && !key.is_maxtext_default) {
      values.emplace(key.key, TableKeyValue{false, key.value, false});
    }
  }
  for (const TrainKey& row : train_keys()) {
    if (config.has(row.name)) {
      values[row.name] = {true, config.value_text(row.name),
                          config.type(row.name) == ConfigType::kBool};
    }
  }
  return values;
}

// tpusim's own defaults of the table's keys (configs/base.yml), read once.
const TableKeyValues& base_values() {
  static const TableKeyValues values = table_values_from_config(base_config());
  return values;
}

bool is_away_from_default(const TableKeyValue& value, const TrainKey& row) {
  const MaxTextKey* maxtext = find_maxtext_key(row.name);
  if (maxtext != nullptr && row.key_class != TrainKeyClass::kPerformance) {
    return !equals_maxtext_default(*maxtext, value.text) && !is_same_as_default(row, value.text);
  }
  const std::string type = value.is_bool ? "bool" : "";
  return !same_value(row.name, value.text, base_values().at(row.name).text, type);
}

}  // namespace

const char* train_key_class_name(TrainKeyClass key_class) {
  switch (key_class) {
    case TrainKeyClass::kNumbers:
      return "numbers";
    case TrainKeyClass::kPerformance:
      return "performance";
    case TrainKeyClass::kRefused:
      return "refused";
    case TrainKeyClass::kNone:
      return "none";
  }
  return "?";
}

const std::vector<TrainKey>& train_keys() {
  static const std::vector<TrainKey> keys = load_table();
  return keys;
}

const TrainKey* find_train_key(std::string_view name) {
  static const NameIndex<TrainKey> index(train_keys());
  return index.find(name);
}

std::vector<TrainKeySetting> train_keys_away_from_default(const Config& config,
                                                          TrainKeyClass key_class) {
  const TableKeyValues values = table_values_from_config(config);
  std::vector<TrainKeySetting> settings;
  for (const TrainKey& row : train_keys()) {
    if (row.key_class != key_class) {
      continue;
    }
    const auto found = values.find(row.name);
    if (found == values.end()) {
      continue;
    }
    const TableKeyValue& value = found->second;
    if (value.in_schema ? is_away_from_default(value, row) : !is_same_as_default(row, value.text)) {
      settings.push_back({&row, value.text});
    }
  }
  return settings;
}

void refuse_keys_train_does_not_build(const Config& config,
                                      std::span<const std::string_view> checked_by_family) {
  std::vector<TrainKeySetting> refused =
      train_keys_away_from_default(config, TrainKeyClass::kRefused);
  std::erase_if(refused, [&](const TrainKeySetting& setting) {
    return std::find(checked_by_family.begin(), checked_by_family.end(), setting.row->name) !=
           checked_by_family.end();
  });
  if (refused.empty()) {
    return;
  }
  std::string message;
  for (const TrainKeySetting& setting : refused) {
    message += (message.empty() ? "" : "; ") + setting.row->name + ": " +
               (setting.value.empty() ? "null" : setting.value) +
               " is not computed by tpusim train (" + setting.row->note + ")";
  }
  throw UserError(message + " [" + kTablePath + "]", refused.front().row->name);
}

void report_performance_keys(const Config& config, std::ostream& out) {
  std::string listed;
  for (const TrainKeySetting& setting :
       train_keys_away_from_default(config, TrainKeyClass::kPerformance)) {
    listed += (listed.empty() ? "" : ", ") + setting.row->name + "=" + setting.value;
  }
  if (!listed.empty()) {
    out << "tpusim: accepted, no effect on train's numbers: " << listed << "\n";
  }
}

}  // namespace tpusim
