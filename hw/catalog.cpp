#include "hw/catalog.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/embedded_files.h"
#include "common/error.h"
#include "common/suggest.h"
#include "common/yaml_text.h"

namespace tpusim {

const HardwareCatalog& HardwareCatalog::builtin() {
  static const HardwareCatalog catalog = [] {
    // TPUSIM_HW_DIR points at a directory of catalog files to use instead (trying new numbers,
    // calibration sweeps: benchmarks/calibrate.py).
    if (const char* directory = std::getenv("TPUSIM_HW_DIR"); directory != nullptr && *directory) {
      return load_directory(directory);
    }
    std::vector<std::pair<std::string, std::string>> files;
    for (const std::string& path : embedded_files_under("configs/hw/")) {
      if (path.ends_with(".yml")) {
        files.emplace_back(path, std::string(*embedded_file(path)));
      }
    }
    return from_texts(files);
  }();
  return catalog;
}

HardwareCatalog HardwareCatalog::load_directory(const std::string& directory) {
  std::vector<std::pair<std::string, std::string>> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (entry.path().extension() == ".yml") {
      files.emplace_back(entry.path().string(), read_text_file(entry.path().string()));
    }
  }
  if (error) {
    throw UserError("cannot read hardware catalog directory '" + directory + "'");
  }
  std::sort(files.begin(), files.end());
  return from_texts(files);
}

HardwareCatalog HardwareCatalog::from_texts(
    const std::vector<std::pair<std::string, std::string>>& files) {
  HardwareCatalog catalog;
  for (const auto& [origin, text] : files) {
    ChipSpec chip = parse_chip_spec(parse_yaml(text, origin), origin);
    for (const ChipSpec& other : catalog.chips_) {
      if (other.name == chip.name) {
        throw UserError(origin + ": chip '" + chip.name + "' is defined twice");
      }
    }
    catalog.chips_.push_back(std::move(chip));
  }
  if (catalog.chips_.empty()) {
    throw UserError("the hardware catalog is empty");
  }
  return catalog;
}

const ChipSpec& HardwareCatalog::chip(std::string_view name) const {
  std::vector<std::string> names;
  for (const ChipSpec& chip : chips_) {
    if (chip.name == name) {
      return chip;
    }
    names.push_back(chip.name);
  }
  throw UserError("unknown chip '" + std::string(name) + "'" + did_you_mean(name, names));
}

const ChipSpec* HardwareCatalog::chip_for_slice_prefix(std::string_view prefix) const {
  for (const ChipSpec& chip : chips_) {
    for (const std::string& candidate : chip.slice.name_prefixes) {
      if (candidate == prefix) {
        return &chip;
      }
    }
  }
  return nullptr;
}

std::vector<std::string> HardwareCatalog::slice_prefixes() const {
  std::vector<std::string> prefixes;
  for (const ChipSpec& chip : chips_) {
    prefixes.insert(prefixes.end(), chip.slice.name_prefixes.begin(),
                    chip.slice.name_prefixes.end());
  }
  return prefixes;
}

}  // namespace tpusim
