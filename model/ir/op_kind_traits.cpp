#include "model/ir/op_kind_traits.h"

#include <array>
#include <stdexcept>
#include <string>

namespace tpusim {
namespace {

// One row per OpKind, in the enum's order (checked below). Unnamed facts are false.
constexpr std::array<OpKindTraits, kOpKindCount> kOpKindTraits = {{
    {.kind = OpKind::kEinsum, .name = "einsum", .has_kernel = true},
    {.kind = OpKind::kElementwise,
     .name = "elementwise",
     .fuses_into_producer = true,
     .writes_in_place = true,
     .has_kernel = true},
    {.kind = OpKind::kRmsNorm, .name = "rms_norm", .has_kernel = true},
    {.kind = OpKind::kLayerNorm, .name = "layer_norm", .has_kernel = true},
    {.kind = OpKind::kRope,
     .name = "rope",
     .fuses_into_producer = true,
     .writes_in_place = true,
     .has_kernel = true},
    {.kind = OpKind::kAttention, .name = "attention", .attention = true, .has_kernel = true},
    {.kind = OpKind::kEmbeddingLookup, .name = "embedding_lookup", .has_kernel = true},
    {.kind = OpKind::kCrossEntropy, .name = "cross_entropy", .has_kernel = true},
    {.kind = OpKind::kMoeRouter, .name = "moe_router", .has_kernel = true},
    {.kind = OpKind::kMoeDispatch, .name = "moe_dispatch", .has_kernel = true},
    {.kind = OpKind::kMoeCombine, .name = "moe_combine", .has_kernel = true},
    {.kind = OpKind::kNormGrad, .name = "norm_grad", .writes_in_place = true, .has_kernel = true},
    {.kind = OpKind::kAttentionGrad,
     .name = "attention_grad",
     .attention = true,
     .has_kernel = true},
    {.kind = OpKind::kEmbeddingGrad, .name = "embedding_grad", .has_kernel = true},
    {.kind = OpKind::kCrossEntropyGrad,
     .name = "cross_entropy_grad",
     .writes_in_place = true,
     .has_kernel = true},
    {.kind = OpKind::kRouterGrad, .name = "router_grad", .has_kernel = true},
    {.kind = OpKind::kReduceSum, .name = "reduce_sum", .has_kernel = true},
    {.kind = OpKind::kNormStatistics, .name = "norm_statistics", .has_kernel = true},
    {.kind = OpKind::kCrossEntropyStatistics,
     .name = "cross_entropy_statistics",
     .has_kernel = true},
    {.kind = OpKind::kDynamicSlice, .name = "dynamic_slice", .has_kernel = true},
    {.kind = OpKind::kAdamUpdate, .name = "adam_update", .has_kernel = true},
    {.kind = OpKind::kAllGather, .name = "all_gather", .collective = Collective::kAllGather},
    {.kind = OpKind::kReduceScatter,
     .name = "reduce_scatter",
     .collective = Collective::kReduceScatter},
    {.kind = OpKind::kAllReduce, .name = "all_reduce", .collective = Collective::kAllReduce},
    {.kind = OpKind::kAllToAll, .name = "all_to_all", .collective = Collective::kAllToAll},
    {.kind = OpKind::kCollectivePermute,
     .name = "collective_permute",
     .collective = Collective::kCollectivePermute},
    {.kind = OpKind::kHostOffload,
     .name = "host_offload",
     .host_transfer = true,
     .has_kernel = true},
    {.kind = OpKind::kHostLoad, .name = "host_load", .host_transfer = true, .has_kernel = true},
    {.kind = OpKind::kSinkhorn, .name = "sinkhorn", .has_kernel = true},
    {.kind = OpKind::kSinkhornGrad, .name = "sinkhorn_grad", .has_kernel = true},
    {.kind = OpKind::kBlockPool, .name = "block_pool", .has_kernel = true},
    {.kind = OpKind::kBlockPoolGrad, .name = "block_pool_grad", .has_kernel = true},
    {.kind = OpKind::kBlockTopK, .name = "block_topk", .has_kernel = true},
}};

// Every enumerator, each once: -Wswitch fails the build here when a kind has no case, and the
// static_assert below then fails until kOpKindCount and the table take the kind in.
constexpr bool is_enumerator(OpKind kind) {
  switch (kind) {
    case OpKind::kEinsum:
    case OpKind::kElementwise:
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kRope:
    case OpKind::kAttention:
    case OpKind::kEmbeddingLookup:
    case OpKind::kCrossEntropy:
    case OpKind::kMoeRouter:
    case OpKind::kMoeDispatch:
    case OpKind::kMoeCombine:
    case OpKind::kNormGrad:
    case OpKind::kAttentionGrad:
    case OpKind::kEmbeddingGrad:
    case OpKind::kCrossEntropyGrad:
    case OpKind::kRouterGrad:
    case OpKind::kReduceSum:
    case OpKind::kNormStatistics:
    case OpKind::kCrossEntropyStatistics:
    case OpKind::kDynamicSlice:
    case OpKind::kAdamUpdate:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kCollectivePermute:
    case OpKind::kHostOffload:
    case OpKind::kHostLoad:
    case OpKind::kSinkhorn:
    case OpKind::kSinkhornGrad:
    case OpKind::kBlockPool:
    case OpKind::kBlockPoolGrad:
    case OpKind::kBlockTopK:
      return true;
  }
  return false;
}

// The enumerators are exactly 0 .. kOpKindCount - 1 (values well past the end are probed too).
constexpr bool count_matches_enum() {
  constexpr int kProbedValues = 4 * static_cast<int>(kOpKindCount) + 64;
  for (int value = 0; value < kProbedValues; ++value) {
    const bool counted = value < static_cast<int>(kOpKindCount);
    if (is_enumerator(static_cast<OpKind>(value)) != counted) {
      return false;
    }
  }
  return true;
}

constexpr bool rows_in_enum_order() {
  for (size_t index = 0; index < kOpKindTraits.size(); ++index) {
    if (kOpKindTraits[index].kind != static_cast<OpKind>(index) ||
        std::string_view(kOpKindTraits[index].name).empty()) {
      return false;
    }
  }
  return true;
}

static_assert(count_matches_enum(),
              "kOpKindCount (op_kind_traits.h) must be one past the last OpKind enumerator");
static_assert(rows_in_enum_order(),
              "kOpKindTraits needs one named row per OpKind, in the enum's order");

}  // namespace

const OpKindTraits& op_kind_traits(OpKind kind) {
  const auto index = static_cast<size_t>(kind);
  if (index >= kOpKindTraits.size()) {
    throw std::out_of_range("not an op kind: " + std::to_string(static_cast<int>(kind)));
  }
  return kOpKindTraits[index];
}

std::optional<OpKind> op_kind_from_name(std::string_view name) {
  for (const OpKindTraits& row : kOpKindTraits) {
    if (name == row.name) {
      return row.kind;
    }
  }
  return std::nullopt;
}

bool may_fuse(OpKind kind) {
  return op_kind_traits(kind).fuses_into_producer;
}

bool is_compute(OpKind kind) {
  const OpKindTraits& row = op_kind_traits(kind);
  return row.collective == Collective::kNone && !row.host_transfer;
}

bool is_reducing_collective(OpKind kind) {
  switch (op_kind_traits(kind).collective) {
    case Collective::kReduceScatter:
    case Collective::kAllReduce:
      return true;
    case Collective::kNone:
    case Collective::kAllGather:
    case Collective::kAllToAll:
    case Collective::kCollectivePermute:
      return false;
  }
  return false;
}

}  // namespace tpusim
