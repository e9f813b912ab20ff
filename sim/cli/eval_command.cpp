// `tpusim eval WEIGHTS [config.yml ...] [key=value ...] [--json] [--tokens-page FILE]`: the loss,
// perplexity and bits per byte of a model on held-out data. WEIGHTS is a tpusim checkpoint
// directory (its recorded model, with the arguments applied over it) or Hugging Face weights (an
// export-hf directory or a .safetensors file, with model_name given).
//
// The data are eval_steps batches of dataset_path's held-out windows (the last tenth of each era,
// sim/train/dataset.h; dataset_type text or jsonl, guessed from the file name when only
// dataset_path is given; synthetic data without one), scored on the simulated devices of
// compile_topology with train's batching and sharding keys (per_device_batch_size,
// gradient_accumulation_steps, ici_*/dcn_*, max_target_length), by the function train's
// evaluations call (sim/train/evaluation.h): the checkpoint of step N evaluated with the run's
// keys gives bitwise the eval_loss train wrote for step N. Bits per byte: loss x tokens / (bytes
// of text they stand for x ln 2), for text data only. --tokens-page writes the token-probability
// page (sim/train/token_viz.h) of the first batch's first sequences.
//
// Before allocating, the run's host memory is checked (sim/train/host_memory.h). Under mpirun
// (built with TPUSIM_WITH_MPI) the devices are spread over the ranks as in train; rank 0 reads the
// weights and prints. Exit 0 on success, 2 on bad input (a missing path, a missing dataset,
// eval_steps <= 0, a model that does not fit in host memory).
//
// Example:
//   tpusim eval runs/a/checkpoints/200 dataset_path=shakespeare.txt eval_steps=8 --json
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/yaml_text.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/cli/model_source.h"
#include "sim/train/evaluation.h"
#include "sim/train/host_memory.h"
#include "sim/train/model_identity.h"
#include "sim/train/sharded_model.h"
#include "sim/train/train_settings.h"
#include "sim/train/trainer.h"
#ifdef TPUSIM_WITH_MPI
#include "sim/cli/mpi_run.h"
#include "sim/transport/mpi_transport.h"
#endif

namespace tpusim {
namespace {

// The config for the weights at `path`: a tpusim checkpoint's recorded model (rank 0 reads its
// state.json, every rank gets the metadata; the model is checked before anything is loaded), or,
// for Hugging Face weights, the arguments' model (model_name is needed). UserError naming the path
// when it does not exist.
Config weights_config(const std::string& path, const std::vector<std::string>& args,
                      Transport& transport, const std::function<void(const Config&)>& check) {
  namespace fs = std::filesystem;
  const bool root = transport.rank() == 0;
  std::error_code error;
  if (root && !fs::exists(path, error)) {
    throw UserError("'" + path +
                    "' does not exist (give a tpusim checkpoint directory, runs/<run>/checkpoints/"
                    "<step>, or Hugging Face weights: an export-hf directory or a .safetensors "
                    "file)");
  }
  const std::string kind =
      transport.broadcast_from_root(root ? (is_hf_weights(path)             ? "hf"
                                            : fs::is_directory(path, error) ? "tpusim"
                                                                            : "other")
                                         : "");
  if (kind == "other") {
    throw UserError("'" + path +
                    "' is neither a checkpoint directory nor Hugging Face weights (.safetensors)");
  }
  if (kind == "tpusim") {
    const std::string state = (fs::path(path) / "state.json").string();
    if (root && !fs::is_regular_file(state, error)) {
      throw UserError("checkpoint '" + path + "' has no state.json (not a tpusim checkpoint)");
    }
    const std::string text = transport.broadcast_from_root(root ? read_text_file(state) : "");
    const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      throw UserError("checkpoint '" + path + "': state.json is not a JSON object");
    }
    Checkpoint recorded;  // the metadata alone: the model is checked before anything is loaded
    recorded.metadata = parsed.value("metadata", nlohmann::json());
    Config config = recorded_config(recorded.metadata.is_object()
                                        ? recorded.metadata.value("model_config", nlohmann::json())
                                        : nlohmann::json(),
                                    path, args, {}, check);
    check_made_from(recorded, path, config, /*with_optimizer=*/false);
    return config;
  }
  Config config = load_command_config(args, "", nullptr, check);
  if (FunctionalSettings::from_config(config).model_name == "default") {
    throw UserError("model_name: Hugging Face weights ('" + path +
                        "') record no tpusim model; name it (model_name=..., and the keys the "
                        "model was trained with)",
                    "model_name");
  }
  return config;
}

struct EvalOptions {
  bool json = false;
  std::string tokens_page;
};

// What the evaluation found, and of what.
struct EvalReport {
  std::string weights;
  bool hugging_face = false;
  std::optional<int64_t> step;  // a tpusim checkpoint's
  std::string model_name;
  std::string dataset;  // dataset_path, or "synthetic"
  int64_t eval_steps = 0;
  int64_t sequences = 0;        // per batch
  int64_t tokens = 0;           // target tokens scored, a window scored twice counted twice
  std::optional<double> bytes;  // text data only
  std::optional<int64_t> held_out_windows;  // text data: the windows the held-out split has
  double loss = 0;

