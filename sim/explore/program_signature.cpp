#include "sim/explore/program_signature.h"

namespace tpusim {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;
constexpr uint64_t kDoubleExact = (uint64_t{1} << 52) - 1;

uint64_t fnv1a(const std::string& text, uint64_t hash) {
  for (const char letter : text) {
    hash ^= static_cast<unsigned char>(letter);
    hash *= kFnvPrime;
  }
  return hash;
}

}  // namespace

std::string program_text_without_axes(const std::string& text) {
  static const std::string kOver = " over {";
  std::string kept;
  kept.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    if (text[at] == '@') {  // "embed:256@fsdp+expert": up to the next ',' or ']'
      while (at < text.size() && text[at] != ',' && text[at] != ']') {
        ++at;
      }
      continue;
    }
    if (text.compare(at, kOver.size(), kOver) == 0) {
      const size_t close = text.find('}', at);
      at = close == std::string::npos ? text.size() : close + 1;
      continue;
    }
    kept += text[at++];
  }
  return kept;
}

uint64_t program_signature(const StepProgram& program) {
  uint64_t hash = fnv1a(program_text_without_axes(program.program.graph.to_text()), kFnvOffset);
  hash = fnv1a("microbatch " + std::to_string(program.microbatch) + " of " +
                   std::to_string(program.global_batch),
               hash);
  hash &= kDoubleExact;
  return hash == 0 ? 1 : hash;
}

}  // namespace tpusim
