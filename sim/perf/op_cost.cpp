#include "sim/perf/op_cost.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "common/mechanisms.h"
#include "hw/attention_kernel_table.h"
#include "model/ir/op_flops.h"
#include "sim/perf/tokamax_gmm_tiling.h"

namespace tpusim {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr double kMicro = 1e-6;
constexpr double kMebi = 1024.0 * 1024.0;
// The MXU consumes the left operand 8 rows per pass ([SB-t]), so rows pad to 8.
constexpr double kMxuRowTile = 8;
// Half of VMEM holds a matmul's blocks; the other half double-buffers the next blocks
// (assumption: XLA's scoped VMEM + prefetch, docs/reference/hardware.md §4 "Scoped VMEM").
constexpr double kVmemFractionForBlocks = 0.5;
// Contraction chunk of a blocked matmul (assumption: Pallas/XLA matmul kernels use 512-1024 deep
// blocks, [PL-m]); the output block accumulates in f32.
constexpr double kContractionBlock = 512;
constexpr double kAccumulatorBytes = 4;
// Flash attention's backward runs 5 matmuls of the forward's 2 sizes: it recomputes Q.K^T, then
// dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (the splash kernel's structure).
constexpr double kFlashBackwardMatmulRatio = 2.5;
// dot_product attention writes the scores, reads them for the softmax, writes and reads the
// probabilities: 4 passes over the S x S matrix in bf16 (f32 softmax stays in VMEM).
constexpr double kDotProductScorePasses = 4;

// A scatter-add of routed rows against a gather of the same rows, on one v5p chip: Marin's
// Levanter MoE block benchmark (tokens 32768, hidden 2048, mlp 768, 128 experts top-8, forward)
// takes 23.70 ms when the unpermute gathers by the inverse permutation and 36.68 ms when it
// scatter-adds (marin .agents/projects/moe_hillclimb_harness.md, rows baseline and scatter). The
// 12.98 ms difference over the 1.07 GB of routed bf16 rows, added to that gather's modeled 6.27
// ms (routed_row_hbm_fraction 0.0704 of the v5p roofline), is 3.07x the gather; assumed the same
// on every TPU (docs/reference/hardware.md §5.14).
constexpr double kRoutingScatterSlowdown = 3.07;

double roundup(double value, double tile) {
  return std::ceil(value / tile) * tile;
}

// Tokens index activations by batch and length, grouped MoE rows by expert_tokens; a weight (or
// a weight's gradient) has none of them.
bool has_token_dims(const Tensor& tensor) {
  // Interned once: every costed einsum asks, and comparing Names compares pointers.
  static const Name kBatch("batch");
  static const Name kLength("length");
  static const Name kExpertTokens("expert_tokens");
  return tensor.dim_index(kBatch) >= 0 || tensor.dim_index(kLength) >= 0 ||
         tensor.dim_index(kExpertTokens) >= 0;
}

// Which pass of a weight matmul an einsum is: forward (or its remat recompute) and the input
// gradient read a weight operand, the weight gradient writes a weight-shaped result. Einsums of
// activations only (dot_product attention) are none of them.
std::optional<MatmulPass> matmul_pass(const Tensor& lhs, const Tensor& rhs, const Tensor& out) {
  if (!has_token_dims(lhs) || !has_token_dims(rhs)) {
    return lhs.kind == TensorKind::kGradient || rhs.kind == TensorKind::kGradient
               ? MatmulPass::kInputGrad
               : MatmulPass::kForward;
  }
  if (!has_token_dims(out)) {
    return MatmulPass::kWeightGrad;
  }
  return std::nullopt;
}

OpCost finish(OpCost cost, const CostContext& context) {
  cost.mxu_seconds /= context.program_efficiency;
  cost.hbm_seconds /= context.program_efficiency;
  cost.vpu_seconds /= context.program_efficiency;
  const double busy = std::max({cost.mxu_seconds, cost.hbm_seconds, cost.vpu_seconds});
  cost.seconds = busy + context.chip->op_overhead_us * kMicro;
  if (busy <= 0) {
    cost.bound = CostCategory::kOverhead;
  } else if (busy == cost.mxu_seconds) {
    cost.bound = CostCategory::kMxu;
  } else if (busy == cost.hbm_seconds) {
    cost.bound = CostCategory::kHbm;
  } else {
    cost.bound = CostCategory::kVpu;
  }
  return cost;
}

// The dims of an einsum by role: in both operands and the output (batch: the experts of a
// grouped matmul), lhs and output only (rows), rhs and output only (cols), or both operands only
// (contracted). Each size is the product of its dims taken in name order.
struct EinsumShape {
  double loops = 1;           // batch
  double m = 1;               // rows
  double k = 1;               // contracted
  double n = 1;               // cols
  char expert_tokens_in = 0;  // 'm', 'k' or 'n': where a dropless grouped matmul's token dim is
  // The largest dim of each role, by name ("embed", "mlp", "expert_tokens"): megablox tiles.
  std::string m_name;
  std::string k_name;
  std::string n_name;
};

EinsumShape einsum_shape(const Tensor& lhs, const Tensor& rhs, const Tensor& out) {
  static const Name kExpertTokens("expert_tokens");
  struct Named {
    Name name;
    int64_t size;  // the rhs's when both operands have the dim
    bool lhs;
    bool rhs;
    bool out;
  };
  // On the stack for the usual ranks: every costed einsum builds one (explore costs millions).
  constexpr size_t kUsualDims = 12;
  boost::container::small_vector<Named, kUsualDims> dims;
  auto find = [&dims](const Name& name) {
    return std::find_if(dims.begin(), dims.end(),
                        [&name](const Named& dim) { return dim.name == name; });
  };
  for (const Dim& dim : lhs.dims) {
    if (const auto found = find(dim.name); found != dims.end()) {
      found->size = dim.size;
    } else {
      dims.push_back({dim.name, dim.size, true, false, false});
    }
  }
  for (const Dim& dim : rhs.dims) {
    if (const auto found = find(dim.name); found != dims.end()) {
      found->size = dim.size;
      found->rhs = true;
    } else {
      dims.push_back({dim.name, dim.size, false, true, false});
    }
  }
  for (const Dim& dim : out.dims) {
    if (const auto found = find(dim.name); found != dims.end()) {
      found->out = true;
    }
  }
  std::sort(dims.begin(), dims.end(),
            [](const Named& a, const Named& b) { return a.name.str() < b.name.str(); });
  EinsumShape shape;
  double largest_m = 0;
  double largest_k = 0;
  double largest_n = 0;
  for (const Named& dim : dims) {
    const auto size = static_cast<double>(dim.size);
    char group = 0;
    auto take_name = [&dim, size](std::string& name, double& largest) {
      if (size > largest) {
        largest = size;
        name = dim.name.str();
      }
    };
    if (dim.lhs && dim.rhs && dim.out) {
      shape.loops *= size;
    } else if (dim.lhs && dim.rhs) {
      shape.k *= size;
      group = 'k';
      take_name(shape.k_name, largest_k);
    } else if (dim.lhs) {
      shape.m *= size;
      group = 'm';
      take_name(shape.m_name, largest_m);
    } else {
      shape.n *= size;
      group = 'n';
      take_name(shape.n_name, largest_n);
    }
    if (dim.name == kExpertTokens) {
      shape.expert_tokens_in = group;
    }
  }
  return shape;
}

// A megablox grouped matmul (gmm for the forward and dlhs, tgmm for the weight gradient) walks
// tiles of tm rows x tk x tn: a tile that straddles two experts' rows is visited once per expert,
// so `rows` rows of `groups` experts take ceil(rows / tm) + groups - 1 row tiles (jax's megablox
// make_group_metadata: routed groups are ragged, so nearly every boundary between two experts
// falls inside a tile), and the embed/mlp dims pad up to whole tiles. Balanced groups (a kernel
// benchmark's) straddle only where a boundary is not a multiple of tm. Each row tile re-reads the
// expert's weight tile; the left operand is re-read once per output column tile.
struct GroupedMatmulWork {
  double executed_flops = 0;
  double hbm_bytes = 0;
  double grid_steps = 0;  // row tile visits x column tiles x contraction tiles
  // With the whole contraction in one tile, each (column tile, expert) run of row tiles keeps one
  // weight block resident: the number of such runs and the bytes of one block (0 otherwise).
  double weight_runs = 0;
  double weight_block_bytes = 0;
};

// How the kernel walks its row tiles: the tile rows, the rows the MXU takes per tile (at least
// its width under grouped_matmul_mxu_rows), and whether the groups are balanced.
struct RowTiling {
  double batch_seq = 512;
  double mxu_rows = 0;
  bool balanced = false;
};

// How a grouped-matmul kernel walks its row tiles, and what each step of its grid costs besides
// its matmul. A row tile streams its rows through weights held in the MXU; with fewer rows than
// the array is wide, loading the next weights is not hidden behind them (tokamax 5bd37bf derives
// tile_m from the MXU width for this reason; docs/reference/hardware.md §5.13). tokamax's gmm_v2
// instead pays a fixed time per grid step (its scalar work: index maps, DMA issues and waits), on
// the core between its matmuls while the issued DMAs stream on, so on the MXU side; its short
// row tiles cost their rows: PR #1221's tile_m 128 -> 256 speed-ups on 256-wide MXUs (1.22-1.59x,
// not the 2x of a full-width pass) follow from the halved step count (§5.16).
struct KernelSteps {
  RowTiling rows;
  double step_seconds = 0;
  double mxu_share = 1;  // the share of the device's MXUs the kernel runs on
};

KernelSteps grouped_matmul_kernel_steps(const GroupedMatmulTiles& tiles,
                                        const CostContext& context) {
  const bool gmm_v2_steps =
      context.gmm_v2 && context.mechanisms.enabled(Mechanism::kGmmV2GridSteps);
  const bool full_width_rows =
      context.mechanisms.enabled(Mechanism::kGroupedMatmulMxuRows) && !gmm_v2_steps;
  KernelSteps steps;
  steps.rows = {static_cast<double>(tiles.batch_seq), full_width_rows ? context.chip->mxu_dim : 0.0,
                context.balanced_groups};
  steps.step_seconds = gmm_v2_steps ? context.chip->gmm_v2_grid_step_us * kMicro : 0.0;
  // gmm_v2 is a pallas_call with no grid whose emit_pipeline has no core axis: on a megacore
  // device (two TensorCores per JAX device: v4, v5p) Pallas runs it on one TensorCore, which has
  // its own MXUs and shares the device's HBM (docs/reference/hardware.md §5.16).
  if (context.gmm_v2 && context.mechanisms.enabled(Mechanism::kGmmV2OneTensorCore)) {
    const ChipSpec& chip = *context.chip;
    steps.mxu_share = std::min(1.0, chip.devices_per_chip / chip.tensorcores_per_chip);
  }
  return steps;
}

// The row tiles visited for `rows` rows in `groups` groups of tm-row tiles.
double row_tile_visits(double rows, double groups, double tm, bool balanced) {
  if (!balanced) {
    return std::ceil(rows / tm) + groups - 1;
  }
  const double per_group = rows / groups;
  const auto count = static_cast<int64_t>(groups);
  double visits = 0;
  for (int64_t group = 0; group < count; ++group) {
    const auto start = static_cast<double>(group) * per_group;
    visits += std::ceil((start + per_group) / tm) - std::floor(start / tm);
  }
  return visits;
}

GroupedMatmulWork grouped_matmul_work(const EinsumShape& shape, const GroupedMatmulTiles& tiles,
                                      const RowTiling& tiling, double routed, double lhs_bytes,
                                      double rhs_bytes, double out_bytes) {
  auto tile_of = [&tiles](const std::string& name) {
    return static_cast<double>(name == "embed" ? tiles.embed : tiles.mlp);
  };
  const double groups = shape.loops;
  GroupedMatmulWork work;
  if (shape.expert_tokens_in == 'k') {
    // tgmm: out[expert, m, n] = sum over the expert's rows of lhs[row, m] x rhs[row, n].
    const double rows = groups * shape.k * routed;
    const double tm = std::min(tiling.batch_seq, rows);
    const double ta = std::min(tile_of(shape.m_name), shape.m);
    const double tb = std::min(tile_of(shape.n_name), shape.n);
    const double padded_m = roundup(shape.m, ta);
    const double padded_n = roundup(shape.n, tb);
    const double visits = row_tile_visits(rows, groups, tm, tiling.balanced);
    work.executed_flops = 2.0 * visits * std::max(tm, tiling.mxu_rows) * padded_m * padded_n;
    work.hbm_bytes =
        visits * tm *
            (padded_m * (padded_n / tb) * lhs_bytes + padded_n * (padded_m / ta) * rhs_bytes) +
        groups * padded_m * padded_n * out_bytes;
    work.grid_steps = visits * (padded_m / ta) * (padded_n / tb);
    return work;
  }
  // gmm: out[row, n] = lhs[row, k] x rhs[expert(row), k, n].
  const double rows = groups * shape.m * routed;
  const double tm = std::min(tiling.batch_seq, rows);
  const double tk = std::min(tile_of(shape.k_name), shape.k);
  const double tn = std::min(tile_of(shape.n_name), shape.n);
  const double padded_k = roundup(shape.k, tk);
  const double padded_n = roundup(shape.n, tn);
  const double visits = row_tile_visits(rows, groups, tm, tiling.balanced);
  work.executed_flops = 2.0 * visits * std::max(tm, tiling.mxu_rows) * padded_k * padded_n;
  // The grid walks (column tile, row tile, contraction tile). Pallas fetches a block only when
  // its index changes between steps, so with the whole contraction in one tile an expert's
  // weight column stays in VMEM across that expert's row tiles: fetched once per expert.
  const bool whole_contraction = padded_k / tk <= 1;
  const double weight_fetches = whole_contraction ? groups : visits;
  work.hbm_bytes =
      visits * ((padded_n / tn) * tm * padded_k * lhs_bytes + tm * padded_n * out_bytes) +
      weight_fetches * padded_k * padded_n * rhs_bytes;
  work.grid_steps = visits * (padded_n / tn) * (padded_k / tk);
  if (whole_contraction) {
    work.weight_runs = groups * (padded_n / tn);
    work.weight_block_bytes = padded_k * tn * rhs_bytes;
  }
  return work;
}

// The MXU-side time of tokamax's gmm_v2 when each expert's weight block waits for the stream
// (the gmm_v2_weight_prefetch mechanism; docs/reference/hardware.md §5.17). The kernel's
// emit_pipeline uses Pallas's standard schedule (its weight BlockSpec asks for three buffers but
// not use_lookahead), which starts fetching a changed block in the iteration directly before the
// one that uses it, behind that iteration's row tile. Per (column tile, expert) run of S steps of
// `step_seconds` on the MXU side, each streaming `stream_bytes`, the next run cannot start before
// (S - 1) x step + block / bandwidth + stream / bandwidth. 0 when a run is one step (the HBM
// roofline holds then) or the contraction is split (a block per step).
// Example: 8 steps of 2 us per run, a 10 us block, 1 us of stream per step: 14 + 10 + 1 = 25 us
// per run against 16 us of MXU time.
double gmm_v2_weight_wait_seconds(const GroupedMatmulWork& work, double step_seconds,
                                  double bytes_per_second) {
  constexpr double kLookaheadSteps = 1;  // the standard schedule: one iteration ahead
  if (work.weight_runs <= 0) {
    return 0;
  }
  const double steps_per_run = work.grid_steps / work.weight_runs;
  if (steps_per_run <= kLookaheadSteps) {
    return 0;
  }
  const double stream_seconds_per_step =
      (work.hbm_bytes - work.weight_runs * work.weight_block_bytes) / bytes_per_second /
      work.grid_steps;
  return work.weight_runs *
         ((steps_per_run - kLookaheadSteps) * step_seconds +
          work.weight_block_bytes / bytes_per_second + kLookaheadSteps * stream_seconds_per_step);
}

// The tiles tokamax picks for itself when MaxText calls it with none (CostContext's
// tokamax_own_tiles; docs/reference/hardware.md §5.15), as megablox tiles by dim name: the row
// tile, the tile over the contraction and the tile over the output columns (a weight gradient's
// two weight dims). tokamax keys its tables on the call's rows and widths: the input gradient's
// key names its output width before its contraction.
GroupedMatmulTiles tokamax_tiles(const EinsumShape& shape, MatmulPass pass, double routed) {
  GroupedMatmulTiles tiles;
  auto tile_of = [&tiles](const std::string& name) -> int64_t& {
    return name == "embed" ? tiles.embed : tiles.mlp;
  };
  auto whole = [](double size) { return static_cast<int64_t>(std::llround(size)); };
  const auto groups = whole(shape.loops);
  if (shape.expert_tokens_in == 'k') {
    const TokamaxTiling tiling =
        tokamax_heuristic_tiling(TokamaxKernel::kTgmm, whole(shape.loops * shape.k * routed),
                                 whole(shape.m), whole(shape.n), groups);
    tiles.batch_seq = tiling.tile_m;
    tile_of(shape.m_name) = tiling.tile_k;
    tile_of(shape.n_name) = tiling.tile_n;
    return tiles;
  }
  const int64_t rows = whole(shape.loops * shape.m * routed);
  const TokamaxTiling tiling =
      pass == MatmulPass::kInputGrad
          ? tokamax_heuristic_tiling(TokamaxKernel::kGmmTransposeRhs, rows, whole(shape.n),
                                     whole(shape.k), groups)
          : tokamax_heuristic_tiling(TokamaxKernel::kGmm, rows, whole(shape.k), whole(shape.n),
                                     groups);
  tiles.batch_seq = tiling.tile_m;
  tile_of(shape.k_name) = tiling.tile_k;
  tile_of(shape.n_name) = tiling.tile_n;
  return tiles;
}

// The fraction of a weight operand one device reads to find its absmax scale: the scale is a max
// over the weight, which XLA's sharding propagation computes where the weight is still sharded
// (a local max and an all-reduce of the scalar or per-channel maxima), before the FSDP all-gather
// that makes the operand whole. Walks back from the operand through all-gathers and one-input
// elementwise ops (the cast from the float32 master copy) to the shard: `visit` is called with
// each tensor on the way (the operand's own excepted).
template <typename Visit>
void walk_weight_scale_chain(const Graph& graph, TensorId operand, const Visit& visit) {
  constexpr int kMaxHops = 4;
  TensorId value = operand;
  for (int hop = 0; hop < kMaxHops; ++hop) {
    const int producer = graph.producer(value);
    if (producer < 0) {
      break;
    }
    const Op& op = graph.ops().at(static_cast<size_t>(producer));
    const bool passes_through =
        op.kind == OpKind::kAllGather || (op.kind == OpKind::kElementwise && op.inputs.size() == 1);
    if (!passes_through) {
      break;
    }
    value = op.inputs[0];
    visit(value);
  }
}

// The fraction: the smallest tensor on that walk over the operand.
double weight_scale_read_fraction(const Graph& graph, TensorId operand) {
  const double whole = static_cast<double>(graph.tensor(operand).num_elements());
  double smallest = whole;
  walk_weight_scale_chain(graph, operand, [&](TensorId value) {
    smallest = std::min(smallest, static_cast<double>(graph.tensor(value).num_elements()));
  });
  return whole > 0 ? smallest / whole : 1.0;
}

// Whether a tensor is written by an elementwise, norm or rotary fusion, into which XLA fuses an
// elementwise consumer such as a fixed-scale cast (producer-consumer fusion). Operands written by
// matmuls, Pallas kernels, collectives or gathers (offloaded to the SparseCores in the recipes
// that quantize grouped matmuls) are not.
bool made_by_vector_fusion(const Graph& graph, TensorId id) {
  const int producer = graph.producer(id);
  if (producer < 0) {
    return false;
  }
  const OpKind kind = graph.ops().at(static_cast<size_t>(producer)).kind;
  return kind == OpKind::kElementwise || kind == OpKind::kRmsNorm || kind == OpKind::kLayerNorm ||
         kind == OpKind::kRope || kind == OpKind::kNormGrad;
}

// Quantizing an operand with a dynamic (absmax) scale needs the scale first: a reduction that
// reads the whole bf16 operand before the matmul (the scale-and-cast itself fuses into the
// matmul's operand read). It runs as its own HBM-bound pass, in series with the matmul. Operands
// already 1 byte wide, or with a fixed scale, need no pass. The fraction of the operand the
// scale pass reads: 0 without a pass. A backward matmul that reuses the forward's quantized
// operands (quantized_residuals) scales only its incoming gradient.
double scale_read_fraction(const Graph& graph, TensorId id, MatmulPass pass,
                           const CostContext& context) {
  const Tensor& operand = graph.tensor(id);
  if (dtype_bytes(operand.dtype) <= 1) {
    return 0.0;
  }
  if (pass != MatmulPass::kForward && operand.kind != TensorKind::kGradient &&
      context.quantized_residuals && context.mechanisms.enabled(Mechanism::kQuantizedResiduals)) {
    return 0.0;
  }
  if (!has_token_dims(operand)) {
    if (!context.dynamic_scale_weights) {
      return 0.0;
    }
    return context.mechanisms.enabled(Mechanism::kWeightScaleOnShard)
               ? weight_scale_read_fraction(graph, id)
               : 1.0;
  }
  const bool dynamic = operand.kind == TensorKind::kGradient ? context.dynamic_scale_gradients
                                                             : context.dynamic_scale_activations;
  return dynamic ? 1.0 : 0.0;
}

// Bytes of the XLA fusions that quantize the operands of a quantized megablox/tokamax grouped
// matmul before the kernel runs (MaxText megablox/ops.py: qpl.quantize of lhs and rhs in _gmm_fwd,
// of the incoming gradient twice in _gmm_bwd, once scaled for dlhs and once for drhs; the forward
// operands are kept quantized as residuals, so dlhs and drhs cast only the gradient). A cast
// reads the operand and writes its 1-byte copy, with these exceptions, all XLA fusion:
//  * wi_0 and wi_1 read one input: it is cast once (charged to wi_0);
//  * the drhs cast of a gradient shares the dlhs cast's read (sibling multi-output fusion);
//  * with a fixed scale, an operand written by an elementwise or norm fusion is cast in that
//    fusion (an elementwise consumer fused into its producer): only the copy is written;
//  * a weight is cast where its scale is found (weight_scale_on_shard): on its FSDP shard.
double grouped_matmul_cast_bytes(const Graph& graph, const Op& op, MatmulPass pass,
                                 double lhs_elements, double rhs_elements,
                                 const CostContext& context) {
  constexpr double kNarrowBytes = 1.0;
  double bytes = 0;
  const std::pair<size_t, double> operands[] = {{0, lhs_elements}, {1, rhs_elements}};
  for (const auto& [index, elements] : operands) {
    const TensorId id = op.inputs[index];
    const Tensor& operand = graph.tensor(id);
    const double width = dtype_bytes(operand.dtype);
    if (width <= kNarrowBytes) {
      continue;
    }
    const bool gradient = operand.kind == TensorKind::kGradient;
    if (!gradient && (pass != MatmulPass::kForward ||
                      (has_token_dims(operand) && op.name.find("/wi_1") != std::string::npos))) {
      continue;  // the forward's quantized residual, or wi_0's cast of the same input
    }
    if (!has_token_dims(operand)) {
      const double fraction = context.mechanisms.enabled(Mechanism::kWeightScaleOnShard)
                                  ? weight_scale_read_fraction(graph, id)
                                  : 1.0;
      bytes += fraction * elements * (width + kNarrowBytes);
      continue;
    }
    const bool fixed_scale =
        gradient ? !context.dynamic_scale_gradients : !context.dynamic_scale_activations;
    const bool read_elsewhere = (gradient && pass == MatmulPass::kWeightGrad) ||
                                (fixed_scale && made_by_vector_fusion(graph, id));
    bytes += elements * ((read_elsewhere ? 0.0 : width) + kNarrowBytes);
  }
  return bytes;
}

// AQT's int8 backward matmuls round their gradient operand stochastically (aqt config_v3:
// vjp_lhs stochastic rounding with jax.uniform): the noise is a float32 tensor of the gradient's
// shape from jax.random.uniform, whose generator output XLA writes to HBM and the quantize fusion
// reads back (4 + 4 bytes per element), in series with the matmul. Operands already 1 byte wide
// were quantized before; only gradients (TensorKind::kGradient) get noise.
double stochastic_rounding_noise_bytes(const Tensor& lhs, const Tensor& rhs, double lhs_elements,
                                       double rhs_elements) {
  constexpr double kNoiseBytesPerElement = 2 * 4.0;  // float32 noise written, then read
  auto noisy = [](const Tensor& operand) {
    return operand.kind == TensorKind::kGradient && dtype_bytes(operand.dtype) > 1;
  };
  return kNoiseBytesPerElement *
         ((noisy(lhs) ? lhs_elements : 0.0) + (noisy(rhs) ? rhs_elements : 0.0));
}

// Under quantization MaxText's dense MoE path sends its dispatch and combine einsums through the
// quantized einsum too (moe.py get_einsum: only inference keeps them plain), so each pays the
// scale pass of its two operands (the token-side operand and the [batch, length, experts,
// capacity] mask) and, under AQT int8, the stochastic-rounding noise of a gradient operand.
// Seconds added to the exchange's cost, in series; its MXU time is left as costed.
double dense_moe_exchange_quantize_seconds(const Graph& graph, const Op& op,
                                           const CostContext& context) {
  if (!context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)]) {
    return 0;
  }
  const bool dispatch = op.kind == OpKind::kMoeDispatch;
  const Tensor& tokens = graph.tensor(dispatch ? op.inputs[0] : op.outputs[0]);
  const Tensor& grouped = graph.tensor(dispatch ? op.outputs[0] : op.inputs[0]);
  const Tensor& operand = graph.tensor(op.inputs[0]);
  auto size_of = [&tokens](const char* name) {
    const int index = tokens.dim_index(name);
    return index < 0 ? 1.0 : static_cast<double>(tokens.dims[static_cast<size_t>(index)].size);
  };
  const double embed = size_of("embed");
  const double length = size_of("length");
  const double mask_elements = static_cast<double>(grouped.num_elements()) / embed * length;
  const auto operand_elements = static_cast<double>(operand.num_elements());
  constexpr double kMaskBytesPerElement = 2;  // the one-hot mask in the activation dtype
  double bytes = 0;
  if (context.mechanisms.enabled(Mechanism::kQuantizeScalePass)) {
    const bool gradient = operand.kind == TensorKind::kGradient;
    const bool dynamic =
        gradient ? context.dynamic_scale_gradients : context.dynamic_scale_activations;
    bytes += (dynamic ? static_cast<double>(operand.bytes()) : 0.0) +
             (context.dynamic_scale_activations ? mask_elements * kMaskBytesPerElement : 0.0);
  }
  if (context.stochastic_rounding_gradients &&
      context.mechanisms.enabled(Mechanism::kAqtStochasticRounding)) {
    // Only the first operand can be a gradient; the mask is not one.
    bytes += stochastic_rounding_noise_bytes(operand, operand, operand_elements, 0.0);
  }
  return bytes / hbm_bytes_per_second(*context.chip) / context.program_efficiency;
}

