// `tpusim train [base.yml] [key=value ...] [--verify] [--quiet]`: trains the model for real on
// the simulated devices of compile_topology (each holding only its shards), with MaxText's keys
// (steps, dataset_type/dataset_path, learning_rate schedule, gradient_accumulation_steps,
// metrics_file, eval_interval). Exit 0 on success, 2 on bad input.
#include <iostream>
#include <memory>

#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/train/trainer.h"

namespace tpusim {

void register_train_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto verify = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  auto dump = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "train", "Run the sharded training step for real on CPU (simulated devices)");
  command->add_option("args", *args, "[config.yml] key=value ...");
  command->add_flag("--verify", *verify,
                    "Run the unsharded reference beside it and report the largest relative "
                    "difference each step");
  command->add_flag("--quiet", *quiet, "No progress line");
  command->add_option("--dump", *dump,
                      "After the first step, write the weights before and after it, the "
                      "gradients and the batch to this directory (for reference comparisons)");
  command->callback([args, verify, quiet, dump] {
    const Config config = load_command_config(*args);
    Trainer trainer(config);
    TrainOptions options;
    options.verify = *verify;
    options.progress = !*quiet;
    options.dump_directory = *dump;
    trainer.run(options, std::cerr);
  });
}

}  // namespace tpusim
