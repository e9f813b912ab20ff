#include "sim/explore/mesh_evaluator.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "hw/chip_spec.h"
#include "model/config.h"
#include "sharding/logical_rules.h"
#include "sim/explore/objective.h"
#include "sim/explore/program_signature.h"
#include "sim/memory/memory_model.h"

namespace tpusim {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// The chain bound adds the same times as the scheduler in another order; a bound a rounding error
// above the step it equals must not prune that step's candidate.
constexpr double kRoundingMargin = 1 - 1e-12;

bool any_fits(const std::vector<bool>& by_kind) {
  return std::any_of(by_kind.begin(), by_kind.end(), [](bool fits) { return fits; });
}

double lowest(const std::vector<double>& bounds) {
  return *std::min_element(bounds.begin(), bounds.end());
}

// Adds the seconds from construction to destruction to `into` (ExplorePhases).
class PhaseTimer {
 public:
  explicit PhaseTimer(double& into) : into_(into), started_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point started_;
};

MemoryEstimate timed_memory(const StepProgram& program, WorkerResult& out) {
  const PhaseTimer timer(out.phases.memory_s);
  return estimate_memory(program);
}

}  // namespace

void SharedThreshold::raise(double value) {
  if (!enabled_) {
    return;
  }
  double current = value_.load(std::memory_order_relaxed);
  while (value > current && !value_.compare_exchange_weak(current, value)) {
  }
}

std::optional<ProgramFacts> SharedProgramFacts::find(const std::vector<int64_t>& key) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = facts_.find(key);
  if (found == facts_.end()) {
    return std::nullopt;
  }
  return found->second;
}

std::optional<double> SharedProgramFacts::lowest_compute(const std::vector<int64_t>& key) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = facts_.find(key);
  if (found == facts_.end() || found->second.compute.empty()) {
    return std::nullopt;
  }
  return lowest(found->second.compute);
}

namespace {

// Same value, or one of them unknown (NaN; an empty list).
bool agree(double a, double b) {
  return std::isnan(a) || std::isnan(b) || a == b;
}

bool agree(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || b.empty()) {
    return true;
  }
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](double x, double y) { return agree(x, y); });
}

// Fills what `into` does not know yet from `from`.
void fill(std::vector<double>& into, const std::vector<double>& from) {
  if (into.empty()) {
    into = from;
    return;
  }
  for (size_t index = 0; index < into.size() && index < from.size(); ++index) {
    if (std::isnan(into[index])) {
      into[index] = from[index];
    }
  }
}

}  // namespace

void SharedProgramFacts::offer(const std::vector<int64_t>& key, const ProgramFacts& facts) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto [found, added] = facts_.try_emplace(key, facts);
  if (added) {
    return;
  }
  ProgramFacts& kept = found->second;
  if (check_ && (!agree(kept.compute, facts.compute) || !agree(kept.kind_peaks, facts.kind_peaks) ||
                 !agree(kept.peak, facts.peak) ||
                 (kept.capacity != 0 && facts.capacity != 0 && kept.capacity != facts.capacity))) {
    throw std::logic_error(
        "explore: two meshes of one equivalence key gave different compute bounds or memory");
  }
  fill(kept.compute, facts.compute);
  fill(kept.kind_peaks, facts.kind_peaks);
  kept.capacity = kept.capacity != 0 ? kept.capacity : facts.capacity;
  kept.peak = std::isnan(kept.peak) ? facts.peak : kept.peak;
}

// The work on one mesh: what divides, where it is placed, what still fits, the current program.
struct MeshEvaluator::MeshPlan {
  size_t mesh_index = 0;
  const MeshShape* mesh = nullptr;
  std::vector<size_t> dividing;           // batch indices whose inputs the mesh splits evenly
  std::vector<DeviceMesh> placed;         // the distinct placements
  std::vector<int> placement_ids;         // their indices into SearchSpace::placements
  int64_t per_remat = 0;                  // candidates below one (batch, remat)
  int64_t per_distinct_batch = 0;         // candidates below one batch
  std::vector<int64_t> per_kind;          // a kind's candidates of one (batch, remat)
  std::vector<std::vector<bool>> fitted;  // [remat][kind]: a smaller batch fitted
  StepProgram program;
  // program.program is a kept program lent while active (build): declared after `program`, so
  // given back before it goes.
  ResizablePrograms::Loan loan;
  uint64_t signature = 0;    // program_signature of `program`, once needed (0: not yet)
  std::vector<int64_t> key;  // MeshEquivalence::key of the mesh (set for evaluate_batches)
  std::vector<MemoryFloor::Bytes>* floors = nullptr;  // its key's row of floors_ (once needed)
};

// One batch of a mesh: its tokens and FLOPs, for the objective.
struct MeshEvaluator::BatchWork {
  size_t index = 0;
  const BatchChoice* choice = nullptr;
  double tokens = 0;
  // Its ClassBounds keys on the plan's mesh (class_keys), once the none program is needed.
  std::vector<std::vector<int64_t>> class_keys;
  // The bounds of a kept program re-sized for the plan's mesh (bounded_by_resize), when they did
  // not bound the batch out: those of the program none_bounds_out then builds, bit for bit.
  std::optional<ComputeBounds> resized;
};

MeshEvaluator::MeshEvaluator(const ExploreContext& context)
    : context_(context),
      numbering_(context.space),
      top_size_(static_cast<size_t>(std::max(1, context.options.top))) {
  // The timing variants of one program, in the space's order: attention kinds, then their
  // perf choices. Consecutive variants with the same kind and block sizes share a cost context.
  const SearchSpace& space = context.space;
  for (size_t kind = 0; kind < space.attention_kinds.size(); ++kind) {
    const std::string& name = space.attention_kinds[kind];
    const std::vector<PerfChoice> choices = space.perf_choices(name);
    for (size_t choice = 0; choice < choices.size(); ++choice) {
      const PerfChoice& perf = choices[choice];
      if (choice == 0 || perf.block_q != choices[choice - 1].block_q ||
          perf.block_kv != choices[choice - 1].block_kv) {
        contexts_.push_back(cost_context(name, perf));
      }
      variants_.push_back({kind, perf, contexts_.size() - 1, offload_on(perf)});
    }
  }
}

CostContext MeshEvaluator::cost_context(const std::string& attention,
                                        const PerfChoice& perf) const {
  CostContext cost = context_.base_perf.cost;
  cost.flash_attention = attention != "dot_product";
  if (perf.block_q > 0) {
    cost.block_q = perf.block_q;
    cost.block_kv = perf.block_kv;
  }
  return cost;
}

double MeshEvaluator::usable_hbm() const {
  return usable_of(context_.space.slice.chip->hbm_usable_bytes_per_device() *
                   (1.0 - context_.settings.hbm_headroom_fraction));
}

double MeshEvaluator::usable_of(double capacity_bytes) const {
  return capacity_bytes * (1 - context_.options.limits.min_hbm_headroom);
}

