// sim/estimate/step_html.h: one self-contained HTML page for one estimate (`tpusim estimate
// --html step.html`): the summary, where the step goes (breakdown bar), HBM per device at the peak
// by kind against the capacity and at every checkpoint of the step (sim/memory/memory_model.h), the
// timeline of the simulated iterations with one lane per
// resource (sim/estimate/trace_lanes.h; wheel to zoom, drag to pan, hover for an op's details),
// and the config. No network: inline SVG, CSS and script; the data is a JSON block in the page.
//
// Example:
//   write_file_atomically("step.html", step_html(estimate_config(config), "model_name=..."));
// After its script has run, the page's <body> carries data-rendered="1" and every lane is an SVG
// group <g class="lane" data-lane="ICI fsdp">, which the browser test checks.
#pragma once

#include <string>

#include "sim/estimate/estimate.h"

namespace tpusim {

std::string step_html(const Estimate& estimate, const std::string& command_line);

}  // namespace tpusim
