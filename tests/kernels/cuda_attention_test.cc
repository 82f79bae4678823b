// Attention's CUDA twins (kernels/cuda/attention.cu, kv_attention.cu) against
// the CPU twins on the same inputs: forward (out, lse) and backward (dqkv) for
// MHA and GQA, head_dim 64 / 128 / 256 and odd sizes (40, 96, 200), sequence
// lengths that are not multiples of any tile (77, 130, 45, 1), batch 2;
// fp32, fp64 and bf16 qkv; dropout with a nonzero head_offset (the masks come
// from Philox on both sides, so they must agree element for element); the
// GPU's outputs pre-filled with NaN (every element must be written, dqkv is
// written, not accumulated); bitwise determinism run to run; and incremental
// decoding (kv_cache_append + kv_attention) over several appended chunks.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/kv_attention.h"
#include "test_util.h"

namespace mt::test {
namespace {

namespace k = ::mt::kernels;

template <typename T>
std::vector<T> convert(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) out[i] = float_to_bf16(static_cast<float>(v[i]));
    else out[i] = static_cast<T>(v[i]);
  }
  return out;
}

// A device tensor whose every element is NaN: outputs the kernel must overwrite.
template <typename T>
Tensor nan_device(Arena& g, Shape s) {
  std::vector<T> nan(static_cast<size_t>(s.numel()), std::numeric_limits<T>::quiet_NaN());
  Tensor d = g.alloc(s, dtype_of<T>());
  copy_tensor(Tensor(nan.data(), s, dtype_of<T>()), d);
  return d;
}

std::string describe(const k::QkvLayout& L, const char* dtype, double dropout, int64_t head_offset) {
  return fmt::format("attention {} T={} B={} heads={} groups={} d={} dropout={} head_offset={}", dtype, L.seq,
                     L.batch, L.heads, L.groups, L.head_dim, dropout, head_offset);
}

struct Tol {
  double rtol, atol_out, atol_lse, atol_grad;
};

// Runs forward and backward on both devices for qkv type In (accumulation
// and output type A) and compares out, lse and dqkv. Backward on the GPU gets
// the CPU's out and lse, so it is compared on exactly the CPU's inputs.
template <typename In, typename A>
void run_case(const k::QkvLayout& L, double dropout, int64_t head_offset, const Tol& tol) {
  const std::string what = describe(L, dtype_name(dtype_of<In>()), dropout, head_offset);
  const k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 1234, 77, head_offset};
  const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
  std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
  fill_normal(qkv_d, 100 + static_cast<uint64_t>(L.seq * 7 + L.head_dim), 1.0);
  fill_normal(dout_d, 200 + static_cast<uint64_t>(L.heads * 13 + L.head_dim), 1.0);
  std::vector<In> qkv = convert<In>(qkv_d);
  std::vector<A> dout = convert<A>(dout_d);
  std::vector<A> out(static_cast<size_t>(os.numel())), lse(static_cast<size_t>(ls.numel())),
      dqkv(static_cast<size_t>(qs.numel()));
  const Tensor t_qkv(qkv.data(), qs, dtype_of<In>()), t_dout(dout.data(), os, dtype_of<A>()),
      t_out(out.data(), os, dtype_of<A>()), t_lse(lse.data(), ls, dtype_of<A>()),
      t_dqkv(dqkv.data(), qs, dtype_of<A>());
  k::attention_forward(t_qkv, L, o, t_out, t_lse);
  k::attention_backward(t_qkv, t_out, t_dout, t_lse, L, o, t_dqkv);

  Arena g = gpu_arena();
  const Tensor d_qkv = to_device(g, t_qkv), d_dout = to_device(g, t_dout);
  const Tensor d_out = nan_device<A>(g, os), d_lse = nan_device<A>(g, ls), d_dqkv = nan_device<A>(g, qs);
  k::attention_forward(d_qkv, L, o, d_out, d_lse);
  expect_close(to_host<A>(d_out), out, tol.rtol, tol.atol_out, what + ": out");
  expect_close(to_host<A>(d_lse), lse, tol.rtol, tol.atol_lse, what + ": lse");

  const Tensor d_out_cpu = to_device(g, t_out), d_lse_cpu = to_device(g, t_lse);
  k::attention_backward(d_qkv, d_out_cpu, d_dout, d_lse_cpu, L, o, d_dqkv);
  expect_close(to_host<A>(d_dqkv), dqkv, tol.rtol, tol.atol_grad, what + ": dqkv");
}

