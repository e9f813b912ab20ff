#include "sim/estimate/step_html.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "sim/estimate/op_details.h"
#include "sim/estimate/trace_lanes.h"
#include "sim/estimate/whole_step.h"
#include "sim/html/html_page.h"

namespace tpusim {
namespace {

// The page (sim/html/html_page.h frames it): the summary, the breakdown and HBM bars, HBM
// over the step, the timeline by lane, and the config.
constexpr const char* kCss = R"css(
  table.summary td { padding: 1px 14px 1px 0; }
  table.summary td:first-child { color: #5b6477; }
  #timeline { border: 1px solid #d7dbe3; cursor: grab; user-select: none; }
  table.summary { max-width: 100%; }
  table.summary td { overflow-wrap: anywhere; }
  table.ops td { white-space: nowrap; }
  table.ops td.wrap { white-space: normal; min-width: 180px; }
)css";

constexpr const char* kBody = R"html(<div class="verdict" id="verdict" hidden></div>
<h1 id="title"></h1>
<table class="summary" id="summary"></table>
<h2>Where the step goes</h2>
<svg id="breakdown" class="chart" viewBox="0 0 1000 34" width="1000" height="34"></svg>
<div class="legend" id="breakdown-legend"></div>
<h2>HBM per device at the peak</h2>
<svg id="memory" class="chart" viewBox="0 0 1000 34" width="1000" height="34"></svg>
<div class="legend" id="memory-legend"></div>
<h2>HBM per device over the step</h2>
<svg id="memory-over-step" class="chart" viewBox="0 0 1000 270" width="1000" height="270"></svg>
<div class="note">At each checkpoint of the memory model, in step order: the end of each forward
region, the first and last iteration of each backward region, the optimizer update. The
dashed line is the usable HBM; the peak is outlined.</div>
<h2>Timeline of one device (the whole step)</h2>
<div><button id="zoom-in">zoom in</button><button id="zoom-out">zoom out</button><button id="reset">reset</button>
<span class="note">wheel: zoom at the pointer; drag: pan; hover: an op's details. Every layer
iteration is drawn: the first few of a layer loop are simulated, the rest repeat the last of
them (as the step time counts them).</span></div>
<svg id="timeline" class="chart" width="1000"></svg>
<div class="legend" id="timeline-legend"></div>
<h2>Roofline of the compute ops</h2>
<svg id="roofline" class="chart" viewBox="0 0 1000 420" width="1000" height="420"></svg>
<div class="note">Arithmetic intensity (FLOPs per HBM byte) against the achieved TFLOP/s per
device, on log scales, under the roofs of the chip's bf16 peak and HBM bandwidth per device;
colour: what bounds the op.</div>
<h2>Op profile (compute ops, most time first)</h2>
<div class="note">Per call: FLOPs (MXU and VPU) and HBM bytes as the cost model charges them, and
the rates they reach in the op's time. Recomputed: run again in the backward pass (remat).</div>
<div class="wide"><table class="ops" id="op-table"></table></div>
<button id="all-ops" hidden></button>
<h2>Config</h2>
<pre id="config"></pre>
)html";

// Draws the page from `data` (see step_html below for its fields).
constexpr const char* kScript = R"js(

document.getElementById("title").textContent = data.title;
if (!data.fits) {
  const verdict = document.getElementById("verdict");
  verdict.textContent = data.verdict;
  verdict.hidden = false;
}
const summary = document.getElementById("summary");
for (const [key, value] of data.summary) {
  const row = summary.insertRow();
  row.insertCell().textContent = key;
  row.insertCell().textContent = value;
}
document.getElementById("config").textContent = data.command;

// HBM by kind, in colours no resource uses (a resource's colour means the same everywhere).
const memoryColors = ["#35486b", "#a07850", "#9fb38a", "#e9a6b8", "#5f9e8f", "#c8b6dd"];
// parts: [name, value, text, resource]; a part with a resource takes its colour (one colour per
// resource across the page), else the HBM kinds'.
function stackedBar(svgId, legendId, parts, total) {
  const sum = parts.reduce((m, p) => m + p[1], 0);
  total = Math.max(total, sum);
  const svg = document.getElementById(svgId);
  const legend = document.getElementById(legendId);
  const width = 1000;
  let x = 0;
  parts.forEach(([name, value, text, resource], index) => {
    const w = total > 0 ? value / total * width : 0;
    const color = resource ? resourceColor(resource) : memoryColors[index % memoryColors.length];
    const rect = el("rect", {x: x, y: 4, width: Math.max(w, 0), height: 26, fill: color}, svg);
    if (resource) rect.dataset.resource = resource;
    rect.dataset.tip = name + ": " + text;
    x += w;
    const item = document.createElement("span");
    if (resource) item.dataset.resource = resource;
    item.innerHTML = '<i style="background:' + color + '"></i>';
    item.appendChild(document.createTextNode(name + " " + text));
    legend.appendChild(item);
  });
  return x;
}
stackedBar("breakdown", "breakdown-legend", data.breakdown, data.step_seconds);
stackedBar("memory", "memory-legend", data.memory.map((p) => [p[0], p[1], gib(p[1])]),
           data.hbm_capacity);
{
  // The capacity as a line (the bar runs past it when the run does not fit).
  const sum = data.memory.reduce((m, p) => m + p[1], 0);
  const x = Math.min(999, data.hbm_capacity / Math.max(sum, data.hbm_capacity) * 1000);
  const line = el("line", {x1: x, x2: x, y1: 0, y2: 34, stroke: "#1d2433", "stroke-width": 3},
                  document.getElementById("memory"));
  el("title", {}, line).textContent = "capacity " + gib(data.hbm_capacity);
}

// HBM over the step: a stacked column per memory checkpoint, in the colours of the bar above.
{
  const svg = document.getElementById("memory-over-step");
  const points = data.memory_timeline;
  const left = 60, right = 990, top = 10, bottom = 170;
  const totals = points.map((p) => p.slice(1).reduce((m, v) => m + v, 0));
  const high = Math.max(data.hbm_capacity, ...totals, 1) * 1.05;
  const peak = totals.indexOf(Math.max(...totals));
  const width = (right - left) / Math.max(points.length, 1);
  const yOf = (bytes) => bottom - bytes / high * (bottom - top);
  points.forEach((point, index) => {
    let below = 0;
    const group = el("g", {}, svg);
    el("title", {}, group).textContent = point[0] + ": " + gib(totals[index]);
    point.slice(1).forEach((bytes, kind) => {
      el("rect", {x: left + index * width + 1, y: yOf(below + bytes), width: Math.max(1, width - 2),
                  height: Math.max(0, yOf(below) - yOf(below + bytes)),
                  fill: memoryColors[kind % memoryColors.length]}, group);
      below += bytes;
    });
    if (index === peak) {
      el("rect", {x: left + index * width, y: yOf(totals[index]) - 2, width: width,
                  height: bottom - yOf(totals[index]) + 2, fill: "none", stroke: "#1d2433",
                  "stroke-width": 2}, group);
    }
    if (points.length <= 40 || index % Math.ceil(points.length / 40) === 0) {
      const label = el("text", {x: left + index * width + width / 2, y: bottom + 8, "font-size": 9,
                                fill: "#5b6477", transform: "rotate(35 " + (left + index * width +
                                width / 2) + " " + (bottom + 8) + ")"}, svg);
      label.textContent = point[0].length > 28 ? point[0].slice(0, 27) + "…" : point[0];
    }
  });
  el("line", {x1: left, x2: right, y1: yOf(data.hbm_capacity), y2: yOf(data.hbm_capacity),
              stroke: "#c94f6d", "stroke-dasharray": "4 3"}, svg);
  for (let t = 0; t <= 4; ++t) {
    const text = el("text", {x: 4, y: yOf(high * t / 4) + 4, "font-size": 10, fill: "#5b6477"}, svg);
    text.textContent = gib(high * t / 4);
  }
}

// Timeline: one lane per resource, ops as rectangles coloured by what bounds them.
const timeline = document.getElementById("timeline");
const laneHeight = 26, labelWidth = 190, plotWidth = 1000 - labelWidth, laneTop = 20;
const timelineHeight = laneTop + data.lanes.length * laneHeight + 4;
timeline.setAttribute("height", timelineHeight);
timeline.setAttribute("viewBox", "0 0 1000 " + timelineHeight);
legend(document.getElementById("timeline-legend"),
       [...new Set(data.events.map((e) => e[6]))].sort(
           (a, b) => Object.keys(resourceColors).indexOf(a) - Object.keys(resourceColors).indexOf(b)));
const end = data.events.reduce((m, e) => Math.max(m, e[1] + e[2]), 0) || 1;
let view = {start: 0, span: end};
const axis = el("g", {}, timeline);
const lanes = data.lanes.map((name, index) => {
  const group = el("g", {"class": "lane", "data-lane": name}, timeline);
  const y = laneTop + index * laneHeight;
  el("rect", {x: 0, y: y, width: 1000, height: laneHeight,
              fill: index % 2 ? "#ffffff" : "#f4f6f9"}, group);
  const label = el("text", {x: 6, y: y + 17, "font-size": 12, fill: "#1d2433"}, group);
  label.textContent = name;
  return {group: group, y: y, ops: el("g", {}, group)};
});
let drag = null;
tips.suppressed = () => drag !== null;
function count(value, unit) {
  const steps = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, prefix] of steps) {
    if (value >= scale) return (value / scale).toFixed(2) + " " + prefix + unit;
  }
  return value.toFixed(0) + " " + unit;
}
// An op's details for its tooltip, at `time` seconds per call.
function opText(op, time) {
  return "\nFLOPs " + count(op.flops, "FLOP") + ", HBM bytes " + count(op.bytes, "B") +
         "\nachieved " + (op.flops / time / 1e12).toFixed(1) + " TFLOP/s, " +
         (op.bytes / time / 1e9).toFixed(1) + " GB/s\nbound: " + op.bound +
         (op.recomputed ? ", recomputed" : ", not recomputed") + "\n" + op.shapes;
}
function draw() {
  for (const lane of lanes) lane.ops.replaceChildren();
  axis.replaceChildren();
  const scale = plotWidth / view.span;
  for (let t = 0; t <= 10; ++t) {
    const x = labelWidth + t * plotWidth / 10;
    el("line", {x1: x, x2: x, y1: laneTop - 4, y2: laneTop + data.lanes.length * laneHeight,
                stroke: "#e3e6ec"}, axis);
    const text = el("text", {x: x + 2, y: 12, "font-size": 10, fill: "#5b6477"}, axis);
    text.textContent = seconds(view.start + t * view.span / 10);
  }
  for (const e of data.events) {
    const x0 = (e[1] - view.start) * scale, x1 = (e[1] + e[2] - view.start) * scale;
    if (x1 < 0 || x0 > plotWidth) continue;
    const x = labelWidth + Math.max(0, x0), w = Math.max(0.5, Math.min(plotWidth, x1) - Math.max(0, x0));
    const lane = lanes[e[0]];
    const rect = el("rect", {x: x, y: lane.y + 3, width: w, height: laneHeight - 6,
                             fill: resourceColor(e[6]), "class": "op"}, lane.ops);
    rect.dataset.resource = e[6];
    rect.dataset.tip = e[3] + "\n" + e[4] + " / " + e[5] + "\nstart " + seconds(e[1]) +
                       ", " + seconds(e[2]) + (e[7] >= 0 ? opText(data.ops[e[7]], e[2]) : "");
  }
}
function zoom(factor, atX) {
  const fraction = Math.min(1, Math.max(0, (atX - labelWidth) / plotWidth));
  const at = view.start + fraction * view.span;
  view.span = Math.min(end, Math.max(end * 1e-6, view.span * factor));
  view.start = Math.min(Math.max(0, at - fraction * view.span), end - view.span);
  draw();
}
timeline.addEventListener("wheel", (event) => {
  event.preventDefault();
  const box = timeline.getBoundingClientRect();
  zoom(event.deltaY < 0 ? 0.8 : 1.25, (event.clientX - box.left) * 1000 / box.width);
}, {passive: false});
timeline.addEventListener("mousedown", (event) => { drag = {x: event.clientX, start: view.start}; });
window.addEventListener("mouseup", () => { drag = null; });
window.addEventListener("mousemove", (event) => {
  if (!drag) return;
  const box = timeline.getBoundingClientRect();
  const shift = (drag.x - event.clientX) * 1000 / box.width / plotWidth * view.span;
  view.start = Math.min(Math.max(0, drag.start + shift), end - view.span);
  draw();
});
document.getElementById("zoom-in").onclick = () => zoom(0.5, labelWidth + plotWidth / 2);
document.getElementById("zoom-out").onclick = () => zoom(2, labelWidth + plotWidth / 2);
document.getElementById("reset").onclick = () => { view = {start: 0, span: end}; draw(); };
draw();

