#include "sim/perf/step_simulator.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "model/config.h"
#include "model/ir/op_kind_traits.h"
#include "sharding/partitioner.h"
#include "sim/perf/collective_cost.h"
#include "sim/perf/step_analysis.h"
#include "sim/perf/timeline.h"

namespace tpusim {
namespace {

// Breakdown keys (compute_mxu, exposed_ici_fsdp, ...) and trace lanes as small integers: the
// scheduler adds seconds into a vector slot, and the breakdown is built once at the end. A step
// has a few dozen of each, so a linear search finds them.
template <typename Key>
class LabelTable {
 public:
  int intern(const Key& key) {
    const auto found = std::find(keys_.begin(), keys_.end(), key);
    if (found != keys_.end()) {
      return static_cast<int>(found - keys_.begin());
    }
    keys_.push_back(key);
    return static_cast<int>(keys_.size()) - 1;
  }
  const Key& key(int id) const { return keys_[static_cast<size_t>(id)]; }
  const std::vector<Key>& keys() const { return keys_; }

 private:
  std::vector<Key> keys_;
};

// Seconds by breakdown label over a part of the step. A label is `charged` once anything was
// added to it (even 0 s), which decides whether the breakdown lists it.
class LabelSeconds {
 public:
  void add(int label, double value) {
    const auto slot = static_cast<size_t>(label);
    if (slot >= seconds_.size()) {
      seconds_.resize(slot + 1, 0.0);
      charged_.resize(slot + 1, false);
    }
    seconds_[slot] += value;
    charged_[slot] = true;
  }
  void add(const LabelSeconds& other, double times) {
    for (size_t slot = 0; slot < other.seconds_.size(); ++slot) {
      if (other.charged_[slot]) {
        add(static_cast<int>(slot), other.seconds_[slot] * times);
      }
    }
  }
  void clear() {
    std::fill(seconds_.begin(), seconds_.end(), 0.0);
    std::fill(charged_.begin(), charged_.end(), false);
  }
  double total() const {
    double sum = 0;
    for (const double value : seconds_) {
      sum += value;
    }
    return sum;
  }
  void scale(double factor) {
    for (double& value : seconds_) {
      value *= factor;
    }
  }
  Breakdown by_key(const LabelTable<BreakdownKey>& labels) const {
    Breakdown breakdown;
    for (size_t slot = 0; slot < seconds_.size(); ++slot) {
      if (charged_[slot]) {
        breakdown[labels.key(static_cast<int>(slot))] = seconds_[slot];
      }
    }
    return breakdown;
  }

 private:
  std::vector<double> seconds_;
  std::vector<bool> charged_;
};

struct Accounting {
  LabelSeconds seconds;  // only with record_details
  double matmul_flops = 0;
  void add(const Accounting& other, double times) {
    seconds.add(other.seconds, times);
    matmul_flops += other.matmul_flops * times;
  }
  void clear() {
    seconds.clear();
    matmul_flops = 0;
  }
};

// What the scheduler needs about one op. Costs are pure functions of the op and the options, so
// they are worked out once per simulate_step call instead of once per simulated iteration.
struct OpPlan {
  enum class Kind { kCompute, kCollective, kDeferredGradient, kHostTransfer };
  Kind kind = Kind::kCompute;
  double seconds = 0;  // on its resource; a deferred gradient reduction: the collective's time
  Resource resource = Resource::kIci;
  double matmul_flops = 0;
  CostCategory bound = CostCategory::kOverhead;
  // Collective matmul: an activation all-gather or reduce-scatter overlapped with its matmul.
  bool overlapped_with_matmul = false;
  int matmul_producer = -1;  // an overlapped reduce-scatter's einsum producer, or -1
  // With record_details: the label charged when the TensorCore waits for this op (its exposed
  // link and axes, host_transfers, or idle), the label of its own compute time, and its trace row.
  int wait_label = -1;
  int compute_label = -1;
  int trace_lane = -1;            // in lanes_: TensorCore, ICI fsdp, DCN data, Host link, ...
  const char* trace_detail = "";  // compute: mxu/hbm/vpu/overhead; collective: its kind
  int trace_dcn_lane = -1;        // a two-stage collective's DCN stage: its lane and seconds
  double trace_dcn_seconds = 0;
  // A reduction across slices: its ring steps' message latency, which the TensorCore driving
  // the steps waits out when it issues the collective (dcn_step_latency; 0 otherwise).
  double tensorcore_wait = 0;
  // Of a compute op's seconds, what the TensorCore spends on continuation-fused collective steps
  // (tensorcore_driven_collectives; 0 otherwise).
  double collective_steps_seconds = 0;
};

// Data-parallel gradient all-reduces across slices are combined and run after the backward pass
// (an FSDP reduce-scatter that spans slices runs per layer like any other).
bool deferred_gradient_reduction(const Graph& graph, const Op& op, const CollectiveTime& time) {
  return time.dcn_seconds > 0 && op.phase == Phase::kBackward && op.kind == OpKind::kAllReduce &&
         graph.tensor(op.outputs[0]).kind == TensorKind::kParameterGrad;
}

// Collective matmul (Wang et al. ASPLOS'23): an activation all-gather / reduce-scatter is split
// into steps that overlap the matmul it feeds or drains.
bool overlapped_with_matmul(const Op& op, bool collective_matmul, bool weight_only) {
  return collective_matmul && !weight_only &&
         (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter);
}

// On a chip whose asynchronous path for all-gather / reduce-scatter / all-reduce is the
// SparseCores (v7x), such a collective kept off them runs as XLA's continuation fusion instead:
// its steps are fused into the XLA fusions that run meanwhile, so it still overlaps compute on
// the links, but the TensorCore issues and waits for its steps (docs/reference/hardware.md §4:
// the v7x guide's -22% for a dense model with the offload is this TensorCore time going away).
bool driven_by_tensorcore(const Op& op, bool offloaded, const ChipSpec& chip,
                          const MechanismSet& mechanisms) {
  return !offloaded && is_collective(op.kind) && op.kind != OpKind::kAllToAll &&
         op.kind != OpKind::kCollectivePermute &&
         mechanisms.enabled(Mechanism::kTensorCoreDrivenCollectives) &&
         chip.sparsecore_collective_offload_default > 0;
}

// An op that runs as a Pallas kernel (splash attention, a megablox grouped matmul), not as an
// XLA fusion: continuation fusion cannot put collective steps into it.
bool runs_as_pallas_kernel(const Graph& graph, const Op& op, const CostContext& context) {
  if (op.kind == OpKind::kAttention || op.kind == OpKind::kAttentionGrad) {
    return context.flash_attention;
  }
  if (op.kind != OpKind::kEinsum || !context.megablox) {
    return false;
  }
  static const Name kExpertTokens("expert_tokens");  // interned once: a pointer compare
  return std::any_of(op.inputs.begin(), op.inputs.end(), [&](TensorId input) {
    return graph.tensor(input).dim_index(kExpertTokens) >= 0;
  });
}

class Simulator {
 public:
  // What a Simulator is made for: collective_sums and chain_bound plan each op as they reach it,
  // so they need none of the scheduler's per-tensor and per-op state (timelines, ready times,
  // plans); chain_bound keeps its own, by op (Analysis::chain_*).
  enum class Use { kSchedule, kCollectiveBounds, kChainBound };

