#include "model/builder/initializers.h"

#include <cmath>
#include <cstdio>

#include "model/config.h"
#include "model/decoder_family.h"

namespace tpusim {

std::string ParameterInit::describe() const {
  char text[160];
  switch (distribution) {
    case InitDistribution::kConstant:
      std::snprintf(text, sizeof(text), "constant %g", value);
      break;
    case InitDistribution::kNormal:
      std::snprintf(text, sizeof(text), "normal(fan_in=%g) -> std %g", fan_in, stddev);
      break;
    case InitDistribution::kTruncatedNormal:
      std::snprintf(text, sizeof(text), "truncated_normal(fan_in=%g) -> std %g", fan_in, stddev);
      break;
  }
  return text;
}

ParameterInit constant_init(double value) {
  ParameterInit init;
  init.distribution = InitDistribution::kConstant;
  init.value = value;
  return init;
}

ParameterInit normal_init(double stddev) {
  ParameterInit init;
  init.distribution = InitDistribution::kNormal;
  init.stddev = stddev;
  return init;
}

ParameterInit kernel_init(double fan_in, double divisor, InitDistribution distribution) {
  ParameterInit init;
  init.distribution = distribution;
  init.fan_in = fan_in;
  init.stddev = std::sqrt(1.0 / fan_in) / divisor;
  return init;
}

bool qk_norm_from_config(const Config& config, const DecoderFamily& family) {
  // Qwen3-Next's full-attention layers always normalize q and k (Hugging Face
  // Qwen3NextAttention: q_norm, k_norm); its preset does not set use_qk_norm.
  return config.get_bool("use_qk_norm") || family.always_qk_norm;
}

QueryScaling query_scaling_from_config(const Config& config, const DecoderFamily& family,
                                       int64_t head_dim) {
  const double inverse_sqrt = 1.0 / std::sqrt(static_cast<double>(head_dim));
  QueryScaling scaling;
  if (family.always_mla() || config.get_string("attention_type") == "mla") {
    // MLA: softmax_scale = qk_head_dim^-0.5, times mscale^2 when the YaRN context extension is on
    // (max_position_embeddings > original_max_position_embeddings), applied to the query.
    const double qk_head_dim = static_cast<double>(config.get_int("qk_nope_head_dim") +
                                                   config.get_int("qk_rope_head_dim"));
    scaling.runtime_scale = 1.0 / std::sqrt(qk_head_dim);
    if (config.get_int("max_position_embeddings") >
        config.get_int("original_max_position_embeddings")) {
      const double mscale =
          0.1 * config.get_float("mscale") * std::log(config.get_float("rope_factor")) + 1.0;
      scaling.runtime_scale *= mscale * mscale;
    }
    scaling.reason = "MLA: softmax_scale at run time";
  } else if (family.query_scale == QueryScale::kRuntimeGpt3) {
    scaling.runtime_scale = inverse_sqrt;
    scaling.reason = "GPT-3 attention: query / sqrt(head_dim) at run time";
  } else if (qk_norm_from_config(config, family)) {
    scaling.runtime_scale = inverse_sqrt;
    scaling.reason = "qk-norm: query_pre_attn_scalar = head_dim^-0.5 at run time";
  } else if (family.query_scale == QueryScale::kRuntimePreAttnScalar) {
    scaling.runtime_scale = inverse_sqrt;
    scaling.reason = "query_pre_attn_scalar = head_dim^-0.5 at run time";
  } else {
    scaling.init_divisor = std::sqrt(static_cast<double>(head_dim));
    scaling.reason = "default Attention: 1/sqrt(head_dim) folded into the query init";
  }
  return scaling;
}

}  // namespace tpusim
