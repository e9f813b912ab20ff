#include "sim/explore/explorer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "hw/chip_spec.h"
#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sharding/logical_rules.h"
#include "sharding/step_program.h"
#include "sim/estimate/estimate.h"
#include "sim/explore/pipeline_schedules.h"
#include "sim/explore/step_bounds.h"
#include "sim/functional/transport.h"
#include "sim/memory/memory_model.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {
namespace {

constexpr const char* kExploreOrigin = "explore";
constexpr const char* kAxisDoesNotDivide = "axis_does_not_divide";
constexpr const char* kSamePlacement = "same_placement";
constexpr const char* kWeightsExceedHbm = "weights_exceed_hbm";
constexpr const char* kDoesNotFitHbm = "does_not_fit_hbm";
constexpr const char* kCannotBeatTop = "cannot_beat_top";

// The best objective still open to a candidate whose step takes at least `step_lower_bound`.
double objective_upper_bound(ExploreObjective objective, double step_lower_bound,
                             double model_tflops, double mfu_peak, double tokens, double chips) {
  // Bounds summed in another order than the simulator's can exceed its time by a few ulp (and a
  // policy's bound from the none program its own bound likewise): give them that slack.
  step_lower_bound *= 1 - 1e-9;
  switch (objective) {
    case ExploreObjective::kMfu:
      return model_tflops / step_lower_bound / mfu_peak;
    case ExploreObjective::kStepTime:
      return -step_lower_bound;
    case ExploreObjective::kTokensPerSecondPerChip:
    case ExploreObjective::kTokensPerDollar:
      break;
  }
  return tokens / step_lower_bound / chips;
}

// The objective a candidate must beat to enter the top N, shared by the worker threads (it only
// rises). Branch and bound: a program whose upper bound is below it cannot change the result.
class SharedThreshold {
 public:
  // Disabled: stays at -infinity, so nothing is ever bounded out.
  explicit SharedThreshold(bool enabled) : enabled_(enabled) {}
  double get() const { return value_.load(std::memory_order_relaxed); }
  void raise(double value) {
    if (!enabled_) {
      return;
    }
    double current = value_.load(std::memory_order_relaxed);
    while (value > current && !value_.compare_exchange_weak(current, value)) {
    }
  }

 private:
  bool enabled_ = true;
  std::atomic<double> value_{-std::numeric_limits<double>::infinity()};
};

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Training steps shared by all meshes, by (batch, remat); built on first use. The attention kind
// is not part of the key: it selects the attention kernel's cost (CostContext::flash_attention),
// not the ops, tensors or memory of the step (explore_test checks that both kinds build the same
// step), so one program serves both kinds as timing variants.
class TrainingStepCache {
 public:
  TrainingStepCache(const Config& config, const SearchSpace& space)
      : config_(config), space_(space) {
    for (size_t remat = 0; remat < space.remats.size(); ++remat) {
      if (space.remats[remat].policy == "none" && space.remats[remat].tensors.empty()) {
        none_ = remat;
      }
    }
  }

  // As a remat index: remat_policy=none, whether or not the space has it (bounds).
  static constexpr size_t kNoRemat = std::numeric_limits<size_t>::max();

  std::shared_ptr<const TrainingStep> get(size_t batch, size_t remat) {
    return entry(batch, remat).step;
  }

  // What `remat` recomputes beyond remat_policy=none (see remat_bounds).
  const std::vector<RecomputedOp>& recomputed(size_t batch, size_t remat) {
    Entry& found = entry(batch, remat);
    std::call_once(found.recomputed_once, [&] {
      const std::shared_ptr<const TrainingStep> none = get(batch, kNoRemat);
      if (none != found.step) {
        found.recomputed = recomputed_beyond_none(*found.step, *none);
      }
    });
    return found.recomputed;
  }

 private:
  struct Entry {
    std::shared_ptr<const TrainingStep> step;
    std::once_flag recomputed_once;
    std::vector<RecomputedOp> recomputed;
  };

  Entry& entry(size_t batch, size_t remat) {
    if (remat == kNoRemat && none_ != kNoRemat) {
      remat = none_;  // the space's own "none": one step, so programs can be shared
    }
    const std::string key = std::to_string(batch) + "/" + std::to_string(remat);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (const auto found = steps_.find(key); found != steps_.end()) {
        return *found->second;
      }
    }
    Candidate candidate;
    candidate.batch = space_.batches[batch];
    candidate.remat = remat == kNoRemat ? 0 : static_cast<int>(remat);
    candidate.attention = space_.attention_kinds.front();  // does not change the step (above)
    Config config;
    {
      std::lock_guard<std::mutex> lock(mutex_);  // Config copies share yaml-cpp nodes
      config = candidate_config(config_, space_, candidate);
      if (remat == kNoRemat) {
        config.set("remat_policy", "none", kExploreOrigin);
      }
    }
    auto built = std::make_unique<Entry>();
    built->step = std::make_shared<const TrainingStep>(
        build_training_step(config, space_.batches[batch].microbatch));
    std::lock_guard<std::mutex> lock(mutex_);
    // Another thread may have built it meanwhile: the first one stays (steps are shared).
    return *steps_.emplace(key, std::move(built)).first->second;
  }

  const Config& config_;
  const SearchSpace& space_;
  size_t none_ = kNoRemat;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Entry>> steps_;
};

