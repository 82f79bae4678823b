// Kernel tests: each backward against central finite differences in double
// precision; forwards against closed forms or naive references; bf16 paths
// against fp32 within bf16 tolerance.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <bit>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "core/arena.h"
#include "kernels/cpu/vec_math.h"
#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/optimizer_step.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace mt {
namespace {

using test::Buf;
using test::expect_fd_grad;
using test::fill_normal;
using test::from_half;
using test::to_half;
namespace k = kernels;

// ---------------------------------------------------------------- GEMM

void gemm_naive(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const std::vector<double>& A,
                const std::vector<double>& B, std::vector<double>& C, double beta) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < K; ++kk)
        s += (ta ? A[kk * M + i] : A[i * K + kk]) * (tb ? B[j * K + kk] : B[kk * N + j]);
      C[i * N + j] = s + beta * C[i * N + j];
    }
}

TEST(Gemm, Fp32AndBf16MatchDoubleReference_AllTransposes) {
  const int64_t M = 37, N = 53, K = 71;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        std::vector<double> A(M * K), B(K * N), C0(M * N);
        fill_normal(A, 1), fill_normal(B, 2), fill_normal(C0, 3);
        std::vector<double> ref = C0;
        gemm_naive(ta, tb, M, N, K, A, B, ref, beta);
        Buf<float> a({M * K}), b({K * N}), c({M * N});
        Buf<bf16> ah({M * K}), bh({K * N});
        for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<float>(A[i]);
        for (int64_t i = 0; i < K * N; ++i) b[i] = static_cast<float>(B[i]);
        for (int64_t i = 0; i < M * N; ++i) c[i] = static_cast<float>(C0[i]);
        k::gemm(ta, tb, M, N, K, 1.0f, a.t(), b.t(), beta, c.t());
        double worst = 0;
        for (int64_t i = 0; i < M * N; ++i) worst = std::max(worst, std::abs(c[i] - ref[i]));
        EXPECT_LT(worst, 1e-4) << "fp32 ta=" << ta << " tb=" << tb << " beta=" << beta;
        // bf16 inputs: compare with the double product of the rounded inputs
        // (exact up to fp32 accumulation) and with the fp32 result (bf16 tolerance).
        k::cast(a.t(), ah.t());
        k::cast(b.t(), bh.t());
        std::vector<double> Ar(M * K), Br(K * N);
        for (int64_t i = 0; i < M * K; ++i) Ar[i] = bf16_to_float(ah[i]);
        for (int64_t i = 0; i < K * N; ++i) Br[i] = bf16_to_float(bh[i]);
        std::vector<double> refr = C0;
        gemm_naive(ta, tb, M, N, K, Ar, Br, refr, beta);
        for (int64_t i = 0; i < M * N; ++i) c[i] = static_cast<float>(C0[i]);
        k::gemm(ta, tb, M, N, K, 1.0f, ah.t(), bh.t(), beta, c.t());
        double wr = 0, wf = 0;
        for (int64_t i = 0; i < M * N; ++i) {
          wr = std::max(wr, std::abs(c[i] - refr[i]));
          wf = std::max(wf, std::abs(c[i] - ref[i]) / std::sqrt(static_cast<double>(K)));
        }
        EXPECT_LT(wr, 1e-4) << "bf16 exactness ta=" << ta << " tb=" << tb;
        EXPECT_LT(wf, 2e-2) << "bf16 vs fp32 ta=" << ta << " tb=" << tb;
      }
}

// x W^T with a long reduction (K >= 2N, K >= 1024, M >= 256) takes oneDNN's
// fp32 matmul primitive instead of dnnl_sgemm (kernels/cpu/gemm.cc): same
// results up to fp32 rounding, for beta 0 and 1, and the same bits every call.
TEST(Gemm, Fp32LongReductionPathMatchesDoubleReference) {
  const int64_t M = 256, N = 40, K = 1100;
  for (float beta : {0.0f, 1.0f}) {
    std::vector<double> A(M * K), B(N * K), C0(M * N);
    fill_normal(A, 6), fill_normal(B, 7), fill_normal(C0, 8);
    std::vector<double> ref = C0;
    gemm_naive(false, true, M, N, K, A, B, ref, beta);
    Buf<float> a({M * K}), b({N * K}), c({M * N}), c2({M * N});
    for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<float>(A[i]);
    for (int64_t i = 0; i < N * K; ++i) b[i] = static_cast<float>(B[i]);
    for (int64_t i = 0; i < M * N; ++i) c[i] = c2[i] = static_cast<float>(C0[i]);
    k::gemm(false, true, M, N, K, 1.0f, a.t(), b.t(), beta, c.t());
    k::gemm(false, true, M, N, K, 1.0f, a.t(), b.t(), beta, c2.t());
    double worst = 0;
    for (int64_t i = 0; i < M * N; ++i) worst = std::max(worst, std::abs(c[i] - ref[i]));
    EXPECT_LT(worst, 1e-3) << "beta=" << beta;  // |C| ~ sqrt(K) ~ 33
    EXPECT_EQ(std::memcmp(c.v.data(), c2.v.data(), c.v.size() * sizeof(float)), 0) << "beta=" << beta;
  }
}

TEST(Gemm, Fp64ReferencePathIsExact) {
  const int64_t M = 5, N = 7, K = 3;
  std::vector<double> A(M * K), B(N * K), ref(M * N, 0.0);
  fill_normal(A, 4), fill_normal(B, 5);
  gemm_naive(false, true, M, N, K, A, B, ref, 0);
  Buf<double> a({M * K}), b({N * K}), c({M * N});
  a.v = A, b.v = B;
  k::gemm(false, true, M, N, K, 1.0f, a.t(), b.t(), 0.0f, c.t());
  for (int64_t i = 0; i < M * N; ++i) EXPECT_NEAR(c[i], ref[i], 1e-12);
}

// gemm_add: D = op(A) op(B) + R with the bits of gemm (beta 0) then add, for
// fp32, bf16 inputs with an fp32 D, and fp64; R is left as it was; an R that
// overlaps D or has another dtype is refused with the reason.
TEST(Gemm, GemmAddIsGemmThenAdd) {
  const int64_t M = 37, N = 29, K = 300;
  std::vector<double> A(M * K), B(N * K), R(M * N);
  fill_normal(A, 14), fill_normal(B, 15), fill_normal(R, 16);
  auto check = [&](DType in, DType out) {
    const size_t es = dtype_size(in), os = dtype_size(out);
    std::vector<char> a(A.size() * es), b(B.size() * es), r(R.size() * os), d(R.size() * os), want(R.size() * os);
    auto put = [](const std::vector<double>& src, std::vector<char>& dst, DType t) {
      for (size_t i = 0; i < src.size(); ++i) {
        if (t == DType::kBF16) reinterpret_cast<bf16*>(dst.data())[i] = float_to_bf16(static_cast<float>(src[i]));
        else if (t == DType::kF32) reinterpret_cast<float*>(dst.data())[i] = static_cast<float>(src[i]);
        else reinterpret_cast<double*>(dst.data())[i] = src[i];
      }
    };
    put(A, a, in), put(B, b, in), put(R, r, out);
    const std::vector<char> r0 = r;
    const Tensor ta(a.data(), {M, K}, in), tb(b.data(), {N, K}, in), tr(r.data(), {M, N}, out),
        td(d.data(), {M, N}, out), tw(want.data(), {M, N}, out);
    k::gemm(false, true, M, N, K, 1.0f, ta, tb, 0.0f, tw);
    k::add(tw, tr, tw);
    k::gemm_add(false, true, M, N, K, ta, tb, tr, td);
    EXPECT_EQ(std::memcmp(d.data(), want.data(), d.size()), 0) << dtype_name(in) << " > " << dtype_name(out);
    EXPECT_EQ(std::memcmp(r.data(), r0.data(), r.size()), 0) << "R changed";
  };
  check(DType::kF32, DType::kF32);
  check(DType::kBF16, DType::kF32);
  check(DType::kF64, DType::kF64);

  std::vector<float> a(M * K), b(N * K), rd(2 * M * N);
  const Tensor ta(a.data(), {M, K}, DType::kF32), tb(b.data(), {N, K}, DType::kF32);
  const Tensor r(rd.data(), {M, N}, DType::kF32), shifted(rd.data() + 1, {M, N}, DType::kF32);
  EXPECT_DEATH(k::gemm_add(false, true, M, N, K, ta, tb, r, shifted), "R overlaps D");
  std::vector<double> d64(M * N);
  EXPECT_DEATH(k::gemm_add(false, true, M, N, K, ta, tb, r, Tensor(d64.data(), {M, N}, DType::kF64)),
               "gemm_add: R and D must share one dtype");
  std::vector<bf16> rh(M * N), dh(M * N);
  EXPECT_DEATH(k::gemm_add(false, true, M, N, K, ta, tb, Tensor(rh.data(), {M, N}, DType::kBF16),
                           Tensor(dh.data(), {M, N}, DType::kBF16)),
               "bf16 with bf16 A and B");
}

// bf16 (fp16) R and D (the 16-bit residual stream): the fp32 product plus R,
// rounded to 16 bits once. Small integers make every product and sum exact in fp32, so
// the expected bits are known; the first row holds the case where rounding
// the product first would differ: 256 + 1 = 257 (not a bf16 value; rounds to
// 256) plus R = 1 is 258 (a bf16 value), while bf16(bf16(257) + 1) = 256.
template <typename H>
void gemm_add_half_rounds_the_sum_once() {
  // The first integer the 16-bit type cannot hold is P + 1: P = 256 for
  // bf16 (8-bit significand), 2048 for fp16 (11 bits).
  const double P = std::is_same_v<H, bf16> ? 256 : 2048;
  const int64_t M = 9, N = 11, K = 6;
  std::vector<H> a(M * K), b(N * K), r(M * N), d(M * N);
  std::vector<double> A(M * K), B(N * K), R(M * N);
  for (int64_t i = 0; i < M * K; ++i) A[i] = static_cast<double>((i * 7) % 9) - 4;
  for (int64_t i = 0; i < N * K; ++i) B[i] = static_cast<double>((i * 5) % 7) - 3;
  for (int64_t i = 0; i < M * N; ++i) R[i] = static_cast<double>((i * 3) % 11) - 5;
  for (int64_t kk = 0; kk < K; ++kk) A[kk] = kk == 0 ? P : kk == 1 ? 1 : 0;  // row 0 . column 0 = P + 1
  for (int64_t kk = 0; kk < K; ++kk) B[kk] = 1;                                // column 0 of B^T: ones
  R[0] = 1;
  for (size_t i = 0; i < a.size(); ++i) a[i] = to_half<H>(static_cast<float>(A[i]));
  for (size_t i = 0; i < b.size(); ++i) b[i] = to_half<H>(static_cast<float>(B[i]));
  for (size_t i = 0; i < r.size(); ++i) r[i] = to_half<H>(static_cast<float>(R[i]));
  const std::vector<H> r0 = r;
  k::gemm_add(false, true, M, N, K, Tensor(a.data(), {M, K}, dtype_of<H>()), Tensor(b.data(), {N, K}, dtype_of<H>()),
              Tensor(r.data(), {M, N}, dtype_of<H>()), Tensor(d.data(), {M, N}, dtype_of<H>()));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = R[i * N + j];
      for (int64_t kk = 0; kk < K; ++kk) s += A[i * K + kk] * B[j * K + kk];
      ASSERT_EQ(d[i * N + j].bits, to_half<H>(static_cast<float>(s)).bits)
          << "D[" << i << "][" << j << "] = " << from_half(d[i * N + j]) << ", exact sum " << s;
    }
  EXPECT_EQ(from_half(d[0]), static_cast<float>(P + 2));
  for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(r[i].bits, r0[i].bits) << "R changed";
}

TEST(Gemm, GemmAddHalfRoundsTheSumOnce) {
  gemm_add_half_rounds_the_sum_once<bf16>();
  gemm_add_half_rounds_the_sum_once<f16>();
}

