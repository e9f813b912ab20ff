// `tpusim generate MODEL [config.yml ...] [key=value ...] --prompt TEXT [--max-tokens N]
// [--temperature T] [--top-k K] [--seed S] [--json [--with-logits]]`: continues TEXT with the
// model of a tpusim checkpoint or a Hugging Face directory (sim/cli/model_source.h) on the
// functional engine (sim/train/generator.h), streaming the decoded text to stdout as each token is
// chosen. Greedy by default; with --temperature > 0 tokens are drawn (over the --top-k largest
// logits), the same for the same --seed. The mesh is one v5e device unless the arguments name
// another (compile_topology=v5e-4 ici_tensor_parallelism=2 ...): every mesh gives the same tokens.
// max_target_length is the prompt plus --max-tokens - 1 unless set (the last token is chosen at
// the last position). Each token recomputes the whole prefix (no KV cache yet). The prompt is
// encoded as training encoded its data (no BOS); generation stops at the tokenizer's EOS.
//
// --json prints one object instead: {"prompt_tokens", "tokens", "text", "stop", "devices"} and,
// with --with-logits, the logits each token was chosen from ("logits": [[...], ...]).
// Exit 0 on success, 2 on bad input (an unknown model directory, an empty prompt, --max-tokens
// <= 0 or above 65536, --temperature < 0, --top-k < 0, a prompt longer than max_target_length,
// --top-k or --seed with greedy decoding, --with-logits without --json) and when the run would not
// fit in host memory (the pre-flight of sim/train/host_memory.h, checked before the engine
// allocates; its line goes to stderr).
//
// Example:
//   tpusim generate runs/a/checkpoints/200 --prompt "Once upon a time" --max-tokens 64
//   tpusim generate /tmp/tiny-llama-hf --prompt "abc" compile_topology=v5e-4 ici_fsdp_parallelism=4
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/cli/model_source.h"
#include "sim/train/generator.h"
#include "sim/train/host_memory.h"
#include "sim/train/text_tokenizer.h"
#include "sim/train/trainer.h"
#include "sim/transport/transport.h"

