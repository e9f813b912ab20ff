// common/mechanisms.h: the named cost mechanisms of the performance and memory models (and the
// program rewrites of the partitioner), each of which can be switched off to measure what it
// contributes (an ablation).
//
// Every mechanism is on in normal use. `tpusim validate --without NAME,...` and `tpusim estimate
// --without NAME,...` switch some off for the whole process, so reports/validation.md can show
// each class of published run with and without the mechanism that explains it. The switches are
// process-wide because the mechanisms sit in independent leaves of the model (op costs,
// collective costs, the scheduler, the memory model, the partitioner); set them once, before
// estimating.
//
// Example:
//   disable_mechanisms({"grouped_matmul_tiles"});          // UserError on an unknown name
//   mechanism_enabled(Mechanism::kGroupedMatmulTiles);     // false
//   MechanismsOff guard({"in_place_buffers"});             // tests: restored on scope exit
#pragma once

#include <array>
#include <string>
#include <vector>

namespace tpusim {

enum class Mechanism {
  kGroupedMatmulTiles,           // megablox/tokamax row-tile visits, tile padding and refetches
  kQuantizeScalePass,            // absmax calibration reads each quantized operand first
  kBf16Attention,                // attention kernels stay bf16 under fp8/int8 quantization
  kChipIngressBound,             // collectives over the chiplet pair bounded by the chip's links
  kSparseCoreReduction,          // offloaded reduce-scatters at 1/3 roofline, on their own queue
  kTensorCoreDrivenCollectives,  // v7x collectives kept off the SparseCores block the TensorCore
  kDcnShardsFirst,               // hierarchical gathers cross DCN with shards, then ICI
  kInPlaceBuffers,               // elementwise results written over a last-read operand (memory)
  kAttentionSubblockPipelining,  // splash overlaps one sub-block's softmax with the next's matmul
  kReductionReassociation,       // add(reduce(a), reduce(b)) runs as reduce(add(a, b)), as in XLA
  kCount,
};

// The name used on the command line and in reports, e.g. "grouped_matmul_tiles".
const char* mechanism_name(Mechanism mechanism);
// One line saying what the mechanism does.
const char* mechanism_summary(Mechanism mechanism);

bool mechanism_enabled(Mechanism mechanism);

// Switches the named mechanisms off (the others back on). UserError naming an unknown one.
void disable_mechanisms(const std::vector<std::string>& names);

// Disables mechanisms for a scope (tests), restoring the previous switches after.
class MechanismsOff {
 public:
  explicit MechanismsOff(const std::vector<std::string>& names);
  ~MechanismsOff();
  MechanismsOff(const MechanismsOff&) = delete;
  MechanismsOff& operator=(const MechanismsOff&) = delete;

 private:
  std::array<bool, static_cast<size_t>(Mechanism::kCount)> previous_;
};

// The names of the mechanisms switched off now.
std::vector<std::string> disabled_mechanisms();

}  // namespace tpusim