// The op profile: a row per compute op, as xprof's op profile lists them.
{
  const table = document.getElementById("op-table");
  const head = table.insertRow();
  for (const name of ["op", "bound", "recomputed", "calls", "s per step", "% of step",
                      "per call", "FLOPs", "HBM bytes", "TFLOP/s", "GB/s", "shapes"]) {
    const cell = document.createElement("th");
    cell.textContent = name;
    head.appendChild(cell);
  }
  const shown = 25;
  data.ops.forEach((op, index) => {
    const row = table.insertRow();
    row.hidden = index >= shown;
    row.dataset.tip = op.region + ": " + op.op + opText(op, op.per_call);
    const cells = [op.region + ": " + op.op, op.bound, op.recomputed ? "yes" : "no",
                   String(op.calls), op.seconds.toFixed(4),
                   (100 * op.seconds / data.step_seconds).toFixed(1) + "%", seconds(op.per_call),
                   count(op.flops, ""), count(op.bytes, "B"),
                   (op.flops / op.per_call / 1e12).toFixed(1),
                   (op.bytes / op.per_call / 1e9).toFixed(1), op.shapes];
    cells.forEach((text, column) => {
      const cell = row.insertCell();
      cell.textContent = text;
      if (column === 0 || column === cells.length - 1) cell.className = "wrap";
    });
  });
  if (data.ops.length > shown) {
    const button = document.getElementById("all-ops");
    button.textContent = "show all " + data.ops.length + " ops";
    button.hidden = false;
    button.onclick = () => {
      for (const row of table.rows) row.hidden = false;
      button.hidden = true;
    };
  }
}

