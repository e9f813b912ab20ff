#include "sim/memory/memory_model.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/mechanisms.h"
#include "model/ir/op_kind_traits.h"
#include "sim/memory/liveness.h"

namespace tpusim {
namespace {

enum class Category { kWeight, kOptimizer, kGradient, kSaved, kOffloaded, kTemporary, kIgnored };

// One iteration's temporaries at their peak.
struct RegionTemporaries {
  double gathered = 0;
  double other = 0;
  double total() const { return gathered + other; }
};

class MemoryModel {
 public:
  MemoryModel(const StepProgram& program, const MechanismSet& mechanisms)
      : program_(program),
        mechanisms_(mechanisms),
        graph_(program.program.graph),
        liveness_(program_liveness(program)) {
    const size_t tensors = graph_.tensors().size();
    bytes_.reserve(tensors);
    for (const Tensor& tensor : graph_.tensors()) {
      bytes_.push_back(static_cast<double>(tensor.bytes()));
    }
    cache_.resize(graph_.regions().size());
    live_.assign(tensors, LiveAs::kDead);
    dies_after_.assign(tensors, Liveness::kNone);
    counted_.assign(tensors, 0);
  }

  MemoryEstimate run() {
    classify();
    const size_t regions = graph_.regions().size();
    std::vector<double> saved(regions, 0);  // per iteration, by forward region
    std::vector<double> offloaded(regions, 0);
    std::vector<double> grads(regions, 0);  // per iteration, by backward region
    MemoryBreakdown persistent;
    for (const Tensor& tensor : graph_.tensors()) {
      const Region& owner = graph_.region(tensor.region);
      // Parameters (and their moments) exist once per iteration of a scanned layer region, once
      // in all for a region whose iterations share them, once per held layer in a pipeline stage.
      const auto repeat = static_cast<double>(owner.parameter_sets());
      const double bytes = bytes_[static_cast<size_t>(tensor.id)];
      switch (category_[static_cast<size_t>(tensor.id)]) {
        case Category::kWeight:
          persistent.weights += bytes * repeat;
          break;
        case Category::kOptimizer:
          persistent.optimizer_state += bytes * repeat;
          break;
        case Category::kGradient:
          grads[static_cast<size_t>(tensor.region)] += bytes;
          break;
        case Category::kSaved:
          saved[static_cast<size_t>(tensor.region)] += bytes;
          break;
        case Category::kOffloaded:
          offloaded[static_cast<size_t>(tensor.region)] += bytes;
          break;
        case Category::kTemporary:  // counted op by op in the scan below
        case Category::kIgnored:
          break;
      }
    }
    MemoryEstimate estimate;
    auto consider = [&](const std::string& where, double saved_bytes, double grad_bytes,
                        double host_bytes, const RegionTemporaries& temporaries) {
      MemoryBreakdown breakdown = persistent;
      breakdown.saved_activations = saved_bytes;
      breakdown.gradients = grad_bytes;
      breakdown.gathered_weights = temporaries.gathered;
      breakdown.temporaries = temporaries.other;
      estimate.timeline.push_back({where, breakdown, host_bytes});
      if (breakdown.total() > estimate.peak_bytes || estimate.peak_region.empty()) {
        estimate.peak_bytes = breakdown.total();
        estimate.at_peak = breakdown;
        estimate.peak_region = where;
        estimate.host_offloaded_bytes = host_bytes;
      }
    };
    const std::vector<double> loop_buffers = pipeline_loop_buffers();
    // Forward: saved activations pile up region by region.
    double saved_so_far = 0;
    double host_so_far = 0;
    std::vector<int> forward_regions;
    for (int region = 0; region < static_cast<int>(regions); ++region) {
      const Region& info = graph_.region(region);
      if (info.phase != Phase::kForward) {
        continue;
      }
      forward_regions.push_back(region);
      const auto repeat = static_cast<double>(info.repeat);
      saved_so_far +=
          saved[static_cast<size_t>(region)] * repeat + loop_buffers[static_cast<size_t>(region)];
      host_so_far += offloaded[static_cast<size_t>(region)] * repeat;
      consider(info.name, saved_so_far, 0, host_so_far, temporaries_of(region));
    }
    // Backward, in program order (reverse of forward): saved activations drain, gradients grow.
    double grads_so_far = 0;
    for (int region = 0; region < static_cast<int>(regions); ++region) {
      const Region& info = graph_.region(region);
      if (info.phase != Phase::kBackward) {
        continue;
      }
      const auto forward = static_cast<size_t>(info.forward_region);
      const auto repeat = static_cast<double>(info.repeat);
      const double saved_here = saved[forward];
      const double host_here = offloaded[forward];
      // Shared parameters accumulate one gradient over all iterations; a pipeline stage one per
      // layer it holds, whichever iterations use it.
      const double grads_here =
          grads[static_cast<size_t>(region)] * static_cast<double>(info.parameter_sets()) / repeat;
      const RegionTemporaries temporaries = temporaries_of(region);
      consider(info.name + " (first iteration)", saved_so_far, grads_so_far + grads_here,
               host_so_far, temporaries);
      consider(info.name + " (last iteration)", saved_so_far - saved_here * (repeat - 1),
               grads_so_far + grads_here * repeat, host_so_far - host_here * (repeat - 1),
               temporaries);
      saved_so_far -= saved_here * repeat + loop_buffers[forward];
      host_so_far -= host_here * repeat;
      grads_so_far += grads_here * repeat;
    }
    for (int region = 0; region < static_cast<int>(regions); ++region) {
      const Region& info = graph_.region(region);
      if (info.phase == Phase::kOptimizer) {
        consider(info.name, 0, grads_so_far, 0, temporaries_of(region));
      }
    }
    estimate.capacity_bytes =
        program_.slice.chip->hbm_usable_bytes_per_device() * (1.0 - program_.hbm_headroom_fraction);
    estimate.fits = estimate.peak_bytes <= estimate.capacity_bytes;
    return estimate;
  }

