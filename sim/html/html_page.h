// sim/html/html_page.h: the frame of tpusim's self-contained HTML pages (estimate --html,
// explore --html): <head> with the title and the shared styles, the page's body, its data as a
// JSON block, and its script run with shared helpers in scope. No network: nothing is loaded.
//
// The page script sees: `data` (the JSON), `svgNS`, `palette` (10 colours), `el(name, attrs,
// parent)` (an SVG element), `gib(bytes)` and `seconds(s)` (formatted text), and `tips`: any
// element with a `data-tip` attribute shows it on hover in the #tip box, unless
// `tips.suppressed()` (a page may replace it, e.g. while dragging), `resourceColor(resource)` (one
// colour per resource in every chart: mxu, hbm, vpu, overhead, ici, dcn, d2d, sparsecore, host,
// ...) and `legend(container, resources)`, which names each resource by the data's
// "resource_names" object (resource -> name). SVGs of class "chart" scale down to narrow windows
// (give them a viewBox). After the script has run, <body> carries data-rendered="1" (the browser
// test's sign that no error stopped it) and data-scroll-width / data-view-width (the page's width
// and the window's: equal or less when nothing scrolls sideways).
//
// Example:
//   render_html_page({.title = "tpusim step", .css = "", .body = "<svg id=\"a\"></svg>",
//                     .script = "el('circle', {r: 3}, document.getElementById('a'));"},
//                    nlohmann::json{{"x", 1}});
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tpusim {

struct HtmlPage {
  std::string title;   // plain text (escaped here)
  std::string css;     // page-specific rules, after the shared ones
  std::string body;    // the page's elements
  std::string script;  // the page's drawing code
};

std::string render_html_page(const HtmlPage& page, const nlohmann::json& data);

// `data` as JSON text safe inside a <script> element: every '<', '>' and '&' written as \u003c,
// \u003e, \u0026, so no value (a run_name of "<!--<script>" or "</script>") can end the element or
// start a comment that swallows the page's script; JSON.parse reads back the same values. Every
// page writer embeds its data through this (render_html_page does).
std::string json_for_script(const nlohmann::json& data);

}  // namespace tpusim
