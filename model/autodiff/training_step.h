// model/autodiff/training_step.h: the whole training step (forward, backward, optimizer) as one
// graph, built by reverse-mode autodiff over the forward graph.
//
// Each forward region gets a backward region (same repeat, reverse order) holding the
// vector-Jacobian products of its ops, emitted as ops: an einsum's VJP is two einsums, an
// attention's is an attention_grad, a norm's a norm_grad, and so on. Forward tensors the backward
// ops read are saved (parameters, inputs, and what the remat policy keeps on device or offloads)
// or rematerialized: their producers are cloned into the backward region as recompute ops.
// Offloaded tensors get a host_offload op after their producer and a host_load before use. The
// optimizer region then applies AdamW to every parameter with its gradient and two moments.
//
// Example:
//   TrainingStep step = build_training_step(config, /*batch=*/4);
//   step.graph.to_text();   // embed, layer x32, head, head/grad, layer/grad x32, ..., optimizer
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "model/autodiff/remat_policy.h"
#include "model/builder/forward_builder.h"

namespace tpusim {

class Config;

struct TrainingStep {
  Graph graph;
  ForwardGraph forward_info;  // region ids and carries of the forward part (graph moved out)
  std::vector<int> backward_regions;             // in execution order (head first)
  std::vector<int> optimizer_regions;            // one per forward region that owns parameters
  std::map<TensorId, TensorId> parameter_grads;  // parameter -> its gradient
  std::map<TensorId, RematDecision> saved;       // forward activations kept for backward
};

// `order`: the forward's layer regions (build_forward, model/builder/layer_plan.h).
TrainingStep build_training_step(const Config& config, int64_t batch,
                                 LayerOrder order = LayerOrder::kByKind);

}  // namespace tpusim