 private:
  // A pipeline's loop buffers (MaxText pipeline.py), alive from its forward loop to the end of
  // its backward loop, counted with the saved activations: the stage's share of the inputs
  // (state_io: M / S microbatches), the hand-over buffer (one), and with circular repeats and
  // more microbatches than stages the storage of the last stage's outputs until their next
  // pass (circ_storage: M). One microbatch here is the loop input's bytes on this device.
  std::vector<double> pipeline_loop_buffers() const {
    const size_t regions = graph_.regions().size();
    std::vector<double> loop_buffers(regions, 0);
    const PipelineSchedule& pipeline = program_.step->forward_info.pipeline;
    for (const Graph::Carry& carry : graph_.carries()) {
      const Tensor& into = graph_.tensor(carry.to);
      const Region& loop = graph_.region(into.region);
      if (pipeline.active() && loop.pipelined() && loop.phase == Phase::kForward &&
          graph_.tensor(carry.from).region != into.region) {
        const bool circular_storage =
            pipeline.repeats > 1 && pipeline.microbatches > pipeline.stages;
        const int64_t microbatches = pipeline.microbatches / pipeline.stages + 1 +
                                     (circular_storage ? pipeline.microbatches : 0);
        loop_buffers[static_cast<size_t>(into.region)] =
            bytes_[static_cast<size_t>(into.id)] * static_cast<double>(microbatches);
      }
    }
    // pipeline_fsdp_ag_once: every layer the stage holds stays gathered through both loops, and
    // the gathered-size gradients sum until the reduce-scatter after the backward loop (counted
    // from the forward loop on: an upper bound in the forward part).
    for (const Op& op : graph_.ops()) {
      const Region& loop = graph_.region(op.region);
      if (op.attrs.iteration_share == 1 || !loop.pipelined()) {
        continue;
      }
      const int forward = loop.phase == Phase::kForward ? op.region : loop.forward_region;
      const bool forward_gather = op.kind == OpKind::kAllGather && op.phase == Phase::kForward;
      const bool reduction = is_reducing_collective(op.kind);
      if (forward >= 0 && (forward_gather || reduction)) {
        const TensorId full = forward_gather ? op.outputs[0] : op.inputs[0];
        loop_buffers[static_cast<size_t>(forward)] +=
            bytes_[static_cast<size_t>(full)] * static_cast<double>(loop.parameter_sets());
      }
    }
    return loop_buffers;
  }