  Simulator(const StepProgram& program, const PerfOptions& options,
            StepSimulator::Analysis& analysis, Use use = Use::kSchedule)
      : program_(program),
        graph_(program.program.graph),
        options_(options),
        details_(options.record_details),
        analysis_(analysis),
        region_ops_(analysis.region_ops),
        carry_source_(analysis.carry_source),
        entry_source_(analysis.entry_source),
        weight_only_(analysis.weight_only),
        ready_(analysis.ready),
        finish_not_before_(analysis.finish_not_before),
        op_span_(analysis.op_span),
        timelines_(analysis.timelines) {
    const bool schedules = use == Use::kSchedule;  // the others keep no per-op state here
    if (schedules) {
      for (Timeline& resource : timelines_) {
        resource.clear();
      }
    }
    analysis.use_mesh(program.mesh, options.cost.mechanisms);
    const size_t tensors = graph_.tensors().size();
    const size_t ops = graph_.ops().size();
    if (schedules) {
      ready_.assign(tensors, 0.0);
      finish_not_before_.assign(tensors, -std::numeric_limits<double>::infinity());
    }
    if (details_) {
      idle_label_ = labels_.intern(BreakdownKey::of(BreakdownKind::kIdle));
    }
    // A compute op that shares the SMs with collectives for t seconds runs at 1 - share of its
    // rate then: it takes share / (1 - share) x t longer.
    const double share = program.slice.chip->collective_compute_share;
    if (share > 0) {
      slowdown_per_shared_second_ = share / (1.0 - share);
      if (details_) {
        shared_compute_label_ =
            labels_.intern(BreakdownKey::of(BreakdownKind::kComputeSharedWithCollectives));
      }
    }
    // The same for every Simulator of this mesh and offload (use_mesh forgets it on a new one).
    std::optional<bool>& fusion = analysis.continuation_fusion[options.sparse_core_offload ? 1 : 0];
    if (!fusion.has_value()) {
      fusion = std::any_of(graph_.ops().begin(), graph_.ops().end(), [&](const Op& op) {
        return driven_by_tensorcore(op, options.sparse_core_offload, *program.slice.chip,
                                    options.cost.mechanisms) &&
               analysis_.collective(op, program.mesh, program.slice).ici_seconds > 0;
      });
    }
    continuation_fusion_ = *fusion;
    if (continuation_fusion_ && details_ && shared_compute_label_ < 0) {
      shared_compute_label_ =
          labels_.intern(BreakdownKey::of(BreakdownKind::kComputeSharedWithCollectives));
    }
    if (!schedules) {
      return;
    }
    OpPlan unplanned;
    unplanned.wait_label = idle_label_;
    plans_.assign(ops, unplanned);
    op_span_.assign(ops, {0.0, 0.0});
    if (details_) {
      profile_seconds_.assign(ops, 0.0);
      profile_calls_.assign(ops, 0.0);
      profiled_.assign(ops, false);
    }
  }

  // StepSimulator::collective_bounds' sums, from the same plans the scheduler runs: every op
  // but the compute ops, which count only when they carry collective steps (their sums depend on
  // the cost context alone, not the mesh: kept in the analysis, driven_sums).
  StepSimulator::Analysis::CollectiveSums collective_sums() {
    std::array<double, kResources> busy{};
    StepSimulator::Analysis::CollectiveSums sums{options_.cost, options_.sparse_core_offload};
    if (continuation_fusion_) {
      const StepSimulator::Analysis::DrivenSums& driven = driven_sums();
      sums.driven_microbatch = driven.microbatch;
      sums.driven_optimizer = driven.optimizer;
    }
    // plan_op's link and seconds for each collective, with its class's link worked out once.
    std::vector<std::optional<LinkTime>>& links = analysis_.class_links;
    links.assign(analysis_.class_op.size(), std::nullopt);
    for (const Op* op : analysis_.not_compute_ops) {
      const double repeat = static_cast<double>(graph_.region(op->region).repeat);
      if (!is_collective(op->kind)) {
        const OpPlan plan = plan_op(*op);  // a host transfer
        busy[static_cast<size_t>(plan.resource)] += plan.seconds * repeat;
        continue;
      }
      const CollectiveTime& time = analysis_.collective(*op, program_.mesh, program_.slice);
      if (deferred_gradient_reduction(graph_, *op, time)) {
        continue;  // its bytes go in the combined reduction, on no link of the iterations
      }
      std::optional<LinkTime>& link =
          links[static_cast<size_t>(analysis_.collective_class[static_cast<size_t>(op->id)])];
      if (!link.has_value()) {
        link = link_time(op->kind, time);
      }
      double seconds = link->seconds;
      const double share = share_of_iterations(*op);
      if (share != 1) {
        seconds *= share;  // as plan_op
      }
      busy[static_cast<size_t>(link->resource)] += seconds * repeat;
    }
    sums.busiest_link = *std::max_element(busy.begin(), busy.end());
    return sums;
  }

