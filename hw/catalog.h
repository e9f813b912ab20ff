// hw/catalog.h: the chip catalog, every configs/hw/*.yml file loaded and checked.
//
// The built-in catalog comes from the copies embedded in the binary; a directory of catalog files
// can be loaded instead (tests, or a user trying new numbers).
//
// Example:
//   const HardwareCatalog& catalog = HardwareCatalog::builtin();
//   const ChipSpec& v5p = catalog.chip("v5p");
//   const ChipSpec* chip = catalog.chip_for_slice_prefix("tpu7x");  // -> v7x
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hw/chip_spec.h"

namespace tpusim {

class HardwareCatalog {
 public:
  // Catalog from the embedded configs/hw/*.yml (parsed once), or from the directory named by the
  // TPUSIM_HW_DIR environment variable when it is set.
  static const HardwareCatalog& builtin();

  // Catalog from every *.yml in `directory`; UserError on any bad file.
  static HardwareCatalog load_directory(const std::string& directory);

  // From (origin, YAML text) pairs.
  static HardwareCatalog from_texts(const std::vector<std::pair<std::string, std::string>>& files);

  // The chip named `name` ("v5p"); UserError with a suggestion when unknown.
  const ChipSpec& chip(std::string_view name) const;

  // The chip whose slice names start with `prefix` ("v5litepod" -> v5e), or nullptr.
  const ChipSpec* chip_for_slice_prefix(std::string_view prefix) const;

  const std::vector<ChipSpec>& chips() const { return chips_; }

  // Every slice-name prefix, for suggestions.
  std::vector<std::string> slice_prefixes() const;

 private:
  std::vector<ChipSpec> chips_;
};

}  // namespace tpusim