// ---------------------------------------------------------------- norms

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, C = 10;
  Buf<double> x({N, C}), w({C}), b({C}), y({N, C}), mean({N}), rstd({N}), proj({N, C});
  fill_normal(x.v, 1), fill_normal(w.v, 2), fill_normal(b.v, 3), fill_normal(proj.v, 4);
  auto loss = [&] {
    k::layernorm_forward(x.t(), w.t(), b.t(), 1e-5, y.t(), mean.t(), rstd.t());
    return test::dot(y.v, proj.v);
  };
  loss();
  // Closed form of the forward on one row.
  double m = 0, v = 0;
  for (int64_t c = 0; c < C; ++c) m += x[c] / C;
  for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m) / C;
  EXPECT_NEAR(y[3], (x[3] - m) / std::sqrt(v + 1e-5) * w[3] + b[3], 1e-12);
  Buf<double> dx({N, C}, 0.5), dw({C}), db({C});  // dx starts at 0.5: backward accumulates
  k::layernorm_backward(proj.t(), x.t(), w.t(), mean.t(), rstd.t(), dx.t(), dw.t(), db.t());
  for (double& d : dx.v) d -= 0.5;
  expect_fd_grad(x.v, loss, dx.v, "dx");
  expect_fd_grad(w.v, loss, dw.v, "dw");
  expect_fd_grad(b.v, loss, db.v, "db");
}

TEST(RMSNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 12;
  Buf<double> x({N, C}), w({C}), y({N, C}), rstd({N}), proj({N, C});
  fill_normal(x.v, 5), fill_normal(w.v, 6), fill_normal(proj.v, 7);
  auto loss = [&] {
    k::rmsnorm_forward(x.t(), w.t(), 1e-6, y.t(), rstd.t());
    return test::dot(y.v, proj.v);
  };
  loss();
  double ms = 0;
  for (int64_t c = 0; c < C; ++c) ms += x[c] * x[c] / C;
  EXPECT_NEAR(y[2], x[2] / std::sqrt(ms + 1e-6) * w[2], 1e-12);
  Buf<double> dx({N, C}), dw({C});
  k::rmsnorm_backward(proj.t(), x.t(), w.t(), rstd.t(), dx.t(), dw.t());
  expect_fd_grad(x.v, loss, dx.v, "dx");
  expect_fd_grad(w.v, loss, dw.v, "dw");
}

// Rows wider than the forward's 32 summation lanes, with a tail (1000 = 31 x
// 32 + 8): mean and rstd against fp64 two-pass sums. The LayerNorm rows sit
// at an offset of 1000 with unit spread, where a one-pass sum of squares in
// fp32 would lose the variance.
TEST(Norms, WideFp32RowsMatchFp64Statistics) {
  const int64_t N = 3, C = 1000;
  std::vector<double> xs(N * C);
  fill_normal(xs, 11);
  for (const bool rms : {false, true}) {
    Buf<float> x({N, C}), w({C}), b({C}), y({N, C}), mean({N}), rstd({N});
    for (int64_t i = 0; i < N * C; ++i) x[i] = static_cast<float>(xs[i] + (rms ? 0.0 : 1000.0));
    for (int64_t c = 0; c < C; ++c) w[c] = 1.f + 0.001f * static_cast<float>(c), b[c] = 0.5f;
    if (rms) k::rmsnorm_forward(x.t(), w.t(), 1e-6, y.t(), rstd.t());
    else k::layernorm_forward(x.t(), w.t(), b.t(), 1e-5, y.t(), mean.t(), rstd.t());
    for (int64_t i = 0; i < N; ++i) {
      double m = 0, v = 0;
      if (!rms) {
        for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
        m /= C;
      }
      for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
      v /= C;
      const double r = 1 / std::sqrt(v + (rms ? 1e-6 : 1e-5));
      if (!rms) EXPECT_NEAR(mean[i], m, 1e-6 * std::abs(m)) << "row " << i;
      EXPECT_NEAR(rstd[i], r, 1e-6 * r) << (rms ? "RMSNorm" : "LayerNorm") << " row " << i;
      for (int64_t c = 0; c < C; ++c) {
        const double want = (x[i * C + c] - m) * r * w[c] + (rms ? 0.0 : 0.5);
        ASSERT_NEAR(y[i * C + c], want, 2e-4) << (rms ? "RMSNorm" : "LayerNorm") << " y[" << i << "][" << c << "]";
      }
    }
  }
}

// ---------------------------------------------------------------- activations

TEST(Gelu, ExactTanhAndSquaredReluMatchClosedFormAndFiniteDifferences) {
  for (auto kind : {k::GeluKind::kExact, k::GeluKind::kTanh, k::GeluKind::kSquaredRelu}) {
    Buf<double> x({40}), y({40}), proj({40}), dx({40});
    fill_normal(x.v, 8, 2.0), fill_normal(proj.v, 9);
    auto loss = [&] {
      k::gelu_forward(kind, x.t(), y.t());
      return test::dot(y.v, proj.v);
    };
    loss();
    double x0 = x[0];
    double want = kind == k::GeluKind::kExact
                      ? 0.5 * x0 * (1 + std::erf(x0 / std::sqrt(2.0)))
                      : 0.5 * x0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x0 + 0.044715 * x0 * x0 * x0)));
    if (kind == k::GeluKind::kSquaredRelu) want = x0 > 0 ? x0 * x0 : 0.0;
    EXPECT_NEAR(y[0], want, 1e-14);
    if (kind == k::GeluKind::kSquaredRelu) {  // both sides of 0
      int neg = 0, pos = 0;
      for (int i = 0; i < 40; ++i) {
        (x[i] < 0 ? neg : pos) += 1;
        EXPECT_EQ(y[i], x[i] > 0 ? x[i] * x[i] : 0.0);
      }
      EXPECT_GT(neg, 5);
      EXPECT_GT(pos, 5);
    }
    k::gelu_backward(kind, x.t(), proj.t(), dx.t());
    expect_fd_grad(x.v, loss, dx.v, "gelu dx");
  }
}

// The fp32 path (vectorised erf/exp/tanh, kernels/cpu/vec_math.h) against
// fp64 (libm's erf, exp, tanh) over [-10, 10], both pieces of erf and of
// tanh and the tails included, for the exact and the tanh form.
TEST(Gelu, Fp32MatchesFp64) {
  for (k::GeluKind kind : {k::GeluKind::kExact, k::GeluKind::kTanh}) {
  const size_t n = 20001;
  Buf<double> x({static_cast<int64_t>(n)}), y(x.shape), dy(x.shape), dx(x.shape);
  Buf<float> xf(x.shape), yf(x.shape), dyf(x.shape), dxf(x.shape);
  for (size_t i = 0; i < n; ++i) {
    xf[i] = static_cast<float>(-10.0 + 20.0 * static_cast<double>(i) / static_cast<double>(n - 1));
    x[i] = xf[i], dy[i] = 1.0, dyf[i] = 1.0f;
  }
  k::gelu_forward(kind, x.t(), y.t());
  k::gelu_backward(kind, x.t(), dy.t(), dx.t());
  k::gelu_forward(kind, xf.t(), yf.t());
  k::gelu_backward(kind, xf.t(), dyf.t(), dxf.t());
  double worst_y = 0, worst_dx = 0;
  for (size_t i = 0; i < n; ++i) {
    worst_y = std::max(worst_y, std::abs(yf[i] - y[i]) / std::max(1.0, std::abs(x[i])));
    worst_dx = std::max(worst_dx, std::abs(dxf[i] - dx[i]));
  }
  EXPECT_LT(worst_y, 5e-7) << (kind == k::GeluKind::kTanh ? "tanh form" : "exact");
  // The tanh form's backward loses a little more in fp32 (libm's tanh in its
  // place gives the same 5.5e-7 at x near 3, the cancellation in 1 - th^2).
  EXPECT_LT(worst_dx, kind == k::GeluKind::kTanh ? 1e-6 : 5e-7) << (kind == k::GeluKind::kTanh ? "tanh form" : "exact");
  }
}

// tanh_simd against libm's tanh in double: relative error within 4 fp32 ulp
// (2^-21) on a fine grid over [-12, 12], exact 0, odd, saturating to +-1.
TEST(VecMath, TanhSimdMatchesTanh) {
  double worst = 0;
  for (int i = -240000; i <= 240000; ++i) {
    const float x = static_cast<float>(i) * 5e-5f;
    const double want = std::tanh(static_cast<double>(x));
    const float got = mt::kernels::cpu::tanh_simd(x);
    if (want != 0) worst = std::max(worst, std::abs(got - want) / std::abs(want));
    ASSERT_EQ(got, -mt::kernels::cpu::tanh_simd(-x)) << x;
  }
  EXPECT_LT(worst, std::ldexp(1.0, -21));
  EXPECT_EQ(mt::kernels::cpu::tanh_simd(0.0f), 0.0f);
  EXPECT_EQ(mt::kernels::cpu::tanh_simd(30.0f), 1.0f);
  EXPECT_EQ(mt::kernels::cpu::tanh_simd(-1e6f), -1.0f);
  EXPECT_EQ(mt::kernels::cpu::tanh_simd(1e-30f), 1e-30f);
}

TEST(SwiGLU, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, F = 7;
  Buf<double> x({N, 2 * F}), y({N, F}), proj({N, F}), dx({N, 2 * F});
  fill_normal(x.v, 10, 1.5), fill_normal(proj.v, 11);
  auto loss = [&] {
    k::swiglu_forward(x.t(), y.t());
    return test::dot(y.v, proj.v);
  };
  loss();
  EXPECT_NEAR(y[1], x[1] / (1 + std::exp(-x[1])) * x[F + 1], 1e-14);  // silu(gate) * up
  k::swiglu_backward(x.t(), proj.t(), dx.t());
  expect_fd_grad(x.v, loss, dx.v, "swiglu dx");
}

// ---------------------------------------------------------------- RoPE

TEST(Rope, RotatesHalvesAndBackwardIsTranspose) {
  k::QkvLayout L{5, 2, 4, 2, 6};  // T=5, B=2, a=4, g=2, d=6
  const int64_t half = 3;
  Buf<double> qkv({L.tokens(), L.row()}), cos({L.seq, half}), sin({L.seq, half}), proj({L.tokens(), L.row()});
  fill_normal(qkv.v, 12), fill_normal(proj.v, 13);
  k::rope_table(10000.0, L.seq, L.head_dim, cos.t(), sin.t());
  std::vector<double> orig = qkv.v;
  Buf<double> work({L.tokens(), L.row()});
  k::rope_forward(qkv.t(), L, cos.t(), sin.t());
  // Closed form for token (t=3, b=1), head 3 (group 1, second q head), pair i=1.
  const int64_t r = 3 * 2 + 1, col = L.q_col(3), i = 1;
  const double ang = 3.0 * std::pow(10000.0, -2.0 * i / 6.0);
  const double x1 = orig[r * L.row() + col + i], x2 = orig[r * L.row() + col + i + half];
  EXPECT_NEAR(qkv[r * L.row() + col + i], x1 * std::cos(ang) - x2 * std::sin(ang), 1e-12);
  EXPECT_NEAR(qkv[r * L.row() + col + i + half], x2 * std::cos(ang) + x1 * std::sin(ang), 1e-12);
  // v untouched.
  for (int64_t c = 0; c < L.head_dim; ++c) EXPECT_EQ(qkv[r * L.row() + L.v_col(1) + c], orig[r * L.row() + L.v_col(1) + c]);
  // Backward vs finite differences.
  qkv.v = orig;
  auto loss = [&] {
    work.v = qkv.v;
    k::rope_forward(work.t(), L, cos.t(), sin.t());
    return test::dot(work.v, proj.v);
  };
  Buf<double> d({L.tokens(), L.row()});
  d.v = proj.v;
  k::rope_backward(d.t(), L, cos.t(), sin.t());
  expect_fd_grad(qkv.v, loss, d.v, "rope dqkv");
}

// --qk-layernorm's head rows: element (head j, dim t) of token r lands where
// the layout formula puts it (q heads of every token first, then k), v is
// neither read nor written, and scatter after gather restores qkv exactly.
TEST(QkHeads, GatherAndScatterFollowTheLayout) {
  for (const k::QkvLayout& L : {k::QkvLayout{3, 2, 6, 2, 4}, k::QkvLayout{2, 1, 3, 1, 5}, k::QkvLayout{2, 2, 2, 2, 3}}) {
    Buf<float> qkv({L.tokens(), L.row()}), heads({L.tokens() * (L.heads + L.groups), L.head_dim});
    for (int64_t i = 0; i < qkv.t().numel(); ++i) qkv[i] = static_cast<float>(i);  // each value its own index
    k::qk_heads_gather(qkv.t(), L, heads.t());
    const int64_t d = L.head_dim;
    for (int64_t r = 0; r < L.tokens(); ++r)
      for (int64_t t = 0; t < d; ++t) {
        for (int64_t j = 0; j < L.heads; ++j)
          ASSERT_EQ(heads[(r * L.heads + j) * d + t], static_cast<float>(r * L.row() + L.q_col(j) + t)) << r << " q" << j;
        for (int64_t j = 0; j < L.groups; ++j)
          ASSERT_EQ(heads[(L.tokens() * L.heads + r * L.groups + j) * d + t],
                    static_cast<float>(r * L.row() + L.k_col(j) + t))
              << r << " k" << j;
      }
    // Scatter negated heads: q and k columns change sign, v keeps its values.
    for (int64_t i = 0; i < heads.t().numel(); ++i) heads[i] = -heads[i];
    k::qk_heads_scatter(heads.t(), L, qkv.t());
    for (int64_t r = 0; r < L.tokens(); ++r)
      for (int64_t c = 0; c < L.row(); ++c) {
        const int64_t grp = c / ((L.heads_per_group() + 2) * d), in = c % ((L.heads_per_group() + 2) * d);
        const bool is_v = in >= (L.heads_per_group() + 1) * d;
        (void)grp;
        const float orig = static_cast<float>(r * L.row() + c);
        ASSERT_EQ(qkv[r * L.row() + c], is_v ? orig : -orig) << "token " << r << " column " << c;
      }
  }
}

