// `tpusim op KIND [key=value ...] [--json]`: times one op alone, like a microbenchmark.
//   tpusim op matmul m=8192 n=8192 k=8192 compile_topology=v5e-1 [dtype=bfloat16]
//   tpusim op all_gather bytes=33554432 axes=fsdp compile_topology=v5e-32 ici_fsdp_parallelism=4
//             ici_data_parallelism=-1
//   tpusim op matmul m=65536 k=3072 n=2048 groups=128 wi_tile_fwd_batch_seq=256
//             compile_topology=tpu7x-2
// KIND is matmul, all_gather, reduce_scatter, all_reduce or all_to_all. Op keys (m, n, k, groups,
// bytes, axes) are read first; groups=G makes the matmul a dropless MoE grouped matmul (tokamax's
// gmm_v2, the kernel the published grouped-matmul benchmarks time: G experts of m / G rows, tiled
// by the config's wi_tile_fwd_* keys, a fixed cost per pipeline grid step); every other key=value
// is a MaxText config override (the slice, the mesh). A standalone op also pays the chip's
// dispatch_overhead_us, as a timed jitted call does.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/suggest.h"
#include "hw/matmul_format.h"
#include "model/config.h"
#include "model/ir/graph.h"
#include "sharding/step_program.h"
#include "sim/cli/command_args.h"
#include "sim/cli/commands.h"
#include "sim/cli/op_timing.h"
#include "sim/perf/collective_cost.h"
#include "sim/perf/op_cost.h"

namespace tpusim {
namespace {

const std::map<std::string, OpKind>& collective_kinds() {
  static const std::map<std::string, OpKind> kinds = {{"all_gather", OpKind::kAllGather},
                                                      {"reduce_scatter", OpKind::kReduceScatter},
                                                      {"all_reduce", OpKind::kAllReduce},
                                                      {"all_to_all", OpKind::kAllToAll}};
  return kinds;
}

int64_t positive_integer(const std::string& key, const std::string& text) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size() && value > 0 && value <= (int64_t{1} << 40)) {
      return value;
    }
  } catch (const std::exception&) {
  }
  throw UserError(key + ": '" + text + "' must be a positive integer (at most 2^40)");
}

// The operands' dtype, the matmul quantization, and the forward megablox tiles
// (wi_tile_fwd_*) a lone matmul is timed with.
struct MatmulSettings {
  std::string dtype;
  std::string quantization;
  GroupedMatmulTiles tiles;
};

MatmulSettings matmul_settings_from_config(const Config& config) {
  return {config.get_string("dtype"),
          config.get_string("quantization"),
          {config.get_int("wi_tile_fwd_batch_seq"), config.get_int("wi_tile_fwd_embed_dim"),
           config.get_int("wi_tile_fwd_mlp_dim")}};
}

// A lone matmul's sizes: m x k @ k x n, as `groups` experts of m / groups rows each when a
// grouped (megablox) matmul.
struct MatmulSize {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t groups = 0;  // 0: a plain matmul
};

MatmulSize matmul_size_from_keys(const std::map<std::string, std::string>& op_keys) {
  for (const char* key : {"m", "n", "k"}) {
    if (!op_keys.contains(key)) {
      throw UserError(std::string("op matmul: missing ") + key + "=...");
    }
  }
  MatmulSize size{positive_integer("m", op_keys.at("m")), positive_integer("n", op_keys.at("n")),
                  positive_integer("k", op_keys.at("k"))};
  if (op_keys.contains("groups")) {
    size.groups = positive_integer("groups", op_keys.at("groups"));
    if (size.groups > size.m) {
      throw UserError("groups: '" + op_keys.at("groups") +
                      "' is more than m=" + std::to_string(size.m) + " (every group needs a row)");
    }
  }
  return size;
}

