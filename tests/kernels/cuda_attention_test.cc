// Attention's CUDA twins (kernels/cuda/attention.cu, kv_attention.cu) against
// the CPU twins on the same inputs: forward (out, lse) and backward (dqkv) for
// MHA and GQA, head_dim 64 / 128 / 256 and odd sizes (40, 96, 200), sequence
// lengths that are not multiples of any tile (77, 130, 45, 1), batch 2;
// fp32, fp64 and bf16 qkv; dropout with a nonzero head_offset (the masks come
// from Philox on both sides, so they must agree element for element); the
// GPU's outputs pre-filled with NaN (every element must be written, dqkv is
// written, not accumulated); bitwise determinism run to run; bf16 out, dout
// and dqkv (bit for bit the rounded fp32 results, SIMT and tensor cores); and
// incremental decoding (kv_cache_append + kv_attention) over several appended
// chunks.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Whether the CUDA twin takes its tensor-core kernels for these tensors
// (kernels/attention.h). A build without the CUDA backend has no such
// function; every test here skips there (MT_REQUIRE_GPU) before asking.
bool uses_tensor_cores(const Tensor& qkv, const k::QkvLayout& L, const k::AttentionOptions& o) {
#ifdef MT_HAVE_CUDA
  return k::cuda::attention_uses_tensor_cores(qkv, L, o);
#else
  (void)qkv, (void)L, (void)o;
  return false;
#endif
}

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
  T x;
  if constexpr (std::is_same_v<T, bf16>) x = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  else x = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> nan(static_cast<size_t>(s.numel()), x);
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
// --reset-attention-mask's doc_start [B, T] for documents ending at EOD
// positions that differ per sequence (those past T are ignored). Layout 1:
// 3, 4 (a one-token document), 70, 127 for even b; 0 and 64 for odd b.
// Layout 2, for the tensor-core kernels' unmasked steps: 63 and 140 for even
// b, 63 for odd b. For odd b the keys from 64 on are wholly visible to the
// queries from 128 on, across the document mask; for even b the document
// starting at 141 begins inside the query tile (and the dQ warp) at 128, so
// a test of its first query alone would wrongly skip the mask.
std::vector<int32_t> doc_starts(const k::QkvLayout& L, int layout = 1) {
  std::vector<int32_t> d(static_cast<size_t>(L.batch * L.seq));
  for (int64_t b = 0; b < L.batch; ++b) {
    const std::vector<int64_t> eods =
        layout == 2 ? (b % 2 == 0 ? std::vector<int64_t>{63, 140} : std::vector<int64_t>{63})
                    : (b % 2 == 0 ? std::vector<int64_t>{3, 4, 70, 127} : std::vector<int64_t>{0, 64});
    int32_t start = 0;
    for (int64_t t = 0; t < L.seq; ++t) {
      d[static_cast<size_t>(b * L.seq + t)] = start;
      if (std::find(eods.begin(), eods.end(), t) != eods.end()) start = static_cast<int32_t>(t + 1);
    }
  }
  return d;
}