// The gradient of a routed expert's bias (MaxText's mlp_bias on the dropless path: moe.py
// transform_bias gathers bias[expert] for every routed row, and the bias joins the expert matmul's
// output) is JAX's transpose of that gather: a scatter-add of the matmul's routed output-gradient
// rows into the [experts, width] bias. Each expert matmul's weight gradient (x^T dY over the
// routed rows) reads exactly that dY, so its bias gradient is charged beside it: the routed rows
// at the routing scatter-add's rate (kRoutingScatterSlowdown over routed_row_hbm_fraction of the
// roofline, docs/reference/hardware.md §5.18), as HBM bytes at the roofline. The forward's bias
// gathers read a table of `experts` rows and fuse into the add after the kernel: not charged.
double expert_bias_scatter_bytes(const Tensor& lhs, const Tensor& rhs, double routed,
                                 const ChipSpec& chip) {
  const Tensor& gradient = lhs.kind == TensorKind::kGradient ? lhs : rhs;
  const double rows = static_cast<double>(gradient.bytes()) * routed;
  return rows * kRoutingScatterSlowdown / chip.routed_row_hbm_fraction;
}

// A pass over `bytes` of HBM that runs before the op and overlaps nothing (a cast, a scale read,
// a noise tensor): its time adds to the op's and to its HBM time.
void add_serial_hbm_pass(OpCost& cost, double bytes, const CostContext& context) {
  const double seconds = bytes / hbm_bytes_per_second(*context.chip) / context.program_efficiency;
  cost.seconds += seconds;
  cost.hbm_seconds += seconds;
}

