// `tpusim topology SLICE [--num-slices N] [--json] [--dot [FILE]]`: the physical slice.
#include <iomanip>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "hw/slice.h"
#include "hw/topology.h"
#include "sim/cli/commands.h"
#include "sim/cli/hardware_json.h"

namespace tpusim {
namespace {

struct TopologyOptions {
  std::string slice_name;
  int num_slices = 1;
  bool json = false;
  std::string dot_path;
  bool dot = false;
};

constexpr double kGiga = 1e9;

// `topology` is the graph of one slice (every figure below is per slice or per chip); `slice` the
// whole request, for the totals over its slices.
nlohmann::json graph_json(const Topology& topology, const Slice& slice) {
  nlohmann::json json;
  json["slice"] = slice.name;
  json["chip"] = slice.chip->name;
  json["num_slices"] = slice.num_slices;
  json["chips"] = slice.total_chips();
  json["devices"] = slice.total_devices();
  json["chips_per_slice"] = slice.chips;
  json["devices_per_chip"] = slice.devices_per_chip;
  json["shape"] = slice.shape;
  json["wraparound"] = slice.wraparound;
  json["hosts"] = slice.total_hosts();
  json["chips_per_host"] = slice.chips_per_host;
  json["ici_links_per_chip"] = topology.ici_links_per_chip();
  json["ici_link_bandwidth_uni_gbps"] = slice.chip->ici_link_bandwidth_uni_gbps;
  nlohmann::json axes = nlohmann::json::array();
  for (int axis = 0; axis < static_cast<int>(slice.shape.size()); ++axis) {
    const AxisBandwidth bandwidth = topology.axis_bandwidth(axis);
    axes.push_back({{"axis", axis},
                    {"size", bandwidth.size},
                    {"wraps", bandwidth.wraps},
                    {"ring_bandwidth_gbps", bandwidth.ring_bandwidth_bytes_per_s / kGiga},
                    {"max_hops", bandwidth.max_hops}});
  }
  json["axes"] = axes;
  json["bisection_bandwidth_tbps"] = topology.bisection_bandwidth_bytes_per_s() / 1e12;
  json["d2d_bandwidth_uni_gbps"] =
      slice.devices_per_chip > 1 ? slice.chip->d2d_bandwidth_uni_gbps : 0.0;
  json["dcn_bandwidth_per_slice_gbps"] = topology.dcn_bandwidth_per_slice_bytes_per_s() / kGiga;
  if (slice.switched) {  // a GPU node: which network joins the nodes
    json["fabric"] = slice.chip->slice.fabric;
  }
  return json;
}

void print_human(const nlohmann::json& json) {
  std::cout << "slice            " << json["slice"].get<std::string>() << " ("
            << json["chip"].get<std::string>() << ")";
  if (json["num_slices"].get<int>() > 1) {
    std::cout << " x " << json["num_slices"].get<int>() << " slices over DCN";
  }
  std::cout << "\n";
  std::string shape;
  for (const auto& dim : json["shape"]) {
    shape += (shape.empty() ? "" : "x") + std::to_string(dim.get<int>());
  }
  std::cout << "shape            " << shape << "\n";
  std::cout << "chips            " << json["chips"] << " (" << json["chips_per_slice"]
            << " per slice)\n";
  std::cout << "devices          " << json["devices"] << " (" << json["devices_per_chip"]
            << " per chip)\n";
  std::cout << "hosts            " << json["hosts"] << " (" << json["chips_per_host"]
            << " chips per host)\n";
  std::cout << "ICI links/chip   " << json["ici_links_per_chip"] << " x "
            << json["ici_link_bandwidth_uni_gbps"].get<double>() << " GB/s per direction\n";
  for (const auto& axis : json["axes"]) {
    std::cout << "axis " << axis["axis"] << "           size " << std::setw(3)
              << axis["size"].get<int>()
              << (axis["wraps"].get<bool>() ? "  wraps   " : "  no wrap ") << " ring "
              << axis["ring_bandwidth_gbps"].get<double>() << " GB/s per device, max "
              << axis["max_hops"] << " hops\n";
  }
  std::cout << "bisection        " << json["bisection_bandwidth_tbps"].get<double>()
            << " TB/s per direction (per slice)\n";
  if (json["d2d_bandwidth_uni_gbps"].get<double>() > 0) {
    std::cout << "D2D (chiplets)   " << json["d2d_bandwidth_uni_gbps"].get<double>()
              << " GB/s per direction\n";
  }
  std::cout << "DCN per slice    " << json["dcn_bandwidth_per_slice_gbps"].get<double>()
            << " GB/s\n";
  if (json.contains("fabric")) {
    std::cout << "fabric           " << json["fabric"].get<std::string>() << "\n";
  }
}

}  // namespace

nlohmann::json topology_json(const Slice& slice) {
  // The figures are per slice, so one slice's graph gives them: 10,000 slices of a 256-chip
  // pod took 2.5 s and 1.4 GB as one graph.
  Slice one_slice = slice;
  one_slice.num_slices = 1;
  return graph_json(Topology(one_slice), slice);
}

void register_topology_command(CLI::App& app) {
  auto options = std::make_shared<TopologyOptions>();
  CLI::App* command = app.add_subcommand(
      "topology",
      "Show a slice's physical topology: chips, devices, shape, wraparound, hosts, "
      "links and bandwidths");
  command
      ->add_option(
          "slice", options->slice_name,
          "Slice name, e.g. v5p-128, v6e-256, tpu7x-512, v5p:4x4x8 (or compile_topology=v5p-128)")
      ->required();
  command->add_option("--num-slices", options->num_slices,
                      "Slices joined over DCN (compile_topology_num_slices)");
  command->add_flag("--json", options->json, "Print one JSON object");
  command
      ->add_option("--dot", options->dot_path, "Write Graphviz (to FILE, or stdout when no FILE)")
      ->expected(0, 1);
  command->callback([options, command] {
    options->dot = command->count("--dot") > 0;
    if (options->dot && options->dot_path.empty() && options->json) {
      // Both on stdout would make neither parseable.
      throw UserError(
          "topology: --json and --dot without a FILE both print to stdout; give --dot a "
          "FILE or drop one of them");
    }
    // A MaxText user writes the slice as the key (compile_topology=v5e-32): the same slice.
    const std::string key_prefix = "compile_topology=";
    if (options->slice_name.rfind(key_prefix, 0) == 0) {
      options->slice_name.erase(0, key_prefix.size());
    }
    const Slice slice = parse_slice(options->slice_name, options->num_slices);
    if (options->dot) {
      // The drawing holds every device, host and link of every slice.
      constexpr int kMaxDotDevices = 65536;
      if (slice.total_devices() > kMaxDotDevices) {
        throw UserError("topology: --dot draws up to " + std::to_string(kMaxDotDevices) +
                        " devices; " + options->slice_name + " x " +
                        std::to_string(slice.num_slices) + " slices has " +
                        std::to_string(slice.total_devices()));
      }
      const Topology topology(slice);
      if (options->dot_path.empty()) {
        std::cout << topology.to_dot();
        return;
      }
      write_file_atomically(options->dot_path, topology.to_dot());
    }
    const nlohmann::json json = topology_json(slice);
    if (options->json) {
      std::cout << json.dump(2) << "\n";
    } else {
      print_human(json);
    }
  });
}

}  // namespace tpusim
