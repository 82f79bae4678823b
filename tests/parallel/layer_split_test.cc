#include "parallel/layer_split.h"

#include <gtest/gtest.h>

namespace mt::parallel {
namespace {

TEST(LayerSplit, InterleavedOffsetsMatchSpecExample) {
  // L=16, PP=4, VPP=2: rank0 has layers [1,2] and [9,10] (1-based), ...
  auto s = split_layers({.num_layers = 16, .pp = 4, .vpp = 2});
  ASSERT_TRUE(s.is_ok());
  ASSERT_EQ(s->size(), 8u);
  auto at = [&](int p, int c) { return (*s)[p * 2 + c]; };
  EXPECT_EQ(at(0, 0).first_layer, 0);
  EXPECT_EQ(at(0, 1).first_layer, 8);
  EXPECT_EQ(at(1, 0).first_layer, 2);
  EXPECT_EQ(at(1, 1).first_layer, 10);
  EXPECT_EQ(at(3, 0).first_layer, 6);
  EXPECT_EQ(at(3, 1).first_layer, 14);
  for (const auto& c : *s) {
    EXPECT_EQ(c.num_layers, 2);
    // Megatron's even-split offset: v*(L/VPP) + p*(L/PP/VPP)
    EXPECT_EQ(c.first_layer, c.chunk * 8 + c.pp_rank * 2);
  }
}

TEST(LayerSplit, AccountForEmbeddingAndLoss) {
  // LLaMA-3.1 405B: 126 layers, PP 8: 128 / 8 = 16, first and last stage 15.
  auto s = split_layers({.num_layers = 126, .pp = 8, .vpp = 1, .account_for_embedding = true, .account_for_loss = true});
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ((*s)[0].num_layers, 15);
  EXPECT_EQ((*s)[7].num_layers, 15);
  for (int p = 1; p < 7; ++p) EXPECT_EQ((*s)[p].num_layers, 16);
  EXPECT_EQ((*s)[1].first_layer, 15);
}

TEST(LayerSplit, UnevenFirstAndLast) {
  auto s = split_layers({.num_layers = 30, .pp = 4, .vpp = 1, .first_stage_layers = 6, .last_stage_layers = 8});
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ((*s)[0].num_layers, 6);
  EXPECT_EQ((*s)[1].num_layers, 8);
  EXPECT_EQ((*s)[2].num_layers, 8);
  EXPECT_EQ((*s)[3].num_layers, 8);
  EXPECT_FALSE(split_layers({.num_layers = 31, .pp = 4, .vpp = 1, .first_stage_layers = 6, .last_stage_layers = 8}).is_ok());
  EXPECT_FALSE(split_layers({.num_layers = 10, .pp = 2, .vpp = 1, .first_stage_layers = 4, .last_stage_layers = 4}).is_ok());
}

TEST(LayerSplit, RejectsUnevenEvenSplit) {
  EXPECT_FALSE(split_layers({.num_layers = 10, .pp = 4}).is_ok());
  EXPECT_FALSE(split_layers({.num_layers = 12, .pp = 2, .vpp = 4}).is_ok());
}

}  // namespace
}  // namespace mt::parallel