OpCost einsum_cost(const Graph& graph, const Op& op, const CostContext& context) {
  const Tensor& lhs = graph.tensor(op.inputs[0]);
  const Tensor& rhs = graph.tensor(op.inputs[1]);
  const Tensor& out = graph.tensor(op.outputs[0]);
  const EinsumShape shape = einsum_shape(lhs, rhs, out);
  double m = shape.m;
  double k = shape.k;
  double n = shape.n;
  double loops = shape.loops;
  // A dropless grouped matmul reads, multiplies and writes only the routed rows (megablox).
  const double routed = op.attrs.routed_fraction;
  if (shape.expert_tokens_in == 'm') {
    m *= routed;
  } else if (shape.expert_tokens_in == 'n') {
    n *= routed;
  } else if (shape.expert_tokens_in == 'k') {
    k *= routed;
  } else {
    loops *= routed;
  }
  const std::optional<MatmulPass> pass = matmul_pass(lhs, rhs, out);
  // MaxText leaves the logits matmul unquantized (decoders.py: "We do not quantize the logits
  // matmul"; qwix's rule matches only decoder/.*layers.*): every einsum over the vocabulary (the
  // unembedding, its two gradients, a one-hot embedding) stays bf16.
  static const Name kVocab("vocab");
  const bool logits =
      context.mechanisms.enabled(Mechanism::kBf16Logits) &&
      (lhs.dim_index(kVocab) >= 0 || rhs.dim_index(kVocab) >= 0 || out.dim_index(kVocab) >= 0);
  // Dropless expert matmuls MaxText's quantization does not reach (CostContext::
  // unquantized_experts) stay bf16, with no scale pass or noise.
  const bool unquantized_expert = shape.expert_tokens_in != 0 && context.unquantized_experts &&
                                  context.mechanisms.enabled(Mechanism::kBf16ExpertMatmuls);
  const bool quantized = pass.has_value() && context.quantized_pass[static_cast<size_t>(*pass)] &&
                         !logits && !unquantized_expert;
  OpCost cost;
  cost.matmul_flops = 2.0 * loops * m * k * n;
  double cast_bytes = 0;  // XLA's quantize fusions before a grouped-matmul kernel
  const ChipSpec& chip = *context.chip;
  const double peak = peak_flops_per_device(context, quantized) * chip.mxu_achievable_fraction;
  // Pipeline fill and drain of the systolic array, once per op: weights are double-buffered, so
  // later weight tiles load without a bubble ([SB-t]; docs/reference/hardware.md §5.3).
  const double fill_drain_seconds = chip.mxu_fill_drain_cycles / (chip.clock_ghz * kGiga);
  const double lhs_bytes = dtype_bytes(lhs.dtype);
  const double rhs_bytes = dtype_bytes(rhs.dtype);
  const double out_bytes = dtype_bytes(out.dtype);
  if (context.megablox && pass.has_value() &&
      context.mechanisms.enabled(Mechanism::kGroupedMatmulTiles) &&
      (shape.expert_tokens_in == 'm' || shape.expert_tokens_in == 'k')) {
    const int weight = op.name.find("/wo") != std::string::npos ? 1 : 0;
    const GroupedMatmulTiles tiles =
        context.tokamax_own_tiles && context.mechanisms.enabled(Mechanism::kTokamaxGmmTiles)
            ? tokamax_tiles(shape, *pass, routed)
            : context.megablox_tiles[weight][static_cast<size_t>(*pass)];
    const KernelSteps steps = grouped_matmul_kernel_steps(tiles, context);
    // Quantized (qwix/AQT) expert weights reach the kernel already narrowed: it reads one byte
    // per weight element. With grouped_matmul_quantize_pass every operand does: MaxText's
    // megablox/ops.py quantizes each one (qpl.quantize) in XLA before the kernel, and the cast
    // is charged below (grouped_matmul_cast_bytes).
    const bool narrow_operands =
        quantized && context.mechanisms.enabled(Mechanism::kGroupedMatmulQuantizePass);
    const double kernel_lhs_bytes = narrow_operands ? std::min(lhs_bytes, 1.0) : lhs_bytes;
    const double weight_bytes = (quantized && !has_token_dims(rhs)) || narrow_operands
                                    ? std::min(rhs_bytes, 1.0)
                                    : rhs_bytes;
    const GroupedMatmulWork work = grouped_matmul_work(shape, tiles, steps.rows, routed,
                                                       kernel_lhs_bytes, weight_bytes, out_bytes);
    const double kernel_peak = peak * steps.mxu_share;
    cost.mxu_seconds = work.executed_flops / kernel_peak + fill_drain_seconds +
                       work.grid_steps * steps.step_seconds;
    cost.hbm_seconds = work.hbm_bytes / hbm_bytes_per_second(chip);
    if (context.gmm_v2 && context.mechanisms.enabled(Mechanism::kGmmV2WeightPrefetch)) {
      const double step_seconds =
          work.executed_flops / kernel_peak / work.grid_steps + steps.step_seconds;
      const double wait_seconds =
          gmm_v2_weight_wait_seconds(work, step_seconds, hbm_bytes_per_second(chip));
      cost.mxu_seconds = std::max(cost.mxu_seconds, wait_seconds + fill_drain_seconds);
    }
    if (narrow_operands) {
      cast_bytes =
          grouped_matmul_cast_bytes(graph, op, *pass, loops * m * k, loops * k * n, context);
    }
  } else {
    // The MXU streams the larger of the two free dims as rows (XLA picks the layout).
    const double efficiency =
        std::max(mxu_padding_efficiency(chip, m, k, n), mxu_padding_efficiency(chip, n, k, m));
    cost.mxu_seconds = cost.matmul_flops / (peak * efficiency) + fill_drain_seconds;
    cost.hbm_seconds = loops *
                       blocked_matmul_hbm_bytes(chip, m, k, n, lhs_bytes, rhs_bytes, out_bytes) /
                       hbm_bytes_per_second(chip);
  }
  OpCost result = finish(cost, context);
  if (cast_bytes > 0) {
    add_serial_hbm_pass(result, cast_bytes, context);
  }
  if (quantized && context.mechanisms.enabled(Mechanism::kQuantizeScalePass)) {
    add_serial_hbm_pass(
        result,
        loops * (scale_read_fraction(graph, op.inputs[0], *pass, context) * m * k * lhs_bytes +
                 scale_read_fraction(graph, op.inputs[1], *pass, context) * k * n * rhs_bytes),
        context);
  }
  if (quantized && context.stochastic_rounding_gradients &&
      context.mechanisms.enabled(Mechanism::kAqtStochasticRounding)) {
    add_serial_hbm_pass(
        result, stochastic_rounding_noise_bytes(lhs, rhs, loops * m * k, loops * k * n), context);
  }
  if (context.routed_expert_biases && shape.expert_tokens_in == 'k' &&
      pass == MatmulPass::kWeightGrad &&
      context.mechanisms.enabled(Mechanism::kExpertBiasScatterGradients)) {
    add_serial_hbm_pass(result, expert_bias_scatter_bytes(lhs, rhs, routed, chip), context);
  }
  return result;
}

