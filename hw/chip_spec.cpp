#include "hw/chip_spec.h"

#include <charconv>
#include <set>
#include <utility>

#include "common/error.h"
#include "common/suggest.h"
#include "common/yaml_text.h"

namespace tpusim {
namespace {

using SpecMember = double ChipSpec::*;

// The one table of catalog keys: name in YAML -> field of ChipSpec.
const std::vector<std::pair<std::string, SpecMember>>& spec_members() {
  static const std::vector<std::pair<std::string, SpecMember>> members = {
      {"peak_bf16_tflops", &ChipSpec::peak_bf16_tflops},
      {"peak_int8_tops", &ChipSpec::peak_int8_tops},
      {"peak_fp8_tflops", &ChipSpec::peak_fp8_tflops},
      {"mfu_peak_bf16_tflops_per_device", &ChipSpec::mfu_peak_bf16_tflops_per_device},
      {"tensorcores_per_chip", &ChipSpec::tensorcores_per_chip},
      {"devices_per_chip", &ChipSpec::devices_per_chip},
      {"mxus_per_tensorcore", &ChipSpec::mxus_per_tensorcore},
      {"mxu_dim", &ChipSpec::mxu_dim},
      {"clock_ghz", &ChipSpec::clock_ghz},
      {"vmem_mib_per_tensorcore", &ChipSpec::vmem_mib_per_tensorcore},
      {"cmem_mib_per_chip", &ChipSpec::cmem_mib_per_chip},
      {"hbm_capacity_gib", &ChipSpec::hbm_capacity_gib},
      {"hbm_usable_gib", &ChipSpec::hbm_usable_gib},
      {"hbm_bandwidth_gbps", &ChipSpec::hbm_bandwidth_gbps},
      {"hbm_achievable_fraction", &ChipSpec::hbm_achievable_fraction},
      {"vmem_bandwidth_tbps_per_tensorcore", &ChipSpec::vmem_bandwidth_tbps_per_tensorcore},
      {"vpu_tflops_per_chip", &ChipSpec::vpu_tflops_per_chip},
      {"mxu_achievable_fraction", &ChipSpec::mxu_achievable_fraction},
      {"mxu_fill_drain_cycles", &ChipSpec::mxu_fill_drain_cycles},
      {"op_overhead_us", &ChipSpec::op_overhead_us},
      {"matmul_output_fusion", &ChipSpec::matmul_output_fusion},
      {"program_efficiency", &ChipSpec::program_efficiency},
      {"dispatch_overhead_us", &ChipSpec::dispatch_overhead_us},
      {"ici_links_per_chip", &ChipSpec::ici_links_per_chip},
      {"ici_link_bandwidth_uni_gbps", &ChipSpec::ici_link_bandwidth_uni_gbps},
      {"ici_achievable_fraction", &ChipSpec::ici_achievable_fraction},
      {"ici_hop_latency_us", &ChipSpec::ici_hop_latency_us},
      {"collective_launch_us", &ChipSpec::collective_launch_us},
      {"collective_compute_share", &ChipSpec::collective_compute_share},
      {"d2d_bandwidth_uni_gbps", &ChipSpec::d2d_bandwidth_uni_gbps},
      {"d2d_latency_us", &ChipSpec::d2d_latency_us},
      {"chips_per_host", &ChipSpec::chips_per_host},
      {"pcie_bandwidth_gbps", &ChipSpec::pcie_bandwidth_gbps},
      {"host_memory_gib", &ChipSpec::host_memory_gib},
      {"dcn_bandwidth_per_chip_gbps", &ChipSpec::dcn_bandwidth_per_chip_gbps},
      {"dcn_achievable_fraction", &ChipSpec::dcn_achievable_fraction},
      {"dcn_latency_us", &ChipSpec::dcn_latency_us},
      {"sparsecores_per_chip", &ChipSpec::sparsecores_per_chip},
      {"sparsecore_collective_offload_default", &ChipSpec::sparsecore_collective_offload_default},
      {"sparsecore_reduce_scatter_time_factor", &ChipSpec::sparsecore_reduce_scatter_time_factor},
      {"max_slice_chips", &ChipSpec::max_slice_chips},
      {"pod_bisection_tbps", &ChipSpec::pod_bisection_tbps},
      {"power_watts", &ChipSpec::power_watts},
  };
  return members;
}

std::string required_string(const YAML::Node& node, const std::string& key,
                            std::string_view origin) {
  const YAML::Node value = node[key];
  if (!value || !value.IsScalar()) {
    throw UserError(std::string(origin) + ": '" + key + "' must be a string");
  }
  return value.as<std::string>();
}

SliceRules parse_slice_rules(const YAML::Node& node, std::string_view origin) {
  if (!node || !node.IsMap()) {
    throw UserError(std::string(origin) + ": missing 'slice' section");
  }
  const std::string where = std::string(origin) + ": slice";
  SliceRules rules;
  const YAML::Node prefixes = node["name_prefixes"];
  if (!prefixes || !prefixes.IsSequence() || prefixes.size() == 0) {
    throw UserError(where + ".name_prefixes must be a non-empty list");
  }
  for (const YAML::Node& prefix : prefixes) {
    rules.name_prefixes.push_back(prefix.as<std::string>());
  }
  const std::string counts = required_string(node, "name_counts", where);
  if (counts == "tensorcores") {
    rules.name_counts = SliceNameUnit::kTensorCores;
  } else if (counts == "chips") {
    rules.name_counts = SliceNameUnit::kChips;
  } else {
    throw UserError(where + ".name_counts: '" + counts + "' is not 'tensorcores' or 'chips'");
  }
  const std::string shape_rule = required_string(node, "shape_rule", where);
  if (shape_rule == "cube") {
    rules.shape_rule = ShapeRule::kCube;
  } else if (shape_rule == "plane") {
    rules.shape_rule = ShapeRule::kPlane;
  } else if (shape_rule == "switched") {
    rules.shape_rule = ShapeRule::kSwitched;
  } else {
    throw UserError(where + ".shape_rule: '" + shape_rule +
                    "' is not 'cube', 'plane' or 'switched'");
  }
  const YAML::Node shapes = node["small_shapes"];
  if (!shapes || !shapes.IsSequence()) {
    throw UserError(where + ".small_shapes must be a list of shapes like \"2x2x1\"");
  }
  for (const YAML::Node& shape : shapes) {
    rules.small_shapes.push_back(
        parse_shape_text(shape.as<std::string>(), where + ".small_shapes"));
  }
  const std::string wrap = required_string(node, "wraparound", where);
  if (wrap == "full_cube") {
    rules.wraparound = WraparoundRule::kFullCube;
  } else if (wrap == "axis_16") {
    rules.wraparound = WraparoundRule::kAxis16;
  } else if (wrap == "all") {
    rules.wraparound = WraparoundRule::kAll;
  } else if (wrap == "none") {
    rules.wraparound = WraparoundRule::kNone;
  } else {
    throw UserError(where + ".wraparound: '" + wrap + "' is not full_cube, axis_16, all or none");
  }
  if (rules.shape_rule == ShapeRule::kSwitched &&
      (rules.small_shapes.size() != 1 || rules.small_shapes[0].size() != 1 ||
       rules.wraparound != WraparoundRule::kNone)) {
    throw UserError(where +
                    ": a switched node lists exactly one 1-D shape (its GPUs, e.g. \"8\") " +
                    "and wraparound none");
  }
  return rules;
}

}  // namespace

const std::vector<std::string>& chip_spec_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> names;
    for (const auto& [name, member] : spec_members()) {
      names.push_back(name);
    }
    return names;
  }();
  return keys;
}

