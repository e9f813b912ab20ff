// sim/estimate/compare_html.h: one self-contained HTML page for two estimates side by side
// (`tpusim compare ... --html compare.html`): both configurations, the summary table, the two
// steps' breakdowns on one time scale and their peak HBM against the usable HBM (one colour per
// resource, as on the estimate page), and the compute ops whose time changed most.
//
// Example:
//   write_file_atomically("compare.html",
//                         compare_html(compare_estimates(a, b), "remat_policy=full", "...", 15));
// After its script has run, <body> carries data-rendered="1"; each configuration is a
// <pre data-config="a"> (and "b") holding how it was run, which the browser test checks.
#pragma once

#include <string>

#include "sim/estimate/estimate_comparison.h"

namespace tpusim {

std::string compare_html(const EstimateComparison& comparison, const std::string& label_a,
                         const std::string& label_b, size_t top_ops);

}  // namespace tpusim
