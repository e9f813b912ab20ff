#include "sharding/partitioner_internal.h"

namespace tpusim::partitioner_internal {

void Partitioner::partition_attention(const Op& op, bool gradient) {
  // Forward inputs: q, k, v, [k_rope], [sinks], [blocks], [selection]; gradient inputs: dout, q,
  // k, v, [k_rope], [sinks], [blocks], [selection], out. The sinks ([heads], one logit per query
  // head) follow the query's heads; the compressed blocks (attrs.compress_ratio > 0) are whole
  // like the keys; CSA's selection ([batch, length, blocks], attrs.block_topk > 0) follows the
  // query's batch and length, its blocks whole.
  const size_t first_forward = gradient ? 1 : 0;
  const TensorId query = op.inputs[first_forward];
  const AxesByName reference = by_name(query, layout(query));
  // Keys and values cover the whole sequence. Their kv heads stay split only when the split
  // divides them evenly (each device's query heads then find their kv heads locally); with
  // fewer kv heads than shards (GQA under wide tensor parallelism) they are gathered whole,
  // as each device needs the kv head its query heads share.
  std::set<std::string> whole_length = {"length"};
  const TensorId key = op.inputs[first_forward + 1];
  const int kv_dim = global_.tensor(key).dim_index("kv_heads");
  bool kv_gathered = false;
  if (kv_dim >= 0) {
    const AxisList& kv_axes = layout(key)[static_cast<size_t>(kv_dim)];
    const int64_t kv_heads = global_.tensor(key).dims[static_cast<size_t>(kv_dim)].size;
    if (!kv_axes.empty()) {
      const bool divides = kv_heads % shards(kv_axes) == 0;
      decisions_.divides(kv_heads, mesh_axis_bits(kv_axes), divides);
      if (!divides) {
        whole_length.insert("kv_heads");
        kv_gathered = true;
      }
    }
  }
  const size_t key_begin = first_forward + 1;
  size_t key_end = gradient ? op.inputs.size() - 1 : op.inputs.size();
  const bool blocks = op.attrs.compress_ratio > 0;
  if (blocks && op.attrs.block_topk > 0) {
    --key_end;  // the selection follows the query (below)
  }
  const size_t blocks_index = blocks ? key_end - 1 : op.inputs.size();
  if (blocks) {
    --key_end;
  }
  const Tensor& last_forward = global_.tensor(op.inputs[key_end - 1]);
  const bool sinks = key_end - first_forward > 3 && last_forward.dims.size() == 1 &&
                     last_forward.dims[0].name == "heads";
  if (sinks) {
    --key_end;
  }
  TensorIds inputs;
  for (size_t index = 0; index < op.inputs.size(); ++index) {
    const TensorId input = op.inputs[index];
    const bool key_side = (index >= key_begin && index < key_end) || index == blocks_index;
    inputs.push_back(reshard(
        input, key_side ? follow(input, {}, whole_length) : follow(input, reference), op.region));
  }
  if (!gradient) {
    emit(op, inputs, {follow(op.outputs[0], reference)}, {});
    return;
  }
  // dq follows q; dk, dv (and dk_rope) are partial sums over the axes splitting q's length,
  // and MLA's shared rotary key (no heads dim) also over the axes splitting the heads.
  const Tensor& query_tensor = global_.tensor(query);
  const int length_dim = query_tensor.dim_index("length");
  const int heads_dim = query_tensor.dim_index("heads");
  const AxisList context =
      length_dim < 0 ? AxisList{} : layout(query)[static_cast<size_t>(length_dim)];
  const AxisList heads = heads_dim < 0 ? AxisList{} : layout(query)[static_cast<size_t>(heads_dim)];
  const int batch_dim = query_tensor.dim_index("batch");
  const AxisList batch = batch_dim < 0 ? AxisList{} : layout(query)[static_cast<size_t>(batch_dim)];
  TensorIds outputs;
  std::vector<std::pair<size_t, AxisList>> pending;
  std::vector<Layout> computed_layouts;
  for (size_t index = 0; index < op.outputs.size(); ++index) {
    const TensorId global = op.outputs[index];
    const Tensor& output = global_.tensor(global);
    AxisList partial;
    const bool dsinks = sinks && index + 1 + (blocks ? 1 : 0) == op.outputs.size();
    if (dsinks) {
      // Summed over this device's sequences and queries: partial over the axes splitting them.
      partial = batch;
      partial.append(context);
    } else if (index > 0) {
      partial = context;
      const bool shared_across_heads =
          output.dim_index("heads") < 0 && (output.dim_index("kv_heads") < 0 || kv_gathered);
      if (shared_across_heads) {
        partial.append(heads);
      }
    }
    const Layout computed =
        index == 0 || dsinks ? follow(global, reference) : follow(global, {}, whole_length);
    computed_layouts.push_back(computed);
    if (computed == layout(global) && partial.empty()) {
      outputs.push_back(local(global));
      continue;
    }
    outputs.push_back(
        make_local(output, computed, op.region, partial.empty() ? "/computed" : "/partial"));
    pending.emplace_back(index, partial);
  }
  add_op(op.kind, op.name, "", inputs, outputs, op.attrs, op.region);
  for (const auto& [index, partial] : pending) {
    finish_output(op.outputs[index], outputs[index], computed_layouts[index], partial, op.region,
                  ReduceOp::kSum);
  }
}

}  // namespace tpusim::partitioner_internal
