// The op profile (core/op_profile.h): dispatched calls are counted per op and
// device, a call inside another timed call counts only in the outer one, and
// nothing is recorded while it is off. (GPU timing by events: the CudaTwin
// test OpProfileTimesGpuCallsWithEvents.)

#include "core/op_profile.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

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

// GEMMs are counted per shape with 2 M N K FLOPs a call, attention with the
// causal pairs' FLOPs (backward 2.5x), and the table gives their TFLOP/s.
TEST(OpProfile, CountsFlopsOfGemmShapesAndAttention) {
  profile::set_enabled(true);
  profile::reset();
  std::vector<float> a(3 * 5, 1.0f), b(5 * 4, 0.5f), c(3 * 4, 0.0f);
  const Tensor A(a.data(), {3, 5}, DType::kF32), B(b.data(), {5, 4}, DType::kF32), C(c.data(), {3, 4}, DType::kF32);
  kernels::gemm(false, false, 3, 4, 5, 1.0f, A, B, 0.0f, C);
  kernels::gemm(false, false, 3, 4, 5, 1.0f, A, B, 0.0f, C);
  const Tensor Bt(b.data(), {4, 5}, DType::kF32);
  kernels::gemm(false, true, 3, 4, 5, 1.0f, A, Bt, 1.0f, C);
  EXPECT_EQ(c[0], 2.5f + 2.5f);  // the calls ran (beta 0, then beta 1)

  // Causal attention over T = 6, batch 2, 2 heads (1 group), head_dim 4.
  const kernels::QkvLayout L{.seq = 6, .batch = 2, .heads = 2, .groups = 1, .head_dim = 4};
  std::vector<float> qkv(static_cast<size_t>(L.tokens() * L.row()), 0.1f), out(static_cast<size_t>(L.tokens() * 8)),
      lse(static_cast<size_t>(2 * 2 * 6)), dqkv(qkv.size());
  const Tensor Q(qkv.data(), {L.tokens(), L.row()}, DType::kF32), O(out.data(), {L.tokens(), 8}, DType::kF32),
      S(lse.data(), {2, 2, 6}, DType::kF32), dQ(dqkv.data(), {L.tokens(), L.row()}, DType::kF32);
  kernels::AttentionOptions ao;
  ao.scale = 0.5;
  kernels::attention_forward(Q, L, ao, O, S);
  kernels::attention_backward(Q, O, O, S, L, ao, dQ);

  const std::vector<profile::OpStat> stats = profile::collect();
  profile::set_enabled(false);
  profile::reset();
  const profile::OpStat* nn = find(stats, "gemm 3x4x5 NN fp32>fp32");
  const profile::OpStat* nt = find(stats, "gemm 3x4x5 NT fp32>fp32");
  ASSERT_NE(nn, nullptr);
  ASSERT_NE(nt, nullptr);
  EXPECT_EQ(find(stats, "gemm"), nullptr);  // the dispatcher's own scope nests inside the labelled one
  EXPECT_EQ(nn->calls, 2);
  EXPECT_EQ(nn->flops, 2 * 2.0 * 3 * 4 * 5);
  EXPECT_EQ(nt->flops, 2.0 * 3 * 4 * 5);
  const double fwd = 4.0 * 2 * 2 * 4 * (6 * 7 / 2);  // 4 B a d T(T+1)/2
  const profile::OpStat* af = find(stats, "attention_forward");
  const profile::OpStat* ab = find(stats, "attention_backward");
  ASSERT_NE(af, nullptr);
  ASSERT_NE(ab, nullptr);
  EXPECT_EQ(af->calls, 1);
  EXPECT_EQ(af->flops, fwd);
  EXPECT_EQ(ab->flops, 2.5 * fwd);
  EXPECT_NEAR(nn->tflops(), nn->ms > 0 ? nn->flops / (nn->ms * 1e9) : 0.0, 1e-12);
  const std::string t = profile::table(stats, 1, 1.0);
  EXPECT_NE(t.find("TFLOP/s"), std::string::npos) << t;
  EXPECT_NE(t.find("gemm 3x4x5 NT fp32>fp32"), std::string::npos) << t;
  // The same label is the same interned string.
  EXPECT_EQ(profile::intern("gemm 3x4x5 NN fp32>fp32"), profile::gemm_label(false, false, 3, 4, 5, DType::kF32, DType::kF32));
}

}  // namespace
}  // namespace mt