int64_t dim_or_one(const Tensor& tensor, const std::string& name) {
  const int index = tensor.dim_index(name);
  return index < 0 ? 1 : tensor.dims[static_cast<size_t>(index)].size;
}

// A GPU's fused attention (attention=cudnn_flash_te: cuDNN through Transformer Engine) at the
// kernel's measured rate for its sequence length and mask (the catalog's attention_kernel table),
// not at the GEMM rate: on H100 cuDNN's causal forward at 4k tokens reaches 52% of the dense peak
// where large GEMMs reach 80%. The measured rates are whole-kernel figures (softmax included), so
// no VPU time is added; FLOPs are counted as the table counts them (a causal mask halves the
// square). The kernel runs in bf16 under any quantization of the layers.
OpCost gpu_attention_kernel_cost(const Graph& graph, const Op& op, const CostContext& context,
                                 bool backward) {
  const size_t first = backward ? 1 : 0;
  const Tensor& query = graph.tensor(op.inputs[first]);
  const Tensor& key = graph.tensor(op.inputs[first + 1]);
  const Tensor& value = graph.tensor(op.inputs[first + 2]);
  const auto query_length = static_cast<double>(dim_or_one(query, "length"));
  const int64_t key_length = dim_or_one(key, "length");
  const auto qk_dim = static_cast<double>(query.dims.back().size);
  const auto v_dim = static_cast<double>(value.dims.back().size);
  const ChipSpec& chip = *context.chip;
  const bool causal = op.attrs.mask != AttentionMask::kNone;
  const double mask_fraction =
      causal ? attention_mask_fraction(op.attrs.mask, key_length, op.attrs.window) : 1.0;
  const double scores = static_cast<double>(dim_or_one(query, "batch")) *
                        static_cast<double>(dim_or_one(query, "heads")) * query_length *
                        static_cast<double>(key_length) * mask_fraction;
  const double passes = backward ? kFlashBackwardMatmulRatio : 1.0;
  OpCost cost;
  cost.matmul_flops = 2.0 * scores * (qk_dim + v_dim) * passes;
  // Head dims pad to the tensor-core tile as on the GEMM path (none for head_dim 64 or 128).
  const double padded_flops =
      2.0 * scores * passes * (roundup(qk_dim, chip.mxu_dim) + roundup(v_dim, chip.mxu_dim));
  const double rate = attention_kernel_tflops(
      chip.attention_kernel, static_cast<double>(key_length),
      backward ? AttentionPass::kBackward : AttentionPass::kForward, causal);
  cost.mxu_seconds = padded_flops / (rate * kTera / chip.devices_per_chip);
  const double bytes = static_cast<double>(query.bytes() + key.bytes() + value.bytes()) +
                       static_cast<double>(dim_or_one(query, "batch")) *
                           static_cast<double>(dim_or_one(query, "heads")) * query_length * v_dim *
                           dtype_bytes(query.dtype);
  cost.hbm_seconds = bytes * (backward ? 2.0 : 1.0) / hbm_bytes_per_second(chip);
  return finish(cost, context);
}

