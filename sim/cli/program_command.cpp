// `tpusim program [config.yml ...] [key=value ...] [--layer N] [--global]`: the per-device program
// as text: every op with local shapes (split dims show their mesh axes) and the collectives the
// partitioner inserted, with their mesh axes and bytes.
#include <iostream>
#include <memory>

#include "common/error.h"
#include "model/config.h"
#include "sharding/step_program.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"

namespace tpusim {

void register_program_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto layer = std::make_shared<int>(-1);
  auto global = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "program", "Print the per-device training-step program (ops, local shapes, collectives)");
  command->add_option("args", *args, "[config.yml ...] key=value ...");
  auto xla_flags = std::make_shared<std::string>();
  command->add_option(
      "--xla-flags", *xla_flags,
      "XLA/libtpu flags of the recipe (also read from LIBTPU_INIT_ARGS, XLA_FLAGS)");
  CLI::Option* layer_option =
      command->add_option("--layer", *layer,
                          "Print only layer group N (0 = first decoder layer kind): its forward, "
                          "backward and optimizer regions");
  command->add_flag("--global", *global, "Print the global (unpartitioned) step instead");
  command->callback([args, layer, layer_option, global, xla_flags] {
    if (layer_option->count() > 0 && *layer < 0) {
      throw UserError("--layer: " + std::to_string(*layer) +
                      " is negative (layer groups count from 0)");
    }
    const Config config = load_command_config(*args, *xla_flags);
    const StepProgram built = build_step_program(config);
    const Graph& graph = *global ? built.step->graph : built.program.graph;
    const auto& layers = built.step->forward_info.layer_regions;
    if (*layer >= static_cast<int>(layers.size())) {
      throw UserError("--layer: " + std::to_string(*layer) + " but the model has " +
                      std::to_string(layers.size()) + " layer group(s)");
    }
    std::cout << "# " << built.slice.name << ", mesh " << built.mesh.shape.describe()
              << ", microbatch " << built.microbatch << " of " << built.global_batch
              << " sequences\n";
    if (*layer < 0) {
      std::cout << graph.to_text();
      return;
    }
    const int forward = layers[static_cast<size_t>(*layer)];
    const std::string& name = graph.region(forward).name;
    for (int region = 0; region < static_cast<int>(graph.regions().size()); ++region) {
      const std::string& candidate = graph.region(region).name;
      if (candidate == name || candidate == name + "/grad" || candidate == "optimizer/" + name) {
        std::cout << graph.to_text(region);
      }
    }
  });
}

}  // namespace tpusim
