// model/ir/tensor.h: a tensor of the training-step graph, with named dims.
//
// Every dim has a semantic name (used to match dims of an einsum: contract "embed" with "embed")
// and a logical axis name (the MaxText logical_axis_rules key that decides its sharding: a weight's
// embed dim is "embed", an activation's embed dim is "activation_embed").
//
// Programs copy dims often (every local tensor starts as a copy of a global one's), so a dim holds
// no heap memory of its own: its names are interned (model/ir/name.h) and the mesh axes it is split
// over are kept inline.
//
// Example:
//   x[batch:8 @activation_batch, length:2048 @activation_length, embed:4096 @activation_embed] bf16
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "model/ir/dtype.h"
#include "model/ir/name.h"

namespace tpusim {

// Mesh axes a dim is split over: inline up to 4 (MaxText's activation_batch rule names data, fsdp,
// fsdp_transpose and expert); more spill to the heap.
using DimAxes = boost::container::small_vector<Name, 4>;

struct Dim {
  Dim() = default;
  Dim(Name dim_name, int64_t dim_size, Name logical_axis)
      : name(dim_name), size(dim_size), logical(logical_axis) {}

  Name name;         // semantic: batch, length, embed, heads, kv_heads, head_dim, mlp, vocab, ...
  int64_t size = 1;  // in a per-device program: the local (shard) size, padded up
  Name logical;      // MaxText logical axis, e.g. "activation_embed" or "embed"
  // Set by the partitioner: the mesh axes this dim is split over (major to minor) and its global
  // size before splitting (0 = not partitioned, size is global).
  DimAxes sharded_over;
  int64_t global_size = 0;

  // The dim's size in the whole (unsharded) tensor.
  int64_t whole_size() const { return global_size > 0 ? global_size : size; }
};

// What a tensor is, which decides which memory category it counts in.
enum class TensorKind {
  kParameter,       // a weight (master copy, weight_dtype)
  kInput,           // tokens, targets, positions, segment ids
  kActivation,      // forward intermediate
  kGradient,        // gradient of an activation (backward intermediate)
  kParameterGrad,   // gradient of a weight
  kOptimizerState,  // Adam moments
  kScalar,          // loss and other scalars
};

const char* tensor_kind_name(TensorKind kind);

using TensorId = int;

struct Tensor {
  TensorId id = -1;
  std::string name;  // "layer/mlp/wi_0", "layer/attention/q"
  std::vector<Dim> dims;
  DType dtype = DType::kF32;
  TensorKind kind = TensorKind::kActivation;
  int region = 0;  // region that produces it (parameters: the region that owns them)
  // MaxText checkpoint name used by remat policies ("query_proj", "mlpwi_0", "context", ...), or
  // "".
  std::string remat_name;

  int64_t num_elements() const;
  int64_t bytes() const;
  // Index of the dim named `dim_name`, or -1.
  int dim_index(std::string_view dim_name) const;
  int dim_index(const Name& dim_name) const;
  int dim_index(const char* dim_name) const { return dim_index(std::string_view(dim_name)); }
  int dim_index(const std::string& dim_name) const { return dim_index(std::string_view(dim_name)); }
  // "x[batch:8,length:2048,embed:4096] bf16"; split dims show their mesh axes: "embed:256@fsdp"
  std::string describe() const;
};

}  // namespace tpusim