OpCost attention_cost(const Graph& graph, const Op& op, const CostContext& context, bool backward) {
  if (context.flash_attention && context.chip->is_gpu() &&
      !context.chip->attention_kernel.empty() &&
      context.mechanisms.enabled(Mechanism::kGpuAttentionKernelRates)) {
    return gpu_attention_kernel_cost(graph, op, context, backward);
  }
  const size_t first = backward ? 1 : 0;
  const Tensor& query = graph.tensor(op.inputs[first]);
  const Tensor& key = graph.tensor(op.inputs[first + 1]);
  const Tensor& value = graph.tensor(op.inputs[first + 2]);
  const double batch = static_cast<double>(dim_or_one(query, "batch"));
  const double heads = static_cast<double>(dim_or_one(query, "heads"));
  const auto query_length = static_cast<double>(dim_or_one(query, "length"));
  const auto key_length = static_cast<double>(dim_or_one(key, "length"));
  const auto qk_dim = static_cast<double>(query.dims.back().size);
  const auto v_dim = static_cast<double>(value.dims.back().size);
  const ChipSpec& chip = *context.chip;
  double computed_fraction = 1.0;  // of the Sq x Skv score matrix
  double hbm_bytes = 0;
  const double q_bytes = static_cast<double>(query.bytes());
  const double kv_bytes = static_cast<double>(key.bytes() + value.bytes());
  const double out_bytes = batch * heads * query_length * v_dim * dtype_bytes(query.dtype);
  // A sliding-window layer runs with its own splash blocks when local_sa_block_* set them.
  const bool local = op.attrs.mask == AttentionMask::kSlidingWindow;
  auto local_or = [local](int64_t local_value, int64_t global_value) {
    return local && local_value > 0 ? local_value : global_value;
  };
  if (context.flash_attention) {
    // Blocks of block_q x block_kv scores; a causal mask skips blocks wholly above the diagonal.
    const double block_q = std::min<double>(
        static_cast<double>(local_or(context.local_block_q, context.block_q)), query_length);
    const double block_kv = std::min<double>(
        static_cast<double>(local_or(context.local_block_kv, context.block_kv)), key_length);
    const double q_blocks = std::ceil(query_length / block_q);
    const double kv_blocks = std::ceil(key_length / block_kv);
    if (op.attrs.mask == AttentionMask::kNone) {
      computed_fraction = 1.0;
    } else {
      const bool windowed = op.attrs.mask == AttentionMask::kSlidingWindow ||
                            op.attrs.mask == AttentionMask::kChunked;
      const double window =
          windowed && op.attrs.window > 0 ? static_cast<double>(op.attrs.window) : key_length;
      // Queries of this device (context-parallel shards hold a load-balanced share of rows).
      double blocks = 0;
      for (double q_block = 0; q_block < q_blocks; ++q_block) {
        const double row_end = (q_block + 1) * block_q * key_length / query_length;
        const double first_row = q_block * block_q * key_length / query_length;
        // A sliding window reaches `window` keys back; a chunk starts at a multiple of its size.
        const double row_start = op.attrs.mask == AttentionMask::kChunked
                                     ? std::floor(first_row / window) * window
                                     : std::max(0.0, first_row - window);
        blocks +=
            std::min(kv_blocks, std::ceil(row_end / block_kv)) - std::floor(row_start / block_kv);
      }
      computed_fraction = blocks / (q_blocks * kv_blocks);
      if (query_length < key_length) {
        // A context shard's queries are spread over the sequence (load balancing): the share of
        // the whole causal matrix, not of its first rows.
        computed_fraction =
            std::max(computed_fraction,
                     attention_mask_fraction(op.attrs.mask, static_cast<int64_t>(key_length),
                                             op.attrs.window));
      }
    }
    hbm_bytes = q_bytes + out_bytes + q_blocks * kv_bytes;
  } else {
    const double scores = batch * heads * query_length * key_length;
    hbm_bytes = q_bytes + kv_bytes + out_bytes + kDotProductScorePasses * scores * 2;
  }
  const double scores = batch * heads * query_length * key_length * computed_fraction;
  OpCost cost;
  cost.matmul_flops = 2.0 * scores * (qk_dim + v_dim);
  // Q.K^T contracts head_dim (pads to the array); P.V outputs head_dim columns (pads too).
  const double qk_efficiency = qk_dim / roundup(qk_dim, chip.mxu_dim);
  const double pv_efficiency = v_dim / roundup(v_dim, chip.mxu_dim);
  double mxu_seconds = 2.0 * scores * qk_dim / qk_efficiency + 2.0 * scores * v_dim / pv_efficiency;
  if (backward) {
    cost.matmul_flops *= kFlashBackwardMatmulRatio;
    mxu_seconds *= kFlashBackwardMatmulRatio;
    hbm_bytes *= 2;  // reads dO and O, writes dQ, dK, dV
  }
  // Attention kernels (splash, dot_product) run in bf16 whatever the quantization of the layers.
  cost.mxu_seconds =
      mxu_seconds /
      (peak_flops_per_device(context, !context.mechanisms.enabled(Mechanism::kBf16Attention)) *
       chip.mxu_achievable_fraction);
  cost.hbm_seconds = hbm_bytes / hbm_bytes_per_second(chip);
  cost.vpu_seconds =
      scores * kSoftmaxFlopsPerScore * (backward ? 2.0 : 1.0) / vpu_flops_per_second(chip);
  if (context.flash_attention) {
    // Within a block the softmax needs Q.K^T's result and P.V needs the softmax's: on one
    // compute sub-block the kernel runs them one after the other, so MXU and VPU time add (HBM
    // streaming overlaps both). With several sub-blocks per key/value block, the VLIW core
    // issues the next sub-block's matmuls beside this one's softmax: a software pipeline whose
    // time is the longer stage plus one sub-block of the shorter.
    OpCost result = finish(cost, context);
    const int64_t kv_block = backward ? local_or(context.local_block_kv_dkv, context.block_kv_dkv)
                                      : local_or(context.local_block_kv, context.block_kv);
    const int64_t kv_compute_block =
        backward ? local_or(context.local_block_kv_dkv_compute, context.block_kv_dkv_compute)
                 : local_or(context.local_block_kv_compute, context.block_kv_compute);
    const int64_t kv_compute_chunks = kv_block / std::max<int64_t>(1, kv_compute_block);
    const double chunks = context.mechanisms.enabled(Mechanism::kAttentionSubblockPipelining)
                              ? static_cast<double>(std::max<int64_t>(1, kv_compute_chunks))
                              : 1.0;
    const double serial = std::max(result.mxu_seconds, result.vpu_seconds) +
                          std::min(result.mxu_seconds, result.vpu_seconds) / chunks;
    if (serial > result.seconds - chip.op_overhead_us * kMicro) {
      result.seconds = serial + chip.op_overhead_us * kMicro;
      result.bound = CostCategory::kMxu;
    }
    return result;
  }
  return finish(cost, context);
}

