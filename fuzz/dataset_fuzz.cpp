// fuzz/dataset_fuzz.cpp: fuzzes the dataset readers of `tpusim train` and the token cache index.
//
// Input: one mode byte, then the bytes of a file. By the mode byte modulo 3:
//   2 ('t')  a dataset_type=text file
//   1 ('j')  a dataset_type=jsonl file (one JSON object with a "text" field per line)
//   0 ('c')  the index.json of a token cache (token_cache.h) of a fixed source file whose cache
//            the target built at start-up: it replaces the index, then the dataset is loaded
//            from the cache (stale, corrupted or valid, whatever the index says)
// The mode byte / 3 picks max_target_length (1, 7 or 64). The target builds the Dataset from a
// config as `tpusim train` does and reads a few training and evaluation batches. A UserError is
// the expected outcome of bad input; any other exception, a crash or a sanitizer report is a bug.
//
// TPUSIM_FUZZ_SEED_OUT=<file>: also write the start-up cache's index.json (with its mode byte)
// there, a seed for mode 0 (how fuzz/corpus/dataset/cache-index.json was made).
//
// Example (libFuzzer, scripts/fuzz.sh builds it):
//   build-fuzz/fuzz/dataset_fuzz -dict=fuzz/dataset.dict -max_total_time=60 work_corpus
//   fuzz/corpus/dataset
// Example (any compiler, the fixed-seed driver the test suite runs):
//   build/fuzz/dataset_fuzz -runs=3000 -seed=1 -dict=fuzz/dataset.dict fuzz/corpus/dataset
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "model/config.h"
#include "sim/train/dataset.h"
#include "sim/train/token_cache.h"

namespace {

namespace fs = std::filesystem;
using tpusim::Config;

constexpr std::array<int, 3> kLengths = {1, 7, 64};
constexpr int kModes = 3;

// The fixed source of the cache mode: a few lines of text, enough for windows of 64 tokens.
constexpr std::string_view kCacheSource =
    "The quick brown fox jumps over the lazy dog.\n"
    "Pack my box with five dozen liquor jugs.\n"
    "How vexingly quick daft zebras jump!\n"
    "Sphinx of black quartz, judge my vow.\n"
    "The five boxing wizards jump quickly.\n";

struct Setup {
  fs::path text_path;
  fs::path jsonl_path;
  fs::path index_path;  // of the cache of source.txt
  // [mode][length]
  std::array<std::array<Config, kLengths.size()>, kModes> configs;
};

Config dataset_config(const std::string& type, const fs::path& path, const std::string& cache,
                      int length) {
  return Config::load(
      "", {"dataset_type=" + type, "dataset_path=" + path.string(), "dataset_cache_dir=" + cache,
           "max_target_length=" + std::to_string(length), "vocab_size=256"});
}

const Setup& setup() {
  static const Setup* const instance = [] {
    auto* result = new Setup;
    const fs::path& scratch = tpusim::fuzz::scratch_directory();
    result->text_path = scratch / "data.txt";
    result->jsonl_path = scratch / "data.jsonl";
    const fs::path source = scratch / "source.txt";
    const fs::path cache = scratch / "cache";
    tpusim::fuzz::write_file(source, kCacheSource);
    const tpusim::TokenizedSource built = tpusim::load_tokens({.dataset_type = "text",
                                                               .path = source.string(),
                                                               .tokenizer_path = "",
                                                               .cache_directory = cache.string()});
    result->index_path = fs::path(built.cache_path) / "index.json";
    for (size_t length = 0; length < kLengths.size(); ++length) {
      result->configs[0][length] = dataset_config("text", source, cache.string(), kLengths[length]);
      result->configs[1][length] =
          dataset_config("jsonl", result->jsonl_path, "", kLengths[length]);
      result->configs[2][length] = dataset_config("text", result->text_path, "", kLengths[length]);
    }
    if (const char* seed_out = std::getenv("TPUSIM_FUZZ_SEED_OUT")) {
      std::ifstream in(result->index_path, std::ios::binary);
      const std::string index((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      tpusim::fuzz::write_file(seed_out, "c" + index);
    }
    return result;
  }();
  return *instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpusim;
  if (size == 0) {
    return 0;
  }
  const Setup& files = setup();
  const int mode = data[0] % kModes;
  const size_t length = (data[0] / kModes) % kLengths.size();
  const std::string_view content = fuzz::as_text(data + 1, size - 1);
  const fs::path target = mode == 0   ? files.index_path
                          : mode == 1 ? files.jsonl_path
                                      : files.text_path;
  fuzz::write_file(target, content);
  fuzz::run_guarded("dataset", [&] {
    const Dataset dataset = Dataset::from_config(files.configs[mode][length]);
    dataset.train_batch(0, 0, 2);
    dataset.train_batch(3, 0, 3);
    dataset.eval_batch(0, 2);
  });
  return 0;
}
