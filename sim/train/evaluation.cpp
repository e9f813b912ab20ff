#include "sim/train/evaluation.h"

#include <algorithm>

#include "sim/train/token_cache.h"

namespace tpusim {
namespace {

// Held-out sequences shown by the token view (fewer when the batch is smaller).
constexpr int64_t kTokenVizSequences = 4;

// Adds one evaluation's log-probabilities of the sampled sequences (and, the first time, their
// target tokens' text).
void add_token_viz_step(TokenViz& viz, int64_t step, const TokenLogProbs& log_probs,
                        const Batch& batch) {
  const int64_t shown = std::min(kTokenVizSequences, log_probs.sequences);
  if (viz.pieces.empty()) {
    for (int64_t sequence = 0; sequence < shown; ++sequence) {
      const auto first = batch.targets.begin() + sequence * log_probs.length;
      viz.pieces.push_back(
          token_texts(viz.tokenizer_path, std::vector<int32_t>(first, first + log_probs.length)));
    }
  }
  TokenViz::Step entry;
  entry.step = step;
  for (int64_t sequence = 0; sequence < shown; ++sequence) {
    const auto first = log_probs.values.begin() + sequence * log_probs.length;
    entry.log_probs.emplace_back(first, first + log_probs.length);
  }
  viz.steps.push_back(std::move(entry));
}

// The UTF-8 bytes one SentencePiece piece stands for (see text_bytes).
double piece_bytes(const std::string& piece) {
  if (piece == "<s>" || piece == "</s>" || piece == "<pad>") {
    return 0;
  }
  constexpr size_t kByteFallbackLength = 6;  // "<0xNN>"
  if (piece.size() == kByteFallbackLength && piece.starts_with("<0x") && piece.ends_with(">")) {
    return 1;
  }
  // Each U+2581 (three bytes) is the one space it encodes.
  const std::string boundary = "\xe2\x96\x81";
  double bytes = static_cast<double>(piece.size());
  for (size_t at = piece.find(boundary); at != std::string::npos;
       at = piece.find(boundary, at + boundary.size())) {
    bytes -= static_cast<double>(boundary.size() - 1);
  }
  return bytes;
}

}  // namespace

double held_out_loss(const Dataset& data, ShardedModel& model, const HeldOutBatches& batches,
                     std::vector<int32_t>* scored_targets) {
  const StepProgram& program = model.program();
  const int64_t eval_steps = std::max<int64_t>(1, batches.eval_steps);
  double total = 0;
  for (int64_t index = 0; index < eval_steps; ++index) {
    std::vector<Batch> eval(static_cast<size_t>(program.accumulation_steps));
    for (auto& batch : eval) {
      batch = data.eval_batch(index, program.microbatch);
    }
    TokenLogProbs log_probs;
    log_probs.sequences = program.microbatch;
    log_probs.length = batches.length;
    const bool sample = batches.viz != nullptr && index == 0;
    total += model.compute_gradients(eval, sample ? &log_probs : nullptr).loss;
    if (sample) {
      add_token_viz_step(*batches.viz, batches.step, log_probs, eval.front());
    }
    if (scored_targets != nullptr) {
      scored_targets->insert(scored_targets->end(), eval.front().targets.begin(),
                             eval.front().targets.end());
    }
  }
  return total / static_cast<double>(eval_steps);
}

double text_bytes(const std::string& tokenizer_path, const std::vector<int32_t>& tokens) {
  if (tokenizer_path.empty()) {
    return static_cast<double>(tokens.size());
  }
  double bytes = 0;
  for (const std::string& piece : token_texts(tokenizer_path, tokens)) {
    bytes += piece_bytes(piece);
  }
  return bytes;
}

}  // namespace tpusim
