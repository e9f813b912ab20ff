// The performance engine's unit models against hand-computed cases, the scheduler's overlap rules
// on small programs, and step-level properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/error.h"
#include "hw/slice.h"
#include "model/config.h"
#include "model/ir/op_kind_traits.h"
#include "model/maxtext_keys.h"
#include "sharding/step_program.h"
#include "sim/estimate/estimate.h"
#include "sim/perf/collective_cost.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/step_simulator.h"
#include "sim/perf/timeline.h"
#include "support/timing_variants.h"

namespace tpusim {
namespace {

const ChipSpec& chip(const char* name) {
  return HardwareCatalog::builtin().chip(name);
}

Graph matmul_graph(int64_t m, int64_t k, int64_t n, DType dtype = DType::kBF16) {
  Graph graph;
  const int region = graph.add_region("r", 1, Phase::kForward);
  const TensorId lhs = graph.add_tensor("x", {Dim{"m", m, ""}, Dim{"k", k, ""}}, dtype,
                                        TensorKind::kActivation, region);
  const TensorId rhs = graph.add_tensor("w", {Dim{"k", k, ""}, Dim{"n", n, ""}}, dtype,
                                        TensorKind::kActivation, region);
  const TensorId out = graph.add_tensor("y", {Dim{"m", m, ""}, Dim{"n", n, ""}}, dtype,
                                        TensorKind::kActivation, region);
  OpAttrs attrs;
  attrs.contracted = {"k"};
  graph.add_op(OpKind::kEinsum, "mm", {lhs, rhs}, {out}, attrs, region);
  return graph;
}

OpCost cost_of(const Graph& graph, const ChipSpec& spec) {
  CostContext context;
  context.chip = &spec;
  return cost_compute_op(graph, graph.ops().front(), context, false);
}

// Large aligned matmul: time = FLOPs / (peak x achievable) + pipeline fill/drain + overhead.
TEST(OpCost, AlignedMatmulIsMxuBound) {
  const ChipSpec& v5e = chip("v5e");
  const OpCost cost = cost_of(matmul_graph(8192, 8192, 8192), v5e);
  const double expected = 2.0 * 8192.0 * 8192 * 8192 / (197e12 * v5e.mxu_achievable_fraction) +
                          v5e.mxu_fill_drain_cycles / (v5e.clock_ghz * 1e9) +
                          v5e.op_overhead_us * 1e-6;
  EXPECT_NEAR(cost.seconds / expected, 1.0, 1e-9);
  EXPECT_EQ(cost.bound, CostCategory::kMxu);
}

// Padding: on a 256x256 MXU (v6e), a contraction of 128 uses half the array.
TEST(OpCost, PaddingToTheArray) {
  EXPECT_DOUBLE_EQ(mxu_padding_efficiency(chip("v6e"), 4096, 128, 4096), 0.5);
  EXPECT_DOUBLE_EQ(mxu_padding_efficiency(chip("v5e"), 4096, 128, 4096), 1.0);
  // Rows pad to 8-row passes: 12 rows use 12/16.
  EXPECT_DOUBLE_EQ(mxu_padding_efficiency(chip("v5e"), 12, 128, 128), 0.75);
  const OpCost aligned = cost_of(matmul_graph(8192, 256, 8192), chip("v6e"));
  const OpCost padded = cost_of(matmul_graph(8192, 128, 8192), chip("v6e"));
  EXPECT_NEAR(padded.mxu_seconds / aligned.mxu_seconds, 1.0, 1e-9);  // half the work, half the rate
}

// A thin matmul (one row block) is HBM-bound: it must read the whole weight.
TEST(OpCost, ThinMatmulIsHbmBound) {
  const ChipSpec& v5p = chip("v5p");
  const OpCost cost = cost_of(matmul_graph(8, 8192, 8192), v5p);
  EXPECT_EQ(cost.bound, CostCategory::kHbm);
  const double bytes = 2.0 * (8 * 8192 + 8192.0 * 8192 + 8 * 8192);
  EXPECT_NEAR(cost.hbm_seconds / (bytes / (2765e9 * v5p.hbm_achievable_fraction)), 1.0, 1e-9);
}

// VMEM blocking: operands larger than VMEM are re-read once per block of the other operand.
TEST(OpCost, BlockingChargesReReads) {
  const ChipSpec& v4 = chip("v4");  // 16 MiB VMEM
  const double small = blocked_matmul_hbm_bytes(v4, 1024, 1024, 1024, 2, 2, 2);
  EXPECT_DOUBLE_EQ(small, 3 * 1024.0 * 1024 * 2);
  const double big = blocked_matmul_hbm_bytes(v4, 65536, 8192, 65536, 2, 2, 2);
  EXPECT_GT(big, 3.0 * 65536 * 8192 * 2);  // re-reads
}

// Collectives against docs/reference/hardware.md §2.
TEST(CollectiveCost, AllGatherOnWrappedAndOpenRings) {
  const Config config = Config::load(
      "", {"compile_topology=v5e-256", "ici_fsdp_parallelism=16", "ici_data_parallelism=-1"});
  const Slice slice = parse_slice("v5e-256");
  const DeviceMesh mesh = place_mesh(resolve_mesh(config, slice), slice);
  const ChipSpec& v5e = *slice.chip;
  const double link = v5e.ici_link_bandwidth_uni_gbps * 1e9 * v5e.ici_achievable_fraction;
  const double bytes = 64e6;
  const CollectiveTime wrapped = collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, slice);
  // Axis of 16 wraps: bidirectional ring, T = (N-1)/N V / (2 W) + launch.
  EXPECT_NEAR(wrapped.seconds, 15.0 / 16 * bytes / (2 * link) + v5e.collective_launch_us * 1e-6,
              1e-9);
  const Config open_config = Config::load(
      "", {"compile_topology=v5e-32", "ici_fsdp_parallelism=4", "ici_data_parallelism=-1"});
  const Slice open_slice = parse_slice("v5e-32");  // 4x8: no wraparound
  const DeviceMesh open_mesh = place_mesh(resolve_mesh(open_config, open_slice), open_slice);
  const CollectiveTime open =
      collective_time(OpKind::kAllGather, bytes, {"fsdp"}, open_mesh, open_slice);
  EXPECT_NEAR(open.seconds, 3.0 / 4 * bytes / link + v5e.collective_launch_us * 1e-6, 1e-9);
  // All-reduce = reduce-scatter + all-gather; all-to-all a quarter of an all-gather (wrapped).
  const CollectiveTime reduce = collective_time(OpKind::kAllReduce, bytes, {"fsdp"}, mesh, slice);
  EXPECT_NEAR(reduce.seconds - v5e.collective_launch_us * 1e-6,
              2 * (wrapped.seconds - v5e.collective_launch_us * 1e-6), 1e-9);
  const CollectiveTime exchange = collective_time(OpKind::kAllToAll, bytes, {"fsdp"}, mesh, slice);
  EXPECT_NEAR(exchange.seconds - v5e.collective_launch_us * 1e-6,
              (wrapped.seconds - v5e.collective_launch_us * 1e-6) / 4, 1e-9);
}

// Mesh axes that split one physical axis share its links: a group over all of them is one ring
// over the positions they cover together, timed as a single mesh axis laid on the same positions
// (a group over fsdp 2 x tensor 2 x expert 4 of a 16-long wrapped axis is the wrapped 16-ring,
// not three rings whose links add up to more than the axis has).
TEST(CollectiveCost, MeshAxesSplittingOnePhysicalAxisShareItsLinks) {
  const double bytes = 64e6;
  auto time_of = [&](const std::string& topology, const std::vector<std::string>& mesh_keys,
                     const std::vector<std::string>& group) {
    std::vector<std::string> keys = {"compile_topology=" + topology};
    keys.insert(keys.end(), mesh_keys.begin(), mesh_keys.end());
    const Slice slice = parse_slice(topology);
    const DeviceMesh mesh = place_mesh(resolve_mesh(Config::load("", keys), slice), slice);
    return collective_time(OpKind::kAllGather, bytes, group, mesh, slice).seconds;
  };
  const ChipSpec& v5e = chip("v5e");
  const double link = v5e.ici_link_bandwidth_uni_gbps * 1e9 * v5e.ici_achievable_fraction;
  const double launch = v5e.collective_launch_us * 1e-6;
  // v5e-256 is 16x16 with wraparound: the 16-ring is bidirectional, T = 15/16 V / (2 W).
  const double split = time_of("v5e-256",
                               {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2",
                                "ici_expert_parallelism=4", "ici_data_parallelism=16"},
                               {"fsdp", "tensor", "expert"});
  EXPECT_NEAR(split, 15.0 / 16 * bytes / (2 * link) + launch, 1e-9);
  EXPECT_DOUBLE_EQ(
      split, time_of("v5e-256", {"ici_fsdp_parallelism=16", "ici_data_parallelism=16"}, {"fsdp"}));
  // v5e-32 is 4x8 without wraparound: fsdp 2 x tensor 2 on the 4-long axis is one open line of
  // 4, T = 3/4 V / W.
  const double line = time_of(
      "v5e-32", {"ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "ici_data_parallelism=8"},
      {"fsdp", "tensor"});
  EXPECT_NEAR(line, 3.0 / 4 * bytes / link + launch, 1e-9);
}

TEST(CollectiveCost, GpuNodeGathersThroughTheSwitchAndNodesOverInfiniBand) {
  // 8 x H100 behind NVSwitch: every GPU sends and receives on its 18 links at once, so an
  // all-gather of V over the 8 takes 7/8 V / (18 x 25 GB/s x achievable), as [SB-g] writes it.
  const Slice node = parse_slice("a3");
  const ChipSpec& h100 = *node.chip;
  const DeviceMesh mesh = place_mesh(
      resolve_mesh(
          Config::load("", {"hardware=gpu", "compile_topology=a3", "ici_fsdp_parallelism=8"}),
          node),
      node);
  const double bytes = 512e6;
  const double nvlink = 18 * 25e9 * h100.ici_achievable_fraction;
  const double launch = h100.collective_launch_us * 1e-6;
  const CollectiveTime gather = collective_time(OpKind::kAllGather, bytes, {"fsdp"}, mesh, node);
  EXPECT_NEAR(gather.seconds, 7.0 / 8 * bytes / nvlink + launch, 1e-12);
  // A switch gives a 4-GPU group the same per-GPU bandwidth (no torus hops to share).
  const DeviceMesh half = place_mesh(
      resolve_mesh(Config::load("", {"hardware=gpu", "compile_topology=a3",
                                     "ici_fsdp_parallelism=4", "ici_data_parallelism=2"}),
                   node),
      node);
  EXPECT_NEAR(collective_time(OpKind::kAllGather, bytes, {"fsdp"}, half, node).seconds,
              3.0 / 4 * bytes / nvlink + launch, 1e-12);
  // All-to-all through the switch: each GPU sends 7/8 of V at its link bandwidth.
  EXPECT_NEAR(collective_time(OpKind::kAllToAll, bytes, {"fsdp"}, mesh, node).seconds,
              gather.seconds, 1e-12);
  // 8 nodes: FSDP over 64 GPUs gathers over NVLink, then V/8 per GPU over its 50 GB/s NIC.
  const Slice nodes = parse_slice("a3", 8);
  const DeviceMesh cluster = place_mesh(
      resolve_mesh(
          Config::load("", {"hardware=gpu", "compile_topology=a3", "compile_topology_num_slices=8",
                            "ici_fsdp_parallelism=8", "dcn_fsdp_parallelism=8"}),
          nodes),
      nodes);
  const CollectiveTime wide = collective_time(OpKind::kAllGather, bytes, {"fsdp"}, cluster, nodes);
  const double nic = 50e9 * h100.dcn_achievable_fraction;
  EXPECT_NEAR(wide.ici_seconds, 7.0 / 8 * bytes / nvlink, 1e-12);
  EXPECT_NEAR(wide.dcn_seconds, 7.0 / 8 * (bytes / 8) / nic, 1e-12);
}

TEST(CollectiveCost, LatencyBoundSmallMessages) {
  const Config config = Config::load(
      "", {"compile_topology=v5e-256", "ici_fsdp_parallelism=16", "ici_data_parallelism=-1"});
  const Slice slice = parse_slice("v5e-256");
  const DeviceMesh mesh = place_mesh(resolve_mesh(config, slice), slice);
  const CollectiveTime tiny = collective_time(OpKind::kAllGather, 256, {"fsdp"}, mesh, slice);
  // 8 hops of 1 us each, plus the launch cost.
  EXPECT_NEAR(tiny.seconds, 8e-6 + slice.chip->collective_launch_us * 1e-6, 1e-12);
}

TEST(CollectiveCost, ChipletPairUsesD2dAndSlicesUseDcn) {
  const Slice v7x = parse_slice("tpu7x-128");
  const DeviceMesh tensor = place_mesh(
      resolve_mesh(Config::load("", {"compile_topology=tpu7x-128", "ici_tensor_parallelism=2"}),
                   v7x),
      v7x);
  const CollectiveTime d2d = collective_time(OpKind::kAllGather, 1e8, {"tensor"}, tensor, v7x);
  EXPECT_EQ(d2d.link, LinkKind::kD2d);
  EXPECT_NEAR(d2d.ici_seconds, 0.5 * 1e8 / (v7x.chip->d2d_bandwidth_uni_gbps * 1e9), 1e-12);
  const Slice multi = parse_slice("v5e-256", 4);
  const DeviceMesh dcn = place_mesh(resolve_mesh(Config::load("", {}), multi), multi);
  const CollectiveTime across = collective_time(OpKind::kAllReduce, 1e8, {"data"}, dcn, multi);
  EXPECT_EQ(across.link, LinkKind::kDcn);
  const double bandwidth =
      multi.chip->dcn_bandwidth_per_chip_gbps * 1e9 * multi.chip->dcn_achievable_fraction;
  // Two rings of 3 steps across the 4 slices, each step's latency on top of its bytes.
  EXPECT_NEAR(across.dcn_seconds,
              2 * 3 * multi.chip->dcn_latency_us * 1e-6 + 2 * 0.75 * 1e8 / bandwidth, 1e-9);
}

// --- The scheduler's overlap rules on hand-built programs. -----------------------------------

struct TinyProgram {
  StepProgram program;
  double compute_a = 0;  // seconds of the first matmul
  double compute_b = 0;
  double gather = 0;
};

// region: a = x @ w1; [gather w2 over fsdp]; b = a @ gathered(w2) (the gather is weight-only,
// so the scheduler may prefetch it) or, with `activation`, b = gathered(a) @ w1.
TinyProgram tiny_program(int64_t gather_rows, bool activation) {
  TinyProgram tiny;
  StepProgram& program = tiny.program;
  const Config config = Config::load("", {"compile_topology=v5p-8"});
  program.slice = parse_slice("v5p-8");
  program.mesh = place_mesh(resolve_mesh(config, program.slice), program.slice);
  Graph& graph = program.program.graph;
  const int region = graph.add_region("r", 1, Phase::kForward);
  auto tensor = [&](const char* name, int64_t rows, int64_t cols, TensorKind kind) {
    return graph.add_tensor(name, {Dim{"m", rows, ""}, Dim{"k", cols, ""}}, DType::kBF16, kind,
                            region);
  };
  const TensorId x = tensor("x", 8192, 4096, TensorKind::kInput);
  const TensorId w1 = graph.add_tensor("w1", {Dim{"k", 4096, ""}, Dim{"n", 4096, ""}}, DType::kBF16,
                                       TensorKind::kParameter, region);
  const TensorId a = graph.add_tensor("a", {Dim{"m", 8192, ""}, Dim{"n", 4096, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  OpAttrs contract_k;
  contract_k.contracted = {"k"};
  graph.add_op(OpKind::kEinsum, "a", {x, w1}, {a}, contract_k, region);
  OpAttrs gather_attrs;
  gather_attrs.mesh_axes = {"fsdp"};
  gather_attrs.group_size = 4;
  TensorId b_input = a;
  TensorId b_weight = -1;
  if (activation) {
    const TensorId gathered =
        graph.add_tensor("a_full", {Dim{"m", gather_rows, ""}, Dim{"n", 4096, ""}}, DType::kBF16,
                         TensorKind::kActivation, region);
    graph.add_op(OpKind::kAllGather, "gather a", {a}, {gathered}, gather_attrs, region);
    b_input = gathered;
    b_weight = graph.add_tensor("w3", {Dim{"n", 4096, ""}, Dim{"p", 4096, ""}}, DType::kBF16,
                                TensorKind::kParameter, region);
  } else {
    const TensorId w2 = graph.add_tensor("w2", {Dim{"n", gather_rows / 4, ""}, Dim{"p", 4096, ""}},
                                         DType::kBF16, TensorKind::kParameter, region);
    b_weight = graph.add_tensor("w2_full", {Dim{"n", gather_rows, ""}, Dim{"p", 4096, ""}},
                                DType::kBF16, TensorKind::kActivation, region);
    graph.add_op(OpKind::kAllGather, "gather w2", {w2}, {b_weight}, gather_attrs, region);
  }
  const TensorId b = graph.add_tensor("b", {Dim{"m", 8192, ""}, Dim{"p", 4096, ""}}, DType::kBF16,
                                      TensorKind::kActivation, region);
  OpAttrs contract_n;
  contract_n.contracted = {"n"};
  graph.add_op(OpKind::kEinsum, "b", {b_input, b_weight}, {b}, contract_n, region);
  CostContext context;
  context.chip = program.slice.chip;
  tiny.compute_a = cost_compute_op(graph, graph.ops()[0], context, false).seconds;
  tiny.compute_b = cost_compute_op(graph, graph.ops()[2], context, false).seconds;
  const Op& gather = graph.ops()[1];
  tiny.gather = collective_time(OpKind::kAllGather,
                                static_cast<double>(graph.tensor(gather.outputs[0]).bytes()),
                                {"fsdp"}, program.mesh, program.slice)
                    .seconds;
  return tiny;
}

PerfOptions plain_options(const StepProgram& program) {
  PerfOptions options;
  options.cost.chip = program.slice.chip;
  options.collective_matmul = false;
  return options;
}

TEST(Scheduler, WeightGatherFullyHiddenBehindCompute) {
  const TinyProgram tiny = tiny_program(4096, false);
  ASSERT_LT(tiny.gather, tiny.compute_a);
  const StepTiming timing = simulate_step(tiny.program, plain_options(tiny.program));
  EXPECT_NEAR(timing.step_seconds, tiny.compute_a + tiny.compute_b, 1e-12);
}

// On a chip whose collectives run on its compute units (a GPU's NCCL kernels on SMs), the compute
// beside a gather runs on the rest: a gather of g seconds hidden behind a costs g x s / (1 - s).
TEST(Scheduler, CollectiveTakesItsShareOfCompute) {
  TinyProgram tiny = tiny_program(4096, false);
  ASSERT_LT(tiny.gather, tiny.compute_a);
  ChipSpec shared = *tiny.program.slice.chip;
  shared.collective_compute_share = 0.25;
  tiny.program.slice.chip = &shared;
  PerfOptions options = plain_options(tiny.program);
  options.cost.chip = tiny.program.slice.chip;
  const StepTiming timing = simulate_step(tiny.program, options);
  const double lost = tiny.gather * 0.25 / 0.75;
  EXPECT_NEAR(timing.step_seconds, tiny.compute_a + lost + tiny.compute_b, 1e-12);
  EXPECT_NEAR(timing.breakdown.at(BreakdownKey::of(BreakdownKind::kComputeSharedWithCollectives)),
              lost, 1e-12);
}

TEST(Scheduler, WeightGatherPartlyExposed) {
  const TinyProgram tiny =
      tiny_program(int64_t{4096} * 64, false);  // a huge weight: gather > compute_a
  ASSERT_GT(tiny.gather, tiny.compute_a);
  const StepTiming timing = simulate_step(tiny.program, plain_options(tiny.program));
  // The gather starts with the step (it depends only on a parameter); b waits for its end.
  EXPECT_NEAR(timing.step_seconds, tiny.gather + tiny.compute_b, 1e-12);
  EXPECT_NEAR(timing.breakdown.at(BreakdownKey::exposed(LinkKind::kIci, {"fsdp"})),
              tiny.gather - tiny.compute_a, 1e-12);
}

TEST(Scheduler, ActivationCollectiveFullyExposed) {
  const TinyProgram tiny = tiny_program(8192, true);
  const StepTiming timing = simulate_step(tiny.program, plain_options(tiny.program));
  // b needs a, gathered: nothing to overlap with.
  EXPECT_NEAR(timing.step_seconds, tiny.compute_a + tiny.gather + tiny.compute_b, 1e-12);
  EXPECT_NEAR(timing.breakdown.at(BreakdownKey::exposed(LinkKind::kIci, {"fsdp"})), tiny.gather,
              1e-12);
}

TEST(Scheduler, CollectiveMatmulHidesActivationGather) {
  const TinyProgram tiny = tiny_program(8192, true);
  PerfOptions options = plain_options(tiny.program);
  options.collective_matmul = true;
  const StepTiming timing = simulate_step(tiny.program, options);
  // b starts on the first of 4 chunks and ends no earlier than the gather.
  const double expected = tiny.compute_a + std::max(tiny.gather / 4 + tiny.compute_b, tiny.gather);
  EXPECT_NEAR(timing.step_seconds, expected, 1e-12);
}

// A link takes the earliest gap that fits at or after the op is ready.
TEST(Timeline, FillsGapsInOrder) {
  Timeline link;
  EXPECT_EQ(link.place(0.0, 2.0), 0.0);  // [0, 2)
  EXPECT_EQ(link.place(1.0, 1.0), 2.0);  // waits: [2, 3)
  EXPECT_EQ(link.place(5.0, 1.0), 5.0);  // [5, 6)
  EXPECT_EQ(link.place(3.0, 1.0), 3.0);  // fits the gap [3, 5)
  EXPECT_EQ(link.place(3.5, 2.0), 6.0);  // [4, 5) is too short: after [5, 6)
  EXPECT_EQ(link.place(4.0, 1.0), 4.0);  // [4, 5) fits exactly
  link.shift(10.0);
  EXPECT_EQ(link.place(0.0, 1.0), 0.0);    // everything moved later
  EXPECT_EQ(link.place(10.5, 1.0), 18.0);  // busy [10, 18) after the shift
  EXPECT_EQ(link.busy_within(9.0, 12.0), 2.0);
  EXPECT_EQ(link.busy_within(18.5, 30.0), 0.5);  // [18, 19)
  EXPECT_EQ(link.busy_within(20.0, 30.0), 0.0);
}

// record_details = false computes the same times and FLOPs, without breakdown, trace or profile.
TEST(Scheduler, LeanRunMatchesDetailedRun) {
  for (const char* slice : {"v5p-16", "tpu7x-16"}) {
    const Config config =
        Config::load("", {"model_name=llama3.1-8b", std::string("compile_topology=") + slice,
                          "compile_topology_num_slices=2", "max_target_length=2048",
                          "remat_policy=qkv_proj_offloaded", "ici_tensor_parallelism=2"});
    const StepProgram program = build_step_program(config);
    PerfOptions options = perf_options_from_config(config, *program.slice.chip);
    const StepTiming detailed = simulate_step(program, options);
    options.record_details = false;
    const StepTiming lean = simulate_step(program, options);
    EXPECT_EQ(lean.step_seconds, detailed.step_seconds) << slice;
    EXPECT_EQ(lean.microbatch_seconds, detailed.microbatch_seconds) << slice;
    EXPECT_EQ(lean.optimizer_seconds, detailed.optimizer_seconds) << slice;
    EXPECT_EQ(lean.hardware_matmul_flops, detailed.hardware_matmul_flops) << slice;
    EXPECT_FALSE(detailed.breakdown.empty());
    EXPECT_FALSE(detailed.trace.empty());
    EXPECT_FALSE(detailed.profile.empty());
    EXPECT_TRUE(lean.breakdown.empty());
    EXPECT_TRUE(lean.trace.empty());
    EXPECT_TRUE(lean.profile.empty());
  }
}

// A lane of the trace is one resource (a link and its mesh axes, a SparseCore queue), which serves
// one op at a time: no two events on a lane overlap. Two scheduling faults showed as overlaps: the
// first backward iteration's incoming gradient counted as ready at 0 (the loop's entry carry was
// dropped for its own), and a parameter's gather slipping into link time freed at the step's
// start when the forward loop's iterations were extrapolated.
TEST(Scheduler, NoTraceLaneServesTwoOpsAtOnce) {
  const std::vector<std::vector<std::string>> configs = {
      {"model_name=llama3.1-405b", "compile_topology=tpu7x-256", "ici_fsdp_parallelism=64",
       "ici_tensor_parallelism=4"},
      {"model_name=llama2-7b", "compile_topology=v5e-16", "compile_topology_num_slices=4",
       "per_device_batch_size=2"},
      {"model_name=llama3.1-8b", "compile_topology=v5p-16", "compile_topology_num_slices=2",
       "max_target_length=2048", "remat_policy=qkv_proj_offloaded", "ici_tensor_parallelism=2"}};
  for (const std::vector<std::string>& overrides : configs) {
    const Config config = Config::load("", overrides);
    const StepProgram program = build_step_program(config);
    const PerfOptions options = perf_options_from_config(config, *program.slice.chip);
    const StepTiming timing = simulate_step(program, options);
    ASSERT_FALSE(timing.trace.empty());
    std::map<int, std::vector<const TraceEvent*>> by_lane;
    for (const TraceEvent& event : timing.trace) {
      by_lane[event.lane].push_back(&event);
    }
    for (auto& [lane, events] : by_lane) {
      std::sort(events.begin(), events.end(),
                [](const TraceEvent* a, const TraceEvent* b) { return a->start < b->start; });
      for (size_t i = 1; i < events.size(); ++i) {
        const TraceEvent& before = *events[i - 1];
        const TraceEvent& after = *events[i];
        EXPECT_GE(after.start, before.start + before.duration - 1e-9)
            << overrides[0] << ": lane " << lane << ", " << before.name << " (" << before.region
            << ") and " << after.name << " (" << after.region << ")";
      }
    }
  }
}

// --- Step-level properties. --------------------------------------------------------------

Estimate estimate_for(const std::vector<std::string>& overrides) {
  return estimate_config(Config::load("", overrides));
}

// With a fixed per-device batch, more chips never make the forward/backward faster beyond the
// work that really shrinks per device (each device casts and updates only its shard of the
// weights: under 2% here), and throughput per chip never beats the ideal: the MXU roofline of the
// FLOPs each chip executes.
TEST(StepTime, MoreChipsNeverBeatTheIdeal) {
  double previous = 0;
  for (const char* slice : {"v5p-8", "v5p-32", "v5p-128", "v5p-512"}) {
    const Estimate estimate =
        estimate_for({"model_name=llama2-7b", std::string("compile_topology=") + slice,
                      "per_device_batch_size=2", "max_target_length=2048"});
    EXPECT_GE(estimate.timing.microbatch_seconds, previous * 0.98) << slice;
    previous = estimate.timing.microbatch_seconds;
    const double roofline_seconds =
        estimate.timing.hardware_matmul_flops / chip("v5p").peak_bf16_flops_per_device();
    const double ideal_tokens_per_chip = 2.0 * 2048 / roofline_seconds;
    EXPECT_LT(estimate.tokens_per_s_per_chip, ideal_tokens_per_chip) << slice;
  }
}

TEST(StepTime, ScanLayersMakeTimeLinearInDepth) {
  const double thirty_two =
      estimate_for({"model_name=llama2-7b", "compile_topology=v5p-8", "per_device_batch_size=1"})
          .step_seconds;
  const double sixty_four =
      estimate_for({"model_name=llama2-7b", "compile_topology=v5p-8", "per_device_batch_size=1",
                    "override_model_config=true", "base_num_decoder_layers=64"})
          .step_seconds;
  EXPECT_GT(sixty_four / thirty_two, 1.7);
  EXPECT_LT(sixty_four / thirty_two, 2.05);
}

TEST(StepTime, MetricsAreConsistent) {
  const Estimate estimate = estimate_for({"model_name=llama3.1-8b", "compile_topology=tpu7x-16",
                                          "per_device_batch_size=2", "max_target_length=4096"});
  const ChipSpec& v7x = chip("v7x");
  EXPECT_NEAR(estimate.mfu,
              estimate.model_tflop_per_device_step / estimate.step_seconds /
                  v7x.mfu_peak_bf16_tflops_per_device,
              1e-12);
  EXPECT_NEAR(estimate.tflops_per_chip, 2 * estimate.tflops_per_device, 1e-9);  // 2 devices/chip
  EXPECT_NEAR(estimate.tokens_per_s_per_chip * 8, estimate.tokens_per_s, 1e-6);
  EXPECT_GT(estimate.mfu, 0.05);
  EXPECT_LT(estimate.mfu, 1.0);
  double accounted = 0;
  for (const auto& [key, seconds] : estimate.timing.breakdown) {
    accounted += seconds;
  }
  EXPECT_NEAR(accounted / estimate.step_seconds, 1.0, 0.02);
}

TEST(StepTime, GradientAccumulationRepeatsMicrobatches) {
  const Estimate one =
      estimate_for({"model_name=llama2-7b", "compile_topology=v5p-8", "per_device_batch_size=2"});
  const Estimate four = estimate_for({"model_name=llama2-7b", "compile_topology=v5p-8",
                                      "per_device_batch_size=2", "gradient_accumulation_steps=4"});
  EXPECT_NEAR(four.step_seconds - four.timing.optimizer_seconds,
              4 * (one.step_seconds - one.timing.optimizer_seconds), 0.01 * four.step_seconds);
  EXPECT_NEAR(four.tokens_per_s_per_chip / one.tokens_per_s_per_chip, 1.0, 0.05);
}

TEST(StepSimulator, EveryRunEqualsAFreshSimulation) {
  // One prepared program timed under a sequence of options (cost contexts, SparseCore offload,
  // collective matmul, another placement of the same mesh) gives what simulate_step gives each.
  Config config = Config::load(
      "", {"model_name=llama2-7b", "compile_topology=tpu7x-16", "ici_data_parallelism=2",
           "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2", "max_target_length=2048"});
  StepProgram program = build_step_program(config);
  const PerfOptions base = perf_options_from_config(config, *program.slice.chip);
  const DeviceMesh data_first =
      place_mesh(program.mesh.shape, program.slice, {mesh_axis_index("data")});
  StepSimulator simulator(program);
  int runs = 0;
  for (const bool swap_mesh : {false, true}) {
    if (swap_mesh) {
      program.mesh = data_first;
    }
    for (const bool flash : {true, false, true}) {
      for (const testing::TimingVariant& variant : testing::timing_variants(base)) {
        PerfOptions options = variant.options;
        options.cost.flash_attention = flash;
        options.cost.block_q = flash ? 1024 : options.cost.block_q;
        options.record_details = options.collective_matmul;
        const StepTiming prepared = simulator.run(options);
        const StepTiming fresh = simulate_step(program, options);
        EXPECT_EQ(prepared.step_seconds, fresh.step_seconds);
        EXPECT_EQ(prepared.hardware_matmul_flops, fresh.hardware_matmul_flops);
        EXPECT_EQ(prepared.breakdown, fresh.breakdown);
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 24);
}

// Contexts that differ only in the attention kernel and its blocks cost every other op alike
// (StepSimulator's analysis costs those once for all such contexts); any other field tells them
// apart.
TEST(OpCost, OnlyAttentionReadsTheAttentionFields) {
  Config config = Config::load("", {"model_name=llama2-7b", "compile_topology=v5p-8",
                                    "ici_fsdp_parallelism=4", "max_target_length=2048"});
  const StepProgram program = build_step_program(config);
  const CostContext base = perf_options_from_config(config, *program.slice.chip).cost;
  CostContext other = base;
  other.flash_attention = !base.flash_attention;
  other.block_q = base.block_q * 2;
  other.block_kv_dkv_compute = base.block_kv_dkv_compute / 2;
  other.local_block_kv = 256;
  ASSERT_TRUE(same_outside_attention(base, other));
  CostContext quantized = base;
  quantized.fp8_matmuls = !base.fp8_matmuls;
  EXPECT_FALSE(same_outside_attention(base, quantized));
  CostContext slower = base;
  slower.program_efficiency = base.program_efficiency * 0.5;
  EXPECT_FALSE(same_outside_attention(base, slower));
  const Graph& graph = program.program.graph;
  int compared = 0;
  int attention = 0;
  for (const Op& op : graph.ops()) {
    if (!is_compute(op.kind)) {
      continue;
    }
    const double here = cost_compute_op(graph, op, base, false).seconds;
    const double there = cost_compute_op(graph, op, other, false).seconds;
    if (op_kind_traits(op.kind).attention) {
      attention += here != there ? 1 : 0;  // the fields do change attention
      continue;
    }
    EXPECT_EQ(here, there) << op.name;
    ++compared;
  }
  EXPECT_GT(compared, 20);
  EXPECT_GT(attention, 0);
}

// local_sa_block_* give the sliding-window layers their own splash blocks. gemma3-4b at 8192
// tokens, window 1024: with 2048 blocks a local layer computes 7 blocks of 2048^2 (q block 0 one,
// the others two) = 28 units of 1024^2; with 1024 blocks 15 units (8 q blocks, 2 each but the
// first). Global layers keep sa_block_*. A value other than None or a whole number exits 2.
TEST(SplashBlocks, LocalLayersTakeTheirOwnBlocks) {
  const std::vector<std::string> base = {"model_name=gemma3-4b",    "compile_topology=v6e-8",
                                         "max_target_length=8192",  "per_device_batch_size=1",
                                         "sa_block_q=2048",         "sa_block_kv=2048",
                                         "sa_block_kv_compute=2048"};
  auto attention_seconds = [](const Estimate& estimate, bool local) {
    double seconds = 0;
    for (const OpProfile& op : estimate.timing.profile) {
      if (op.op == "attention attention" && op.region == (local ? "local_layer" : "layer")) {
        seconds += op.seconds;
      }
    }
    return seconds;
  };
  std::vector<std::string> small = base;
  small.insert(small.end(), {"local_sa_block_q=1024", "local_sa_block_kv=1024",
                             "local_sa_block_kv_compute=1024"});
  const Estimate same = estimate_config(Config::load("", base));
  const Estimate local = estimate_config(Config::load("", small));
  EXPECT_NEAR(attention_seconds(local, true) / attention_seconds(same, true), 15.0 / 28.0, 0.02);
  EXPECT_DOUBLE_EQ(attention_seconds(local, false), attention_seconds(same, false));
  std::vector<std::string> bad = base;
  bad.emplace_back("local_sa_block_kv=big");
  try {
    Config::load("", bad);
    ADD_FAILURE() << "local_sa_block_kv=big was accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("local_sa_block_kv"), std::string::npos);
  }
}

// use_iota_embed: MaxText's Embed looks tokens up as one_hot(tokens, vocab) . table, and the
// table's gradient is one_hot^T . dy: 2.T.V.D MXU FLOPs each, outside MaxText's count (MFU is
// unchanged), with the same values as the gather. llama3-8b on v5p-8 (fsdp 4, the table
// gathered whole): T = 2048 tokens per device, V = 128256, D = 4096.
TEST(IotaEmbedding, OneHotMatmulsRunOnTheMxu) {
  const std::vector<std::string> base = {"model_name=llama3-8b", "compile_topology=v5p-8",
                                         "per_device_batch_size=1", "max_target_length=2048"};
  std::vector<std::string> iota = base;
  iota.emplace_back("use_iota_embed=true");
  const Estimate gather = estimate_config(Config::load("", base));
  const Estimate one_hot = estimate_config(Config::load("", iota));
  const double expected = 2 * (2.0 * 2048 * 128256 * 4096);
  EXPECT_NEAR((one_hot.flops.hardware_matmul - gather.flops.hardware_matmul) / expected, 1.0,
              1e-12);
  EXPECT_DOUBLE_EQ(one_hot.flops.model_matmul, gather.flops.model_matmul);
  EXPECT_DOUBLE_EQ(one_hot.mfu, gather.mfu * gather.step_seconds / one_hot.step_seconds);
  EXPECT_GT(one_hot.step_seconds, gather.step_seconds);
}

// Every key of tpusim's schema that configs/maxtext/base_keys.tsv classes as not read by the
// estimate ("none" or "not_modeled") really is not: set away from its default on a small MoE with
// fsdp and context parallelism, the step time, peak HBM and mesh stay bitwise the same. A key
// added to that class needs a value here.
TEST(SchemaKeysNotRead, LeaveTheEstimateUnchanged) {
  const std::map<std::string, std::string> values = {
      {"reuse_example_batch", "1"},
      {"matmul_precision", "highest"},
      {"mlp_activations_limit", "7"},
      {"dropout_rate", "0.1"},
      {"logits_dot_in_fp32", "true"},
      {"cast_logits_to_fp32", "false"},
      {"load_balance_loss_weight", "0.01"},
      {"norm_topk_prob", "true"},
      {"routed_scaling_factor", "2.5"},
      {"routed_score_func", "sigmoid"},
      {"n_routing_groups", "2"},
      {"topk_routing_group", "1"},
      {"optimizer_memory_host_offload", "true"},
      {"parameter_memory_host_offload", "true"},
      {"scan_layers", "false"},
      {"param_scan_axis", "0"},
      {"fused_qkv", "true"},
      {"fused_mlp", "true"},
      {"mesh_axes",
       "[autoregressive, expert, tensor_sequence, tensor, context_autoregressive, "
       "context_usp_ulysses, context, fsdp_transpose, fsdp, stage, data, diloco]"},
      {"data_sharding", "[[data, fsdp]]"},
      {"sharding_tolerance", "0.1"},
      {"shard_optimizer_over_data", "true"},
      {"packing", "false"},
      {"train_split", "other"},
      {"eval_split", "other"},
      {"log_period", "7"},
      {"rope_type", "yarn"},
      {"beta_fast", "16"},
      {"beta_slow", "2"},
      {"allow_split_physical_axes", "true"},
      {"sa_block_q_dkv", "1024"},
      {"sa_block_q_dq", "1024"},
      {"sa_block_kv_dq", "1024"},
      {"sa_use_fused_bwd_kernel", "true"},
      {"local_sa_block_q_dkv", "1024"},
      {"context_parallel_load_balance", "false"},
      {"context_parallel_strategy", "ring"},
  };
  const std::vector<std::string> base = {"model_name=tiny-moe", "compile_topology=v5e-4",
                                         "ici_fsdp_parallelism=2", "ici_context_parallelism=2",
                                         "max_target_length=256"};
  const Estimate reference = estimate_config(Config::load("", base));
  size_t checked = 0;
  const Config schema = Config::load("", {});
  for (const std::string& key : schema.keys()) {
    const MaxTextKey* maxtext = find_maxtext_key(key);
    if (maxtext == nullptr || maxtext->effect == MaxTextKeyEffect::kModeled) {
      continue;
    }
    const auto value = values.find(key);
    if (value == values.end()) {
      ADD_FAILURE() << key << " is classed as not read by the estimate but has no test value";
      continue;
    }
    SCOPED_TRACE(key + "=" + value->second);
    std::vector<std::string> overrides = base;
    overrides.push_back(key + "=" + value->second);
    const Estimate changed = estimate_config(Config::load("", overrides));
    EXPECT_DOUBLE_EQ(changed.step_seconds, reference.step_seconds);
    EXPECT_DOUBLE_EQ(changed.memory.peak_bytes, reference.memory.peak_bytes);
    EXPECT_EQ(changed.json["mesh"], reference.json["mesh"]);
    ++checked;
  }
  EXPECT_EQ(checked, values.size());
}

}  // namespace
}  // namespace tpusim