// DeepSeek-V4's attention with compressed blocks (attrs.compress_ratio > 0): one kernel doing
// the work of its window part and its blocks part (model/ir/op_flops.h), each costed as the
// attention op it is; the kernel launches once, so one op overhead is taken off their sum.
OpCost compressed_attention_cost(const Graph& graph, const Op& op, const CostContext& context,
                                 bool backward) {
  const CompressedAttentionParts parts = compressed_attention_parts(op);
  const OpCost window = attention_cost(graph, parts.window, context, backward);
  const OpCost blocks = attention_cost(graph, parts.blocks, context, backward);
  OpCost cost;
  cost.seconds = window.seconds + blocks.seconds - context.chip->op_overhead_us * kMicro;
  cost.mxu_seconds = window.mxu_seconds + blocks.mxu_seconds;
  cost.hbm_seconds = window.hbm_seconds + blocks.hbm_seconds;
  cost.vpu_seconds = window.vpu_seconds + blocks.vpu_seconds;
  cost.matmul_flops = window.matmul_flops + blocks.matmul_flops;
  cost.bound = window.seconds >= blocks.seconds ? window.bound : blocks.bound;
  return cost;
}

// MaxText's dense MoE path (sparse_matmul=false) dispatches and combines tokens with one-hot
// einsums per sequence: [batch, length, embed] x mask[batch, length, experts, capacity] ->
// [experts, batch x capacity, embed], i.e. 2 x (grouped elements) x length FLOPs on the MXU.
OpCost dense_moe_exchange_cost(const Graph& graph, const Op& op, const CostContext& context) {
  const bool dispatch = op.kind == OpKind::kMoeDispatch;
  const Tensor& tokens = graph.tensor(dispatch ? op.inputs[0] : op.outputs[0]);
  const Tensor& grouped = graph.tensor(dispatch ? op.outputs[0] : op.inputs[0]);
  const auto length = static_cast<double>(dim_or_one(tokens, "length"));
  const ChipSpec& chip = *context.chip;
  OpCost cost;
  cost.matmul_flops = 2.0 * static_cast<double>(grouped.num_elements()) * length;
  // Quantized, they are AQT/fp8 einsums at the narrow rate (narrow_dense_moe_exchange; their
  // quantize passes: dense_moe_exchange_quantize_seconds).
  const bool narrow = context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] &&
                      context.mechanisms.enabled(Mechanism::kNarrowDenseMoeExchange);
  cost.mxu_seconds =
      cost.matmul_flops / (peak_flops_per_device(context, narrow) * chip.mxu_achievable_fraction);
  cost.hbm_seconds =
      static_cast<double>(tokens.bytes() + grouped.bytes()) / hbm_bytes_per_second(chip);
  return finish(cost, context);
}

}  // namespace

