// GradBuckets over MPI_COMM_WORLD (the data-parallel group) at 1, 2 and 4
// ranks: bucket boundaries worked out by hand, all-reduce and reduce-scatter
// against closed-form sums (synchronous and overlapped, with the launch
// points of the overlapped buckets), and the parameter all-gather.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "comm/communicator.h"
#include "parallel/grad_buckets.h"

namespace mt::parallel {
namespace {

// A 64-element buffer with four parameters (gap [55, 56), padding [60, 64)).
// Stages: -1 (embedding), 0, 1, 2 (= L, final norm / output layer).
constexpr int64_t kN = 64;
std::vector<ParamRange> test_ranges() { return {{0, 9, -1}, {9, 31, 0}, {31, 55, 1}, {56, 60, 2}}; }
constexpr int kLast = 2;

template <typename T>
Tensor tensor(std::vector<T>& v) {
  return Tensor(v.data(), {static_cast<int64_t>(v.size())}, dtype_of<T>());
}

void expect_buckets(const GradBuckets& gb, const std::vector<Bucket>& want) {
  ASSERT_EQ(gb.buckets().size(), want.size());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(gb.buckets()[b].begin, want[b].begin) << "bucket " << b;
    EXPECT_EQ(gb.buckets()[b].end, want[b].end) << "bucket " << b;
    EXPECT_EQ(gb.buckets()[b].params, want[b].params) << "bucket " << b;
  }
}

// Hand-computed buckets of test_ranges() with bucket_elems = 20 (parameters
// taken last first; a bucket closes once it holds >= 20 elements, at the
// parameter's start rounded down to a multiple of DP).
std::vector<Bucket> hand_buckets(int dp) {
  switch (dp) {
    case 1:  // [56,60): 8 < 20; [31,55): 33 -> close at 31; [9,31): 22 -> close at 9; rest [0,9).
      return {{31, 64, {2, 3}}, {9, 31, {1}}, {0, 9, {0}}};
    case 2:  // close at 31 -> 30 (range 1 straddles); [9,31): 30 - 9 = 21 -> close at 8; rest [0,8).
      return {{30, 64, {1, 2, 3}}, {8, 30, {0, 1}}, {0, 8, {0}}};
    case 4:  // close at 31 -> 28; [9,31): 28 - 9 = 19 < 20; [0,9): 28 -> start 0: the last bucket.
      return {{28, 64, {1, 2, 3}}, {0, 28, {0, 1}}};
    default: return {};
  }
}

TEST(GradBuckets, BucketFormation) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  if (DP != 1 && DP != 2 && DP != 4) GTEST_SKIP() << "hand-computed boundaries exist for DP 1, 2 and 4";
  std::vector<double> g(kN), p(kN);

  // Overlap with 20-element buckets.
  for (GradReduceMode mode : {GradReduceMode::kAllReduce, GradReduceMode::kReduceScatter}) {
    GradBuckets gb(tensor(g), tensor(p), test_ranges(), *dp, {mode, true, 20});
    const auto want = hand_buckets(DP);
    expect_buckets(gb, want);
    ASSERT_EQ(gb.shard().size(), want.size());
    for (size_t b = 0; b < want.size(); ++b) {
      const int64_t n = want[b].end - want[b].begin;
      EXPECT_EQ(n % DP, 0);
      const ShardBlock& s = gb.shard()[b];
      EXPECT_EQ(s.bucket, static_cast<int>(b));
      if (mode == GradReduceMode::kReduceScatter) {
        EXPECT_EQ(s.begin, want[b].begin + r * n / DP);
        EXPECT_EQ(s.end, want[b].begin + (r + 1) * n / DP);
      } else {
        EXPECT_EQ(s.begin, want[b].begin);
        EXPECT_EQ(s.end, want[b].end);
      }
    }
  }
  // Spelled out for DP = 4, rank 3, reduce-scatter: blocks [55, 64) and [21, 28).
  if (DP == 4 && r == 3) {
    GradBuckets gb(tensor(g), tensor(p), test_ranges(), *dp, {GradReduceMode::kReduceScatter, true, 20});
    EXPECT_EQ(gb.shard()[0].begin, 55);
    EXPECT_EQ(gb.shard()[0].end, 64);
    EXPECT_EQ(gb.shard()[1].begin, 21);
    EXPECT_EQ(gb.shard()[1].end, 28);
  }
  // Without overlap: one bucket, the whole buffer, whatever bucket_elems says.
  {
    GradBuckets gb(tensor(g), tensor(p), test_ranges(), *dp, {GradReduceMode::kReduceScatter, false, 20});
    expect_buckets(gb, {{0, kN, {0, 1, 2, 3}}});
    ASSERT_EQ(gb.shard().size(), 1u);
    EXPECT_EQ(gb.shard()[0].begin, r * kN / DP);
    EXPECT_EQ(gb.shard()[0].end, (r + 1) * kN / DP);
  }
  // Overlap with Megatron's default size (40M elements): one bucket.
  {
    GradBuckets gb(tensor(g), Tensor(), test_ranges(), *dp, {GradReduceMode::kAllReduce, true, 0});
    expect_buckets(gb, {{0, kN, {0, 1, 2, 3}}});
  }
  // One-element buckets: every parameter start (rounded down) is a boundary.
  {
    GradBuckets gb(tensor(g), Tensor(), test_ranges(), *dp, {GradReduceMode::kAllReduce, true, 1});
    std::vector<Bucket> want;
    if (DP == 1) want = {{56, 64, {3}}, {31, 56, {2}}, {9, 31, {1}}, {0, 9, {0}}};
    if (DP == 2) want = {{56, 64, {3}}, {30, 56, {1, 2}}, {8, 30, {0, 1}}, {0, 8, {0}}};
    if (DP == 4) want = {{56, 64, {3}}, {28, 56, {1, 2}}, {8, 28, {0, 1}}, {0, 8, {0}}};
    expect_buckets(gb, want);
  }
}

