// sim/explore/mesh_evaluator.h: evaluates every candidate of one mesh (explore's unit of work):
// prunes what cannot be legal, fit or win, times the rest, and keeps the best in a WorkerResult.
//
// Per mesh: the batches whose inputs the mesh splits evenly (Divisibility), the placements that
// lay the mesh out differently, then per batch (ascending, so once one does not fit the larger
// ones are skipped) and remat policy one partitioned program, its memory per attention kind, and
// its timing variants (placement x attention kind x perf switches), each skipped when its step's
// lower bound cannot beat the top N found so far (SharedThreshold), or the best variant of the same
// program timed already (a top N keeps one entry per program): the variants are timed best bound
// first. The step bound of a variant is the largest of its TensorCore compute, the collectives
// (those the TensorCore drives, the busiest link) and its dependency chains
// (StepSimulator::chain_bound: within a per cent of the step for most variants, so that most are
// never timed). A program whose equivalent mesh (mesh_equivalence.h: same per-device program)
// showed that it does not fit, or that its TensorCore bound cannot beat the top N, is not built
// (SharedProgramFacts). Meshes of one key evaluated in a row (evaluate_group) keep the programs
// built for the first: the later ones take their memory and TensorCore bounds from them and their
// collectives and chains on their own layouts (MeshEquivalence::relabeled: the same bounds bit
// for bit), and build a program only to time a variant. A mesh whose every batch was settled by
// memory floors or compute bounds alone is replayed for the next meshes of its key with the same
// dividing batches: its counts per placement times theirs, no batch evaluated again.
//
// Example:
//   SharedThreshold threshold(/*enabled=*/true);
//   SharedProgramFacts facts(/*check=*/false);
//   ClassBounds class_bounds(/*check=*/false);
//   MeshEvaluator evaluator({config, settings, space, options, rules, steps, maxtext_flops,
//                            base_perf, threshold, divisibility, equivalence, facts, classes,
//                            /*schedule=*/0, class_bounds});
//   WorkerResult found;
//   evaluator.evaluate(/*mesh_index=*/3, found);
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/flops_maxtext.h"
#include "sharding/divisibility.h"
#include "sharding/step_program.h"
#include "sim/explore/batch_classes.h"
#include "sim/explore/class_bounds.h"
#include "sim/explore/explore_settings.h"
#include "sim/explore/explorer.h"
#include "sim/explore/memory_floor_set.h"
#include "sim/explore/mesh_equivalence.h"
#include "sim/explore/resizable_programs.h"
#include "sim/explore/step_bounds.h"
#include "sim/explore/training_step_cache.h"
#include "sim/explore/worker_result.h"
#include "sim/perf/op_cost.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {

class Config;
class LogicalAxisRules;
struct MemoryEstimate;

// The objective a candidate must beat to enter the top N, shared by the worker threads (it only
// rises). Branch and bound: a program whose upper bound is below it cannot change the result.
class SharedThreshold {
 public:
  // Disabled: stays at -infinity, so nothing is ever bounded out.
  explicit SharedThreshold(bool enabled) : enabled_(enabled) {}
  double get() const { return value_.load(std::memory_order_relaxed); }
  bool enabled() const { return enabled_; }  // false under --no-branch-and-bound
  void raise(double value);

 private:
  bool enabled_ = true;
  std::atomic<double> value_{-std::numeric_limits<double>::infinity()};
};

// What one (mesh, batch, remat) program showed, kept for the meshes of the same equivalence key
// (mesh_equivalence.h: the same per-device program), shared by the worker threads: they need not
// partition the program again to see that it does not fit or cannot beat the top N.
struct ProgramFacts {
  std::vector<double> compute;  // TensorCore step bounds per cost context
  double capacity = 0;          // the memory model's usable bytes per device (0: not estimated)
  double peak = 0;              // its peak without attention scores in HBM (NaN: not estimated)
  // Peak bytes per attention kind (NaN: not estimated, the kind did not fit a smaller batch).
  std::vector<double> kind_peaks;
};

class SharedProgramFacts {
 public:
  // `check`: every fact offered again is compared with the one kept (std::logic_error when they
  // differ) and none is used to skip a program (ExploreOptions::check_equivalent_meshes, for
  // tests).
  explicit SharedProgramFacts(bool check) : check_(check) {}
  bool checking() const { return check_; }
  std::optional<ProgramFacts> find(const std::vector<int64_t>& key) const;
  // The least of the kept TensorCore step bounds (find(key)->compute), without copying the
  // facts; nullopt when none are kept.
  std::optional<double> lowest_compute(const std::vector<int64_t>& key) const;
  void offer(const std::vector<int64_t>& key, const ProgramFacts& facts);