double hbm_bytes_per_second(const ChipSpec& chip) {
  return chip.hbm_bandwidth_gbps * kGiga * chip.hbm_achievable_fraction / chip.devices_per_chip;
}

double vpu_flops_per_second(const ChipSpec& chip) {
  return chip.vpu_tflops_per_chip * kTera / chip.devices_per_chip;
}

double peak_flops_per_device(const CostContext& context, bool narrow) {
  const ChipSpec& chip = *context.chip;
  double tflops = chip.peak_bf16_tflops;
  if (narrow && context.int8_matmuls && chip.peak_int8_tops > 0) {
    tflops = chip.peak_int8_tops;
  } else if (narrow && context.fp8_matmuls && chip.peak_fp8_tflops > 0) {
    tflops = chip.peak_fp8_tflops;
  }
  return tflops * kTera / chip.devices_per_chip;
}

const char* cost_category_name(CostCategory category) {
  switch (category) {
    case CostCategory::kMxu:
      return "mxu";
    case CostCategory::kHbm:
      return "hbm";
    case CostCategory::kVpu:
      return "vpu";
    case CostCategory::kOverhead:
      return "overhead";
  }
  return "?";
}

double mxu_padding_efficiency(const ChipSpec& chip, double m, double k, double n) {
  if (m <= 0 || k <= 0 || n <= 0) {
    return 1.0;
  }
  return (m / roundup(m, kMxuRowTile)) * (k / roundup(k, chip.mxu_dim)) *
         (n / roundup(n, chip.mxu_dim));
}

double blocked_matmul_hbm_bytes(const ChipSpec& chip, double m, double k, double n,
                                double lhs_element_bytes, double rhs_element_bytes,
                                double out_element_bytes) {
  const double lhs = m * k * lhs_element_bytes;
  const double rhs = k * n * rhs_element_bytes;
  const double out = m * n * out_element_bytes;
  const double budget = chip.vmem_mib_per_tensorcore * kMebi * kVmemFractionForBlocks;
  if (lhs + rhs + out <= budget) {
    return lhs + rhs + out;
  }
  // Output blocks of b x b accumulate in f32 over contraction chunks of kContractionBlock; both
  // operand blocks are double-buffered: 2 x b.bk.(lhs + rhs bytes) + 4.b^2 <= budget.
  const double chunk = std::min(k, kContractionBlock);
  const double linear = 2.0 * chunk * (lhs_element_bytes + rhs_element_bytes);
  double block = (-linear + std::sqrt(linear * linear + 4.0 * kAccumulatorBytes * budget)) /
                 (2.0 * kAccumulatorBytes);
  block = std::max(block, static_cast<double>(chip.mxu_dim));
  const double lhs_reads = std::max(1.0, std::ceil(n / block));
  const double rhs_reads = std::max(1.0, std::ceil(m / block));
  // Keep the smaller operand resident where it fits (weights of a small layer, short sequences).
  if (rhs <= budget / 2 || lhs <= budget / 2) {
    return lhs + rhs + out;
  }
  return lhs * lhs_reads + rhs * rhs_reads + out;
}

