// Pipeline schedules checked without a model: order invariants, Megatron's
// interleaved order, in-flight counts, deadlock freedom and the bubble.
#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace mt::parallel {
namespace {

bool interleaved_valid(int64_t P, int64_t M, int64_t N) { return N >= P && N <= M && (M % N == 0 || M % N >= P); }

TEST(Schedule, MegatronInterleavedOrderExample) {
  // From schedules.py: P=2, N=3, M=5, V=2.
  auto order = interleaved_order(2, 5, 3);
  std::vector<int> mb, chunk;
  for (auto [m, c] : order) mb.push_back(m), chunk.push_back(c);
  EXPECT_EQ(mb, (std::vector<int>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunk, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
}

TEST(Schedule, OneFOneBWarmupCounts) {
  auto s = build_schedule(4, 1, 8, 0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->kind, ScheduleKind::kOneFOneB);
  for (int r = 0; r < 4; ++r) {
    int warm = 0;
    for (const auto& a : s->ranks[r]) {
      if (a.op == Action::kBackward) break;
      ++warm;
    }
    EXPECT_EQ(warm, std::min(4 - r - 1, 8) + 1) << "rank " << r;  // warm-up plus the first steady forward
  }
}

TEST(Schedule, InvariantsAndNoDeadlockAcrossSizes) {
  for (int64_t P : {1, 2, 4, 8})
    for (int64_t V : {1, 2, 4}) {
      if (P == 1 && V > 1) continue;
      for (int64_t M = P; M <= 4 * P; ++M) {
        if (V > 1 && !interleaved_valid(P, M, P)) {
          EXPECT_FALSE(build_schedule(P, V, M, 0).is_ok()) << P << " " << V << " " << M;
          continue;
        }
        auto s = build_schedule(P, V, M, 0);
        ASSERT_TRUE(s.is_ok()) << s.status().message();
        for (int64_t r = 0; r < P; ++r) {
          std::set<std::pair<int, int>> fwd, bwd;
          for (const auto& a : s->ranks[r]) {
            auto key = std::make_pair(a.microbatch, a.chunk);
            if (a.op == Action::kForward) {
              EXPECT_TRUE(fwd.insert(key).second) << "forward twice";
            } else {
              EXPECT_TRUE(fwd.count(key)) << "backward before forward: P=" << P << " V=" << V << " M=" << M << " r=" << r;
              EXPECT_TRUE(bwd.insert(key).second) << "backward twice";
            }
          }
          EXPECT_EQ(fwd.size(), static_cast<size_t>(M * V));
          EXPECT_EQ(bwd.size(), static_cast<size_t>(M * V));
        }
        Timeline t = simulate(*s, 1, 1);
        ASSERT_FALSE(t.deadlock) << "P=" << P << " V=" << V << " M=" << M;
        for (int64_t r = 0; r < P; ++r) {
          int64_t expect = V == 1 ? std::min(P - r, M) : std::min((P - r - 1) * 2 + (V - 1) * P + 1, M * V);
          if (P == 1) expect = 1;
          EXPECT_EQ(t.max_in_flight[r], expect) << "P=" << P << " V=" << V << " M=" << M << " r=" << r;
        }
      }
    }
}

TEST(Schedule, OneFOneBBubbleMatchesFormula) {
  for (int64_t P : {2, 4, 8})
    for (int64_t M = P; M <= 4 * P; ++M)
      for (double tb : {1.0, 2.0}) {
        auto s = build_schedule(P, 1, M, 0);
        Timeline t = simulate(*s, 1, tb);
        EXPECT_NEAR(t.bubble_fraction, bubble_formula(P, 1, M), 1e-12) << "P=" << P << " M=" << M << " tb=" << tb;
      }
}

TEST(Schedule, InterleavedBubbleMatchesFormulaForFullGroups) {
  // Unit-time chunk actions, M a multiple of P: the simulated idle share is
  // (P-1)/(P-1+V*M), a V-fold smaller bubble than 1F1B.
  for (int64_t P : {2, 4, 8})
    for (int64_t V : {2, 4})
      for (int64_t M : {P, 2 * P, 4 * P}) {
        auto s = build_schedule(P, V, M, 0);
        ASSERT_TRUE(s.is_ok());
        Timeline t = simulate(*s, 1, 1);
        EXPECT_NEAR(t.bubble_fraction, bubble_formula(P, V, M), 1e-12) << "P=" << P << " V=" << V << " M=" << M;
      }
}

TEST(Schedule, NoPipeliningAlternates) {
  auto s = build_schedule(1, 1, 3, 0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->kind, ScheduleKind::kNoPipelining);
  ASSERT_EQ(s->ranks[0].size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s->ranks[0][i].op, i % 2 == 0 ? Action::kForward : Action::kBackward);
  EXPECT_EQ(simulate(*s, 1, 2).bubble_fraction, 0);
}

TEST(Schedule, SeedBubble) {
  EXPECT_NEAR(bubble_formula(2, 1, 8), 1.0 / 9.0, 1e-15);
  EXPECT_NEAR(bubble_formula(2, 1, 8), 0.111, 5e-4);
}

}  // namespace
}  // namespace mt::parallel