// Relative Frobenius error, as the CPU's bf16 test measures it.
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d, den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

constexpr Tol kFp32{1e-4, 1e-5, 1e-5, 1e-4};
constexpr Tol kFp64{1e-10, 1e-12, 1e-12, 1e-11};

TEST(CudaTwin, AttentionFp32MatchesCpu) {
  MT_REQUIRE_GPU();
  // {seq, batch, heads, groups, head_dim}
  for (const k::QkvLayout& L : {k::QkvLayout{77, 2, 4, 2, 64}, k::QkvLayout{130, 2, 8, 1, 128},
                                k::QkvLayout{77, 2, 4, 4, 40}, k::QkvLayout{70, 2, 3, 3, 96},
                                k::QkvLayout{33, 2, 2, 1, 256}, k::QkvLayout{45, 1, 2, 1, 200},
                                k::QkvLayout{1, 3, 2, 1, 64}})
    run_case<float, float>(L, 0.0, 0, kFp32);
}

TEST(CudaTwin, AttentionFp64MatchesCpu) {
  MT_REQUIRE_GPU();
  for (const k::QkvLayout& L : {k::QkvLayout{77, 2, 4, 2, 64}, k::QkvLayout{130, 2, 8, 1, 128},
                                k::QkvLayout{77, 2, 4, 4, 40}, k::QkvLayout{45, 1, 2, 1, 200}})
    run_case<double, double>(L, 0.0, 0, kFp64);
}

TEST(CudaTwin, AttentionBf16QkvMatchesCpu) {
  MT_REQUIRE_GPU();
  // Both twins widen the same bf16 values exactly and accumulate in fp32, so
  // they agree to fp32 rounding; the elementwise bound is looser than that,
  // and the relative error is also held to the CPU bf16 test's bounds.
  for (const k::QkvLayout& L :
       {k::QkvLayout{77, 2, 4, 2, 64}, k::QkvLayout{130, 2, 8, 1, 128}, k::QkvLayout{77, 2, 4, 4, 40}}) {
    run_case<bf16, float>(L, 0.0, 0, Tol{1e-3, 1e-4, 1e-4, 1e-3});
    // The CPU bf16 test's measure: relative Frobenius error of out and dqkv.
    const k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), 0, 0, 0, 0};
    const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
    std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
    fill_normal(qkv_d, 16, 1.0);
    fill_normal(dout_d, 17, 1.0);
    std::vector<bf16> qkv = convert<bf16>(qkv_d);
    std::vector<float> dout = convert<float>(dout_d), out(static_cast<size_t>(os.numel())),
        lse(static_cast<size_t>(ls.numel())), dqkv(static_cast<size_t>(qs.numel()));
    const Tensor t_qkv(qkv.data(), qs, DType::kBF16), t_dout(dout.data(), os, DType::kF32),
        t_out(out.data(), os, DType::kF32), t_lse(lse.data(), ls, DType::kF32), t_dqkv(dqkv.data(), qs, DType::kF32);
    k::attention_forward(t_qkv, L, o, t_out, t_lse);
    k::attention_backward(t_qkv, t_out, t_dout, t_lse, L, o, t_dqkv);
    Arena g = gpu_arena();
    const Tensor d_qkv = to_device(g, t_qkv), d_dout = to_device(g, t_dout);
    const Tensor d_out = nan_device<float>(g, os), d_lse = nan_device<float>(g, ls), d_dqkv = nan_device<float>(g, qs);
    k::attention_forward(d_qkv, L, o, d_out, d_lse);
    k::attention_backward(d_qkv, d_out, d_dout, d_lse, L, o, d_dqkv);
    const std::string what = describe(L, "bf16", 0, 0);
    EXPECT_LT(rel_err(to_host<float>(d_out), out), 1e-2) << what;
    EXPECT_LT(rel_err(to_host<float>(d_dqkv), dqkv), 2e-2) << what;
  }
}

