#include "sim/train/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "common/error.h"
#include "model/model_dims.h"
#include "sim/train/sharded_model.h"

namespace tpusim {

int32_t choose_token(const std::vector<float>& logits, const GenerateOptions& options,
                     std::mt19937_64& random) {
  if (logits.empty()) {
    throw std::logic_error("generate: no logits");
  }
  if (options.temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first, the lower id first among equal logits.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < order.size()) {
    order.resize(static_cast<size_t>(options.top_k));
  }
  const double top = logits[static_cast<size_t>(order.front())];
  std::vector<double> weights;
  double total = 0;
  for (const int32_t id : order) {
    weights.push_back(std::exp((logits[static_cast<size_t>(id)] - top) / options.temperature));
    total += weights.back();
  }
  // A uniform draw in [0, 1) from the generator's top 53 bits (the same on every standard
  // library, unlike std::uniform_real_distribution).
  const double draw = static_cast<double>(random() >> 11) * 0x1.0p-53 * total;
  double sum = 0;
  for (size_t index = 0; index < order.size(); ++index) {
    sum += weights[index];
    if (draw < sum) {
      return order[index];
    }
  }
  return order.back();
}

GenerateLimits GenerateLimits::from_config(const Config& config) {
  return {config.get_int("max_target_length"), ModelDims::from_config(config).vocab_size};
}

Generator::Generator(const Config& config, const Checkpoint& weights)
    : model_(std::make_unique<ShardedModel>(config)),
      length_(GenerateLimits::from_config(config).max_target_length),
      vocab_(GenerateLimits::from_config(config).vocab_size) {
  model_->restore(weights, /*with_optimizer=*/false);
}

Generator::~Generator() = default;

int Generator::num_devices() const {
  return model_->num_devices();
}

std::vector<float> Generator::next_logits(const std::vector<int32_t>& prefix) {
  const auto size = static_cast<int64_t>(prefix.size());
  if (size < 1 || size > length_) {
    throw std::logic_error("generate: a prefix of " + std::to_string(size) + " tokens for " +
                           std::to_string(length_) + " positions");
  }
  const StepProgram& program = model_->program();
  const int64_t sequences = program.microbatch;
  // Every sequence of the batch is the prefix padded with token 0 (causal attention: the padding
  // does not reach the prefix's positions); the targets are the next tokens, 0 past the prefix.
  Batch batch;
  batch.tokens.assign(static_cast<size_t>(sequences * length_), 0);
  batch.targets.assign(static_cast<size_t>(sequences * length_), 0);
  for (int64_t sequence = 0; sequence < sequences; ++sequence) {
    for (int64_t position = 0; position < size; ++position) {
      const auto at = static_cast<size_t>(sequence * length_ + position);
      batch.tokens[at] = prefix[static_cast<size_t>(position)];
      if (position + 1 < size) {
        batch.targets[at] = prefix[static_cast<size_t>(position + 1)];
      }
    }
  }
  const std::vector<Batch> microbatches(static_cast<size_t>(program.accumulation_steps), batch);
  TokenLogProbs sink;
  sink.sequences = sequences;
  sink.length = length_;
  sink.logits_position = size - 1;
  sink.vocab = vocab_;
  model_->compute_gradients(microbatches, &sink);
  std::vector<float> logits(sink.logits.begin(), sink.logits.begin() + vocab_);
  if (std::any_of(logits.begin(), logits.end(), [](float value) { return std::isnan(value); })) {
    throw std::logic_error("generate: some logits of the last position were not computed");
  }
  return logits;
}

GenerateStop Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                 int32_t eos,
                                 const std::function<void(const GeneratedToken&)>& on_token) {
  std::vector<int32_t> prefix = prompt;
  std::mt19937_64 random(options.seed);
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    if (static_cast<int64_t>(prefix.size()) > length_) {  // its last position is the program's
      return GenerateStop::kLength;
    }
    GeneratedToken token;
    token.logits = next_logits(prefix);
    token.id = choose_token(token.logits, options, random);
    prefix.push_back(token.id);
    on_token(token);
    if (eos >= 0 && token.id == eos) {
      return GenerateStop::kEndOfSequence;
    }
  }
  return GenerateStop::kMaxTokens;
}

}  // namespace tpusim
