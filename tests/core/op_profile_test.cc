// The op profile (core/op_profile.h): dispatched calls are counted per op and
// device, a call inside another timed call counts only in the outer one, and
// nothing is recorded while it is off. (GPU timing by events: the CudaTwin
// test OpProfileTimesGpuCallsWithEvents.)

#include "core/op_profile.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/elementwise.h"

namespace mt {
namespace {

const profile::OpStat* find(const std::vector<profile::OpStat>& stats, const std::string& op) {
  for (const profile::OpStat& s : stats)
    if (s.op == op) return &s;
  return nullptr;
}

TEST(OpProfile, CountsOutermostCallsPerOpAndDevice) {
  profile::set_enabled(true);
  profile::reset();
  std::vector<float> a(4096, 1.0f), b(4096, 2.0f);
  const Tensor ta(a.data(), {4096}, DType::kF32), tb(b.data(), {4096}, DType::kF32);
  for (int i = 0; i < 3; ++i) kernels::add_inplace(ta, tb);
  {
    profile::OpScope outer("outer_op", Device::kCpu);
    kernels::add_inplace(ta, tb);  // inside outer_op: counted there only
  }
  kernels::add_inplace(ta, tb);  // after the nested one: timed again
  std::vector<profile::OpStat> stats = profile::collect();
  ASSERT_EQ(stats.size(), 2u);
  const profile::OpStat* add = find(stats, "add_inplace");
  const profile::OpStat* outer = find(stats, "outer_op");
  ASSERT_NE(add, nullptr);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(add->calls, 4);
  EXPECT_EQ(add->device, Device::kCpu);
  EXPECT_GE(add->ms, 0.0);
  EXPECT_EQ(outer->calls, 1);
  EXPECT_EQ(a[0], 1.0f + 5 * 2.0f);  // the calls ran

  // The table: one row per op, calls per iteration over 4 iterations.
  const std::string t = profile::table(stats, 4, 10.0);
  EXPECT_NE(t.find("op profile over 4 iteration(s)"), std::string::npos) << t;
  EXPECT_NE(t.find("add_inplace"), std::string::npos) << t;
  EXPECT_NE(t.find("1.0"), std::string::npos) << t;  // 4 calls / 4 iterations

  // Off: nothing more is recorded; reset forgets the totals.
  profile::set_enabled(false);
  kernels::add_inplace(ta, tb);
  stats = profile::collect();
  ASSERT_NE(find(stats, "add_inplace"), nullptr);
  EXPECT_EQ(find(stats, "add_inplace")->calls, 4);
  profile::reset();
  EXPECT_TRUE(profile::collect().empty());
}

}  // namespace
}  // namespace mt