  // The collective steps the compute ops carry under continuation fusion, by phase, summed in
  // program order once per cost context.
  const StepSimulator::Analysis::DrivenSums& driven_sums() {
    std::vector<StepSimulator::Analysis::DrivenSums>& kept = analysis_.driven_sums;
    for (const StepSimulator::Analysis::DrivenSums& sums : kept) {
      if (sums.cost == options_.cost) {
        return sums;
      }
    }
    StepSimulator::Analysis::DrivenSums sums{options_.cost};
    for (const Op& op : graph_.ops()) {
      if (is_compute(op.kind)) {
        const Region& region = graph_.region(op.region);
        (region.phase == Phase::kOptimizer ? sums.optimizer : sums.microbatch) +=
            plan_op(op).collective_steps_seconds * static_cast<double>(region.repeat);
      }
    }
    kept.push_back(sums);
    return kept.back();
  }

  // StepSimulator::chain_bound, from the same plans the scheduler runs; with `cheapest`, each
  // compute op (not a collective the TensorCore drives) costs its entry instead, by op id.
  double chain_bound(const std::vector<double>* cheapest = nullptr) {
    cheapest_ = cheapest;
    analysis_.find_chain_links(graph_);
    // A walk reads only what it wrote: an op not reached yet reads as the scheduler's fresh
    // state (ready at 0, no chunk pending, a span of nothing).
    const size_t ops = graph_.ops().size();
    analysis_.chain_output_ready.assign(ops, 0.0);
    analysis_.chain_finish_not_before.assign(ops, -std::numeric_limits<double>::infinity());
    op_span_.assign(ops, {0.0, 0.0});
    double microbatch = 0;
    double optimizer = 0;
    double deferred = 0;
    for (int region = 0; region < static_cast<int>(graph_.regions().size()); ++region) {
      const Region& info = graph_.region(region);
      const double iteration = chain_iteration(region, deferred);
      (info.phase == Phase::kOptimizer ? optimizer : microbatch) +=
          iteration * static_cast<double>(info.repeat);
    }
    return microbatch * static_cast<double>(program_.accumulation_steps) + deferred + optimizer;
  }

  StepTiming run() {
    StepTiming timing;
    Accounting total;
    const int regions = static_cast<int>(graph_.regions().size());
    // One microbatch's forward and backward, then the cross-slice gradient reductions XLA
    // combines after it, then the optimizer update.
    for (int region = 0; region < regions; ++region) {
      if (graph_.region(region).phase != Phase::kOptimizer) {
        const double region_start = tensorcore_free_;
        Accounting part = simulate_region(region, timing);
        if (details_ && graph_.region(region).pipelined()) {
          label_bubble(part.seconds);
          add_stage_lanes(graph_.region(region), region_start, tensorcore_free_, timing);
        }
        total.add(part, 1.0);
      }
    }
    const double microbatch = tensorcore_free_;
    flush_deferred_gradient_reductions(total, timing);
    const double optimizer_start = tensorcore_free_;
    for (int region = 0; region < regions; ++region) {
      if (graph_.region(region).phase == Phase::kOptimizer) {
        total.add(simulate_region(region, timing), 1.0);
      }
    }
    const double end = std::max({tensorcore_free_, last_event_end_});
    const double accumulation = static_cast<double>(program_.accumulation_steps);
    timing.microbatch_seconds = microbatch;
    timing.optimizer_seconds = end - optimizer_start;
    timing.step_seconds = end + (accumulation - 1) * microbatch;
    // The other accumulation microbatches repeat the simulated one.
    total.add(microbatch_accounting_, accumulation - 1);
    timing.hardware_matmul_flops = total.matmul_flops;
    if (details_) {
      timing.breakdown = total.seconds.by_key(labels_);
      double accounted = 0;
      for (const auto& [key, value] : timing.breakdown) {
        accounted += value;
      }
      timing.breakdown[BreakdownKey::of(BreakdownKind::kIdle)] +=
          std::max(0.0, timing.step_seconds - accounted);
      timing.profile = profile();
      timing.lanes = lanes_.keys();
    }
    return timing;
  }

 private:
  // A pipeline stage's loop: of its iterations, (S - 1) d compute on nothing (the stage waits for
  // the first microbatch or has sent its last; model/pipeline_schedule.h). That share of the
  // loop's time, whatever it was spent on, is the bubble.
  void label_bubble(LabelSeconds& seconds) {
    const double fraction = program_.step->forward_info.pipeline.bubble_fraction();
    const double bubble = seconds.total() * fraction;
    seconds.scale(1.0 - fraction);
    seconds.add(labels_.intern(BreakdownKey::of(BreakdownKind::kPipelineBubble)), bubble);
  }

  // The trace's "Stage s" lanes: what each stage works on in each iteration of a pipeline loop
  // (every device runs the loop in lockstep, so the simulated device's iteration times are all
  // stages'). Stage s starts d s iterations late; backward runs the iterations in reverse. Runs
  // of bubble iterations are one event; with many iterations, so are runs of work.
  void add_stage_lanes(const Region& region, double start, double end, StepTiming& timing) {
    const PipelineSchedule& schedule = program_.step->forward_info.pipeline;
    const int64_t iterations = schedule.iterations();
    const double period = (end - start) / static_cast<double>(iterations);
    const bool backward = region.phase == Phase::kBackward;
    constexpr int64_t kMostIterationsDrawn = 400;
    const bool merge_work = iterations > kMostIterationsDrawn;
    const int64_t useful = schedule.microbatches * schedule.repeats;
    for (int64_t stage = 0; stage < schedule.stages; ++stage) {
      const int lane = lanes_.intern({LaneKind::kStage, {}, stage, false});
      int64_t run_start = 0;
      for (int64_t slot = 0; slot < iterations; ++slot) {
        const int64_t iteration = backward ? iterations - 1 - slot : slot;
        auto state = [&](int64_t at) {  // -1 bubble, 0 work (merged), else 1 + the work index
          const int64_t index =
              (backward ? iterations - 1 - at : at) - stage * schedule.forwarding_delay;
          if (index < 0 || index >= useful) {
            return int64_t{-1};
          }
          return merge_work ? int64_t{0} : 1 + index;
        };
        const int64_t here = state(slot);
        if (slot + 1 < iterations && state(slot + 1) == here && here <= 0) {
          continue;  // the run goes on
        }
        std::string name = "bubble";
        if (here == 0) {
          name = "microbatches";
        } else if (here > 0) {
          const int64_t index = iteration - stage * schedule.forwarding_delay;
          name = "microbatch " + std::to_string(index % schedule.microbatches) + ", repeat " +
                 std::to_string(index / schedule.microbatches);
        }
        timing.trace.push_back({name + (backward ? " (backward)" : ""), lane, region.name,
                                start + static_cast<double>(run_start) * period,
                                static_cast<double>(slot + 1 - run_start) * period,
                                here < 0 ? "bubble" : "layers"});
        run_start = slot + 1;
      }
    }
  }