// --multi-latent-attention's packing (kernels/mla.h): every qkv element is
// the q, kv or position-key element the layout names (each value its own
// index), v padded with zeros; unpack is pack's transpose (<pack(x), y> =
// <x, unpack(y)> for random x and y, so the position key's gradient sums
// the heads); mla_ctx takes each head's leading dv dims and pads them back.
TEST(Mla, PackFollowsTheLayoutAndUnpackIsItsTranspose) {
  for (const k::MlaDims& m : {k::MlaDims{4, 3, 5, 4, 6}, k::MlaDims{3, 1, 2, 2, 4}, k::MlaDims{2, 2, 4, 2, 3}}) {
    const int64_t N = m.tokens, a = m.heads, dn = m.dn, dr = m.dr, dv = m.dv, D = m.D();
    Buf<double> q({N, a * D}), kv({N, a * (dn + dv)}), kpe({N, dr}), qkv({N, 3 * a * D});
    for (int64_t i = 0; i < q.t().numel(); ++i) q[i] = 1000 + i;
    for (int64_t i = 0; i < kv.t().numel(); ++i) kv[i] = 2000 + i;
    for (int64_t i = 0; i < kpe.t().numel(); ++i) kpe[i] = 3000 + i;
    k::mla_pack(q.t(), kv.t(), kpe.t(), m, qkv.t());
    const k::QkvLayout L{N, 1, a, a, D};
    for (int64_t r = 0; r < N; ++r)
      for (int64_t h = 0; h < a; ++h)
        for (int64_t c = 0; c < D; ++c) {
          const double* row = &qkv[r * L.row()];
          const double want_q = c < dr ? q[(r * a + h) * D + dn + c] : q[(r * a + h) * D + c - dr];
          const double want_k = c < dr ? kpe[r * dr + c] : kv[(r * a + h) * (dn + dv) + c - dr];
          const double want_v = c < dv ? kv[(r * a + h) * (dn + dv) + dn + c] : 0.0;
          ASSERT_EQ(row[L.q_col(h) + c], want_q) << "token " << r << " head " << h << " q dim " << c;
          ASSERT_EQ(row[L.k_col(h) + c], want_k) << "token " << r << " head " << h << " k dim " << c;
          ASSERT_EQ(row[L.v_col(h) + c], want_v) << "token " << r << " head " << h << " v dim " << c;
        }
    std::mt19937 g(5);
    std::normal_distribution<double> nd;
    for (Buf<double>* b : {&q, &kv, &kpe}) for (auto& x : b->v) x = nd(g);
    Buf<double> y({N, 3 * a * D}), dq({N, a * D}), dkv({N, a * (dn + dv)}), dkpe({N, dr});
    for (auto& x : y.v) x = nd(g);
    k::mla_pack(q.t(), kv.t(), kpe.t(), m, qkv.t());
    k::mla_unpack(y.t(), m, dq.t(), dkv.t(), dkpe.t());
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < y.v.size(); ++i) {
      // The padded value dims are constants (zeros), not part of the transpose.
      const int64_t col = static_cast<int64_t>(i) % (3 * a * D) % (3 * D);
      if (col >= 2 * D + dv) continue;
      lhs += qkv.v[i] * y.v[i];
    }
    rhs = test::dot(q.v, dq.v) + test::dot(kv.v, dkv.v) + test::dot(kpe.v, dkpe.v);
    EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs));
    Buf<double> ctx({N, a * D}), cv({N, a * dv});
    for (int64_t i = 0; i < ctx.t().numel(); ++i) ctx[i] = i;
    k::mla_ctx(ctx.t(), cv.t(), m, false);
    for (int64_t i = 0; i < N * a; ++i)
      for (int64_t c = 0; c < dv; ++c) ASSERT_EQ(cv[i * dv + c], ctx[i * D + c]);
    k::mla_ctx(ctx.t(), cv.t(), m, true);
    for (int64_t i = 0; i < N * a; ++i)
      for (int64_t c = 0; c < D; ++c) ASSERT_EQ(ctx[i * D + c], c < dv ? cv[i * dv + c] : 0.0);
  }
}

// Partial rotation (--rotary-percent): the leading r dims rotate with r's
// own frequencies, the rest of q and k pass through; backward is still the
// transpose.
TEST(Rope, PartialRotationLeavesTheTailAndBackwardIsTranspose) {
  k::QkvLayout L{4, 2, 4, 2, 8};  // d = 8, r = 4
  const int64_t r = 4, half = 2;
  k::RopeSpec spec{10000.0, r};
  Buf<double> qkv({L.tokens(), L.row()}), cos({L.seq, half}), sin({L.seq, half}), proj({L.tokens(), L.row()});
  fill_normal(qkv.v, 21), fill_normal(proj.v, 22);
  k::rope_table(spec, L.seq, cos.t(), sin.t());
  const std::vector<double> orig = qkv.v;
  k::rope_forward(qkv.t(), L, cos.t(), sin.t(), r);
  const int64_t row = 2 * 2 + 1, col = L.k_col(1), i = 1;
  const double ang = 2.0 * std::pow(10000.0, -2.0 * i / 4.0);  // base^(-2i/r), not /d
  const double x1 = orig[row * L.row() + col + i], x2 = orig[row * L.row() + col + i + half];
  EXPECT_NEAR(qkv[row * L.row() + col + i], x1 * std::cos(ang) - x2 * std::sin(ang), 1e-12);
  EXPECT_NEAR(qkv[row * L.row() + col + i + half], x2 * std::cos(ang) + x1 * std::sin(ang), 1e-12);
  for (int64_t t = 0; t < L.tokens(); ++t)
    for (int64_t h = 0; h < L.heads; ++h)
      for (int64_t c = r; c < L.head_dim; ++c)
        ASSERT_EQ(qkv[t * L.row() + L.q_col(h) + c], orig[t * L.row() + L.q_col(h) + c]) << "dim " << c << " must pass through";
  Buf<double> work({L.tokens(), L.row()}), d({L.tokens(), L.row()});
  qkv.v = orig;
  auto loss = [&] {
    work.v = qkv.v;
    k::rope_forward(work.t(), L, cos.t(), sin.t(), r);
    return test::dot(work.v, proj.v);
  };
  d.v = proj.v;
  k::rope_backward(d.t(), L, cos.t(), sin.t(), r);
  expect_fd_grad(qkv.v, loss, d.v, "partial rope dqkv");
  EXPECT_DEATH(k::rope_forward(qkv.t(), L, cos.t(), sin.t(), 3), "rotated dims must be even");
  EXPECT_DEATH(k::rope_forward(qkv.t(), L, cos.t(), sin.t(), 10), "rotated dims must be even");
}

// Llama 3.1 scaling without PyTorch: each frequency is kept (wavelength
// under 2048), divided by the factor (over 8192) or in between.
TEST(Rope, Llama31ScalingHasThreeBands) {
  // The three bands, closed form: base 500000, d 128, factor 8.
  const auto f = k::rope_inv_freq({500000, 128, true, 8, 1});
  const auto p = k::rope_inv_freq({500000, 128, false, 8, 1});
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double wl = 2 * M_PI / p[i];
    if (wl < 2048) kept += f[i] == p[i];
    else if (wl > 8192) divided += f[i] == p[i] / 8;
    else smoothed += f[i] < p[i] && f[i] > p[i] / 8;
  }
  EXPECT_EQ(kept + divided + smoothed, 64);
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

// --rotary-interleaved: pair i is dims (2i, 2i + 1) with frequency i; the
// tail past r passes through; backward is the transpose.
TEST(Rope, InterleavedPairsAdjacentDims) {
  k::QkvLayout L{4, 2, 4, 2, 8};
  const int64_t r = 6, half = 3;  // a partial rotation too: dims 6, 7 pass through
  k::RopeSpec spec{10000.0, r};
  Buf<double> qkv({L.tokens(), L.row()}), cos({L.seq, half}), sin({L.seq, half}), proj({L.tokens(), L.row()});
  fill_normal(qkv.v, 31), fill_normal(proj.v, 32);
  k::rope_table(spec, L.seq, cos.t(), sin.t());
  const std::vector<double> orig = qkv.v;
  k::rope_forward(qkv.t(), L, cos.t(), sin.t(), r, true);
  const int64_t row = 3 * 2 + 0, col = L.q_col(2), i = 2;
  const double ang = 3.0 * std::pow(10000.0, -2.0 * i / 6.0);
  const double x1 = orig[row * L.row() + col + 2 * i], x2 = orig[row * L.row() + col + 2 * i + 1];
  EXPECT_NEAR(qkv[row * L.row() + col + 2 * i], x1 * std::cos(ang) - x2 * std::sin(ang), 1e-12);
  EXPECT_NEAR(qkv[row * L.row() + col + 2 * i + 1], x2 * std::cos(ang) + x1 * std::sin(ang), 1e-12);
  for (int64_t c = r; c < L.head_dim; ++c) EXPECT_EQ(qkv[row * L.row() + col + c], orig[row * L.row() + col + c]);
  Buf<double> work({L.tokens(), L.row()}), d({L.tokens(), L.row()});
  qkv.v = orig;
  auto loss = [&] {
    work.v = qkv.v;
    k::rope_forward(work.t(), L, cos.t(), sin.t(), r, true);
    return test::dot(work.v, proj.v);
  };
  d.v = proj.v;
  k::rope_backward(d.t(), L, cos.t(), sin.t(), r, true);
  expect_fd_grad(qkv.v, loss, d.v, "interleaved rope dqkv");
}

// The tables against Megatron's formulas run in float64 PyTorch
// (tests/kernels/rope_reference.py): plain, Llama 3.1 scaling with its three
// frequency bands, partial rotation and position interpolation.
TEST(Rope, TablesMatchMegatronsFormulas) {
  struct Case {
    int64_t seq, kv;
    double base, percent;
    bool scaling;
    double factor, interp;
  };
  const Case cases[] = {{300, 128, 500000, 1.0, true, 8, 1},   // Llama 3.1 8B
                        {64, 64, 500000, 1.0, true, 32, 1},    // Llama 3.2's factor
                        {50, 128, 10000, 1.0, false, 8, 1},
                        {50, 96, 10000, 0.25, false, 8, 1},    // GPT-NeoX style partial rotation
                        {30, 64, 10000, 0.3, false, 8, 1},     // int(19.2) = 19: 10 frequencies over 19, 20 dims rotate
                        {40, 64, 1e6, 0.5, true, 16, 4}};
  const std::string dir = std::string(MT_BINARY_DIR) + "/test-artifacts", out = dir + "/rope_ref_";
  std::string cmd = fmt::format("mkdir -p {} && /usr/bin/python3 {}/tests/kernels/rope_reference.py {}", dir, MT_SOURCE_DIR, out);
  for (const Case& c : cases)
    cmd += fmt::format(" {} {} {} {} {} {} {}", c.seq, c.kv, c.base, c.percent, c.scaling ? 1 : 0, c.factor, c.interp);
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3 (apt install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const int64_t dim = c.percent < 1 ? static_cast<int64_t>(c.kv * c.percent) : c.kv, rot = dim + dim % 2, half = rot / 2;
    auto read = [&](const std::string& p) {
      std::vector<double> v(static_cast<size_t>(c.seq * half));
      std::ifstream in(p, std::ios::binary);
      in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(double)));
      EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(v.size() * sizeof(double))) << p;
      return v;
    };
    const auto rc_ = read(out + std::to_string(ci) + "cos.f64"), rs_ = read(out + std::to_string(ci) + "sin.f64");
    k::RopeSpec spec{c.base, rot, c.scaling, c.factor, c.interp, dim};
    Buf<double> cos({c.seq, half}), sin({c.seq, half});
    k::rope_table(spec, c.seq, cos.t(), sin.t());
    double worst = 0;
    for (size_t i = 0; i < rc_.size(); ++i) worst = std::max({worst, std::abs(cos.v[i] - rc_[i]), std::abs(sin.v[i] - rs_[i])});
    EXPECT_LT(worst, 1e-12) << "seq " << c.seq << " kv " << c.kv << " scaling " << c.scaling;
    if (c.scaling) {  // and the scaling changed something
      k::RopeSpec plain = spec;
      plain.llama3_scaling = false;
      EXPECT_NE(k::rope_inv_freq(plain), k::rope_inv_freq(spec));
    }
  }
}