// g[j] on rank r in iteration `it`; the sum over ranks is closed form.
double local_grad(int r, int64_t j, int it) { return (r + 1) * (j + 1) * (it + 1) + 0.5 * r; }
double summed_grad(int DP, int64_t j, int it) {
  return (j + 1) * (it + 1) * DP * (DP + 1) / 2.0 + 0.5 * DP * (DP - 1) / 2.0;
}

// Buckets whose every parameter has a stage in `marked`.
size_t complete_buckets(const GradBuckets& gb, const std::vector<ParamRange>& ranges, const std::set<int>& marked) {
  size_t n = 0;
  for (const Bucket& b : gb.buckets()) {
    bool all = true;
    for (int p : b.params) all = all && marked.count(ranges[static_cast<size_t>(p)].stage) > 0;
    n += all ? 1 : 0;
  }
  return n;
}

template <typename T>
void check_reduction(GradReduceMode mode, bool overlap) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  std::vector<T> g(kN);
  const auto ranges = test_ranges();
  GradBuckets gb(tensor(g), Tensor(), ranges, *dp, {mode, overlap, 20});
  for (int it = 0; it < 3; ++it) {
    for (int64_t j = 0; j < kN; ++j) g[static_cast<size_t>(j)] = static_cast<T>(local_grad(r, j, it));
    dp->reset_stats();
    // Progress reported before begin_last_backward() (earlier micro-batches) launches nothing.
    for (int s = kLast; s >= -1; --s) gb.mark_ready(s);
    EXPECT_EQ(dp->stats().calls, 0u);
    gb.begin_last_backward();
    std::set<int> marked;
    for (int s = kLast; s >= -1; --s) {
      gb.mark_ready(s);
      marked.insert(s);
      // Overlap: a bucket starts as soon as all its parameters are ready.
      const size_t want = overlap && DP > 1 ? complete_buckets(gb, ranges, marked) : 0;
      EXPECT_EQ(dp->stats().calls, want) << "after mark_ready(" << s << ")";
    }
    gb.finish();
    EXPECT_EQ(dp->stats().calls, DP > 1 ? gb.buckets().size() : 0u);
    if (DP > 1) {
      const uint64_t bytes = kN * sizeof(T);
      const uint64_t got = mode == GradReduceMode::kAllReduce ? dp->stats().all_reduce_bytes
                                                               : dp->stats().reduce_scatter_bytes;
      EXPECT_EQ(got, bytes);
    }
    std::vector<char> owned(kN, 0);
    for (const ShardBlock& s : gb.shard())
      for (int64_t j = s.begin; j < s.end; ++j) owned[static_cast<size_t>(j)] = 1;
    for (int64_t j = 0; j < kN; ++j) {
      const T got = g[static_cast<size_t>(j)];
      if (owned[static_cast<size_t>(j)])
        EXPECT_EQ(got, static_cast<T>(summed_grad(DP, j, it))) << "element " << j << " iteration " << it;
      else  // reduce-scatter leaves the other blocks as they were (here: this rank's own values)
        EXPECT_EQ(got, static_cast<T>(local_grad(r, j, it))) << "element " << j << " iteration " << it;
    }
    if (mode == GradReduceMode::kAllReduce) {
      EXPECT_EQ(std::count(owned.begin(), owned.end(), 1), kN);
    }
  }
}

