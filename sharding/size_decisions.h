// sharding/size_decisions.h: the partitioner's choices that depend on axis sizes (not only on
// which axes are larger than 1), recorded with their outcomes so that a partitioned program can be
// re-sized for another mesh (sharding/program_resize.h).
//
// The partitioner reads a mesh through its axis sizes. Most of what it does depends only on which
// axes are larger than 1: the rules drop the others (LogicalAxisRules::shard_dims), and layouts,
// collectives and slices are lists of axes. A few choices compare sizes:
//   - an einsum computes an output dim split (or slices an operand and reduces the output) rather
//     than gathering the operand when the output is the smaller (partition_einsum.cpp: bytes of two
//     local tensors);
//   - attention keeps the kv heads split only when the split divides them (partition_attention);
//   - a sum of two reductions runs as one reduction of their sum only when the two partial sums
//     have the same local shape (reassociate_reductions.cpp).
// Each is kept here with its outcome; MoE routing, which sizes its buffers from the tokens, is not
// covered and marks the program as not resizable.
//
// Example:
//   SizeDecisions decisions;
//   decisions.bytes_less(2.0, output, operand, true);  // 2 x bytes(output) < bytes(operand) held
//   decisions.divides(8, (1U << tensor_axis), false);  // 8 kv heads did not split evenly
#pragma once

#include <cstdint>
#include <vector>

#include "model/ir/tensor.h"

namespace tpusim {

struct SizeDecision {
  enum class Kind : uint8_t {
    kBytesLess,    // factor x bytes(a) < bytes(b), a and b local tensors of the program
    kDivides,      // value % (product of the sizes of `axes`) == 0
    kShapesEqual,  // the local dims of a and b have equal sizes
  };
  Kind kind = Kind::kBytesLess;
  bool outcome = false;
  double factor = 1;
  TensorId a = -1;
  TensorId b = -1;
  int64_t value = 0;
  uint32_t axes = 0;  // bit per mesh axis index

  bool operator==(const SizeDecision&) const = default;
};

struct SizeDecisions {
  std::vector<SizeDecision> recorded;
  // False when the partitioner made a size-dependent choice that is not recorded (MoE routing).
  bool resizable = true;

  void bytes_less(double factor, TensorId a, TensorId b, bool outcome) {
    record({SizeDecision::Kind::kBytesLess, outcome, factor, a, b, 0, 0});
  }
  void divides(int64_t value, uint32_t axes, bool outcome) {
    record({SizeDecision::Kind::kDivides, outcome, 1, -1, -1, value, axes});
  }
  void shapes_equal(TensorId a, TensorId b, bool outcome) {
    record({SizeDecision::Kind::kShapesEqual, outcome, 1, a, b, 0, 0});
  }

 private:
  // The same choice asked again in a row (an einsum compares the same two tensors once per axis)
  // adds nothing: every re-size checks each record.
  void record(const SizeDecision& decision) {
    if (recorded.empty() || !(recorded.back() == decision)) {
      recorded.push_back(decision);
    }
  }
};

}  // namespace tpusim
