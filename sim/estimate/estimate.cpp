#include "sim/estimate/estimate.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/flops_maxtext.h"
#include "sim/estimate/op_details.h"
#include "sim/estimate/trace_lanes.h"
#include "sim/estimate/whole_step.h"

namespace tpusim {
namespace {

constexpr double kTera = 1e12;

nlohmann::json memory_json(const MemoryEstimate& memory) {
  const MemoryBreakdown& peak = memory.at_peak;
  return {{"weights_bytes", peak.weights},
          {"optimizer_state_bytes", peak.optimizer_state},
          {"gradients_bytes", peak.gradients},
          {"saved_activations_bytes", peak.saved_activations},
          {"gathered_weights_bytes", peak.gathered_weights},
          {"temporaries_bytes", peak.temporaries},
          {"host_offloaded_bytes", memory.host_offloaded_bytes},
          {"peak_at", memory.peak_region}};
}

// What the estimate's summary reads from the config beyond the program.
struct SummarySettings {
  std::string model_name;
  int64_t max_target_length = 0;  // tokens per sequence
};

SummarySettings summary_settings_from_config(const Config& config) {
  return {config.get_string("model_name"), config.get_int("max_target_length")};
}

bool on_compute_lane(const StepTiming& timing, const TraceEvent& event) {
  const LaneKind kind = timing.lanes[static_cast<size_t>(event.lane)].kind;
  return kind == LaneKind::kTensorCore || kind == LaneKind::kGpuSms;
}

}  // namespace

Estimate estimate_config(const Config& config, const MechanismSet& mechanisms) {
  const SummarySettings summary = summary_settings_from_config(config);
  Estimate estimate;
  estimate.program = build_step_program(config, mechanisms);
  const StepProgram& built = estimate.program;
  const ChipSpec& chip = *built.slice.chip;
  estimate.flops = program_flops(built);
  estimate.memory = estimate_memory(built, mechanisms);
  PerfOptions perf = perf_options_from_config(config, chip);
  perf.cost.mechanisms = mechanisms;
  estimate.timing = simulate_step(built, perf);
  estimate.perf = perf;
  estimate.model_tflop_per_device_step = maxtext_training_flops_per_device(config).total_tflops();
  estimate.step_seconds = estimate.timing.step_seconds;
  const double step = estimate.step_seconds;
  estimate.tflops_per_device = estimate.model_tflop_per_device_step / step;
  estimate.tflops_per_chip = estimate.tflops_per_device * chip.devices_per_chip;
  estimate.mfu = estimate.tflops_per_device / chip.mfu_peak_bf16_tflops_per_device;
  estimate.hardware_utilization =
      estimate.timing.hardware_matmul_flops / step / chip.peak_bf16_flops_per_device();
  const double tokens =
      static_cast<double>(built.global_batch) * static_cast<double>(summary.max_target_length);
  estimate.tokens_per_s = tokens / step;
  estimate.tokens_per_s_per_chip = estimate.tokens_per_s / built.slice.total_chips();

  nlohmann::json& json = estimate.json;
  json["model_name"] = summary.model_name;
  json["slice"] = built.slice.name;
  json["num_slices"] = built.slice.num_slices;
  json["chip"] = chip.name;
  json["devices"] = built.slice.total_devices();
  json["chips"] = built.slice.total_chips();
  json["mesh"] = built.mesh.shape.describe();
  nlohmann::json placement = nlohmann::json::object();
  for (const MeshAxisPlacement& axis : built.mesh.axes) {
    if (axis.ici_size * axis.dcn_size > 1) {
      placement[mesh_axis_names()[static_cast<size_t>(axis.mesh_axis)]] =
          axis.describe(built.slice);
    }
  }
  json["mesh_placement"] = placement;
  json["global_batch_sequences"] = built.global_batch;
  if (const PipelineSchedule& pipeline = built.step->forward_info.pipeline; pipeline.active()) {
    json["pipeline"] = {
        {"stages", pipeline.stages},           {"layers_per_stage", pipeline.layers_per_stage},
        {"repeats", pipeline.repeats},         {"microbatches", pipeline.microbatches},
        {"iterations", pipeline.iterations()}, {"bubble_fraction", pipeline.bubble_fraction()},
        {"schedule", pipeline.describe()}};
  }
  json["tokens_per_step"] = tokens;
  json["step_time_s"] = step;
  json["mfu"] = estimate.mfu;
  json["mfu_peak_tflops_per_device"] = chip.mfu_peak_bf16_tflops_per_device;
  json["hardware_flop_utilization"] = estimate.hardware_utilization;
  // Its denominator: the catalog's bf16 peak, which MaxText's MFU peak may round (v7x: 1150
  // against 1153.5 TFLOP/s per device).
  json["hardware_peak_tflops_per_device"] = chip.peak_bf16_flops_per_device() / kTera;
  json["tflops_per_device"] = estimate.tflops_per_device;
  json["tflops_per_chip"] = estimate.tflops_per_chip;
  json["tokens_per_s"] = estimate.tokens_per_s;
  json["tokens_per_s_per_chip"] = estimate.tokens_per_s_per_chip;
  json["model_tflop_per_device_step"] = estimate.model_tflop_per_device_step;
  json["program_model_tflop_per_device_step"] = estimate.flops.model_matmul / kTera;
  json["hardware_tflop_per_device_step"] = estimate.flops.hardware_matmul / kTera;
  json["recompute_tflop_per_device_step"] = estimate.flops.recompute_matmul / kTera;
  json["uncounted_tflop_per_device_step"] = estimate.flops.uncounted_matmul / kTera;
  json["vector_tflop_per_device_step"] = estimate.flops.vector / kTera;
  // The numerator of hardware_flop_utilization: the matmul FLOPs as the timing runs them
  // (attention as its kernels run it: flash attention's backward recomputes the scores), which is
  // not hardware_tflop_per_device_step, the program's count.
  json["executed_tflop_per_device_step"] = estimate.timing.hardware_matmul_flops / kTera;
  json["breakdown"] = rendered_breakdown(estimate.timing.breakdown);
  json["microbatch_time_s"] = estimate.timing.microbatch_seconds;
  json["optimizer_time_s"] = estimate.timing.optimizer_seconds;
  json["memory"] = memory_json(estimate.memory);
  json["hbm_peak_bytes_per_device"] = estimate.memory.peak_bytes;
  json["hbm_capacity_bytes"] = estimate.memory.capacity_bytes;
  json["fits"] = estimate.memory.fits;
  nlohmann::json padding = nlohmann::json::array();
  for (const PaddingNote& note : built.program.padding) {
    padding.push_back({{"tensor", note.tensor},
                       {"dim", note.dim},
                       {"size", note.global_size},
                       {"shards", note.shards},
                       {"padded_to", note.padded_size}});
  }
  json["padding"] = padding;
  return estimate;
}

std::string chrome_trace(const Estimate& estimate) {
  const StepTiming& timing = estimate.timing;
  const Slice& slice = estimate.program.slice;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", 0},
                    {"args",
                     {{"name", "device 0: " + slice.chip->display_name + " in " + slice.name +
                                   " (mesh " + estimate.program.mesh.shape.describe() + ")"}}}});
  const std::vector<int> lanes = ordered_lanes(timing);
  const std::vector<int> lane_index = lane_rows(timing, lanes);
  for (size_t index = 0; index < lanes.size(); ++index) {
    events.push_back(
        {{"ph", "M"},
         {"name", "thread_name"},
         {"pid", 0},
         {"tid", static_cast<int>(index)},
         {"args", {{"name", lane_name(timing.lanes[static_cast<size_t>(lanes[index])])}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 0},
                      {"tid", static_cast<int>(index)},
                      {"args", {{"sort_index", static_cast<int>(index)}}}});
  }
  // Every layer iteration (sim/estimate/whole_step.h), each compute op with its FLOPs, bytes,
  // shapes, achieved rates and whether it is recomputed (sim/estimate/op_details.h).
  const std::vector<TraceEvent> whole_step = whole_step_trace(estimate);
  std::map<std::pair<std::string, std::string>, OpDetail> details;
  for (OpDetail& detail : op_details(estimate)) {
    details.emplace(std::make_pair(detail.region, detail.name), std::move(detail));
  }
  for (const TraceEvent& event : whole_step) {
    nlohmann::json args = {{"region", event.region}, {"detail", event.detail}};
    const auto found = details.find({event.region, event.name});
    if (found != details.end() && on_compute_lane(timing, event) &&
        found->second.flops + found->second.hbm_bytes > 0) {
      const OpDetail& detail = found->second;
      args["flops"] = detail.flops;
      args["hbm_bytes"] = detail.hbm_bytes;
      args["shapes"] = detail.shapes;
      args["recomputed"] = detail.recomputed;
      if (event.duration > 0) {
        args["achieved_tflop_per_s"] = detail.flops / event.duration / kTera;
        args["achieved_gb_per_s"] = detail.hbm_bytes / event.duration / 1e9;
      }
    }
    events.push_back({{"ph", "X"},
                      {"name", event.name},
                      {"cat", event.region},
                      {"pid", 0},
                      {"tid", lane_index[static_cast<size_t>(event.lane)]},
                      {"ts", event.start * 1e6},
                      {"dur", event.duration * 1e6},
                      {"args", args}});
  }
  // HBM in use as counters, at each memory checkpoint placed at its region in the trace: the end
  // of the region's last event, or of its first event for a "(first iteration)" checkpoint.
  constexpr double kGibibyte = 1024.0 * 1024.0 * 1024.0;
  for (const MemoryCheckpoint& point : estimate.memory.timeline) {
    const size_t paren = point.where.find(" (");
    const std::string region = point.where.substr(0, paren);
    const bool first = point.where.find("(first iteration)") != std::string::npos;
    double at = -1;
    for (const TraceEvent& event : whole_step) {
      if (event.region == region) {
        at = event.start + event.duration;
        if (first) {
          break;
        }
      }
    }
    if (at < 0) {
      continue;
    }
    const MemoryBreakdown& kinds = point.memory;
    events.push_back({{"ph", "C"},
                      {"name", "HBM GiB"},
                      {"pid", 0},
                      {"ts", at * 1e6},
                      {"args",
                       {{"weights", kinds.weights / kGibibyte},
                        {"optimizer state", kinds.optimizer_state / kGibibyte},
                        {"gradients", kinds.gradients / kGibibyte},
                        {"saved activations", kinds.saved_activations / kGibibyte},
                        {"gathered weights", kinds.gathered_weights / kGibibyte},
                        {"temporaries", kinds.temporaries / kGibibyte}}}});
  }
  // Flow arrows: a collective's end -> the op that waited for it (binding to the enclosing slices).
  int flow_id = 0;
  for (const TraceFlow& flow : timing.flows) {
    ++flow_id;
    events.push_back({{"ph", "s"},
                      {"name", "wait"},
                      {"cat", "wait"},
                      {"id", flow_id},
                      {"pid", 0},
                      {"tid", lane_index[static_cast<size_t>(flow.from_lane)]},
                      {"ts", whole_step_time(estimate, flow.from_time) * 1e6 - 0.001}});
    events.push_back({{"ph", "f"},
                      {"bp", "e"},
                      {"name", "wait"},
                      {"cat", "wait"},
                      {"id", flow_id},
                      {"pid", 0},
                      {"tid", lane_index[static_cast<size_t>(flow.to_lane)]},
                      {"ts", whole_step_time(estimate, flow.to_time) * 1e6}});
  }
  return nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump();
}

}  // namespace tpusim