// ---------------------------------------------------------------- attention

// Naive causal GQA attention in double: softmax over the full row (with
// doc_start [B, T]: over keys doc_start[b, i] .. i only).
void attention_naive(const std::vector<double>& qkv, const k::QkvLayout& L, double scale, std::vector<double>& out,
                     const std::vector<int32_t>* doc_start = nullptr) {
  const int64_t T = L.seq, B = L.batch, D = L.head_dim, row = L.row();
  out.assign(L.tokens() * L.heads * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < L.heads; ++h) {
      const int64_t g = h / L.heads_per_group();
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = doc_start ? (*doc_start)[static_cast<size_t>(b * T + i)] : 0;
        std::vector<double> s(i + 1, -1e300);
        double mx = -1e300;
        for (int64_t j = j0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += qkv[(i * B + b) * row + L.q_col(h) + c] * qkv[(j * B + b) * row + L.k_col(g) + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int64_t j = j0; j <= i; ++j)
          for (int64_t c = 0; c < D; ++c)
            out[(i * B + b) * L.heads * D + h * D + c] += s[j] / z * qkv[(j * B + b) * row + L.v_col(g) + c];
      }
    }
}

struct AttnCase {
  k::QkvLayout L;
  double dropout;
};

TEST(Attention, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  // Sequences longer than one tile so that tiling and the online softmax are exercised.
  for (AttnCase ac : {AttnCase{{70, 2, 4, 2, 4}, 0.0}, AttnCase{{9, 1, 2, 2, 3}, 0.0}, AttnCase{{67, 1, 3, 1, 2}, 0.3}}) {
    const k::QkvLayout& L = ac.L;
    k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), ac.dropout, 99, 7, 0};
    Buf<double> qkv({L.tokens(), L.row()}), out({L.tokens(), L.heads * L.head_dim}), lse({L.batch, L.heads, L.seq}),
        proj({L.tokens(), L.heads * L.head_dim}), dqkv({L.tokens(), L.row()});
    fill_normal(qkv.v, 14), fill_normal(proj.v, 15);
    auto loss = [&] {
      k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
      return test::dot(out.v, proj.v);
    };
    loss();
    if (ac.dropout == 0) {
      std::vector<double> ref;
      attention_naive(qkv.v, L, o.scale, ref);
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - out[i]));
      EXPECT_LT(worst, 1e-12) << "T=" << L.seq;
    }
    k::attention_backward(qkv.t(), out.t(), proj.t(), lse.t(), L, o, dqkv.t());
    // Finite differences over a subset for the long case to keep the test fast.
    if (qkv.size() > 4000) {
      std::vector<double> sub_x, sub_g;
      // Perturb every element but check through the generic helper on a strided view.
      std::vector<size_t> idx;
      for (size_t i = 0; i < qkv.size(); i += 13) idx.push_back(i);
      std::vector<double> xs(idx.size()), gs(idx.size());
      for (size_t n = 0; n < idx.size(); ++n) xs[n] = qkv[idx[n]], gs[n] = dqkv[idx[n]];
      auto loss_sub = [&] {
        for (size_t n = 0; n < idx.size(); ++n) qkv[idx[n]] = xs[n];
        return loss();
      };
      expect_fd_grad(xs, loss_sub, gs, "attention dqkv (strided subset)");
    } else {
      expect_fd_grad(qkv.v, loss, dqkv.v, "attention dqkv");
    }
  }
}

TEST(Attention, Bf16InputsMatchFp32WithinBf16Tolerance) {
  k::QkvLayout L{80, 2, 4, 2, 16};
  k::AttentionOptions o{0.25, 0, 0, 0, 0};
  Buf<float> qkv({L.tokens(), L.row()}), out({L.tokens(), L.heads * L.head_dim}), out_h({L.tokens(), L.heads * L.head_dim}),
      lse({L.batch, L.heads, L.seq}), lse_h({L.batch, L.heads, L.seq}), dout({L.tokens(), L.heads * L.head_dim}),
      dq({L.tokens(), L.row()}), dq_h({L.tokens(), L.row()});
  Buf<bf16> qkv_h({L.tokens(), L.row()});
  fill_normal(qkv.v, 16), fill_normal(dout.v, 17);
  k::cast(qkv.t(), qkv_h.t());
  k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
  k::attention_forward(qkv_h.t(), L, o, out_h.t(), lse_h.t());
  k::attention_backward(qkv.t(), out.t(), dout.t(), lse.t(), L, o, dq.t());
  k::attention_backward(qkv_h.t(), out_h.t(), dout.t(), lse_h.t(), L, o, dq_h.t());
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel(out.v, out_h.v), 1e-2);
  EXPECT_LT(rel(dq.v, dq_h.v), 2e-2);
}

// Forward and backward on fp64 and on the same values in fp32 (qkv from
// seed, dout from seed + 1): out, lse and dqkv within fp32 rounding.
void expect_fp32_matches_fp64(const k::QkvLayout& L, const k::AttentionOptions& o, uint64_t seed) {
  const int64_t no = L.tokens() * L.heads * L.head_dim, nq = L.tokens() * L.row(), nl = L.batch * L.heads * L.seq;
  Buf<double> qkv({nq}), out({no}), lse({nl}), dout({no}), dq({nq});
  Buf<float> qkv_f({nq}), out_f({no}), lse_f({nl}), dout_f({no}), dq_f({nq});
  fill_normal(qkv.v, seed, 1.5), fill_normal(dout.v, seed + 1);
  for (size_t i = 0; i < qkv.size(); ++i) qkv_f[i] = static_cast<float>(qkv[i]);
  for (size_t i = 0; i < dout.size(); ++i) dout_f[i] = static_cast<float>(dout[i]);
  k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
  k::attention_backward(qkv.t(), out.t(), dout.t(), lse.t(), L, o, dq.t());
  k::attention_forward(qkv_f.t(), L, o, out_f.t(), lse_f.t());
  k::attention_backward(qkv_f.t(), out_f.t(), dout_f.t(), lse_f.t(), L, o, dq_f.t());
  auto rel = [](const std::vector<double>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
    return std::sqrt(num / den);
  };
  const std::string what = "d " + std::to_string(L.head_dim) + " dropout " + std::to_string(o.dropout) +
                           (o.doc_start.defined() ? " documents" : "");
  EXPECT_LT(rel(out.v, out_f.v), 2e-6) << what;
  EXPECT_LT(rel(lse.v, lse_f.v), 1e-6) << what;
  EXPECT_LT(rel(dq.v, dq_f.v), 5e-6) << what;
}

// The fp32 path (register-blocked tiles, vectorised exp) against the fp64
// path on the same inputs: causal tile edges inside a tile (T=150, 70, 33 with
// 64-wide tiles, row counts not a multiple of 4), GQA, head_dim 64 as in
// GPT-2 and 80 / 32 (other vector counts), and 24 (not a multiple of 16: the
// generic fp32 path), with and without dropout.
TEST(Attention, Fp32MatchesFp64) {
  std::vector<AttnCase> cases;
  for (k::QkvLayout L : {k::QkvLayout{150, 2, 4, 2, 64}, k::QkvLayout{70, 1, 2, 1, 80}, k::QkvLayout{33, 3, 2, 2, 32},
                         k::QkvLayout{45, 2, 2, 1, 24}})
    for (double dropout : {0.0, 0.2}) cases.push_back({L, dropout});
  for (const auto& [L, dropout] : cases)
    expect_fp32_matches_fp64(L, k::AttentionOptions{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 5, 3, 0},
                             31);
}

// With bf16 qkv, out, dout and dqkv may each be bf16 (under --bf16 the model
// keeps ctx, dctx and dqkv so): a bf16 output is the fp32 result rounded once
// as it is stored, bit for bit, and a bf16 input gives bit for bit the result
// of an fp32 input holding the same values. All 2 x 2 x 2 backward
// combinations against the all-fp32 call; GQA, causal with partial tiles
// (T = 70 over 64-row tiles), with and without dropout; head_dim 32 takes the
// fast path, 24 the generic one. Other combinations are refused, naming the
// tensor.
template <typename H>
void attention_half_outputs_are_rounded() {
  auto bits_equal = [](const std::vector<float>& want, const std::vector<H>& got, const std::string& what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (to_half<H>(want[i]).bits != got[i].bits && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": " << want[first] << " rounds to "
                       << to_half<H>(want[first]).bits << ", got " << got[first].bits;
  };
  auto same_bits = [](const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
    ASSERT_EQ(want.size(), got.size()) << what;
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << what;
  };
  const char* hn = dtype_name(dtype_of<H>());
  for (k::QkvLayout L : {k::QkvLayout{70, 2, 4, 2, 32}, k::QkvLayout{70, 2, 4, 2, 24}})
    for (double dropout : {0.0, 0.2}) {
      const std::string what = "d " + std::to_string(L.head_dim) + " dropout " + std::to_string(dropout);
      const k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 21, 4, 1};
      const Shape qs{L.tokens(), L.row()}, os{L.tokens(), L.heads * L.head_dim}, ls{L.batch, L.heads, L.seq};
      Buf<float> qkv_f(qs), dout_f(os);
      fill_normal(qkv_f.v, 41, 1.5), fill_normal(dout_f.v, 42);
      Buf<H> qkv(qs), dout_h(os);
      k::cast(qkv_f.t(), qkv.t());
      k::cast(dout_f.t(), dout_h.t());
      k::cast(dout_h.t(), dout_f.t());  // dout_f now holds the bf16 values

      Buf<float> out(os), lse(ls), lse2(ls);
      Buf<H> out_h(os);
      k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
      k::attention_forward(qkv.t(), L, o, out_h.t(), lse2.t());
      bits_equal(out.v, out_h.v, what + ": 16-bit out");
      same_bits(lse.v, lse2.v, what + ": lse with 16-bit out");

      // Reference: the all-fp32 backward on fp32 copies of the bf16 out and dout.
      Buf<float> out_f(os), dq(qs);
      k::cast(out_h.t(), out_f.t());
      k::attention_backward(qkv.t(), out_f.t(), dout_f.t(), lse.t(), L, o, dq.t());
      for (int mask = 1; mask < 8; ++mask) {
        const bool o16 = mask & 1, d16 = mask & 2, g16 = mask & 4;
        const std::string combo = what + fmt::format(": out {} dout {} dqkv {}", o16 ? hn : "fp32",
                                                     d16 ? hn : "fp32", g16 ? hn : "fp32");
        Buf<float> dq_f(qs, NAN);
        Buf<H> dq_h(qs, to_half<H>(NAN));
        k::attention_backward(qkv.t(), o16 ? out_h.t() : out_f.t(), d16 ? dout_h.t() : dout_f.t(), lse.t(), L, o,
                              g16 ? dq_h.t() : dq_f.t());
        if (g16) bits_equal(dq.v, dq_h.v, combo);
        else same_bits(dq.v, dq_f.v, combo);
      }
    }
}

TEST(Attention, HalfOutputsAreTheRoundedFp32Results_BitForBit) {
  attention_half_outputs_are_rounded<bf16>();
  attention_half_outputs_are_rounded<f16>();
  // fp32 qkv keeps fp32 activations; lse stays in the accumulation type.
  const k::QkvLayout L{8, 1, 2, 1, 16};
  const k::AttentionOptions o{0.25, 0, 0, 0, 0};
  Buf<float> qkv({L.tokens(), L.row()}), out({L.tokens(), L.heads * L.head_dim}), lse({L.batch, L.heads, L.seq});
  Buf<bf16> qkv_h({L.tokens(), L.row()}), out_h({L.tokens(), L.heads * L.head_dim}),
      lse_h({L.batch, L.heads, L.seq});
  Buf<double> out_d({L.tokens(), L.heads * L.head_dim});
  EXPECT_DEATH(k::attention_forward(qkv.t(), L, o, out_h.t(), lse.t()),
               "attention_forward: out is bf16, expected fp32 for fp32 qkv");
  EXPECT_DEATH(k::attention_forward(qkv_h.t(), L, o, out_d.t(), lse.t()),
               "attention_forward: out is fp64, expected fp32 or bf16 for bf16 qkv");
  EXPECT_DEATH(k::attention_forward(qkv_h.t(), L, o, out_h.t(), lse_h.t()),
               "attention_forward: lse is bf16, expected fp32 for bf16 qkv");
  Buf<float> dqkv({L.tokens(), L.row()});
  EXPECT_DEATH(k::attention_backward(qkv.t(), out.t(), out_h.t(), lse.t(), L, o, dqkv.t()),
               "attention_backward: dout is bf16, expected fp32 for fp32 qkv");
  Buf<double> dqkv_d({L.tokens(), L.row()});
  EXPECT_DEATH(k::attention_backward(qkv_h.t(), out.t(), out.t(), lse.t(), L, o, dqkv_d.t()),
               "attention_backward: dqkv is fp64, expected fp32 or bf16 for bf16 qkv");
}