 private:
  bool check_ = false;
  mutable std::mutex mutex_;
  std::map<std::vector<int64_t>, ProgramFacts> facts_;
};

// What every mesh's evaluation reads (and the threshold and step cache the workers share).
struct ExploreContext {
  const Config& config;
  const ExploreSettings& settings;  // read from config
  const SearchSpace& space;
  const ExploreOptions& options;
  const LogicalAxisRules& rules;
  TrainingStepCache& steps;
  const std::vector<MaxTextFlops>& maxtext_flops_per_batch;  // per device, by batch (MFU)
  const PerfOptions& base_perf;
  SharedThreshold& threshold;
  const Divisibility& divisibility;
  const MeshEquivalence& equivalence;
  SharedProgramFacts& facts;
  const BatchClasses& classes;
  size_t schedule;  // this search's number in `classes`
  ClassBounds& class_bounds;
  ResizablePrograms& resizable;
};

class MeshEvaluator {
 public:
  explicit MeshEvaluator(const ExploreContext& context);

  // Evaluates every candidate of space.meshes[mesh_index] into `out`.
  void evaluate(size_t mesh_index, WorkerResult& out);
  // The same for meshes of one equivalence key, in order: the remat_policy=none programs built
  // for the first bound the others (on their layouts, MeshEquivalence::relabeled) unbuilt.
  void evaluate_group(const std::vector<size_t>& mesh_indices, WorkerResult& out);

 private:
  // One timing variant of a program: attention kind, perf switches and their cost context.
  struct Variant {
    size_t kind = 0;  // index into SearchSpace::attention_kinds
    PerfChoice perf;
    size_t context = 0;    // index into contexts_
    bool offload = false;  // offload_on(perf), worked out once (bounds read it per placement)
  };
  // A variant of the program under one placement that its bounds leave open: the best objective
  // it could reach.
  struct Bounded {
    size_t placement = 0;  // index into MeshPlan::placed
    size_t variant = 0;    // index into variants_
    double best = 0;
    size_t group = 0;  // the placement's place in the timing order
  };
  struct MeshPlan;
  struct BatchWork;
  // The program bounds are worked out on: the plan's own, or one of its key partitioned on
  // `mesh`, an equivalent mesh (MeshEquivalence::relabeled lays it out as the plan's mesh).
  struct Bounding {
    StepProgram* program = nullptr;
    const MeshShape* mesh = nullptr;
  };
  // Collective bounds of one program under one placement, by [SparseCore offload][collective
  // matmul] (those the variants use).
  using SwitchBounds = std::array<std::array<std::optional<CollectiveBounds>, 2>, 2>;
  // Dependency-chain bounds of one program under one placement, by [offload][collective matmul]
  // (StepSimulator::chain_bound with the TensorCore bounds' op costs: the least over every cost
  // context, fusible ops charged as fused).
  using SwitchChains = std::array<std::array<double, 2>, 2>;
  // The remat_policy=none program's bounds, which bound every policy of the same mesh and batch
  // before it is partitioned: its TensorCore bounds (plus a policy's recomputation), its
  // collectives per placement (a policy runs at least the collectives of none: step_bounds.h),
  // and its dependency chains per placement (a policy runs the same chains with recomputation
  // inserted; fusible ops are charged as fused, as a policy may fuse what none cannot).
  struct NoneBounds {
    ComputeBounds compute;
    std::vector<SwitchBounds> collectives;  // per placement
    std::vector<SwitchChains> chains;       // per placement
  };