// The jit-argument divisibility rule (JAX requires parameters and inputs to split evenly). The
// logical rules assign mesh axes to dims independently of the axis sizes (sizes only drop axes of
// size 1, which split nothing), so the assignment is resolved once and each mesh is checked with
// integer products.
class Divisibility {
 public:
  Divisibility(const TrainingStep& step, const LogicalAxisRules& rules) {
    MeshShape every_axis;  // all axes > 1: nothing is dropped
    every_axis.ici.fill(2);
    every_axis.dcn.fill(1);
    for (const Tensor& tensor : step.graph.tensors()) {
      if (tensor.kind != TensorKind::kParameter && tensor.kind != TensorKind::kInput) {
        continue;
      }
      const std::vector<std::vector<int>> axes = rules.shard_dims(tensor.dims, every_axis);
      for (size_t dim = 0; dim < tensor.dims.size(); ++dim) {
        if (axes[dim].empty()) {
          continue;
        }
        const bool batch = tensor.kind == TensorKind::kInput && dim == 0;
        (batch ? batch_dims_ : fixed_dims_).push_back({tensor.dims[dim].size, axes[dim]});
      }
    }
  }

  bool parameters_divide(const MeshShape& mesh) const {
    return std::all_of(fixed_dims_.begin(), fixed_dims_.end(),
                       [&](const SplitDim& dim) { return dim.size % dim.shards(mesh) == 0; });
  }
  bool batch_divides(const MeshShape& mesh, int64_t microbatch) const {
    return std::all_of(batch_dims_.begin(), batch_dims_.end(),
                       [&](const SplitDim& dim) { return microbatch % dim.shards(mesh) == 0; });
  }

 private:
  struct SplitDim {
    int64_t size = 0;
    std::vector<int> axes;
    int64_t shards(const MeshShape& mesh) const {
      int64_t product = 1;
      for (const int axis : axes) {
        product *= mesh.size(axis);
      }
      return product;
    }
  };
  std::vector<SplitDim> fixed_dims_;  // parameter dims and input dims other than the batch
  std::vector<SplitDim> batch_dims_;  // the inputs' batch dims (size varies with the batch)
};

double objective_value(ExploreObjective objective, double step_seconds, double mfu,
                       double tokens_per_s_per_chip) {
  switch (objective) {
    case ExploreObjective::kMfu:
      return mfu;
    case ExploreObjective::kStepTime:
      return -step_seconds;
    case ExploreObjective::kTokensPerSecondPerChip:
    case ExploreObjective::kTokensPerDollar:
      break;
  }
  return tokens_per_s_per_chip;
}

struct Scored {
  Candidate candidate;
  double objective = 0;
};

bool better(const Scored& a, const Scored& b) {
  if (a.objective != b.objective) {
    return a.objective > b.objective;
  }
  return a.candidate.order < b.candidate.order;
}

// What one worker thread found.
struct WorkerResult {
  std::vector<Scored> top;  // kept sorted best first, at most N
  int64_t evaluated = 0;
  int64_t programs = 0;
  std::map<std::string, int64_t> pruned;
  double smallest_peak = std::numeric_limits<double>::infinity();
  double capacity = 0;
  // A uniform sample of what was evaluated (reservoir sampling, a fixed seed per worker).
  std::vector<ExploreSample> samples;
  int64_t samples_seen = 0;
  uint64_t random_state = 0x9E3779B97F4A7C15ULL;

  void sample(const ExploreSample& value, size_t limit) {
    if (limit == 0) {
      return;
    }
    ++samples_seen;
    if (samples.size() < limit) {
      samples.push_back(value);
      return;
    }
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    const uint64_t slot = random_state % static_cast<uint64_t>(samples_seen);
    if (slot < limit) {
      samples[slot] = value;
    }
  }

  void offer(Scored scored, size_t limit) {
    if (top.size() == limit && !better(scored, top.back())) {
      return;
    }
    top.insert(std::upper_bound(top.begin(), top.end(), scored, better), std::move(scored));
    if (top.size() > limit) {
      top.pop_back();
    }
  }
};

// Evaluates every candidate of one mesh into `out`.
class MeshEvaluator {
 public:
  MeshEvaluator(const Config& config, const SearchSpace& space, const ExploreOptions& options,
                const LogicalAxisRules& rules, TrainingStepCache& steps,
                const std::vector<double>& model_tflops_per_batch, const PerfOptions& base_perf,
                SharedThreshold& threshold, const Divisibility& divisibility)
      : config_(config),
        space_(space),
        options_(options),
        rules_(rules),
        steps_(steps),
        model_tflops_(model_tflops_per_batch),
        base_perf_(base_perf),
        threshold_(threshold),
        divisibility_(divisibility) {
    // The timing variants of one program, in the space's order: attention kinds, then their
    // perf choices. Consecutive variants with the same kind and block sizes share a cost context.
    for (size_t kind = 0; kind < space.attention_kinds.size(); ++kind) {
      const std::string& name = space.attention_kinds[kind];
      const std::vector<PerfChoice> choices = space.perf_choices(name);
      for (size_t choice = 0; choice < choices.size(); ++choice) {
        const PerfChoice& perf = choices[choice];
        if (choice == 0 || perf.block_q != choices[choice - 1].block_q ||
            perf.block_kv != choices[choice - 1].block_kv) {
          contexts_.push_back(cost_context(name, perf));
        }
        variants_.push_back({kind, perf, contexts_.size() - 1});
      }
    }
  }

