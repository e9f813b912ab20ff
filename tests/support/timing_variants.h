// tests/support/timing_variants.h: the four timing variants the explorer times on one program
// (SparseCore collective offload off or on, times collective matmul off or on), for tests that
// hold a bound, a cache or a relabeled mesh to the simulator on each of them.
//
// Each variant is `base` with those two switches set and per-op details off; its label names
// the switches for SCOPED_TRACE.
//
// Example:
//   for (const TimingVariant& variant : timing_variants(base)) {
//     SCOPED_TRACE(variant.label);  // "offload 1 cm 0"
//     EXPECT_LE(simulator.chain_bound(variant.options),
//               simulator.run(variant.options).step_seconds);
//   }
#pragma once

#include <string>
#include <vector>

#include "sim/perf/step_simulator.h"

namespace tpusim::testing {

struct TimingVariant {
  PerfOptions options;
  std::string label;  // "offload 0 cm 1"
};

inline std::vector<TimingVariant> timing_variants(const PerfOptions& base) {
  std::vector<TimingVariant> variants;
  for (const bool offload : {false, true}) {
    for (const bool collective_matmul : {false, true}) {
      TimingVariant variant{base, "offload " + std::to_string(static_cast<int>(offload)) + " cm " +
                                      std::to_string(static_cast<int>(collective_matmul))};
      variant.options.record_details = false;
      variant.options.sparse_core_offload = offload;
      variant.options.collective_matmul = collective_matmul;
      variants.push_back(variant);
    }
  }
  return variants;
}

}  // namespace tpusim::testing