void MeshEvaluator::mark_unfit(MeshPlan& plan, size_t remat, size_t kind, double peak,
                               WorkerResult& out) const {
  plan.fitted[remat][kind] = false;
  out.tally[PrunedReason::kDoesNotFitHbm] += plan.per_kind[kind];
  out.sample({0.0, 0.0, peak, false}, context_.options.max_samples);
}

void MeshEvaluator::prune_fitted(const MeshPlan& plan, size_t remat, WorkerResult& out) {
  // Summed first, then added to the reason's entry once.
  int64_t fitted = 0;
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    fitted += plan.fitted[remat][kind] ? plan.per_kind[kind] : 0;
  }
  if (!plan.per_kind.empty()) {
    out.tally[PrunedReason::kCannotBeatTop] += fitted;
  }
}

bool MeshEvaluator::offload_on(const PerfChoice& perf) const {
  return perf.sparse_core_offload == "on" ||
         (perf.sparse_core_offload == "auto" &&
          context_.space.slice.chip->sparsecore_collective_offload_default > 0);
}

void MeshEvaluator::bound_none_by_placement(const MeshPlan& plan, const BatchWork& batch,
                                            StepProgram& program, const MeshShape& program_mesh,
                                            StepSimulator& simulator, NoneBounds& none) const {
  // A policy's bound adds recomputation to none's compute and the threshold only rises, so a
  // (placement, switches) whose variants none's cheaper bounds already cannot lift over the
  // threshold never decides anything: its collectives or chains are not worked out (0 in
  // least_step_bound, which leaves its bound at what already cannot reach).
  const double threshold = context_.threshold.get();
  const std::vector<double>& compute = none.compute.step;
  none.collectives.assign(plan.placed.size(), SwitchBounds{});
  none.chains.assign(plan.placed.size(), SwitchChains{});
  const bool own = &program == &plan.program;
  for (size_t which = 0; which < plan.placed.size(); ++which) {
    place(plan, Bounding{&program, &program_mesh}, which);
    for (const Variant& variant : variants_) {
      if (cannot_reach(best_possible(batch, compute[variant.context]), threshold)) {
        continue;
      }
      const PerfOptions perf_options = switch_options(variant);
      std::optional<CollectiveBounds>& bounds =
          none.collectives[which][perf_options.sparse_core_offload][perf_options.collective_matmul];
      if (!bounds.has_value()) {
        bounds = simulator.collective_bounds(perf_options);
      }
    }
    for (const Variant& variant : variants_) {
      const PerfOptions perf_options = switch_options(variant);
      const bool offload = perf_options.sparse_core_offload;
      const bool collective_matmul = perf_options.collective_matmul;
      const std::optional<CollectiveBounds>& bounds =
          none.collectives[which][offload][collective_matmul];
      if (!bounds.has_value() ||
          cannot_reach(best_possible(batch, std::max(compute[variant.context] +
                                                         bounds->tensorcore_driven_seconds,
                                                     bounds->busiest_link_seconds)),
                       threshold)) {
        continue;
      }
      double& chain = none.chains[which][offload][collective_matmul];
      if (chain == 0) {
        chain = simulator.chain_bound(perf_options, none.compute.op_seconds) * kRoundingMargin;
      }
    }
  }
  if (own) {
    program.mesh = plan.placed.front();
  }
}

void MeshEvaluator::place(const MeshPlan& plan, const Bounding& target, size_t which) const {
  target.program->mesh = target.program == &plan.program
                             ? plan.placed[which]
                             : context_.equivalence.relabeled(plan.placed[which], *target.mesh);
}

PerfOptions MeshEvaluator::switch_options(const Variant& variant) const {
  PerfOptions perf_options = context_.base_perf;
  perf_options.record_details = false;
  perf_options.sparse_core_offload = variant.offload;
  perf_options.collective_matmul = variant.perf.collective_matmul;
  return perf_options;
}

double MeshEvaluator::least_step_bound(const std::vector<double>& compute,
                                       const std::vector<SwitchBounds>& collectives,
                                       const std::vector<SwitchChains>* chains) const {
  if (collectives.empty()) {
    return lowest(compute);  // no collectives worked out: the compute bound alone
  }
  double least = std::numeric_limits<double>::infinity();
  for (size_t which = 0; which < collectives.size(); ++which) {
    for (const Variant& variant : variants_) {
      const bool offload = variant.offload;
      const bool collective_matmul = variant.perf.collective_matmul;
      // Not worked out (bound_none_by_placement): nothing above the compute bound.
      const CollectiveBounds bounds =
          collectives[which][offload][collective_matmul].value_or(CollectiveBounds{});
      const double chain = chains != nullptr && !chains->empty()
                               ? (*chains)[which][offload][collective_matmul]
                               : 0.0;
      least = std::min(least, std::max({compute[variant.context] + bounds.tensorcore_driven_seconds,
                                        bounds.busiest_link_seconds, chain}));
    }
  }
  return least;
}

void MeshEvaluator::evaluate(size_t mesh_index, WorkerResult& out) {
  evaluate_mesh(mesh_index, out);
  out.tally.flush(out.pruned);
}

void MeshEvaluator::evaluate_mesh(size_t mesh_index, WorkerResult& out) {
  MeshPlan plan;
  if (!plan_mesh(mesh_index, plan, out)) {
    return;
  }
  const bool replayable = settled_.replayable && plan.dividing == settled_.dividing;
  if (replayable && !context_.facts.checking()) {
    replay_settled(plan, out.tally, out.phases, out.capacity);
    return;
  }
  // Checking mode: the replay's counts must be those of the full evaluation.
  std::optional<WorkerResult> replayed;
  if (replayable) {
    replayed.emplace();
    replayed->tally = out.tally;
    replayed->phases = out.phases;
    replayed->capacity = out.capacity;
    replayed->evaluated = out.evaluated;  // a replay times nothing (checking partitions, though)
    replay_settled(plan, replayed->tally, replayed->phases, replayed->capacity);
  }
  // Only the batches read the key (floors, facts, classes): most meshes of a bounded-out search
  // divide no batch or are replayed.
  plan.key = context_.equivalence.key(*plan.mesh);
  const Settled before = settled_counts(out);
  settling_ = true;
  settled_bounded_ = 0;
  evaluate_batches(plan, out);
  settled_.replayable = false;
  if (replayed.has_value() &&
      (!same_counts(replayed->tally, out.tally) || replayed->capacity != out.capacity ||
       replayed->phases.floor_skipped_programs != out.phases.floor_skipped_programs ||
       replayed->evaluated != out.evaluated)) {
    throw std::logic_error(
        "explore: a mesh's counts replayed from an equivalent mesh differ from its own");
  }
  if (settling_ && followed_) {
    record_settled(plan, before, out);
  }
}

