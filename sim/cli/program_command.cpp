// `tpusim program [base.yml] [key=value ...] [--layer N]`: the training step's graph as text.
//
// Today this prints the forward graph of one device's microbatch (per_device_batch_size
// sequences); the partitioner will turn it into the per-device program with collectives.
#include <iostream>
#include <memory>

#include "common/error.h"
#include "model/builder/forward_builder.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"

namespace tpusim {

void register_program_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto layer = std::make_shared<int>(-1);
  CLI::App* command =
      app.add_subcommand("program", "Print the training step's graph (ops, shapes) as text");
  command->add_option("args", *args, "[config.yml] key=value ...");
  command->add_option("--layer", *layer, "Print only layer group N (0 = first decoder layer kind)");
  command->callback([args, layer] {
    const CommandArgs split = split_command_args(*args);
    const Config config = Config::load(split.base_path, split.overrides);
    const double per_device = config.get_float("per_device_batch_size");
    const auto batch = static_cast<int64_t>(std::max(1.0, per_device));
    const ForwardGraph forward = build_forward(config, batch);
    if (*layer >= static_cast<int>(forward.layer_regions.size())) {
      throw UserError("--layer: " + std::to_string(*layer) + " but the model has " +
                      std::to_string(forward.layer_regions.size()) + " layer group(s)");
    }
    const int region = *layer < 0 ? -1 : forward.layer_regions[static_cast<size_t>(*layer)];
    std::cout << forward.graph.to_text(region);
  });
}

}  // namespace tpusim