  void evaluate(size_t mesh_index, WorkerResult& out) {
    const MeshShape& mesh = space_.meshes[mesh_index];
    const auto batches = space_.batches.size();
    const int64_t per_batch = space_.candidates_per_mesh_and_batch();
    const auto per_placement = static_cast<int64_t>(variants_.size());
    const auto placements = static_cast<int64_t>(space_.placements.size());
    const bool parameters_divide = divisibility_.parameters_divide(mesh);
    std::vector<size_t> dividing;
    for (size_t batch = 0; batch < batches; ++batch) {
      if (parameters_divide &&
          divisibility_.batch_divides(mesh, space_.batches[batch].microbatch)) {
        dividing.push_back(batch);
      } else {
        out.pruned[kAxisDoesNotDivide] += per_batch;
      }
    }
    if (dividing.empty()) {
      return;
    }
    // The distinct placements of this mesh: a choice whose first axis has size 1 here, or that
    // lays every axis where an earlier choice does, is the same candidate again.
    std::vector<DeviceMesh> placed;
    std::vector<int> placement_ids;
    for (size_t choice = 0; choice < space_.placements.size(); ++choice) {
      const std::vector<int>& first = space_.placements[choice];
      DeviceMesh candidate_mesh;
      const bool trivial = choice > 0 && std::all_of(first.begin(), first.end(), [&](int axis) {
                             return mesh.ici[static_cast<size_t>(axis)] == 1;
                           });
      if (!trivial) {
        candidate_mesh = place_mesh(mesh, space_.slice, first);
      }
      if (trivial || std::any_of(placed.begin(), placed.end(), [&](const DeviceMesh& other) {
            return same_layout(other, candidate_mesh);
          })) {
        out.pruned[kSamePlacement] += static_cast<int64_t>(dividing.size()) *
                                      static_cast<int64_t>(space_.remats.size()) * per_placement;
        continue;
      }
      placed.push_back(std::move(candidate_mesh));
      placement_ids.push_back(static_cast<int>(choice));
    }
    // Candidates below one (batch, remat) that are not duplicates.
    const int64_t per_remat = per_placement * static_cast<int64_t>(placed.size());
    const int64_t per_distinct_batch = per_remat * static_cast<int64_t>(space_.remats.size());
    StepProgram program;
    program.slice = space_.slice;
    program.mesh = placed.front();  // partitioning reads only the mesh's shape
    const ChipSpec& chip = *space_.slice.chip;
    const double chips = space_.slice.total_chips();
    const int64_t length = config_.get_int("max_target_length");
    const size_t remats = space_.remats.size();
    bool first_program = true;
    // Makes `program` the program of (batch, remat), partitioning only when its training step is
    // not the one it already holds (remat_policy=none serves both as the bound program and as a
    // candidate).
    auto build = [&](size_t batch, size_t remat) {
      std::shared_ptr<const TrainingStep> step = steps_.get(batch, remat);
      if (step == program.step) {
        return;
      }
      const BatchChoice& choice = space_.batches[batch];
      program.step = std::move(step);
      program.microbatch = choice.microbatch;
      program.accumulation_steps = choice.accumulation_steps;
      program.global_batch = choice.microbatch * choice.accumulation_steps;
      program.program = partition(*program.step, rules_, program.mesh);
      ++out.programs;
    };
    // Memory depends on the attention kind too (dot_product materializes its scores), so fit is
    // tracked per (remat, kind); a kind's candidates of one remat are that many per (batch).
    const size_t kinds = space_.attention_kinds.size();
    std::vector<int64_t> per_kind(kinds, 0);
    for (const Variant& variant : variants_) {
      per_kind[variant.kind] += static_cast<int64_t>(placed.size());
    }
    std::vector<std::vector<bool>> fitted(remats, std::vector<bool>(kinds, true));
    auto any_fits = [](const std::vector<bool>& by_kind) {
      return std::any_of(by_kind.begin(), by_kind.end(), [](bool fits) { return fits; });
    };
    // Prunes one remat's candidates at this batch: those of kinds that still fit for `reason`.
    auto prune_remat = [&](size_t remat, const char* reason) {
      for (size_t kind = 0; kind < kinds; ++kind) {
        out.pruned[fitted[remat][kind] ? reason : kDoesNotFitHbm] += per_kind[kind];
      }
    };
    for (size_t at = 0; at < dividing.size(); ++at) {
      const size_t batch = dividing[at];
      if (std::none_of(fitted.begin(), fitted.end(), any_fits)) {
        // Every policy failed to fit a smaller batch: the larger ones cannot fit either.
        out.pruned[kDoesNotFitHbm] +=
            static_cast<int64_t>(dividing.size() - at) * per_distinct_batch;
        break;
      }
      const BatchChoice& choice = space_.batches[batch];
      const double tokens = static_cast<double>(choice.microbatch * choice.accumulation_steps) *
                            static_cast<double>(length);
      auto best_possible = [&](double step_lower_bound) {
        return objective_upper_bound(options_.objective, step_lower_bound, model_tflops_[batch],
                                     chip.mfu_peak_bf16_tflops_per_device, tokens, chips);
      };
      auto lowest = [](const std::vector<double>& bounds) {
        return *std::min_element(bounds.begin(), bounds.end());
      };
      // Branch and bound over the remat policies, from the remat_policy=none program: its
      // TensorCore bound bounds every policy (skip the batch if even that cannot beat the top N),
      // and with each policy's recomputation added it bounds that policy without partitioning it.
      std::optional<ComputeBounds> none;
      if (remats > 1 && !first_program &&
          threshold_.get() > -std::numeric_limits<double>::infinity()) {
        build(batch, TrainingStepCache::kNoRemat);
        none = tensorcore_lower_bounds(program, contexts_, /*keep_forward_ops=*/true);
        if (best_possible(lowest(none->step)) < threshold_.get()) {
          for (size_t remat = 0; remat < remats; ++remat) {
            prune_remat(remat, kCannotBeatTop);
          }
          continue;
        }
      }
      for (size_t remat = 0; remat < remats; ++remat) {
        if (!any_fits(fitted[remat])) {
          out.pruned[kDoesNotFitHbm] += per_remat;  // a smaller batch did not fit
          continue;
        }
        if (none.has_value() &&
            best_possible(lowest(remat_bounds(*none, steps_.recomputed(batch, remat),
                                              choice.accumulation_steps))) < threshold_.get()) {
          prune_remat(remat, kCannotBeatTop);
          continue;
        }
        build(batch, remat);
        program.attention_scores_in_hbm = false;
        const MemoryEstimate memory = estimate_memory(program);
        const double usable = memory.capacity_bytes * (1 - options_.limits.min_hbm_headroom);
        out.capacity = usable;
        out.smallest_peak = std::min(out.smallest_peak, memory.peak_bytes);  // the least of kinds
        if (first_program) {
          first_program = false;
          const double persistent = memory.at_peak.weights + memory.at_peak.optimizer_state;
          if (persistent > usable) {
            // Weights and optimizer state do not depend on batch, remat or attention.
            out.pruned[kWeightsExceedHbm] +=
                static_cast<int64_t>(dividing.size()) * per_distinct_batch;
            return;
          }
        }
        std::vector<double> kind_peaks(kinds, memory.peak_bytes);
        for (size_t kind = 0; kind < kinds; ++kind) {
          if (!fitted[remat][kind]) {
            out.pruned[kDoesNotFitHbm] += per_kind[kind];  // a smaller batch did not fit
            continue;
          }
          double peak = memory.peak_bytes;
          if (space_.attention_kinds[kind] == "dot_product") {
            program.attention_scores_in_hbm = true;
            peak = estimate_memory(program).peak_bytes;
            program.attention_scores_in_hbm = false;
          }
          kind_peaks[kind] = peak;
          if (peak > usable) {
            fitted[remat][kind] = false;
            out.pruned[kDoesNotFitHbm] += per_kind[kind];
            out.sample({0.0, 0.0, peak, false}, options_.max_samples);
          }
        }
        if (!any_fits(fitted[remat])) {
          continue;
        }
        const std::vector<double> context_bounds = tensorcore_lower_bounds(program, contexts_).step;
        std::optional<StepSimulator> simulator;  // shared by the timing variants below
        for (size_t which = 0; which < placed.size(); ++which) {
          program.mesh = placed[which];
          // The collectives' bounds depend on the placement and the perf switches, not on the
          // attention kernel: worked out on first need, by [offload][collective_matmul].
          std::array<std::array<std::optional<CollectiveBounds>, 2>, 2> collective_bounds;
          for (size_t index = 0; index < variants_.size(); ++index) {
            const Variant& variant = variants_[index];
            if (!fitted[remat][variant.kind]) {
              continue;  // counted above
            }
            PerfOptions perf_options = base_perf_;
            perf_options.record_details = false;  // ranking needs the times only
            perf_options.cost = contexts_[variant.context];
            perf_options.sparse_core_offload = variant.perf.sparse_core_offload == "on" ||
                                               (variant.perf.sparse_core_offload == "auto" &&
                                                chip.sparsecore_collective_offload_default > 0);
            perf_options.collective_matmul = variant.perf.collective_matmul;
            if (best_possible(context_bounds[variant.context]) < threshold_.get()) {
              out.pruned[kCannotBeatTop] += 1;
              continue;
            }
            if (!simulator.has_value()) {
              simulator.emplace(program);
            }
            std::optional<CollectiveBounds>& bounds =
                collective_bounds[perf_options.sparse_core_offload][perf_options.collective_matmul];
            if (!bounds.has_value()) {
              bounds = simulator->collective_bounds(perf_options);
            }
            // Collectives the TensorCore drives add to its compute; the busiest link bounds apart.
            const double step_bound =
                std::max(context_bounds[variant.context] + bounds->tensorcore_driven_seconds,
                         bounds->busiest_link_seconds);
            if (best_possible(step_bound) < threshold_.get()) {
              out.pruned[kCannotBeatTop] += 1;
              continue;
            }
            const StepTiming timing = simulator->run(perf_options);
            ++out.evaluated;
            const double step = timing.step_seconds;
            out.sample({step, tokens / step / chips, kind_peaks[variant.kind], true},
                       options_.max_samples);
            const double mfu = model_tflops_[batch] / step / chip.mfu_peak_bf16_tflops_per_device;
            const double per_chip = tokens / step / chips;
            Scored scored;
            scored.candidate = {mesh,
                                choice,
                                static_cast<int>(remat),
                                space_.attention_kinds[variant.kind],
                                variant.perf,
                                placement_ids[which],
                                0};
            scored.candidate.order =
                (((static_cast<int64_t>(mesh_index) * static_cast<int64_t>(batches) +
                   static_cast<int64_t>(batch)) *
                      static_cast<int64_t>(remats) +
                  static_cast<int64_t>(remat)) *
                     placements +
                 placement_ids[which]) *
                    per_placement +
                static_cast<int64_t>(index);
            scored.objective = objective_value(options_.objective, step, mfu, per_chip);
            out.offer(std::move(scored), top_size_);
            if (out.top.size() == top_size_) {
              threshold_.raise(out.top.back().objective);
            }
          }
        }
      }
    }
  }