void MeshEvaluator::evaluate_batches(MeshPlan& plan, WorkerResult& out) {
  // Weights and optimizer state do not depend on batch, remat or attention: the memory floor's
  // state is the memory model's exactly, so no program is needed to see they do not fit.
  const double state = memory_floor(plan, plan.dividing.front(), 0).state;
  if (state > usable_hbm()) {
    out.capacity = usable_hbm();
    out.smallest_peak = std::min(out.smallest_peak, state);  // the peak is at least this
    out.tally[PrunedReason::kWeightsExceedHbm] +=
        static_cast<int64_t>(plan.dividing.size()) * plan.per_distinct_batch;
    return;
  }
  for (size_t at = 0; at < plan.dividing.size(); ++at) {
    if (!evaluate_batch(plan, at, out)) {
      return;
    }
  }
}

MeshEvaluator::Settled MeshEvaluator::settled_counts(const WorkerResult& out) {
  Settled counts;
  for (size_t reason = 0; reason < kSettledReasons.size(); ++reason) {
    counts.per_placement[reason] = out.tally.count(kSettledReasons[reason]);
  }
  counts.floor_skips = out.phases.floor_skipped_programs;
  return counts;
}

void MeshEvaluator::record_settled(const MeshPlan& plan, const Settled& before, WorkerResult& out) {
  // Every count of a settled mesh is a multiple of its placements (per_kind, per_remat and
  // per_distinct_batch are): kept per placement.
  const Settled after = settled_counts(out);
  const auto placements = static_cast<int64_t>(plan.placed.size());
  for (size_t reason = 0; reason < kSettledReasons.size(); ++reason) {
    const int64_t added = after.per_placement[reason] - before.per_placement[reason];
    if (added % placements != 0) {
      return;  // not a settled mesh's counts: nothing replayed
    }
    settled_.per_placement[reason] = added / placements;
  }
  settled_.floor_skips = after.floor_skips - before.floor_skips;
  settled_.capacity = settled_.floor_skips > 0 ||
                      after.per_placement[kSettledWeights] > before.per_placement[kSettledWeights];
  settled_.bounded = settled_bounded_;
  settled_.dividing = plan.dividing;
  settled_.replayable = true;
}

void MeshEvaluator::replay_settled(const MeshPlan& plan, PrunedTally& tally, ExplorePhases& phases,
                                   double& capacity) const {
  // What evaluate_batches counts for this mesh: the same floors and (through the facts the
  // settled mesh left) the same compute bounds, which the threshold, only rising since, still
  // bounds out, now as equivalent_mesh_skips; this mesh's own placements. (smallest_peak took
  // the floors' bytes from the settled mesh.)
  const auto placements = static_cast<int64_t>(plan.placed.size());
  for (size_t reason = 0; reason < kSettledReasons.size(); ++reason) {
    if (settled_.per_placement[reason] != 0) {
      tally[kSettledReasons[reason]] += settled_.per_placement[reason] * placements;
    }
  }
  phases.floor_skipped_programs += settled_.floor_skips;
  phases.equivalent_mesh_skips += settled_.bounded;
  phases.bounded_out_programs += settled_.bounded;
  if (settled_.capacity) {
    capacity = usable_hbm();
  }
}

bool MeshEvaluator::same_counts(const PrunedTally& a, const PrunedTally& b) {
  return std::all_of(kSettledReasons.begin(), kSettledReasons.end(),
                     [&](PrunedReason reason) { return a.count(reason) == b.count(reason); });
}

void MeshEvaluator::evaluate_group(const std::vector<size_t>& mesh_indices, WorkerResult& out) {
  kept_.clear();
  settled_.replayable = false;
  for (size_t at = 0; at < mesh_indices.size(); ++at) {
    followed_ = at + 1 < mesh_indices.size();
    evaluate_mesh(mesh_indices[at], out);
  }
  out.tally.flush(out.pruned);
  kept_.clear();
  settled_.replayable = false;
  followed_ = false;
}

bool MeshEvaluator::plan_mesh(size_t mesh_index, MeshPlan& plan, WorkerResult& out) const {
  const SearchSpace& space = context_.space;
  const MeshShape& mesh = space.meshes[mesh_index];
  plan.mesh_index = mesh_index;
  plan.mesh = &mesh;
  const int64_t per_batch = space.candidates_per_mesh_and_batch();
  const auto per_placement = static_cast<int64_t>(variants_.size());
  const bool parameters_divide = context_.divisibility.parameters_divide(mesh);
  for (size_t batch = 0; batch < space.batches.size(); ++batch) {
    if (parameters_divide &&
        context_.divisibility.batch_divides(mesh, space.batches[batch].loaded_microbatch)) {
      plan.dividing.push_back(batch);
    } else {
      out.tally[PrunedReason::kAxisDoesNotDivide] += per_batch;
    }
  }
  if (plan.dividing.empty()) {
    return false;
  }
  // The distinct placements of this mesh: a choice whose first axis has size 1 here, or that
  // lays every axis where an earlier choice does, is the same candidate again.
  plan.placed.reserve(space.placements.size());
  for (size_t choice = 0; choice < space.placements.size(); ++choice) {
    const std::vector<int>& first = space.placements[choice];
    DeviceMesh candidate_mesh;
    const bool trivial = choice > 0 && std::all_of(first.begin(), first.end(), [&](int axis) {
                           return mesh.ici[static_cast<size_t>(axis)] == 1;
                         });
    if (!trivial) {
      candidate_mesh = place_mesh(mesh, space.slice, first);
    }
    if (trivial ||
        std::any_of(plan.placed.begin(), plan.placed.end(),
                    [&](const DeviceMesh& other) { return same_layout(other, candidate_mesh); })) {
      out.tally[PrunedReason::kSamePlacement] += static_cast<int64_t>(plan.dividing.size()) *
                                                 static_cast<int64_t>(space.remats.size()) *
                                                 per_placement;
      continue;
    }
    plan.placed.push_back(std::move(candidate_mesh));
    plan.placement_ids.push_back(static_cast<int>(choice));
  }
  plan.per_remat = per_placement * static_cast<int64_t>(plan.placed.size());
  plan.per_distinct_batch = plan.per_remat * static_cast<int64_t>(space.remats.size());
  plan.program.slice = space.slice;
  plan.program.mesh = plan.placed.front();  // partitioning reads only the mesh's shape
  plan.program.hbm_headroom_fraction = context_.settings.hbm_headroom_fraction;
  // Memory depends on the attention kind too (dot_product materializes its scores), so fit is
  // tracked per (remat, kind); a kind's candidates of one remat are that many per (batch).
  const size_t kinds = space.attention_kinds.size();
  plan.per_kind.assign(kinds, 0);
  for (const Variant& variant : variants_) {
    plan.per_kind[variant.kind] += static_cast<int64_t>(plan.placed.size());
  }
  plan.fitted.assign(space.remats.size(), std::vector<bool>(kinds, true));
  return true;
}

