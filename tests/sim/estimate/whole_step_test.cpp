// tests/sim/estimate/whole_step_test.cpp: the whole step's events (sim/estimate/whole_step.h) and
// the per-op details (sim/estimate/op_details.h) of llama3.1-70b on v6e-256, checked against
// numbers worked out another way: the breakdown's compute seconds (the scheduler's accounting),
// the layer count of the model, and an einsum's FLOPs from its shapes (2 m k n).
#include "sim/estimate/whole_step.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/config.h"
#include "sim/estimate/estimate.h"
#include "sim/estimate/op_details.h"

namespace tpusim {
namespace {

const Estimate& llama70b() {
  static const Estimate estimate =
      estimate_config(Config::load("", {"model_name=llama3.1-70b", "compile_topology=v6e-256"}));
  return estimate;
}

TEST(WholeStep, TensorCoreOpsAddUpToTheBreakdownsComputeSeconds) {
  const Estimate& estimate = llama70b();
  double compute = 0;
  for (const auto& [key, seconds] : estimate.timing.breakdown) {
    compute += key.kind == BreakdownKind::kCompute ? seconds : 0.0;
  }
  double drawn = 0;
  double simulated = 0;
  for (const TraceEvent& event : whole_step_trace(estimate)) {
    drawn += estimate.timing.lanes[static_cast<size_t>(event.lane)].kind == LaneKind::kTensorCore
                 ? event.duration
                 : 0.0;
  }
  for (const TraceEvent& event : estimate.timing.trace) {
    simulated +=
        estimate.timing.lanes[static_cast<size_t>(event.lane)].kind == LaneKind::kTensorCore
            ? event.duration
            : 0.0;
  }
  EXPECT_NEAR(drawn, compute, 1e-9 * compute);
  // The simulated iterations alone are far from it: 4 of 80 layers each way.
  EXPECT_LT(simulated, 0.2 * compute);
}

TEST(WholeStep, EveryLayerIterationIsDrawnOnce) {
  // llama3.1-70b has 80 decoder layers: the forward and the backward layer loops run 80 times
  // each, so each layer op (one per iteration) is drawn 80 times, in order, without overlap.
  std::map<std::string, int> calls;
  std::map<std::string, double> last_end;
  const Estimate& estimate = llama70b();
  for (const TraceEvent& event : whole_step_trace(estimate)) {
    if (event.region != "layer" && event.region != "layer/grad") {
      continue;
    }
    const std::string key = event.region + ": " + event.name + " on " +
                            lane_name(estimate.timing.lanes[static_cast<size_t>(event.lane)]);
    ++calls[key];
    if (last_end.contains(key)) {
      EXPECT_GE(event.start, last_end[key] - 1e-12) << key;
    }
    last_end[key] = event.start + event.duration;
  }
  EXPECT_EQ(calls["layer: mlp/wi_0 on TensorCore"], 80);
  EXPECT_EQ(calls["layer/grad: attention on TensorCore"], 80);
}

TEST(OpDetails, AnEinsumsFlopsAreTwiceItsMultiplyAdds) {
  // layer: einsum mlp/wi_0 is [batch, length, embed] x [embed, mlp] per device: 2 b l e m FLOPs.
  for (const OpDetail& op : op_details(llama70b())) {
    if (op.region == "layer" && op.op == "einsum mlp/wi_0") {
      EXPECT_EQ(op.shapes, "bf16[12,2048,8192] x bf16[8192,28672] -> bf16[12,2048,28672]");
      EXPECT_NEAR(op.flops, 2.0 * 12 * 2048 * 8192 * 28672, 1e-6 * op.flops);
      EXPECT_EQ(op.calls, 80.0);
      EXPECT_FALSE(op.recomputed);
      EXPECT_GT(op.hbm_bytes, 2.0 * 8192 * 28672);  // at least the bf16 weight, read once
      return;
    }
  }
  ADD_FAILURE() << "no layer: einsum mlp/wi_0 in the profile";
}

TEST(OpDetails, RematFullRecomputesTheForwardMatmulsInTheBackward) {
  int recomputed = 0;
  for (const OpDetail& op : op_details(llama70b())) {
    if (op.recomputed) {
      EXPECT_EQ(op.region, "layer/grad") << op.op;
      ++recomputed;
    }
  }
  EXPECT_GT(recomputed, 0);  // base.yml's remat_policy=full
}

}  // namespace
}  // namespace tpusim