TEST(GradBuckets, AllReduce) { check_reduction<double>(GradReduceMode::kAllReduce, false); }
TEST(GradBuckets, AllReduce_Overlap) { check_reduction<double>(GradReduceMode::kAllReduce, true); }
TEST(GradBuckets, AllReduce_OverlapF32) { check_reduction<float>(GradReduceMode::kAllReduce, true); }
TEST(GradBuckets, ReduceScatter) { check_reduction<double>(GradReduceMode::kReduceScatter, false); }
TEST(GradBuckets, ReduceScatter_Overlap) { check_reduction<double>(GradReduceMode::kReduceScatter, true); }
TEST(GradBuckets, ReduceScatter_OverlapF32) { check_reduction<float>(GradReduceMode::kReduceScatter, true); }

// Overlap, but finish() without any progress reported: everything starts in finish().
TEST(GradBuckets, ReduceScatter_OverlapFinishOnly) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  std::vector<double> g(kN);
  for (int64_t j = 0; j < kN; ++j) g[static_cast<size_t>(j)] = local_grad(r, j, 0);
  GradBuckets gb(tensor(g), Tensor(), test_ranges(), *dp, {GradReduceMode::kReduceScatter, true, 1});
  gb.begin_last_backward();
  gb.mark_ready(kLast);  // only the last bucket's parameter
  gb.finish();
  for (const ShardBlock& s : gb.shard())
    for (int64_t j = s.begin; j < s.end; ++j) EXPECT_EQ(g[static_cast<size_t>(j)], summed_grad(DP, j, 0));
}

double param_value(int64_t j) { return 0.25 * static_cast<double>(j) + 3; }

// Each rank writes only its blocks of the parameter buffer (garbage elsewhere).
void fill_own_blocks(const GradBuckets& gb, std::vector<double>& p, int r) {
  std::fill(p.begin(), p.end(), -1000.0 * (r + 1));
  for (const ShardBlock& s : gb.shard())
    for (int64_t j = s.begin; j < s.end; ++j) p[static_cast<size_t>(j)] = param_value(j);
}

TEST(GradBuckets, AllGatherParams) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  std::vector<double> g(kN), p(kN);
  for (bool overlap : {false, true}) {
    GradBuckets gb(tensor(g), tensor(p), test_ranges(), *dp, {GradReduceMode::kReduceScatter, overlap, 20});
    fill_own_blocks(gb, p, r);
    dp->reset_stats();
    gb.all_gather_params();
    EXPECT_EQ(dp->stats().calls, DP > 1 ? gb.buckets().size() : 0u);
    if (DP > 1) {
      EXPECT_EQ(dp->stats().all_gather_bytes, kN * sizeof(double));
    }
    for (int64_t j = 0; j < kN; ++j) EXPECT_EQ(p[static_cast<size_t>(j)], param_value(j)) << "element " << j;
  }
}

TEST(GradBuckets, AllGatherParams_Async) {
  auto dp = comm::world_communicator();
  const int r = dp->rank();
  std::vector<double> g(kN), p(kN);
  const auto ranges = test_ranges();
  GradBuckets gb(tensor(g), tensor(p), ranges, *dp, {GradReduceMode::kReduceScatter, true, 20});
  for (int it = 0; it < 2; ++it) {
    fill_own_blocks(gb, p, r);
    gb.start_param_gather();
    // Forward order: each stage's parameters are complete once its buckets were waited for.
    for (int s = -1; s <= kLast; ++s) {
      gb.wait_param_gather(s);
      for (const ParamRange& pr : ranges) {
        if (pr.stage != s) continue;
        for (int64_t j = pr.begin; j < pr.end; ++j)
          EXPECT_EQ(p[static_cast<size_t>(j)], param_value(j)) << "stage " << s << " element " << j;
      }
    }
    gb.wait_param_gather_all();
    for (int64_t j = 0; j < kN; ++j) EXPECT_EQ(p[static_cast<size_t>(j)], param_value(j)) << "element " << j;
  }
  // wait_param_gather_all alone also completes a gather.
  fill_own_blocks(gb, p, r);
  gb.start_param_gather();
  gb.wait_param_gather_all();
  for (int64_t j = 0; j < kN; ++j) EXPECT_EQ(p[static_cast<size_t>(j)], param_value(j)) << "element " << j;
}

// kAllReduce has nothing to gather: a no-op.
TEST(GradBuckets, AllGatherParams_AllReduceIsNoOp) {
  auto dp = comm::world_communicator();
  std::vector<double> g(kN);
  GradBuckets gb(tensor(g), Tensor(), test_ranges(), *dp, {GradReduceMode::kAllReduce, false, 0});
  dp->reset_stats();
  gb.all_gather_params();
  gb.start_param_gather();
  gb.wait_param_gather_all();
  EXPECT_EQ(dp->stats().calls, 0u);
}

}  // namespace
}  // namespace mt::parallel