  // evaluate, its pruned counts left in out.tally (evaluate and evaluate_group add them to
  // out.pruned once at the end).
  void evaluate_mesh(size_t mesh_index, WorkerResult& out);
  // evaluate_mesh after plan_mesh: the weights' floor, then the batches in order.
  void evaluate_batches(MeshPlan& plan, WorkerResult& out);
  // A mesh whose every batch was settled by memory floors or by a compute bound (no program
  // timed, no collective or chain bound needed), counted so that the next mesh of its key in
  // evaluate_group, with the same dividing batches, replays it: the same floors, and the compute
  // bounds its facts (SharedProgramFacts) keep bound the same batches out (the threshold only
  // rises), on that mesh's own placements.
  struct Settled {
    bool replayable = false;
    std::vector<size_t> dividing;
    // Counts by kSettledReasons per placement (settled_counts: the tally's totals).
    std::array<int64_t, 3> per_placement{};
    int64_t floor_skips = 0;  // ExplorePhases::floor_skipped_programs
    int64_t bounded = 0;      // batches bounded out (bounded_out_programs)
    bool capacity = false;    // a floor set out.capacity
  };
  // The reasons a settled mesh counts; kSettledWeights indexes weights_exceed_hbm (its weights'
  // floor, like a batch's, sets out.capacity).
  static constexpr std::array<PrunedReason, 3> kSettledReasons = {
      PrunedReason::kDoesNotFitHbm, PrunedReason::kCannotBeatTop, PrunedReason::kWeightsExceedHbm};
  static constexpr size_t kSettledWeights = 2;
  static_assert(kSettledReasons[kSettledWeights] == PrunedReason::kWeightsExceedHbm);
  // The counts a settled mesh adds (per_placement: the tally's totals), for record_settled.
  static Settled settled_counts(const WorkerResult& out);
  void record_settled(const MeshPlan& plan, const Settled& before, WorkerResult& out);
  // Adds what evaluate_batches would count for the plan's mesh from settled_.
  void replay_settled(const MeshPlan& plan, PrunedTally& tally, ExplorePhases& phases,
                      double& capacity) const;
  static bool same_counts(const PrunedTally& a, const PrunedTally& b);
  CostContext cost_context(const std::string& attention, const PerfChoice& perf) const;
  bool offload_on(const PerfChoice& perf) const;
  // The remat_policy=none program's collective bounds and then dependency chains (SwitchChains,
  // its compute ops costing none.compute.op_seconds) under every placement of the plan and the
  // switches of the variants that the cheaper bounds before them leave open at this batch.
  // `program` is plan.program, or one of `program_mesh`'s key partitioned on that mesh.
  void bound_none_by_placement(const MeshPlan& plan, const BatchWork& batch, StepProgram& program,
                               const MeshShape& program_mesh, StepSimulator& simulator,
                               NoneBounds& none) const;
  // True when a program of the same class on this mesh or an equivalent one (batch_classes.h: at
  // another batch or under another pipeline schedule) gave the TensorCore bound of this batch's
  // remat_policy=none program and that alone cannot beat the top N: no program is built (the
  // bound is offered as the program's facts, as none_bounds_out does).
  bool bounded_by_class(const MeshPlan& plan, const BatchWork& batch, WorkerResult& out) const;
  // The ClassBounds keys of (batch, this search's schedule) on the plan's mesh, by region: its
  // equivalence key, then the region's class key (empty: no class).
  std::vector<std::vector<int64_t>> class_keys(const MeshPlan& plan, size_t batch) const;
  // The TensorCore bound per context the batch takes from the seconds kept for its class keys,
  // when every region's are known, and whether some came from another schedule's program.
  struct ClassStep {
    std::vector<double> step;
    bool other_schedule = false;
  };
  std::optional<ClassStep> class_step(const BatchWork& batch) const;
  // The TensorCore bounds of the batch's remat_policy=none program on the plan's mesh from a kept
  // program re-sized for it (resizable_programs.h); nullopt when none re-sizes.
  std::optional<ComputeBounds> resized_bounds(const MeshPlan& plan, const BatchWork& batch) const;
  // True when resized_bounds alone cannot beat the top N: no program is built (the bound is
  // offered as the program's facts and class seconds, as none_bounds_out does). Else keeps the
  // re-sized program's bounds in `batch` for none_bounds_out.
  bool bounded_by_resize(const MeshPlan& plan, BatchWork& batch) const;
  // Keeps none's seconds per region pass under the batch's class keys (checking mode: first
  // compares the bound class_step derives with none's, std::logic_error when they differ).
  void remember_class(const BatchWork& batch, const ComputeBounds& none) const;
  // Bounds the batch from the remat_policy=none program (built, or kept from an equivalent mesh):
  // true when no policy can beat the top N; `none` gets its bounds.
  bool none_bounds_out(MeshPlan& plan, const BatchWork& batch, std::optional<NoneBounds>& none,
                       WorkerResult& out);
  // base_perf with the variant's SparseCore offload and collective matmul, no details.
  PerfOptions switch_options(const Variant& variant) const;
  // The least step bound over the plan's placements and the variants: per variant, its context's
  // compute bound plus the collectives the TensorCore drives, or the busiest link, or its chains
  // if larger (collectives or chains not worked out count as 0).
  double least_step_bound(const std::vector<double>& compute,
                          const std::vector<SwitchBounds>& collectives,
                          const std::vector<SwitchChains>* chains = nullptr) const;
  // The batches that divide and the distinct placements of the mesh; false if no batch divides.
  bool plan_mesh(size_t mesh_index, MeshPlan& plan, WorkerResult& out) const;
  // Makes plan.program the program of (batch, remat), partitioning only when its training step
  // is not the one it already holds and no kept program re-sizes for the mesh
  // (resizable_programs.h); keeps what it partitions for other meshes (checking mode: compares it
  // with a kept program re-sized for the mesh, std::logic_error when they differ).
  void build(MeshPlan& plan, size_t batch, size_t remat, WorkerResult& out);
  // plan.program.program from a kept program of (batch, remat) re-sized for the plan's mesh; false
  // when none re-sizes (or re-sizing is off).
  bool copy_resized(MeshPlan& plan, size_t batch, size_t remat) const;
  // As copy_resized, but the kept program is lent to the plan (plan.loan) instead of copied.
  bool borrow_resized(MeshPlan& plan, size_t batch, size_t remat) const;
  // False once the mesh needs no more work (nothing fits, or its weights alone do not).
  bool evaluate_batch(MeshPlan& plan, size_t at, WorkerResult& out);
  // True (and the remat's candidates counted as does_not_fit_hbm, marked unfit from here on)
  // when its memory floor at this batch exceeds HBM: no program needs to be built.
  bool exceeds_floor(MeshPlan& plan, const BatchWork& batch, size_t remat, WorkerResult& out) const;
  // The memory floor of (batch, remat) on the plan's mesh, kept per equivalence key (the same on
  // every mesh of one key: mesh_equivalence.h).
  MemoryFloor::Bytes memory_floor(MeshPlan& plan, size_t batch, size_t remat) const;
  // memory_floor's row entry of (batch, remat), with those of the other policies still fitting
  // there not yet known (in one pass: memory_floor_set.h).
  void fill_floors(MeshPlan& plan, size_t batch, size_t remat) const;
  // With the program of (batch, remat) kept from an equivalent mesh (evaluate_group): its memory
  // and bounds on this mesh's layouts; true when they show that no candidate need be timed (all
  // counted), else the program is built and timed. False: nothing kept, nothing done.
  bool bound_with_kept(MeshPlan& plan, const BatchWork& batch, size_t remat, WorkerResult& out);
  bool evaluate_remat(MeshPlan& plan, const BatchWork& batch, size_t remat,
                      const std::optional<NoneBounds>& none, WorkerResult& out);
  // Marks the attention kinds that do not fit this remat's program; their peaks in kind_peaks.
  void check_fit(MeshPlan& plan, size_t remat, const MemoryEstimate& memory, double usable,
                 std::vector<double>& kind_peaks, WorkerResult& out);
  // Times the program's variants (placements x attention kinds x perf switches) that fit;
  // `known_bounds`: the program's TensorCore bounds when already worked out (remat_policy=none's).
  void time_variants(MeshPlan& plan, const BatchWork& batch, size_t remat,
                     const std::vector<double>& kind_peaks, const std::vector<double>* known_bounds,
                     WorkerResult& out);
  // The variants of plan.program (under every placement) that fit and whose step bounds can
  // still beat the top N, the most promising placement first and, within it, best first.
  std::vector<Bounded> bound_variants(MeshPlan& plan, const Bounding& target,
                                      const BatchWork& batch, size_t remat,
                                      const std::vector<double>& context_bounds,
                                      StepSimulator& simulator, WorkerResult& out) const;
  // A variant's perf options for timing: switch_options with its attention cost context.
  PerfOptions variant_options(const Variant& variant) const;
  // Tightens each open variant's best with StepSimulator::chain_bound, drops those that cannot
  // beat the top N, and puts the rest best first within each placement.
  void tighten_by_chains(MeshPlan& plan, const Bounding& target, const BatchWork& batch,
                         StepSimulator& simulator, std::vector<Bounded>& open,
                         WorkerResult& out) const;
  // Lays `target`'s program out as the plan's placement `which` (relabeled when it was
  // partitioned on another mesh of the key).
  void place(const MeshPlan& plan, const Bounding& target, size_t which) const;
  // The facts key of (batch, remat) on the plan's mesh (kNoRemat: the none program's).
  std::vector<int64_t> facts_key(const MeshPlan& plan, size_t batch, size_t remat) const;
  // With the facts of the same program on an equivalent mesh: true (and the candidates counted)
  // when they show that no attention kind fits or that the compute bound cannot beat the top N.
  bool skip_by_facts(MeshPlan& plan, const BatchWork& batch, size_t remat, WorkerResult& out);
  // Prunes one remat's candidates at a batch as cannot_beat_top (the kinds that did not fit a
  // smaller batch as does_not_fit_hbm).
  static void prune_remat(const MeshPlan& plan, size_t remat, WorkerResult& out);
  double best_possible(const BatchWork& batch, double step_lower_bound) const;
  // Usable HBM per device less the --min-hbm-headroom share (what a candidate's peak must fit).
  double usable_hbm() const;
  // A program's HBM capacity (MemoryEstimate::capacity_bytes) less the --min-hbm-headroom share.
  double usable_of(double capacity_bytes) const;
  // The attention kind's peak does not fit this remat: it is unfit from here on (larger batches
  // too), its candidates count as does_not_fit_hbm and the peak is sampled.
  void mark_unfit(MeshPlan& plan, size_t remat, size_t kind, double peak, WorkerResult& out) const;
  // Counts the kinds still fitted at this remat as cannot_beat_top (the unfit ones are counted).
  static void prune_fitted(const MeshPlan& plan, size_t remat, WorkerResult& out);

