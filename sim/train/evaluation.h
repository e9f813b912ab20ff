// sim/train/evaluation.h: the held-out loss of a model, as `tpusim train` records it at its
// evaluations (eval_loss in the metrics file) and `tpusim eval` reports it.
//
// eval_steps batches of the held-out windows (dataset.h; synthetic data: a stream of its own),
// each given to every microbatch of the step, scored by the same forward and backward pass a
// training step runs (ShardedModel::compute_gradients), their losses averaged in batch order. One
// function for both commands, so the same weights on the same mesh give the same bits.
//
// Example:
//   std::vector<int32_t> targets;
//   const double loss = held_out_loss(data, model, {.eval_steps = 4, .length = 1024}, &targets);
//   const double bits_per_byte = loss * targets.size() / (text_bytes("", targets) * M_LN2);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/train/dataset.h"
#include "sim/train/sharded_model.h"
#include "sim/train/token_viz.h"

namespace tpusim {

struct HeldOutBatches {
  int64_t eval_steps = 1;  // batches (>= 1)
  int64_t length = 0;      // max_target_length
  // With `viz`: batch 0's log-probabilities (its first sequences) join the token view as `step`.
  TokenViz* viz = nullptr;
  int64_t step = 0;
};

// The mean loss in nats per target token over the batches; `scored_targets`, when given, receives
// the target tokens of every batch (each once, whatever the microbatch count).
double held_out_loss(const Dataset& data, ShardedModel& model, const HeldOutBatches& batches,
                     std::vector<int32_t>* scored_targets = nullptr);

// The bytes of text `tokens` stand for: one per token for the byte-level tokenizer (tokenizer_path
// ""); with a SentencePiece model, each piece's UTF-8 bytes, its word-boundary mark U+2581 as the
// one space it encodes, a byte-fallback piece <0xNN> as one byte, <s> </s> <pad> as none.
double text_bytes(const std::string& tokenizer_path, const std::vector<int32_t>& tokens);

}  // namespace tpusim