  // The TensorCore's time in one iteration of `region` when every collective and transfer starts
  // the moment its input is ready (no link is ever busy) and every input from outside the
  // iteration (an earlier region, the previous iteration, the prefetched weights) is ready when
  // the iteration starts; adds the region's deferred gradient reductions to `deferred`.
  // schedule() waits at least this long in each iteration: the same ops in the same order on the
  // TensorCore, each ready no earlier (a timeline only delays a transfer).
  double chain_iteration(int region, double& deferred) {
    constexpr double kLongAgo = -1e300;  // finite, so that spans stay free of inf - inf
    const Region& info = graph_.region(region);
    std::vector<double>& output_ready = analysis_.chain_output_ready;            // by op id
    std::vector<double>& finish_not_before = analysis_.chain_finish_not_before;  // by op id
    double tensorcore = 0;
    for (const Op* op : region_ops_[static_cast<size_t>(region)]) {
      const auto id = static_cast<size_t>(op->id);
      const OpPlan plan = chain_plan(*op);
      double ready = kLongAgo;
      double chunks_end = kLongAgo;  // an overlapped all-gather's last chunk
      const auto begin = static_cast<size_t>(analysis_.chain_producer_begin[id]);
      const auto stop = static_cast<size_t>(analysis_.chain_producer_begin[id + 1]);
      for (size_t link = begin; link < stop; ++link) {
        const auto producer = static_cast<size_t>(analysis_.chain_producers[link]);
        ready = std::max(ready, output_ready[producer]);
        chunks_end = std::max(chunks_end, finish_not_before[producer]);
      }
      if (weight_only_[id]) {
        ready = kLongAgo;  // issued ahead
      }
      if (plan.matmul_producer >= 0) {
        const Op& producer = graph_.ops()[static_cast<size_t>(plan.matmul_producer)];
        const auto& [producer_start, producer_end] =
            op_span_[static_cast<size_t>(plan.matmul_producer)];
        ready = producer.region != region
                    ? kLongAgo
                    : producer_start +
                          (producer_end - producer_start) /
                              static_cast<double>(std::max<int64_t>(1, op->attrs.group_size));
      }
      if (plan.tensorcore_wait > 0) {
        tensorcore = std::max(ready, tensorcore) + plan.tensorcore_wait;
      }
      double start = ready;
      double end = ready + plan.seconds;
      if (plan.kind == OpPlan::Kind::kDeferredGradient) {
        deferred += plan.seconds * static_cast<double>(info.repeat);
        end = ready;
      } else if (plan.kind == OpPlan::Kind::kCompute) {
        start = std::max(ready, tensorcore);
        end = std::max(start + plan.seconds, chunks_end);
        tensorcore = end;
      }
      op_span_[id] = {start, end};
      output_ready[id] = end;
      if (plan.overlapped_with_matmul && op->kind == OpKind::kAllGather) {
        output_ready[id] =
            start + (end - start) / static_cast<double>(std::max<int64_t>(1, op->attrs.group_size));
        finish_not_before[id] = end;
      }
    }
    return tensorcore;
  }

  // An op's plan for chain_iteration: the scheduler's, or with `cheapest_` a compute op's given
  // cost (the rest of a compute op's plan is not read there).
  OpPlan chain_plan(const Op& op) {
    if (cheapest_ == nullptr || !analysis_.compute[static_cast<size_t>(op.id)]) {
      return plan_op(op);
    }
    OpPlan plan;
    plan.kind = OpPlan::Kind::kCompute;
    plan.seconds = (*cheapest_)[static_cast<size_t>(op.id)] * share_of_iterations(op);
    return plan;
  }

  // Works out the cost of every op of a region, before its first iteration.
  void plan_region(int region) {
    for (const Op* op : region_ops_[static_cast<size_t>(region)]) {
      plans_[static_cast<size_t>(op->id)] = plan_op(*op);
    }
  }

  // An op that runs in only some iterations (a pipeline stage's hand-over every k layers, its
  // weight gathers once per held layer) is charged that share of its cost in each: the region's
  // total is right, the iterations average it.
  OpPlan plan_op(const Op& op) {
    OpPlan plan = plan_op_once(op);
    const double share = share_of_iterations(op);
    if (share != 1) {
      plan.seconds *= share;
      plan.matmul_flops *= share;
      plan.collective_steps_seconds *= share;
      plan.tensorcore_wait *= share;
      plan.trace_dcn_seconds *= share;
    }
    return plan;
  }