// Roofline: intensity vs achieved rate, log-log, under the roofs.
{
  const svg = document.getElementById("roofline");
  const left = 70, right = 980, top = 14, bottom = 380;
  const ops = data.ops.filter((op) => op.flops > 0 && op.bytes > 0 && op.per_call > 0);
  const peak = data.peak_flops / 1e12, bandwidth = data.hbm_bandwidth;  // TFLOP/s, B/s
  const ridge = data.peak_flops / bandwidth;
  const xs = ops.map((op) => op.flops / op.bytes).concat([ridge]);
  const xLow = Math.pow(10, Math.floor(Math.log10(Math.min(...xs)))),
        xHigh = Math.pow(10, Math.ceil(Math.log10(Math.max(...xs) * 1.01)));
  const yHigh = Math.pow(10, Math.ceil(Math.log10(peak * 1.01)));
  const yLow = Math.min(yHigh / 1e4, ...ops.map((op) => op.flops / op.per_call / 1e12));
  const xOf = (x) => left + (Math.log10(x) - Math.log10(xLow)) /
                     (Math.log10(xHigh) - Math.log10(xLow)) * (right - left);
  const yOf = (y) => bottom - (Math.log10(Math.max(y, yLow)) - Math.log10(yLow)) /
                     (Math.log10(yHigh) - Math.log10(yLow)) * (bottom - top);
  for (let x = xLow; x <= xHigh * 1.001; x *= 10) {
    el("line", {x1: xOf(x), x2: xOf(x), y1: top, y2: bottom, stroke: "#e3e6ec"}, svg);
    el("text", {x: xOf(x) - 8, y: bottom + 16, "font-size": 11, fill: "#5b6477"}, svg)
        .textContent = String(x);
  }
  for (let y = yHigh; y >= yLow * 0.999; y /= 10) {
    el("line", {x1: left, x2: right, y1: yOf(y), y2: yOf(y), stroke: "#e3e6ec"}, svg);
    el("text", {x: 4, y: yOf(y) + 4, "font-size": 11, fill: "#5b6477"}, svg).textContent =
        String(+y.toPrecision(3));
  }
  el("text", {x: (left + right) / 2 - 90, y: bottom + 34, "font-size": 12, fill: "#1d2433"}, svg)
      .textContent = "FLOPs per HBM byte (log)";
  el("text", {x: left + 4, y: top + 12, "font-size": 12, fill: "#1d2433"}, svg).textContent =
      "TFLOP/s per device (log)";
  const roof = [[xLow, xLow * bandwidth / 1e12], [ridge, peak], [xHigh, peak]];
  el("polyline", {points: roof.map(([x, y]) => xOf(x) + "," + yOf(y)).join(" "), fill: "none",
                  stroke: "#1d2433", "stroke-width": 2}, svg);
  for (const op of ops) {
    const dot = el("circle", {cx: xOf(op.flops / op.bytes), cy: yOf(op.flops / op.per_call / 1e12),
                              r: 4 + Math.min(8, 40 * op.seconds / data.step_seconds),
                              fill: resourceColor(op.bound), "fill-opacity": 0.75,
                              "class": "roofline-op"}, svg);
    dot.dataset.resource = op.bound;
    dot.dataset.tip = op.region + ": " + op.op + opText(op, op.per_call);
  }
}
)js";

