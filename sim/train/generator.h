// sim/train/generator.h: autoregressive decoding (`tpusim generate`) on the functional engine.
//
// The model is a ShardedModel of the config's mesh (one device or many: the same per-device
// program `tpusim train` runs), its weights restored from a checkpoint or Hugging Face weights.
// Each new token recomputes the whole prefix: the batch holds the prefix padded to
// max_target_length (causal attention: later positions do not change earlier ones), the program
// runs forward (and, as it is a training program, backward: its gradients are discarded), and the
// cross-entropy kernel records the logits of the last prefix position (TokenLogProbs'
// logits sink, gathered over devices and ranks). There is no KV cache yet: a step costs a whole
// forward pass of max_target_length tokens rather than one token's.
//
// The next token: the argmax of the logits (greedy, temperature 0; the lowest id among equal
// logits), or, with temperature T > 0, a draw from softmax(logits / T) over the top_k largest
// (all with top_k 0) by a 64-bit Mersenne Twister seeded with `seed`, so a seed gives the same
// tokens on any mesh whose logits agree. The logits are those the loss sees (after
// normalize_embedding_logits and final_logits_soft_cap).
//
// Example:
//   Generator generator(config, checkpoint);
//   generator.generate(prompt_ids, {.max_tokens = 32}, /*eos=*/-1,
//                      [](const GeneratedToken& token) { std::cout << token.id << "\n"; });
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "sim/train/checkpoint.h"

namespace tpusim {

class ShardedModel;

struct GenerateOptions {
  int64_t max_tokens = 32;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: every token
  uint64_t seed = 0;
};

// What generation reads from the config: the longest prefix and the vocabulary.
struct GenerateLimits {
  int64_t max_target_length = 0;
  int64_t vocab_size = 0;

  static GenerateLimits from_config(const Config& config);
};

struct GeneratedToken {
  int32_t id = 0;
  std::vector<float> logits;  // of the position that chose it, [vocab]
};

// Why generation stopped.
enum class GenerateStop { kMaxTokens, kEndOfSequence, kLength };

// The next token from `logits` (see the file comment); `random` is advanced only when sampling.
int32_t choose_token(const std::vector<float>& logits, const GenerateOptions& options,
                     std::mt19937_64& random);

class Generator {
 public:
  Generator(const Config& config, const Checkpoint& weights);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  int64_t length() const { return length_; }  // the longest prefix (max_target_length)
  int num_devices() const;

  // The logits of the token after `prefix` (1 <= size <= length()), [vocab].
  std::vector<float> next_logits(const std::vector<int32_t>& prefix);

  // Appends up to options.max_tokens tokens to `prompt`, calling `on_token` for each as it is
  // chosen; stops after `eos` (>= 0) or when the prefix is longer than length() (the last
  // token chosen is the one after position length() - 1).
  GenerateStop generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                        int32_t eos, const std::function<void(const GeneratedToken&)>& on_token);

 private:
  std::unique_ptr<ShardedModel> model_;
  int64_t length_ = 0;
  int64_t vocab_ = 0;
};

}  // namespace tpusim
