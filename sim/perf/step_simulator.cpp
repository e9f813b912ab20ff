#include "sim/perf/step_simulator.h"

#include <algorithm>
#include <limits>
#include <set>

#include "model/config.h"
#include "sharding/partitioner.h"
#include "sim/perf/collective_cost.h"

namespace tpusim {
namespace {

// A resource that serves one op at a time; a new op takes the earliest gap that fits after it is
// ready (the latency-hiding scheduler fills idle link time).
class Timeline {
 public:
  double place(double ready, double duration) {
    double start = ready;
    for (const auto& [busy_start, busy_end] : busy_) {
      if (busy_end <= start) {
        continue;
      }
      if (busy_start >= start + duration) {
        break;
      }
      start = std::max(start, busy_end);
    }
    busy_.insert({start, start + duration});
    return start;
  }
  void shift(double delta) {
    std::set<std::pair<double, double>> moved;
    for (const auto& [start, end] : busy_) {
      moved.insert({start + delta, end + delta});
    }
    busy_ = std::move(moved);
  }

 private:
  std::set<std::pair<double, double>> busy_;
};

struct Accounting {
  std::map<std::string, double> seconds;
  std::map<int, OpProfile> ops;  // by op id
  double matmul_flops = 0;
  void add(const Accounting& other, double times) {
    for (const auto& [key, value] : other.seconds) {
      seconds[key] += value * times;
    }
    for (const auto& [id, profile] : other.ops) {
      OpProfile& mine = ops[id];
      if (mine.op.empty()) {
        mine = profile;
        mine.seconds = 0;
        mine.calls = 0;
      }
      mine.seconds += profile.seconds * times;
      mine.calls += profile.calls * times;
    }
    matmul_flops += other.matmul_flops * times;
  }
};

std::string join_axes(const std::vector<std::string>& axes) {
  std::string text;
  for (const std::string& axis : axes) {
    text += (text.empty() ? "" : "+") + axis;
  }
  return text;
}

class Simulator {
 public:
  Simulator(const StepProgram& program, const PerfOptions& options)
      : program_(program), graph_(program.program.graph), options_(options) {
    ready_.assign(graph_.tensors().size(), 0.0);
    carry_source_.assign(graph_.tensors().size(), -1);
    for (const Graph::Carry& carry : graph_.carries()) {
      carry_source_[static_cast<size_t>(carry.to)] = carry.from;
    }
    weight_only_.assign(graph_.ops().size(), false);
    for (const Op& op : graph_.ops()) {
      bool only_weights = !op.inputs.empty();
      for (const TensorId input : op.inputs) {
        const Tensor& tensor = graph_.tensor(input);
        const int producer = graph_.producer(input);
        const bool weight = (tensor.kind == TensorKind::kParameter && producer < 0) ||
                            (producer >= 0 && weight_only_[static_cast<size_t>(producer)]);
        only_weights = only_weights && weight;
      }
      weight_only_[static_cast<size_t>(op.id)] = only_weights && op.phase != Phase::kOptimizer;
    }
    fused_.assign(graph_.ops().size(), false);
    find_fusions();
  }

  StepTiming run() {
    StepTiming timing;
    Accounting total;
    const int regions = static_cast<int>(graph_.regions().size());
    // One microbatch's forward and backward, then the cross-slice gradient reductions XLA
    // combines after it, then the optimizer update.
    for (int region = 0; region < regions; ++region) {
      if (graph_.region(region).phase != Phase::kOptimizer) {
        total.add(simulate_region(region, timing), 1.0);
      }
    }
    const double microbatch = tensorcore_free_;
    flush_deferred_gradient_reductions(total);
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
    for (const auto& [key, value] : microbatch_accounting_.seconds) {
      total.seconds[key] += value * (accumulation - 1);
    }
    total.matmul_flops += microbatch_accounting_.matmul_flops * (accumulation - 1);
    double accounted = 0;
    for (const auto& [key, value] : total.seconds) {
      accounted += value;
    }
    total.seconds["idle"] += std::max(0.0, timing.step_seconds - accounted);
    timing.breakdown = total.seconds;
    timing.hardware_matmul_flops = total.matmul_flops;
    for (const auto& [id, profile] : total.ops) {
      timing.profile.push_back(profile);
    }
    std::sort(timing.profile.begin(), timing.profile.end(),
              [](const OpProfile& a, const OpProfile& b) { return a.seconds > b.seconds; });
    return timing;
  }

