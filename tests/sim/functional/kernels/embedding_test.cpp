// tests/sim/functional/kernels/embedding_test.cpp: the embedding kernels
// (sim/functional/kernels/embedding.cpp). Embedding lookup and its gradient, whole and over vocab
// shards. The method and the helpers: kernel_test_support.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/sim/functional/kernels/kernel_test_support.h"

namespace tpusim::kernel_test {
namespace {

TEST(KernelEmbedding, LookupReadsRowsAndVocabShardsSumToWhole) {
  std::mt19937 rng(14);
  Case c;
  const TensorId tokens = c.tensor("tokens", token_dims(), TensorKind::kInput);
  const TensorId table = c.tensor("table", {dim("vocab", 8), dim("embed", 4)});
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId local_table =
      c.tensor("local_table", {split("vocab", 4, 8, "tensor"), dim("embed", 4)});
  const Op& whole = c.op(OpKind::kEmbeddingLookup, {tokens, table}, {x});
  const TensorId local_x = c.tensor("local_x", activation_dims());
  const Op& local = c.op(OpKind::kEmbeddingLookup, {tokens, local_table}, {local_x});
  const TensorData token_values = random_ints(c.info(tokens), rng, 8);
  const TensorData table_values = random_data(c.info(table), rng);
  const TensorData result = run(c.graph, whole, {token_values, table_values})[0];
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t l = 0; l < 3; ++l) {
      const auto row = static_cast<int64_t>(token_values.at({b, l}));
      for (int64_t e = 0; e < 4; ++e) {
        EXPECT_EQ(result.at({b, l, e}), table_values.at({row, e}));
      }
    }
  }
  TensorData sum = TensorData::zeros(c.info(x));
  for (int device = 0; device < 2; ++device) {
    const TensorData part =
        run(c.graph, local, {token_values, slice(table_values, 0, device * 4, 4)},
            device_on("tensor", device, 2))[0];
    for (size_t index = 0; index < sum.values.size(); ++index) {
      sum.values[index] += part.values[index];
    }
  }
  expect_close(sum, result);
}

TEST(KernelEmbedding, GradientMatchesFiniteDifferencesAndShards) {
  std::mt19937 rng(15);
  Case c;
  const TensorId tokens = c.tensor("tokens", token_dims(), TensorKind::kInput);
  const TensorId table = c.tensor("table", {dim("vocab", 8), dim("embed", 4)});
  const TensorId x = c.tensor("x", activation_dims());
  const TensorId dx = c.tensor("dx", activation_dims());
  const TensorId dtable = c.tensor("dtable", {dim("vocab", 8), dim("embed", 4)});
  const TensorId local_dtable =
      c.tensor("local_dtable", {split("vocab", 4, 8, "tensor"), dim("embed", 4)});
  const Op& forward = c.op(OpKind::kEmbeddingLookup, {tokens, table}, {x});
  const Op& grad = c.op(OpKind::kEmbeddingGrad, {dx, tokens}, {dtable}, {}, true);
  const Op& local_grad = c.op(OpKind::kEmbeddingGrad, {dx, tokens}, {local_dtable}, {}, true);
  TensorData token_values = random_ints(c.info(tokens), rng, 8);
  token_values.values[0] = token_values.values[1];  // a repeated token accumulates
  const std::vector<TensorData> inputs = {token_values, random_data(c.info(table), rng)};
  const std::vector<TensorData> weights = random_weights(c.graph, forward, rng);
  const TensorData analytic = run(c.graph, grad, {weights[0], token_values})[0];
  expect_fd("embedding dtable", c.graph, forward, inputs, weights, 1, analytic);
  for (int device = 0; device < 2; ++device) {
    expect_close(
        run(c.graph, local_grad, {weights[0], token_values}, device_on("tensor", device, 2))[0],
        slice(analytic, 0, device * 4, 4));
  }
}

}  // namespace
}  // namespace tpusim::kernel_test