// Document masking (--reset-attention-mask): doc_start [B, T] from
// documents ending at an EOD; each query sees its own document's keys only.
std::vector<int32_t> doc_starts_of(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& eods) {
  std::vector<int32_t> d(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      d[static_cast<size_t>(b * T + t)] = start;
      for (int64_t e : eods[static_cast<size_t>(b)])
        if (e == t) start = static_cast<int32_t>(t + 1);  // the EOD closes its document
    }
  }
  return d;
}

// Context parallelism: each CP rank computes the queries of chunks r and
// 2 cp - 1 - r against the whole sequence's keys. Its out and lse rows are
// bit for bit the full call's rows at those positions (same key tiles, same
// order, positions for masks and dropout), and the CP ranks' dqkv summed
// equal the full call's dqkv (dK and dV accumulate in another order: rounding
// only). fp64 generic and fp32 fast/generic paths, chunks shorter and longer
// than a tile and not a multiple of it, GQA, dropout.
template <typename T>
void check_cp_attention(const k::QkvLayout& L, int64_t cp, double dropout, double tol,
                        std::vector<int32_t> doc = {}) {
  k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 5, 3, 1};
  if (!doc.empty()) o.doc_start = Tensor(doc.data(), {L.batch, L.seq}, DType::kI32);
  const int64_t ad = L.heads * L.head_dim, nq = L.tokens() * L.row(), Tq = L.seq / cp;
  Buf<T> qkv({nq}), out({L.tokens() * ad}), lse({L.batch * L.heads * L.seq}), dout({L.tokens() * ad}), dq({nq});
  std::vector<double> seed_q(static_cast<size_t>(nq)), seed_d(static_cast<size_t>(L.tokens() * ad));
  fill_normal(seed_q, 41, 1.5), fill_normal(seed_d, 42);
  for (int64_t i = 0; i < nq; ++i) qkv[i] = static_cast<T>(seed_q[i]);
  for (size_t i = 0; i < seed_d.size(); ++i) dout[i] = static_cast<T>(seed_d[i]);
  k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
  k::attention_backward(qkv.t(), out.t(), dout.t(), lse.t(), L, o, dq.t());
  std::vector<double> dsum(static_cast<size_t>(nq), 0.0);
  for (int64_t r = 0; r < cp; ++r) {
    k::AttentionOptions oc = o;
    oc.cp_size = cp, oc.cp_rank = r;
    const k::QueryChunks qc = k::query_chunks(L, oc);
    ASSERT_EQ(qc.rows(), Tq);
    Buf<T> out_r({Tq * L.batch * ad}), lse_r({L.batch * L.heads * Tq}), dout_r({Tq * L.batch * ad}), dq_r({nq});
    for (int64_t t = 0; t < Tq; ++t)  // this rank's rows of dout
      for (int64_t x = 0; x < L.batch * ad; ++x) dout_r[t * L.batch * ad + x] = dout[qc.position(t) * L.batch * ad + x];
    for (int64_t x = 0; x < nq; ++x) dq_r[x] = static_cast<T>(777);  // written everywhere
    k::attention_forward(qkv.t(), L, oc, out_r.t(), lse_r.t());
    k::attention_backward(qkv.t(), out_r.t(), dout_r.t(), lse_r.t(), L, oc, dq_r.t());
    int64_t out_diff = 0, lse_diff = 0;
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t p = qc.position(t);
      for (int64_t x = 0; x < L.batch * ad; ++x) out_diff += out_r[t * L.batch * ad + x] != out[p * L.batch * ad + x];
      for (int64_t bh = 0; bh < L.batch * L.heads; ++bh) lse_diff += lse_r[bh * Tq + t] != lse[bh * L.seq + p];
    }
    EXPECT_EQ(out_diff, 0) << "cp " << cp << " rank " << r << " T " << L.seq;
    EXPECT_EQ(lse_diff, 0) << "cp " << cp << " rank " << r << " T " << L.seq;
    for (int64_t x = 0; x < nq; ++x) dsum[static_cast<size_t>(x)] += static_cast<double>(dq_r[x]);
  }
  double num = 0, den = 0;
  for (int64_t x = 0; x < nq; ++x) {
    const double e = dsum[static_cast<size_t>(x)] - static_cast<double>(dq[x]);
    num += e * e, den += static_cast<double>(dq[x]) * static_cast<double>(dq[x]);
  }
  EXPECT_LT(std::sqrt(num / den), tol) << "cp " << cp << " T " << L.seq << " d " << L.head_dim << " dropout " << dropout;
}

// QueryChunks' tiles, by index and by the division-free walk (place, next,
// tile_at; the CUDA dK/dV kernel's lean build walks this way), against the
// tiles written out from the definition: each chunk cut into tiles from its
// first row, the last one shorter. Chunks shorter than a tile, a multiple of
// it and not, one chunk (no CP) and two.
TEST(Attention, QueryTileWalkMatchesTheTileIndex) {
  for (int64_t cp : {1, 2, 3})
    for (int64_t seq : {int64_t{5}, int64_t{6}, int64_t{64}, int64_t{140}, int64_t{420}})
      for (int64_t r = 0; r < cp; ++r)
        for (int64_t size : {1, 7, 32, 64}) {
          if (cp > 1 && seq % (2 * cp) != 0) continue;
          const k::QueryChunks q = k::query_chunks(seq, cp, r);
          const int64_t n = cp == 1 ? 1 : 2, len = cp == 1 ? seq : seq / (2 * cp);
          const std::string what = fmt::format("seq {} cp {} rank {} tile {}", seq, cp, r, size);
          ASSERT_EQ(q.n, n) << what;
          ASSERT_EQ(q.len, len) << what;
          std::vector<k::QueryChunks::Tile> want;
          for (int64_t c = 0; c < n; ++c) {
            const int64_t start = cp == 1 ? 0 : (c == 0 ? r : 2 * cp - 1 - r) * len;
            for (int64_t off = 0; off < len; off += size)
              want.push_back({c * len + off, start + off, std::min(size, len - off)});
          }
          ASSERT_EQ(q.tiles(size), static_cast<int64_t>(want.size())) << what;
          k::QueryChunks::Place at = q.place(0, size);
          for (int64_t qt = 0; qt < q.tiles(size); ++qt) {
            const k::QueryChunks::Tile& w = want[static_cast<size_t>(qt)];
            const k::QueryChunks::Tile byindex = q.tile(qt, size), walked = q.tile_at(at, size);
            EXPECT_EQ(byindex.local, w.local) << what << " tile " << qt;
            EXPECT_EQ(byindex.pos, w.pos) << what << " tile " << qt;
            EXPECT_EQ(byindex.rows, w.rows) << what << " tile " << qt;
            EXPECT_EQ(walked.local, w.local) << what << " walk at tile " << qt;
            EXPECT_EQ(walked.pos, w.pos) << what << " walk at tile " << qt;
            EXPECT_EQ(walked.rows, w.rows) << what << " walk at tile " << qt;
            EXPECT_EQ(q.position(w.local + w.rows - 1), w.pos + w.rows - 1) << what << " tile " << qt;
            at = q.next(at, size);
          }
          EXPECT_EQ(at.chunk, q.n) << what << ": the walk ends past the last chunk";
          EXPECT_EQ(at.off, 0) << what;
        }
}

TEST(Attention, ContextParallelChunksMatchTheFullCall) {
  for (int64_t cp : {2, 3}) {
    for (double dropout : {0.0, 0.25}) {
      check_cp_attention<double>(k::QkvLayout{12 * cp, 2, 4, 2, 8}, cp, dropout, 1e-13);   // chunks of 6: within a tile
      check_cp_attention<double>(k::QkvLayout{140 * cp, 1, 2, 1, 8}, cp, dropout, 1e-13);  // chunks of 70: across tiles
      check_cp_attention<float>(k::QkvLayout{140 * cp, 2, 4, 2, 32}, cp, dropout, 1e-5);   // fp32 fast path
      check_cp_attention<float>(k::QkvLayout{20 * cp, 1, 2, 2, 24}, cp, dropout, 1e-5);    // fp32 generic path
      // Document masks (positions, as the kernels see them).
      const std::vector<std::vector<int64_t>> eods = {{5, 77, 78, 150}, {0, 64, 140}};
      check_cp_attention<double>(k::QkvLayout{140 * cp, 2, 2, 1, 8}, cp, dropout, 1e-13,
                                 doc_starts_of(2, 140 * cp, eods));
      check_cp_attention<float>(k::QkvLayout{140 * cp, 2, 4, 2, 32}, cp, dropout, 1e-5,
                                doc_starts_of(2, 140 * cp, eods));
    }
  }
}

// Against the naive masked softmax and finite differences (fp64, generic
// path); the fp32 fast and generic paths against fp64 with dropout; every
// CP rank's chunks against the full masked call. Documents shorter than a
// tile, spanning tiles, a one-token document and one starting at a tile
// boundary.
TEST(Attention, DocumentMaskMatchesNaiveFiniteDifferencesAndCp) {
  const std::vector<std::vector<int64_t>> eods = {{9, 10, 63, 100}, {0, 70, 71, 72}};
  for (const k::QkvLayout& L : {k::QkvLayout{140, 2, 4, 2, 4}, k::QkvLayout{12, 2, 2, 1, 3}}) {
    std::vector<int32_t> ds = doc_starts_of(L.batch, L.seq, eods);
    Buf<int32_t> dst({L.batch, L.seq});
    dst.v = ds;
    k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), 0.0, 3, 4, 0};
    o.doc_start = dst.t();
    Buf<double> qkv({L.tokens(), L.row()}), out({L.tokens(), L.heads * L.head_dim}), lse({L.batch, L.heads, L.seq}),
        proj({L.tokens(), L.heads * L.head_dim}), dqkv({L.tokens(), L.row()});
    fill_normal(qkv.v, 24), fill_normal(proj.v, 25);
    auto loss = [&] {
      k::attention_forward(qkv.t(), L, o, out.t(), lse.t());
      return test::dot(out.v, proj.v);
    };
    loss();
    std::vector<double> ref;
    attention_naive(qkv.v, L, o.scale, ref, &ds);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - out[i]));
    EXPECT_LT(worst, 1e-12) << "T=" << L.seq;
    k::attention_backward(qkv.t(), out.t(), proj.t(), lse.t(), L, o, dqkv.t());
    std::vector<size_t> idx;
    for (size_t i = 0; i < qkv.size(); i += qkv.size() > 4000 ? 11 : 1) idx.push_back(i);
    std::vector<double> xs(idx.size()), gs(idx.size());
    for (size_t n = 0; n < idx.size(); ++n) xs[n] = qkv[idx[n]], gs[n] = dqkv[idx[n]];
    auto loss_sub = [&] {
      for (size_t n = 0; n < idx.size(); ++n) qkv[idx[n]] = xs[n];
      return loss();
    };
    expect_fd_grad(xs, loss_sub, gs, "attention dqkv with document masks");
  }
  // fp32 (fast path d = 32, generic d = 24) against fp64, with dropout.
  for (const k::QkvLayout& L : {k::QkvLayout{140, 2, 4, 2, 32}, k::QkvLayout{140, 2, 2, 2, 24}})
    for (double dropout : {0.0, 0.2}) {
      Buf<int32_t> dst({L.batch, L.seq});
      dst.v = doc_starts_of(L.batch, L.seq, eods);
      k::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(L.head_dim)), dropout, 5, 3, 0};
      o.doc_start = dst.t();
      expect_fp32_matches_fp64(L, o, 33);
    }
}

