// Liveness over a hand-built two-region program; every expectation below is read off the op list
// by hand, not produced by the code under test.
//
//   region 0 "forward" (forward)            region 1 "backward" (backward of region 0)
//     op 0  a  = f(x, w)       position 0     op 4  g  = q(c', a)   position 0
//     op 1  b  = f(a)          position 1     op 5  gw = r(g, x)    position 1
//     op 2  c  = f(a, b)       position 2
//     op 3  d  = f(b)          position 3
//   carry c -> c' (region 0's c becomes region 1's c'); gw is a final (parameter) gradient;
//   x is the batch, w a parameter, m an Adam moment nobody reads.
#include "sim/memory/liveness.h"

#include <gtest/gtest.h>

#include <vector>

namespace tpusim {
namespace {

struct Program {
  Graph graph;
  TensorId x, w, m, a, b, c, d, c_in, g, gw;
};

TensorId vector_tensor(Graph& graph, const char* name, TensorKind kind, int region) {
  return graph.add_tensor(name, {{"embed", 8, "embed"}}, DType::kF32, kind, region);
}

Program two_regions() {
  Program program;
  Graph& graph = program.graph;
  const int forward = graph.add_region("forward", 1, Phase::kForward);
  const int backward = graph.add_region("backward", 1, Phase::kBackward, forward);
  Program& p = program;
  p.x = vector_tensor(graph, "x", TensorKind::kInput, forward);
  p.w = vector_tensor(graph, "w", TensorKind::kParameter, forward);
  p.m = vector_tensor(graph, "m", TensorKind::kOptimizerState, forward);
  p.a = vector_tensor(graph, "a", TensorKind::kActivation, forward);
  p.b = vector_tensor(graph, "b", TensorKind::kActivation, forward);
  p.c = vector_tensor(graph, "c", TensorKind::kActivation, forward);
  p.d = vector_tensor(graph, "d", TensorKind::kActivation, forward);
  p.c_in = vector_tensor(graph, "c_in", TensorKind::kGradient, backward);
  p.g = vector_tensor(graph, "g", TensorKind::kGradient, backward);
  p.gw = vector_tensor(graph, "gw", TensorKind::kParameterGrad, backward);
  const auto op = [&](std::vector<TensorId> inputs, TensorId output, int region) {
    graph.add_op(OpKind::kElementwise, "op", std::move(inputs), {output}, {}, region);
  };
  op({p.x, p.w}, p.a, forward);      // op 0
  op({p.a}, p.b, forward);           // op 1
  op({p.a, p.b}, p.c, forward);      // op 2
  op({p.b}, p.d, forward);           // op 3
  op({p.c_in, p.a}, p.g, backward);  // op 4
  op({p.g, p.x}, p.gw, backward);    // op 5
  graph.add_carry(p.c, p.c_in);
  return program;
}

TEST(Liveness, RolesOfTensors) {
  const Program p = two_regions();
  const Liveness liveness(p.graph, {p.gw});
  EXPECT_TRUE(liveness.is_state(p.w));
  EXPECT_TRUE(liveness.is_state(p.m));
  EXPECT_FALSE(liveness.is_state(p.x));   // the batch is not state
  EXPECT_FALSE(liveness.is_state(p.gw));  // produced by an op
  EXPECT_TRUE(liveness.is_final_gradient(p.gw));
  EXPECT_FALSE(liveness.is_final_gradient(p.g));
  EXPECT_TRUE(liveness.persistent(p.w));
  EXPECT_TRUE(liveness.persistent(p.gw));
  EXPECT_FALSE(liveness.persistent(p.a));
  EXPECT_TRUE(liveness.is_carry_source(p.c));
  EXPECT_FALSE(liveness.is_carry_source(p.c_in));
  EXPECT_TRUE(liveness.is_carry_end(p.c));
  EXPECT_TRUE(liveness.is_carry_end(p.c_in));
  EXPECT_FALSE(liveness.is_carry_end(p.a));
}

TEST(Liveness, LastReaderOverTheWholeProgram) {
  const Program p = two_regions();
  const Liveness liveness(p.graph, {p.gw});
  EXPECT_EQ(liveness.last_reader(p.x), 5);  // ops 0 and 5
  EXPECT_EQ(liveness.last_reader(p.w), 0);
  EXPECT_EQ(liveness.last_reader(p.a), 4);  // ops 1, 2 and the backward's 4
  EXPECT_EQ(liveness.last_reader(p.b), 3);
  EXPECT_EQ(liveness.last_reader(p.c_in), 4);
  EXPECT_EQ(liveness.last_reader(p.g), 5);
  EXPECT_EQ(liveness.last_reader(p.c), Liveness::kNone);  // only the carry reads it
  EXPECT_EQ(liveness.last_reader(p.d), Liveness::kNone);
  EXPECT_EQ(liveness.last_reader(p.m), Liveness::kNone);
  // Dies after its last reader, else after its producer, else never produced nor read.
  EXPECT_EQ(liveness.dies_after(p.a), 4);
  EXPECT_EQ(liveness.dies_after(p.b), 3);
  EXPECT_EQ(liveness.dies_after(p.d), 3);
  EXPECT_EQ(liveness.dies_after(p.c), 2);
  EXPECT_EQ(liveness.dies_after(p.gw), 5);
  EXPECT_EQ(liveness.dies_after(p.m), Liveness::kNone);
  EXPECT_TRUE(liveness.read_outside_own_region(p.a));  // region 1 reads it
  EXPECT_TRUE(liveness.read_outside_own_region(p.x));
  EXPECT_FALSE(liveness.read_outside_own_region(p.b));
  EXPECT_FALSE(liveness.read_outside_own_region(p.c));  // a carry is not a read
}

TEST(Liveness, LastUseInsideEachRegion) {
  const Program p = two_regions();
  const Liveness liveness(p.graph, {p.gw});
  ASSERT_EQ(liveness.region_ops(0).size(), 4u);
  ASSERT_EQ(liveness.region_ops(1).size(), 2u);
  EXPECT_EQ(liveness.region_ops(1)[0]->id, 4);
  EXPECT_EQ(liveness.last_use_in_region(p.a, 0), 2);
  EXPECT_EQ(liveness.last_use_in_region(p.a, 1), 0);
  EXPECT_EQ(liveness.last_use_in_region(p.x, 0), 0);
  EXPECT_EQ(liveness.last_use_in_region(p.x, 1), 1);
  EXPECT_EQ(liveness.last_use_in_region(p.b, 0), 3);
  EXPECT_EQ(liveness.last_use_in_region(p.b, 1), Liveness::kNone);
  EXPECT_EQ(liveness.last_use_in_region(p.d, 0), Liveness::kNone);
  // Touched at its producer (or first read): free after the last use there ...
  EXPECT_EQ(liveness.dies_after_in_region(p.a, 0, 0), 2);
  EXPECT_EQ(liveness.dies_after_in_region(p.b, 0, 1), 3);
  EXPECT_EQ(liveness.dies_after_in_region(p.c_in, 1, 0), 0);
  // ... at once when nothing there reads it, unless it is carried out (then it lives on).
  EXPECT_EQ(liveness.dies_after_in_region(p.d, 0, 3), 3);
  EXPECT_EQ(liveness.dies_after_in_region(p.c, 0, 2), Liveness::kNone);
}

}  // namespace
}  // namespace tpusim