 private:
  // Elementwise ops that read a matmul's only output fuse into it (XLA output fusion).
  void find_fusions() {
    std::vector<int> consumers(graph_.tensors().size(), 0);
    for (const Op& op : graph_.ops()) {
      for (const TensorId input : op.inputs) {
        ++consumers[static_cast<size_t>(input)];
      }
    }
    for (const Op& op : graph_.ops()) {
      if (op.kind != OpKind::kElementwise && op.kind != OpKind::kRope) {
        continue;
      }
      for (const TensorId input : op.inputs) {
        const int producer = graph_.producer(input);
        if (producer < 0) {
          continue;
        }
        const Op& source = graph_.ops()[static_cast<size_t>(producer)];
        const bool fusible_source = source.kind == OpKind::kEinsum ||
                                    source.kind == OpKind::kElementwise ||
                                    source.kind == OpKind::kRope;
        if (fusible_source && source.region == op.region &&
            consumers[static_cast<size_t>(input)] == 1) {
          fused_[static_cast<size_t>(op.id)] = true;
        }
      }
    }
  }

  // Gradient reductions across slices (DCN) are combined by XLA into a few large all-reduces
  // after the backward pass (all-reduce combiner), so they run then, and the update waits.
  void flush_deferred_gradient_reductions(Accounting& total) {
    if (deferred_dcn_seconds_ <= 0) {
      return;
    }
    const double start = dcn_.place(tensorcore_free_, deferred_dcn_seconds_);
    const double end = start + deferred_dcn_seconds_;
    total.seconds["exposed_dcn_gradient_reduction"] += end - tensorcore_free_;
    tensorcore_free_ = end;
    last_event_end_ = std::max(last_event_end_, end);
    deferred_dcn_seconds_ = 0;
  }

  double input_ready(TensorId id) const {
    const int source = carry_source_[static_cast<size_t>(id)];
    double ready = ready_[static_cast<size_t>(id)];
    if (source >= 0) {
      ready = std::max(ready, ready_[static_cast<size_t>(source)]);
    }
    return ready;
  }