  ExploreContext context_;
  CandidateNumbering numbering_;
  std::vector<CostContext> contexts_;  // the distinct attention cost contexts
  std::vector<Variant> variants_;      // per program, in the space's order
  size_t top_size_ = 1;
  // memory_floor's results by equivalence key, then by batch x remats + remat (saved < 0: not
  // yet), this worker's own. A mesh finds its key's row once (MeshPlan::floors).
  static constexpr size_t kMaxKeptFloors = size_t{1} << 18;
  mutable std::map<std::vector<int64_t>, std::vector<MemoryFloor::Bytes>> floors_;
  // fill_floors' sets by batch and policies (a bit each), this worker's own; more policies than
  // bits: one floor at a time.
  static constexpr size_t kMostSetFloors = 64;
  mutable std::map<std::pair<size_t, uint64_t>, std::unique_ptr<MemoryFloorSet>> floor_sets_;
  mutable std::vector<MemoryFloor::Bytes> set_bytes_;  // fill_floors' scratch
  // evaluate_group: programs built on the group's earlier meshes, by training step (batch and
  // remat), with the mesh they were partitioned on, their TensorCore bounds and memory.
  struct KeptProgram {
    MeshShape mesh;
    StepProgram program;
    ResizablePrograms::Loan loan;        // program.program is lent (goes back before it goes)
    ComputeBounds compute;               // remat_policy=none's (empty otherwise)
    std::vector<double> context_bounds;  // TensorCore bounds per cost context (empty: not yet)
    double capacity = 0;
    double peak = 0;
    std::vector<double> kind_peaks;  // empty: memory not estimated; NaN: this kind's not
    // Bounds the later meshes of the group (kept: its compute costs per context are worked out
    // once for all of them; only the collectives depend on the layout).
    std::unique_ptr<StepSimulator> simulator;
    StepSimulator& bounds_simulator() {
      if (simulator == nullptr) {
        simulator = std::make_unique<StepSimulator>(program);
      }
      return *simulator;
    }
  };
  std::map<const TrainingStep*, KeptProgram> kept_;
  bool followed_ = false;  // evaluate_group: another mesh of this key follows
  // Programs are kept for the next mesh of the key (not in checking mode, which builds each).
  bool more_of_key() const { return followed_ && !context_.facts.checking(); }
  // The last mesh of the group evaluated in full, if settled (replayed for the next ones).
  Settled settled_;
  bool settling_ = false;        // the mesh being evaluated is settled so far
  int64_t settled_bounded_ = 0;  // its batches bounded out so far
};

}  // namespace tpusim
