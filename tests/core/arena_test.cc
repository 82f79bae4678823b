// Arena, SizeTable and the counter-based RNG.
#include <gtest/gtest.h>

#include <cmath>

#include "core/arena.h"
#include "core/rng.h"

namespace mt {
namespace {

TEST(SizeTable, OffsetsAreAlignedAndInOrder) {
  SizeTable t;
  t.add("a", {3}, DType::kF32);
  t.add("b", {5, 2}, DType::kBF16);
  t.add("c", {1}, DType::kI64);
  EXPECT_EQ(t[0].offset, 0u);
  EXPECT_EQ(t[1].offset, 64u);
  EXPECT_EQ(t[2].offset, 128u);
  EXPECT_EQ(t.total_bytes(), 192u);
  EXPECT_EQ(t.total_elements(), 14);
}

TEST(Arena, CarveAllocResetAndHighWater) {
  Arena a(4096, "test");
  SizeTable t;
  t.add("w", {10}, DType::kF32);
  t.add("b", {4}, DType::kF32);
  auto v = a.carve(t);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(static_cast<char*>(v[1].data()) - static_cast<char*>(v[0].data()), 64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v[0].data()) % kArenaAlign, 0u);
  size_t m = a.mark();
  {
    ArenaScope s(a);
    Tensor x = a.alloc({256}, DType::kF32);
    EXPECT_EQ(x.numel(), 256);
  }
  EXPECT_EQ(a.used(), m);
  EXPECT_EQ(a.high_water(), m + 1024);
  EXPECT_DEATH(a.alloc({4096}, DType::kF32), "full");
}

TEST(Tensor, ViewAndSlice) {
  float buf[12];
  Tensor t(buf, {4, 3}, DType::kF32);
  EXPECT_EQ(t.slice(1, 3).data(), buf + 3);
  EXPECT_EQ(t.slice(1, 3).shape(), (Shape{2, 3}));
  EXPECT_EQ(t.view({12}).numel(), 12);
}

TEST(Rng, PhiloxIsDeterministicAndNormalHasUnitMoments) {
  EXPECT_EQ(philox_uniform(1, 2, 3), philox_uniform(1, 2, 3));
  EXPECT_NE(philox_uniform(1, 2, 3), philox_uniform(1, 2, 4));
  EXPECT_NE(philox_uniform(1, 2, 3), philox_uniform(2, 2, 3));
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    double x = philox_normal(1234, 5, static_cast<uint64_t>(i));
    s += x, s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

}  // namespace
}  // namespace mt
