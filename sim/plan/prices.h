// sim/plan/prices.h: the user's price list (--prices FILE): what one chip-hour (TPU) or one
// node-hour (GPU) costs, by hardware kind and consumption model. tpusim has no prices of its
// own; configs/prices.example.yml shows the format with example values.
//
//   currency: USD
//   hardware:
//     v6e:   {per: chip_hour, on_demand: 2.70, spot: 1.20, committed: 1.90}
//     a3:    {per: node_hour, on_demand: 88.0}
//
// A kind is named as in slice names and --hardware (v5p, v6e, tpu7x, a3, ...). A GPU node's
// price is spread over its GPUs (node-hour / GPUs per node = one "chip"-hour).
//
// Example:
//   const PriceTable prices = PriceTable::read("prices.yml");
//   prices.per_chip_hour(parse_slice("v6e-256"), Consumption::kSpot);  // 1.20, or nullopt
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "hw/catalog.h"
#include "hw/slice.h"

namespace tpusim {

enum class Consumption { kOnDemand, kSpot, kCommitted };

// "on_demand", "spot", "committed"; UserError naming the value otherwise.
Consumption parse_consumption(std::string_view name);
// The --consumption option of explore and plan: parse_consumption(name), and a UserError when it
// is not on_demand and `prices_path` (--prices) is empty: it picks a column of that file, so
// without one it would change nothing. consumption_option("spot", "") throws.
Consumption consumption_option(std::string_view name, const std::string& prices_path);
const char* consumption_name(Consumption consumption);

class PriceTable {
 public:
  // UserError naming the file, the key and the value for: an unknown top-level key, an unknown
  // hardware kind, `per` other than chip_hour/node_hour (node_hour only for GPU nodes), a price
  // that is not a number or is negative, a kind with no price at all.
  static PriceTable from_yaml(std::string_view text, const std::string& origin,
                              const HardwareCatalog& catalog = HardwareCatalog::builtin());
  // The file of the --prices option (explore, plan): its errors start with "--prices: ".
  static PriceTable read(const std::string& path);

  // The price of one chip-hour of `slice`'s chips, or nullopt when the file has none for its
  // kind and consumption model.
  std::optional<double> per_chip_hour(const Slice& slice, Consumption consumption) const;

  const std::string& currency() const { return currency_; }
  const std::string& origin() const { return origin_; }

 private:
  struct KindPrices {
    bool per_node = false;  // GPU node-hour
    std::map<Consumption, double> prices;
  };
  std::string currency_ = "USD";
  std::string origin_;
  std::map<const ChipSpec*, KindPrices> kinds_;
};

}  // namespace tpusim