// Rounded as the command line rounds it (std::fixed), so the page and `tpusim estimate` agree.
std::string format_number(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

constexpr size_t kMostOpsListed = 400;

nlohmann::json ops_json(const Estimate& estimate) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpDetail& op : op_details(estimate)) {
    if (ops.size() == kMostOpsListed) {
      break;
    }
    ops.push_back({{"region", op.region},
                   {"op", op.op},
                   {"bound", op.bound},
                   {"calls", op.calls},
                   {"seconds", op.seconds},
                   {"per_call", op.seconds_per_call},
                   {"flops", op.flops},
                   {"bytes", op.hbm_bytes},
                   {"shapes", op.shapes},
                   {"recomputed", op.recomputed}});
  }
  return ops;
}

// The whole step's events: [row, start, duration, name, region, detail, resource, op index in
// data.ops or -1].
nlohmann::json events_json(const Estimate& estimate, const std::vector<int>& lane_index) {
  const StepTiming& timing = estimate.timing;
  std::map<std::pair<std::string, std::string>, int> op_index;
  const std::vector<OpDetail> details = op_details(estimate);
  for (size_t index = 0; index < details.size() && index < kMostOpsListed; ++index) {
    op_index.emplace(std::make_pair(details[index].region, details[index].name),
                     static_cast<int>(index));
  }
  nlohmann::json events = nlohmann::json::array();
  for (const TraceEvent& event : whole_step_trace(estimate)) {
    const TraceLane& lane = timing.lanes[static_cast<size_t>(event.lane)];
    const std::string resource = event_resource(lane, event.detail);
    const auto found = op_index.find({event.region, event.name});
    const bool compute = lane.kind == LaneKind::kTensorCore || lane.kind == LaneKind::kGpuSms;
    events.push_back({lane_index[static_cast<size_t>(event.lane)], event.start, event.duration,
                      event.name, event.region, event.detail, resource,
                      compute && found != op_index.end() ? found->second : -1});
  }
  return events;
}