TEST(CudaTwin, AttentionDropoutWithHeadOffsetMatchesCpu) {
  MT_REQUIRE_GPU();
  // A dropped element missing on one side would move the outputs by O(1), far
  // outside these tolerances.
  run_case<float, float>({77, 2, 4, 2, 64}, 0.2, 3, kFp32);
  run_case<float, float>({130, 2, 8, 1, 128}, 0.1, 8, kFp32);
  run_case<float, float>({77, 2, 4, 4, 40}, 0.3, 5, kFp32);
  run_case<double, double>({77, 2, 4, 2, 64}, 0.2, 3, kFp64);
  run_case<double, double>({45, 1, 2, 1, 200}, 0.25, 6, kFp64);
  run_case<bf16, float>({70, 2, 3, 3, 96}, 0.15, 2, Tol{1e-3, 1e-4, 1e-4, 1e-3});
}

TEST(CudaTwin, AttentionIsDeterministic) {
  MT_REQUIRE_GPU();
  const k::QkvLayout L{130, 2, 4, 2, 64};
  const k::AttentionOptions o{0.125, 0.1, 9, 4, 2};
  const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
  std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
  fill_normal(qkv_d, 5, 1.0);
  fill_normal(dout_d, 6, 1.0);
  std::vector<float> qkv = convert<float>(qkv_d), dout = convert<float>(dout_d);
  Arena g = gpu_arena();
  const Tensor d_qkv = to_device(g, Tensor(qkv.data(), qs, DType::kF32));
  const Tensor d_dout = to_device(g, Tensor(dout.data(), os, DType::kF32));
  std::vector<float> out[2], lse[2], dqkv[2];
  for (int run = 0; run < 2; ++run) {
    const Tensor d_out = nan_device<float>(g, os), d_lse = nan_device<float>(g, ls), d_dqkv = nan_device<float>(g, qs);
    k::attention_forward(d_qkv, L, o, d_out, d_lse);
    k::attention_backward(d_qkv, d_out, d_dout, d_lse, L, o, d_dqkv);
    out[run] = to_host<float>(d_out), lse[run] = to_host<float>(d_lse), dqkv[run] = to_host<float>(d_dqkv);
  }
  expect_close(out[1], out[0], 0, 0, "attention out run to run");
  expect_close(lse[1], lse[0], 0, 0, "attention lse run to run");
  expect_close(dqkv[1], dqkv[0], 0, 0, "attention dqkv run to run");
}

// The tensor-core kernels (AttentionOptions::bf16_matmul). The reference is
// the CPU twin on the same bf16-rounded qkv (an fp32 In holds bf16 values),
// so Q, K and V agree exactly; the GPU also rounds dO, P and dS to bf16 for
// their products (fp32 accumulation), so out and dqkv agree to bf16
// precision (measured on the emulator: about 1e-3 for out, 2.5e-3 for dqkv):
// relative Frobenius error, and every element within a fraction
// of the output's largest magnitude. lse comes from exact bf16 products summed
// in fp32: fp32 rounding only. Outputs start as NaN (all must be written),
// and a second run must give the same bits.
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

