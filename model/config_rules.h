// model/config_rules.h: the semantic checks a loaded config must pass.
//
// Types come from base.yml; this file adds what a type cannot say: allowed values of string keys
// (remat_policy, attention, dtype, ...), ranges of numbers (dims must be positive, and absurd sizes
// such as base_emb_dim=10000000 are refused), and checks across keys (top-k <= experts, query heads
// a multiple of kv heads). Each failure is a UserError naming the key and the value.
//
// Example:
//   validate_config(config);  // throws "remat_policy: 'ful' is not one of full, minimal, ..."
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim {

class Config;

// Throws UserError on the first violated rule.
void validate_config(const Config& config);

// The keys the rules mention (a test checks they all exist in base.yml).
std::vector<std::string> config_rule_keys();

// A key MaxText leaves None until it is set to a positive whole number (local_sa_block_q, ...):
// 0 for None (or null), else the number. UserError naming the key for anything else.
int64_t optional_positive_int(const Config& config, const std::string& key);

// Allowed values of an enumerated string key, or empty when the key is not enumerated.
std::vector<std::string> allowed_values(const std::string& key);

}  // namespace tpusim
