#!/usr/bin/env python3
"""Writes configs/maxtext/base_keys.tsv: every key of MaxText's base.yml (from the fixture
tests/data/maxtext/maxtext_keys.tsv) with what tpusim does with it. A key of configs/base.yml is
"modeled"; the others are "none" when a name pattern below says it cannot change a training step's
time or memory, else "not_modeled" (the conservative default). Rerun after updating the fixture.

Usage: python3 scripts/make_maxtext_key_table.py
"""
import csv
import os
import re

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
known=set()
for line in open('configs/base.yml'):
    m=re.match(r'^([A-Za-z_][A-Za-z0-9_]*):',line)
    if m: known.add(m.group(1))
rows=list(csv.reader(open('tests/data/maxtext/maxtext_keys.tsv'),delimiter='\t',quoting=csv.QUOTE_NONE))[1:]
NONE_PATTERNS = [ r'^global_rope_max_timescale$', r'^global_rope_proportion$', r'^local_rope_proportion$', r'^partial_rotary_factor$', r'^rope_interleave$', r'^rope_truncate$', r'^rope_attention_scaling$', r'^rope_use_scale$', r'^rope_linear_scaling_factor$', r'^rope_pairwise$', r'^local_rope_max_timescale$', r'^temperature_tuning$', r'ckpt', r'orbax', r'^generate_slice$',
 r'checkpoint', r'^save_', r'^load_', r'lora_input_adapters_path', r'hf_lora_adapter_path', r'^hf_', r'^grain_', r'^olmo_',
 r'^dataset', r'^eval_', r'_eval$', r'_eval_', r'eval_dataset', r'tokeniz', r'^add_bos$', r'^add_eos$', r'chat_template',
 r'^use_truncation$', r'data_columns$', r'image_column$', r'profil', r'^dump_', r'^xprof', r'goodput', r'^monitor_',
 r'heartbeat', r'^report_', r'tensorboard', r'^vertex_', r'wandb', r'^gcs_', r'^log_', r'^debug_', r'prometheus',
 r'^jax_', r'^inference_', r'prefill', r'^decode_', r'^autoregressive_decode_assert$', r'^prompt$', r'prefix_caching',
 r'^quantize_kvcache$', r'^kv_quant_', r'warmup', r'inference_pool', r'^multi_sampling$', r'^return_log_prob$',
 r'_axis_order$', r'^reshape_q$', r'^vllm_', r'^image_', r'^video_', r'^audio_', r'_for_vit$', r'_for_audio$',
 r'^use_multimodal$', r'^use_audio', r'^freeze_', r'^dtype_mm$', r'^max_num_images_per_example$', r'^vision_output_length$',
 r'^use_mrope$', r'^mrope_section$', r'^position_id_per_seconds$', r'^elastic_', r'managed_mldiagnostics',
 r'^skip_jax_distributed_system$', r'^compiled_trainstep_file$', r'^write_estimator_result$', r'^max_checkify$',
 r'^target_eval_loss$', r'^enable_data_shuffling$', r'^num_epoch$', r'^generate_padding_batch',
 r'^expansion_factor_real_data$', r'^colocated_python_data_input$', r'^lr_schedule_type$', r'^learning_rate_final_fraction$',
 r'^wsd_', r'^muon_', r'^enable_nnx$', r'^pure_nnx', r'^use_ragged_attention$', r'^ragged_block_size$',
 r'^max_corpus_chars$', r'^default_prompt$', r'^use_dpo$', r'^use_sft$', r'^sft_train_on_completion_only$',
 r'^enable_single_controller$', r'^record_internal_nn_metrics$', r'^internal_compile', r'^compile_xla_flags$',
 r'^model_call_mode$', r'^constant_bound_config$', r'^use_chat_template$', r'^max_segments_per_seq$',
 r'^enable_pathways_goodput$', r'^step_deviation_interval_seconds$', r'^enable_gcp_', r'^upload_all_profiler_results$',
 r'^hide_profiler_step_metric$', r'^enable_tpu_profiling_options$', r'^tpu_num_', r'^enable_jax_profiler$',
 r'^check_vma$', r'^skip_step_', r'^enable_autocheckpoint$', r'^local_checkpoint_', r'^mtc_data_parallelism$',
 r'^enable_multi_tier_checkpointing$', r'^multi_tier_checkpointing', r'^enable_emergency_checkpoint$',
 r'^weight_sparsity_', r'^replicate_quant_scale$', r'^quant_cfg_path$', r'^rope_theta_for_vit$',
 r'^eval_per_device_batch_size$', r'^use_vertex_tensorboard$', r'^distill_', r'^subslice_shape$',
 r'^jax_cache_dir$',
]
# Keys that change what a training step computes or how fast, but tpusim does not model yet.
# (Everything not matched above is treated as such: a conservative default.)
EXTRA = [
 ('vision_encoder_block','""','str','none','multimodal encoder of a preset; set in model presets, not in base.yml'),
 ('log_moe_bias_norms','false','bool','none','logging switch of the deepseek4 presets; not in base.yml'),
 ('fsdp_shard_on_exp','False','bool','not_modeled','older MaxText name of shard_exp_on_fsdp (published recipes of 2025)'),
]
for proj in ('wi','wo'):
    for phase,default in (('fwd','2'),('dlhs','2'),('drhs','3')):
        EXTRA.append((f'{proj}_tile_{phase}_buffer_count', default if False else 'None', 'int', 'not_modeled',
                      'megablox tile buffering of a newer MaxText revision (published recipes of 2026); the default is not in the key table'))