namespace tpusim {
namespace {

// The most tokens one call generates: each costs a forward pass over the whole sequence.
constexpr int64_t kMaxNewTokens = 65536;

struct GenerateRequest {
  std::string model;
  std::vector<std::string> args;
  std::string prompt;
  GenerateOptions options;
  int64_t seed = 0;
  bool json = false;
  bool with_logits = false;
};

void check_request(const GenerateRequest& request) {
  if (request.prompt.empty()) {
    throw UserError("generate: --prompt is empty: give the text to continue");
  }
  const GenerateOptions& options = request.options;
  if (options.max_tokens <= 0 || options.max_tokens > kMaxNewTokens) {
    throw UserError("generate: --max-tokens " + std::to_string(options.max_tokens) +
                    ": expected 1 to " + std::to_string(kMaxNewTokens));
  }
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    std::ostringstream value;
    value << options.temperature;
    throw UserError("generate: --temperature " + value.str() +
                    ": expected a finite number >= 0 (0: greedy)");
  }
  if (options.top_k < 0) {
    throw UserError("generate: --top-k " + std::to_string(options.top_k) +
                    ": expected >= 0 (0: every token)");
  }
  if (request.seed < 0) {
    throw UserError("generate: --seed " + std::to_string(request.seed) + ": expected >= 0");
  }
  // Options that change nothing where they are given, refused rather than dropped without a word.
  if (options.temperature == 0 && (options.top_k > 0 || request.seed > 0)) {
    throw UserError(std::string("generate: ") + (options.top_k > 0 ? "--top-k" : "--seed") +
                    " applies to sampling, but --temperature is 0 (greedy): give --temperature "
                    "> 0");
  }
  if (request.with_logits && !request.json) {
    throw UserError("generate: --with-logits adds the logits to --json's object: give --json");
  }
}

// Whether the arguments set `key` themselves.
bool sets_key(const std::vector<std::string>& args, const std::string& key) {
  for (const std::string& item : split_command_args(args).overrides) {
    if (split_override(item).first == key) {
      return true;
    }
  }
  return false;
}

const char* stop_name(GenerateStop stop) {
  switch (stop) {
    case GenerateStop::kEndOfSequence:
      return "eos";
    case GenerateStop::kLength:
      return "max_target_length";
    case GenerateStop::kMaxTokens:
      break;
  }
  return "max_tokens";
}

void generate(GenerateRequest request) {
  check_request(request);
  request.options.seed = static_cast<uint64_t>(request.seed);
  ModelSource source = load_model_source(request.model, request.args,
                                         {"compile_topology=v5e-1", "per_device_batch_size=1"},
                                         "generate", check_functional_support);
  Config& config = source.config;
  const TextTokenizer tokenizer(tokenizer_path_from_config(config));
  const std::vector<int32_t> prompt = tokenizer.encode(request.prompt);
  if (prompt.empty()) {
    throw UserError("generate: --prompt encodes to no tokens with tokenizer_path '" +
                    tokenizer.path() + "'");
  }
  const int64_t vocab = GenerateLimits::from_config(config).vocab_size;
  if (const auto largest = *std::max_element(prompt.begin(), prompt.end()); largest >= vocab) {
    throw UserError("vocab_size: " + std::to_string(vocab) + " has no token " +
                        std::to_string(largest) + ", which the prompt encodes to",
                    "vocab_size");
  }
  const auto prompt_size = static_cast<int64_t>(prompt.size());
  if (!sets_key(request.args, "max_target_length")) {
    config.set("max_target_length",
               std::to_string(std::max<int64_t>(1, prompt_size + request.options.max_tokens - 1)),
               "generate: prompt + --max-tokens");
  } else if (const int64_t length = GenerateLimits::from_config(config).max_target_length;
             prompt_size > length) {
    throw UserError("max_target_length: " + std::to_string(length) + " is shorter than the " +
                        std::to_string(prompt_size) + "-token prompt",
                    "max_target_length");
  }
  // The host-memory pre-flight: the Generator runs the step program of one max_target_length
  // batch on every device of the mesh in this process (no KV cache yet), with the checkpoint's
  // weights staged; exit 2 naming the need and what is available before allocating it.
  const LocalTransport in_process;
  const std::string memory = require_host_memory(
      training_host_memory(config, {.checkpoint_staging = true, .optimizer_in_checkpoint = false},
                           in_process),
      "generate of " + request.model);
  Generator generator(config, source.checkpoint);
  std::vector<int32_t> tokens;
  nlohmann::json logits = nlohmann::json::array();
  std::string printed;
  const int32_t eos = tokenizer.special().eos;
  const GenerateStop stop =
      generator.generate(prompt, request.options, eos, [&](const GeneratedToken& token) {
        tokens.push_back(token.id);
        if (request.with_logits) {
          logits.push_back(token.logits);
        }
        if (request.json || token.id == eos) {
          return;
        }
        // The text so far, decoded whole (a piece's leading space depends on what precedes it);
        // what is new since the last token is printed.
        const std::string text = tokenizer.decode(tokens);
        if (text.size() > printed.size() && text.starts_with(printed)) {
          std::cout << text.substr(printed.size()) << std::flush;
          printed = text;
        }
      });
  if (request.json) {
    nlohmann::json out = {{"prompt_tokens", prompt},
                          {"tokens", tokens},
                          {"text", tokenizer.decode(tokens)},
                          {"stop", stop_name(stop)},
                          {"devices", generator.num_devices()}};
    if (request.with_logits) {
      out["logits"] = logits;
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
  }
  std::cerr << memory << "\n";
  std::cerr << "generate: " << prompt_size << " prompt tokens, " << tokens.size() << " generated ("
            << (request.options.temperature > 0 ? "sampled" : "greedy") << ", stopped by "
            << stop_name(stop) << ") on " << generator.num_devices()
            << " simulated devices, the prefix recomputed each token (no KV cache)\n";
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto request = std::make_shared<GenerateRequest>();
  CLI::App* command = app.add_subcommand(
      "generate", "Continue a prompt with a checkpoint's or Hugging Face directory's model");
  command->add_option("model", request->model, "tpusim checkpoint or Hugging Face directory")
      ->required();
  command->add_option("args", request->args, "[config.yml ...] key=value ... (mesh, tokenizer)");
  command->add_option("--prompt", request->prompt, "the text to continue")->required();
  command->add_option("--max-tokens", request->options.max_tokens, "tokens to generate (32)");
  command->add_option("--temperature", request->options.temperature,
                      "0 (default): greedy; > 0: sample from softmax(logits / T)");
  command->add_option("--top-k", request->options.top_k, "sample among the K largest (0: all)");
  command->add_option("--seed", request->seed, "seed of the sampling (0)");
  command->add_flag("--json", request->json, "one JSON object instead of the streamed text");
  command->add_flag("--with-logits", request->with_logits,
                    "with --json: the logits of every generated token");
  command->callback([request] { generate(*request); });
}

}  // namespace tpusim
