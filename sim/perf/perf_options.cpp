#include <algorithm>
#include <string>

#include "common/lowercase.h"
#include "hw/chip_spec.h"
#include "hw/matmul_format.h"
#include "model/config.h"
#include "model/config_rules.h"
#include "sim/perf/step_simulator.h"

namespace tpusim {

PerfOptions perf_options_from_config(const Config& config, const ChipSpec& chip) {
  PerfOptions options;
  options.cost.chip = &chip;
  options.cost.program_efficiency = chip.program_efficiency;
  const std::string attention = config.get_string("attention");
  options.cost.flash_attention = attention != "dot_product";
  options.cost.block_q = config.get_int("sa_block_q");
  options.cost.block_kv = config.get_int("sa_block_kv");
  options.cost.block_kv_compute = config.get_int("sa_block_kv_compute");
  options.cost.block_kv_dkv = config.get_int("sa_block_kv_dkv");
  options.cost.block_kv_dkv_compute = config.get_int("sa_block_kv_dkv_compute");
  // local_sa_block_*: MaxText's None (0 here) falls back to the sa_block_* value where it is used.
  options.cost.local_block_q = optional_positive_int(config, "local_sa_block_q");
  options.cost.local_block_kv = optional_positive_int(config, "local_sa_block_kv");
  options.cost.local_block_kv_compute = optional_positive_int(config, "local_sa_block_kv_compute");
  options.cost.local_block_kv_dkv = optional_positive_int(config, "local_sa_block_kv_dkv");
  options.cost.local_block_kv_dkv_compute =
      optional_positive_int(config, "local_sa_block_kv_dkv_compute");
  const std::string quantization = config.get_string("quantization");
  options.cost.int8_matmuls = matmul_format(quantization) == MatmulFormat::kInt8;
  options.cost.fp8_matmuls = matmul_format(quantization) == MatmulFormat::kFp8;
  // fp8 runs all three passes in fp8 (e4m3 forward, e5m2 gradients). MaxText's AQT int8
  // (quantizations.py _get_int8_quant_config) quantizes forward and dlhs, and the weight gradient
  // (drhs) too unless quantization_local_shard_count is 0 (its default -1 becomes the number of
  // slices, pyconfig.py); qwix int8 quantizes every backward matmul. intmp keeps its old reading
  // (forward and dlhs).
  const bool aqt_int8 = quantization == "int8" && !config.get_bool("use_qwix_quantization");
  const bool int8_weight_grad =
      quantization == "int8" &&
      (!aqt_int8 || config.get_int("quantization_local_shard_count") != 0);
  options.cost.quantized_pass[static_cast<size_t>(MatmulPass::kForward)] =
      options.cost.int8_matmuls || options.cost.fp8_matmuls;
  options.cost.quantized_pass[static_cast<size_t>(MatmulPass::kInputGrad)] =
      options.cost.int8_matmuls || options.cost.fp8_matmuls;
  options.cost.quantized_pass[static_cast<size_t>(MatmulPass::kWeightGrad)] =
      options.cost.fp8_matmuls || int8_weight_grad;
  // AQT int8 rounds gradients stochastically (config_v3 with rng_type="jax.uniform").
  options.cost.stochastic_rounding_gradients = aqt_int8;
  // Only a fixed range needs no pass over the tensor (qwix calibrate(); the method name is
  // case-insensitive there, and model/config_rules.cpp has refused what qwix would not parse).
  auto dynamic = [&config](const char* key) {
    return !lowercase(config.get_string(key)).starts_with("fixed");
  };
  options.cost.dynamic_scale_weights = dynamic("weight_quantization_calibration_method");
  options.cost.dynamic_scale_activations = dynamic("act_quantization_calibration_method");
  options.cost.dynamic_scale_gradients = dynamic("bwd_quantization_calibration_method");
  // On GPUs quantization=fp8 is MaxText's Fp8Quantization (flax's Fp8DotGeneralOp): delayed
  // scaling, each operand quantized with the scale its amax history kept from earlier steps
  // (fp8_ops.in_qdq), its new amax taken in the same pass as the cast. No pass runs before the
  // matmul, whatever the calibration keys say (they are read by the TPU paths only).
  if (chip.is_gpu() && quantization == "fp8" && !config.get_bool("use_qwix_quantization")) {
    options.cost.dynamic_scale_weights = false;
    options.cost.dynamic_scale_activations = false;
    options.cost.dynamic_scale_gradients = false;
  }
  // Megablox and tokamax's grouped matmul are both tiled kernels driven by the same tile keys.
  options.cost.megablox = config.get_bool("sparse_matmul") &&
                          (config.get_bool("megablox") || config.get_bool("use_tokamax_gmm"));
  options.cost.custom_sort_vjp = config.get_bool("use_custom_sort_vjp");
  options.cost.routed_expert_biases =
      config.get_bool("mlp_bias") && config.get_bool("sparse_matmul");
  options.cost.gmm_v2 = options.cost.megablox && config.get_bool("use_gmm_v2");
  // MaxText (moe.py gmm) sends unquantized tokamax calls to tokamax.ragged_dot with no tiling;
  // quantized ones, and use_gmm_v2, go through its megablox wrapper with the tile keys.
  options.cost.tokamax_own_tiles = options.cost.megablox && config.get_bool("use_tokamax_gmm") &&
                                   quantization.empty() && !config.get_bool("use_gmm_v2");
  // Which quantized runs leave the dropless experts in bf16. Without qwix: megablox/tokamax
  // quantize in the kernel (megablox/ops.py builds an AQT-like rule), while jax.lax.ragged_dot
  // (no megablox/tokamax) is given an AQT QTensor kernel only in serve mode (moe.py). Under qwix,
  // only fp8_full's rule names the grouped matmuls (quantizations.py get_fp8_full_qwix_rule:
  // op_names dot_general, gmm, ragged_dot; the int8 and fp8 rules name dot_general only).
  const bool qwix = config.get_bool("use_qwix_quantization");
  const bool grouped_kernel = config.get_bool("megablox") || config.get_bool("use_tokamax_gmm");
  // quantizations.py get_fp8_full_qwix_rule leaves bwd_use_original_residuals at qwix's False.
  options.cost.quantized_residuals = qwix && quantization == "fp8_full";
  options.cost.unquantized_experts = !quantization.empty() && config.get_bool("sparse_matmul") &&
                                     (qwix ? quantization != "fp8_full" : !grouped_kernel);
  const char* const weights[] = {"wi", "wo"};
  const char* const passes[] = {"fwd", "dlhs", "drhs"};
  for (size_t weight = 0; weight < 2; ++weight) {
    for (size_t pass = 0; pass < 3; ++pass) {
      const std::string prefix = std::string(weights[weight]) + "_tile_" + passes[pass] + "_";
      GroupedMatmulTiles& tiles = options.cost.megablox_tiles[weight][pass];
      tiles.batch_seq = config.get_int(prefix + "batch_seq");
      tiles.embed = config.get_int(prefix + "embed_dim");
      tiles.mlp = config.get_int(prefix + "mlp_dim");
    }
  }
  const std::string offload = config.get_string("sparse_core_collective_offload");
  options.sparse_core_offload =
      offload == "on" || (offload == "auto" && chip.sparsecore_collective_offload_default > 0);
  options.collective_matmul = config.get_bool("collective_matmul");
  return options;
}

}  // namespace tpusim