void MeshEvaluator::build(MeshPlan& plan, size_t batch, size_t remat, WorkerResult& out) {
  std::shared_ptr<const TrainingStep> step = context_.steps.get(batch, remat);
  if (step == plan.program.step) {
    return;  // remat_policy=none serves both as the bound program and as a candidate
  }
  plan.loan.give_back();  // the program is replaced below
  const BatchChoice& choice = context_.space.batches[batch];
  plan.program.step = std::move(step);
  plan.program.microbatch = choice.microbatch;
  plan.program.accumulation_steps = choice.accumulation_steps;
  plan.program.global_batch = choice.microbatch * choice.accumulation_steps;
  plan.signature = 0;
  const PhaseTimer timer(out.phases.partition_s);
  if (!context_.facts.checking() && borrow_resized(plan, batch, remat)) {
    ++out.phases.resized_programs;
    return;
  }
  plan.program.program = partition(*plan.program.step, context_.rules, plan.program.mesh);
  ++out.programs;
  if (!context_.options.resized_programs) {
    return;
  }
  if (context_.facts.checking()) {
    // The re-sizing argument (sharding/program_resize.h) checked on every program partitioned.
    PartitionedProgram built = std::move(plan.program.program);
    if (copy_resized(plan, batch, remat) && !same_program(plan.program.program, built)) {
      throw std::logic_error(
          "explore: a program re-sized for this mesh differs from the mesh's own partition");
    }
    plan.program.program = std::move(built);
  }
  context_.resizable.offer(batch, remat, plan.program.program, *plan.mesh);
}

bool MeshEvaluator::copy_resized(MeshPlan& plan, size_t batch, size_t remat) const {
  if (!context_.options.resized_programs) {
    return false;
  }
  const bool copied = context_.resizable.with_resized(
      batch, remat, *plan.mesh,
      [&](const PartitionedProgram& resized) { plan.program.program = resized; });
  if (copied) {
    plan.program.program.mesh = plan.program.mesh;
  }
  return copied;
}

bool MeshEvaluator::borrow_resized(MeshPlan& plan, size_t batch, size_t remat) const {
  // Lent rather than copied: the copy (a whole Graph) cost ~8% of a near-bar slice. The loan
  // ends at the next build or with the plan.
  if (!context_.options.resized_programs ||
      !context_.resizable.lend(batch, remat, *plan.mesh, plan.program.program, plan.loan)) {
    return false;
  }
  plan.program.program.mesh = plan.program.mesh;
  return true;
}

void MeshEvaluator::prune_remat(const MeshPlan& plan, size_t remat, WorkerResult& out) {
  // Summed by reason first, then added to each reason's entry that a kind reached (once each).
  std::array<int64_t, 2> by_reason{};  // cannot beat the top N, does not fit
  std::array<bool, 2> reached{};
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    const size_t reason = plan.fitted[remat][kind] ? 0 : 1;
    by_reason[reason] += plan.per_kind[kind];
    reached[reason] = true;
  }
  if (reached[0]) {
    out.tally[PrunedReason::kCannotBeatTop] += by_reason[0];
  }
  if (reached[1]) {
    out.tally[PrunedReason::kDoesNotFitHbm] += by_reason[1];
  }
}

double MeshEvaluator::best_possible(const BatchWork& batch, double step_lower_bound) const {
  const SearchSpace& space = context_.space;
  return objective_upper_bound(context_.options.objective, step_lower_bound,
                               context_.maxtext_flops_per_batch[batch.index].total_tflops(),
                               space.slice.chip->mfu_peak_bf16_tflops_per_device, batch.tokens,
                               space.slice.total_chips());
}

bool MeshEvaluator::evaluate_batch(MeshPlan& plan, size_t at, WorkerResult& out) {
  const SearchSpace& space = context_.space;
  const size_t remats = space.remats.size();
  if (std::none_of(plan.fitted.begin(), plan.fitted.end(), any_fits)) {
    // Every policy failed to fit a smaller batch: the larger ones cannot fit either.
    out.tally[PrunedReason::kDoesNotFitHbm] +=
        static_cast<int64_t>(plan.dividing.size() - at) * plan.per_distinct_batch;
    return false;
  }
  BatchWork batch;
  batch.index = plan.dividing[at];
  batch.choice = &space.batches[batch.index];
  batch.tokens = static_cast<double>(batch.choice->microbatch * batch.choice->accumulation_steps) *
                 static_cast<double>(context_.settings.max_target_length);
  // Memory floors first (memory_floor.h): a policy whose floor exceeds HBM does not fit here or
  // at a larger batch, and no program is built for it.
  std::vector<bool> floored(remats, false);
  for (size_t remat = 0; remat < remats; ++remat) {
    floored[remat] = any_fits(plan.fitted[remat]) && exceeds_floor(plan, batch, remat, out);
  }
  const bool some_fit = std::any_of(plan.fitted.begin(), plan.fitted.end(), any_fits);
  // Branch and bound over the remat policies, from the remat_policy=none program: its
  // TensorCore bound bounds every policy (skip the batch if even that cannot beat the top N),
  // and with each policy's recomputation added it bounds that policy without partitioning it.
  std::optional<NoneBounds> none;
  if (some_fit && remats > 1 &&
      context_.threshold.get() > -std::numeric_limits<double>::infinity()) {
    // The none program of an equivalent mesh has the same TensorCore bound: if that alone cannot
    // beat the top N, this none program need not be built.
    const std::vector<int64_t> none_key = facts_key(plan, batch.index, TrainingStepCache::kNoRemat);
    const std::optional<double> known =
        context_.facts.checking() ? std::nullopt : context_.facts.lowest_compute(none_key);
    bool bounded_out =
        known.has_value() && cannot_reach(best_possible(batch, *known), context_.threshold.get());
    if (bounded_out) {
      ++out.phases.equivalent_mesh_skips;
    } else {
      batch.class_keys = class_keys(plan, batch.index);
      if (bounded_by_class(plan, batch, out)) {
        ++out.phases.batch_class_skips;
        bounded_out = true;
      } else if (bounded_by_resize(plan, batch)) {
        ++out.phases.resized_program_skips;
        bounded_out = true;
      } else {
        bounded_out = none_bounds_out(plan, batch, none, out);
        // Settled by its compute bound alone (the facts it offered bound it on the next mesh)?
        settling_ = settling_ && bounded_out &&
                    cannot_reach(best_possible(batch, lowest(none->compute.step)),
                                 context_.threshold.get());
      }
    }
    if (bounded_out) {
      ++settled_bounded_;
      ++out.phases.bounded_out_programs;
      for (size_t remat = 0; remat < remats; ++remat) {
        if (!floored[remat]) {
          prune_remat(plan, remat, out);
        }
      }
      return true;
    }
  }
  settling_ = settling_ && !some_fit;  // else programs are built and timed
  for (size_t remat = 0; remat < remats; ++remat) {
    if (floored[remat]) {
      continue;  // counted by exceeds_floor
    }
    if (!evaluate_remat(plan, batch, remat, none, out)) {
      return false;
    }
  }
  return true;
}