  // Where a collective that is not deferred runs and for how long (before its share of the
  // iterations), from its kind and its class's time on the mesh: the same for every op of a class.
  LinkTime link_time(OpKind kind, const CollectiveTime& time) const {
    LinkTime link;
    link.seconds = time.seconds;
    const bool offloaded = options_.sparse_core_offload && kind != OpKind::kAllToAll;
    const bool sparsecore_reduction =
        options_.cost.mechanisms.enabled(Mechanism::kSparseCoreReduction);
    const bool reduction = sparsecore_reduction && is_reducing_collective(kind);
    link.resource = time.dcn_seconds > time.ici_seconds ? Resource::kDcn
                    : !offloaded                        ? Resource::kIci
                    : reduction                         ? Resource::kSparseCoreReduce
                                                        : Resource::kSparseCore;
    if (offloaded && sparsecore_reduction) {
      // The SparseCores reduce what a reduce-scatter receives, slower than the links deliver.
      const double reduce_share = kind == OpKind::kReduceScatter ? 1.0
                                  : kind == OpKind::kAllReduce   ? 0.5
                                                                 : 0.0;
      link.seconds += reduce_share * time.ici_seconds *
                      (program_.slice.chip->sparsecore_reduce_scatter_time_factor - 1.0);
    }
    return link;
  }

  OpPlan plan_op_once(const Op& op) {
    OpPlan plan;
    plan.wait_label = idle_label_;
    // Collective matmul: the matmul can start on the first chunk of an overlapped all-gather,
    // and a reduce-scatter on the matmul's first partial result.
    plan.overlapped_with_matmul = overlapped_with_matmul(op, options_.collective_matmul,
                                                         weight_only_[static_cast<size_t>(op.id)]);
    if (plan.overlapped_with_matmul && op.kind == OpKind::kReduceScatter) {
      const int producer = graph_.producer(op.inputs[0]);
      if (producer >= 0 && graph_.ops()[static_cast<size_t>(producer)].kind == OpKind::kEinsum) {
        plan.matmul_producer = producer;
      }
    }
    if (is_collective(op.kind)) {
      const CollectiveTime& time = analysis_.collective(op, program_.mesh, program_.slice);
      plan.seconds = time.seconds;
      // A reduction across slices adds each received chunk before it sends the next one, so the
      // TensorCore driving it waits out every step's latency; gathers and permutes only move
      // bytes (their latency stays in the collective's own time).
      if (is_reducing_collective(op.kind)) {
        plan.tensorcore_wait = time.dcn_latency_seconds;
      }
      if (deferred_gradient_reduction(graph_, op, time)) {
        // Its steps' latency is waited out per layer as the gradients are reduced; the bytes
        // go in the combined reduction after the backward pass.
        plan.kind = OpPlan::Kind::kDeferredGradient;
        plan.seconds -= plan.tensorcore_wait;
        if (details_) {
          plan.wait_label =
              labels_.intern(BreakdownKey::of(BreakdownKind::kExposedGradientReduction));
        }
        return plan;
      }
      plan.kind = OpPlan::Kind::kCollective;
      const LinkTime on_link = link_time(op.kind, time);
      plan.resource = on_link.resource;
      plan.seconds = on_link.seconds;
      if (details_) {
        plan.wait_label = labels_.intern(BreakdownKey::exposed(time.link, op.attrs.mesh_axes));
        // One lane per link and mesh axes, as the trace viewers show a link each. A collective
        // with an ICI and a DCN stage shows each stage on its own lane, one after the other.
        const bool gpu = program_.slice.switched;
        const LaneKind dcn_link = gpu ? LaneKind::kInfiniBand : LaneKind::kDcn;
        const bool two_stages = time.ici_seconds > 0 && time.dcn_seconds > 0;
        const LaneKind link = plan.resource == Resource::kSparseCoreReduce
                                  ? LaneKind::kSparseCoreReduce
                              : plan.resource == Resource::kSparseCore     ? LaneKind::kSparseCore
                              : time.link == LinkKind::kDcn && !two_stages ? dcn_link
                              : time.link == LinkKind::kD2d                ? LaneKind::kD2d
                              : gpu                                        ? LaneKind::kNvLink
                                                                           : LaneKind::kIci;
        std::vector<std::string> axes = op.attrs.mesh_axes;
        std::sort(axes.begin(), axes.end());
        plan.trace_lane = lanes_.intern({link, axes, 0, false});
        if (two_stages) {
          plan.trace_dcn_lane = lanes_.intern({dcn_link, axes, 0, false});
          plan.trace_dcn_seconds = time.dcn_seconds;
        }
        plan.trace_detail = op_kind_name(op.kind);
      }
      return plan;
    }
    if (op_kind_traits(op.kind).host_transfer) {
      const double bytes = static_cast<double>(graph_.tensor(op.inputs[0]).bytes());
      plan.kind = OpPlan::Kind::kHostTransfer;
      plan.seconds = bytes / (program_.slice.chip->pcie_bandwidth_gbps * 1e9 /
                              program_.slice.devices_per_chip);
      plan.resource = Resource::kHost;
      if (details_) {
        plan.wait_label = labels_.intern(BreakdownKey::of(BreakdownKind::kHostTransfers));
        plan.trace_lane = lanes_.intern({LaneKind::kHost, {}, 0, false});
        plan.trace_detail = op_kind_name(op.kind);
      }
      return plan;
    }
    if (context_costs_ == nullptr) {
      context_costs_ = &analysis_.context_costs(graph_, options_.cost);
    }
    const OpCost& cost = analysis_.compute_cost(graph_, op, *context_costs_);
    plan.kind = OpPlan::Kind::kCompute;
    plan.seconds = cost.seconds;
    if (continuation_fusion_ && !runs_as_pallas_kernel(graph_, op, options_.cost)) {
      plan.collective_steps_seconds =
          cost.seconds * program_.slice.chip->continuation_fusion_tensorcore_share;
      plan.seconds += plan.collective_steps_seconds;
    }
    plan.matmul_flops = cost.matmul_flops;
    plan.bound = cost.bound;
    if (details_) {
      plan.compute_label = labels_.intern(BreakdownKey::compute(cost.bound));
      plan.trace_lane = lanes_.intern(compute_lane());
      plan.trace_detail = cost_category_name(cost.bound);
    }
    return plan;
  }

  Timeline& timeline(Resource resource) { return timelines_[static_cast<size_t>(resource)]; }

  // A collective on the links of a chip whose collectives run on its compute units (a GPU's NCCL
  // kernels on SMs), which slows the compute that overlaps it.
  bool takes_compute_share(const OpPlan& plan) const {
    return slowdown_per_shared_second_ > 0 && plan.kind == OpPlan::Kind::kCollective &&
           (plan.resource == Resource::kIci || plan.resource == Resource::kDcn);
  }