// With cp > 1 both twins compute CP rank cp_rank's queries (AttentionOptions::cp_size);
// with docs, both mask each query to its document (AttentionOptions::doc_start).
template <typename In, typename A>
void run_case(const k::QkvLayout& L, double dropout, int64_t head_offset, const Tol& tol, int64_t cp = 1,
              int64_t cp_rank = 0, bool docs = false) {
  const std::string what = describe(L, dtype_name(dtype_of<In>()), dropout, head_offset) +
                           (cp > 1 ? fmt::format(" cp {} rank {}", cp, cp_rank) : "") + (docs ? " documents" : "");
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 1234, 77, head_offset};
  o.cp_size = cp, o.cp_rank = cp_rank;
  std::vector<int32_t> doc = doc_starts(L);
  if (docs) o.doc_start = Tensor(doc.data(), {L.batch, L.seq}, DType::kI32);
  const int64_t Tq = L.seq / cp;
  const Shape qs{L.tokens(), L.row()}, os{Tq * L.batch, L.heads * L.head_dim}, ls{L.batch, L.heads, Tq};
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
  if (docs) o.doc_start = to_device(g, o.doc_start);
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
void run_tc_case(const k::QkvLayout& L, double dropout, int64_t head_offset, int64_t cp = 1, int64_t cp_rank = 0,
                 int docs = 0) {  // docs: 0 none, else doc_starts' layout
  const std::string what = describe(L, dtype_name(dtype_of<In>()), dropout, head_offset) + " (tensor cores)" +
                           (cp > 1 ? fmt::format(" cp {} rank {}", cp, cp_rank) : "") +
                           (docs ? fmt::format(" documents {}", docs) : "");
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 4321, 19, head_offset};
  o.bf16_matmul = true;
  o.cp_size = cp, o.cp_rank = cp_rank;
  std::vector<int32_t> doc = doc_starts(L, docs);
  if (docs) o.doc_start = Tensor(doc.data(), {L.batch, L.seq}, DType::kI32);
  const int64_t Tq = L.seq / cp;
  const Shape qs{L.tokens(), L.row()}, os{Tq * L.batch, L.heads * L.head_dim}, ls{L.batch, L.heads, Tq};
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
  if (docs) o.doc_start = to_device(g, o.doc_start);
  const Tensor d_qkv = to_device(g, t_qkv), d_dout = to_device(g, t_dout);
  ASSERT_TRUE(uses_tensor_cores(d_qkv, L, o)) << what;
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

// Context parallelism: each CP rank's call (its two chunks of queries
// against every key, dqkv with zeros in the other ranks' query rows) on both
// twins, SIMT and tensor cores; chunks shorter than a tile, longer and not a
// multiple of one; dropout with a head offset.
TEST(CudaTwin, AttentionContextParallelMatchesCpu) {
  MT_REQUIRE_GPU();
  for (int64_t cp : {2, 3})
    for (int64_t r = 0; r < cp; ++r) {
      run_case<float, float>(k::QkvLayout{70 * 2 * cp, 2, 4, 2, 64}, 0.0, 0, kFp32, cp, r);
      run_case<float, float>(k::QkvLayout{6 * 2 * cp, 1, 2, 1, 40}, 0.2, 3, kFp32, cp, r);
      run_case<double, double>(k::QkvLayout{33 * 2 * cp, 1, 2, 2, 128}, 0.0, 0, kFp64, cp, r);
      run_tc_case<float>({70 * 2 * cp, 1, 4, 2, 64}, 0.0, 0, cp, r);
      run_tc_case<bf16>({8 * 2 * cp, 2, 2, 1, 128}, 0.1, 2, cp, r);
    }
  // Chunks of 62: rank 1's first query tile starts at position 62, so a key
  // tile's last key lies just past a tile's (or a warp's) first query: the
  // boundary of the tensor-core kernels' unmasked steps.
  run_tc_case<bf16>({62 * 2 * 2, 1, 4, 2, 64}, 0.0, 0, 2, 1);
}

// Document masking (--reset-attention-mask): each query sees its own
// document's keys only, on both twins, SIMT (fp32, fp64) and tensor cores,
// with dropout, and under context parallelism.
TEST(CudaTwin, AttentionDocumentMaskMatchesCpu) {
  MT_REQUIRE_GPU();
  run_case<float, float>(k::QkvLayout{140, 2, 4, 2, 64}, 0.0, 0, kFp32, 1, 0, true);
  run_case<float, float>(k::QkvLayout{77, 2, 2, 1, 40}, 0.2, 3, kFp32, 1, 0, true);
  run_case<double, double>(k::QkvLayout{130, 2, 2, 2, 128}, 0.0, 0, kFp64, 1, 0, true);
  run_tc_case<float>({140, 2, 4, 2, 64}, 0.0, 0, 1, 0, 1);
  run_tc_case<bf16>({130, 2, 2, 1, 128}, 0.1, 2, 1, 0, 1);
  run_tc_case<bf16>({200, 2, 4, 2, 64}, 0.0, 0, 1, 0, 2);  // unmasked steps across documents, and not
  for (int64_t r = 0; r < 2; ++r) {
    run_case<float, float>(k::QkvLayout{140, 2, 4, 2, 64}, 0.0, 0, kFp32, 2, r, true);
    run_tc_case<float>({140, 2, 4, 2, 64}, 0.1, 1, 2, r, 1);
  }
}