MemoryFloor::Bytes MeshEvaluator::memory_floor(MeshPlan& plan, size_t batch, size_t remat) const {
  // Equivalent meshes split every tensor alike (mesh_equivalence.h), and the floor only sums the
  // tensors' local sizes, in the same order: the same bytes bit for bit.
  const size_t remats = context_.space.remats.size();
  if (plan.floors == nullptr) {
    const auto found = floors_.find(plan.key);
    if (found != floors_.end()) {
      plan.floors = &found->second;
    } else {
      if (floors_.size() * context_.space.batches.size() * remats >= kMaxKeptFloors) {
        floors_.clear();  // bounded memory on the largest spaces (no other plan holds a row)
      }
      plan.floors = &floors_
                         .emplace(plan.key, std::vector<MemoryFloor::Bytes>(
                                                context_.space.batches.size() * remats,
                                                MemoryFloor::Bytes{0, -1}))
                         .first->second;
    }
  }
  MemoryFloor::Bytes& kept = (*plan.floors)[batch * remats + remat];
  if (kept.saved < 0) {
    fill_floors(plan, batch, remat);
  }
  return kept;
}

void MeshEvaluator::fill_floors(MeshPlan& plan, size_t batch, size_t remat) const {
  // evaluate_batch asks for the floor of every policy still fitting at this batch (and
  // evaluate_batches for one's state just before): worked out together, the tensors' local sizes
  // once (memory_floor_set.h). No other policy's step is built for it.
  const size_t remats = context_.space.remats.size();
  MemoryFloor::Bytes* const row = plan.floors->data() + batch * remats;
  uint64_t wanted = 0;
  for (size_t other = 0; other < remats && remats <= kMostSetFloors; ++other) {
    if (row[other].saved < 0 && (other == remat || any_fits(plan.fitted[other]))) {
      wanted |= uint64_t{1} << other;
    }
  }
  if (std::popcount(wanted) < 2) {
    row[remat] = context_.steps.memory_floor(batch, remat).bytes(*plan.mesh);
    return;
  }
  std::unique_ptr<MemoryFloorSet>& set = floor_sets_[{batch, wanted}];
  if (set == nullptr) {
    std::vector<const MemoryFloor*> floors;
    for (size_t other = 0; other < remats; ++other) {
      if ((wanted >> other & 1U) != 0) {
        floors.push_back(&context_.steps.memory_floor(batch, other));
      }
    }
    set = std::make_unique<MemoryFloorSet>(std::move(floors));
  }
  set->bytes(*plan.mesh, set_bytes_);
  size_t next = 0;
  for (size_t other = 0; other < remats; ++other) {
    if ((wanted >> other & 1U) != 0) {
      row[other] = set_bytes_[next++];
    }
  }
}

std::vector<std::vector<int64_t>> MeshEvaluator::class_keys(const MeshPlan& plan,
                                                            size_t batch) const {
  std::vector<std::vector<int64_t>> keys =
      context_.classes.region_keys(context_.schedule, *plan.mesh, batch);
  for (std::vector<int64_t>& key : keys) {
    key.insert(key.begin(), plan.key.begin(), plan.key.end());
    key.insert(key.begin(), static_cast<int64_t>(plan.key.size()));
  }
  return keys;
}

std::optional<MeshEvaluator::ClassStep> MeshEvaluator::class_step(const BatchWork& batch) const {
  if (batch.class_keys.empty()) {
    return std::nullopt;
  }
  const std::optional<ClassSeconds> found =
      context_.class_bounds.find(batch.class_keys, context_.schedule);
  if (!found.has_value()) {
    return std::nullopt;
  }
  const TrainingStep& none = *context_.steps.get(batch.index, TrainingStepCache::kNoRemat);
  return ClassStep{bounds_from_regions(found->region_seconds, none.graph.regions(),
                                       batch.choice->accumulation_steps)
                       .step,
                   found->other_schedule};
}

bool MeshEvaluator::bounded_by_class(const MeshPlan& plan, const BatchWork& batch,
                                     WorkerResult& out) const {
  if (context_.facts.checking()) {
    return false;
  }
  const std::optional<ClassStep> derived = class_step(batch);
  if (!derived.has_value() ||
      !cannot_reach(best_possible(batch, lowest(derived->step)), context_.threshold.get())) {
    return false;
  }
  context_.facts.offer(facts_key(plan, batch.index, TrainingStepCache::kNoRemat),
                       {derived->step, 0, kUnknown, {}});
  out.phases.schedule_class_skips += derived->other_schedule ? 1 : 0;
  return true;
}

std::optional<ComputeBounds> MeshEvaluator::resized_bounds(const MeshPlan& plan,
                                                           const BatchWork& batch) const {
  return context_.resizable.bounds(batch.index, TrainingStepCache::kNoRemat, *plan.mesh,
                                   batch.choice->accumulation_steps, contexts_);
}

bool MeshEvaluator::bounded_by_resize(const MeshPlan& plan, BatchWork& batch) const {
  if (!context_.options.resized_programs || context_.facts.checking()) {
    return false;
  }
  std::optional<ComputeBounds> resized = resized_bounds(plan, batch);
  if (!resized.has_value()) {
    return false;
  }
  if (!cannot_reach(best_possible(batch, lowest(resized->step)), context_.threshold.get())) {
    batch.resized = std::move(resized);  // none_bounds_out builds the program: its bounds
    return false;
  }
  remember_class(batch, *resized);
  context_.facts.offer(facts_key(plan, batch.index, TrainingStepCache::kNoRemat),
                       {resized->step, 0, kUnknown, {}});
  return true;
}

void MeshEvaluator::remember_class(const BatchWork& batch, const ComputeBounds& none) const {
  if (batch.class_keys.empty()) {
    return;
  }
  // In checking mode, what bounded_by_class would have derived for this batch from the seconds
  // kept so far must be the bound of the program just built, bit for bit, or the class argument
  // is wrong.
  if (context_.facts.checking()) {
    const std::optional<ClassStep> derived = class_step(batch);
    if (derived.has_value() && derived->step != none.step) {
      throw std::logic_error(
          "explore: a batch's TensorCore bound derived from its region classes differs from its "
          "own program's");
    }
  }
  context_.class_bounds.offer(batch.class_keys, none.region_seconds, context_.schedule);
}

