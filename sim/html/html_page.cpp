#include "sim/html/html_page.h"

namespace tpusim {
namespace {

constexpr const char* kSharedCss = R"css(
  body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2433; max-width: 1400px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 15px; margin: 22px 0 6px; }
  .legend span { display: inline-block; margin-right: 14px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
  #tip { position: fixed; pointer-events: none; background: #1d2433; color: #fff; padding: 4px 8px;
         border-radius: 4px; font-size: 12px; display: none; white-space: pre; }
  pre { background: #f4f6f9; padding: 8px; white-space: pre-wrap; word-break: break-all; }
  button { margin-right: 6px; }
  .note { color: #5b6477; font-size: 12px; }
  svg.chart { display: block; width: 100%; max-width: 1000px; height: auto; }
  .verdict { background: #c94f6d; color: #fff; padding: 6px 10px; font-weight: 600; margin: 6px 0; }
  .wide { overflow-x: auto; max-width: 100%; }
  table.ops { border-collapse: collapse; font-size: 12px; }
  table.ops th, table.ops td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #e3e6ec; }
  table.ops th:first-child, table.ops td:first-child { text-align: left; }
  @media (max-width: 600px) { body { margin: 8px; } }
)css";

constexpr const char* kSharedScript = R"js(
const data = JSON.parse(document.getElementById("data").textContent);
const svgNS = "http://www.w3.org/2000/svg";
const palette = ["#3b6fd6", "#e8833a", "#3fa672", "#c94f6d", "#8a63c9", "#d4b13b", "#4bb3c4",
                 "#7f8694", "#b86b3c", "#5a8f3c"];
function el(name, attrs, parent) {
  const node = document.createElementNS(svgNS, name);
  for (const key in attrs) node.setAttribute(key, attrs[key]);
  if (parent) parent.appendChild(node);
  return node;
}
function gib(bytes) { return (bytes / 2 ** 30).toFixed(2) + " GiB"; }
function seconds(value) {
  if (value >= 1) return value.toFixed(3) + " s";
  if (value >= 1e-3) return (value * 1e3).toFixed(3) + " ms";
  return (value * 1e6).toFixed(1) + " us";
}
// One colour per resource in every chart of every page: a compute op by what bounds it, a link by
// its kind; `legend` lists the resources a chart uses.
const resourceColors = {mxu: "#3b6fd6", hbm: "#e8833a", vpu: "#3fa672", overhead: "#7f8694",
                        shared: "#b86b3c", ici: "#8a63c9", nvlink: "#8a63c9", d2d: "#4bb3c4",
                        sparsecore: "#d4b13b", dcn: "#c94f6d", infiniband: "#c94f6d",
                        host: "#5a8f3c", stage: "#6d7fa8", bubble: "#b9bfca", idle: "#dfe3ea"};
// Each resource's name for legends, from the page's data (written by the render functions of
// sim/perf/timing_labels.h); the resource itself where the page names none.
const resourceNames = data.resource_names || {};
function resourceColor(resource) { return resourceColors[resource] || "#7f8694"; }
function legend(container, resources) {
  for (const resource of resources) {
    const item = document.createElement("span");
    item.dataset.resource = resource;
    item.innerHTML = '<i style="background:' + resourceColor(resource) + '"></i>';
    item.appendChild(document.createTextNode(resourceNames[resource] || resource));
    container.appendChild(item);
  }
}
const tips = {suppressed: () => false};
{
  const tip = document.getElementById("tip");
  document.addEventListener("mousemove", (event) => {
    const text = event.target.dataset ? event.target.dataset.tip : undefined;
    if (!text || tips.suppressed()) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.left = (event.clientX + 12) + "px";
    tip.style.top = (event.clientY + 12) + "px";
    tip.style.display = "block";
  });
}
)js";

std::string html_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string json_for_script(const nlohmann::json& data) {
  // In JSON text '<', '>' and '&' occur only inside strings, where \u003c, \u003e and \u0026
  // read back as the same characters.
  const std::string json = data.dump();
  std::string out;
  out.reserve(json.size());
  for (const char character : json) {
    switch (character) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += character;
    }
  }
  return out;
}

std::string render_html_page(const HtmlPage& page, const nlohmann::json& data) {
  std::string html =
      "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>";
  html += html_escape(page.title);
  html += "</title>\n<style>";
  html += kSharedCss;
  html += page.css;
  html += "</style>\n</head>\n<body>\n";
  html += page.body;
  html += "\n<div id=\"tip\"></div>\n<script type=\"application/json\" id=\"data\">";
  html += json_for_script(data);
  html += "</script>\n<script>\n\"use strict\";\n(() => {";
  html += kSharedScript;
  html += page.script;
  // The page's width against the window's, for the browser test's "no horizontal scroll".
  html +=
      "\ndocument.body.dataset.scrollWidth = document.documentElement.scrollWidth;"
      "\ndocument.body.dataset.viewWidth = window.innerWidth;"
      "\ndocument.body.dataset.rendered = \"1\";\n})();\n</script>\n</body>\n</html>\n";
  return html;
}

}  // namespace tpusim
