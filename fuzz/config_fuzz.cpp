// fuzz/config_fuzz.cpp: fuzzes the config loader as `tpusim estimate my.yml key=value` drives it.
//
// Input: the text of a YAML config file; lines after a line "#!overrides" (a YAML comment, so a
// seed stays a valid config) are also given as key=value overrides, one per line. The target
// writes the file into its scratch directory, loads it with load_command_config (embedded
// base.yml, the file and its base_config chain, the model preset, the overrides, validation),
// derives the model dimensions, and, for slices of at most kMaxChips chips, runs the estimate
// (per-device program, memory and performance models). A UserError is the expected outcome of
// bad input; any other exception, a crash or a sanitizer report is a bug.
//
// Example (libFuzzer, scripts/fuzz.sh builds it):
//   build-fuzz/fuzz/config_fuzz -dict=fuzz/config.dict -max_total_time=60 work_corpus
//   fuzz/corpus/config
// Example (any compiler, the fixed-seed driver the test suite runs):
//   build/fuzz/config_fuzz -runs=3000 -seed=1 -dict=fuzz/config.dict fuzz/corpus/config
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "hw/slice.h"
#include "model/config.h"
#include "model/model_dims.h"
#include "sharding/step_program.h"
#include "sim/cli/command_args.h"
#include "sim/estimate/estimate.h"

namespace {

// Larger slices are valid input but take longer to estimate than a fuzz input should.
constexpr int64_t kMaxChips = 1024;
constexpr std::string_view kOverridesMarker = "#!overrides";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpusim;
  const std::string_view input = fuzz::as_text(data, size);
  std::string_view yaml = input;
  std::vector<std::string> args;
  const auto path = fuzz::scratch_directory() / "config.yml";
  args.push_back(path.string());
  if (const size_t marker = input.find(kOverridesMarker); marker != std::string_view::npos) {
    yaml = input.substr(0, marker);
    std::string_view rest = input.substr(marker + kOverridesMarker.size());
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      const std::string_view line = rest.substr(0, end);
      if (!line.empty()) {
        args.emplace_back(line);
      }
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
  }
  fuzz::write_file(path, yaml);
  fuzz::run_guarded("config", [&] {
    const Config config = load_command_config(args);
    ModelDims::from_config(config);
    if (slice_from_config(config).total_chips() <= kMaxChips) {
      estimate_config(config);
    }
  });
  return 0;
}