double spec_value(const ChipSpec& chip, std::string_view key) {
  for (const auto& [name, member] : spec_members()) {
    if (name == key) {
      return chip.*member;
    }
  }
  throw std::out_of_range("no chip spec key '" + std::string(key) + "'");
}

double ChipSpec::hbm_capacity_bytes_per_device() const {
  return hbm_capacity_gib * 1024.0 * 1024.0 * 1024.0 / devices_per_chip;
}

double ChipSpec::hbm_usable_bytes_per_device() const {
  return hbm_usable_gib * 1024.0 * 1024.0 * 1024.0;
}

double ChipSpec::peak_flops_for_quantization(const std::string& quantization) const {
  if ((quantization == "int8" || quantization == "intmp") && peak_int8_tops > 0) {
    return peak_int8_tops * 1e12;
  }
  if (quantization.rfind("fp8", 0) == 0 && peak_fp8_tflops > 0) {
    return peak_fp8_tflops * 1e12;
  }
  return peak_bf16_tflops * 1e12;
}

double ChipSpec::peak_bf16_flops_per_device() const {
  return peak_bf16_tflops * 1e12 / devices_per_chip;
}

std::vector<int> parse_shape_text(std::string_view text, std::string_view what) {
  std::vector<int> dims;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('x', start), text.size());
    const std::string_view part = text.substr(start, end - start);
    int dim = 0;
    const auto [ptr, error] = std::from_chars(part.data(), part.data() + part.size(), dim);
    if (part.empty() || error != std::errc() || ptr != part.data() + part.size() || dim <= 0) {
      throw UserError(std::string(what) + ": '" + std::string(text) +
                      "' is not a shape like 4x4x8 (positive integers joined by 'x')");
    }
    dims.push_back(dim);
    start = end + 1;
  }
  return dims;
}