  Accounting simulate_region(int region, StepTiming& timing) {
    const Region& info = graph_.region(region);
    std::vector<const Op*> ops;
    for (const Op& op : graph_.ops()) {
      if (op.region == region) {
        ops.push_back(&op);
      }
    }
    const int64_t repeat = info.repeat;
    const int64_t simulated = std::min<int64_t>(repeat, options_.max_simulated_iterations);
    // Each simulated iteration stands for repeat / simulated real ones (deferred work).
    iteration_weight_ = static_cast<double>(repeat) / static_cast<double>(simulated);
    Accounting region_total;
    Accounting last_iteration;
    double previous_end = 0;
    double period = 0;
    for (int64_t iteration = 0; iteration < simulated; ++iteration) {
      const double iteration_start = tensorcore_free_;
      Accounting accounting;
      double iteration_end = 0;
      for (const Op* op : ops) {
        iteration_end = std::max(iteration_end, schedule(*op, accounting, timing, info, iteration));
      }
      // The region's own carry: this iteration's outputs feed the next iteration's inputs.
      prefetch_from_ = iteration_start;
      period = iteration_end - previous_end;
      previous_end = iteration_end;
      region_total.add(accounting, 1.0);
      last_iteration = accounting;
    }
    if (repeat > simulated) {
      const double remaining = static_cast<double>(repeat - simulated);
      const double delta = remaining * period;
      region_total.add(last_iteration, remaining);
      tensorcore_free_ += delta;
      last_event_end_ += delta;
      prefetch_from_ += delta;
      for (Timeline* timeline : {&ici_, &dcn_, &host_, &sparse_core_}) {
        timeline->shift(delta);
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
  double schedule(const Op& op, Accounting& accounting, StepTiming& timing, const Region& info,
                  int64_t iteration) {
    double ready = 0;
    int blocking_producer = -1;
    for (const TensorId input : op.inputs) {
      const double input_time = input_ready(input);
      if (input_time > ready) {
        ready = input_time;
        blocking_producer = graph_.producer(input);
        const int source = carry_source_[static_cast<size_t>(input)];
        if (source >= 0 && ready_[static_cast<size_t>(source)] >= input_time) {
          blocking_producer = graph_.producer(source);
        }
      }
    }
    if (weight_only_[static_cast<size_t>(op.id)]) {
      // Weight preparation is issued ahead: from the previous iteration's start.
      ready = std::min(ready, prefetch_from_);
    }
    const bool record =
        iteration < options_.max_simulated_iterations && timing.trace.size() < kMaxTraceEvents;
    double start = 0;
    double end = 0;
    // Collective matmul (Wang et al. ASPLOS'23): an activation all-gather / reduce-scatter is
    // split into steps that overlap the matmul it feeds or drains; the matmul can start on the
    // first chunk and a reduce-scatter on the matmul's first partial result.
    const bool overlapped_with_matmul =
        options_.collective_matmul && !weight_only_[static_cast<size_t>(op.id)] &&
        (op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter);
    if (overlapped_with_matmul && op.kind == OpKind::kReduceScatter) {
      const int producer = graph_.producer(op.inputs[0]);
      if (producer >= 0 && graph_.ops()[static_cast<size_t>(producer)].kind == OpKind::kEinsum) {
        const auto& [producer_start, producer_end] = op_span_[producer];
        ready = producer_start + (producer_end - producer_start) /
                                     static_cast<double>(std::max<int64_t>(1, op.attrs.group_size));
      }
    }
    if (is_collective(op.kind)) {
      const double bytes = static_cast<double>(collective_bytes(graph_, op));
      const CollectiveTime time =
          collective_time(op.kind, bytes, op.attrs.mesh_axes, program_.mesh, program_.slice);
      const bool gradient_across_slices =
          time.dcn_seconds > 0 && op.phase == Phase::kBackward &&
          graph_.tensor(op.outputs[0]).kind == TensorKind::kParameterGrad;
      if (gradient_across_slices) {
        deferred_dcn_seconds_ += time.seconds * iteration_weight_;
        for (const TensorId output : op.outputs) {
          ready_[static_cast<size_t>(output)] = ready;
        }
        return ready;
      }
      const bool offloaded = options_.sparse_core_offload && op.kind != OpKind::kAllToAll;
      Timeline& link =
          time.dcn_seconds > time.ici_seconds ? dcn_ : (offloaded ? sparse_core_ : ici_);
      start = link.place(ready, time.seconds);
      end = start + time.seconds;
      collective_label_[op.id] =
          std::string("exposed_") + time.link + "_" + join_axes(op.attrs.mesh_axes);
      if (record) {
        timing.trace.push_back({op.name,
                                offloaded ? "SparseCore" : (time.link == "dcn" ? "DCN" : "ICI"),
                                info.name, start, time.seconds});
      }
    } else if (op.kind == OpKind::kHostOffload || op.kind == OpKind::kHostLoad) {
      const double bytes = static_cast<double>(graph_.tensor(op.inputs[0]).bytes());
      const double seconds = bytes / (program_.slice.chip->pcie_bandwidth_gbps * 1e9 /
                                      program_.slice.devices_per_chip);
      start = host_.place(ready, seconds);
      end = start + seconds;
      collective_label_[op.id] = "host_transfers";
      if (record) {
        timing.trace.push_back({op.name, "Host link", info.name, start, seconds});
      }
    } else {
      const OpCost cost =
          cost_compute_op(graph_, op, options_.cost, fused_[static_cast<size_t>(op.id)]);
      start = std::max(ready, tensorcore_free_);
      if (start > tensorcore_free_) {
        // The TensorCore waits: blame the op it waits for (a collective or transfer), else idle.
        const auto label = blocking_producer >= 0 ? collective_label_.find(blocking_producer)
                                                  : collective_label_.end();
        accounting.seconds[label != collective_label_.end() ? label->second : "idle"] +=
            start - tensorcore_free_;
      }
      end = start + cost.seconds;
      for (const TensorId input : op.inputs) {
        if (const auto found = finish_not_before_.find(input); found != finish_not_before_.end()) {
          end = std::max(end, found->second);
        }
      }
      tensorcore_free_ = end;
      accounting.seconds[std::string("compute_") + cost_category_name(cost.bound)] += cost.seconds;
      OpProfile& profile = accounting.ops[op.id];
      profile.region = info.name;
      profile.op = std::string(op_kind_name(op.kind)) + " " + op.name;
      profile.bound = cost_category_name(cost.bound);
      profile.seconds += cost.seconds;
      profile.calls += 1;
      accounting.matmul_flops += cost.matmul_flops;
      if (record && cost.seconds > 0) {
        timing.trace.push_back({op.name, "TensorCore", info.name, start, cost.seconds});
      }
    }
    op_span_[op.id] = {start, end};
    double output_ready = end;
    if (overlapped_with_matmul && op.kind == OpKind::kAllGather) {
      // The consumer starts on the first chunk and cannot finish before the last one.
      output_ready =
          start + (end - start) / static_cast<double>(std::max<int64_t>(1, op.attrs.group_size));
      for (const TensorId output : op.outputs) {
        finish_not_before_[output] = end;
      }
    }
    for (const TensorId output : op.outputs) {
      ready_[static_cast<size_t>(output)] = output_ready;
    }
    last_event_end_ = std::max(last_event_end_, end);
    return end;
  }

  static constexpr size_t kMaxTraceEvents = 200000;

  const StepProgram& program_;
  const Graph& graph_;
  PerfOptions options_;
  std::vector<double> ready_;
  std::vector<TensorId> carry_source_;
  std::vector<bool> weight_only_;
  std::vector<bool> fused_;
  std::map<int, std::string> collective_label_;
  std::map<int, std::pair<double, double>> op_span_;  // op id -> (start, end), latest iteration
  std::map<TensorId, double> finish_not_before_;      // collective-matmul chunks still arriving
  Accounting microbatch_accounting_;
  Timeline ici_;
  Timeline dcn_;
  Timeline host_;
  Timeline sparse_core_;
  double tensorcore_free_ = 0;
  double last_event_end_ = 0;
  double prefetch_from_ = 0;
  double iteration_weight_ = 1;
  double deferred_dcn_seconds_ = 0;
};

}  // namespace

PerfOptions perf_options_from_config(const Config& config, const ChipSpec& chip) {
  PerfOptions options;
  options.cost.chip = &chip;
  options.cost.program_efficiency = chip.program_efficiency;
  const std::string attention = config.get_string("attention");
  options.cost.flash_attention = attention != "dot_product";
  options.cost.block_q = config.get_int("sa_block_q");
  options.cost.block_kv = config.get_int("sa_block_kv");
  const std::string quantization = config.get_string("quantization");
  options.cost.int8_matmuls = quantization == "int8" || quantization == "intmp";
  options.cost.fp8_matmuls = quantization.rfind("fp8", 0) == 0 || quantization == "nanoo_fp8";
  const std::string offload = config.get_string("sparse_core_collective_offload");
  options.sparse_core_offload =
      offload == "on" || (offload == "auto" && chip.sparsecore_collective_offload_default > 0);
  options.collective_matmul = config.get_bool("collective_matmul");
  return options;
}

StepTiming simulate_step(const StepProgram& program, const PerfOptions& options) {
  return Simulator(program, options).run();
}

}  // namespace tpusim