 private:
  // One timing variant of a program: attention kind, perf switches and their cost context.
  struct Variant {
    size_t kind = 0;  // index into SearchSpace::attention_kinds
    PerfChoice perf;
    size_t context = 0;  // index into contexts_
  };

  CostContext cost_context(const std::string& attention, const PerfChoice& perf) const {
    CostContext cost = base_perf_.cost;
    cost.flash_attention = attention != "dot_product";
    if (perf.block_q > 0) {
      cost.block_q = perf.block_q;
      cost.block_kv = perf.block_kv;
    }
    return cost;
  }

  const Config& config_;
  const SearchSpace& space_;
  const ExploreOptions& options_;
  const LogicalAxisRules& rules_;
  TrainingStepCache& steps_;
  const std::vector<double>& model_tflops_;
  const PerfOptions& base_perf_;
  SharedThreshold& threshold_;
  const Divisibility& divisibility_;
  std::vector<CostContext> contexts_;  // the distinct attention cost contexts
  std::vector<Variant> variants_;      // per program, in the space's order
  size_t top_size_ = static_cast<size_t>(std::max(1, options_.top));
};

std::vector<std::string> maxtext_keys(const std::vector<std::string>& overrides) {
  // tpusim-only switches (XLA flags or a custom device order on a real TPU, not MaxText keys).
  std::vector<std::string> keys;
  for (const std::string& item : overrides) {
    if (item.rfind("sparse_core_collective_offload=", 0) != 0 &&
        item.rfind("collective_matmul=", 0) != 0 && item.rfind("mesh_placement_first=", 0) != 0) {
      keys.push_back(item);
    }
  }
  return keys;
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) {
    text += (text.empty() ? "" : " ") + item;
  }
  return text;
}