// The tensor-core dK/dV kernel's two builds (kernels::cuda::set_dkv_lean,
// which attention_bench times against each other) store the same bits; the
// default one is checked against the CPU twin above. fp32 and bf16 dout/dqkv,
// GQA and MHA, partial tiles, dropout, documents and a context-parallel rank.
template <typename Io>
void expect_dkv_builds_agree(const k::QkvLayout& L, double dropout, int64_t cp, int64_t cp_rank, int docs) {
  const std::string what = describe(L, dtype_name(dtype_of<Io>()), dropout, 3) + " dK/dV builds" +
                           (cp > 1 ? fmt::format(" cp {} rank {}", cp, cp_rank) : "") +
                           (docs ? fmt::format(" documents {}", docs) : "");
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 4321, 19, 3};
  o.bf16_matmul = true;
  o.cp_size = cp, o.cp_rank = cp_rank;
  Arena g = gpu_arena();
  std::vector<int32_t> doc = doc_starts(L, docs);
  if (docs) o.doc_start = to_device(g, Tensor(doc.data(), {L.batch, L.seq}, DType::kI32));
  const int64_t Tq = L.seq / cp;
  const Shape qs{L.tokens(), L.row()}, os{Tq * L.batch, L.heads * L.head_dim}, ls{L.batch, L.heads, Tq};
  std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
  fill_normal(qkv_d, 700 + static_cast<uint64_t>(L.seq), 1.0);
  fill_normal(dout_d, 800 + static_cast<uint64_t>(L.heads), 1.0);
  std::vector<bf16> qkv = convert<bf16>(qkv_d);
  std::vector<Io> dout = convert<Io>(dout_d);
  const Tensor d_qkv = to_device(g, Tensor(qkv.data(), qs, DType::kBF16)),
               d_dout = to_device(g, Tensor(dout.data(), os, dtype_of<Io>()));
  const Tensor d_out = nan_device<Io>(g, os), d_lse = nan_device<float>(g, ls);
  ASSERT_TRUE(uses_tensor_cores(d_qkv, L, o)) << what;
  k::attention_forward(d_qkv, L, o, d_out, d_lse);
  std::vector<Io> got[2];
  for (int lean = 0; lean < 2; ++lean) {
    const Tensor d_dqkv = nan_device<Io>(g, qs);
#ifdef MT_HAVE_CUDA
    k::cuda::set_dkv_lean(lean == 1);
#endif
    k::attention_backward(d_qkv, d_out, d_dout, d_lse, L, o, d_dqkv);
    got[lean] = to_host<Io>(d_dqkv);
  }
#ifdef MT_HAVE_CUDA
  k::cuda::set_dkv_lean(false);
#endif
  ASSERT_EQ(got[0].size(), got[1].size());
  size_t differ = 0;
  for (size_t i = 0; i < got[0].size(); ++i)
    differ += std::memcmp(&got[0][i], &got[1][i], sizeof(Io)) != 0;
  EXPECT_EQ(differ, 0u) << what << ": elements of dqkv that differ";
}

TEST(CudaTwin, AttentionDkvKernelBuildsAgreeBitwise) {
  MT_REQUIRE_GPU();
  expect_dkv_builds_agree<float>({130, 2, 4, 2, 64}, 0.0, 1, 0, 0);
  expect_dkv_builds_agree<bf16>({77, 2, 4, 4, 64}, 0.0, 1, 0, 0);
  expect_dkv_builds_agree<bf16>({200, 1, 4, 1, 128}, 0.1, 1, 0, 0);
  expect_dkv_builds_agree<float>({140, 2, 4, 2, 64}, 0.0, 1, 0, 1);
  expect_dkv_builds_agree<bf16>({200, 2, 4, 2, 64}, 0.0, 1, 0, 2);  // unmasked steps across documents, and not
  expect_dkv_builds_agree<bf16>({70 * 2 * 2, 1, 4, 2, 128}, 0.2, 2, 1, 0);
  expect_dkv_builds_agree<bf16>({70 * 2 * 2, 2, 4, 2, 64}, 0.0, 2, 0, 2);  // documents under CP
  expect_dkv_builds_agree<bf16>({62 * 2 * 2, 1, 4, 2, 64}, 0.0, 2, 1, 0);  // a key tile ends just past a query tile's start
}