bool same_outside_attention(const CostContext& a, const CostContext& b) {
  CostContext masked = b;
  masked.flash_attention = a.flash_attention;
  masked.block_q = a.block_q;
  masked.block_kv = a.block_kv;
  masked.block_kv_compute = a.block_kv_compute;
  masked.block_kv_dkv = a.block_kv_dkv;
  masked.block_kv_dkv_compute = a.block_kv_dkv_compute;
  masked.local_block_q = a.local_block_q;
  masked.local_block_kv = a.local_block_kv;
  masked.local_block_kv_compute = a.local_block_kv_compute;
  masked.local_block_kv_dkv = a.local_block_kv_dkv;
  masked.local_block_kv_dkv_compute = a.local_block_kv_dkv_compute;
  return masked == a;
}

void tensors_cost_reads(const Graph& graph, const Op& op, std::vector<TensorId>& tensors) {
  tensors.insert(tensors.end(), op.inputs.begin(), op.inputs.end());
  tensors.insert(tensors.end(), op.outputs.begin(), op.outputs.end());
  for (const TensorId input : op.inputs) {
    walk_weight_scale_chain(graph, input, [&](TensorId value) { tensors.push_back(value); });
  }
}

OpCost cost_compute_op(const Graph& graph, const Op& op, const CostContext& context, bool fused) {
  const ChipSpec& chip = *context.chip;
  switch (op.kind) {
    case OpKind::kEinsum:
      return einsum_cost(graph, op, context);
    case OpKind::kAttention:
    case OpKind::kAttentionGrad: {
      const bool backward = op.kind == OpKind::kAttentionGrad;
      return op.attrs.compress_ratio > 0 ? compressed_attention_cost(graph, op, context, backward)
                                         : attention_cost(graph, op, context, backward);
    }
    case OpKind::kMoeDispatch:
    case OpKind::kMoeCombine:
      if (op.attrs.capacity_factor > 0) {
        OpCost cost = dense_moe_exchange_cost(graph, op, context);
        const double quantize_seconds = dense_moe_exchange_quantize_seconds(graph, op, context);
        cost.seconds += quantize_seconds;
        cost.hbm_seconds += quantize_seconds;
        return cost;
      }
      break;
    // Costed below by their vector FLOPs and the bytes they read and write.
    case OpKind::kElementwise:
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kRope:
    case OpKind::kEmbeddingLookup:
    case OpKind::kCrossEntropy:
    case OpKind::kMoeRouter:
    case OpKind::kNormGrad:
    case OpKind::kEmbeddingGrad:
    case OpKind::kCrossEntropyGrad:
    case OpKind::kRouterGrad:
    case OpKind::kBlockPool:
    case OpKind::kBlockPoolGrad:
    case OpKind::kBlockTopK:
    case OpKind::kReduceSum:
    case OpKind::kNormStatistics:
    case OpKind::kCrossEntropyStatistics:
    case OpKind::kDynamicSlice:
    case OpKind::kAdamUpdate:
    case OpKind::kSinkhorn:
    case OpKind::kSinkhornGrad:
    // Timed elsewhere (collective_time(), the host link); here their bytes, if asked.
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
    case OpKind::kAllToAll:
    case OpKind::kCollectivePermute:
    case OpKind::kHostOffload:
    case OpKind::kHostLoad:
      break;
  }
  OpCost cost;
  const OpFlops flops = op_flops(graph, op);
  cost.vpu_seconds = flops.vector / vpu_flops_per_second(chip);
  if (fused) {
    // Runs inside its producer's kernel: VPU work only, no HBM traffic, no launch.
    cost.vpu_seconds /= context.program_efficiency;
    cost.seconds = cost.vpu_seconds;
    cost.bound = CostCategory::kVpu;
    return cost;
  }
  // The gradient of a clipped SwiGLU's up projection, kMul(dy, a, b) with activation_limit
  // (model/ir/op.h), reads b for its mask only: its sibling dy clip(b) reads b in the same XLA
  // fusion of the SwiGLU's backward, where b is charged once.
  const size_t charged_inputs =
      op.kind == OpKind::kElementwise && op.attrs.activation_limit > 0 && op.inputs.size() == 3
          ? 2
          : op.inputs.size();
  double bytes = 0;
  for (size_t input = 0; input < charged_inputs; ++input) {
    bytes += static_cast<double>(graph.tensor(op.inputs[input]).bytes());
  }
  for (const TensorId output : op.outputs) {
    bytes += static_cast<double>(graph.tensor(output).bytes());
  }
  if (op.kind == OpKind::kEmbeddingLookup && !op.attrs.one_hot_embedding) {
    // A gather reads the rows it needs, not the table (the one-hot matmul streams all of it).
    bytes = 2.0 * static_cast<double>(graph.tensor(op.outputs[0]).bytes());
  }
  cost.hbm_seconds = bytes / hbm_bytes_per_second(chip);
  if ((op.kind == OpKind::kMoeDispatch || op.kind == OpKind::kMoeCombine) &&
      context.mechanisms.enabled(Mechanism::kRoutedRowGathers)) {
    // The routed rows (the dispatch's output, the combine's input: one row per token and
    // expert it is sent to) are gathered or scattered row by row, at a fraction of the roofline.
    const double routed = static_cast<double>(
        (op.kind == OpKind::kMoeDispatch ? graph.tensor(op.outputs[0]) : graph.tensor(op.inputs[0]))
            .bytes());
    // Without MaxText's custom sort VJP the backward of each routing gather is JAX's transpose
    // of a gather, a scatter-add into the rows it read (XLA cannot know the indices are a
    // permutation), kRoutingScatterSlowdown times as long as the gather.
    // (A rematerialized forward dispatch or combine in the backward pass writes an activation,
    // not a gradient, and stays a gather.)
    const bool scatter = !context.custom_sort_vjp &&
                         graph.tensor(op.outputs[0]).kind == TensorKind::kGradient &&
                         context.mechanisms.enabled(Mechanism::kRoutingScatterGradients);
    const double slowdown = scatter ? kRoutingScatterSlowdown : 1.0;
    cost.hbm_seconds +=
        routed / hbm_bytes_per_second(chip) * (slowdown / chip.routed_row_hbm_fraction - 1.0);
  }
  if (flops.matmul > 0) {
    // use_iota_embed's one-hot matmuls, in the activation dtype (bf16) on the MXU.
    cost.matmul_flops = flops.matmul;
    cost.mxu_seconds =
        flops.matmul / (peak_flops_per_device(context, false) * chip.mxu_achievable_fraction);
  }
  return finish(cost, context);
}

}  // namespace tpusim