  void classify() {
    const size_t count = graph_.tensors().size();
    category_.assign(count, Category::kTemporary);
    std::vector<std::optional<RematDecision>> saved(count);
    for (const auto& [global, decision] : program_.step->saved) {
      saved[static_cast<size_t>(program_.program.local_of_global[static_cast<size_t>(global)])] =
          decision;
    }
    for (const Tensor& tensor : graph_.tensors()) {
      const auto id = static_cast<size_t>(tensor.id);
      const Phase phase = graph_.region(tensor.region).phase;
      if (liveness_.is_state(tensor.id)) {
        category_[id] =
            tensor.kind == TensorKind::kParameter ? Category::kWeight : Category::kOptimizer;
      } else if (phase == Phase::kOptimizer) {
        category_[id] = Category::kIgnored;  // updates are written in place (donated buffers)
      } else if (liveness_.is_final_gradient(tensor.id)) {
        category_[id] = Category::kGradient;
      } else if (saved[id].has_value()) {
        category_[id] =
            *saved[id] == RematDecision::kOffload ? Category::kOffloaded : Category::kSaved;
      } else if (tensor.kind == TensorKind::kInput) {
        category_[id] = Category::kSaved;  // the batch stays for the whole step
      }
    }
    // An offloaded tensor's device copy lives until its host_offload op: a temporary.
    for (const Op& op : graph_.ops()) {
      if (op.kind == OpKind::kHostOffload) {
        category_[static_cast<size_t>(op.outputs[0])] = Category::kIgnored;
      }
    }
  }

  bool is_weight_source(TensorId id) const {
    const Tensor& tensor = graph_.tensor(id);
    if (tensor.kind == TensorKind::kParameter) {
      return true;
    }
    const int producer = graph_.producer(id);
    if (producer < 0) {
      return false;
    }
    const Op& op = graph_.ops()[static_cast<size_t>(producer)];
    return op.kind == OpKind::kElementwise && op.attrs.function == ElementwiseFn::kCast &&
           graph_.tensor(op.inputs[0]).kind == TensorKind::kParameter;
  }

  // Peak temporaries of one iteration of `region`, by a linear scan of its ops: a temporary is
  // live from the op that first touches it to the last op that reads it (an output nobody reads
  // dies at once, unless it is carried to the next region or iteration; Liveness decides).
  RegionTemporaries temporaries_of(int region) {
    std::optional<RegionTemporaries>& cached = cache_[static_cast<size_t>(region)];
    if (cached.has_value()) {
      return *cached;
    }
    scan_ = Scan{};
    scan_.region = region;
    scan_.backward = graph_.region(region).phase == Phase::kBackward;
    const std::vector<const Op*>& ops = liveness_.region_ops(region);
    for (size_t position = 0; position < ops.size(); ++position) {
      const Op& op = *ops[position];
      const auto index = static_cast<int>(position);
      for (const TensorId input : op.inputs) {
        add(input, false, index);  // produced elsewhere (carry, reload): live from the region start
      }
      const bool gathers_weight = op.kind == OpKind::kAllGather && is_weight_source(op.inputs[0]);
      for (const TensorId output : op.outputs) {
        add(output, gathers_weight, index);
      }
      if (scan_.taken_over.empty()) {
        scan_.taken_over.assign(graph_.tensors().size(), false);
      }
      reuse_operand_buffer(op, index);
      // While the op runs: its live tensors plus its own scratch (dot_product scores).
      const double scratch = attention_scores_bytes(op);
      if (scan_.current.total() + scratch > scan_.peak.total()) {
        scan_.peak = scan_.current;
        scan_.peak.other += scratch;
      }
      free_dead(index);
    }
    // Leave the per-tensor scratch clean for the next region.
    for (const TensorId id : scan_.live) {
      live_[static_cast<size_t>(id)] = LiveAs::kDead;
    }
    cached = scan_.peak;
    return scan_.peak;
  }

  // A temporary first touched at position `index` of the scanned region becomes live (as a
  // gathered weight or as another temporary) until Liveness says it dies.
  void add(TensorId id, bool gathered, int index) {
    const auto slot = static_cast<size_t>(id);
    if (category_[slot] != Category::kTemporary || live_[slot] != LiveAs::kDead) {
      return;
    }
    live_[slot] = gathered ? LiveAs::kGathered : LiveAs::kOther;
    scan_.live.push_back(id);
    dies_after_[slot] = liveness_.dies_after_in_region(id, scan_.region, index);
    counted_[slot] = bytes_[slot];
    (gathered ? scan_.current.gathered : scan_.current.other) += bytes_[slot];
  }

