#include "sim/plan/prices.h"

#include <cmath>

#include "common/error.h"
#include "common/suggest.h"
#include "common/yaml_text.h"

namespace tpusim {
namespace {

double price_value(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) {
    throw UserError(where + ": expected a price (a number), got a " +
                    (node.IsMap() ? "mapping" : "list"));
  }
  const std::string& text = node.Scalar();
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw UserError(where + ": '" + text + "' is not a number");
  }
  if (value < 0) {
    throw UserError(where + ": " + text + " is negative");
  }
  return value;
}

}  // namespace

Consumption parse_consumption(std::string_view name) {
  if (name == "on_demand") {
    return Consumption::kOnDemand;
  }
  if (name == "spot") {
    return Consumption::kSpot;
  }
  if (name == "committed") {
    return Consumption::kCommitted;
  }
  throw UserError("--consumption: unknown '" + std::string(name) +
                  "' (on_demand, spot, committed)");
}

Consumption consumption_option(std::string_view name, const std::string& prices_path) {
  const Consumption consumption = parse_consumption(name);
  if (prices_path.empty() && consumption != Consumption::kOnDemand) {
    throw UserError("--consumption " + std::string(name) +
                    ": picks a column of --prices, which is not given (--prices FILE)");
  }
  return consumption;
}

const char* consumption_name(Consumption consumption) {
  switch (consumption) {
    case Consumption::kSpot:
      return "spot";
    case Consumption::kCommitted:
      return "committed";
    case Consumption::kOnDemand:
      break;
  }
  return "on_demand";
}

PriceTable PriceTable::from_yaml(std::string_view text, const std::string& origin,
                                 const HardwareCatalog& catalog) {
  const YAML::Node root = parse_yaml(text, origin);
  if (!root.IsMap()) {
    throw UserError(origin + ": expected a mapping with 'currency' and 'hardware'");
  }
  PriceTable table;
  table.origin_ = origin;
  for (const auto& entry : root) {
    const std::string key = entry.first.Scalar();
    if (key == "currency") {
      table.currency_ = entry.second.Scalar();
    } else if (key != "hardware") {
      throw UserError(yaml_location(entry.first, origin) + ": unknown key '" + key +
                      "' (currency, hardware)");
    }
  }
  const YAML::Node hardware = root["hardware"];
  if (!hardware || !hardware.IsMap() || hardware.size() == 0) {
    throw UserError(origin +
                    ": 'hardware' must map hardware kinds (v6e, tpu7x, a3, ...) to prices");
  }
  for (const auto& kind : hardware) {
    const std::string name = kind.first.Scalar();
    const std::string where = yaml_location(kind.first, origin) + ": hardware." + name;
    const ChipSpec* chip = catalog.chip_for_slice_prefix(name);
    if (chip == nullptr) {
      throw UserError(where + ": unknown hardware kind '" + name + "'" +
                      did_you_mean(name, catalog.slice_prefixes()));
    }
    if (!kind.second.IsMap()) {
      throw UserError(where +
                      ": expected {per: chip_hour|node_hour, on_demand: ..., spot: ..., "
                      "committed: ...}");
    }
    KindPrices prices;
    for (const auto& field : kind.second) {
      const std::string field_name = field.first.Scalar();
      const std::string field_where = where + "." + field_name;
      if (field_name == "per") {
        const std::string unit = field.second.Scalar();
        if (unit != "chip_hour" && unit != "node_hour") {
          throw UserError(field_where + ": '" + unit + "' must be chip_hour or node_hour");
        }
        if (unit == "node_hour" && !chip->is_gpu()) {
          throw UserError(field_where + ": node_hour is for GPU nodes; " + name +
                          " is priced per chip_hour");
        }
        prices.per_node = unit == "node_hour";
        continue;
      }
      if (field_name != "on_demand" && field_name != "spot" && field_name != "committed") {
        throw UserError(field_where + ": unknown key (per, on_demand, spot, committed)");
      }
      prices.prices[parse_consumption(field_name)] = price_value(field.second, field_where);
    }
    if (prices.prices.empty()) {
      throw UserError(where + ": no price (on_demand, spot or committed)");
    }
    if (chip->is_gpu() && !kind.second["per"]) {
      throw UserError(where + ": say whether the price is per node_hour or per chip_hour (GPU)");
    }
    table.kinds_[chip] = prices;
  }
  return table;
}

PriceTable PriceTable::read(const std::string& path) {
  try {
    return from_yaml(read_text_file(path), path);
  } catch (const UserError& error) {
    // The file is the --prices option's (explore, plan): say so ("cannot read file" alone did not).
    throw UserError("--prices: " + std::string(error.what()), error.key());
  }
}

std::optional<double> PriceTable::per_chip_hour(const Slice& slice, Consumption consumption) const {
  const auto kind = kinds_.find(slice.chip);
  if (kind == kinds_.end()) {
    return std::nullopt;
  }
  const auto price = kind->second.prices.find(consumption);
  if (price == kind->second.prices.end()) {
    return std::nullopt;
  }
  return kind->second.per_node ? price->second / slice.chips : price->second;
}

}  // namespace tpusim
