#include "sim/estimate/compare_html.h"

#include "sim/html/html_page.h"

namespace tpusim {
namespace {

constexpr const char* kCss = R"css(
  table.side td, table.side th { padding: 2px 12px 2px 0; text-align: right; }
  table.side td:first-child, table.side th:first-child { text-align: left; color: #5b6477; }
  pre.config { margin: 2px 0 8px; }
)css";

constexpr const char* kBody = R"html(<div class="verdict" id="verdict" hidden></div>
<h1>tpusim compare: A against B</h1>
<div>A</div><pre class="config" data-config="a" id="config-a"></pre>
<div>B</div><pre class="config" data-config="b" id="config-b"></pre>
<div class="wide"><table class="side" id="summary"></table></div>
<h2>Where each step goes (one time scale)</h2>
<svg id="breakdown" class="chart" viewBox="0 0 1000 76" width="1000" height="76"></svg>
<div class="legend" id="breakdown-legend"></div>
<h2>Breakdown (s per step)</h2>
<div class="wide"><table class="ops" id="breakdown-table"></table></div>
<h2>HBM per device at the peak, against the usable HBM (dashed)</h2>
<svg id="memory" class="chart" viewBox="0 0 1000 76" width="1000" height="76"></svg>
<h2>Compute ops whose time changed most (s per step)</h2>
<div class="wide"><table class="ops" id="ops"></table></div>
)html";

// Draws the page from `data` (see compare_html below for its fields).
constexpr const char* kScript = R"js(
document.getElementById("config-a").textContent = data.a.run;
document.getElementById("config-b").textContent = data.b.run;
if (data.verdict) {
  const verdict = document.getElementById("verdict");
  verdict.textContent = data.verdict;
  verdict.hidden = false;
}
function row(table, cells, header) {
  const tr = table.insertRow();
  for (const text of cells) {
    const cell = document.createElement(header ? "th" : "td");
    cell.textContent = text;
    tr.appendChild(cell);
  }
  return tr;
}
const summary = document.getElementById("summary");
row(summary, ["", "A", "B", "B vs A"], true);
for (const cells of data.summary) row(summary, cells, false);

// Both breakdowns on the longer step's scale, a bar each; one colour per resource.
{
  const svg = document.getElementById("breakdown");
  const longest = Math.max(data.a.estimate.step_time_s, data.b.estimate.step_time_s, 1e-12);
  ["a", "b"].forEach((side, index) => {
    const y = 4 + index * 36;
    const label = el("text", {x: 0, y: y + 20, "font-size": 14, fill: "#1d2433"}, svg);
    label.textContent = side.toUpperCase();
    let x = 24;
    for (const part of data.breakdown) {
      const w = part[side] / longest * 970;
      if (w <= 0) continue;
      const rect = el("rect", {x: x, y: y, width: w, height: 30, fill: resourceColor(part.resource)},
                      svg);
      rect.dataset.resource = part.resource;
      rect.dataset.tip = side.toUpperCase() + ": " + part.label + " " + part[side].toFixed(4) + " s";
      x += w;
    }
  });
  legend(document.getElementById("breakdown-legend"),
         [...new Set(data.breakdown.map((p) => p.resource))]);
  const table = document.getElementById("breakdown-table");
  row(table, ["", "A", "B", "B - A"], true);
  for (const part of data.breakdown) {
    const change = part.b - part.a;
    row(table, [part.label, part.a.toFixed(4), part.b.toFixed(4),
                (change >= 0 ? "+" : "") + change.toFixed(4)], false);
  }
}

// Peak HBM per device of each, against its usable HBM.
{
  const svg = document.getElementById("memory");
  const high = Math.max(data.a.estimate.hbm_peak_bytes_per_device,
                        data.b.estimate.hbm_peak_bytes_per_device,
                        data.a.estimate.hbm_capacity_bytes, data.b.estimate.hbm_capacity_bytes, 1);
  ["a", "b"].forEach((side, index) => {
    const report = data[side].estimate;
    const y = 4 + index * 36;
    const label = el("text", {x: 0, y: y + 20, "font-size": 14, fill: "#1d2433"}, svg);
    label.textContent = side.toUpperCase();
    const w = report.hbm_peak_bytes_per_device / high * 970;
    const bar = el("rect", {x: 24, y: y, width: w, height: 30,
                            fill: report.fits ? "#3fa672" : "#c94f6d"}, svg);
    bar.dataset.tip = side.toUpperCase() + ": peak " + gib(report.hbm_peak_bytes_per_device) +
                      " of " + gib(report.hbm_capacity_bytes) + (report.fits ? " (fits)" : " (OUT OF MEMORY)");
    const cap = 24 + report.hbm_capacity_bytes / high * 970;
    el("line", {x1: cap, x2: cap, y1: y - 2, y2: y + 32, stroke: "#1d2433", "stroke-width": 2,
                "stroke-dasharray": "4 3"}, svg);
  });
}

{
  const table = document.getElementById("ops");
  row(table, ["region: op", "A", "B", "B - A"], true);
  for (const op of data.op_changes) {
    const change = op.b - op.a;
    row(table, [op.region + ": " + op.op, op.a.toFixed(4), op.b.toFixed(4),
                (change >= 0 ? "+" : "") + change.toFixed(4)], false);
  }
}
)js";

}  // namespace

std::string compare_html(const EstimateComparison& comparison, const std::string& label_a,
                         const std::string& label_b, size_t top_ops) {
  nlohmann::json data = comparison_json(comparison, label_a, label_b, top_ops);
  data["summary"] = summary_rows(comparison);
  nlohmann::json names = nlohmann::json::object();
  for (const auto& part : data["breakdown"]) {
    if (!names.contains(part["resource"].get<std::string>())) {
      names[part["resource"].get<std::string>()] = part["label"];
    }
  }
  data["resource_names"] = names;
  if (!comparison.a.fits || !comparison.b.fits) {
    const bool both = !comparison.a.fits && !comparison.b.fits;
    data["verdict"] = std::string("OUT OF MEMORY: ") +
                      (both ? "A and B do" : (!comparison.a.fits ? "A does" : "B does")) +
                      " not fit in HBM";
  }
  return render_html_page({"tpusim compare", kCss, kBody, kScript}, data);
}

}  // namespace tpusim