bool MeshEvaluator::none_bounds_out(MeshPlan& plan, const BatchWork& batch,
                                    std::optional<NoneBounds>& none, WorkerResult& out) {
  none.emplace();
  // The none program of an equivalent mesh evaluated just before is this mesh's program with
  // other axis names: it bounds this batch on this mesh's layouts without a partition.
  const TrainingStep* step = context_.steps.get(batch.index, TrainingStepCache::kNoRemat).get();
  // A kept program holds none's bounds only if this function kept it: when the space itself has
  // remat_policy=none, evaluate_remat keeps the same step's program for its memory alone.
  auto kept = kept_.find(step);
  const bool borrowed = kept != kept_.end() && !kept->second.compute.step.empty();
  StepProgram* program = &plan.program;
  const MeshShape* program_mesh = plan.mesh;
  if (borrowed) {
    ++out.phases.borrowed_programs;
    none->compute = kept->second.compute;
    program = &kept->second.program;
    program_mesh = &kept->second.mesh;
  } else {
    build(plan, batch.index, TrainingStepCache::kNoRemat, out);
    ++out.phases.bound_programs;
    const PhaseTimer timer(out.phases.bounds_s);
    // A kept program re-sized for this mesh is this program, op for op: its bounds are these.
    none->compute = batch.resized.has_value() ? *batch.resized
                                              : tensorcore_lower_bounds(plan.program, contexts_,
                                                                        /*keep_forward_ops=*/true);
  }
  const PhaseTimer timer(out.phases.bounds_s);
  remember_class(batch, none->compute);
  context_.facts.offer(facts_key(plan, batch.index, TrainingStepCache::kNoRemat),
                       {none->compute.step, 0, kUnknown, {}});
  bool bounded_out =
      cannot_reach(best_possible(batch, lowest(none->compute.step)), context_.threshold.get());
  if (!bounded_out) {
    // Collectives and chains only where the compute bound leaves a variant open, chains only
    // where the collectives do too (they cost more).
    std::optional<StepSimulator> own;  // the kept program's simulator is kept with it
    StepSimulator& simulator =
        borrowed ? kept->second.bounds_simulator() : own.emplace(plan.program);
    bound_none_by_placement(plan, batch, *program, *program_mesh, simulator, *none);
    bounded_out = cannot_reach(
        best_possible(batch,
                      least_step_bound(none->compute.step, none->collectives, &none->chains)),
        context_.threshold.get());
  }
  if (more_of_key() && !borrowed) {
    auto [keep, added] = kept_.try_emplace(step);
    if (added) {
      keep->second.mesh = *plan.mesh;
      if (bounded_out) {
        // Nothing of this batch is left to build from it here (the next batch partitions its own
        // step): its partitioned program moves to the kept one instead of being copied (a lent
        // one with its loan, until the group ends).
        PartitionedProgram partitioned = std::move(plan.program.program);
        plan.program.program = PartitionedProgram();
        keep->second.program = plan.program;
        keep->second.program.program = std::move(partitioned);
        if (plan.loan.active()) {
          plan.loan.move_to(keep->second.loan, keep->second.program.program);
        }
        plan.program.step.reset();
      } else {
        keep->second.program = plan.program;
      }
    }
    // An entry evaluate_remat made holds an equivalent mesh's program of the same step: the
    // compute bounds are the same there (they do not depend on the layout).
    keep->second.compute = none->compute;
  }
  return bounded_out;
}

bool MeshEvaluator::exceeds_floor(MeshPlan& plan, const BatchWork& batch, size_t remat,
                                  WorkerResult& out) const {
  // The floor (state and saved activations) is below the peak of every attention kind.
  const double floor = memory_floor(plan, batch.index, remat).total();
  if (floor <= usable_hbm()) {
    return false;
  }
  ++out.phases.floor_skipped_programs;
  out.capacity = usable_hbm();
  out.smallest_peak = std::min(out.smallest_peak, floor);  // the peak is at least this
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    // A kind that did not fit a smaller batch is counted the same way (check_fit does too).
    plan.fitted[remat][kind] = false;
    out.tally[PrunedReason::kDoesNotFitHbm] += plan.per_kind[kind];
  }
  return true;
}

bool MeshEvaluator::evaluate_remat(MeshPlan& plan, const BatchWork& batch, size_t remat,
                                   const std::optional<NoneBounds>& none, WorkerResult& out) {
  if (!any_fits(plan.fitted[remat])) {
    out.tally[PrunedReason::kDoesNotFitHbm] += plan.per_remat;  // a smaller batch did not fit
    return true;
  }
  if (none.has_value()) {
    bool bounded_out = false;
    {
      const PhaseTimer timer(out.phases.bounds_s);
      const std::vector<double> compute =
          remat_bounds(none->compute, context_.steps.recomputed(batch.index, remat),
                       batch.choice->accumulation_steps);
      bounded_out = cannot_reach(
          best_possible(batch, least_step_bound(compute, none->collectives, &none->chains)),
          context_.threshold.get());
    }
    if (bounded_out) {
      prune_remat(plan, remat, out);
      return true;
    }
  }
  if (skip_by_facts(plan, batch, remat, out) || bound_with_kept(plan, batch, remat, out)) {
    return true;
  }
  build(plan, batch.index, remat, out);
  plan.program.attention_scores_in_hbm = false;
  const MemoryEstimate memory = timed_memory(plan.program, out);
  const double usable = usable_of(memory.capacity_bytes);
  out.capacity = usable;
  out.smallest_peak = std::min(out.smallest_peak, memory.peak_bytes);  // the least of kinds
  std::vector<double> kind_peaks(plan.per_kind.size(), memory.peak_bytes);
  const std::vector<bool> fitted_before = plan.fitted[remat];
  check_fit(plan, remat, memory, usable, kind_peaks, out);
  ProgramFacts facts{{}, memory.capacity_bytes, memory.peak_bytes, kind_peaks};
  for (size_t kind = 0; kind < kind_peaks.size(); ++kind) {
    if (!fitted_before[kind] && context_.space.attention_kinds[kind] == "dot_product") {
      facts.kind_peaks[kind] = kUnknown;  // not estimated
    }
  }
  context_.facts.offer(facts_key(plan, batch.index, remat), facts);
  if (more_of_key()) {
    auto [kept, added] = kept_.try_emplace(plan.program.step.get());
    if (added) {
      kept->second.mesh = *plan.mesh;
      kept->second.program = plan.program;
    }
    kept->second.capacity = memory.capacity_bytes;
    kept->second.peak = memory.peak_bytes;
    kept->second.kind_peaks = facts.kind_peaks;
  }
  if (!any_fits(plan.fitted[remat])) {
    ++out.phases.unfit_programs;
  } else {
    // The remat_policy=none program that bounded the batch is this one: its bounds are known.
    const bool is_none =
        none.has_value() &&
        plan.program.step == context_.steps.get(batch.index, TrainingStepCache::kNoRemat);
    time_variants(plan, batch, remat, kind_peaks, is_none ? &none->compute.step : nullptr, out);
  }
  return true;
}