// What the browser test checks the drawn ops against, from other sources than the drawing: the
// breakdown's compute seconds (the TensorCore's busy time over the step), and per lane and region
// the simulated events' seconds with the region's repeats (each simulated iteration stands for
// repeat / simulated ones, as the scheduler counts them, times the microbatches of gradient
// accumulation outside the optimizer).
nlohmann::json check_json(const Estimate& estimate, const std::vector<int>& lane_index) {
  double compute = 0;
  for (const auto& [key, seconds] : estimate.timing.breakdown) {
    if (key.kind == BreakdownKind::kCompute ||
        key.kind == BreakdownKind::kComputeSharedWithCollectives) {
      compute += seconds;
    }
  }
  std::map<std::pair<int, std::string>, double> simulated;
  for (const TraceEvent& event : estimate.timing.trace) {
    simulated[{lane_index[static_cast<size_t>(event.lane)], event.region}] += event.duration;
  }
  nlohmann::json repeats = nlohmann::json::object();
  for (const Region& region : estimate.program.program.graph.regions()) {
    const int64_t simulated_iterations =
        std::min<int64_t>(region.repeat, estimate.perf.max_simulated_iterations);
    // A microbatch's region runs once per microbatch of gradient accumulation.
    const int64_t microbatches =
        region.phase == Phase::kOptimizer ? 1 : estimate.program.accumulation_steps;
    repeats[region.name] = {region.repeat * microbatches, simulated_iterations, region.pipelined()};
  }
  nlohmann::json lanes = nlohmann::json::array();
  for (const auto& [where, seconds] : simulated) {
    lanes.push_back({where.first, where.second, seconds});
  }
  return {{"compute_seconds", compute}, {"repeats", repeats}, {"simulated", lanes}};
}