TEST(Attention, SeqLen4096NeverAllocatesTxT) {
  // a=4 heads, g=2 groups, d=64, B=1, T=4096: T*T*a fp32 scores would be 256 MiB.
  k::QkvLayout L{4096, 1, 4, 2, 64};
  const size_t txt = static_cast<size_t>(L.seq) * L.seq * L.heads * sizeof(float);
  Arena arena(size_t{64} << 20, "attention-4096");
  Tensor qkv = arena.alloc({L.tokens(), L.row()}, DType::kF32);
  Tensor out = arena.alloc({L.tokens(), L.heads * L.head_dim}, DType::kF32);
  Tensor lse = arena.alloc({L.batch, L.heads, L.seq}, DType::kF32);
  Tensor dout = arena.alloc({L.tokens(), L.heads * L.head_dim}, DType::kF32);
  Tensor dqkv = arena.alloc({L.tokens(), L.row()}, DType::kF32);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.ptr<float>()[i] = static_cast<float>(philox_normal(1, 2, i));
  for (int64_t i = 0; i < dout.numel(); ++i) dout.ptr<float>()[i] = static_cast<float>(philox_normal(1, 3, i));
  k::AttentionOptions o{0.125, 0, 0, 0, 0};
  k::attention_forward(qkv, L, o, out, lse);
  k::attention_backward(qkv, out, dout, lse, L, o, dqkv);
  // Only the five planned buffers (25 MB) live in the arena: less than ONE head's T x T fp32.
  EXPECT_LT(arena.high_water(), txt / static_cast<size_t>(L.heads)) << "arena high-water " << arena.high_water();
  // Row 0 attends only to itself: output equals v of token 0, lse equals its scaled score.
  const float* q = qkv.ptr<float>();
  for (int64_t c = 0; c < L.head_dim; ++c) EXPECT_NEAR(out.ptr<float>()[c], q[L.v_col(0) + c], 1e-6);
  for (int64_t i = 0; i < dqkv.numel(); ++i) ASSERT_TRUE(std::isfinite(dqkv.ptr<float>()[i]));
}

// ---------------------------------------------------------------- cross-entropy

TEST(CrossEntropy, LossMatchesClosedFormAndVocabShardsAgree) {
  const int64_t N = 4, V = 11;
  Buf<double> lg({N, V});
  fill_normal(lg.v, 18, 3.0);
  Buf<int32_t> tg({N});
  tg.v = {3, 10, 0, -1};  // the last row is ignored
  Buf<double> mx({N}), se({N}), tl({N}), loss({N});
  k::xent_partials(lg.t(), tg.t(), 0, mx.t(), se.t(), tl.t());
  k::xent_loss(mx.t(), se.t(), tl.t(), tg.t(), loss.t());
  for (int64_t i = 0; i < 3; ++i) {
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(lg[i * V + j]);
    EXPECT_NEAR(loss[i], std::log(z) - lg[i * V + tg[i]], 1e-12);
  }
  EXPECT_EQ(loss[3], 0.0);
  // Two shards [0,6) and [6,11), combined as the TP all-reduces would.
  const int64_t split = 6;
  Buf<double> s0({N, split}), s1({N, V - split});
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < V; ++j) (j < split ? s0[i * split + j] : s1[i * (V - split) + j - split]) = lg[i * V + j];
  Buf<double> m0({N}), e0({N}), t0({N}), m1({N}), e1({N}), t1({N}), gm({N}), l2({N});
  k::xent_partials(s0.t(), tg.t(), 0, m0.t(), e0.t(), t0.t());
  k::xent_partials(s1.t(), tg.t(), split, m1.t(), e1.t(), t1.t());
  for (int64_t i = 0; i < N; ++i) gm[i] = std::max(m0[i], m1[i]);                          // all-reduce max
  k::xent_rescale(e0.t(), m0.t(), gm.t());
  k::xent_rescale(e1.t(), m1.t(), gm.t());
  for (int64_t i = 0; i < N; ++i) e0[i] += e1[i], t0[i] += t1[i];                           // all-reduce sum
  k::xent_loss(gm.t(), e0.t(), t0.t(), tg.t(), l2.t());
  for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(l2[i], loss[i], 1e-12);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, V = 9;
  Buf<double> lg({N, V}), dl({N}), mx({N}), se({N}), tl({N}), loss({N}), dlg({N, V});
  fill_normal(lg.v, 19, 2.0), fill_normal(dl.v, 20);
  Buf<int64_t> tg({N});
  tg.v = {1, 8, 4};
  auto f = [&] {
    k::xent_partials(lg.t(), tg.t(), 0, mx.t(), se.t(), tl.t());
    k::xent_loss(mx.t(), se.t(), tl.t(), tg.t(), loss.t());
    return test::dot(loss.v, dl.v);
  };
  f();
  k::xent_backward(lg.t(), tg.t(), 0, mx.t(), se.t(), dl.t(), dlg.t());
  expect_fd_grad(lg.v, f, dlg.v, "dlogits");
}

// The bf16-compute path writes dlogits in bf16 straight from the softmax:
// bitwise the fp32 gradient, rounded. A vocabulary shard, an ignored label.
template <typename H>
void xent_half_backward_is_rounded() {
  for (int64_t v0 : {int64_t{0}, int64_t{50}}) {
    const int64_t N = 45, V = 130;
    Buf<float> lg({N, V}), dl({N}), mx({N}), se({N}), tl({N}), dlg({N, V});
    fill_normal(lg.v, 31, 3.0), fill_normal(dl.v, 32);
    Buf<int32_t> tg({N});
    for (int64_t i = 0; i < N; ++i) tg[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % 190);
    tg[7] = -1;
    k::xent_partials(lg.t(), tg.t(), v0, mx.t(), se.t(), tl.t());
    k::xent_backward(lg.t(), tg.t(), v0, mx.t(), se.t(), dl.t(), dlg.t());
    Buf<H> d({N, V});
    k::xent_backward_half(lg.t(), tg.t(), v0, mx.t(), se.t(), dl.t(), d.t());
    for (int64_t i = 0; i < N * V; ++i)
      ASSERT_EQ(d[static_cast<size_t>(i)].bits, to_half<H>(dlg[static_cast<size_t>(i)]).bits)
          << "row " << i / V << " vocab " << i % V << " shard start " << v0;
  }
}

TEST(CrossEntropy, HalfBackwardIsTheRoundedFp32Gradient) {
  xent_half_backward_is_rounded<bf16>();
  xent_half_backward_is_rounded<f16>();
}

// ---------------------------------------------------------------- embedding

TEST(Embedding, LookupShardsAndGradient) {
  const int64_t V = 7, C = 5, T = 3, B = 2;
  Buf<double> w({V, C}), pos({T, C}), out({T * B, C}), proj({T * B, C});
  fill_normal(w.v, 21), fill_normal(pos.v, 22), fill_normal(proj.v, 23);
  Buf<int32_t> tok({T * B});
  tok.v = {1, 6, 6, 0, 3, 1};
  auto f = [&] {
    k::embedding_forward(tok.t(), w.t(), 0, out.t());
    k::position_add_forward(pos.t(), B, out.t());
    return test::dot(out.v, proj.v);
  };
  f();
  EXPECT_EQ(out[3 * C + 2], w[0 * C + 2] + pos[1 * C + 2]);  // row 3: t=1, b=1, token 0
  Buf<double> dw({V, C}), dpos({T, C});
  k::embedding_backward(tok.t(), proj.t(), 0, dw.t());
  k::position_add_backward(proj.t(), B, dpos.t());
  expect_fd_grad(w.v, f, dw.v, "dword");
  expect_fd_grad(pos.v, f, dpos.v, "dpos");
  // A vocabulary shard [4, 7) gives zero rows for tokens it does not own.
  Buf<double> shard({3, C}), o2({T * B, C});
  for (int64_t i = 0; i < 3 * C; ++i) shard[i] = w[4 * C + i];
  k::embedding_forward(tok.t(), shard.t(), 4, o2.t());
  EXPECT_EQ(o2[0], 0.0);
  EXPECT_EQ(o2[1 * C], w[6 * C]);
}

// ---------------------------------------------------------------- dropout, AdamW, norms

TEST(Dropout, SeededReproducibleAndScaled) {
  const int64_t n = 100000;
  Buf<float> x({n}, 1.0f), y({n}), y2({n});
  k::dropout_forward(x.t(), y.t(), 0.25, 42, 3);
  k::dropout_forward(x.t(), y2.t(), 0.25, 42, 3);
  EXPECT_EQ(y.v, y2.v);
  int64_t zeros = std::count(y.v.begin(), y.v.end(), 0.0f);
  EXPECT_NEAR(static_cast<double>(zeros) / n, 0.25, 0.01);
  for (float v : y.v) ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6);
  k::dropout_forward(x.t(), y2.t(), 0.25, 42, 4);  // another stream: another mask
  EXPECT_NE(y.v, y2.v);
  // Backward uses the same mask; an offset picks the same elements of a bigger tensor.
  Buf<float> dy({n}, 2.0f), dx({n});
  k::dropout_backward(dy.t(), dx.t(), 0.25, 42, 3);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx[i] == 0.0f, y[i] == 0.0f);
  Buf<float> part({10}, 1.0f);
  k::dropout_forward(part.t(), part.t(), 0.25, 42, 3, 500);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(part[i], y[500 + i]);
}

// --moe-input-jitter-eps: y = x J, J uniform in [1 - eps, 1 + eps): the
// factors' range, mean (1) and variance (eps^2 / 3), a flat histogram, the
// same noise for the same key (backward) and at an offset, another stream
// another noise.
TEST(Jitter, UniformFactorsKeyedLikeDropout) {
  const int64_t n = 200000;
  const double eps = 0.2;
  Buf<float> x({n}, 2.0f), y({n}), y2({n});
  k::jitter(x.t(), y.t(), eps, 42, 3);
  k::jitter(x.t(), y2.t(), eps, 42, 3);
  EXPECT_EQ(y.v, y2.v);
  double mean = 0, var = 0;
  std::vector<int64_t> bins(10, 0);
  for (float v : y.v) {
    const double j = v / 2.0;
    ASSERT_GE(j, 1 - eps - 1e-7);
    ASSERT_LT(j, 1 + eps + 1e-7);
    mean += j, var += (j - 1) * (j - 1);
    ++bins[static_cast<size_t>(std::min(9.0, std::floor((j - (1 - eps)) / (2 * eps) * 10)))];
  }
  mean /= n, var /= n;
  EXPECT_NEAR(mean, 1.0, 3 * eps / std::sqrt(3.0 * n));  // 3 standard errors
  EXPECT_NEAR(var, eps * eps / 3, 0.02 * eps * eps / 3);
  for (int64_t b : bins) EXPECT_NEAR(static_cast<double>(b) / n, 0.1, 0.005);
  k::jitter(x.t(), y2.t(), eps, 42, 4);  // another stream
  EXPECT_NE(y.v, y2.v);
  Buf<float> part({10}, 2.0f);
  k::jitter(part.t(), part.t(), eps, 42, 3, 500);  // in place, at an offset
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(part[i], y[500 + i]);
  Buf<double> d({4}, 3.0);
  k::jitter(d.t(), d.t(), 0.0, 42, 3);  // eps 0: the identity
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(d[i], 3.0);
}

