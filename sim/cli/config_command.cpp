// `tpusim config [config.yml ...] [key=value ...] [--json]`: the resolved config, where each value
// came from, and (when compile_topology is set) the mesh it gives. A quick way to check a MaxText
// command line before estimating it.
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "hw/slice.h"
#include "model/config.h"
#include "model/model_dims.h"
#include "sharding/logical_rules.h"
#include "sharding/mesh.h"
#include "sharding/step_program.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"

namespace tpusim {
namespace {

// compile_topology as given ("" when the config names no slice: no mesh to show).
std::string topology_from_config(const Config& config) {
  return config.get_string("compile_topology");
}

}  // namespace

void register_config_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto json_output = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "config",
      "Load base.yml -> config files -> model preset -> key=value overrides, validate, and print");
  command->add_option("args", *args, "[config.yml ...] key=value ...");
  auto xla_flags = std::make_shared<std::string>();
  command->add_option(
      "--xla-flags", *xla_flags,
      "XLA/libtpu flags of the recipe (also read from LIBTPU_INIT_ARGS, XLA_FLAGS)");
  command->add_flag("--json", *json_output, "Print JSON");
  command->callback([args, json_output, xla_flags] {
    const Config config = load_command_config(*args, *xla_flags);
    const ModelDims dims = ModelDims::from_config(config);
    // The rules' checks every other command makes (a rule naming an unknown mesh axis was
    // printed here, exit 0, and refused by estimate).
    static_cast<void>(LogicalAxisRules::from_config(config));
    nlohmann::json json;
    json["config"] = config.to_json();
    json["model"] = {{"emb_dim", dims.emb_dim},           {"num_query_heads", dims.num_query_heads},
                     {"num_kv_heads", dims.num_kv_heads}, {"head_dim", dims.head_dim},
                     {"mlp_dim", dims.mlp_dim},           {"num_layers", dims.num_layers},
                     {"vocab_size", dims.vocab_size},     {"num_experts", dims.num_experts}};
    const std::string topology = topology_from_config(config);
    std::string mesh_description;  // set when compile_topology names a slice
    if (!topology.empty()) {
      // The slice every other command builds, with its checks of the slice count and hardware.
      const Slice slice = slice_from_config(config);
      const MeshShape mesh = resolve_mesh(config, slice);
      nlohmann::json axes;
      for (int axis = 0; axis < kNumMeshAxes; ++axis) {
        axes[mesh_axis_names()[axis]] = {{"ici", mesh.ici[axis]}, {"dcn", mesh.dcn[axis]}};
      }
      json["mesh"] = axes;
      json["devices"] = slice.total_devices();
      mesh_description = mesh.describe();
    }
    if (*json_output) {
      std::cout << json.dump(2) << "\n";
      return;
    }
    for (const std::string& key : config.keys()) {
      std::cout << std::left << std::setw(40) << key << " " << std::setw(24)
                << json["config"][key].dump() << " # " << config.origin(key) << "\n";
    }
    if (!mesh_description.empty()) {
      std::cout << "\nmesh on " << topology << " (" << json["devices"]
                << " devices): " << mesh_description << "\n";
    }
  });
}

}  // namespace tpusim
