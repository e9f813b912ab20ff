// model/autodiff/remat_policy.h: what MaxText's remat_policy keeps of a decoder layer's forward
// activations for the backward pass.
//
// Inside the scanned decoder layers, a forward tensor with a checkpoint name (query_proj,
// key_proj, value_proj, qkv_proj, kv_proj, out_proj, context, mlpwi(_0/_1), mlpwo, moe_mlpwi*,
// moe_mlpwo, mla_q, mla_kv, decoder_layer_input) is kept on device, offloaded to host memory, or
// rematerialized (recomputed in backward) according to the policy; unnamed tensors are always
// recomputed unless the policy is "none". Outside the layers (embedding, head) nothing is
// rematerialized. Meanings follow docs/reference/maxtext.md §3 (remat_policy).
//
// Example:
//   RematPolicy policy = RematPolicy::from_config(config);       // remat_policy=save_qkv_proj
//   policy.decision("query_proj");  // RematDecision::kDevice
//   policy.decision("mlpwo");       // RematDecision::kRemat
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tpusim {

class Config;

enum class RematDecision { kRemat, kDevice, kOffload };

const char* remat_decision_name(RematDecision decision);

class RematPolicy {
 public:
  static RematPolicy from_config(const Config& config);

  // Decision for a layer tensor with checkpoint name `name` ("" = unnamed).
  RematDecision decision(const std::string& name) const;

  const std::string& policy_name() const { return policy_; }

 private:
  std::string policy_;
  bool save_everything_ = false;
  std::map<std::string, RematDecision> named_;
};

// Every checkpoint name the builder uses, for the custom policy's keys.
const std::vector<std::string>& checkpoint_names();

}  // namespace tpusim
