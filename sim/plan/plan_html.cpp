#include "sim/plan/plan_html.h"

#include "sim/html/html_page.h"
#include "sim/plan/plan_output.h"

namespace tpusim {
namespace {

constexpr const char* kCss = R"css(
  table.points { border-collapse: collapse; }
  table.points td, table.points th { padding: 3px 10px 3px 0; text-align: right; vertical-align: top; }
  table.points td.args { text-align: left; font: 11px/1.3 monospace; max-width: 640px; }
  table.points tr.front td:first-child { font-weight: 600; color: #e8833a; }
  p.recommendation { max-width: 1000px; font-size: 15px; }
)css";

constexpr const char* kBody = R"html(<h1 id="title"></h1>
<p class="recommendation" id="recommendation"></p>
<h2 id="axes"></h2>
<svg id="scatter" class="chart" viewBox="0 0 1000 480" width="1000" height="480"></svg>
<h2>Slices searched (front first)</h2>
<div class="wide"><table class="points" id="points"><tr><th>slice</th><th>chips</th><th>days</th>
<th>chip-hours</th><th>cost</th><th>tokens/s/chip</th><th>step s</th><th>configuration</th>
<th class="args">reproduce with</th></tr></table></div>
<h2>Command</h2>
<pre id="command"></pre>
)html";

// Log-log scatter: x days, y chip-hours or cost; the front joined by a line.
constexpr const char* kScript = R"js(
document.getElementById("title").textContent = data.title;
document.getElementById("recommendation").textContent = data.plan.recommendation;
document.getElementById("command").textContent = data.command;
const byCost = data.plan.front_against === "cost";
const second = (p) => byCost ? p.cost : p.chip_hours;
document.getElementById("axes").textContent =
  "Days to the token budget against " + (byCost ? "cost" : "chip-hours") + " (log scales)";
const points = data.plan.points;
const svg = document.getElementById("scatter");
const left = 80, right = 960, top = 20, bottom = 430;
if (points.length > 0) {
  const xs = points.map((p) => Math.log10(p.days)), ys = points.map((p) => Math.log10(second(p)));
  const pad = (lo, hi) => hi - lo < 0.2 ? [lo - 0.1, hi + 0.1] : [lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)];
  const [x0, x1] = pad(Math.min(...xs), Math.max(...xs)), [y0, y1] = pad(Math.min(...ys), Math.max(...ys));
  const sx = (v) => left + (Math.log10(v) - x0) / (x1 - x0) * (right - left);
  const sy = (v) => bottom - (Math.log10(v) - y0) / (y1 - y0) * (bottom - top);
  el("line", {x1: left, y1: bottom, x2: right, y2: bottom, stroke: "#888"}, svg);
  el("line", {x1: left, y1: top, x2: left, y2: bottom, stroke: "#888"}, svg);
  for (let e = Math.ceil(x0 * 4) / 4; e <= x1; e += 0.25) {
    const t = el("text", {x: sx(10 ** e), y: bottom + 16, "text-anchor": "middle", "font-size": 11}, svg);
    t.textContent = (10 ** e).toPrecision(2);
  }
  for (let e = Math.ceil(y0 * 4) / 4; e <= y1; e += 0.25) {
    const t = el("text", {x: left - 6, y: sy(10 ** e) + 4, "text-anchor": "end", "font-size": 11}, svg);
    t.textContent = (10 ** e).toPrecision(3);
  }
  const label = el("text", {x: (left + right) / 2, y: bottom + 38, "text-anchor": "middle"}, svg);
  label.textContent = "days";
  const front = data.plan.front.map((i) => points[i]);
  el("polyline", {points: front.map((p) => sx(p.days) + "," + sy(second(p))).join(" "),
                  fill: "none", stroke: "#e8833a", "stroke-width": 2}, svg);
  const kinds = [...new Set(points.map((p) => p.hardware))];
  points.forEach((p) => {
    const dot = el("circle", {cx: sx(p.days), cy: sy(second(p)), r: p.on_front ? 7 : 4,
                              fill: palette[kinds.indexOf(p.hardware) % palette.length],
                              stroke: p.on_front ? "#1d2433" : "none"}, svg);
    dot.setAttribute("data-tip", p.slice + ": " + p.days.toFixed(1) + " days, " +
                     Math.round(p.chip_hours) + " chip-hours\n" + p.mesh + ", remat " + p.remat +
                     "\n" + p.estimate_command);
    const name = el("text", {x: sx(p.days) + 9, y: sy(second(p)) - 6, "font-size": 11}, svg);
    name.textContent = p.slice;
  });
}
const table = document.getElementById("points");
const order = data.plan.front.concat(points.map((_, i) => i).filter((i) => !data.plan.front.includes(i)));
for (const index of order) {
  const p = points[index];
  const row = table.insertRow();
  if (p.on_front) row.className = "front";
  const cells = [p.slice + (p.on_front ? " (front)" : ""), p.chips, p.days.toFixed(1),
                 Math.round(p.chip_hours), p.cost === null ? "-" : p.cost.toFixed(0),
                 p.tokens_per_s_per_chip.toFixed(0), p.step_time_s.toFixed(2),
                 p.mesh + ", per_device_batch_size " + p.per_device_batch_size + " x " +
                 p.gradient_accumulation_steps + ", remat " + p.remat + ", " + p.attention,
                 p.estimate_command + "\n" + p.maxtext_command];
  cells.forEach((value, column) => {
    const cell = row.insertCell();
    cell.textContent = value;
    if (column === 8) { cell.className = "args"; cell.style.whiteSpace = "pre-wrap"; }
  });
}
)js";

}  // namespace

std::string plan_html(const PlanResult& result, const std::string& command_line) {
  nlohmann::json data;
  data["title"] =
      "tpusim plan: " + result.model_name + ", " + tokens_text(result.request.tokens) + " tokens";
  data["command"] = command_line;
  data["plan"] = plan_json(result);
  return render_html_page({.title = data["title"], .css = kCss, .body = kBody, .script = kScript},
                          data);
}

}  // namespace tpusim
