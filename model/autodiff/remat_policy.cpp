#include "model/autodiff/remat_policy.h"

#include <vector>

#include "common/error.h"
#include "model/config.h"

namespace tpusim {
namespace {

const std::vector<std::string> kQkv = {"query_proj", "key_proj", "value_proj", "qkv_proj",
                                       "kv_proj",    "mla_q",    "mla_kv"};
const std::vector<std::string> kMlpIn = {"mlpwi",     "mlpwi_0",     "mlpwi_1",
                                         "moe_mlpwi", "moe_mlpwi_0", "moe_mlpwi_1"};
const std::vector<std::string> kMlpOut = {"mlpwo", "moe_mlpwo"};

void mark(std::map<std::string, RematDecision>& named, const std::vector<std::string>& names,
          RematDecision decision) {
  for (const std::string& name : names) {
    named[name] = decision;
  }
}

}  // namespace

const char* remat_decision_name(RematDecision decision) {
  switch (decision) {
    case RematDecision::kRemat:
      return "remat";
    case RematDecision::kDevice:
      return "device";
    case RematDecision::kOffload:
      return "offload";
  }
  return "?";
}

const std::vector<std::string>& checkpoint_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = {"decoder_layer_input", "context", "out_proj"};
    all.insert(all.end(), kQkv.begin(), kQkv.end());
    all.insert(all.end(), kMlpIn.begin(), kMlpIn.end());
    all.insert(all.end(), kMlpOut.begin(), kMlpOut.end());
    return all;
  }();
  return names;
}

RematPolicy RematPolicy::from_config(const Config& config) {
  RematPolicy policy;
  policy.policy_ = config.get_string("remat_policy");
  const std::string& name = policy.policy_;
  auto& named = policy.named_;
  const auto device = RematDecision::kDevice;
  // The scan carry is saved by every built-in policy (it is the layer's input).
  named["decoder_layer_input"] = device;
  if (name == "none") {
    policy.save_everything_ = true;
  } else if (name == "minimal" || name == "minimal_with_quantization") {
    mark(named, kQkv, device);
    mark(named, {"out_proj"}, device);
    mark(named, kMlpIn, device);
    mark(named, kMlpOut, device);
  } else if (name == "minimal_with_context" || name == "minimal_with_context_and_quantization" ||
             name == "minimal_flash") {
    // minimal_flash (MaxText's GPU policy): dots without batch dims plus the attention output
    // ("context"), i.e. minimal_with_context.
    mark(named, kQkv, device);
    mark(named, {"out_proj", "context"}, device);
    mark(named, kMlpIn, device);
    mark(named, kMlpOut, device);
  } else if (name == "save_dot_with_context_except_mlp") {
    mark(named, kQkv, device);
    mark(named, {"out_proj", "context"}, device);
  } else if (name == "save_dot_except_mlpwi") {
    mark(named, kQkv, device);
    mark(named, {"out_proj"}, device);
    mark(named, kMlpOut, device);
  } else if (name == "save_dot_except_mlp") {
    mark(named, kQkv, device);
    mark(named, {"out_proj"}, device);
  } else if (name == "save_qkv_proj") {
    mark(named, kQkv, device);
  } else if (name == "save_out_proj") {
    mark(named, {"out_proj"}, device);
  } else if (name == "qkv_proj_offloaded") {
    mark(named, {"query_proj", "key_proj", "value_proj", "qkv_proj", "kv_proj"},
         RematDecision::kOffload);
  } else if (name == "minimal_offloaded") {
    mark(named, kQkv, RematDecision::kOffload);
    mark(named, {"out_proj"}, RematDecision::kOffload);
    mark(named, kMlpIn, RematDecision::kOffload);
    mark(named, kMlpOut, RematDecision::kOffload);
  } else if (name == "custom") {
    for (const std::string& key : checkpoint_names()) {
      if (!config.has(key)) {
        continue;
      }
      const std::string value = config.get_string(key);
      if (value != "remat" && value != "device" && value != "offload") {
        throw UserError(key + ": '" + value + "' is not remat, device or offload");
      }
      // The layer input is the argument of the checkpointed layer, which jax.checkpoint always
      // keeps for the backward pass: "remat" of it keeps it on device.
      const bool carry = key == "decoder_layer_input";
      named[key] = value == "device" || (carry && value == "remat") ? RematDecision::kDevice
                   : value == "offload"                             ? RematDecision::kOffload
                                                                    : RematDecision::kRemat;
    }
  }
  // "full": only the carry, set above.
  return policy;
}

RematDecision RematPolicy::decision(const std::string& name) const {
  if (save_everything_) {
    return RematDecision::kDevice;
  }
  const auto found = named_.find(name);
  return found == named_.end() ? RematDecision::kRemat : found->second;
}

}  // namespace tpusim
