// hw/chip_spec.h: one TPU generation's numbers, loaded from configs/hw/<name>.yml.
//
// Every number in the catalog carries its provenance: a `source:` citing
// docs/reference/hardware.md (or a derivation from cited numbers) or an `assumption:` saying
// why the value was chosen. The loader rejects a number without one. Calibrated efficiency and
// latency parameters live here too, never in code.
//
// Example (configs/hw/v5p.yml):
//   specs:
//     hbm_bandwidth_gbps: {value: 2765, source: "[GC5p] 2765 GB/s"}
//   -> ChipSpec::hbm_bandwidth_gbps == 2765,
//      provenance["hbm_bandwidth_gbps"].text == "[GC5p] 2765 GB/s" (is_assumption false)
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "hw/attention_kernel_table.h"

namespace tpusim {

// How a slice name's number counts: v4-128/v5p-128/tpu7x-128 count TensorCores, v5e-256/v6e-256
// count chips (docs/reference/maxtext.md §0).
enum class SliceNameUnit { kTensorCores, kChips };

// Which physical shapes a generation's slices take.
enum class ShapeRule {
  kCube,      // 3D: listed small shapes, then A x B x C with every dim a multiple of 4
  kPlane,     // 2D: only the listed shapes
  kSwitched,  // a GPU node: the one listed shape of GPUs behind a switch (NVSwitch), named by
              // its node name alone ("a3"); nodes over the DCN fabric are the "slices"
};

// Which torus axes have wraparound links.
enum class WraparoundRule {
  kFullCube,  // all axes wrap iff every dim is a multiple of 4 (v4, v5p, v7x)
  kAxis16,    // an axis wraps iff its size is 16 (v5e, v6e)
  kAll,       // every axis of size > 2 wraps (v3 pods)
  kNone,      // no torus (a switched GPU node)
};

struct SliceRules {
  std::vector<std::string> name_prefixes;  // "v5p"; v7x: "tpu7x", "v7x"; v5e: "v5e", "v5litepod"
  SliceNameUnit name_counts = SliceNameUnit::kChips;
  ShapeRule shape_rule = ShapeRule::kPlane;
  std::vector<std::vector<int>> small_shapes;  // cube: shapes below 4x4x4; plane: every legal shape
  WraparoundRule wraparound = WraparoundRule::kAxis16;
  // A GPU node's fabric between nodes, in words ("RoCE (GPUDirect RDMA), one 400 Gb/s ConnectX-7
  // NIC per GPU"); empty on TPUs, whose slices meet over DCN.
  std::string fabric;
};

// Where a catalog number came from.
struct Provenance {
  std::string text;  // the source citation or the assumption note
  bool is_assumption = false;
};

struct ChipSpec {
  std::string name;          // catalog key, e.g. "v5p"
  std::string display_name;  // "TPU v5p"
  SliceRules slice;

  // Compute (per chip unless the name says otherwise).
  double peak_bf16_tflops = 0;
  double peak_int8_tops = 0;
  double peak_fp8_tflops = 0;
  double mfu_peak_bf16_tflops_per_device = 0;  // the peak MaxText's MFU divides by
  double tensorcores_per_chip = 0;
  double devices_per_chip = 0;  // 2 on v3 and v7x (one per TensorCore); 1 with megacore
  double mxus_per_tensorcore = 0;
  double mxu_dim = 0;  // 128 or 256
  double clock_ghz = 0;
  double vmem_mib_per_tensorcore = 0;
  double cmem_mib_per_chip = 0;
  double vpu_tflops_per_chip = 0;
  double vmem_bandwidth_tbps_per_tensorcore = 0;
  double mxu_achievable_fraction = 0;
  double mxu_fill_drain_cycles = 0;
  double op_overhead_us = 0;
  // 1 where the compiler fuses an elementwise consumer into the matmul's kernel (XLA:TPU's
  // output fusion), 0 where a matmul is a library call whose result goes to HBM first (cuBLAS).
  double matmul_output_fusion = 1;
  double program_efficiency = 0;    // in-program fraction of the isolated-kernel roofline
  double dispatch_overhead_us = 0;  // launching one jitted op from the host (standalone ops only)

