// RankGrid against the worked examples of ../shared/spec/megatron-reference.md §3.3.
#include "parallel/rank_grid.h"

#include <gtest/gtest.h>

namespace mt::parallel {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

RankGrid make(GridSizes s) {
  auto g = RankGrid::create(s);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return *g;
}

TEST(RankGrid, World16_TP2_PP2_DP4_DefaultOrder) {
  RankGrid g = make({.world = 16, .tp = 2, .pp = 2, .cp = 1, .ep = 1, .etp = 2});
  EXPECT_EQ(g.dp(), 4);
  EXPECT_EQ(g.order(), "tp-cp-ep-dp-pp");
  EXPECT_EQ(g.groups(GroupKind::kTensor),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kData), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kDataContext), g.groups(GroupKind::kData));
  EXPECT_EQ(g.groups(GroupKind::kPipeline),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kModel), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kTensorData), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  Groups singletons;
  for (int64_t r = 0; r < 16; ++r) singletons.push_back({r});
  EXPECT_EQ(g.groups(GroupKind::kContext), singletons);
  EXPECT_EQ(g.groups(GroupKind::kEmbedding), g.groups(GroupKind::kPipeline));
  EXPECT_EQ(g.groups(GroupKind::kPositionEmbedding), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // rank = tp + 2*dp + 8*pp
  for (int64_t r = 0; r < 16; ++r) {
    RankCoord c = g.coord(r);
    EXPECT_EQ(r, c.tp + 2 * c.dp + 8 * c.pp);
    EXPECT_EQ(c.cp, 0);
    EXPECT_EQ(g.rank_of(c.tp, c.cp, c.dp, c.pp), r);
  }
  EXPECT_EQ(g.group_of(GroupKind::kData, 9), (std::vector<int64_t>{9, 11, 13, 15}));
}

TEST(RankGrid, World16_TpPpDpMapping) {
  RankGrid g = make({.world = 16, .tp = 2, .pp = 2, .cp = 1, .ep = 1, .etp = 2, .tp_pp_dp_order = true});
  EXPECT_EQ(g.order(), "tp-cp-ep-pp-dp");
  EXPECT_EQ(g.groups(GroupKind::kPipeline),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kData), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kModel), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  for (int64_t r = 0; r < 16; ++r) {
    RankCoord c = g.coord(r);
    EXPECT_EQ(r, c.tp + 2 * c.pp + 4 * c.dp);
  }
}

TEST(RankGrid, World16_WithContextParallel) {
  RankGrid g = make({.world = 16, .tp = 2, .pp = 2, .cp = 2, .ep = 1, .etp = 2});
  EXPECT_EQ(g.dp(), 2);
  auto cp = g.groups(GroupKind::kContext);
  ASSERT_GE(cp.size(), 5u);
  EXPECT_EQ(cp[0], (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(cp[1], (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(cp[2], (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(cp[3], (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(cp[4], (std::vector<int64_t>{8, 10}));
  auto dp = g.groups(GroupKind::kData);
  EXPECT_EQ(dp[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(dp[1], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(dp[2], (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(dp[3], (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(dp[4], (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(g.groups(GroupKind::kDataContext),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(g.groups(GroupKind::kTensorContext)[0], (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(RankGrid, World16_WithExpertParallel) {
  RankGrid g = make({.world = 16, .tp = 2, .pp = 2, .cp = 1, .ep = 2, .etp = 2});
  EXPECT_EQ(g.edp(), 2);
  auto ep = g.groups(GroupKind::kExpert);
  EXPECT_EQ(ep[0], (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(ep[1], (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ep[2], (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(ep[3], (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(ep[4], (std::vector<int64_t>{8, 10}));
  auto edp = g.groups(GroupKind::kExpertData);
  EXPECT_EQ(edp[0], (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(edp[1], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(edp[2], (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(edp[3], (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(edp[4], (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(g.groups(GroupKind::kExpertTensorExpert)[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(g.groups(GroupKind::kExpertTensorExpert)[1], (std::vector<int64_t>{4, 5, 6, 7}));
}

TEST(RankGrid, EmbeddingGroupIsFirstStageOnlyWithoutPipeline) {
  RankGrid g = make({.world = 4, .tp = 2, .pp = 1});
  EXPECT_EQ(g.groups(GroupKind::kEmbedding), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(RankGrid, EveryGroupKindPartitionsTheWorld) {
  // Property: for every kind that covers all ranks, each rank is in exactly
  // one group, and groups have the expected size.
  for (auto s : {GridSizes{.world = 64, .tp = 2, .pp = 4, .cp = 2, .ep = 4, .etp = 1},
                 GridSizes{.world = 48, .tp = 3, .pp = 2, .cp = 2, .ep = 2, .etp = 3, .tp_pp_dp_order = true},
                 GridSizes{.world = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 8, .etp = 1}}) {
    RankGrid g = make(s);
    for (GroupKind k : all_group_kinds()) {
      if (k == GroupKind::kEmbedding || k == GroupKind::kPositionEmbedding) continue;
      std::vector<int> seen(s.world, 0);
      for (const auto& grp : g.groups(k))
        for (int64_t r : grp) seen[r]++;
      for (int64_t r = 0; r < s.world; ++r) EXPECT_EQ(seen[r], 1) << group_kind_name(k) << " rank " << r;
    }
    EXPECT_EQ(g.groups(GroupKind::kTensor).front().size(), static_cast<size_t>(s.tp));
    EXPECT_EQ(g.groups(GroupKind::kPipeline).front().size(), static_cast<size_t>(s.pp));
    EXPECT_EQ(g.groups(GroupKind::kData).front().size(), static_cast<size_t>(g.dp()));
    EXPECT_EQ(g.groups(GroupKind::kExpert).front().size(), static_cast<size_t>(s.ep));
    EXPECT_EQ(g.groups(GroupKind::kExpertData).front().size(), static_cast<size_t>(g.edp()));
  }
}

TEST(RankGrid, RejectsIndivisibleWorld) {
  EXPECT_FALSE(RankGrid::create({.world = 30, .tp = 4, .pp = 2}).is_ok());
  EXPECT_FALSE(RankGrid::create({.world = 16, .tp = 2, .pp = 2, .ep = 3, .etp = 2}).is_ok());
  EXPECT_FALSE(RankGrid::create({.world = 0}).is_ok());
}

}  // namespace
}  // namespace mt::parallel