const std::vector<std::string>& prune_reasons() {
  static const std::vector<std::string> reasons = {
      kAxisDoesNotDivide, kSamePlacement, kWeightsExceedHbm, kDoesNotFitHbm, kCannotBeatTop};
  return reasons;
}

// The candidate at position `order` of the space's enumeration (the inverse of the order the
// evaluator gives: mesh, batch, remat, placement, attention kind, perf variant).
Candidate candidate_of_order(const SearchSpace& space, int64_t order) {
  std::vector<std::vector<PerfChoice>> choices;
  for (const std::string& kind : space.attention_kinds) {
    choices.push_back(space.perf_choices(kind));
  }
  const int64_t per_placement = space.variants_per_placement();
  const auto placements = static_cast<int64_t>(space.placements.size());
  const auto remats = static_cast<int64_t>(space.remats.size());
  const auto batches = static_cast<int64_t>(space.batches.size());
  Candidate candidate;
  candidate.order = order;
  int64_t within = order % per_placement;
  int64_t rest = order / per_placement;
  candidate.placement = static_cast<int>(rest % placements);
  rest /= placements;
  candidate.remat = static_cast<int>(rest % remats);
  rest /= remats;
  candidate.batch = space.batches[static_cast<size_t>(rest % batches)];
  candidate.mesh = space.meshes[static_cast<size_t>(rest / batches)];
  for (size_t kind = 0; kind < choices.size(); ++kind) {
    const auto count = static_cast<int64_t>(choices[kind].size());
    if (within < count) {
      candidate.attention = space.attention_kinds[kind];
      candidate.perf = choices[kind][static_cast<size_t>(within)];
      break;
    }
    within -= count;
  }
  return candidate;
}

// Merges every rank's counts and top N (exchanged as numbers: counts, then (order, objective)
// pairs, from which each candidate is rebuilt); every rank gets the same merged result.
WorkerResult merge_ranks(const WorkerResult& mine, Transport& transport, const SearchSpace& space,
                         size_t top) {
  std::vector<double> encoded = {static_cast<double>(mine.evaluated),
                                 static_cast<double>(mine.programs), mine.smallest_peak,
                                 mine.capacity};
  for (const std::string& reason : prune_reasons()) {
    const auto found = mine.pruned.find(reason);
    encoded.push_back(found == mine.pruned.end() ? 0.0 : static_cast<double>(found->second));
  }
  for (const Scored& scored : mine.top) {
    encoded.push_back(static_cast<double>(scored.candidate.order));
    encoded.push_back(scored.objective);
  }
  WorkerResult merged;
  for (const std::vector<double>& theirs : transport.all_gather(encoded)) {
    size_t at = 0;
    merged.evaluated += static_cast<int64_t>(theirs[at++]);
    merged.programs += static_cast<int64_t>(theirs[at++]);
    merged.smallest_peak = std::min(merged.smallest_peak, theirs[at++]);
    merged.capacity = std::max(merged.capacity, theirs[at++]);
    for (const std::string& reason : prune_reasons()) {
      const auto count = static_cast<int64_t>(theirs[at++]);
      if (count > 0) {
        merged.pruned[reason] += count;
      }
    }
    for (; at + 1 < theirs.size(); at += 2) {
      Scored scored;
      scored.candidate = candidate_of_order(space, static_cast<int64_t>(theirs[at]));
      scored.objective = theirs[at + 1];
      merged.offer(std::move(scored), top);
    }
  }
  return merged;
}

}  // namespace