// The einsum of a plain matmul (dims m, k, n), or the forward grouped matmul of dropless MoE:
// lhs[experts, expert_tokens, embed] x rhs[experts, embed, mlp], the m rows split evenly over the
// groups (balanced routing), timed as megablox runs it with the config's wi_tile_fwd_* tiles.
int add_matmul_op(Graph& graph, const MatmulSize& size, DType dtype) {
  const int region = graph.add_region("op", 1, Phase::kForward);
  OpAttrs attrs;
  auto add = [&](const char* name, std::vector<Dim> dims, TensorKind kind) {
    return graph.add_tensor(name, std::move(dims), dtype, kind, region);
  };
  if (size.groups == 0) {
    attrs.contracted = {"k"};
    const TensorId lhs =
        add("lhs", {Dim{"m", size.m, ""}, Dim{"k", size.k, ""}}, TensorKind::kActivation);
    const TensorId rhs =
        add("rhs", {Dim{"k", size.k, ""}, Dim{"n", size.n, ""}}, TensorKind::kActivation);
    const TensorId out =
        add("out", {Dim{"m", size.m, ""}, Dim{"n", size.n, ""}}, TensorKind::kActivation);
    return graph.add_op(OpKind::kEinsum, "matmul", {lhs, rhs}, {out}, attrs, region);
  }
  const int64_t rows = (size.m + size.groups - 1) / size.groups;
  attrs.contracted = {"embed"};
  attrs.routed_fraction = static_cast<double>(size.m) / static_cast<double>(rows * size.groups);
  const Dim experts{"experts", size.groups, ""};
  const TensorId lhs =
      add("lhs", {experts, Dim{"expert_tokens", rows, ""}, Dim{"embed", size.k, ""}},
          TensorKind::kActivation);
  const TensorId rhs = add("rhs", {experts, Dim{"embed", size.k, ""}, Dim{"mlp", size.n, ""}},
                           TensorKind::kParameter);
  const TensorId out = add("out", {experts, Dim{"expert_tokens", rows, ""}, Dim{"mlp", size.n, ""}},
                           TensorKind::kActivation);
  return graph.add_op(OpKind::kEinsum, "moe/experts/wi", {lhs, rhs}, {out}, attrs, region);
}

nlohmann::json matmul_json(const ChipSpec& chip, const std::string& quantization,
                           const MatmulSize& size, const OpCost& cost) {
  const double seconds = cost.seconds + chip.dispatch_overhead_us * 1e-6;
  const double flops =
      2.0 * static_cast<double>(size.m) * static_cast<double>(size.n) * static_cast<double>(size.k);
  const double peak = chip.peak_flops_for_quantization(quantization) / chip.devices_per_chip;
  nlohmann::json json = {{"op", "matmul"},
                         {"chip", chip.name},
                         {"m", size.m},
                         {"n", size.n},
                         {"k", size.k},
                         {"seconds", seconds},
                         {"kernel_seconds", cost.seconds},
                         {"dispatch_seconds", chip.dispatch_overhead_us * 1e-6},
                         {"tflops", flops / seconds / 1e12},
                         {"percent_of_peak", 100.0 * flops / seconds / peak},
                         {"bound", cost_category_name(cost.bound)},
                         {"mxu_seconds", cost.mxu_seconds},
                         {"hbm_seconds", cost.hbm_seconds}};
  if (size.groups > 0) {
    json["groups"] = size.groups;
  }
  return json;
}

nlohmann::json time_matmul(const std::map<std::string, std::string>& op_keys, const Config& config,
                           const MechanismSet& mechanisms) {
  const MatmulSettings settings = matmul_settings_from_config(config);
  const std::string& quantization = settings.quantization;
  const MatmulSize size = matmul_size_from_keys(op_keys);
  const Slice slice = slice_from_config(config);
  const ChipSpec& chip = *slice.chip;
  Graph graph;
  const int id = add_matmul_op(graph, size, parse_dtype(settings.dtype, "dtype"));
  CostContext context;
  context.chip = &chip;
  context.mechanisms = mechanisms;
  context.int8_matmuls = matmul_format(quantization) == MatmulFormat::kInt8;
  context.fp8_matmuls = matmul_format(quantization) == MatmulFormat::kFp8;
  // A lone matmul is a forward pass; with a bf16 dtype its operands pay the quantize pass.
  context.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] =
      context.int8_matmuls || context.fp8_matmuls;
  if (size.groups > 0) {
    context.megablox = true;
    context.balanced_groups = true;
    context.gmm_v2 = true;  // the kernel the published grouped-matmul benchmarks time
    context.megablox_tiles[0][static_cast<size_t>(MatmulPass::kForward)] = settings.tiles;
  }
  const OpCost cost = cost_compute_op(graph, graph.ops()[static_cast<size_t>(id)], context, false);
  return matmul_json(chip, quantization, size, cost);
}