bool MeshEvaluator::bound_with_kept(MeshPlan& plan, const BatchWork& batch, size_t remat,
                                    WorkerResult& out) {
  const auto found = kept_.find(context_.steps.get(batch.index, remat).get());
  if (found == kept_.end() || found->second.kind_peaks.empty()) {
    return false;
  }
  KeptProgram& kept = found->second;
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    if (plan.fitted[remat][kind] && std::isnan(kept.kind_peaks[kind])) {
      return false;  // not estimated there: build it here
    }
  }
  // The memory of equivalent meshes is the same (mesh_equivalence.h): what check_fit counts.
  const double usable = usable_of(kept.capacity);
  out.capacity = usable;
  out.smallest_peak = std::min(out.smallest_peak, kept.peak);
  std::vector<double> kind_peaks(plan.per_kind.size(), kept.peak);
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    if (!plan.fitted[remat][kind]) {
      out.tally[PrunedReason::kDoesNotFitHbm] += plan.per_kind[kind];
      continue;
    }
    kind_peaks[kind] = kept.kind_peaks[kind];
    if (kind_peaks[kind] > usable) {
      mark_unfit(plan, remat, kind, kind_peaks[kind], out);
    }
  }
  ++out.phases.borrowed_programs;
  if (!any_fits(plan.fitted[remat])) {
    ++out.phases.unfit_programs;
    return true;
  }
  if (kept.context_bounds.empty()) {
    const PhaseTimer timer(out.phases.bounds_s);
    kept.context_bounds = tensorcore_lower_bounds(kept.program, contexts_).step;
  }
  const std::vector<double> context_bounds = kept.context_bounds;
  if (cannot_reach(best_possible(batch, lowest(context_bounds)), context_.threshold.get())) {
    prune_fitted(plan, remat, out);  // as time_variants counts
    return true;
  }
  // time_variants' bounds on this mesh's layouts, counted only when they leave nothing open.
  const int64_t cannot_beat_top = out.tally[PrunedReason::kCannotBeatTop];
  const int64_t chain_bounded = out.phases.chain_bounded;
  {
    StepSimulator& simulator = kept.bounds_simulator();
    const Bounding target{&kept.program, &kept.mesh};
    std::vector<Bounded> open =
        bound_variants(plan, target, batch, remat, context_bounds, simulator, out);
    tighten_by_chains(plan, target, batch, simulator, open, out);
    if (open.empty()) {
      return true;
    }
  }
  out.tally[PrunedReason::kCannotBeatTop] = cannot_beat_top;
  out.phases.chain_bounded = chain_bounded;
  --out.phases.borrowed_programs;
  build(plan, batch.index, remat, out);
  time_variants(plan, batch, remat, kind_peaks, &context_bounds, out);
  return true;
}

std::vector<int64_t> MeshEvaluator::facts_key(const MeshPlan& plan, size_t batch,
                                              size_t remat) const {
  std::vector<int64_t> key = plan.key;
  key.push_back(static_cast<int64_t>(batch));
  // The step, not the remat index: the none bound program is the space's own none candidate.
  key.push_back(static_cast<int64_t>(
      reinterpret_cast<intptr_t>(context_.steps.get(batch, remat).get())));  // NOLINT
  return key;
}

bool MeshEvaluator::skip_by_facts(MeshPlan& plan, const BatchWork& batch, size_t remat,
                                  WorkerResult& out) {
  if (context_.facts.checking()) {
    return false;
  }
  const std::optional<ProgramFacts> known =
      context_.facts.find(facts_key(plan, batch.index, remat));
  if (!known.has_value() || known->kind_peaks.empty()) {
    return false;
  }
  const double usable = usable_of(known->capacity);
  bool some_fit = false;
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    if (plan.fitted[remat][kind]) {
      if (std::isnan(known->kind_peaks[kind])) {
        return false;  // not estimated there: build it here
      }
      some_fit = some_fit || known->kind_peaks[kind] <= usable;
    }
  }
  const bool compute_prunes =
      !known->compute.empty() &&
      cannot_reach(best_possible(batch, lowest(known->compute)), context_.threshold.get());
  if (some_fit && !compute_prunes) {
    return false;
  }
  // What evaluate_remat, check_fit and time_variants count for this program.
  ++out.phases.equivalent_mesh_skips;
  out.capacity = usable;
  out.smallest_peak = std::min(out.smallest_peak, known->peak);
  for (size_t kind = 0; kind < plan.per_kind.size(); ++kind) {
    const double peak = known->kind_peaks[kind];
    if (plan.fitted[remat][kind] && peak > usable) {
      mark_unfit(plan, remat, kind, peak, out);
    } else {
      out.tally[plan.fitted[remat][kind] ? PrunedReason::kCannotBeatTop
                                         : PrunedReason::kDoesNotFitHbm] += plan.per_kind[kind];
    }
  }
  if (!some_fit) {
    ++out.phases.unfit_programs;
  }
  return true;
}

void MeshEvaluator::check_fit(MeshPlan& plan, size_t remat, const MemoryEstimate& memory,
                              double usable, std::vector<double>& kind_peaks, WorkerResult& out) {
  for (size_t kind = 0; kind < kind_peaks.size(); ++kind) {
    if (!plan.fitted[remat][kind]) {
      // A smaller batch did not fit.
      out.tally[PrunedReason::kDoesNotFitHbm] += plan.per_kind[kind];
      continue;
    }
    double peak = memory.peak_bytes;
    if (context_.space.attention_kinds[kind] == "dot_product") {
      plan.program.attention_scores_in_hbm = true;
      peak = timed_memory(plan.program, out).peak_bytes;
      plan.program.attention_scores_in_hbm = false;
    }
    kind_peaks[kind] = peak;
    if (peak > usable) {
      mark_unfit(plan, remat, kind, peak, out);
    }
  }
}

std::vector<MeshEvaluator::Bounded> MeshEvaluator::bound_variants(
    MeshPlan& plan, const Bounding& target, const BatchWork& batch, size_t remat,
    const std::vector<double>& context_bounds, StepSimulator& simulator, WorkerResult& out) const {
  std::vector<Bounded> open;
  const double threshold = context_.threshold.get();
  for (size_t which = 0; which < plan.placed.size(); ++which) {
    place(plan, target, which);
    // The collectives' bounds depend on the placement and the perf switches, not on the
    // attention kernel: worked out on first need, by [offload][collective_matmul].
    SwitchBounds collective_bounds;
    for (size_t index = 0; index < variants_.size(); ++index) {
      const Variant& variant = variants_[index];
      if (!plan.fitted[remat][variant.kind]) {
        continue;  // counted in check_fit
      }
      if (cannot_reach(best_possible(batch, context_bounds[variant.context]), threshold)) {
        out.tally[PrunedReason::kCannotBeatTop] += 1;
        continue;
      }
      const bool offload = variant.offload;
      std::optional<CollectiveBounds>& bounds =
          collective_bounds[offload][variant.perf.collective_matmul];
      if (!bounds.has_value()) {
        const PhaseTimer timer(out.phases.bounds_s);
        bounds = simulator.collective_bounds(switch_options(variant));
      }
      // Collectives the TensorCore drives add to its compute; the busiest link bounds apart.
      const double step_bound =
          std::max(context_bounds[variant.context] + bounds->tensorcore_driven_seconds,
                   bounds->busiest_link_seconds);
      const double best = best_possible(batch, step_bound);
      if (cannot_reach(best, threshold)) {
        out.tally[PrunedReason::kCannotBeatTop] += 1;
        continue;
      }
      open.push_back({which, index, best});
    }
  }
  // The most promising first (the space's order among equals), placement by placement (the
  // simulator keeps one placement's collective times): the placement whose best variant promises
  // most, then its variants best first.
  std::vector<double> placement_best(plan.placed.size(), -std::numeric_limits<double>::infinity());
  for (const Bounded& item : open) {
    placement_best[item.placement] = std::max(placement_best[item.placement], item.best);
  }
  std::stable_sort(open.begin(), open.end(), [&](const Bounded& a, const Bounded& b) {
    if (a.placement != b.placement) {
      return placement_best[a.placement] > placement_best[b.placement] ||
             (placement_best[a.placement] == placement_best[b.placement] &&
              a.placement < b.placement);
    }
    return a.best > b.best;
  });
  for (size_t index = 0; index < open.size(); ++index) {
    open[index].group = index == 0 ? 0
                        : open[index].placement == open[index - 1].placement
                            ? open[index - 1].group
                            : open[index - 1].group + 1;
  }
  return open;
}

