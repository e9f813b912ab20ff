#include "model/ir/name.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/ir/tensor.h"

namespace tpusim {
namespace {

TEST(Name, GivesBackTheTextItWasMadeFrom) {
  const std::string text = "activation_embed";  // longer than a short-string buffer
  const Name name = text;
  EXPECT_EQ(name.str(), "activation_embed");
  EXPECT_EQ(std::string_view(name), "activation_embed");
  EXPECT_STREQ(name.c_str(), "activation_embed");
  EXPECT_EQ(name.size(), 16U);
  EXPECT_FALSE(name.empty());
  EXPECT_TRUE(Name().empty());
  EXPECT_EQ(Name(), Name(""));
}

TEST(Name, EqualTextsShareOneCopy) {
  const Name a = "heads";
  const Name b = std::string("heads");
  const Name c = std::string_view("heads_x").substr(0, 5);
  EXPECT_EQ(&a.str(), &b.str());
  EXPECT_EQ(&a.str(), &c.str());
  EXPECT_EQ(a, c);
  EXPECT_NE(a, Name("kv_heads"));
}

TEST(Name, ComparesWithTextLikeTheString) {
  const Name name = "mlp";
  EXPECT_TRUE(name == "mlp");
  EXPECT_TRUE("mlp" == name);
  EXPECT_TRUE(name == std::string("mlp"));
  EXPECT_TRUE(std::string_view("mlp") == name);
  EXPECT_TRUE(name != "mlp2");
  EXPECT_FALSE(name == "ml");
}

TEST(Name, OrdersByTextAsTheStringsDid) {
  std::vector<std::string> texts = {"vocab", "batch", "embed", "", "embed_no_exp", "Batch", "b"};
  std::vector<Name> names(texts.begin(), texts.end());
  std::sort(texts.begin(), texts.end());
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), texts.size());
  for (size_t index = 0; index < texts.size(); ++index) {
    EXPECT_EQ(names[index].str(), texts[index]);
  }
  EXPECT_LT(Name("a"), Name("b"));
  EXPECT_EQ(Name("a") <=> Name("a"), std::strong_ordering::equal);
}

TEST(Name, JoinsAndPrintsAsText) {
  const Name axis = "fsdp_transpose";
  EXPECT_EQ("@" + axis, "@fsdp_transpose");
  EXPECT_EQ(axis + "+", "fsdp_transpose+");
  EXPECT_EQ(std::string("embed:256") + axis, "embed:256fsdp_transpose");
  EXPECT_EQ(axis + std::string("/x"), "fsdp_transpose/x");
  std::ostringstream out;
  out << axis;
  EXPECT_EQ(out.str(), "fsdp_transpose");
}

TEST(Name, ThreadsInterningTheSameNewTextsAgree) {
  constexpr int kTexts = 500;
  std::vector<std::vector<Name>> seen(2);
  std::vector<std::thread> threads;
  for (size_t thread = 0; thread < seen.size(); ++thread) {
    threads.emplace_back([&seen, thread] {
      for (int index = 0; index < kTexts; ++index) {
        seen[thread].emplace_back("name_test_concurrent_" + std::to_string(index));
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (int index = 0; index < kTexts; ++index) {
    const auto at = static_cast<size_t>(index);
    EXPECT_EQ(&seen[0][at].str(), &seen[1][at].str());
    EXPECT_EQ(seen[0][at].str(), "name_test_concurrent_" + std::to_string(index));
  }
}

TEST(Name, ADimCopiesItsNamesAndAxesAsValues) {
  Dim dim{"embed", 4096, "activation_embed"};
  dim.sharded_over = {"data", "fsdp", "fsdp_transpose", "expert", "tensor_transpose"};  // > inline
  const Dim copy = dim;
  dim.sharded_over.pop_back();
  dim.name = "mlp";
  EXPECT_EQ(copy.name, "embed");
  EXPECT_EQ(copy.logical, "activation_embed");
  ASSERT_EQ(copy.sharded_over.size(), 5U);
  EXPECT_EQ(copy.sharded_over[4], "tensor_transpose");
  EXPECT_EQ(dim.sharded_over.size(), 4U);

  Tensor tensor;
  tensor.name = "x";
  tensor.dims = {copy, Dim{"length", 8, "activation_length"}};
  EXPECT_EQ(tensor.dim_index("length"), 1);
  EXPECT_EQ(tensor.dim_index(Name("embed")), 0);
  EXPECT_EQ(tensor.dim_index(std::string("vocab")), -1);
  EXPECT_EQ(tensor.describe(),
            "x[embed:4096@data+fsdp+fsdp_transpose+expert+tensor_transpose,length:8] f32");
}

}  // namespace
}  // namespace tpusim