template <typename In>
void run_tc_case(const k::QkvLayout& L, double dropout, int64_t head_offset) {
  const std::string what = describe(L, dtype_name(dtype_of<In>()), dropout, head_offset) + " (tensor cores)";
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 4321, 19, head_offset};
  o.bf16_matmul = true;
  const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
  std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
  fill_normal(qkv_d, 400 + static_cast<uint64_t>(L.seq * 3 + L.head_dim), 1.0);
  fill_normal(dout_d, 500 + static_cast<uint64_t>(L.heads * 11 + L.head_dim), 1.0);
  for (double& x : qkv_d) x = bf16_to_float(float_to_bf16(static_cast<float>(x)));
  std::vector<In> qkv = convert<In>(qkv_d);
  std::vector<float> dout = convert<float>(dout_d), out(static_cast<size_t>(os.numel())),
      lse(static_cast<size_t>(ls.numel())), dqkv(static_cast<size_t>(qs.numel()));
  const Tensor t_qkv(qkv.data(), qs, dtype_of<In>()), t_dout(dout.data(), os, DType::kF32),
      t_out(out.data(), os, DType::kF32), t_lse(lse.data(), ls, DType::kF32), t_dqkv(dqkv.data(), qs, DType::kF32);
  k::attention_forward(t_qkv, L, o, t_out, t_lse);
  k::attention_backward(t_qkv, t_out, t_dout, t_lse, L, o, t_dqkv);

  Arena g = gpu_arena();
  const Tensor d_qkv = to_device(g, t_qkv), d_dout = to_device(g, t_dout);
  ASSERT_TRUE(k::cuda::attention_uses_tensor_cores(d_qkv, L, o)) << what;
  const Tensor d_out_cpu = to_device(g, t_out), d_lse_cpu = to_device(g, t_lse);
  std::vector<float> got_out[2], got_lse[2], got_dqkv[2];
  for (int run = 0; run < 2; ++run) {
    const Tensor d_out = nan_device<float>(g, os), d_lse = nan_device<float>(g, ls), d_dqkv = nan_device<float>(g, qs);
    k::attention_forward(d_qkv, L, o, d_out, d_lse);
    k::attention_backward(d_qkv, d_out_cpu, d_dout, d_lse_cpu, L, o, d_dqkv);
    got_out[run] = to_host<float>(d_out), got_lse[run] = to_host<float>(d_lse), got_dqkv[run] = to_host<float>(d_dqkv);
  }
  expect_close(got_lse[0], lse, 1e-5, 1e-4, what + ": lse");
  EXPECT_LT(rel_err(got_out[0], out), 5e-3) << what << ": out";
  EXPECT_LT(rel_err(got_dqkv[0], dqkv), 8e-3) << what << ": dqkv";
  expect_close(got_out[0], out, 0, 3e-2 * max_abs(out), what + ": out, elementwise");
  expect_close(got_dqkv[0], dqkv, 0, 3e-2 * max_abs(dqkv), what + ": dqkv, elementwise");
  expect_close(got_out[1], got_out[0], 0, 0, what + ": out run to run");
  expect_close(got_lse[1], got_lse[0], 0, 0, what + ": lse run to run");
  expect_close(got_dqkv[1], got_dqkv[0], 0, 0, what + ": dqkv run to run");
}

TEST(CudaTwin, AttentionTensorCoresMatchCpu) {
  MT_REQUIRE_GPU();
  // {seq, batch, heads, groups, head_dim}: partial and whole tiles, GQA and
  // MHA, a single token, both head sizes; fp32 and bf16 qkv.
  run_tc_case<float>({77, 2, 4, 2, 64}, 0.0, 0);
  run_tc_case<float>({130, 2, 4, 1, 128}, 0.0, 0);
  run_tc_case<float>({64, 1, 2, 2, 128}, 0.0, 0);
  run_tc_case<float>({1, 3, 2, 1, 64}, 0.0, 0);
  run_tc_case<bf16>({200, 1, 4, 2, 64}, 0.0, 0);
  run_tc_case<bf16>({45, 2, 2, 1, 128}, 0.0, 0);
  // Dropout with a head offset: the same Philox masks as the CPU twin.
  run_tc_case<float>({130, 2, 4, 2, 64}, 0.2, 3);
  run_tc_case<bf16>({77, 1, 4, 1, 128}, 0.1, 8);
}