  // Gradient reductions across slices (DCN) are combined by XLA into a few large all-reduces
  // after the backward pass (all-reduce combiner), so they run then, and the update waits.
  void flush_deferred_gradient_reductions(Accounting& total, StepTiming& timing) {
    if (deferred_dcn_seconds_ <= 0) {
      return;
    }
    const double start = timeline(Resource::kDcn).place(tensorcore_free_, deferred_dcn_seconds_);
    const double end = start + deferred_dcn_seconds_;
    if (details_) {
      total.seconds.add(labels_.intern(BreakdownKey::of(BreakdownKind::kExposedGradientReduction)),
                        end - tensorcore_free_);
      const int lane = lanes_.intern(
          {program_.slice.switched ? LaneKind::kInfiniBand : LaneKind::kDcn, {}, 0, true});
      timing.trace.push_back({"gradient all-reduce across slices (combined)", lane, "step", start,
                              deferred_dcn_seconds_, "all_reduce"});
    }
    tensorcore_free_ = end;
    last_event_end_ = std::max(last_event_end_, end);
    deferred_dcn_seconds_ = 0;
  }

  // A carried input is ready when its source is: the loop's own carry, and the value entering
  // the loop (which alone counts in the first iteration, before the loop's carry exists).
  double input_ready(TensorId id) const {
    double ready = ready_[static_cast<size_t>(id)];
    for (const int source :
         {carry_source_[static_cast<size_t>(id)], entry_source_[static_cast<size_t>(id)]}) {
      if (source >= 0) {
        ready = std::max(ready, ready_[static_cast<size_t>(source)]);
      }
    }
    return ready;
  }

  Accounting simulate_region(int region, StepTiming& timing) {
    const Region& info = graph_.region(region);
    plan_region(region);
    const std::vector<const Op*>& ops = region_ops_[static_cast<size_t>(region)];
    const int64_t repeat = info.repeat;
    const int64_t simulated = std::min<int64_t>(repeat, options_.max_simulated_iterations);
    // Each simulated iteration stands for repeat / simulated real ones (deferred work).
    iteration_weight_ = static_cast<double>(repeat) / static_cast<double>(simulated);
    Accounting region_total;
    Accounting iteration_accounting;  // after the loop: the last iteration's
    double previous_end = 0;
    double period = 0;
    for (int64_t iteration = 0; iteration < simulated; ++iteration) {
      const double iteration_start = tensorcore_free_;
      iteration_accounting.clear();
      double iteration_end = 0;
      for (const Op* op : ops) {
        iteration_end = std::max(iteration_end, schedule(*op, iteration_accounting, timing, info));
      }
      // The region's own carry: this iteration's outputs feed the next iteration's inputs.
      prefetch_from_ = iteration_start;
      period = iteration_end - previous_end;
      previous_end = iteration_end;
      region_total.add(iteration_accounting, 1.0);
    }
    if (repeat > simulated) {
      const double remaining = static_cast<double>(repeat - simulated);
      const double delta = remaining * period;
      region_total.add(iteration_accounting, remaining);
      if (details_ && simulated > 0) {
        for (const Op* op : ops) {
          const auto id = static_cast<size_t>(op->id);
          if (profiled_[id]) {
            profile_seconds_[id] += plans_[id].seconds * remaining;
            profile_calls_[id] += remaining;
          }
        }
      }
      tensorcore_free_ += delta;
      last_event_end_ += delta;
      prefetch_from_ += delta;
      for (Timeline& resource : timelines_) {
        resource.shift(delta);
      }
      for (const Op* op : ops) {
        for (const TensorId output : op->outputs) {
          ready_[static_cast<size_t>(output)] += delta;
        }
      }
    }
    if (info.phase != Phase::kOptimizer) {
      microbatch_accounting_.add(region_total, 1.0);
    }
    prefetch_from_ = tensorcore_free_;
    return region_total;
  }

  // Schedules one op; returns its end time.
  double schedule(const Op& op, Accounting& accounting, StepTiming& timing, const Region& info) {
    const auto id = static_cast<size_t>(op.id);
    const OpPlan& plan = plans_[id];
    int blocking_producer = -1;
    double ready = inputs_ready(op, blocking_producer);
    if (weight_only_[id]) {
      // Weight preparation is issued one iteration ahead: from the previous iteration's start,
      // not earlier (an input ready at 0, a parameter, does not let it fill link time anywhere
      // since the step began), and not later (a weight-only producer just placed, a cast, stands
      // for the same work done ahead).
      ready = prefetch_from_;
    }
    const bool record = details_ && timing.trace.size() < kMaxTraceEvents;
    if (plan.matmul_producer >= 0) {
      const auto& [producer_start, producer_end] =
          op_span_[static_cast<size_t>(plan.matmul_producer)];
      ready = producer_start + (producer_end - producer_start) /
                                   static_cast<double>(std::max<int64_t>(1, op.attrs.group_size));
    }
    if (plan.tensorcore_wait > 0) {
      wait_out_dcn_steps(op, plan, ready, accounting, record ? &timing : nullptr, info);
    }
    double start = 0;
    double end = 0;
    switch (plan.kind) {
      case OpPlan::Kind::kDeferredGradient:
        deferred_dcn_seconds_ += plan.seconds * iteration_weight_;
        for (const TensorId output : op.outputs) {
          ready_[static_cast<size_t>(output)] = ready;
        }
        return ready;
      case OpPlan::Kind::kCollective:
      case OpPlan::Kind::kHostTransfer:
        start = schedule_transfer(op, plan, ready, accounting, record ? &timing : nullptr, info);
        end = start + plan.seconds;
        break;
      case OpPlan::Kind::kCompute:
        std::tie(start, end) = schedule_compute(op, plan, ready, blocking_producer, accounting,
                                                record ? &timing : nullptr, info);
        break;
    }
    op_span_[id] = {start, end};
    double output_ready = end;
    if (plan.overlapped_with_matmul && op.kind == OpKind::kAllGather) {
      // The consumer starts on the first chunk and cannot finish before the last one.
      output_ready =
          start + (end - start) / static_cast<double>(std::max<int64_t>(1, op.attrs.group_size));
      for (const TensorId output : op.outputs) {
        finish_not_before_[static_cast<size_t>(output)] = end;
      }
    }
    for (const TensorId output : op.outputs) {
      ready_[static_cast<size_t>(output)] = output_ready;
    }
    last_event_end_ = std::max(last_event_end_, end);
    return end;
  }

