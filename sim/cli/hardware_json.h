// sim/cli/hardware_json.h: what `topology` and `hw` print under --json, as functions, for the CLI
// and the Python module (python/), like sim/cli/command_json.h (apart from it: hw/topology.h and
// the timing model's headers both name a LinkKind).
//
// Example:
//   topology_json(parse_slice("v5p-128"))["bisection_bandwidth_tbps"];
//   hw_json("v5p")["specs"]["peak_bf16_tflops"]["source"];
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "hw/slice.h"

namespace tpusim {

// `tpusim topology SLICE --num-slices N --json` of a parsed slice (parse_slice).
nlohmann::json topology_json(const Slice& slice);

// `tpusim hw [CHIP] --json`: one chip, or the list of every chip when `chip_name` is empty.
nlohmann::json hw_json(const std::string& chip_name);

}  // namespace tpusim