nlohmann::json time_collective(const std::string& kind,
                               const std::map<std::string, std::string>& op_keys,
                               const Config& config, const MechanismSet& mechanisms) {
  if (!op_keys.contains("bytes") || !op_keys.contains("axes")) {
    throw UserError("op " + kind +
                    ": needs bytes=N (the per-device array V) and axes=a[,b] (mesh axes)");
  }
  const int64_t bytes = positive_integer("bytes", op_keys.at("bytes"));
  std::vector<std::string> axes;
  std::string text = op_keys.at("axes");
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string axis = text.substr(start, comma - start);
    mesh_axis_index(axis);  // UserError with a suggestion when unknown
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) {
      throw UserError(
          "axes=" + text + ": '" + axis + "' is named twice (a group spans each axis once)",
          "axes");
    }
    axes.push_back(axis);
    start = comma + 1;
  }
  const Slice slice = slice_from_config(config);
  const DeviceMesh mesh = place_mesh(resolve_mesh(config, slice), slice);
  const int64_t group = mesh.shape.product_of(mesh_axis_bits(axes));
  if (group < 2) {
    throw UserError("axes=" + text +
                    " spans a single device on this mesh (set its ici_*/dcn_* "
                    "parallelism above 1)");
  }
  const CollectiveTime time = collective_time(
      collective_kinds().at(kind), static_cast<double>(bytes), axes, mesh, slice, mechanisms);
  nlohmann::json placement = nlohmann::json::object();
  for (const std::string& axis : axes) {
    placement[axis] = mesh.axis(axis).describe(slice);
  }
  return {{"op", kind},
          {"chip", slice.chip->name},
          {"bytes", bytes},
          {"group_size", group},
          {"placement", placement},
          {"seconds", time.seconds},
          {"ici_seconds", time.ici_seconds},
          {"dcn_seconds", time.dcn_seconds},
          {"link", link_kind_name(time.link)}};
}

}  // namespace

nlohmann::json time_op(const std::string& kind, const std::vector<std::string>& args,
                       const MechanismSet& mechanisms, bool quiet) {
  std::vector<std::string> kinds = {"matmul"};
  for (const auto& [name, value] : collective_kinds()) {
    kinds.push_back(name);
  }
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    throw UserError("op: unknown kind '" + kind + "'" + did_you_mean(kind, kinds));
  }
  static const std::vector<std::string> kMatmulKeys = {"m", "n", "k", "groups"};
  static const std::vector<std::string> kCollectiveKeys = {"bytes", "axes"};
  const std::vector<std::string>& own_keys = kind == "matmul" ? kMatmulKeys : kCollectiveKeys;
  const std::vector<std::string>& other_keys = kind == "matmul" ? kCollectiveKeys : kMatmulKeys;
  std::map<std::string, std::string> op_keys;
  std::vector<std::string> overrides;
  for (const std::string& arg : args) {
    const auto [key, value] = split_override(arg);
    if (std::find(own_keys.begin(), own_keys.end(), key) != own_keys.end()) {
      if (!op_keys.emplace(key, value).second) {  // as a config key given twice
        throw UserError("'" + key + "' is given twice on the command line", key);
      }
    } else if (std::find(other_keys.begin(), other_keys.end(), key) != other_keys.end()) {
      throw UserError("op " + kind + ": " + key + "= is a key of " +
                          (kind == "matmul" ? "a collective" : "a matmul") +
                          ", not read here (matmul: m, n, k, groups; collectives: bytes, axes)",
                      key);
    } else {
      overrides.push_back(arg);
    }
  }
  const Config config = quiet ? load_recipe_config(overrides, "") : load_command_config(overrides);
  return kind == "matmul" ? time_matmul(op_keys, config, mechanisms)
                          : time_collective(kind, op_keys, config, mechanisms);
}

void register_op_command(CLI::App& app) {
  auto kind = std::make_shared<std::string>();
  auto args = std::make_shared<std::vector<std::string>>();
  auto json_output = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("op", "Time one op alone (matmul or a collective)");
  command->add_option("kind", *kind, "matmul, all_gather, reduce_scatter, all_reduce, all_to_all")
      ->required();
  command->add_option("args", *args, "op keys (m n k [groups] | bytes axes) and config key=value");
  command->add_flag("--json", *json_output, "Print JSON");
  command->callback([kind, args, json_output] {
    const nlohmann::json json = time_op(*kind, *args, MechanismSet());
    if (*json_output) {
      std::cout << json.dump(2) << "\n";
      return;
    }
    std::cout << std::fixed << std::setprecision(1);
    if (*kind == "matmul") {
      std::cout << "matmul " << json["m"] << "x" << json["k"] << " @ " << json["k"] << "x"
                << json["n"]
                << (json.contains("groups") ? " in " + json["groups"].dump() + " groups" : "")
                << " on " << json["chip"].get<std::string>() << ": "
                << json["seconds"].get<double>() * 1e6 << " us (" << json["tflops"].get<double>()
                << " TFLOP/s, " << json["percent_of_peak"].get<double>() << "% of peak, "
                << json["bound"].get<std::string>() << "-bound, incl. "
                << json["dispatch_seconds"].get<double>() * 1e6 << " us dispatch)\n";
    } else {
      std::cout << *kind << " of " << json["bytes"] << " bytes over " << json["group_size"]
                << " devices (" << json["link"].get<std::string>()
                << "): " << json["seconds"].get<double>() * 1e6 << " us\n";
      for (const auto& [axis, where] : json["placement"].items()) {
        std::cout << "  " << axis << ": " << where.get<std::string>() << "\n";
      }
    }
  });
}

}  // namespace tpusim
