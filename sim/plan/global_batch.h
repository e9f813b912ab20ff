// sim/plan/global_batch.h: the global batch `tpusim plan` trains with, a constraint the user sets
// (--global-batch-tokens MIN-MAX) because it changes the training, not only its speed.
//
// Default: the range of the model's published MaxText runs (validation/published.csv, embedded:
// per_device_batch_size x devices x max_target_length x gradient_accumulation_steps of each row
// of that model_name), else 1M-16M tokens; `source` says which. Within the range plan searches
// one global batch: the largest power of two of sequences in it (a larger batch of the same
// microbatches only adds gradient accumulation, which amortizes the per-step work: optimizer
// update, gradient reduction), else the largest whole number of sequences in it.
//
// Example:
//   GlobalBatchRange range = default_global_batch_range("llama3.1-70b");
//   // {1048576, 10485760, "the published llama3.1-70b runs (validation/published.csv, 4 rows)"}
//   global_batch_sequences(range, /*max_target_length=*/8192);  // 1024
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpusim {

struct GlobalBatchRange {
  double min_tokens = 0;
  double max_tokens = 0;
  std::string source;  // where the range comes from, for the output
};

// "1e6-16e6", "4194304", "2M-8M" (K, M, G suffixes); UserError naming the value.
GlobalBatchRange parse_global_batch_range(const std::string& text);

GlobalBatchRange default_global_batch_range(const std::string& model_name);

// Sequences per optimizer step; UserError when the range holds no whole sequence.
int64_t global_batch_sequences(const GlobalBatchRange& range, int64_t max_target_length);

// "1.0M" style text of a token count.
std::string tokens_text(double tokens);

}  // namespace tpusim