  // The TensorCore drives a reduction's ring steps across slices: from when the collective can
  // be issued, it waits out their message latency before its next op.
  void wait_out_dcn_steps(const Op& op, const OpPlan& plan, double ready, Accounting& accounting,
                          StepTiming* trace, const Region& info) {
    const double start = std::max(ready, tensorcore_free_);
    if (details_) {
      if (start > tensorcore_free_) {
        accounting.seconds.add(idle_label_, start - tensorcore_free_);
      }
      accounting.seconds.add(plan.wait_label, plan.tensorcore_wait);
    }
    tensorcore_free_ = start + plan.tensorcore_wait;
    last_event_end_ = std::max(last_event_end_, tensorcore_free_);
    if (trace != nullptr) {
      trace->trace.push_back({op.name + " (steps across slices)", lanes_.intern(compute_lane()),
                              info.name, start, plan.tensorcore_wait, "dcn_step_latency"});
    }
  }

  // When the last of the op's inputs is ready, and the op producing it (for a carried input the
  // op producing the carry's source when that is what arrives last; -1 when none).
  double inputs_ready(const Op& op, int& blocking_producer) const {
    double ready = 0;
    for (const TensorId input : op.inputs) {
      const double input_time = input_ready(input);
      if (input_time > ready) {
        ready = input_time;
        blocking_producer = graph_.producer(input);
        for (const int source : {carry_source_[static_cast<size_t>(input)],
                                 entry_source_[static_cast<size_t>(input)]}) {
          if (source >= 0 && ready_[static_cast<size_t>(source)] >= input_time) {
            blocking_producer = graph_.producer(source);
          }
        }
      }
    }
    return ready;
  }

  // A collective or host transfer on its own resource from `ready`; returns its start. Records
  // its trace events when `trace` is set.
  double schedule_transfer(const Op& op, const OpPlan& plan, double ready, Accounting& accounting,
                           StepTiming* trace, const Region& info) {
    const double start = timeline(plan.resource).place(ready, plan.seconds);
    const double end = start + plan.seconds;
    if (takes_compute_share(plan)) {
      // Compute already scheduled beside this collective lost its share of the SMs: the
      // work it could not do pushes the compute that follows.
      const double shared =
          timeline(Resource::kCompute).busy_within(start, std::min(end, tensorcore_free_));
      const double lost = shared * slowdown_per_shared_second_;
      tensorcore_free_ += lost;
      if (details_) {
        accounting.seconds.add(shared_compute_label_, lost);
      }
    }
    if (trace != nullptr) {
      const double dcn =
          plan.trace_dcn_lane >= 0 ? std::min(plan.seconds, plan.trace_dcn_seconds) : 0.0;
      trace->trace.push_back(
          {op.name, plan.trace_lane, info.name, start, plan.seconds - dcn, plan.trace_detail});
      if (dcn > 0) {
        trace->trace.push_back({op.name, plan.trace_dcn_lane, info.name, start + plan.seconds - dcn,
                                dcn, plan.trace_detail});
      }
    }
    return start;
  }

  // A compute op on the TensorCore, from `ready` or when the TensorCore is free; returns its
  // start and end. The wait is blamed on `blocking_producer`; records its trace event (and the
  // arrow from the transfer it waited for) when `trace` is set.
  std::pair<double, double> schedule_compute(const Op& op, const OpPlan& plan, double ready,
                                             int blocking_producer, Accounting& accounting,
                                             StepTiming* trace, const Region& info) {
    const auto id = static_cast<size_t>(op.id);
    const double waiting_from = tensorcore_free_;
    const double start = std::max(ready, tensorcore_free_);
    if (details_ && start > tensorcore_free_) {
      // The TensorCore waits: blame the op it waits for (a collective or transfer), else idle.
      const int label = blocking_producer >= 0
                            ? plans_[static_cast<size_t>(blocking_producer)].wait_label
                            : idle_label_;
      accounting.seconds.add(label, start - tensorcore_free_);
    }
    double end = start + plan.seconds;
    double lost = 0;
    if (slowdown_per_shared_second_ > 0) {
      // Collectives already running beside this op hold their share of the SMs.
      lost = slowdown_per_shared_second_ * (timeline(Resource::kIci).busy_within(start, end) +
                                            timeline(Resource::kDcn).busy_within(start, end));
      end += lost;
    }
    for (const TensorId input : op.inputs) {
      end = std::max(end, finish_not_before_[static_cast<size_t>(input)]);
    }
    if (slowdown_per_shared_second_ > 0) {
      timeline(Resource::kCompute).place(start, end - start);
    }
    tensorcore_free_ = end;
    accounting.matmul_flops += plan.matmul_flops;
    if (details_) {
      accounting.seconds.add(plan.compute_label, plan.seconds - plan.collective_steps_seconds);
      if (plan.collective_steps_seconds > 0) {
        accounting.seconds.add(shared_compute_label_, plan.collective_steps_seconds);
      }
      if (lost > 0) {
        accounting.seconds.add(shared_compute_label_, lost);
      }
      profile_seconds_[id] += plan.seconds;
      profile_calls_[id] += 1;
      profiled_[id] = true;
    }
    if (trace != nullptr && plan.seconds > 0) {
      trace->trace.push_back(
          {op.name, plan.trace_lane, info.name, start, plan.seconds + lost, plan.trace_detail});
      // The collective or transfer this op waited for: an arrow from its end to here.
      const int waited_for = start > waiting_from ? blocking_producer : -1;
      if (waited_for >= 0) {
        const OpPlan& producer = plans_[static_cast<size_t>(waited_for)];
        if (producer.kind != OpPlan::Kind::kCompute && producer.trace_lane >= 0) {
          const int lane =
              producer.trace_dcn_lane >= 0 ? producer.trace_dcn_lane : producer.trace_lane;
          trace->flows.push_back(
              {lane, op_span_[static_cast<size_t>(waited_for)].second, plan.trace_lane, start});
        }
      }
    }
    return {start, end};
  }