PerfOptions MeshEvaluator::variant_options(const Variant& variant) const {
  PerfOptions options = switch_options(variant);  // no details: ranking needs the times only
  options.cost = contexts_[variant.context];
  return options;
}

void MeshEvaluator::tighten_by_chains(MeshPlan& plan, const Bounding& target,
                                      const BatchWork& batch, StepSimulator& simulator,
                                      std::vector<Bounded>& open, WorkerResult& out) const {
  if (open.size() < 2 && context_.threshold.get() == -std::numeric_limits<double>::infinity()) {
    return;  // it is timed whatever its bound
  }
  const PhaseTimer timer(out.phases.bounds_s);
  const double threshold = context_.threshold.get();
  std::vector<Bounded> kept;
  kept.reserve(open.size());
  // First the bound over every cost context at once, per placement and switches (it prunes most
  // variants), then each variant's own.
  std::map<std::array<size_t, 3>, double> any_context;
  for (Bounded item : open) {
    place(plan, target, item.placement);
    const Variant& variant = variants_[item.variant];
    const PerfOptions options = variant_options(variant);
    const std::array<size_t, 3> switches{item.placement, options.sparse_core_offload ? 1U : 0U,
                                         options.collective_matmul ? 1U : 0U};
    auto found = any_context.find(switches);
    if (found == any_context.end()) {
      found = any_context.emplace(switches, simulator.chain_bound(options, contexts_)).first;
    }
    item.best = std::min(item.best, best_possible(batch, found->second * kRoundingMargin));
    if (!cannot_reach(item.best, threshold)) {
      item.best = std::min(item.best,
                           best_possible(batch, simulator.chain_bound(options) * kRoundingMargin));
    }
    if (cannot_reach(item.best, threshold)) {
      out.tally[PrunedReason::kCannotBeatTop] += 1;
      ++out.phases.chain_bounded;
      continue;
    }
    kept.push_back(item);
  }
  // Best first within each placement, the placements in the order bound_variants chose.
  std::stable_sort(kept.begin(), kept.end(), [](const Bounded& a, const Bounded& b) {
    return a.group == b.group ? a.best > b.best : a.group < b.group;
  });
  open = std::move(kept);
  place(plan, target, 0);
}

void MeshEvaluator::time_variants(MeshPlan& plan, const BatchWork& batch, size_t remat,
                                  const std::vector<double>& kind_peaks,
                                  const std::vector<double>* known_bounds, WorkerResult& out) {
  const ChipSpec& chip = *context_.space.slice.chip;
  const double chips = context_.space.slice.total_chips();
  SharedThreshold& threshold = context_.threshold;
  std::vector<double> context_bounds;
  if (known_bounds != nullptr) {
    context_bounds = *known_bounds;
  } else {
    const PhaseTimer timer(out.phases.bounds_s);
    context_bounds = tensorcore_lower_bounds(plan.program, contexts_).step;
  }
  context_.facts.offer(facts_key(plan, batch.index, remat), {context_bounds, 0, kUnknown, {}});
  if (const auto kept = kept_.find(plan.program.step.get()); kept != kept_.end()) {
    kept->second.context_bounds = context_bounds;
  }
  if (cannot_reach(best_possible(batch, lowest(context_bounds)), threshold.get())) {
    // No variant's compute bound can beat the top N (the kinds that do not fit are counted).
    prune_fitted(plan, remat, out);
    return;
  }
  std::optional<StepSimulator> simulator;  // shared by the timing variants below
  {
    const PhaseTimer timer(out.phases.simulate_s);
    simulator.emplace(plan.program);
  }
  const Bounding own{&plan.program, plan.mesh};
  std::vector<Bounded> open =
      bound_variants(plan, own, batch, remat, context_bounds, *simulator, out);
  tighten_by_chains(plan, own, batch, *simulator, open, out);
  // Every variant times this same per-device program, and a top N keeps one entry per program
  // (the best, worker_result.h): a variant that cannot reach the best variant timed already
  // cannot be that entry, whatever the top N holds.
  double program_best = -std::numeric_limits<double>::infinity();
  bool simulated = false;
  for (const Bounded& item : open) {
    if (cannot_reach(item.best, threshold.get())) {
      out.tally[PrunedReason::kCannotBeatTop] += 1;
      continue;
    }
    // Not under --no-branch-and-bound, which times every candidate that fits.
    if (threshold.enabled() && cannot_reach(item.best, program_best)) {
      out.tally[PrunedReason::kCannotBeatTop] += 1;
      ++out.phases.below_own_program;
      continue;
    }
    const Variant& variant = variants_[item.variant];
    plan.program.mesh = plan.placed[item.placement];
    const PerfOptions perf_options = variant_options(variant);
    out.phases.timed_programs += simulated ? 0 : 1;
    simulated = true;
    StepTiming timing;
    {
      const PhaseTimer timer(out.phases.simulate_s);
      timing = simulator->run(perf_options);
    }
    ++out.evaluated;
    const double step = timing.step_seconds;
    const double per_chip = batch.tokens / step / chips;
    out.sample({step, per_chip, kind_peaks[variant.kind], true}, context_.options.max_samples);
    const double mfu = context_.maxtext_flops_per_batch[batch.index].total_tflops() / step /
                       chip.mfu_peak_bf16_tflops_per_device;
    Scored scored;
    scored.candidate = {
        *plan.mesh,
        *batch.choice,
        static_cast<int>(remat),
        context_.space.attention_kinds[variant.kind],
        variant.perf,
        plan.placement_ids[item.placement],
        numbering_.order(plan.mesh_index, batch.index, remat,
                         static_cast<size_t>(plan.placement_ids[item.placement]), item.variant)};
    scored.objective = objective_value(context_.options.objective, step, mfu, per_chip);
    program_best = std::max(program_best, scored.objective);
    if (!out.would_enter(scored, top_size_)) {
      continue;  // nor better than an entry of its own program (each is above the last)
    }
    if (plan.signature == 0) {
      const PhaseTimer timer(out.phases.signature_s);
      plan.signature = program_signature(plan.program);
    }
    scored.program = plan.signature;
    out.offer(std::move(scored), top_size_);
    if (out.top.size() == top_size_) {
      threshold.raise(out.top.back().objective);
    }
  }
  plan.program.mesh = plan.placed.front();
}

}  // namespace tpusim
