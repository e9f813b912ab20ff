// sim/functional/kernels/embedding.cpp: kEmbeddingLookup, the rows of an embedding table picked by
// token ids (vocab or position embeddings, sharded over the table's first dim), and
// kEmbeddingGrad, its scatter-add VJP.
//
// Example: tokens [[5, 9]] on the device holding vocab rows [0, 8) of a 16-row table: x[0, 0] =
// table row 5, x[0, 1] = zeros (row 9 is on the other device; the engine all-reduces the shards).
//
// kEmbeddingLookup(tokens[token dims], table[V, embed dims]) -> x[token dims, embed dims]:
//   x[t] = table[tokens[t] - offset] where the table's FIRST dim (vocab or position) holds the
//   global rows [offset, offset + V) on this device (offset = device.offset(table.dims[0])); a
//   token outside that range gives zeros (the engine all-reduces the vocab shards). Token and
//   embed dims are matched by name (the output's embed dims are the table's slice).
// kEmbeddingGrad(dx, tokens) -> dtable: dtable[tokens[t] - offset] += dx[t] for the tokens in the
//   local range (scatter-add); other rows 0.
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/functional/kernels/context.h"
#include "sim/functional/kernels/families.h"

namespace tpusim::kernels {
namespace {

struct EmbeddingLayout {
  Space tokens;
  Space embed;
  std::vector<int64_t> token_strides;    // in the tokens tensor
  std::vector<int64_t> x_token_strides;  // in x / dx
  std::vector<int64_t> table_embed_strides;
  std::vector<int64_t> x_embed_strides;
  int64_t row_stride = 0;
  int64_t rows = 0;
  int64_t offset = 0;
};

EmbeddingLayout embedding_layout(const Ctx& ctx, const Tensor& tokens, const Tensor& table,
                                 const Tensor& x) {
  if (table.dims.empty()) {
    ctx.fail("embedding table has no dims");
  }
  EmbeddingLayout layout;
  layout.tokens = space_without(tokens, {});
  for (size_t index = 1; index < table.dims.size(); ++index) {
    layout.embed.add(table.dims[index].name, table.dims[index].size);
  }
  layout.token_strides = ctx.strides_in(tokens, layout.tokens, true, true);
  layout.x_token_strides = ctx.strides_in(x, layout.tokens, true, false);
  layout.table_embed_strides = ctx.strides_in(table, layout.embed, true, false);
  layout.x_embed_strides = ctx.strides_in(x, layout.embed, true, false);
  if (x.dims.size() != layout.tokens.names.size() + layout.embed.names.size()) {
    ctx.fail("embedding output must have the token dims and the table's embed dims");
  }
  layout.row_stride = strides_of(table).front();
  layout.rows = table.dims.front().size;
  layout.offset = ctx.device().offset(table.dims.front());
  return layout;
}

// (table offset within a row, x offset within a token) of every embed element.
std::vector<std::pair<int64_t, int64_t>> embed_offsets(const EmbeddingLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> offsets;
  const std::array<std::vector<int64_t>, 2> strides = {layout.table_embed_strides,
                                                       layout.x_embed_strides};
  for_each_index(layout.embed.sizes, strides,
                 [&](const std::array<int64_t, 2>& at) { offsets.emplace_back(at[0], at[1]); });
  return offsets;
}

void run_embedding(const Ctx& ctx, bool gradient) {
  ctx.expect_counts(2, 2, 1, 1);
  const Tensor& tokens = ctx.in_tensor(gradient ? 1 : 0);
  const Tensor& table = gradient ? ctx.out_tensor(0) : ctx.in_tensor(1);
  const Tensor& x = gradient ? ctx.in_tensor(0) : ctx.out_tensor(0);
  const EmbeddingLayout layout = embedding_layout(ctx, tokens, table, x);
  const std::vector<std::pair<int64_t, int64_t>> pairs = embed_offsets(layout);
  const float* token_values = ctx.in(gradient ? 1 : 0);
  const std::array<std::vector<int64_t>, 2> strides = {layout.token_strides,
                                                       layout.x_token_strides};
  if (gradient) {
    const float* dx = ctx.in(0);
    float* dtable = ctx.out(0);
    std::vector<double> sums(static_cast<size_t>(layout.rows * layout.row_stride), 0.0);
    for_each_index(layout.tokens.sizes, strides, [&](const std::array<int64_t, 2>& at) {
      const int64_t row = to_index(token_values[at[0]]) - layout.offset;
      if (row < 0 || row >= layout.rows) {
        return;
      }
      for (const auto& [table_at, x_at] : pairs) {
        sums[static_cast<size_t>(row * layout.row_stride + table_at)] += dx[at[1] + x_at];
      }
    });
    for (size_t index = 0; index < sums.size(); ++index) {
      dtable[index] = static_cast<float>(sums[index]);
    }
    return;
  }
  const float* table_values = ctx.in(1);
  float* out = ctx.out(0);
  for_each_index(layout.tokens.sizes, strides, [&](const std::array<int64_t, 2>& at) {
    const int64_t row = to_index(token_values[at[0]]) - layout.offset;
    if (row < 0 || row >= layout.rows) {
      return;
    }
    for (const auto& [table_at, x_at] : pairs) {
      out[at[1] + x_at] = table_values[row * layout.row_stride + table_at];
    }
  });
}

}  // namespace

void run_embedding_lookup(const Ctx& ctx) {
  run_embedding(ctx, false);
}

void run_embedding_grad(const Ctx& ctx) {
  run_embedding(ctx, true);
}

}  // namespace tpusim::kernels