  // Text data whose held-out split has fewer windows than the batches take: they wrap around and
  // score the same windows again (the loss is their mean all the same).
  bool repeats_windows() const {
    return held_out_windows && *held_out_windows < eval_steps * sequences;
  }

  std::optional<double> bits_per_byte() const {
    if (!bytes || *bytes <= 0) {
      return std::nullopt;
    }
    return loss * static_cast<double>(tokens) / (*bytes * M_LN2);
  }
};

// The keys eval reads besides train's settings.
struct EvalKeys {
  std::string dataset_type;
  std::string dataset_path;
  std::string topology;
  int64_t eval_steps = 0;

  static EvalKeys from_config(const Config& config);
};

EvalKeys EvalKeys::from_config(const Config& config) {
  return {.dataset_type = config.get_string("dataset_type"),
          .dataset_path = config.get_string("dataset_path"),
          .topology = config.get_string("compile_topology"),
          .eval_steps = config.get_int("eval_steps")};
}

// dataset_path given alone reads the file (a .jsonl or .json file as JSON lines, else text) where
// base.yml's synthetic data would ignore it; eval_steps <= 0 is refused (MaxText's -1, "not set",
// evaluates one batch, as train does).
Config eval_config(Config config) {
  const EvalKeys keys = EvalKeys::from_config(config);
  const std::string& path = keys.dataset_path;
  if (!path.empty() && keys.dataset_type == "synthetic" &&
      config.origin("dataset_type") != "command line") {
    const bool lines = path.ends_with(".jsonl") || path.ends_with(".json");
    config.set_string("dataset_type", lines ? "jsonl" : "text", "tpusim eval (from dataset_path)");
  }
  const int64_t eval_steps = keys.eval_steps;
  if (eval_steps <= 0 && (eval_steps != -1 || config.origin("eval_steps") == "command line")) {
    throw UserError("eval_steps: " + std::to_string(eval_steps) +
                        " evaluates nothing (give the number of held-out batches, >= 1)",
                    "eval_steps");
  }
  return config;
}

void check_page_path(const std::string& path) {
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (std::filesystem::is_directory(path, error) ||
      (!parent.empty() && !std::filesystem::is_directory(parent, error))) {
    throw UserError("--tokens-page: cannot write '" + path +
                    "' (a directory, or its directory does not exist)");
  }
}

EvalReport evaluate_weights(const std::string& path, const Config& config,
                            const EvalOptions& options, Transport& transport) {
  const TrainSettings settings = TrainSettings::from_config(config);
  const EvalKeys keys = EvalKeys::from_config(config);
  const Dataset data = Dataset::from_config(config);
  const bool root = transport.rank() == 0;
  transport.set_timeout(collective_timeout(settings.collective_timeout_seconds));
  const std::string memory = require_host_memory(
      training_host_memory(config, {.checkpoint_staging = true, .optimizer_in_checkpoint = false},
                           transport),
      "eval of " + settings.model_name + " on " + keys.topology, transport.ranks_on_host());
  ShardedModel model(config, &transport);
  const Checkpoint weights = load_model_weights(path, config, transport);
  model.restore(weights, /*with_optimizer=*/false);
  if (root) {
    std::cerr << memory << "\n";  // once the weights loaded: a bad input stays one line
  }
  EvalReport report;
  report.weights = path;
  report.hugging_face = is_hf_weights(path);
  if (!report.hugging_face) {
    report.step = weights.step;
  }
  report.model_name = settings.model_name;
  const bool synthetic = keys.dataset_type == "synthetic";
  report.dataset = synthetic ? "synthetic" : keys.dataset_path;
  report.eval_steps = std::max<int64_t>(1, settings.eval_steps);
  report.sequences = model.program().microbatch;
  TokenViz viz;
  viz.title = "tpusim eval: " + settings.model_name + ", token probabilities";
  viz.tokenizer_path = settings.tokenizer_path;
  std::vector<int32_t> targets;
  report.loss = held_out_loss(data, model,
                              {.eval_steps = report.eval_steps,
                               .length = settings.max_target_length,
                               .viz = options.tokens_page.empty() ? nullptr : &viz,
                               .step = report.step.value_or(0)},
                              &targets);
  report.tokens = static_cast<int64_t>(targets.size());
  if (!synthetic) {
    report.bytes = text_bytes(settings.tokenizer_path, targets);
    report.held_out_windows = data.eval_windows();
  }
  if (root && !options.tokens_page.empty()) {
    viz.eval_loss.emplace_back(report.step.value_or(0), report.loss);
    write_file_atomically(options.tokens_page, render_token_viz(viz));
  }
  return report;
}

nlohmann::json report_json(const EvalReport& report) {
  const auto optional = [](const auto& value) {
    return value ? nlohmann::json(*value) : nlohmann::json();
  };
  return {{"weights", report.weights},
          {"format", report.hugging_face ? "huggingface" : "tpusim"},
          {"step", optional(report.step)},
          {"model_name", report.model_name},
          {"dataset", report.dataset},
          {"eval_steps", report.eval_steps},
          {"sequences_per_batch", report.sequences},
          {"tokens", report.tokens},
          {"bytes", optional(report.bytes)},
          {"held_out_windows", optional(report.held_out_windows)},
          {"repeats_windows", report.repeats_windows()},
          {"loss", report.loss},
          {"perplexity", std::exp(report.loss)},
          {"bits_per_byte", optional(report.bits_per_byte())}};
}

void print_human(const EvalReport& report) {
  std::cout << "tpusim eval: " << report.model_name << " from " << report.weights;
  if (report.step) {
    std::cout << " (step " << *report.step << ")";
  }
  std::cout << ", " << report.eval_steps << " held-out batch" << (report.eval_steps > 1 ? "es" : "")
            << " of " << report.sequences << " sequences from " << report.dataset << ": "
            << report.tokens << " tokens";
  if (report.bytes) {
    std::cout << ", " << std::fixed << std::setprecision(0) << *report.bytes << " bytes";
  }
  if (report.repeats_windows()) {
    std::cout << " (the held-out split has " << *report.held_out_windows << " window"
              << (*report.held_out_windows > 1 ? "s" : "") << " for "
              << report.eval_steps * report.sequences
              << " sequences: the batches score them again, and count them again)";
  }
  std::cout << "\n"
            << std::setprecision(std::numeric_limits<double>::max_digits10) << std::defaultfloat
            << "loss           " << report.loss << " nats per token\n"
            << std::fixed << std::setprecision(4) << "perplexity     " << std::exp(report.loss)
            << "\n";
  if (const auto bits = report.bits_per_byte()) {
    std::cout << "bits per byte  " << *bits << "\n";
  }
}

void run_eval(const std::string& path, const std::vector<std::string>& args,
              const EvalOptions& options, Transport& transport) {
  if (!options.tokens_page.empty()) {
    check_page_path(options.tokens_page);
  }
  const Config config =
      eval_config(weights_config(path, args, transport, check_functional_support));
  const EvalReport report = evaluate_weights(path, config, options, transport);
  if (transport.rank() != 0) {
    return;
  }
  if (options.json) {
    std::cout << report_json(report).dump(2) << "\n";
  } else {
    print_human(report);
  }
}

#ifdef TPUSIM_WITH_MPI
void eval_under_mpirun(const std::string& path, const std::vector<std::string>& args,
                       const EvalOptions& options) {
  MpiTransport transport;
  run_rank_or_abort(transport, [&] { run_eval(path, args, options, transport); });
}
#endif

}  // namespace

