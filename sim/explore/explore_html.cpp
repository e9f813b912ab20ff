#include "sim/explore/explore_html.h"

#include <algorithm>

#include "sim/html/html_page.h"

namespace tpusim {
namespace {

// The page (sim/html/html_page.h frames it): counts, the scatter, the top N, the command.
constexpr const char* kCss = R"css(
  table { border-collapse: collapse; }
  table.top td, table.top th { padding: 3px 10px 3px 0; text-align: right; vertical-align: top; }
  table.top td.args, table.top th.args { text-align: left; font: 11px/1.3 monospace; max-width: 700px; }
  table.top td.tight { color: #c94f6d; font-weight: 600; }
  table.top tr:nth-child(even) { background: #f4f6f9; }
  table.counts td { padding: 1px 14px 1px 0; word-break: break-word; }
  table.counts td:first-child { white-space: nowrap; color: #5b6477; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 5px; }
)css";

constexpr const char* kBody = R"html(<h1 id="title"></h1>
<table class="counts" id="counts"></table>
<h2>Throughput against HBM per device</h2>
<div class="legend"><span><i style="background:#3b6fd6"></i>fits (timed)</span>
<span><i style="background:#c94f6d"></i>does not fit (not timed; drawn above the plot; past the
right edge: more HBM than the axis shows)</span>
<span><i style="background:#e8833a"></i>Pareto front (no candidate both smaller and faster)</span>
<span><i style="border:2px solid #1d2433;width:7px;height:7px"></i>top N</span></div>
<svg id="scatter" class="chart" viewBox="0 0 1000 520" width="1000" height="520"></svg>
<div class="note" id="sample-note"></div>
<h2>Top candidates</h2>
<div class="wide"><table class="top" id="top"><tr><th>#</th><th>step s</th><th>MFU</th><th>tokens/s/chip</th>
<th>HBM GiB</th><th>HBM used</th><th>mesh</th><th class="args">reproduce with</th></tr></table></div>
<h2>Search</h2>
<pre id="command"></pre>
)html";

// Draws the page from `data` (see explore_html below for its fields).
constexpr const char* kScript = R"js(
const gibValue = (bytes) => bytes / 2 ** 30;
document.getElementById("title").textContent = data.title;
document.getElementById("command").textContent = data.command;
const counts = document.getElementById("counts");
for (const [key, value] of data.counts) {
  const row = counts.insertRow();
  row.insertCell().textContent = key;
  row.insertCell().textContent = value;
}
const table = document.getElementById("top");
data.top.forEach((item, index) => {
  const row = table.insertRow();
  const cells = [index + 1, item.step_time_s.toFixed(3), (100 * item.mfu).toFixed(1) + "%",
                 item.tokens_per_s_per_chip.toFixed(1), gibValue(item.hbm_peak_bytes_per_device).toFixed(2),
                 (100 * item.hbm_used_fraction).toFixed(1) + "%" + (item.hbm_tight ? " (above 95%)" : ""),
                 item.mesh, item.estimate_command];
  cells.forEach((value, column) => {
    const cell = row.insertCell();
    cell.textContent = value;
    if (column === 5 && item.hbm_tight) cell.className = "tight";
    if (column === 7) cell.className = "args";
  });
});

// Scatter: x = peak HBM (GiB), y = tokens/s per chip (comparable across batch sizes, unlike the
// step time); candidates that do not fit sit in a strip on top.
const svg = document.getElementById("scatter");
const left = 70, right = 980, topStrip = 30, plotTop = 50, bottom = 470;
const fits = data.samples.filter((s) => s[2] === 1);
const misses = data.samples.filter((s) => s[2] === 0);
const allX = data.samples.map((s) => gibValue(s[1])).concat(data.top.map((t) => gibValue(t.hbm_peak_bytes_per_device)),
                                                      [gibValue(data.usable_hbm)]);
const times = fits.map((s) => s[0]).concat(data.top.map((t) => t.tokens_per_s_per_chip));
// The axis ends at 1.2 x the usable HBM at most, so the candidates that fit are not squeezed
// into one column by a far larger one that does not; those past it sit at the right edge.
const xMax = Math.min(Math.max(...allX, 1e-9) * 1.05, 1.2 * gibValue(data.usable_hbm));
svg.dataset.xMax = xMax;
const yMin = 0, yMax = times.length ? Math.max(...times) * 1.05 : 1;
const xOf = (v) => left + Math.min(v, xMax) / xMax * (right - left);
const yOf = (v) => bottom - (v - yMin) / Math.max(yMax - yMin, 1e-12) * (bottom - plotTop);
el("rect", {x: left, y: plotTop, width: right - left, height: bottom - plotTop, fill: "#fbfcfd",
            stroke: "#d7dbe3"}, svg);
for (let t = 0; t <= 5; ++t) {
  const xv = xMax * t / 5, yv = yMin + (yMax - yMin) * t / 5;
  el("text", {x: xOf(xv) - 10, y: bottom + 16, "font-size": 11, fill: "#5b6477"}, svg).textContent = xv.toFixed(1);
  el("text", {x: 8, y: yOf(yv) + 4, "font-size": 11, fill: "#5b6477"}, svg).textContent = yv.toFixed(0);
}
el("text", {x: (left + right) / 2 - 60, y: bottom + 34, "font-size": 12}, svg).textContent = "peak HBM per device (GiB)";
el("text", {x: 8, y: plotTop - 6, "font-size": 12}, svg).textContent = "tokens/s per chip";
el("line", {x1: xOf(gibValue(data.usable_hbm)), x2: xOf(gibValue(data.usable_hbm)), y1: topStrip - 10, y2: bottom,
            stroke: "#c94f6d", "stroke-dasharray": "4 3"}, svg);
el("text", {x: xOf(gibValue(data.usable_hbm)) + 4, y: topStrip - 14, "font-size": 11, fill: "#c94f6d"}, svg)
    .textContent = "usable HBM " + gibValue(data.usable_hbm).toFixed(1) + " GiB";
function dot(x, y, color, text, cls) {
  const c = el("circle", {cx: x, cy: y, r: 3, fill: color, "fill-opacity": 0.55, "class": cls}, svg);
  c.dataset.tip = text;
  return c;
}
for (const s of misses) {
  dot(xOf(gibValue(s[1])), topStrip + (s[1] % 7), "#c94f6d", "does not fit: " + gibValue(s[1]).toFixed(2) + " GiB", "sample");
}
for (const s of fits) {
  dot(xOf(gibValue(s[1])), yOf(s[0]), "#3b6fd6", s[0].toFixed(1) + " tokens/s/chip, step " + s[3].toFixed(3) +
      " s, " + gibValue(s[1]).toFixed(2) + " GiB", "sample");
}
// Pareto front: sorted by HBM, keep each candidate with more tokens/s than every smaller one.
const front = fits.slice().sort((a, b) => a[1] - b[1] || b[0] - a[0]);
let best = -Infinity;
const points = [];
for (const s of front) {
  if (s[0] > best) { best = s[0]; points.push(xOf(gibValue(s[1])) + "," + yOf(s[0])); }
}
if (points.length) el("polyline", {points: points.join(" "), fill: "none", stroke: "#e8833a", "stroke-width": 2}, svg);
data.top.forEach((t, index) => {
  const ring = el("circle", {cx: xOf(gibValue(t.hbm_peak_bytes_per_device)), cy: yOf(t.tokens_per_s_per_chip), r: 6,
                             fill: "none", stroke: "#1d2433", "stroke-width": 1.5, "class": "top-ring"}, svg);
  ring.dataset.tip = "#" + (index + 1) + ": " + t.tokens_per_s_per_chip.toFixed(1) + " tokens/s/chip, step " +
                     t.step_time_s.toFixed(3) + " s\n" + t.mesh + "\n" + t.args + "\nreproduce: " +
                     t.estimate_command;
});
document.getElementById("sample-note").textContent =
    "Plotted: " + data.samples.length + " of the " + data.samples_seen + " candidates built (timed or found not to fit)" +
    (data.samples.length < data.samples_seen ? " (a uniform sample)" : "") +
    ". Candidates skipped unbuilt (branch and bound, a smaller batch already too large) are not drawn.";
)js";

}  // namespace

std::string explore_html(const ExploreResult& result, const std::string& command_line) {
  const nlohmann::json report = result.to_json();
  nlohmann::json data;
  // The model, from the command that reproduces the best candidate (or the search's own).
  std::string model;
  const std::string source = report["top"].empty()
                                 ? command_line
                                 : report["top"][0].value("estimate_command", command_line);
  if (const size_t at = source.find("model_name="); at != std::string::npos) {
    const size_t begin = at + std::string("model_name=").size();
    model = source.substr(begin, source.find(' ', begin) - begin) + " on ";
  }
  const std::string title =
      "explore: " + model + result.space.slice.name +
      (result.space.slice.num_slices > 1 ? " x " + std::to_string(result.space.slice.num_slices)
                                         : std::string()) +
      " (" + result.space.slice.chip->display_name + ")";
  data["title"] = title;
  nlohmann::json counts = nlohmann::json::array();
  counts.push_back({"candidates in the space", std::to_string(result.candidates_in_space)});
  counts.push_back({"evaluated (timed)", std::to_string(result.candidates_evaluated)});
  for (const auto& [reason, count] : result.pruned) {
    counts.push_back({"pruned: " + reason, std::to_string(count)});
  }
  counts.push_back({"objective", objective_name(result.objective)});
  counts.push_back({"searched keys", report["searched_keys"].dump()});
  data["counts"] = counts;
  data["top"] = report["top"];
  data["usable_hbm"] = result.usable_hbm_bytes;
  nlohmann::json samples = nlohmann::json::array();
  for (const ExploreSample& sample : result.samples) {
    samples.push_back({sample.tokens_per_s_per_chip, sample.peak_bytes, sample.fits ? 1 : 0,
                       sample.step_seconds});
  }
  data["samples"] = samples;
  data["samples_seen"] = result.samples_seen;
  data["command"] = command_line;
  return render_html_page({"tpusim " + title, kCss, kBody, kScript}, data);
}

}  // namespace tpusim
