// sim/explore/explore_html.h: one self-contained HTML page for one search (`tpusim explore
// --html explore.html`): what was searched and pruned, the top N as a table (with the command that
// reproduces each), and a scatter of the evaluated candidates (a uniform sample when there are
// many): tokens/s per chip against peak HBM per device, those that fit and those that do not, the
// usable HBM as a line, the Pareto front (no other candidate both faster and smaller) marked, the
// top N ringed. No network: inline SVG, CSS and script, the data as a JSON block.
//
// Example:
//   ExploreOptions options;  options.max_samples = 20000;
//   write_file_atomically("explore.html", explore_html(explore(config, options), "tpusim explore
//   ..."));
// After its script has run, <body> carries data-rendered="1" and every plotted candidate is a
// <circle class="sample"> and every top-N candidate a <circle class="top-ring">, which the
// browser test checks.
#pragma once

#include <string>

#include "sim/explore/explorer.h"

namespace tpusim {

std::string explore_html(const ExploreResult& result, const std::string& command_line);

}  // namespace tpusim
