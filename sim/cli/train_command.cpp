// `tpusim train [config.yml ...] [key=value ...] [--verify] [--quiet]`: trains the model for real
// on the simulated devices of compile_topology (each holding only its shards), with MaxText's keys
// (steps, dataset_type/dataset_path, learning_rate schedule, gradient_accumulation_steps,
// metrics_file, eval_interval). Exit 0 on success, 2 on bad input, 3 when --verify finds a step
// off the unsharded reference by more than its tolerance.
//
// Under `mpirun -np R` (built with TPUSIM_WITH_MPI) the devices are spread over the R ranks
// (mpi_transport.h); any failure on a rank ends the whole job: exit 2 for bad input, 1 otherwise,
// or mpirun's own status when a rank dies.
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "model/config.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/train/train_keys.h"
#include "sim/train/trainer.h"
#ifdef TPUSIM_WITH_MPI
#include "sim/cli/mpi_run.h"
#include "sim/transport/mpi_transport.h"
#endif

namespace tpusim {
namespace {

void train(const std::vector<std::string>& args, const TrainOptions& options,
           Transport* transport) {
  const Config config = load_command_config(args, "", nullptr, check_functional_support);
  Trainer trainer(config, transport);
  trainer.run(options, std::cerr);
  // The performance keys the config set (train_keys.h), once the run is through: a bad input
  // stays one line on stderr.
  if (transport == nullptr || transport->rank() == 0) {
    report_performance_keys(config, std::cerr);
  }
}

#ifdef TPUSIM_WITH_MPI
void train_under_mpirun(const std::vector<std::string>& args, const TrainOptions& options) {
  MpiTransport transport;
  run_rank_or_abort(transport, [&] { train(args, options, &transport); });
}
#endif

}  // namespace

void register_train_command(CLI::App& app) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto verify = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  auto dump = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "train", "Run the sharded training step for real on CPU (simulated devices)");
  command->add_option("args", *args, "[config.yml ...] key=value ...");
  command->add_flag("--verify", *verify,
                    "Run the unsharded reference beside it and report the largest relative "
                    "difference each step");
  command->add_flag("--quiet", *quiet, "No progress line");
  command->add_option("--dump", *dump,
                      "After the first step, write the weights before and after it, the "
                      "gradients and the batch to this directory (for reference comparisons)");
  command->callback([args, verify, quiet, dump] {
    // Checked before the run: a file there failed after the first step, as "cannot create
    // checkpoint directory", naming no option.
    if (std::error_code error; !dump->empty() && std::filesystem::exists(*dump, error) &&
                               !std::filesystem::is_directory(*dump, error)) {
      throw UserError("--dump: '" + *dump + "' exists and is not a directory");
    }
    TrainOptions options;
    options.verify = *verify;
    options.progress = !*quiet;
    options.dump_directory = *dump;
#ifdef TPUSIM_WITH_MPI
    if (MpiTransport::launched_by_mpirun()) {
      train_under_mpirun(*args, options);
      return;
    }
#else
    // Any size but 0 or 1 (atoi wrapped 4294967298 to 2 and read "x" as 0): under mpirun.
    const std::string_view ranks =
        std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? std::getenv("OMPI_COMM_WORLD_SIZE") : "";
    if (!ranks.empty() && ranks != "0" && ranks != "1") {
      throw UserError(
          "this tpusim was built without MPI (TPUSIM_WITH_MPI=OFF or OpenMPI not found): under "
          "mpirun every rank would run the whole job; run tpusim train without mpirun");
    }
#endif
    train(*args, options, nullptr);
  });
}

}  // namespace tpusim