TEST(CudaTwin, AttentionTensorCoresOnlyWhereBuilt) {
  MT_REQUIRE_GPU();
  // Without the permission, at another head size, or for fp64 the SIMT
  // kernels run (the tests above hold them to the CPU twin at fp32/fp64).
  Arena g = gpu_arena(size_t{1} << 20);
  k::AttentionOptions o{0.125, 0, 0, 0, 0};
  const Tensor f32 = g.alloc({8, 64 * 3}, DType::kF32), f64 = g.alloc({8, 64 * 3}, DType::kF64);
  EXPECT_FALSE(k::cuda::attention_uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
  o.bf16_matmul = true;
  EXPECT_TRUE(k::cuda::attention_uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
  EXPECT_FALSE(k::cuda::attention_uses_tensor_cores(f64, {8, 1, 1, 1, 64}, o));
  const Tensor d96 = g.alloc({8, 96 * 3}, DType::kF32);
  EXPECT_FALSE(k::cuda::attention_uses_tensor_cores(d96, {8, 1, 1, 1, 96}, o));
}

// Prefill then decode: chunks of new tokens appended to the caches, each chunk
// attending to everything before it. Outputs per chunk and the caches at the
// end are compared with the CPU twin (the caches exactly: they are copies).
template <typename T>
void run_kv_case(int64_t heads, int64_t groups, int64_t head_dim, double rtol, double atol) {
  const int64_t t_max = 150;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const Shape cs{t_max, groups, head_dim};
  std::vector<T> kc(static_cast<size_t>(cs.numel())), vc(static_cast<size_t>(cs.numel()));
  const Tensor t_kc(kc.data(), cs, dtype_of<T>()), t_vc(vc.data(), cs, dtype_of<T>());
  Arena g = gpu_arena();
  const Tensor d_kc = to_device(g, t_kc), d_vc = to_device(g, t_vc);  // both zero
  int64_t pos = 0;
  for (int64_t n : {90, 1, 7, 33, 1}) {
    const k::QkvLayout L{n, 1, heads, groups, head_dim};
    const std::string what = fmt::format("kv_attention {} heads={} groups={} d={} pos={} n={}",
                                         dtype_name(dtype_of<T>()), heads, groups, head_dim, pos, n);
    const Shape qs{n, L.row()}, os{n, heads * head_dim};
    std::vector<double> qkv_d(static_cast<size_t>(qs.numel()));
    fill_normal(qkv_d, 300 + static_cast<uint64_t>(pos), 1.0);
    std::vector<T> qkv = convert<T>(qkv_d), out(static_cast<size_t>(os.numel()));
    const Tensor t_qkv(qkv.data(), qs, dtype_of<T>()), t_out(out.data(), os, dtype_of<T>());
    k::kv_cache_append(t_qkv, L, pos, t_kc, t_vc);
    k::kv_attention(t_qkv, L, t_kc, t_vc, pos, scale, t_out);

    const Tensor d_qkv = to_device(g, t_qkv), d_out = nan_device<T>(g, os);
    k::kv_cache_append(d_qkv, L, pos, d_kc, d_vc);
    k::kv_attention(d_qkv, L, d_kc, d_vc, pos, scale, d_out);
    expect_close(to_host<T>(d_out), out, rtol, atol, what + ": out");
    pos += n;
  }
  ASSERT_LE(pos, t_max);
  expect_close(to_host<T>(d_kc), kc, 0, 0, "kv_cache_append: k cache");
  expect_close(to_host<T>(d_vc), vc, 0, 0, "kv_cache_append: v cache");
}

TEST(CudaTwin, AttentionKvCacheAppendAndDecodeMatchCpu) {
  MT_REQUIRE_GPU();
  run_kv_case<float>(4, 2, 64, 1e-4, 1e-5);
  run_kv_case<float>(8, 1, 40, 1e-4, 1e-5);
  run_kv_case<float>(2, 2, 256, 1e-4, 1e-5);
  run_kv_case<double>(4, 2, 64, 1e-10, 1e-12);
  run_kv_case<double>(8, 1, 40, 1e-10, 1e-12);
}

}  // namespace
}  // namespace mt::test