  // Memory.
  double hbm_capacity_gib = 0;
  double hbm_usable_gib = 0;  // what a program may allocate, PER DEVICE (half a v7x chip)
  double hbm_bandwidth_gbps = 0;
  double hbm_achievable_fraction = 0;

  // Interconnect.
  double ici_links_per_chip = 0;
  double ici_link_bandwidth_uni_gbps = 0;  // nominal, one direction, one link
  double ici_achievable_fraction = 0;
  double ici_hop_latency_us = 0;
  double collective_launch_us = 0;
  // Share of the compute units a running collective holds (a GPU's NCCL kernels occupy SMs);
  // compute that overlaps it runs on the rest. 0 where collectives use their own engines.
  double collective_compute_share = 0;
  double d2d_bandwidth_uni_gbps = 0;  // chiplet-to-chiplet inside a chip (v7x only)
  double d2d_latency_us = 0;
  double chips_per_host = 0;
  double pcie_bandwidth_gbps = 0;
  double host_memory_gib = 0;
  double dcn_bandwidth_per_chip_gbps = 0;
  double dcn_achievable_fraction = 0;
  double dcn_latency_us = 0;
  double sparsecores_per_chip = 0;
  double sparsecore_collective_offload_default = 0;  // 1 = XLA offloads AG/RS/AR by default
  // An offloaded reduce-scatter takes this many times its ICI roofline (the SparseCores reduce the
  // incoming shards); all-reduces pay it on their reduce-scatter half.
  double sparsecore_reduce_scatter_time_factor = 1;
  // Where collectives kept off the SparseCores run as continuation fusion (v7x with the offload
  // off): the share of an XLA fusion's time the TensorCore adds for the collective steps it
  // carries (Pallas kernels carry none). 0 where no such path is modelled.
  double continuation_fusion_tensorcore_share = 0;
  // The fraction of the HBM roofline at which a dropless MoE's row gathers and scatters (dispatch,
  // combine and their gradients) move the routed rows: XLA gathers ragged rows, not streams.
  double routed_row_hbm_fraction = 1;
  // The fixed cost of one step of tokamax's gmm_v2 pipeline grid (its emit_pipeline: the scalar
  // core's index maps and the dynamic-size row DMAs of each step), microseconds; 0 where gmm_v2
  // does not run or nothing measures it.
  double gmm_v2_grid_step_us = 0;

  // System.
  double max_slice_chips = 0;
  double pod_bisection_tbps = 0;  // published pod figure, 0 where none is published
  double power_watts = 0;

  std::map<std::string, Provenance> provenance;  // spec key -> where its value came from

  // GPU entries: the measured fused-attention kernel rates (empty on TPUs).
  AttentionKernelTable attention_kernel;

  // A GPU node (NVLink domain behind a switch) rather than a TPU torus slice.
  bool is_gpu() const { return slice.shape_rule == ShapeRule::kSwitched; }

  // Whole-device numbers the engines use.
  double hbm_capacity_bytes_per_device() const;
  double hbm_usable_bytes_per_device() const;
  double peak_bf16_flops_per_device() const;
  // Peak FLOP/s per chip for a MaxText quantization setting ("" bf16, "int8", "fp8...").
  double peak_flops_for_quantization(const std::string& quantization) const;
};

// Every spec key a catalog file must define, in catalog order.
const std::vector<std::string>& chip_spec_keys();

// The value of spec `key` ("hbm_bandwidth_gbps"); std::out_of_range when no such key.
double spec_value(const ChipSpec& chip, std::string_view key);

// Parses one catalog file; `origin` names it in errors (UserError naming the key).
ChipSpec parse_chip_spec(const YAML::Node& root, std::string_view origin);

// "2x2x1" -> {2, 2, 1}; UserError when malformed.
std::vector<int> parse_shape_text(std::string_view text, std::string_view what);

// {4, 4, 8} -> "4x4x8".
std::string shape_to_text(const std::vector<int>& dims);

}  // namespace tpusim