TEST(CudaTwin, AttentionTensorCoresOnlyWhereBuilt) {
  MT_REQUIRE_GPU();
  // Without the permission, at another head size, for fp64 or with a scale
  // that is not positive the SIMT kernels run (the tests above hold them to the CPU twin at fp32/fp64).
  Arena g = gpu_arena(size_t{1} << 20);
  k::AttentionOptions o{0.125, 0, 0, 0, 0};
  const Tensor f32 = g.alloc({8, 64 * 3}, DType::kF32), f64 = g.alloc({8, 64 * 3}, DType::kF64);
  EXPECT_FALSE(uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
  o.bf16_matmul = true;
  EXPECT_TRUE(uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
  EXPECT_FALSE(uses_tensor_cores(f64, {8, 1, 1, 1, 64}, o));
  const Tensor d96 = g.alloc({8, 96 * 3}, DType::kF32);
  EXPECT_FALSE(uses_tensor_cores(d96, {8, 1, 1, 1, 96}, o));
  // Their softmax takes row maxima of unscaled scores: a positive scale only.
  o.scale = -0.125;
  EXPECT_FALSE(uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
  o.scale = 0;
  EXPECT_FALSE(uses_tensor_cores(f32, {8, 1, 1, 1, 64}, o));
}

// bf16 out, dout and dqkv with bf16 qkv (kernels/attention.h), on the SIMT
// path (tc false) or the tensor-core path (tc true, bf16_matmul):
//  - on the GPU itself, bit for bit: a bf16 out is the fp32 out rounded once,
//    and every (out, dout, dqkv) combination of fp32 and bf16 gives the
//    all-fp32 backward's dqkv (rounded once where dqkv is bf16), for out and
//    dout holding the same bf16 values; lse is the same either way;
//  - against the CPU twin given the same inputs: the tolerances of the tests
//    above (SIMT: CudaTwin.AttentionBf16QkvMatchesCpu's, plus one bf16 ulp for
//    outputs rounded on both sides; tensor cores: run_tc_case's, against the
//    CPU's fp32 results).
std::vector<float> widened(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

void expect_rounded_bits(const std::vector<float>& want, const std::vector<bf16>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (float_to_bf16(want[i]).bits != got[i].bits && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first " << first << ": fp32 " << want[first]
                     << " rounds to " << float_to_bf16(want[first]).bits << ", bf16 output " << got[first].bits;
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << what;
}

void run_bf16_io_case(const k::QkvLayout& L, double dropout, int64_t head_offset, bool tc) {
  const std::string what = describe(L, "bf16", dropout, head_offset) + (tc ? " (tensor cores)" : " (SIMT)") +
                           ", bf16 activations";
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 2468, 13, head_offset};
  o.bf16_matmul = tc;
  const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
  std::vector<double> qkv_d(static_cast<size_t>(qs.numel())), dout_d(static_cast<size_t>(os.numel()));
  fill_normal(qkv_d, 600 + static_cast<uint64_t>(L.seq * 5 + L.head_dim), 1.0);
  fill_normal(dout_d, 700 + static_cast<uint64_t>(L.heads * 3 + L.head_dim), 1.0);
  std::vector<bf16> qkv = convert<bf16>(qkv_d), dout_h = convert<bf16>(dout_d);
  std::vector<float> dout_f = widened(dout_h);
  const Tensor t_qkv(qkv.data(), qs, DType::kBF16), t_dout_h(dout_h.data(), os, DType::kBF16),
      t_dout_f(dout_f.data(), os, DType::kF32);

  // CPU twin: fp32 and bf16 out; backward all-fp32 (on fp32 copies of the
  // bf16 out) and all-bf16.
  std::vector<float> out_c(static_cast<size_t>(os.numel())), lse_c(static_cast<size_t>(ls.numel())),
      lse_c2(lse_c.size()), dq_c(static_cast<size_t>(qs.numel()));
  std::vector<bf16> out_ch(out_c.size()), dq_ch(dq_c.size());
  const Tensor t_out_c(out_c.data(), os, DType::kF32), t_out_ch(out_ch.data(), os, DType::kBF16),
      t_lse_c(lse_c.data(), ls, DType::kF32);
  k::attention_forward(t_qkv, L, o, t_out_c, t_lse_c);
  k::attention_forward(t_qkv, L, o, t_out_ch, Tensor(lse_c2.data(), ls, DType::kF32));
  std::vector<float> out_f = widened(out_ch);
  const Tensor t_out_f(out_f.data(), os, DType::kF32);
  k::attention_backward(t_qkv, t_out_f, t_dout_f, t_lse_c, L, o, Tensor(dq_c.data(), qs, DType::kF32));
  k::attention_backward(t_qkv, t_out_ch, t_dout_h, t_lse_c, L, o, Tensor(dq_ch.data(), qs, DType::kBF16));

  Arena g = gpu_arena();
  const Tensor d_qkv = to_device(g, t_qkv);
  ASSERT_EQ(uses_tensor_cores(d_qkv, L, o), tc) << what;
  // Forward: fp32 and bf16 out.
  const Tensor d_out = nan_device<float>(g, os), d_lse = nan_device<float>(g, ls);
  const Tensor d_out_h = nan_device<bf16>(g, os), d_lse2 = nan_device<float>(g, ls);
  k::attention_forward(d_qkv, L, o, d_out, d_lse);
  k::attention_forward(d_qkv, L, o, d_out_h, d_lse2);
  const std::vector<float> g_out = to_host<float>(d_out), g_lse = to_host<float>(d_lse);
  const std::vector<bf16> g_out_h = to_host<bf16>(d_out_h);
  expect_rounded_bits(g_out, g_out_h, what + ": bf16 out vs fp32 out");
  expect_same_bits(g_lse, to_host<float>(d_lse2), what + ": lse with bf16 out");

  // Backward on the CPU's out (bf16 values) and lse: all fp32, then the other
  // seven combinations.
  const Tensor d_out_f = to_device(g, t_out_f), d_out_ch = to_device(g, t_out_ch), d_lse_c = to_device(g, t_lse_c);
  const Tensor d_dout_f = to_device(g, t_dout_f), d_dout_h = to_device(g, t_dout_h);
  const Tensor d_dq = nan_device<float>(g, qs);
  k::attention_backward(d_qkv, d_out_f, d_dout_f, d_lse_c, L, o, d_dq);
  const std::vector<float> g_dq = to_host<float>(d_dq);
  std::vector<bf16> g_dq_h;  // all bf16
  for (int mask = 1; mask < 8; ++mask) {
    const bool o16 = mask & 1, d16 = mask & 2, g16 = mask & 4;
    const std::string combo = what + fmt::format(": out {}, dout {}, dqkv {}", o16 ? "bf16" : "fp32",
                                                 d16 ? "bf16" : "fp32", g16 ? "bf16" : "fp32");
    const Tensor d_dq2 = g16 ? nan_device<bf16>(g, qs) : nan_device<float>(g, qs);
    k::attention_backward(d_qkv, o16 ? d_out_ch : d_out_f, d16 ? d_dout_h : d_dout_f, d_lse_c, L, o, d_dq2);
    if (g16) {
      std::vector<bf16> got = to_host<bf16>(d_dq2);
      expect_rounded_bits(g_dq, got, combo + " vs all fp32");
      if (mask == 7) g_dq_h = std::move(got);
    } else {
      expect_same_bits(g_dq, to_host<float>(d_dq2), combo + " vs all fp32");
    }
  }

  // Against the CPU twin.
  const std::vector<float> g_out_hf = widened(g_out_h), g_dq_hf = widened(g_dq_h);
  if (!tc) {
    constexpr double kUlp = 1.0 / 128;  // one bf16 ulp, relative
    const Tol t{1e-3, 1e-4, 1e-4, 1e-3};
    expect_close(g_out, out_c, t.rtol, t.atol_out, what + ": out");
    expect_close(g_lse, lse_c, t.rtol, t.atol_lse, what + ": lse");
    expect_close(g_dq, dq_c, t.rtol, t.atol_grad, what + ": dqkv");
    expect_close(g_out_hf, widened(out_ch), t.rtol + kUlp, t.atol_out, what + ": bf16 out");
    expect_close(g_dq_hf, widened(dq_ch), t.rtol + kUlp, t.atol_grad, what + ": bf16 dqkv");
  } else {
    expect_close(g_lse, lse_c, 1e-5, 1e-4, what + ": lse");
    EXPECT_LT(rel_err(g_out_hf, out_c), 5e-3) << what << ": bf16 out";
    EXPECT_LT(rel_err(g_dq_hf, dq_c), 8e-3) << what << ": bf16 dqkv";
    expect_close(g_out_hf, out_c, 0, 3e-2 * max_abs(out_c), what + ": bf16 out, elementwise");
    expect_close(g_dq_hf, dq_c, 0, 3e-2 * max_abs(dq_c), what + ": bf16 dqkv, elementwise");
  }
}

TEST(CudaTwin, AttentionBf16ActivationsAreRoundedFp32Results) {
  MT_REQUIRE_GPU();
  // {seq, batch, heads, groups, head_dim}: GQA, partial tiles, causal; SIMT at
  // head_dim 40 (DM 64) and 96 (DM 128) with dropout; tensor cores at 64 and 128.
  run_bf16_io_case({77, 1, 4, 2, 40}, 0.0, 0, false);
  run_bf16_io_case({45, 2, 2, 1, 96}, 0.2, 3, false);
  run_bf16_io_case({77, 1, 4, 2, 64}, 0.0, 0, true);
  run_bf16_io_case({45, 2, 4, 2, 128}, 0.1, 5, true);
}

TEST(CudaTwin, AttentionActivationDtypesAreChecked) {
  MT_REQUIRE_GPU();
  // Each call fails its dtype check on the host, before any launch.
  const k::QkvLayout L{8, 1, 2, 1, 64};
  const k::AttentionOptions o{0.125, 0, 0, 0, 0};
  Arena g = gpu_arena(size_t{1} << 20);
  const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
  const Tensor qkv = g.alloc(qs, DType::kF32), qkv_h = g.alloc(qs, DType::kBF16), out = g.alloc(os, DType::kF32),
               out_h = g.alloc(os, DType::kBF16), out_d = g.alloc(os, DType::kF64), lse = g.alloc(ls, DType::kF32),
               lse_h = g.alloc(ls, DType::kBF16), dqkv = g.alloc(qs, DType::kF32), dqkv_d = g.alloc(qs, DType::kF64);
  EXPECT_DEATH(k::attention_forward(qkv, L, o, out_h, lse),
               "attention_forward: out is bf16, expected fp32 for fp32 qkv");
  EXPECT_DEATH(k::attention_forward(qkv_h, L, o, out_d, lse),
               "attention_forward: out is fp64, expected fp32 or bf16 for bf16 qkv");
  EXPECT_DEATH(k::attention_forward(qkv_h, L, o, out_h, lse_h),
               "attention_forward: lse is bf16, expected fp32 for bf16 qkv");
  EXPECT_DEATH(k::attention_backward(qkv, out, out_h, lse, L, o, dqkv),
               "attention_backward: dout is bf16, expected fp32 for fp32 qkv");
  EXPECT_DEATH(k::attention_backward(qkv_h, out, out, lse, L, o, dqkv_d),
               "attention_backward: dqkv is fp64, expected fp32 or bf16 for bf16 qkv");
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
