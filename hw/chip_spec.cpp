#include "hw/chip_spec.h"

#include <charconv>
#include <cmath>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "common/error.h"
#include "common/suggest.h"
#include "common/yaml_text.h"
#include "hw/matmul_format.h"

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
      {"continuation_fusion_tensorcore_share", &ChipSpec::continuation_fusion_tensorcore_share},
      {"routed_row_hbm_fraction", &ChipSpec::routed_row_hbm_fraction},
      {"gmm_v2_grid_step_us", &ChipSpec::gmm_v2_grid_step_us},
      {"max_slice_chips", &ChipSpec::max_slice_chips},
      {"pod_bisection_tbps", &ChipSpec::pod_bisection_tbps},
      {"power_watts", &ChipSpec::power_watts},
  };
  return members;
}

// The range a catalog number must lie in. Bounds are far past any real chip (the largest shipped
// value is a few times below each) and keep later arithmetic sound: rates and sizes that the
// engines divide by are positive, fractions are in (0, 1], switches are 0 or 1, counts are whole
// numbers, and max_slice_chips x 10,000 slices x devices_per_chip fits an int.
struct SpecBound {
  double min;
  bool min_exclusive;  // min itself is refused (a rate of 0 divides by zero)
  double max;
  bool whole = false;  // a count
};

constexpr SpecBound kRate{0, true, 1e7};           // TFLOP/s, GB/s, GHz, GiB, ...: > 0
constexpr SpecBound kOptional{0, false, 1e7};      // 0 where the feature is absent
constexpr SpecBound kFraction{0, true, 1};         // an achievable fraction
constexpr SpecBound kLatency{0, false, 1e6};       // microseconds, up to a second
constexpr SpecBound kSwitch{0, false, 1, true};    // 0 or 1
constexpr SpecBound kCount{1, false, 4096, true};  // links, MXUs, cores, ...

const std::map<std::string, SpecBound, std::less<>>& spec_bounds() {
  static const std::map<std::string, SpecBound, std::less<>> bounds = {
      {"peak_bf16_tflops", kRate},
      {"peak_int8_tops", kOptional},
      {"peak_fp8_tflops", kOptional},
      {"mfu_peak_bf16_tflops_per_device", kRate},
      {"tensorcores_per_chip", {1, false, 8, true}},
      {"devices_per_chip", {1, false, 2, true}},  // one device, or two chiplets (v3, v7x)
      {"mxus_per_tensorcore", kCount},
      {"mxu_dim", kCount},
      {"clock_ghz", {0, true, 100}},
      {"vmem_mib_per_tensorcore", kRate},
      {"cmem_mib_per_chip", kOptional},
      {"hbm_capacity_gib", kRate},
      {"hbm_usable_gib", kRate},
      {"hbm_bandwidth_gbps", kRate},
      {"hbm_achievable_fraction", kFraction},
      {"vmem_bandwidth_tbps_per_tensorcore", kRate},
      {"vpu_tflops_per_chip", kRate},
      {"mxu_achievable_fraction", kFraction},
      {"mxu_fill_drain_cycles", {0, false, 1e6, true}},
      {"op_overhead_us", kLatency},
      {"matmul_output_fusion", kSwitch},
      {"program_efficiency", kFraction},
      {"dispatch_overhead_us", kLatency},
      {"ici_links_per_chip", {1, false, 64, true}},
      {"ici_link_bandwidth_uni_gbps", kRate},
      {"ici_achievable_fraction", kFraction},
      {"ici_hop_latency_us", kLatency},
      {"collective_launch_us", kLatency},
      {"collective_compute_share", {0, false, 0.9}},  // compute keeps at least a tenth
      {"d2d_bandwidth_uni_gbps", kOptional},
      {"d2d_latency_us", kLatency},
      {"chips_per_host", {1, false, 1024, true}},
      {"pcie_bandwidth_gbps", kRate},
      {"host_memory_gib", kRate},
      {"dcn_bandwidth_per_chip_gbps", kRate},
      {"dcn_achievable_fraction", kFraction},
      {"dcn_latency_us", kLatency},
      {"sparsecores_per_chip", {0, false, 64, true}},
      {"sparsecore_collective_offload_default", kSwitch},
      {"sparsecore_reduce_scatter_time_factor", {1, false, 100}},
      {"continuation_fusion_tensorcore_share", {0, false, 10}},
      {"routed_row_hbm_fraction", kFraction},
      {"gmm_v2_grid_step_us", kLatency},
      {"max_slice_chips", {1, false, 65536, true}},
      {"pod_bisection_tbps", kOptional},
      {"power_watts", {0, true, 1e5}},
  };
  return bounds;
}