ExploreObjective parse_objective(const std::string& name) {
  if (name == "tokens_per_s_per_chip") {
    return ExploreObjective::kTokensPerSecondPerChip;
  }
  if (name == "mfu") {
    return ExploreObjective::kMfu;
  }
  if (name == "step_time") {
    return ExploreObjective::kStepTime;
  }
  if (name == "tokens_per_dollar") {
    return ExploreObjective::kTokensPerDollar;
  }
  throw UserError("--objective: unknown '" + name +
                  "' (tokens_per_s_per_chip, mfu, step_time, tokens_per_dollar)");
}

const char* objective_name(ExploreObjective objective) {
  switch (objective) {
    case ExploreObjective::kMfu:
      return "mfu";
    case ExploreObjective::kStepTime:
      return "step_time";
    case ExploreObjective::kTokensPerDollar:
      return "tokens_per_dollar";
    case ExploreObjective::kTokensPerSecondPerChip:
      break;
  }
  return "tokens_per_s_per_chip";
}

std::vector<std::string> candidate_overrides(const SearchSpace& space, const Candidate& candidate) {
  std::vector<std::string> overrides;
  for (const int axis : space.ici_axes) {
    overrides.push_back(mesh_axis_key(false, mesh_axis_names()[static_cast<size_t>(axis)]) + "=" +
                        std::to_string(candidate.mesh.ici[static_cast<size_t>(axis)]));
  }
  for (const int axis : space.dcn_axes) {
    overrides.push_back(mesh_axis_key(true, mesh_axis_names()[static_cast<size_t>(axis)]) + "=" +
                        std::to_string(candidate.mesh.dcn[static_cast<size_t>(axis)]));
  }
  auto searched = [&](const std::string& key) {
    return std::find(space.searched_keys.begin(), space.searched_keys.end(), key) !=
           space.searched_keys.end();
  };
  overrides.push_back("per_device_batch_size=" +
                      number_text(candidate.batch.per_device_batch_size));
  overrides.push_back("gradient_accumulation_steps=" +
                      std::to_string(candidate.batch.accumulation_steps));
  const RematChoice& remat = space.remats[static_cast<size_t>(candidate.remat)];
  overrides.push_back("remat_policy=" + remat.policy);
  for (const auto& [key, value] : remat.tensors) {
    overrides.push_back(key + "=" + value);
  }
  overrides.push_back("attention=" + candidate.attention);
  if (candidate.perf.block_q > 0) {
    overrides.push_back("sa_block_q=" + std::to_string(candidate.perf.block_q));
    overrides.push_back("sa_block_kv=" + std::to_string(candidate.perf.block_kv));
  }
  if (searched("sparse_core_collective_offload")) {
    overrides.push_back("sparse_core_collective_offload=" + candidate.perf.sparse_core_offload);
  }
  if (searched("collective_matmul")) {
    overrides.push_back(std::string("collective_matmul=") +
                        (candidate.perf.collective_matmul ? "true" : "false"));
  }
  if (searched("mesh_placement_first")) {
    overrides.push_back("mesh_placement_first=" +
                        space.placement_text(static_cast<size_t>(candidate.placement)));
  }
  return overrides;
}

Config candidate_config(const Config& config, const SearchSpace& space,
                        const Candidate& candidate) {
  Config result = config;
  for (const std::string& item : candidate_overrides(space, candidate)) {
    const auto [key, value] = split_override(item);
    if (key.rfind("ici_", 0) == 0 || key.rfind("dcn_", 0) == 0) {
      continue;  // the mesh is applied from candidate.mesh directly
    }
    result.set(key, value, kExploreOrigin);
  }
  return result;
}