# Keys of tpusim's configs/base.yml that the estimate does not read (tests/model/
# maxtext_compat_test.cpp sets each on a small model and checks that the step time, memory and mesh
# stay bitwise the same): each is listed when a config sets it,
# as "none" (cannot change the estimate; `tpusim train` refuses the ones whose numerics it does not
# build) or "not_modeled" (changes the step; a warning when it differs from MaxText's default).
SCHEMA_NOT_READ = {
 # Numerics only: the router's scoring, scale, renormalization and group limit, the
 # activation clamp, the dropout rate, the RoPE variant and YaRN's ramp. `train` refuses what it
 # does not build (enable_dropout stays "modeled": without a dropout_rate it changes nothing, most
 # presets set it, and train reads it). routed_bias is "modeled": its [experts] bias per routed
 # layer is a parameter with optimizer state (model/builder/feed_forward_block.cpp).
 'routed_score_func': 'none', 'routed_scaling_factor': 'none',
 'norm_topk_prob': 'none', 'n_routing_groups': 'none', 'topk_routing_group': 'none',
 'mlp_activations_limit': 'none', 'dropout_rate': 'none',
 'beta_fast': 'none', 'beta_slow': 'none',
 # Data pipeline, logging and layout of the scanned weights.
 'packing': 'none', 'reuse_example_batch': 'none', 'log_period': 'none', 'train_split': 'none',
 'eval_split': 'none', 'sharding_tolerance': 'none', 'param_scan_axis': 'none',
 # Change time or memory; not modeled yet.
 'load_balance_loss_weight': 'not_modeled', 'fused_qkv': 'not_modeled', 'fused_mlp': 'not_modeled',
 'matmul_precision': 'not_modeled', 'logits_dot_in_fp32': 'not_modeled',
 'cast_logits_to_fp32': 'not_modeled', 'optimizer_memory_host_offload': 'not_modeled',
 'parameter_memory_host_offload': 'not_modeled', 'shard_optimizer_over_data': 'not_modeled',
 'context_parallel_strategy': 'not_modeled', 'context_parallel_load_balance': 'not_modeled',
 'allow_split_physical_axes': 'not_modeled', 'data_sharding': 'not_modeled',
 'sa_use_fused_bwd_kernel': 'not_modeled', 'sa_block_q_dkv': 'not_modeled',
 'sa_block_q_dq': 'not_modeled', 'sa_block_kv_dq': 'not_modeled',
 'local_sa_block_q_dkv': 'not_modeled', 'scan_layers': 'not_modeled',
 'mesh_axes': 'not_modeled', 'rope_type': 'none',
}
out=open('configs/maxtext/base_keys.tsv','w')
out.write('# Every key of MaxText\'s base.yml (src/maxtext/configs/base.yml at the revision docs/reference/maxtext.md\n')
out.write('# names), with its default and type as MaxText parses them, and what tpusim does with it when it is not\n')
out.write('# one of tpusim\'s own keys (configs/base.yml): "none" = cannot change a training step\'s time or memory\n')
out.write('# (paths, logging, profiling, checkpointing, data pipeline, inference, multimodal encoders);\n')
out.write('# "not_modeled" = changes the step but tpusim does not model it yet (a warning when set to a value\n')
out.write('# other than MaxText\'s default). Rows after the base.yml keys come from other MaxText revisions\n')
out.write('# that published recipes use; their `note` says so.\n')
out.write('key\tdefault\ttype\teffect\tnote\n')
counts={}
for k,d,t in rows:
    if k in SCHEMA_NOT_READ:
        eff=SCHEMA_NOT_READ[k]
    elif k in known:
        eff='modeled'
    elif any(re.search(p,k) for p in NONE_PATTERNS):
        eff='none'
    else:
        eff='not_modeled'
    counts[eff]=counts.get(eff,0)+1
    out.write(f'{k}\t{d}\t{t}\t{eff}\t\n')
for r in EXTRA:
    out.write('\t'.join(r)+'\n')
print(counts)