std::string format_spec_number(double value) {
  std::ostringstream out;
  out << std::setprecision(15) << value;
  return out.str();
}

// UserError naming the file and key when `value` is not finite or outside the key's bound.
void check_spec_value(const std::string& where, const std::string& key, double value) {
  const auto found = spec_bounds().find(key);
  if (found == spec_bounds().end()) {
    throw std::logic_error("no bound for catalog key '" + key + "'");
  }
  const SpecBound& bound = found->second;
  const bool too_small = bound.min_exclusive ? !(value > bound.min) : !(value >= bound.min);
  if (!std::isfinite(value) || too_small || value > bound.max ||
      (bound.whole && value != std::floor(value))) {
    throw UserError(where + ".value: " + format_spec_number(value) + " is out of range (" +
                        (bound.whole ? "a whole number " : "a finite number ") +
                        (bound.min_exclusive ? "> " : ">= ") + format_spec_number(bound.min) +
                        " and <= " + format_spec_number(bound.max) + ")",
                    key);
  }
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
  if (rules.shape_rule == ShapeRule::kSwitched) {
    rules.fabric = required_string(node, "fabric", where);
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
  const MatmulFormat format = matmul_format(quantization);
  if (format == MatmulFormat::kInt8 && peak_int8_tops > 0) {
    return peak_int8_tops * 1e12;
  }
  if (format == MatmulFormat::kFp8 && peak_fp8_tflops > 0) {
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
    check_spec_value(where, key, value);
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
  // Across keys: what one device can use of its chip, and the peak MFU divides by (a peak far
  // below the chip's gave an MFU of 1644%).
  const std::string specs_at = std::string(origin) + ": specs.";
  if (chip.hbm_usable_gib > chip.hbm_capacity_gib / chip.devices_per_chip) {
    throw UserError(specs_at + "hbm_usable_gib: " + format_spec_number(chip.hbm_usable_gib) +
                        " GiB per device is more than hbm_capacity_gib / devices_per_chip (" +
                        format_spec_number(chip.hbm_capacity_gib / chip.devices_per_chip) + ")",
                    "hbm_usable_gib");
  }
  const double peak_per_device = chip.peak_bf16_tflops / chip.devices_per_chip;
  if (chip.mfu_peak_bf16_tflops_per_device < 0.5 * peak_per_device ||
      chip.mfu_peak_bf16_tflops_per_device > 1.01 * peak_per_device) {
    throw UserError(specs_at + "mfu_peak_bf16_tflops_per_device: " +
                        format_spec_number(chip.mfu_peak_bf16_tflops_per_device) +
                        " must be from half to all of peak_bf16_tflops / devices_per_chip (" +
                        format_spec_number(peak_per_device) + ")",
                    "mfu_peak_bf16_tflops_per_device");
  }
  if (const YAML::Node kernel = root["attention_kernel"]; kernel) {
    chip.attention_kernel =
        parse_attention_kernel_table(kernel, std::string(origin) + ": attention_kernel");
  } else if (chip.is_gpu()) {
    throw UserError(std::string(origin) +
                    ": a GPU entry needs an 'attention_kernel' section (its fused-attention "
                    "kernel rates; see configs/hw/README.md)");
  }
  return chip;
}

}  // namespace tpusim