  // The compute ops' TensorCore time over the step, most expensive first.
  std::vector<OpProfile> profile() const {
    std::vector<OpProfile> ops;
    for (const Op& op : graph_.ops()) {
      const auto id = static_cast<size_t>(op.id);
      if (profiled_[id]) {
        ops.push_back(
            {graph_.region(op.region).name, std::string(op_kind_name(op.kind)) + " " + op.name,
             cost_category_name(plans_[id].bound), profile_seconds_[id], profile_calls_[id]});
      }
    }
    std::sort(ops.begin(), ops.end(),
              [](const OpProfile& a, const OpProfile& b) { return a.seconds > b.seconds; });
    return ops;
  }

  static constexpr size_t kMaxTraceEvents = 200000;

  const StepProgram& program_;
  const Graph& graph_;
  PerfOptions options_;
  bool details_ = true;
  StepSimulator::Analysis& analysis_;
  const std::vector<std::vector<const Op*>>& region_ops_;  // by region, in program order
  const std::vector<TensorId>& carry_source_;              // by tensor id
  const std::vector<TensorId>& entry_source_;              // by tensor id
  const std::vector<bool>& weight_only_;                   // by op id
  std::vector<OpPlan> plans_;                              // by op id
  std::vector<double>& ready_;                             // by tensor id
  std::vector<double>& finish_not_before_;  // by tensor id: collective-matmul chunks arriving
  std::vector<std::pair<double, double>>& op_span_;  // by op id: (start, end), latest iteration
  // With record_details: labels, and each compute op's TensorCore seconds and calls.
  // The trace lane of compute: the TensorCore, or the SMs of a GPU.
  TraceLane compute_lane() const {
    return {program_.slice.switched ? LaneKind::kGpuSms : LaneKind::kTensorCore, {}, 0, false};
  }

  LabelTable<BreakdownKey> labels_;
  LabelTable<TraceLane> lanes_;  // trace lanes
  int idle_label_ = -1;
  std::vector<double> profile_seconds_;
  std::vector<double> profile_calls_;
  std::vector<bool> profiled_;
  Accounting microbatch_accounting_;
  std::array<Timeline, kResources>& timelines_;
  double tensorcore_free_ = 0;
  double last_event_end_ = 0;
  double prefetch_from_ = 0;
  double iteration_weight_ = 1;
  double deferred_dcn_seconds_ = 0;
  double slowdown_per_shared_second_ = 0;  // collective_compute_share / (1 - share)
  // Collectives run as continuation fusion on the TensorCore (tensorcore_driven_collectives):
  // the XLA fusions carry their steps.
  bool continuation_fusion_ = false;
  int shared_compute_label_ = -1;
  const std::vector<double>* cheapest_ = nullptr;  // chain_bound's compute costs, if given
  // The analysis' costs of options_.cost, looked up on first need.
  StepSimulator::Analysis::ContextCosts* context_costs_ = nullptr;
};

}  // namespace

StepSimulator::StepSimulator(const StepProgram& program)
    : program_(program),
      analysis_(std::make_unique<Analysis>(program.program.graph,
                                           program.slice.chip->matmul_output_fusion > 0)) {}

StepSimulator::~StepSimulator() = default;

StepTiming StepSimulator::run(const PerfOptions& options) {
  return Simulator(program_, options, *analysis_).run();
}

CollectiveBounds StepSimulator::collective_bounds(const PerfOptions& options) {
  Analysis& analysis = *analysis_;
  analysis.use_mesh(program_.mesh, options.cost.mechanisms);
  const Analysis::CollectiveSums* sums =
      analysis.collective_sums_for(options.cost, options.sparse_core_offload);
  if (sums == nullptr) {
    PerfOptions lean = options;
    lean.record_details = false;
    analysis.collective_sums.push_back(
        Simulator(program_, lean, analysis, Simulator::Use::kCollectiveBounds).collective_sums());
    sums = &analysis.collective_sums.back();
  }
  return {sums->driven_microbatch * static_cast<double>(program_.accumulation_steps) +
              sums->driven_optimizer,
          sums->busiest_link};
}

double StepSimulator::chain_bound(const PerfOptions& options) {
  PerfOptions lean = options;
  lean.record_details = false;
  return Simulator(program_, lean, *analysis_, Simulator::Use::kChainBound).chain_bound();
}

double StepSimulator::chain_bound(const PerfOptions& options,
                                  const std::vector<CostContext>& contexts) {
  Analysis& analysis = *analysis_;
  if (analysis.cheapest_of != contexts) {
    const Graph& graph = program_.program.graph;
    analysis.cheapest_of = contexts;
    analysis.cheapest.assign(graph.ops().size(), std::numeric_limits<double>::infinity());
    for (const CostContext& context : contexts) {
      Analysis::ContextCosts& costs = analysis.context_costs(graph, context);
      for (const Op& op : graph.ops()) {
        if (is_compute(op.kind)) {
          double& least = analysis.cheapest[static_cast<size_t>(op.id)];
          least = std::min(least, analysis.compute_cost(graph, op, costs).seconds);
        }
      }
    }
  }
  return chain_bound(options, analysis.cheapest);
}

double StepSimulator::chain_bound(const PerfOptions& options,
                                  const std::vector<double>& op_seconds) {
  PerfOptions lean = options;
  lean.record_details = false;
  return Simulator(program_, lean, *analysis_, Simulator::Use::kChainBound)
      .chain_bound(&op_seconds);
}

StepTiming simulate_step(const StepProgram& program, const PerfOptions& options) {
  return StepSimulator(program).run(options);
}

}  // namespace tpusim
