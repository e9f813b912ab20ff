// model/builder/initializers.h: how MaxText initializes each parameter, and where it puts the
// attention's 1/sqrt(head_dim).
//
// MaxText draws every kernel from jax's variance_scaling(scale, "fan_in", distribution) with the
// fan-in taken over the kernel's INPUT axes (the axes the matmul contracts), so a query kernel
// [embed, heads, head_dim] has fan-in embed, not embed x heads. Its default Attention applies no
// 1/sqrt(head_dim) to the logits at run time: the factor is folded into the query kernel's
// initializer instead (kernel_init / sqrt(head_dim)), which a model then learns around. The
// families that normalize or scale queries at run time (qk-norm, query_pre_attn_scalar, GPT-3's
// own attention, MLA's softmax_scale) initialize the query like any other kernel. The facts and
// their sources are in docs/reference/numerics.md, part C.
//
// Example (tiny-llama: embed 64, 4 query heads, 2 kv heads, head_dim 16, mlp 128):
//   QueryScaling scaling = query_scaling_from_config(config, dims.family(), 16);  // runtime 1,
//   divisor 4 ParameterInit q = kernel_init(64, scaling.init_divisor); q.stddev; // 0.125 / 4 =
//   0.03125 kernel_init(128).stddev;                           // mlp/wo: 1 / sqrt(128) = 0.0884
#pragma once

#include <cstdint>
#include <string>

namespace tpusim {

class Config;
struct DecoderFamily;

enum class InitDistribution {
  kConstant,         // every element = value (norm scales 1, biases 0)
  kNormal,           // N(0, stddev^2)
  kTruncatedNormal,  // N(0, sigma^2) cut at +-2 sigma, sigma chosen so that the std is stddev
};

// The standard deviation of N(0, 1) truncated to [-2, 2] (jax's variance_scaling divides its
// target std by this, so that the truncated draw has the target std).
inline constexpr double kTruncatedNormalStd = 0.87962566103423978;

struct ParameterInit {
  InitDistribution distribution = InitDistribution::kConstant;
  double value = 0;   // kConstant
  double stddev = 0;  // the standard deviation of the drawn values (after truncation)
  double fan_in = 0;  // variance scaling: the fan-in it used (0: not variance scaling)
  // "truncated_normal(fan_in=64) / 4 -> std 0.03125", for messages and tests.
  std::string describe() const;
};

// A constant (norm scales, biases).
ParameterInit constant_init(double value);
// nn.initializers.normal(stddev): MaxText's token (and GPT-3 position) embedding tables.
ParameterInit normal_init(double stddev);
// variance_scaling(1.0, "fan_in", distribution) divided by `divisor`: std sqrt(1 / fan_in) /
// divisor.
ParameterInit kernel_init(double fan_in, double divisor = 1,
                          InitDistribution distribution = InitDistribution::kTruncatedNormal);

// Where a decoder block's attention scales its logits q.k.
struct QueryScaling {
  double runtime_scale = 1;  // multiplies q.k in the attention op
  double init_divisor = 1;   // divides the query kernel's initializer
  std::string reason;        // "default Attention: folded into the query init", ...
};

// MaxText's use_qk_norm: a per-head RMSNorm of the query and the key (qwen3; always on in the
// full-attention layers of qwen3_next and qwen3_5: DecoderFamily::always_qk_norm).
bool qk_norm_from_config(const Config& config, const DecoderFamily& family);

// For the attention of `config`'s decoder block (`family`, ModelDims::family) whose query heads
// are `head_dim` wide (MLA reads its own dims from the config).
QueryScaling query_scaling_from_config(const Config& config, const DecoderFamily& family,
                                       int64_t head_dim);

}  // namespace tpusim