namespace {

// Thins `samples` to at most `most` (0: no limit) by a fixed stride, keeping their order.
void thin_samples(std::vector<ExploreSample>& samples, size_t most) {
  if (most == 0 || samples.size() <= most) {
    return;
  }
  std::vector<ExploreSample> thinned;
  thinned.reserve(most);
  for (size_t index = 0; index < most; ++index) {
    thinned.push_back(samples[index * samples.size() / most]);
  }
  samples = std::move(thinned);
}

ExploreResult explore_one_schedule(const Config& config, const ExploreOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  if (options.objective == ExploreObjective::kTokensPerDollar) {
    throw UserError(
        "--objective tokens_per_dollar: the hardware catalog (configs/hw) has no chip prices; "
        "use tokens_per_s_per_chip, mfu or step_time");
  }
  // Each listed candidate is estimated again in full for its breakdown (~1.5 ms): --top 65536
  // ran for minutes (found by the command-line fuzz). A ranking longer than this is not read.
  constexpr int kMaxTop = 1000;
  if (options.top < 1 || options.top > kMaxTop) {
    throw UserError("--top: " + std::to_string(options.top) + " must be from 1 to " +
                    std::to_string(kMaxTop));
  }
  ExploreResult result;
  result.objective = options.objective;
  result.space = build_search_space(config, options.limits);
  const SearchSpace& space = result.space;
  const LogicalAxisRules rules = LogicalAxisRules::from_config(config);
  TrainingStepCache steps(config, space);
  std::vector<double> model_tflops;
  for (const BatchChoice& batch : space.batches) {
    Candidate candidate;
    candidate.batch = batch;
    candidate.attention = space.attention_kinds[0];
    model_tflops.push_back(
        maxtext_training_flops_per_device(candidate_config(config, space, candidate))
            .total_tflops());
  }
  const PerfOptions base_perf = perf_options_from_config(config, *space.slice.chip);

  const int rank = options.transport != nullptr ? options.transport->rank() : 0;
  const int ranks = options.transport != nullptr ? options.transport->num_ranks() : 1;
  result.ranks = ranks;
  // This rank's meshes: every ranks-th, so that each rank gets a share of the costly ones.
  const size_t my_meshes =
      (space.meshes.size() + static_cast<size_t>(ranks - 1 - rank)) / static_cast<size_t>(ranks);
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  const int threads =
      std::max(1, std::min<int>(options.threads > 0 ? options.threads : static_cast<int>(cores),
                                static_cast<int>(std::max<size_t>(1, my_meshes))));
  result.threads = threads;
  std::vector<WorkerResult> workers(static_cast<size_t>(threads));
  SharedThreshold threshold(options.branch_and_bound);
  const Divisibility divisibility(*steps.get(0, 0), rules);
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&](int thread) {
    MeshEvaluator evaluator(config, space, options, rules, steps, model_tflops, base_perf,
                            threshold, divisibility);
    auto last_report = std::chrono::steady_clock::now();
    try {
      for (size_t slot = next++; slot < my_meshes; slot = next++) {
        const size_t mesh = slot * static_cast<size_t>(ranks) + static_cast<size_t>(rank);
        evaluator.evaluate(mesh, workers[static_cast<size_t>(thread)]);
        ++done;
        if (thread == 0 && options.progress) {
          const auto now = std::chrono::steady_clock::now();
          if (now - last_report > std::chrono::milliseconds(200)) {
            last_report = now;
            options.progress(static_cast<int64_t>(done.load()), static_cast<int64_t>(my_meshes));
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      failure = std::current_exception();
      next = my_meshes;
    }
  };
  std::vector<std::thread> pool;
  for (int thread = 1; thread < threads; ++thread) {
    pool.emplace_back(work, thread);
  }
  work(0);
  for (std::thread& thread : pool) {
    thread.join();
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
  if (options.progress) {
    options.progress(static_cast<int64_t>(my_meshes), static_cast<int64_t>(my_meshes));
  }

  WorkerResult merged;
  for (WorkerResult& worker : workers) {
    merged.evaluated += worker.evaluated;
    merged.programs += worker.programs;
    merged.smallest_peak = std::min(merged.smallest_peak, worker.smallest_peak);
    merged.capacity = std::max(merged.capacity, worker.capacity);
    for (const auto& [reason, count] : worker.pruned) {
      merged.pruned[reason] += count;
    }
    for (Scored& scored : worker.top) {
      merged.offer(std::move(scored), static_cast<size_t>(options.top));
    }
    merged.samples.insert(merged.samples.end(), worker.samples.begin(), worker.samples.end());
    merged.samples_seen += worker.samples_seen;
  }
  if (ranks > 1) {
    std::vector<ExploreSample> samples = std::move(merged.samples);
    const int64_t seen = merged.samples_seen;
    merged = merge_ranks(merged, *options.transport, space, static_cast<size_t>(options.top));
    merged.samples = std::move(samples);  // this rank's only
    merged.samples_seen = seen;
  }
  // Each worker kept up to max_samples; thin the union to max_samples by a fixed stride.
  thin_samples(merged.samples, options.max_samples);
  result.samples = std::move(merged.samples);
  result.samples_seen = merged.samples_seen;
  result.candidates_evaluated = merged.evaluated;
  result.programs_built = merged.programs;
  result.pruned = merged.pruned;
  result.smallest_peak_hbm_bytes = std::isfinite(merged.smallest_peak) ? merged.smallest_peak : 0;
  result.usable_hbm_bytes = merged.capacity;

  // The winners get a full estimate through the same path as `tpusim estimate`.
  const std::vector<std::string> user_overrides = config.command_line_overrides();
  for (const Scored& scored : merged.top) {
    const std::vector<std::string> overrides = candidate_overrides(space, scored.candidate);
    std::vector<std::string> args;
    for (const std::string& item : user_overrides) {
      const std::string key = split_override(item).first;
      const bool replaced = std::any_of(overrides.begin(), overrides.end(), [&](const auto& o) {
        return split_override(o).first == key;
      });
      if (!replaced) {
        args.push_back(item);
      }
    }
    args.insert(args.end(), overrides.begin(), overrides.end());
    Config full = config;
    for (const std::string& item : overrides) {
      const auto [key, value] = split_override(item);
      full.set(key, value, kExploreOrigin);
    }
    const Estimate estimate = estimate_config(full);
    RankedCandidate ranked;
    ranked.candidate = scored.candidate;
    ranked.args = join(args);
    ranked.maxtext_overrides = maxtext_keys(args);
    ranked.step_time_s = estimate.step_seconds;
    ranked.mfu = estimate.mfu;
    ranked.tokens_per_s_per_chip = estimate.tokens_per_s_per_chip;
    ranked.hbm_peak_bytes_per_device = estimate.memory.peak_bytes;
    ranked.hbm_capacity_bytes = estimate.memory.capacity_bytes;
    ranked.fits = estimate.memory.fits;
    ranked.objective = scored.objective;
    ranked.estimate = estimate.json;
    result.top.push_back(std::move(ranked));
  }
  result.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  result.candidates_in_space = space.size();
  return result;
}

}  // namespace

ExploreResult explore(const Config& config, const ExploreOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string> schedule_keys;
  const std::vector<ScheduleChoice> choices = pipeline_schedule_choices(config, schedule_keys);
  if (choices.size() == 1 && choices.front().stages == 1) {
    ExploreResult result = explore_one_schedule(config, options);
    return result;
  }
  ExploreResult merged;
  std::vector<RankedCandidate> everything;
  std::optional<UserError> first_error;
  for (const ScheduleChoice& choice : choices) {
    const Config scheduled = with_schedule(config, choice);
    ExploreResult part;
    try {
      part = explore_one_schedule(scheduled, options);
    } catch (const UserError& error) {
      // A schedule the batch or the layers cannot take (MaxText refuses it too) is skipped; the
      // error stands only when no schedule could be searched.
      if (!first_error) {
        first_error = error;
      }
      continue;
    }
    merged.pipeline_options.push_back(summarize_schedule(choice, scheduled, part));
    if (merged.pipeline_options.size() == 1) {
      merged.space = part.space;
      merged.objective = part.objective;
      merged.threads = part.threads;
      merged.ranks = part.ranks;
    }
    merged.candidates_in_space += part.candidates_in_space;
    merged.candidates_evaluated += part.candidates_evaluated;
    merged.programs_built += part.programs_built;
    for (const auto& [reason, count] : part.pruned) {
      merged.pruned[reason] += count;
    }
    merged.smallest_peak_hbm_bytes =
        merged.pipeline_options.size() == 1 || part.smallest_peak_hbm_bytes == 0
            ? std::max(merged.smallest_peak_hbm_bytes, part.smallest_peak_hbm_bytes)
            : std::min(merged.smallest_peak_hbm_bytes, part.smallest_peak_hbm_bytes);
    merged.usable_hbm_bytes = std::max(merged.usable_hbm_bytes, part.usable_hbm_bytes);
    merged.samples.insert(merged.samples.end(), part.samples.begin(), part.samples.end());
    merged.samples_seen += part.samples_seen;
    everything.insert(everything.end(), part.top.begin(), part.top.end());
  }
  if (merged.pipeline_options.empty()) {
    throw *first_error;
  }
  for (const std::string& key : schedule_keys) {
    merged.space.searched_keys.push_back(key);
  }
  std::stable_sort(
      everything.begin(), everything.end(),
      [](const RankedCandidate& a, const RankedCandidate& b) { return a.objective > b.objective; });
  if (everything.size() > static_cast<size_t>(options.top)) {
    everything.resize(static_cast<size_t>(options.top));
  }
  merged.top = std::move(everything);
  thin_samples(merged.samples, options.max_samples);
  merged.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return merged;
}

nlohmann::json ExploreResult::to_json() const {
  nlohmann::json json;
  json["candidates_in_space"] = candidates_in_space;
  json["candidates_evaluated"] = candidates_evaluated;
  json["pruned"] = nlohmann::json::object();
  for (const auto& [reason, count] : pruned) {
    json["pruned"][reason] = count;
  }
  json["programs_built"] = programs_built;
  json["elapsed_s"] = elapsed_s;
  json["threads"] = threads;
  json["ranks"] = ranks;
  json["candidates_per_s_per_core"] =
      elapsed_s > 0 ? static_cast<double>(candidates_evaluated) / elapsed_s / (threads * ranks) : 0;
  json["objective"] = objective_name(objective);
  json["searched_keys"] = space.searched_keys;
  json["meshes"] = space.meshes.size();
  json["usable_hbm_bytes_per_device"] = usable_hbm_bytes;
  json["smallest_peak_hbm_bytes_per_device"] = smallest_peak_hbm_bytes;
  if (!pipeline_options.empty()) {
    json["pipeline_options"] = nlohmann::json::array();
    for (const PipelineOption& option : pipeline_options) {
      nlohmann::json item = {{"stages", option.stages},
                             {"schedule", option.schedule},
                             {"candidates", option.candidates},
                             {"fits", option.found}};
      if (option.stages > 1) {
        item["num_pipeline_microbatches"] = option.microbatches;
        item["num_layers_per_pipeline_stage"] = option.layers_per_stage;
      }
      if (option.found) {
        item["best_step_time_s"] = option.step_time_s;
        item["best_objective"] = option.objective;
        item["pipeline_bubble_s"] = option.bubble_s;
        item["exposed_stage_transfers_s"] = option.stage_transfers_s;
        item["exposed_dcn_gradient_reduction_s"] = option.gradient_reduction_s;
        item["args"] = option.args;
      }
      json["pipeline_options"].push_back(item);
    }
  }
  json["top"] = nlohmann::json::array();
  for (const RankedCandidate& ranked : top) {
    nlohmann::json item;
    item["args"] = ranked.args;
    item["maxtext_overrides"] = join(ranked.maxtext_overrides);
    item["step_time_s"] = ranked.step_time_s;
    item["mfu"] = ranked.mfu;
    item["tokens_per_s_per_chip"] = ranked.tokens_per_s_per_chip;
    item["hbm_peak_bytes_per_device"] = ranked.hbm_peak_bytes_per_device;
    item["hbm_capacity_bytes"] = ranked.hbm_capacity_bytes;
    item["hbm_headroom_bytes"] = ranked.hbm_capacity_bytes - ranked.hbm_peak_bytes_per_device;
    item["fits"] = ranked.fits;
    item["mesh"] = ranked.estimate["mesh"];
    item["mesh_placement"] = ranked.estimate["mesh_placement"];
    item["breakdown"] = ranked.estimate["breakdown"];
    item["estimate_command"] = "tpusim estimate " + ranked.args;
    json["top"].push_back(item);
  }
  return json;
}

}  // namespace tpusim