void register_eval_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto args = std::make_shared<std::vector<std::string>>();
  auto options = std::make_shared<EvalOptions>();
  CLI::App* command = app.add_subcommand(
      "eval", "Loss, perplexity and bits per byte of a checkpoint or Hugging Face weights");
  command
      ->add_option("weights", *path,
                   "checkpoint directory (runs/<run>/checkpoints/N) or Hugging Face weights")
      ->required();
  command->add_option("args", *args, "[config.yml ...] key=value ... (dataset_path, eval_steps)");
  command->add_flag("--json", options->json, "Print the result as JSON");
  command->add_option("--tokens-page", options->tokens_page,
                      "Write the token-probability page (HTML) of the first batch here");
  command->callback([path, args, options] {
#ifdef TPUSIM_WITH_MPI
    if (MpiTransport::launched_by_mpirun()) {
      eval_under_mpirun(*path, *args, *options);
      return;
    }
#else
    // As train: under mpirun every rank would run the whole job.
    const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (ranks != nullptr && std::string_view(ranks) != "0" && std::string_view(ranks) != "1") {
      throw UserError(
          "this tpusim was built without MPI (TPUSIM_WITH_MPI=OFF or OpenMPI not found): run "
          "tpusim eval without mpirun");
    }
#endif
    LocalTransport transport;
    run_eval(*path, *args, *options, transport);
  });
}

}  // namespace tpusim