std::string shape_to_text(const std::vector<int>& dims) {
  std::string text;
  for (size_t index = 0; index < dims.size(); ++index) {
    if (index > 0) {
      text += 'x';
    }
    text += std::to_string(dims[index]);
  }
  return text;
}

ChipSpec parse_chip_spec(const YAML::Node& root, std::string_view origin) {
  if (!root || !root.IsMap()) {
    throw UserError(std::string(origin) + ": a hardware catalog file must be a YAML mapping");
  }
  ChipSpec chip;
  chip.name = required_string(root, "name", origin);
  chip.display_name = required_string(root, "display_name", origin);
  chip.slice = parse_slice_rules(root["slice"], origin);

  const YAML::Node specs = root["specs"];
  if (!specs || !specs.IsMap()) {
    throw UserError(std::string(origin) + ": missing 'specs' section");
  }
  std::set<std::string> seen;
  for (const auto& [key, member] : spec_members()) {
    const YAML::Node entry = specs[key];
    const std::string where = std::string(origin) + ": specs." + key;
    if (!entry) {
      throw UserError(where + " is missing (every chip defines every spec key)");
    }
    if (!entry.IsMap() || !entry["value"]) {
      throw UserError(where +
                      " must be {value: N, source: \"...\"} or {value: N, assumption: \"...\"}");
    }
    const bool has_source = static_cast<bool>(entry["source"]);
    const bool has_assumption = static_cast<bool>(entry["assumption"]);
    if (has_source == has_assumption) {
      throw UserError(where + " needs exactly one of 'source' or 'assumption'");
    }
    double value = 0;
    try {
      value = entry["value"].as<double>();
    } catch (const YAML::Exception&) {
      throw UserError(where + ".value is not a number");
    }
    if (value < 0) {
      throw UserError(where + ".value must not be negative");
    }
    chip.*member = value;
    Provenance provenance;
    provenance.is_assumption = has_assumption;
    provenance.text = (has_source ? entry["source"] : entry["assumption"]).as<std::string>();
    if (provenance.text.empty()) {
      throw UserError(where + " has an empty " + (has_source ? "source" : "assumption"));
    }
    chip.provenance[key] = provenance;
    seen.insert(key);
  }
  for (const auto& entry : specs) {
    const std::string key = entry.first.as<std::string>();
    if (!seen.contains(key)) {
      throw UserError(std::string(origin) + ": unknown spec key '" + key + "'" +
                      did_you_mean(key, chip_spec_keys()));
    }
  }
  if (chip.devices_per_chip < 1 || chip.tensorcores_per_chip < 1 || chip.chips_per_host < 1) {
    throw UserError(std::string(origin) +
                    ": devices_per_chip, tensorcores_per_chip and chips_per_host must be >= 1");
  }
  return chip;
}

}  // namespace tpusim
