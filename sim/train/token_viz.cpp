#include "sim/train/token_viz.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "sim/html/html_page.h"

namespace tpusim {
namespace {

constexpr const char* kCss = R"CSS(
  .controls { margin: 8px 0 12px; }
  .legend { display: inline-block; vertical-align: middle; width: 220px; height: 12px;
            margin: 0 6px; border: 1px solid #ccc;
            background: linear-gradient(to right, hsl(0,75%,62%), hsl(60,75%,70%), hsl(120,55%,62%)); }
  .seq { font-family: ui-monospace, monospace; font-size: 13px; line-height: 22px;
         border: 1px solid #dde; padding: 6px 8px; margin: 0 0 10px; white-space: pre-wrap;
         word-break: break-all; }
  .seq h3 { font: 600 12px sans-serif; margin: 0 0 4px; color: #555; }
  .tok { padding: 1px 0; border-radius: 2px; }
  .tok:hover { outline: 1px solid #1d2433; }
  #curve { border: 1px solid #dde; }
)CSS";

constexpr const char* kBody = R"HTML(
<h1 id="title"></h1>
<p>Each token of a fixed sample of held-out sequences, coloured by the probability the model gave
it at the chosen evaluation step (hover a token for its probability and log-probability).</p>
<div class="controls">
  <label>step <select id="step"></select></label>
  <span style="margin-left:16px">p &le; 0.001</span><span class="legend"></span><span>p = 1</span>
  <span id="mean" style="margin-left:16px"></span>
</div>
<svg id="curve" width="640" height="200"></svg>
<div id="sequences"></div>
)HTML";

// Draws the loss curves into #curve, the heatmaps into #sequences; the selector switches steps.
constexpr const char* kScript = R"JS(
document.getElementById("title").textContent = data.title;
const select = document.getElementById("step");
data.steps.forEach((s, i) => {
  const option = document.createElement("option");
  option.value = i; option.textContent = s.step; select.appendChild(option);
});
select.value = data.steps.length - 1;

// On a log scale: a model at a few nats per token gives most tokens p < 0.1, which a linear scale
// would paint all red. p <= 0.001 red, 0.03 yellow, 1 green.
function colour(p) {
  const x = Math.min(1, Math.max(0, 1 + Math.log10(Math.max(p, 1e-9)) / 3));
  return "hsl(" + (120 * x).toFixed(0) + ",70%," + (62 + 8 * Math.sin(Math.PI * x)).toFixed(0) + "%)";
}

const curve = document.getElementById("curve");
const W = 640, H = 200, pad = 36;
// A non-finite loss (null in the data) is left out of the curves.
data.loss = data.loss.filter(p => p[1] !== null);
data.eval_loss = data.eval_loss.filter(p => p[1] !== null);
const points = data.loss.concat(data.eval_loss);
const steps = points.map(p => p[0]), losses = points.map(p => p[1]);
const x0 = Math.min(...steps), x1 = Math.max(...steps);
const low = Math.min(...losses), high = Math.max(...losses), margin = 0.05 * (high - low || 1);
const y0 = low - margin, y1 = high + margin;
const sx = s => pad + (W - 2 * pad) * (s - x0) / Math.max(1, x1 - x0);
const sy = v => H - pad + (2 * pad - H) * (v - y0) / Math.max(1e-9, y1 - y0);
el("line", {x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#888"}, curve);
el("line", {x1: pad, y1: pad, x2: pad, y2: H - pad, stroke: "#888"}, curve);
[low, high].forEach(v => {
  const t = el("text", {x: 4, y: sy(v) + 4, "font-size": 10}, curve); t.textContent = v.toFixed(2);
});
[[x0, "start"], [x1, "end"]].forEach(([s, anchor]) => {
  const t = el("text", {x: sx(s), y: H - pad + 14, "font-size": 10, "text-anchor": anchor}, curve);
  t.textContent = "step " + s;
});
[[data.loss, palette[0], "training loss"], [data.eval_loss, palette[1], "eval loss"]].forEach(([series, c, name], i) => {
  if (series.length === 0) return;
  el("polyline", {points: series.map(p => sx(p[0]) + "," + sy(p[1])).join(" "), fill: "none",
                  stroke: c, "stroke-width": 1.5}, curve);
  series.forEach(p => el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2, fill: c,
                                    "data-tip": name + " " + p[1].toFixed(4) + " at step " + p[0]}, curve));
  const t = el("text", {x: W - pad - 110 + 70 * i, y: 14, "font-size": 11, fill: c}, curve);
  t.textContent = name;
});
const marker = el("line", {y1: pad, y2: H - pad, stroke: "#1d2433", "stroke-dasharray": "3 3"}, curve);

const container = document.getElementById("sequences");
const spans = data.pieces.map((pieces, s) => {
  const div = document.createElement("div"); div.className = "seq";
  const h = document.createElement("h3"); h.textContent = "held-out sequence " + (s + 1); div.appendChild(h);
  const row = pieces.map(text => {
    const span = document.createElement("span"); span.className = "tok"; span.textContent = text;
    div.appendChild(span); return span;
  });
  container.appendChild(div);
  return row;
});

function show(index) {
  const step = data.steps[index];
  let sum = 0, count = 0;
  spans.forEach((row, s) => row.forEach((span, t) => {
    const lp = step.log_probs[s][t];
    if (lp === null) { span.style.background = "#eee"; span.dataset.tip = "not computed"; return; }
    const p = Math.exp(lp);
    span.style.background = colour(p);
    span.dataset.tip = JSON.stringify(data.pieces[s][t]) + "  p = " + p.toFixed(4) +
                       "  log p = " + lp.toFixed(3) + "  (step " + step.step + ")";
    sum += lp; count += 1;
  }));
  document.getElementById("mean").textContent =
      "mean log p " + (count ? (sum / count).toFixed(3) : "-") + " over " + count + " tokens";
  marker.setAttribute("x1", sx(step.step)); marker.setAttribute("x2", sx(step.step));
}
select.addEventListener("change", () => show(Number(select.value)));
if (data.steps.length > 0) show(data.steps.length - 1);
)JS";

}  // namespace

std::string byte_token_text(int32_t token) {
  if (token == '\n') {
    return "\u23ce\n";
  }
  if (token == '\t') {
    return "\u21e5";
  }
  if (token >= 32 && token < 127) {
    return std::string(1, static_cast<char>(token));
  }
  char text[8];
  std::snprintf(text, sizeof text, "\\x%02x", static_cast<unsigned>(token & 0xff));
  return text;
}

std::string render_token_viz(const TokenViz& viz) {
  nlohmann::json steps = nlohmann::json::array();
  for (const TokenViz::Step& step : viz.steps) {
    nlohmann::json sequences = nlohmann::json::array();
    for (const std::vector<float>& row : step.log_probs) {
      nlohmann::json values = nlohmann::json::array();
      for (const float value : row) {
        // NaN (a token no device computed) is not JSON: null. Rounded to keep the page small.
        values.push_back(std::isnan(value) ? nlohmann::json()
                                           : nlohmann::json(std::round(value * 1e4) / 1e4));
      }
      sequences.push_back(values);
    }
    steps.push_back({{"step", step.step}, {"log_probs", sequences}});
  }
  const nlohmann::json data = {{"title", viz.title},
                               {"pieces", viz.pieces},
                               {"steps", steps},
                               {"loss", viz.loss},
                               {"eval_loss", viz.eval_loss}};
  return render_html_page({.title = viz.title, .css = kCss, .body = kBody, .script = kScript},
                          data);
}

}  // namespace tpusim