TEST(AdamW, MatchesClosedFormOverSteps) {
  Buf<double> p({3}), g({3}), m({3}), v({3});
  p.v = {0.5, -1.0, 2.0};
  double rp[3] = {0.5, -1.0, 2.0}, rm[3] = {}, rv[3] = {};
  k::AdamWOptions o;
  o.lr = 0.1, o.weight_decay = 0.1, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8;
  for (int64_t t = 1; t <= 5; ++t) {
    for (int i = 0; i < 3; ++i) g[i] = std::sin(1.0 + t * (i + 1));
    o.step = t;
    k::adamw_step(p.t(), g.t(), m.t(), v.t(), o);
    for (int i = 0; i < 3; ++i) {
      rp[i] -= o.lr * o.weight_decay * rp[i];
      rm[i] = 0.9 * rm[i] + 0.1 * g[i];
      rv[i] = 0.95 * rv[i] + 0.05 * g[i] * g[i];
      double mh = rm[i] / (1 - std::pow(0.9, t)), vh = rv[i] / (1 - std::pow(0.95, t));
      rp[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], rp[i], 1e-12);
}

TEST(GradNorm, GlobalNormAndClipping) {
  Buf<float> a({2}), b({1});
  a.v = {3, 0}, b.v = {4};
  EXPECT_NEAR(k::global_grad_norm({a.t(), b.t()}), 5.0, 1e-12);
  double n = k::clip_grad_norm({a.t(), b.t()}, 1.0);
  EXPECT_NEAR(n, 5.0, 1e-12);
  EXPECT_NEAR(k::global_grad_norm({a.t(), b.t()}), 1.0, 1e-6);
}

TEST(CountZeros, PlusAndMinusZeroButNotNan) {
  Buf<float> a({6});
  a.v = {0.0f, -0.0f, 1e-40f, std::nanf(""), 0.0f, -2.0f};  // a denormal is not zero
  Buf<double> b({3});
  b.v = {0.0, 5.0, -0.0};
  Buf<float> empty({0});
  EXPECT_EQ(k::count_zeros_each({a.t(), b.t(), empty.t()}), (std::vector<int64_t>{3, 2, 0}));
  // Scaled as the clipping coefficient scales: 1e-40f * 1e-6 underflows in fp32, -2 * 1e-6 does not.
  EXPECT_EQ(k::count_zeros_each({a.t()}, 1e-6), (std::vector<int64_t>{4}));
  EXPECT_EQ(k::count_zeros_each({b.t()}, 1e-300), (std::vector<int64_t>{2}));  // fp64: 5e-300 is not 0
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);        // tie -> even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.01171875f)), 1.015625f);   // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

// fp16 (IEEE binary16) against the compiler's _Float16, an independent
// implementation: every one of the 65536 payloads widens to the same float
// (NaNs as NaN), and floats round to the same payload, nearest even: every
// fp32 value whose rounding is in question (each fp16 value and its
// neighbouring midpoints, +-1 fp32 ulp), the subnormal range, overflow to
// inf at 65520, and 2^20 random bit patterns.
TEST(Fp16, MatchesTheCompilersFloat16) {
  for (uint32_t u = 0; u < 65536; ++u) {
    _Float16 h;
    const uint16_t bits = static_cast<uint16_t>(u);
    std::memcpy(&h, &bits, 2);
    const float want = static_cast<float>(h), got = f16_to_float(f16{bits});
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << u;
    else ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "payload " << u << ": " << want << " vs " << got;
  }
  auto check = [](float f) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    const uint16_t got = float_to_f16(f).bits;
    if (std::isnan(f)) ASSERT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x3ff)) << f;
    else ASSERT_EQ(got, want) << "float " << f << " (bits " << std::hex << std::bit_cast<uint32_t>(f) << ")";
  };
  for (uint32_t u = 0; u < 65536; ++u) {
    const float v = f16_to_float(f16{static_cast<uint16_t>(u)});
    if (std::isnan(v) || std::isinf(v)) continue;
    const float next = f16_to_float(f16{static_cast<uint16_t>(u + 1)});
    for (float x : {v, std::nextafter(v, 1e30f), std::nextafter(v, -1e30f)}) check(x);
    if ((u & 0x7fff) < 0x7bff) {  // the midpoint to the next fp16 value and its fp32 neighbours
      const float mid = v + (next - v) / 2;
      for (float x : {mid, std::nextafter(mid, 1e30f), std::nextafter(mid, -1e30f)}) check(x);
    }
  }
  for (float x : {65504.0f, 65519.996f, 65520.0f, 1e30f, -65520.0f, 5.96e-8f, 2.98e-8f, 2.9802322e-08f, 1e-10f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::nanf(""), 0.0f,
                  -0.0f})
    check(x);
  std::mt19937 g(5);
  for (int i = 0; i < (1 << 20); ++i) check(std::bit_cast<float>(static_cast<uint32_t>(g())));
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // ties to even rounds 65520 up to inf
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3c00);
}

TEST(Cast, SameDtypeIsABitCopy) {
  // bf16 -> bf16 once stored the float value in the 16-bit field (1.5 -> 0x0001).
  std::vector<bf16> src{float_to_bf16(1.5f), float_to_bf16(-3.25f), float_to_bf16(1e-20f)}, dst(3);
  kernels::cast(Tensor(src.data(), {3}, DType::kBF16), Tensor(dst.data(), {3}, DType::kBF16));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(dst[i].bits, src[i].bits) << i;
  std::vector<float> f{1.5f, -2.0f}, g(2);
  kernels::cast(Tensor(f.data(), {2}, DType::kF32), Tensor(g.data(), {2}, DType::kF32));
  EXPECT_EQ(g, f);
  // fp16 -> fp16 likewise; bf16 <-> fp16 and fp32 -> fp16 widen exactly and round once.
  std::vector<f16> hs{float_to_f16(1.5f), float_to_f16(-3.25f), float_to_f16(1e-6f)}, hd(3);
  kernels::cast(Tensor(hs.data(), {3}, DType::kF16), Tensor(hd.data(), {3}, DType::kF16));
  for (size_t i = 0; i < hs.size(); ++i) EXPECT_EQ(hd[i].bits, hs[i].bits) << i;
  kernels::cast(Tensor(src.data(), {3}, DType::kBF16), Tensor(hd.data(), {3}, DType::kF16));
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(hd[i].bits, float_to_f16(bf16_to_float(src[i])).bits) << i;
  std::vector<float> w{1.0f + 1.0f / 4096, 70000.0f, 3e-8f};
  kernels::cast(Tensor(w.data(), {3}, DType::kF32), Tensor(hd.data(), {3}, DType::kF16));
  EXPECT_EQ(f16_to_float(hd[0]), 1.0f);  // tie -> even
  EXPECT_TRUE(std::isinf(f16_to_float(hd[1])));
  EXPECT_EQ(f16_to_float(hd[2]), 5.9604644775390625e-8f);  // nearest subnormal
}