// The legends' name of each resource the page colours: a lane's name for a link (ICI fsdp, ...),
// the breakdown's label for what bounds compute and for the rest.
nlohmann::json resource_names_json(const Estimate& estimate) {
  nlohmann::json names = nlohmann::json::object();
  for (const TraceLane& lane : estimate.timing.lanes) {
    const std::string resource = event_resource(lane, "");
    if (lane.kind != LaneKind::kTensorCore && lane.kind != LaneKind::kGpuSms &&
        !names.contains(resource)) {
      names[resource] = lane_name(lane);
    }
  }
  for (const CostCategory bound :
       {CostCategory::kMxu, CostCategory::kHbm, CostCategory::kVpu, CostCategory::kOverhead}) {
    names[cost_category_name(bound)] = breakdown_label(BreakdownKey::compute(bound));
  }
  for (const auto& [key, seconds] : estimate.timing.breakdown) {
    if (!names.contains(breakdown_resource(key))) {
      names[breakdown_resource(key)] = breakdown_label(key);
    }
  }
  return names;
}

}  // namespace

std::string step_html(const Estimate& estimate, const std::string& command_line) {
  const nlohmann::json& report = estimate.json;
  nlohmann::json data;
  const std::string title = report["model_name"].get<std::string>() + " on " +
                            report["slice"].get<std::string>() +
                            (estimate.program.slice.num_slices > 1
                                 ? " x " + std::to_string(estimate.program.slice.num_slices)
                                 : std::string());
  data["title"] = title;
  data["fits"] = estimate.memory.fits;
  data["verdict"] = "OUT OF MEMORY: peak HBM per device " +
                    format_number(estimate.memory.peak_bytes / (1ull << 30), 2) + " GiB of " +
                    format_number(estimate.memory.capacity_bytes / (1ull << 30), 2) +
                    " GiB usable (peak at " + estimate.memory.peak_region +
                    "); the figures below are for a step that would not start";
  nlohmann::json summary = nlohmann::json::array();
  summary.push_back({"step time", format_number(estimate.step_seconds, 3) + " s"});
  summary.push_back({"MFU", format_number(100 * estimate.mfu, 1) + "%"});
  summary.push_back({"TFLOP/s per chip", format_number(estimate.tflops_per_chip, 1)});
  summary.push_back({"tokens/s per chip", format_number(estimate.tokens_per_s_per_chip, 1)});
  summary.push_back(
      {"HBM per device", format_number(estimate.memory.peak_bytes / (1ull << 30), 2) + " of " +
                             format_number(estimate.memory.capacity_bytes / (1ull << 30), 2) +
                             " GiB" + (estimate.memory.fits ? " (fits)" : " (OUT OF MEMORY)")});
  summary.push_back({"chip", estimate.program.slice.chip->display_name});
  summary.push_back({"mesh", report["mesh"]});
  for (const auto& [axis, placement] : report["mesh_placement"].items()) {
    summary.push_back({"  " + axis, placement});
  }
  data["summary"] = summary;
  nlohmann::json breakdown = nlohmann::json::array();
  for (const auto& [key, seconds] : estimate.timing.breakdown) {
    if (seconds > 0) {
      breakdown.push_back({breakdown_label(key), seconds, format_number(seconds, 4) + " s",
                           breakdown_resource(key)});
    }
  }
  data["breakdown"] = breakdown;
  data["step_seconds"] = estimate.step_seconds;
  const MemoryBreakdown& peak = estimate.memory.at_peak;
  data["memory"] = nlohmann::json::array({nlohmann::json::array({"weights", peak.weights}),
                                          {"optimizer state", peak.optimizer_state},
                                          {"gradients", peak.gradients},
                                          {"saved activations", peak.saved_activations},
                                          {"gathered weights", peak.gathered_weights},
                                          {"temporaries", peak.temporaries}});
  data["hbm_capacity"] = estimate.memory.capacity_bytes;
  nlohmann::json memory_timeline = nlohmann::json::array();
  for (const MemoryCheckpoint& point : estimate.memory.timeline) {
    const MemoryBreakdown& kinds = point.memory;
    memory_timeline.push_back({point.where, kinds.weights, kinds.optimizer_state, kinds.gradients,
                               kinds.saved_activations, kinds.gathered_weights, kinds.temporaries});
  }
  data["memory_timeline"] = memory_timeline;
  const std::vector<int> lanes = ordered_lanes(estimate.timing);
  const std::vector<int> lane_index = lane_rows(estimate.timing, lanes);
  nlohmann::json lane_names = nlohmann::json::array();
  for (const int lane : lanes) {
    lane_names.push_back(lane_name(estimate.timing.lanes[static_cast<size_t>(lane)]));
  }
  data["lanes"] = lane_names;
  data["ops"] = ops_json(estimate);
  data["resource_names"] = resource_names_json(estimate);
  data["events"] = events_json(estimate, lane_index);
  data["check"] = check_json(estimate, lane_index);
  const ChipSpec& chip = *estimate.program.slice.chip;
  data["peak_flops"] = chip.peak_bf16_flops_per_device();
  data["hbm_bandwidth"] = chip.hbm_bandwidth_gbps * 1e9 / chip.devices_per_chip;
  data["command"] = command_line;
  return render_html_page({"tpusim step: " + title, kCss, kBody, kScript}, data);
}

}  // namespace tpusim
