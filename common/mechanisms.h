// common/mechanisms.h: the named cost mechanisms of the performance and memory models (and the
// program rewrites of the partitioner), each of which can be switched off to measure what it
// contributes (an ablation).
//
// Every mechanism is on in normal use. `tpusim validate --without NAME,...` and `tpusim estimate
// --without NAME,...` switch some off, so reports/validation.md can show each class of published
// run with and without the mechanism that explains it. Which ones are on is a value, MechanismSet,
// that travels with the options of the leaves that consult it (op costs and the scheduler through
// CostContext::mechanisms, collective costs, the memory model, the partitioner), so the caches
// keyed on those options tell a run without a mechanism from one with it.
//
// Example:
//   const MechanismSet off = MechanismSet::without({"grouped_matmul_tiles"});  // UserError on
//                                                                               // an unknown name
//   off.enabled(Mechanism::kGroupedMatmulTiles);   // false
//   MechanismSet().enabled(Mechanism::kGroupedMatmulTiles);  // true: all on
//   off.disabled_names();                          // {"grouped_matmul_tiles"}
#pragma once

#include <array>
#include <string>
#include <vector>

namespace tpusim {

enum class Mechanism {
  kGroupedMatmulTiles,           // megablox/tokamax row-tile visits, tile padding and refetches
  kQuantizeScalePass,            // absmax calibration reads each quantized operand first
  kBf16Attention,                // attention kernels stay bf16 under fp8/int8 quantization
  kBf16Logits,                   // the logits matmul stays bf16 under fp8/int8 quantization
  kChipIngressBound,             // collectives over the chiplet pair bounded by the chip's links
  kSparseCoreReduction,          // offloaded reduce-scatters on a SparseCore queue of their own
  kTensorCoreDrivenCollectives,  // v7x collectives off the SparseCores take TensorCore time
  kDcnShardsFirst,               // hierarchical gathers cross DCN with shards, then ICI
  kDcnStepLatency,               // each ring step across slices pays its message latency
  kInPlaceBuffers,               // elementwise results written over a last-read operand (memory)
  kAttentionSubblockPipelining,  // splash overlaps one sub-block's softmax with the next's matmul
  kReductionReassociation,       // add(reduce(a), reduce(b)) runs as reduce(add(a, b)), as in XLA
  kGpuAttentionKernelRates,      // GPU fused attention at its measured kernel rate (catalog table)
  kRoutedRowGathers,             // dropless MoE moves routed rows at a fraction of HBM roofline
  kAqtStochasticRounding,        // AQT int8 writes and reads a 32-bit noise tensor per gradient
  kWeightScaleOnShard,           // a weight's absmax scale is found on its FSDP shard
  kGroupedMatmulMxuRows,         // a grouped-matmul row tile narrower than the MXU fills it anyway
  kRoutingScatterGradients,      // without MaxText's custom sort VJP, routing gradients scatter-add
  kTokamaxGmmTiles,              // unquantized tokamax gmm tiles itself (tuned table, else 128^3)
  kBf16ExpertMatmuls,            // MoE experts MaxText's quantization does not reach stay bf16
  kGroupedMatmulQuantizePass,    // a Pallas grouped matmul's narrow operands are cast by XLA first
  kQuantizedResiduals,           // fp8_full's backward reuses the forward's quantized operands
  kNarrowDenseMoeExchange,       // quantized dense-MoE dispatch/combine einsums at the narrow rate
  kGmmV2GridSteps,               // tokamax gmm_v2 pays a fixed cost per step of its pipeline grid
  kGmmV2WeightPrefetch,          // gmm_v2 fetches an expert's next weights one grid step ahead
  kExpertBiasScatterGradients,   // mlp_bias: each routed expert bias's gradient is a scatter-add
  kGmmV2OneTensorCore,           // gmm_v2 runs on one TensorCore of a megacore device (v4, v5p)
  kCount,
};

// The name used on the command line and in reports, e.g. "grouped_matmul_tiles".
const char* mechanism_name(Mechanism mechanism);
// One line saying what the mechanism does.
const char* mechanism_summary(Mechanism mechanism);
// Every mechanism's name, comma-separated in the order of Mechanism (for --help texts).
std::string mechanism_names_joined();

// Which mechanisms are on: all of them unless switched off by name.
class MechanismSet {
 public:
  MechanismSet() = default;  // every mechanism on

  // All but the named ones. UserError naming an unknown one (the --without list).
  static MechanismSet without(const std::vector<std::string>& names);

  bool enabled(Mechanism mechanism) const;

  // The names of the mechanisms switched off, in the order of Mechanism.
  std::vector<std::string> disabled_names() const;

  bool operator==(const MechanismSet&) const = default;

 private:
  std::array<bool, static_cast<size_t>(Mechanism::kCount)> off_{};
};

}  // namespace tpusim
