#include "sim/estimate/step_html.h"

#include <map>

#include "sim/estimate/trace_lanes.h"
#include "sim/html/html_page.h"

namespace tpusim {
namespace {

// The page (sim/html/html_page.h frames it): the summary, the breakdown and HBM bars, HBM
// over the step, the timeline by lane, and the config.
constexpr const char* kCss = R"css(
  table.summary td { padding: 1px 14px 1px 0; }
  table.summary td:first-child { color: #5b6477; }
  #timeline { border: 1px solid #d7dbe3; cursor: grab; user-select: none; }
)css";

constexpr const char* kBody = R"html(<h1 id="title"></h1>
<table class="summary" id="summary"></table>
<h2>Where the step goes</h2>
<svg id="breakdown" width="1000" height="34"></svg>
<div class="legend" id="breakdown-legend"></div>
<h2>HBM per device at the peak</h2>
<svg id="memory" width="1000" height="34"></svg>
<div class="legend" id="memory-legend"></div>
<h2>HBM per device over the step</h2>
<svg id="memory-over-step" width="1000" height="270"></svg>
<div class="note">At each checkpoint of the memory model, in step order: the end of each forward
region, the first and last iteration of each backward region, the optimizer update. The
dashed line is the usable HBM; the peak is outlined.</div>
<h2>Timeline of one device (the simulated iterations)</h2>
<div><button id="zoom-in">zoom in</button><button id="zoom-out">zoom out</button><button id="reset">reset</button>
<span class="note">wheel: zoom at the pointer; drag: pan; hover: an op's details. Layer loops
are simulated for a few iterations and the rest repeat them, so the timeline has gaps.</span></div>
<svg id="timeline" width="1000"></svg>
<h2>Config</h2>
<pre id="config"></pre>
)html";

// Draws the page from `data` (see step_html below for its fields).
constexpr const char* kScript = R"js(

document.getElementById("title").textContent = data.title;
const summary = document.getElementById("summary");
for (const [key, value] of data.summary) {
  const row = summary.insertRow();
  row.insertCell().textContent = key;
  row.insertCell().textContent = value;
}
document.getElementById("config").textContent = data.command;

function stackedBar(svgId, legendId, parts, total, format) {
  const sum = parts.reduce((m, p) => m + p[1], 0);
  total = Math.max(total, sum);
  const svg = document.getElementById(svgId);
  const legend = document.getElementById(legendId);
  const width = 1000;
  let x = 0;
  parts.forEach(([name, value], index) => {
    const w = total > 0 ? value / total * width : 0;
    const color = palette[index % palette.length];
    const rect = el("rect", {x: x, y: 4, width: Math.max(w, 0), height: 26, fill: color}, svg);
    el("title", {}, rect).textContent = name + ": " + format(value);
    x += w;
    const item = document.createElement("span");
    item.innerHTML = '<i style="background:' + color + '"></i>';
    item.appendChild(document.createTextNode(name + " " + format(value)));
    legend.appendChild(item);
  });
  return x;
}
stackedBar("breakdown", "breakdown-legend", data.breakdown, data.step_seconds, seconds);
stackedBar("memory", "memory-legend", data.memory, data.hbm_capacity, gib);
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
                  fill: palette[kind % palette.length]}, group);
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
timeline.setAttribute("height", laneTop + data.lanes.length * laneHeight + 4);
const end = data.events.reduce((m, e) => Math.max(m, e[1] + e[2]), 0) || 1;
let view = {start: 0, span: end};
const detailColor = {mxu: "#3b6fd6", hbm: "#e8833a", vpu: "#3fa672", overhead: "#7f8694"};
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
    const color = detailColor[e[5]] || palette[(e[0] + 4) % palette.length];
    const rect = el("rect", {x: x, y: lane.y + 3, width: w, height: laneHeight - 6, fill: color},
                    lane.ops);
    rect.dataset.tip = e[3] + "\n" + e[4] + " / " + e[5] + "\nstart " + seconds(e[1]) +
                       ", " + seconds(e[2]);
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
  zoom(event.deltaY < 0 ? 0.8 : 1.25, event.clientX - box.left);
}, {passive: false});
timeline.addEventListener("mousedown", (event) => { drag = {x: event.clientX, start: view.start}; });
window.addEventListener("mouseup", () => { drag = null; });
window.addEventListener("mousemove", (event) => {
  if (!drag) return;
  const shift = (drag.x - event.clientX) / plotWidth * view.span;
  view.start = Math.min(Math.max(0, drag.start + shift), end - view.span);
  draw();
});
document.getElementById("zoom-in").onclick = () => zoom(0.5, labelWidth + plotWidth / 2);
document.getElementById("zoom-out").onclick = () => zoom(2, labelWidth + plotWidth / 2);
document.getElementById("reset").onclick = () => { view = {start: 0, span: end}; draw(); };
draw();
)js";

std::string format_number(double value, int decimals) {
  std::string text = std::to_string(value);
  const size_t dot = text.find('.');
  return dot == std::string::npos ? text : text.substr(0, dot + static_cast<size_t>(decimals) + 1);
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
      breakdown.push_back({breakdown_name(key), seconds});
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
  nlohmann::json events = nlohmann::json::array();
  for (const TraceEvent& event : estimate.timing.trace) {
    events.push_back({lane_index[static_cast<size_t>(event.lane)], event.start, event.duration,
                      event.name, event.region, event.detail});
  }
  data["events"] = events;
  data["command"] = command_line;
  return render_html_page({"tpusim step: " + title, kCss, kBody, kScript}, data);
}

}  // namespace tpusim
