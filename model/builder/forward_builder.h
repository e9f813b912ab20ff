// model/builder/forward_builder.h: the forward pass of a MaxText decoder-only model as a Graph.
//
// Builds [embed x1] [one region per layer group x count] [head x1] from the config: token
// embedding (plus learned positions for gpt3), each decoder layer (RMSNorm or LayerNorm, RoPE,
// GQA or MLA attention or Gated DeltaNet linear attention, SwiGLU/GeGLU/GELU MLP or a routed
// mixture of experts with shared experts),
// the final norm, the unembedding (tied when logits_via_embedding) and the cross-entropy loss.
// Tensors carry MaxText's logical axis names and checkpoint names so the partitioner and the remat
// policies can read them.
//
// Example:
//   ForwardGraph forward = build_forward(config, /*batch=*/8);
//   forward.graph.to_text(forward.layer_regions[0]);   // one decoder layer
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/builder/initializers.h"
#include "model/builder/layer_plan.h"
#include "model/ir/graph.h"
#include "model/pipeline_schedule.h"

namespace tpusim {

class Config;

struct ForwardGraph {
  Graph graph;
  int embed_region = -1;
  std::vector<int> layer_regions;  // one per LayerGroup, in plan order
  int head_region = -1;
  // The residual stream between regions: embed_output feeds layer_inputs[0], layer_outputs[i]
  // feeds layer_inputs[i + 1] (the scan carry), the last layer output feeds head_input.
  TensorId embed_output = -1;
  std::vector<TensorId> layer_inputs;
  std::vector<TensorId> layer_outputs;
  TensorId head_input = -1;
  TensorId loss = -1;
  // Scalars each iteration of their (layer) region adds to the reported loss: MaxText's
  // load-balance loss of each routed MoE layer, already divided by the number of those layers
  // (their mean). Their gradient is the router VJP's own (kRouterGrad), not seeded from here.
  std::vector<TensorId> auxiliary_losses;
  int64_t head_chunks = 1;  // num_vocab_tiling: the head region runs once per chunk of tokens
  int64_t batch = 0;        // sequences in the graph
  int64_t length = 0;       // tokens per sequence
  // MaxText's pipeline (inactive with one stage): the layer region then runs iterations x
  // layers_per_stage times on batch / microbatches sequences.
  PipelineSchedule pipeline;
  // How each parameter starts, by "<region>/<parameter>" ("layer/attention/query"): MaxText's
  // initializer of that kernel (initializers.h).
  std::map<std::string, ParameterInit> initializers;
};

// `batch` is the number of sequences the graph processes (a whole microbatch before partitioning);
// `order` says whether each kind of layer is one region or each run of them (layer_plan.h).
ForwardGraph build_forward(const Config& config, int64_t batch,
                           LayerOrder order = LayerOrder::kByKind);

}  // namespace tpusim