// Each test below runs for bf16 and for fp16 (H): --bf16 and --fp16 take the
// same 16-bit paths, the stored type aside.
// Under --bf16 the norms and MLP activations write the GEMM's bf16 input
// directly: each stored value is the fp32 result rounded once (float_to_bf16),
// bit for bit what the fp32 output followed by a cast gives; the statistics
// are the fp32 call's. Other output dtypes are refused, naming the op.
template <typename H>
void half_outputs_norms_and_activations() {
  const int64_t N = 7, C = 40, F = 20;
  std::vector<double> xd(N * C), wd(C), bd(C);
  fill_normal(xd, 91), fill_normal(wd, 92), fill_normal(bd, 93);
  Buf<float> x({N, C}), w({C}), b({C});
  for (int64_t i = 0; i < N * C; ++i) x[i] = static_cast<float>(xd[i]);
  for (int64_t i = 0; i < C; ++i) w[i] = static_cast<float>(wd[i]), b[i] = static_cast<float>(bd[i]);
  auto expect_rounded = [](Buf<float>& y, Buf<H>& yh, const char* what) {
    ASSERT_EQ(y.size(), yh.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(yh[i].bits, to_half<H>(y[i]).bits) << what << " element " << i << " (fp32 " << y[i] << ")";
  };
  for (bool rms : {false, true}) {
    Buf<float> y({N, C}), mean({N}), rstd({N}), mean2({N}), rstd2({N});
    Buf<H> yh({N, C});
    if (rms) {
      k::rmsnorm_forward(x.t(), w.t(), 1e-5, y.t(), rstd.t());
      k::rmsnorm_forward(x.t(), w.t(), 1e-5, yh.t(), rstd2.t());
    } else {
      k::layernorm_forward(x.t(), w.t(), b.t(), 1e-5, y.t(), mean.t(), rstd.t());
      k::layernorm_forward(x.t(), w.t(), b.t(), 1e-5, yh.t(), mean2.t(), rstd2.t());
    }
    expect_rounded(y, yh, rms ? "rmsnorm" : "layernorm");
    EXPECT_EQ(rstd.v, rstd2.v);
    EXPECT_EQ(mean.v, mean2.v);
  }
  for (k::GeluKind kind : {k::GeluKind::kExact, k::GeluKind::kTanh}) {
    Buf<float> y({N, C});
    Buf<H> yh({N, C});
    k::gelu_forward(kind, x.t(), y.t());
    k::gelu_forward(kind, x.t(), yh.t());
    expect_rounded(y, yh, "gelu");
  }
  {
    const Tensor x2(x.v.data(), {N, 2 * F}, DType::kF32);  // [gate | up]
    Buf<float> y({N, F});
    Buf<H> yh({N, F});
    k::swiglu_forward(x2, y.t());
    k::swiglu_forward(x2, yh.t());
    expect_rounded(y, yh, "swiglu");
  }
  Buf<double> xd64({N, C}), wd64({C});
  Buf<H> yh({N, C});
  Buf<double> r64({N});
  EXPECT_DEATH(k::rmsnorm_forward(xd64.t(), wd64.t(), 1e-5, yh.t(), r64.t()),
               fmt::format("rmsnorm_forward: output dtype {} for fp64 input", dtype_name(dtype_of<H>())));
}

// Under --bf16 the GEMM-side activations (qkv, fc1 and their gradients) are
// stored in bf16: each op widens a bf16 input exactly and computes in fp32,
// so its result is bit for bit the fp32 call's on the same values, rounded
// once as stored. Mixed dtypes and wrong table/bias dtypes are refused.
// n normal values (+ shift) rounded to bf16: the bf16 values and their
// exact fp32 widening.
template <typename H>
std::pair<Buf<float>, Buf<H>> rounded(uint64_t seed, int64_t n, double scale, double shift = 0) {
  std::vector<double> d(n);
  fill_normal(d, seed, scale);
  Buf<float> f({n});
  Buf<H> h({n});
  for (int64_t i = 0; i < n; ++i) h[i] = to_half<H>(static_cast<float>(d[i] + shift)), f[i] = from_half(h[i]);
  return std::make_pair(f, h);
}

// Every bf16 element is its fp32 counterpart rounded once.
template <typename H>
void expect_rounded(const Buf<float>& y, const Buf<H>& yh, const std::string& what) {
  ASSERT_EQ(y.v.size(), yh.v.size());
  for (size_t i = 0; i < y.v.size(); ++i)
    ASSERT_EQ(yh.v[i].bits, to_half<H>(y.v[i]).bits) << what << " element " << i << " (fp32 " << y.v[i] << ")";
}
// ... or within `ulps` units in the last 16-bit place of it (same sign).
template <typename H>
void expect_rounded(const Buf<float>& y, const Buf<H>& yh, int ulps, const std::string& what) {
  ASSERT_EQ(y.v.size(), yh.v.size());
  for (size_t i = 0; i < y.v.size(); ++i) {
    const int want = to_half<H>(y.v[i]).bits, got = yh.v[i].bits;
    ASSERT_TRUE((want ^ got) < 0x8000 && std::abs(want - got) <= ulps)
        << what << " element " << i << " (fp32 " << y.v[i] << "): bits " << got << ", want " << want;
  }
}

template <typename H>
void half_storage_pointwise_ops() {
  const int64_t N = 9, C = 24, F = 12;
  auto [x, xh] = rounded<H>(1, N * C, 2.0);
  auto [dy, dyh] = rounded<H>(2, N * C, 1.0);
  for (k::GeluKind kind : {k::GeluKind::kExact, k::GeluKind::kTanh}) {
    Buf<float> y({N * C}), dx({N * C});
    Buf<H> yh({N * C}), dxh({N * C});
    k::gelu_forward(kind, x.t(), y.t());
    k::gelu_forward(kind, xh.t(), yh.t());
    expect_rounded(y, yh, "gelu forward");
    k::gelu_backward(kind, x.t(), dy.t(), dx.t());
    k::gelu_backward(kind, xh.t(), dyh.t(), dxh.t());
    expect_rounded(dx, dxh, "gelu backward");
  }
  {
    auto [x2, x2h] = rounded<H>(3, N * 2 * F, 1.5);
    auto [d2, d2h] = rounded<H>(4, N * F, 1.0);
    const Shape xs{N, 2 * F}, ys{N, F};
    Buf<float> y(ys), dx(xs);
    Buf<H> yh(ys), dxh(xs);
    Tensor X(x2.v.data(), xs, DType::kF32), Xh(x2h.v.data(), xs, dtype_of<H>());
    Tensor D(d2.v.data(), ys, DType::kF32), Dh(d2h.v.data(), ys, dtype_of<H>());
    k::swiglu_forward(X, y.t());
    k::swiglu_forward(Xh, yh.t());
    expect_rounded(y, yh, "swiglu forward");
    Buf<float> yf(ys);
    k::swiglu_forward(Xh, yf.t());  // bf16 in, fp32 out: the fp32 result itself
    EXPECT_EQ(yf.v, y.v);
    k::swiglu_backward(X, D, dx.t());
    k::swiglu_backward(Xh, Dh, dxh.t());
    expect_rounded(dx, dxh, "swiglu backward");
    EXPECT_DEATH(k::swiglu_backward(Xh, D, dxh.t()), "swiglu_backward: x, dy and dx must share one dtype");
  }
  {
    k::QkvLayout L{5, 2, 4, 2, 8};
    Buf<float> cos({L.seq, 4}), sin({L.seq, 4});
    k::rope_table(10000.0, L.seq, L.head_dim, cos.t(), sin.t());
    auto [q, qh] = rounded<H>(5, L.tokens() * L.row(), 1.0);
    const Shape qs{L.tokens(), L.row()};
    for (bool inverse : {false, true}) {
      Buf<float> y = q;
      Buf<H> yh = qh;
      y.shape = yh.shape = qs;
      if (inverse) k::rope_backward(y.t(), L, cos.t(), sin.t()), k::rope_backward(yh.t(), L, cos.t(), sin.t());
      else k::rope_forward(y.t(), L, cos.t(), sin.t()), k::rope_forward(yh.t(), L, cos.t(), sin.t());
      expect_rounded(y, yh, inverse ? "rope backward" : "rope forward");
    }
    Buf<H> ch({L.seq, 4}), sh({L.seq, 4});
    Buf<H> y = qh;
    y.shape = qs;
    EXPECT_DEATH(k::rope_forward(y.t(), L, ch.t(), sh.t()), fmt::format("rope: cos/sin tables must be fp32 for {} qkv", dtype_name(dtype_of<H>())));
  }
  {
    auto [b, bh] = rounded<H>(6, C, 1.0);
    Buf<float> y = x, db({C}, 0.25f), db2({C}, 0.25f);
    Buf<H> yh = xh;
    y.shape = yh.shape = Shape{N, C};
    k::bias_add(y.t(), b.t());
    k::bias_add(yh.t(), b.t());
    expect_rounded(y, yh, "bias_add");
    Tensor D(dy.v.data(), {N, C}, DType::kF32), Dh(dyh.v.data(), {N, C}, dtype_of<H>());
    k::bias_grad(D, db.t());
    k::bias_grad(Dh, db2.t());
    EXPECT_EQ(db.v, db2.v);  // bf16 dy widened exactly, summed in the same order
    EXPECT_DEATH(k::bias_add(yh.t(), bh.t()), fmt::format("bias_add: the bias must be fp32 for {} activations", dtype_name(dtype_of<H>())));
  }
}

// The bf16 residual stream (--bf16 without --fp32-residual-connection): each
// op on bf16 residual tensors widens them exactly, computes exactly as it
// does in fp32, and rounds what it stores once. So every result is
// bit for bit the fp32 op on the widened values, rounded: the fp32 ops are
// the reference (they have their own finite-difference and closed-form tests).
template <typename H>
void half_residual_stream_ops() {
  const int64_t N = 12, C = 40, B = 3;
  auto [x, xh] = rounded<H>(21, N * C, 1.5, 0.4);
  auto [o, oh] = rounded<H>(22, N * C, 1.0);
  Buf<float> w({C}), bias({C});
  fill_normal(w.v, 23, 0.3);
  fill_normal(bias.v, 24, 0.2);
  for (float& v : w.v) v += 1;
  const Shape xs{N, C};
  x.shape = xh.shape = o.shape = oh.shape = xs;

  // add, every mix of fp32 and bf16 operands: the fp32 sum rounded once
  // (an fp32 y is the sum itself).
  for (int mask = 0; mask < 8; ++mask) {
    const bool ab = mask & 1, bb = mask & 2, yb = mask & 4;
    Buf<float> y(xs);
    Buf<H> yh(xs);
    k::add(ab ? xh.t() : x.t(), bb ? oh.t() : o.t(), yb ? yh.t() : y.t());
    Buf<float> want(xs);
    k::add(x.t(), o.t(), want.t());  // x, o hold the widened bf16 values
    if (yb) expect_rounded(want, yh, fmt::format("add mask {}", mask));
    else EXPECT_EQ(y.v, want.v) << "add mask " << mask;
  }
  {
    Buf<H> yh = xh;
    Buf<float> want(xs);
    k::add(x.t(), o.t(), want.t());
    k::add_inplace(yh.t(), o.t());  // bf16 += fp32
    expect_rounded(want, yh, "add_inplace bf16 += fp32");
    Buf<double> d64(xs);
    EXPECT_DEATH(k::add(d64.t(), xh.t(), yh.t()), "add: a must be fp32 or bf16");
  }
  // dropout: the same mask, the kept values scaled in fp32 and rounded.
  {
    Buf<float> y(xs);
    Buf<H> yh(xs);
    k::dropout_forward(x.t(), y.t(), 0.3, 7, 8, 100);
    k::dropout_forward(xh.t(), yh.t(), 0.3, 7, 8, 100);
    expect_rounded(y, yh, "dropout forward");
    k::dropout_backward(x.t(), y.t(), 0.3, 7, 9, 0);
    k::dropout_backward(xh.t(), yh.t(), 0.3, 7, 9, 0);
    expect_rounded(y, yh, "dropout backward");
    EXPECT_DEATH(k::dropout_forward(xh.t(), y.t(), 0.3, 7, 8, 0), "dropout: x and y must share one dtype");
  }
  // Norms: bf16 x gives the fp32 statistics and y of the widened x; the
  // backward's dw, db are the fp32 ones and dx (bf16, accumulated) is
  // bf16(dx + the fp32 term), with dy bf16 or fp32.
  for (bool rms : {false, true}) {
    const std::string nm = rms ? "rmsnorm" : "layernorm";
    Buf<float> y(xs), mean({N}), rstd({N}), mean2({N}), rstd2({N});
    Buf<H> yh(xs);
    if (rms) {
      k::rmsnorm_forward(x.t(), w.t(), 1e-5, y.t(), rstd.t());
      k::rmsnorm_forward(xh.t(), w.t(), 1e-5, yh.t(), rstd2.t());
    } else {
      k::layernorm_forward(x.t(), w.t(), bias.t(), 1e-5, y.t(), mean.t(), rstd.t());
      k::layernorm_forward(xh.t(), w.t(), bias.t(), 1e-5, yh.t(), mean2.t(), rstd2.t());
      EXPECT_EQ(mean.v, mean2.v) << nm;
    }
    EXPECT_EQ(rstd.v, rstd2.v) << nm;
    expect_rounded(y, yh, nm + " forward");
    for (bool dy_bf16 : {true, false}) {
      auto [dx0, dx0h] = rounded<H>(25, N * C, 0.5);
      dx0.shape = dx0h.shape = xs;
      // The fp32 call accumulates into the same dx values; its result rounded
      // once is the 16-bit call's, to one 16-bit ulp: the row sums mean(g)
      // and mean(g xhat) may be added in another order where one
      // instantiation is vectorised and the other not (fp16's finer rounding
      // shows it, rarely).
      Buf<float> term = dx0, dw({C}, 0.5f), db({C}, 0.25f), dw2({C}, 0.5f), db2({C}, 0.25f);
      Buf<H> dxh = dx0h;
      const Tensor dyt = dy_bf16 ? oh.t() : o.t();
      if (rms) {
        k::rmsnorm_backward(o.t(), x.t(), w.t(), rstd.t(), term.t(), dw.t());
        k::rmsnorm_backward(dyt, xh.t(), w.t(), rstd.t(), dxh.t(), dw2.t());
      } else {
        k::layernorm_backward(o.t(), x.t(), w.t(), mean.t(), rstd.t(), term.t(), dw.t(), db.t());
        k::layernorm_backward(dyt, xh.t(), w.t(), mean.t(), rstd.t(), dxh.t(), dw2.t(), db2.t());
        EXPECT_EQ(db.v, db2.v) << nm << " db";
      }
      EXPECT_EQ(dw.v, dw2.v) << nm << " dw";
      expect_rounded(term, dxh, 1, nm + (dy_bf16 ? " backward, bf16 dy" : " backward, fp32 dy"));
    }
    Buf<float> dxf(xs), dwf({C});
    EXPECT_DEATH(k::rmsnorm_backward(oh.t(), xh.t(), w.t(), rstd.t(), dxf.t(), dwf.t()),
                 "rmsnorm_backward: x and dx must share one dtype");
  }
  // Embedding and learned positions into / from a bf16 stream.
  {
    const int64_t V = 7;
    Buf<float> table({V, C}), pos({N / B, C});
    fill_normal(table.v, 26);
    fill_normal(pos.v, 27);
    std::vector<int32_t> tok(N);
    for (int64_t i = 0; i < N; ++i) tok[i] = static_cast<int32_t>((i * 5) % (V + 2)) - 1 + 1;  // some outside [1, 1 + V)
    const Tensor tt(tok.data(), {N}, DType::kI32);
    Buf<float> e(xs);
    Buf<H> eh(xs);
    k::embedding_forward(tt, table.t(), 1, e.t());
    k::embedding_forward(tt, table.t(), 1, eh.t());
    expect_rounded(e, eh, "embedding forward");
    Buf<float> ew(xs);  // the widened bf16 embedding, plus the positions
    for (int64_t i = 0; i < N * C; ++i) ew[i] = from_half(eh[i]);
    k::position_add_forward(pos.t(), B, ew.t());
    k::position_add_forward(pos.t(), B, eh.t());
    expect_rounded(ew, eh, "position add forward");
    Buf<float> dt1({V, C}, 0.5f), dt2({V, C}, 0.5f), dp1({N / B, C}, 0.5f), dp2({N / B, C}, 0.5f);
    k::embedding_backward(tt, o.t(), 1, dt1.t());
    k::embedding_backward(tt, oh.t(), 1, dt2.t());
    EXPECT_EQ(dt1.v, dt2.v);
    k::position_add_backward(o.t(), B, dp1.t());
    k::position_add_backward(oh.t(), B, dp2.t());
    EXPECT_EQ(dp1.v, dp2.v);
    Buf<double> t64({V, C});
    EXPECT_DEATH(k::embedding_backward(tt, oh.t(), 1, t64.t()), fmt::format("embedding_backward: dout dtype {} with fp64", dtype_name(dtype_of<H>())));
  }
}

// bf16 GEMM inputs with a bf16 C (the qkv and fc1 outputs under --bf16): the
// fp32-accumulated product rounded once, so within one bf16 rounding of the
// fp32-C result, for every transpose pair; beta 1 adds the old bf16 C.
template <typename H>
void half_storage_gemm_output() {
  const int64_t M = 33, N = 40, K = 70;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        std::vector<double> A(M * K), B(K * N), C0(M * N);
        fill_normal(A, 7 + ta), fill_normal(B, 8 + tb), fill_normal(C0, 9);
        Buf<H> ah({M * K}), bh({K * N}), ch({M * N});
        Buf<float> c({M * N});
        for (int64_t i = 0; i < M * K; ++i) ah[i] = to_half<H>(static_cast<float>(A[i]));
        for (int64_t i = 0; i < K * N; ++i) bh[i] = to_half<H>(static_cast<float>(B[i]));
        for (int64_t i = 0; i < M * N; ++i) ch[i] = to_half<H>(static_cast<float>(C0[i])), c[i] = from_half(ch[i]);
        k::gemm(ta, tb, M, N, K, 1.0f, ah.t(), bh.t(), beta, c.t());
        k::gemm(ta, tb, M, N, K, 1.0f, ah.t(), bh.t(), beta, ch.t());
        for (int64_t i = 0; i < M * N; ++i) {
          const float want = c[i], got = from_half(ch[i]);
          // One rounding of the fp32 value: within half an ulp (2^-8 relative for
          // bf16, 2^-11 for fp16) of it.
          const double half_ulp = std::is_same_v<H, bf16> ? 1.0 / 256 : 1.0 / 2048;
          ASSERT_LE(std::abs(got - want), std::abs(want) * half_ulp + 1e-30)
              << "ta=" << ta << " tb=" << tb << " beta=" << beta << " element " << i;
        }
      }
  Buf<H> a({4}), b({4});
  Buf<double> c64({4});
  EXPECT_DEATH(k::gemm(false, false, 2, 2, 2, 1.0f, a.t(), b.t(), 0.0f, c64.t()),
               fmt::format("gemm: {0} A needs {0} B and an fp32 or {0} C", dtype_name(dtype_of<H>())));
}

TEST(HalfOutputs, NormsAndActivationsStoreTheRoundedFp32Result) {
  half_outputs_norms_and_activations<bf16>();
  half_outputs_norms_and_activations<f16>();
}
TEST(HalfStorage, PointwiseOpsOnHalfAreTheRoundedFp32Result) {
  half_storage_pointwise_ops<bf16>();
  half_storage_pointwise_ops<f16>();
}
TEST(HalfResidual, OpsOnTheHalfStreamAreTheRoundedFp32Ops) {
  half_residual_stream_ops<bf16>();
  half_residual_stream_ops<f16>();
}
TEST(HalfStorage, GemmHalfOutputIsTheRoundedFp32Product) {
  half_storage_gemm_output<bf16>();
  half_storage_gemm_output<f16>();
}

}  // namespace
}  // namespace mt
