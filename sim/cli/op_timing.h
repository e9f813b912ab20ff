// sim/cli/op_timing.h: one op timed alone, as `tpusim op` does, for the commands that time ops
// (op, validate --pairs).
//
// `args` are op keys (m n k for a matmul; bytes axes for a collective) and config key=value
// overrides (the slice, the mesh, the dtype). UserError naming an unknown kind or a bad key.
//
// Example:
//   nlohmann::json matmul = time_op("matmul", {"m=8192", "n=8192", "k=8192",
//                                              "compile_topology=v5e-1"}, MechanismSet());
//   matmul["seconds"];  matmul["percent_of_peak"];
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mechanisms.h"

namespace tpusim {

// kind: matmul, all_gather, reduce_scatter, all_reduce or all_to_all; `mechanisms` the cost
// mechanisms switched on. `quiet` loads the config without printing the keys it does not model
// (a caller timing many ops).
nlohmann::json time_op(const std::string& kind, const std::vector<std::string>& args,
                       const MechanismSet& mechanisms, bool quiet = false);

}  // namespace tpusim