  // XLA's buffer assignment lets an elementwise-shaped op write its result over an operand it
  // reads for the last time (the logits' gradient over the saved logits, a residual over its
  // input): the output then takes no new memory. A saved activation (freed with its backward
  // region) can be taken over once, by an op of that backward region that reads it last.
  void reuse_operand_buffer(const Op& op, int index) {
    if (!op_kind_traits(op.kind).writes_in_place ||
        !mechanisms_.enabled(Mechanism::kInPlaceBuffers)) {
      return;
    }
    for (const TensorId output : op.outputs) {
      const auto out_slot = static_cast<size_t>(output);
      if (category_[out_slot] != Category::kTemporary || counted_[out_slot] <= 0) {
        continue;
      }
      for (const TensorId input : op.inputs) {
        const auto in_slot = static_cast<size_t>(input);
        if (bytes_[in_slot] < bytes_[out_slot] ||
            liveness_.last_use_in_region(input, scan_.region) != index ||
            graph_.tensor(input).kind == TensorKind::kInput) {
          continue;
        }
        const bool temporary = category_[in_slot] == Category::kTemporary &&
                               live_[in_slot] == LiveAs::kOther && counted_[in_slot] > 0 &&
                               dies_after_[in_slot] == index;
        const bool saved =
            scan_.backward && category_[in_slot] == Category::kSaved && !scan_.taken_over[in_slot];
        if (!temporary && !saved) {
          continue;
        }
        if (temporary) {
          scan_.current.other -= counted_[in_slot];
          counted_[in_slot] = 0;
        } else {
          scan_.taken_over[in_slot] = true;
          (live_[out_slot] == LiveAs::kGathered ? scan_.current.gathered : scan_.current.other) -=
              counted_[out_slot];
          counted_[out_slot] = 0;
        }
        break;
      }
    }
  }

  // Frees what the op at `index` read for the last time (and outputs nobody reads), by tensor id.
  void free_dead(int index) {
    std::vector<TensorId>& dead = scan_.dead;
    dead.clear();
    for (const TensorId id : scan_.live) {
      if (dies_after_[static_cast<size_t>(id)] == index) {
        dead.push_back(id);
      }
    }
    std::sort(dead.begin(), dead.end());
    for (const TensorId id : dead) {
      const auto slot = static_cast<size_t>(id);
      (live_[slot] == LiveAs::kGathered ? scan_.current.gathered : scan_.current.other) -=
          counted_[slot];
      live_[slot] = LiveAs::kDead;
    }
    std::erase_if(scan_.live,
                  [this](TensorId id) { return live_[static_cast<size_t>(id)] == LiveAs::kDead; });
  }

  // attention=dot_product: the scores an attention op (or its gradient) materializes.
  double attention_scores_bytes(const Op& op) const {
    if (!program_.attention_scores_in_hbm || !op_kind_traits(op.kind).attention) {
      return 0;
    }
    const bool gradient = op.kind == OpKind::kAttentionGrad;
    const size_t first = gradient ? 1 : 0;  // the gradient's inputs start with dy
    const Tensor& query = graph_.tensor(op.inputs[first]);
    const Tensor& key = graph_.tensor(op.inputs[first + 1]);
    const auto size_of = [](const Tensor& tensor, const char* name) {
      const int dim = tensor.dim_index(name);
      return dim < 0 ? 1.0 : static_cast<double>(tensor.dims[static_cast<size_t>(dim)].size);
    };
    // DeepSeek-V4's compressed blocks (the last forward input) are score columns too.
    const double blocks =
        op.attrs.compress_ratio > 0
            ? size_of(graph_.tensor(op.inputs[op.inputs.size() - (gradient ? 2 : 1) -
                                              (op.attrs.block_topk > 0 ? 1 : 0)]),
                      "length")
            : 0.0;
    const double elements = size_of(query, "batch") * size_of(query, "heads") *
                            size_of(query, "length") * (size_of(key, "length") + blocks);
    return elements * (gradient ? 2.0 : 1.0) * dtype_bytes(query.dtype);
  }

  enum class LiveAs : uint8_t { kDead, kOther, kGathered };

  // The scan of one region's iteration by temporaries_of.
  struct Scan {
    int region = 0;
    bool backward = false;
    std::vector<TensorId> live;  // live temporaries, in the order they became live
    std::vector<TensorId> dead;  // scratch of free_dead
    RegionTemporaries current;
    RegionTemporaries peak;
    std::vector<bool> taken_over;  // by tensor id: saved activations an output took over
  };

  const StepProgram& program_;
  MechanismSet mechanisms_;
  const Graph& graph_;
  const Liveness liveness_;
  std::vector<double> bytes_;                            // by tensor id
  std::vector<Category> category_;                       // by tensor id
  std::vector<std::optional<RegionTemporaries>> cache_;  // by region
  Scan scan_;
  // Scratch of temporaries_of, by tensor id: whether it is live (and as what), and the position
  // after which it dies.
  std::vector<LiveAs> live_;
  std::vector<int> dies_after_;
  std::vector<double> counted_;  // bytes a live temporary holds (0 once another took them over)
};

}  // namespace

MemoryEstimate estimate_memory(const StepProgram& program, const MechanismSet& mechanisms) {
  return MemoryModel(program, mechanisms).run();
}

}  // namespace tpusim
