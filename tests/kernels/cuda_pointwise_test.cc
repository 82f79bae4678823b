// The CUDA twins of the pointwise and row-reduction kernels (norm,
// activation, rope, embedding, elementwise, adamw, cross_entropy) against
// their CPU twins on the same inputs: fp32 and fp64, odd sizes (rows and
// widths that are not multiples of a block), accumulate-vs-write semantics
// (outputs that accumulate start non-zero), the aliasing the headers allow,
// the tensor-parallel offsets (vocab_start, index_offset), and empty inputs.
// Where the CUDA twin promises the CPU's bits (rope tables, embedding and
// position gradients, bias_grad, casts, dropout, AdamW) the test demands
// bitwise equality; reductions in a different order get tolerances; every
// deterministic reduction is also run twice and must repeat its bits.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/op_profile.h"
#include "core/sim_device.h"
#include "cuda_test_util.h"
#include "kernels/activation.h"
#include "kernels/optimizer_step.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/mla.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace mt::test {
namespace {

namespace k = kernels;
using kernels::GeluKind;

constexpr size_t kArenaBytes = size_t{64} << 20;

template <typename T>
std::vector<T> randn(int64_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::vector<T> v(static_cast<size_t>(n));
  fill_normal(v, seed, scale);
  for (T& x : v) x += static_cast<T>(shift);
  return v;
}

template <typename T>
Tensor view(std::vector<T>& v, Shape s) {
  return Tensor(v.data(), s, dtype_of<T>());
}

template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else return static_cast<double>(v);
}

// Every element has the same bits (the CUDA twin promises the CPU's result exactly).
template <typename T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << as_double(got[i]) << ", expected "
                    << as_double(want[i]) << " bit for bit";
      return;
    }
}

// bf16 vectors compared as floats.
std::vector<float> widen(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

// Tolerances for results whose reduction order differs from the CPU's.
template <typename T>
struct Tol {
  static constexpr double tight = std::is_same_v<T, float> ? 2e-6 : 1e-13;  // pointwise, libm ulps
  static constexpr double sum = std::is_same_v<T, float> ? 2e-5 : 1e-12;    // short reductions
  static constexpr double wide = std::is_same_v<T, float> ? 2e-4 : 1e-11;   // cancellation, long sums
};

const char* tname(DType t) { return dtype_name(t); }

// randn rounded to bf16.
std::vector<bf16> bf16_randn(int64_t n, uint64_t seed, double scale) {
  std::vector<float> f = randn<float>(n, seed, scale);
  std::vector<bf16> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = float_to_bf16(f[i]);
  return h;
}

// ---------------------------------------------------------------- norms

// Tensors a case places one element past 16-byte alignment (rows that cannot
// take packs), as a mask: one at a time, so that the packed kernels must
// check each.
enum Offset : int { kOffX = 1, kOffY = 2, kOffDy = 4, kOffDx = 8 };
template <typename T>
void layernorm_case(int64_t N, int64_t C, bool with_bias, bool rms, int off = 0) {
  const DType dt = dtype_of<T>();
  const std::string what = fmt::format("{} {} N={} C={}{}{}", rms ? "rmsnorm" : "layernorm", tname(dt), N, C,
                                       with_bias ? " bias" : "", off ? fmt::format(" offsets {}", off) : "");
  const auto at = [off](int which) { return int64_t{(off & which) ? 1 : 0}; };
  auto x = randn<T>(N * C, 11 + N, 1.0, 0.3), w = randn<T>(C, 12, 0.5, 1.0), b = randn<T>(C, 13, 0.2);
  std::vector<T> y(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  Arena g = gpu_arena(std::max(kArenaBytes, static_cast<size_t>(8 * N * C) * sizeof(T)));
  Tensor X = view(x, {N, C}), W = view(w, {C}), B = with_bias ? view(b, {C}) : Tensor();
  Tensor gX = to_device_at(g, X, at(kOffX)), gW = to_device(g, W), gB = with_bias ? to_device(g, B) : Tensor();
  Tensor gY = g.alloc({N * C + at(kOffY)}, dt).slice(at(kOffY), at(kOffY) + N * C).view({N, C}), gMean = g.alloc({N}, dt),
         gRstd = g.alloc({N}, dt);
  const double eps = 1e-5;
  if (rms) {
    k::rmsnorm_forward(X, W, eps, view(y, {N, C}), view(rstd, {N}));
    k::rmsnorm_forward(gX, gW, eps, gY, gRstd);
  } else {
    k::layernorm_forward(X, W, B, eps, view(y, {N, C}), view(mean, {N}), view(rstd, {N}));
    k::layernorm_forward(gX, gW, gB, eps, gY, gMean, gRstd);
    expect_close(to_host<T>(gMean), mean, Tol<T>::tight, Tol<T>::tight, what + " mean");
  }
  expect_close(to_host<T>(gRstd), rstd, Tol<T>::tight, 0, what + " rstd");
  expect_close(to_host<T>(gY), y, Tol<T>::sum, Tol<T>::sum, what + " y");

  // Backward ACCUMULATES into dx, dw, db: start them non-zero. Both twins get
  // the CPU's mean/rstd, so only the kernels differ.
  auto dy = randn<T>(N * C, 14 + C), dx = randn<T>(N * C, 15), dw = randn<T>(C, 16), db = randn<T>(C, 17);
  Tensor gDy = to_device_at(g, view(dy, {N, C}), at(kOffDy)), gMean2 = to_device(g, view(mean, {N})),
         gRstd2 = to_device(g, view(rstd, {N}));
  auto run_gpu = [&](std::vector<T>& odx, std::vector<T>& odw, std::vector<T>& odb) {
    Tensor gDx = to_device_at(g, view(dx, {N, C}), at(kOffDx)), gDw = to_device(g, view(dw, {C})),
           gDb = with_bias ? to_device(g, view(db, {C})) : Tensor();
    if (rms) k::rmsnorm_backward(gDy, gX, gW, gRstd2, gDx, gDw);
    else k::layernorm_backward(gDy, gX, gW, gMean2, gRstd2, gDx, gDw, gDb);
    odx = to_host<T>(gDx);
    odw = to_host<T>(gDw);
    if (with_bias) odb = to_host<T>(gDb);
  };
  std::vector<T> gdx, gdw, gdb, gdx2, gdw2, gdb2;
  run_gpu(gdx, gdw, gdb);
  run_gpu(gdx2, gdw2, gdb2);
  if (rms) k::rmsnorm_backward(view(dy, {N, C}), X, W, view(rstd, {N}), view(dx, {N, C}), view(dw, {C}));
  else
    k::layernorm_backward(view(dy, {N, C}), X, W, view(mean, {N}), view(rstd, {N}), view(dx, {N, C}), view(dw, {C}),
                          with_bias ? view(db, {C}) : Tensor());
  expect_close(gdx, dx, Tol<T>::wide, Tol<T>::sum, what + " dx");
  // dw and db add N rows per column in a different order on each side (the
  // GPU in row chunks): their rounding grows with N, and cancellation leaves
  // small sums, so the absolute bound scales with the row count.
  const double col_atol = Tol<T>::sum * std::max(1.0, static_cast<double>(N) / 256.0);
  expect_close(gdw, dw, Tol<T>::sum, col_atol, what + " dw");
  if (with_bias) expect_close(gdb, db, Tol<T>::sum, col_atol, what + " db");
  expect_bitwise(gdx2, gdx, what + " dx, second run");
  expect_bitwise(gdw2, gdw, what + " dw, second run");
  if (with_bias) expect_bitwise(gdb2, gdb, what + " db, second run");
}

// RMSNorm (b and mean unused) or LayerNorm forward, eps 1e-5.
void norm_forward(bool rms, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                  const Tensor& rstd) {
  if (rms) k::rmsnorm_forward(x, w, 1e-5, y, rstd);
  else k::layernorm_forward(x, w, b, 1e-5, y, mean, rstd);
}

// kernels::cuda::set_norm_packed where the CUDA backend is compiled (the
// no-CUDA compile check builds these tests without it).
void set_norm_packed(bool on) {
#ifdef MT_HAVE_CUDA
  k::cuda::set_norm_packed(on);
#else
  (void)on;
#endif
}

// The norms' shapes (norm.cu). With fp32 parameters, C a multiple of 8
// from 1024 to 4096 and aligned rows: the packed kernels (set_norm_packed,
// the default). C = 1024 and 2048 are one pack a thread, 2056 and 4096 two
// (2056's second only in thread 0). Forward blocks hold 4 rows; backward
// blocks N / 256 rows rounded up in groups of 4 (2 with two packs a
// thread): 37 rows are 37 one-row chunks, 300 are 150 of 2, 1203 are 241 of
// 5 (a one-row group closes each, and the last chunk holds 3), 520 with two
// packs 174 of 3 (a one-row group closes each). Otherwise (narrower or
// unaligned rows, and always fp64): the column-a-thread kernels. Their
// backward blocks hold 16 rows: 1100 rows are 69 chunks, the last one
// short; columns per thread 1, 2, 4, 8 and 16 for C = 70, 300, 1000, 2048
// and 4096, the last one partly past the row at 1000 (and 128: a
// --qk-layernorm head). 4500 wide: the three-kernel path (600 rows: 2
// chunks of its column sums). The packed kernels' shapes run again with
// them off; then x, y, dy and dx offset in turn (rows that cannot take
// packs), and all four together.
template <typename F>
void for_norm_cases(F&& run) {
  const std::pair<int64_t, int64_t> packable[] = {{300, 1024}, {33, 2048}, {17, 4096},
                                                  {37, 1024},  {1203, 1024}, {520, 2056}};
  const std::pair<int64_t, int64_t> others[] = {{37, 129}, {1100, 70}, {1, 3},     {0, 64},    {20, 300},
                                                {45, 4500}, {600, 4500}, {300, 1000}, {64, 128}};
  for (auto [N, C] : packable) run(N, C, 0);
  for (auto [N, C] : others) run(N, C, 0);
  set_norm_packed(false);
  for (auto [N, C] : packable) run(N, C, 0);
  set_norm_packed(true);
  for (int off : {kOffX, kOffY, kOffDy, kOffDx}) run(37, 1024, off);
  run(20, 2048, kOffX | kOffY | kOffDy | kOffDx);
}

TEST(CudaTwin, LayerNormForwardBackwardMatchCpu) {
  MT_REQUIRE_GPU();
  for_norm_cases([](int64_t N, int64_t C, int off) {
    layernorm_case<float>(N, C, true, false, off);
    layernorm_case<float>(N, C, false, false, off);
    layernorm_case<double>(N, C, true, false, off);
    layernorm_case<double>(N, C, false, false, off);
  });
}

TEST(CudaTwin, RmsNormForwardBackwardMatchCpu) {
  MT_REQUIRE_GPU();
  for_norm_cases([](int64_t N, int64_t C, int off) {
    layernorm_case<float>(N, C, false, true, off);
    layernorm_case<double>(N, C, false, true, off);
  });
}

// In place, as the CUDA twins allow: the forward's y over x and the
// backward's dx over dy (the packed kernels at 1024 wide, the column
// kernels at 70), against the CPU twin on separate buffers.
TEST(CudaTwin, NormsInPlaceMatchCpu) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  const int64_t N = 45;
  for (const int64_t C : {int64_t{1024}, int64_t{70}})
    for (bool rms : {false, true}) {
      const std::string what = fmt::format("{} C={} in place", rms ? "rmsnorm" : "layernorm", C);
      auto x = randn<float>(N * C, 120 + C, 1.0, 0.3), w = randn<float>(C, 121, 0.5, 1.0), b = randn<float>(C, 122, 0.2);
      std::vector<float> y(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      const Tensor X = view(x, {N, C}), W = view(w, {C}), B = rms ? Tensor() : view(b, {C});
      const Tensor gXY = to_device(g, X), gW = to_device(g, W), gB = rms ? Tensor() : to_device(g, B),
                   gMean = g.alloc({N}, DType::kF32), gRstd = g.alloc({N}, DType::kF32);
      norm_forward(rms, X, W, B, view(y, {N, C}), view(mean, {N}), view(rstd, {N}));
      norm_forward(rms, gXY, gW, gB, gXY, gMean, gRstd);
      expect_close(to_host<float>(gXY), y, Tol<float>::sum, Tol<float>::sum, what + " y");
      // dx starts as dy (one buffer on the GPU, a copy on the CPU).
      auto dy = randn<float>(N * C, 123), dw = randn<float>(C, 124), db = randn<float>(C, 125);
      std::vector<float> dx = dy;
      const Tensor gX = to_device(g, X), gD = to_device(g, view(dy, {N, C})), gDw = to_device(g, view(dw, {C})),
                   gDb = rms ? Tensor() : to_device(g, view(db, {C})), gMean2 = to_device(g, view(mean, {N})),
                   gRstd2 = to_device(g, view(rstd, {N}));
      if (rms) {
        k::rmsnorm_backward(gD, gX, gW, gRstd2, gD, gDw);
        k::rmsnorm_backward(view(dy, {N, C}), X, W, view(rstd, {N}), view(dx, {N, C}), view(dw, {C}));
      } else {
        k::layernorm_backward(gD, gX, gW, gMean2, gRstd2, gD, gDw, gDb);
        k::layernorm_backward(view(dy, {N, C}), X, W, view(mean, {N}), view(rstd, {N}), view(dx, {N, C}),
                              view(dw, {C}), view(db, {C}));
        expect_close(to_host<float>(gDb), db, Tol<float>::sum, Tol<float>::sum, what + " db");
      }
      expect_close(to_host<float>(gD), dx, Tol<float>::wide, Tol<float>::sum, what + " dx");
      expect_close(to_host<float>(gDw), dw, Tol<float>::sum, Tol<float>::sum, what + " dw");
    }
}

// set_norm_packed switches kernels: the same backward with the packed
// kernels and without gives dw within rounding of each other but not bit for
// bit (5-row against 16-row column partials: another summation order), so
// the default runs above took the packed kernels.
TEST(CudaTwin, NormPackedSwitchChangesTheKernel) {
  MT_REQUIRE_GPU();
  const int64_t N = 1203, C = 1024;
  auto x = randn<float>(N * C, 130, 1.0, 0.3), w = randn<float>(C, 131, 0.5, 1.0), dy = randn<float>(N * C, 132);
  auto dx = randn<float>(N * C, 133);
  std::vector<float> y(static_cast<size_t>(N * C)), rstd(static_cast<size_t>(N)), zeros(static_cast<size_t>(C));
  k::rmsnorm_forward(view(x, {N, C}), view(w, {C}), 1e-5, view(y, {N, C}), view(rstd, {N}));
  Arena g = gpu_arena(std::max(kArenaBytes, static_cast<size_t>(4 * N * C) * sizeof(float)));
  const Tensor gX = to_device(g, view(x, {N, C})), gW = to_device(g, view(w, {C})),
               gDy = to_device(g, view(dy, {N, C})), gRstd = to_device(g, view(rstd, {N}));
  std::vector<float> dw[2];
  for (int packed = 0; packed < 2; ++packed) {
    set_norm_packed(packed == 1);
    const Tensor gDx = to_device(g, view(dx, {N, C})), gDw = to_device(g, view(zeros, {C}));
    k::rmsnorm_backward(gDy, gX, gW, gRstd, gDx, gDw);
    dw[packed] = to_host<float>(gDw);
  }
  set_norm_packed(true);
  size_t differ = 0;
  for (int64_t c = 0; c < C; ++c) differ += dw[0][static_cast<size_t>(c)] != dw[1][static_cast<size_t>(c)];
  EXPECT_GT(differ, 0u) << "the packed and column kernels' dw are bit for bit the same: was a packed kernel run?";
  expect_close(dw[1], dw[0], Tol<float>::sum, Tol<float>::sum * static_cast<double>(N) / 256.0, "dw packed vs column");
}

// bf16 outputs (the GEMM inputs under --bf16): the GPU's value rounded once,
// so within one bf16 rounding of the CPU twin's bf16 (their fp32 values
// differ by fp32 rounding at most; the stored bits may then differ by 1 ulp).
void expect_bf16_close(const std::vector<bf16>& got, const std::vector<bf16>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    ASSERT_LE(std::abs(g - w), 1e-6 + std::abs(w) * (1.0 / 128)) << what << " element " << i;
  }
}

TEST(CudaTwin, NormAndActivationBf16OutputsMatchCpu) {
  MT_REQUIRE_GPU();
  const int64_t N = 37, C = 129, F = 64;
  auto x = randn<float>(N * C, 81, 1.0, 0.2);
  Arena g = gpu_arena(kArenaBytes);
  const Tensor X = view(x, {N, C}), gX = to_device(g, X);
  // Norms of fp32 rows into bf16 y: the column kernels (129 wide), the
  // packed ones (1024 wide), and the column ones again for a y one element
  // off 16-byte alignment (x aligned).
  for (const auto& [Cn, yoff] : {std::pair<int64_t, int64_t>{C, 0}, {1024, 0}, {1024, 1}}) {
    auto xn = randn<float>(N * Cn, 85 + Cn, 1.0, 0.2), wn = randn<float>(Cn, 86, 0.5, 1.0), bn = randn<float>(Cn, 87, 0.2);
    const Tensor Xn = view(xn, {N, Cn}), Wn = view(wn, {Cn}), Bn = view(bn, {Cn});
    const Tensor gXn = to_device(g, Xn), gWn = to_device(g, Wn), gBn = to_device(g, Bn);
    for (bool rms : {false, true}) {
      std::vector<bf16> y(static_cast<size_t>(N * Cn));
      std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      Tensor gY = g.alloc({N * Cn + yoff}, DType::kBF16).slice(yoff, yoff + N * Cn).view({N, Cn}),
             gMean = g.alloc({N}, DType::kF32), gRstd = g.alloc({N}, DType::kF32);
      norm_forward(rms, Xn, Wn, Bn, view(y, {N, Cn}), view(mean, {N}), view(rstd, {N}));
      norm_forward(rms, gXn, gWn, gBn, gY, gMean, gRstd);
      expect_bf16_close(to_host<bf16>(gY), y,
                        fmt::format("{} bf16 y C={}{}", rms ? "rmsnorm" : "layernorm", Cn, yoff ? ", offset y" : ""));
    }
  }
  for (k::GeluKind kind : {k::GeluKind::kExact, k::GeluKind::kTanh, k::GeluKind::kSquaredRelu}) {
    std::vector<bf16> y(static_cast<size_t>(N * C));
    Tensor gY = g.alloc({N, C}, DType::kBF16);
    k::gelu_forward(kind, X, view(y, {N, C}));
    k::gelu_forward(kind, gX, gY);
    expect_bf16_close(to_host<bf16>(gY), y, "gelu bf16 y");
  }
  auto x2 = randn<float>(N * 2 * F, 84);
  std::vector<bf16> y(static_cast<size_t>(N * F));
  Tensor gX2 = to_device(g, view(x2, {N, 2 * F})), gY = g.alloc({N, F}, DType::kBF16);
  k::swiglu_forward(view(x2, {N, 2 * F}), view(y, {N, F}));
  k::swiglu_forward(gX2, gY);
  expect_bf16_close(to_host<bf16>(gY), y, "swiglu bf16 y");
}

// ---------------------------------------------------------------- activations

template <typename T>
void gelu_case(GeluKind kind, int64_t n) {
  const std::string what = fmt::format("gelu {} {} n={}",
                                       kind == GeluKind::kExact ? "exact" : kind == GeluKind::kTanh ? "tanh" : "squared-relu",
                                       tname(dtype_of<T>()), n);
  auto x = randn<T>(n, 21 + n, 2.0), dy = randn<T>(n, 22);
  std::vector<T> y(x.size()), dx(x.size());
  Arena g = gpu_arena(kArenaBytes);
  Tensor gX = to_device(g, view(x, {n})), gDy = to_device(g, view(dy, {n}));
  Tensor gY = g.alloc({n}, dtype_of<T>()), gDx = g.alloc({n}, dtype_of<T>());
  k::gelu_forward(kind, view(x, {n}), view(y, {n}));
  k::gelu_forward(kind, gX, gY);
  expect_close(to_host<T>(gY), y, Tol<T>::tight, Tol<T>::tight, what + " y");
  k::gelu_backward(kind, view(x, {n}), view(dy, {n}), view(dx, {n}));
  k::gelu_backward(kind, gX, gDy, gDx);
  expect_close(to_host<T>(gDx), dx, Tol<T>::tight, Tol<T>::tight, what + " dx");
}

TEST(CudaTwin, GeluExactAndTanhMatchCpu) {
  MT_REQUIRE_GPU();
  for (int64_t n : {10007, 1, 0})
    for (GeluKind kind : {GeluKind::kExact, GeluKind::kTanh, GeluKind::kSquaredRelu}) {
      gelu_case<float>(kind, n);
      gelu_case<double>(kind, n);
    }
}

template <typename T>
void swiglu_case(int64_t N, int64_t F) {
  const std::string what = fmt::format("swiglu {} N={} F={}", tname(dtype_of<T>()), N, F);
  auto x = randn<T>(N * 2 * F, 31 + N, 2.0), dy = randn<T>(N * F, 32);
  std::vector<T> y(static_cast<size_t>(N * F)), dx(x.size());
  Arena g = gpu_arena(kArenaBytes);
  Tensor X = view(x, {N, 2 * F}), Dy = view(dy, {N, F});
  Tensor gX = to_device(g, X), gDy = to_device(g, Dy);
  Tensor gY = g.alloc({N, F}, dtype_of<T>()), gDx = g.alloc({N, 2 * F}, dtype_of<T>());
  k::swiglu_forward(X, view(y, {N, F}));
  k::swiglu_forward(gX, gY);
  expect_close(to_host<T>(gY), y, Tol<T>::tight, Tol<T>::tight, what + " y");
  k::swiglu_backward(X, Dy, view(dx, {N, 2 * F}));
  k::swiglu_backward(gX, gDy, gDx);
  expect_close(to_host<T>(gDx), dx, Tol<T>::tight, Tol<T>::tight, what + " dx");
  // Backward writes (does not accumulate) and may write over x.
  k::swiglu_backward(gX, gDy, gX);
  expect_close(to_host<T>(gX), dx, Tol<T>::tight, Tol<T>::tight, what + " dx written over x");
  // The same rows one element past a 16-byte boundary: the element-wise launch.
  if (N > 0) {
    const int64_t n2 = N * 2 * F;
    Tensor gX1 = g.alloc({n2 + 1}, dtype_of<T>()), gY1 = g.alloc({N * F + 1}, dtype_of<T>());
    Tensor gXo = gX1.slice(1, n2 + 1).view({N, 2 * F}), gYo = gY1.slice(1, N * F + 1).view({N, F});
    copy_tensor(X, gXo);
    k::swiglu_forward(gXo, gYo);
    expect_close(to_host<T>(gYo), y, Tol<T>::tight, Tol<T>::tight, what + " y (unaligned)");
    Tensor gDy1 = g.alloc({N * F + 1}, dtype_of<T>()), gDx1 = g.alloc({n2 + 1}, dtype_of<T>());
    Tensor gDyo = gDy1.slice(1, N * F + 1).view({N, F}), gDxo = gDx1.slice(1, n2 + 1).view({N, 2 * F});
    copy_tensor(Dy, gDyo);
    k::swiglu_backward(gXo, gDyo, gDxo);
    expect_close(to_host<T>(gDxo), dx, Tol<T>::tight, Tol<T>::tight, what + " dx (unaligned)");
  }
}

TEST(CudaTwin, SwiGluMatchesCpu) {
  MT_REQUIRE_GPU();
  // F = 129: element by element; 1000 and 64: 16-byte Packs (4 fp32, 2 fp64).
  for (auto [N, F] : {std::pair<int64_t, int64_t>{37, 129}, {3, 1000}, {5, 64}, {0, 8}}) {
    swiglu_case<float>(N, F);
    swiglu_case<double>(N, F);
  }
}

// ---------------------------------------------------------------- rope

// spec.rot_dim 0: the whole head rotates.
template <typename T>
void rope_case(const k::QkvLayout& L, int64_t table_seq, k::RopeSpec spec = {}, bool interleaved = false) {
  const DType dt = dtype_of<T>();
  if (spec.rot_dim == 0) spec.rot_dim = L.head_dim;
  const std::string what = fmt::format("rope {} s={} b={} a={} g={} d={} r={} scaled={} yarn={} interleaved={}", tname(dt),
                                       L.seq, L.batch, L.heads, L.groups, L.head_dim, spec.rot_dim, spec.llama3_scaling,
                                       spec.yarn, interleaved);
  const int64_t half = spec.rot_dim / 2, r = spec.rot_dim;
  std::vector<T> cs(static_cast<size_t>(table_seq * half)), sn(cs.size());
  Arena g = gpu_arena(kArenaBytes);
  Tensor gCos = g.alloc({table_seq, half}, dt), gSin = g.alloc({table_seq, half}, dt);
  k::rope_table(spec, table_seq, view(cs, {table_seq, half}), view(sn, {table_seq, half}));
  k::rope_table(spec, table_seq, gCos, gSin);
  expect_bitwise(to_host<T>(gCos), cs, what + " cos table");
  expect_bitwise(to_host<T>(gSin), sn, what + " sin table");

  auto qkv = randn<T>(L.tokens() * L.row(), 41 + L.seq);
  const std::vector<T> orig = qkv;
  Tensor Q = view(qkv, {L.tokens(), L.row()});
  Tensor gQ = to_device(g, Q);
  k::rope_forward(Q, L, view(cs, {table_seq, half}), view(sn, {table_seq, half}), r, interleaved);
  k::rope_forward(gQ, L, gCos, gSin, r, interleaved);
  expect_close(to_host<T>(gQ), qkv, Tol<T>::tight, Tol<T>::tight, what + " forward");
  k::rope_backward(Q, L, view(cs, {table_seq, half}), view(sn, {table_seq, half}), r, interleaved);
  k::rope_backward(gQ, L, gCos, gSin, r, interleaved);
  std::vector<T> back = to_host<T>(gQ);
  expect_close(back, qkv, Tol<T>::tight, Tol<T>::tight, what + " inverse");
  // Backward is the transpose: with YaRN's cos/sin factor m it leaves the
  // rotated dims times m^2.
  std::vector<T> want = orig;
  if (spec.mscale != 1)
    for (int64_t row = 0; row < L.tokens(); ++row)
      for (int64_t h = 0; h < L.heads + L.groups; ++h)
        for (int64_t c = 0; c < r; ++c) {
          T& x = want[static_cast<size_t>(row * L.row() + (h < L.heads ? L.q_col(h) : L.k_col(h - L.heads)) + c)];
          x = static_cast<T>(static_cast<double>(x) * spec.mscale * spec.mscale);
        }
  expect_close(back, want, 10 * Tol<T>::tight, 10 * Tol<T>::tight, what + " inverse undoes forward");
}

TEST(CudaTwin, RopeTableAndApplyMatchCpu) {
  MT_REQUIRE_GPU();
  k::QkvLayout gqa{.seq = 7, .batch = 3, .heads = 6, .groups = 2, .head_dim = 16};
  k::QkvLayout mha{.seq = 37, .batch = 1, .heads = 4, .groups = 4, .head_dim = 64};
  k::QkvLayout mqa{.seq = 5, .batch = 2, .heads = 3, .groups = 1, .head_dim = 2};
  for (const k::QkvLayout& L : {gqa, mha, mqa}) {
    rope_case<float>(L, L.seq);
    rope_case<double>(L, L.seq);
  }
  rope_case<float>(gqa, 4096);  // a table longer than the sequence, large angles
  rope_case<double>(gqa, 4096);
  // --rotary-percent: Packs (r = 8 of 16) and element by element (r = 6);
  // Llama 3.1 scaling with position interpolation.
  rope_case<float>(gqa, gqa.seq, {10000.0, 8});
  rope_case<float>(gqa, gqa.seq, {10000.0, 6});
  rope_case<double>(gqa, gqa.seq, {10000.0, 6});
  rope_case<float>(mha, 4096, {500000.0, 64, true, 8.0, 2.0});
  rope_case<float>(mha, mha.seq, {500000.0, 32, true, 32.0, 1.0});
  // --rotary-interleaved, whole and partial.
  rope_case<float>(gqa, gqa.seq, {}, true);
  rope_case<double>(mha, mha.seq, {10000.0, 40}, true);
  // MLA's YaRN table (factor 40, its ramp across the 8 frequencies) with the
  // cos/sin factor, on the leading 8 dims of each head, pairs adjacent.
  k::RopeSpec yarn{10000.0, 8};
  yarn.yarn = true, yarn.yarn_factor = 40, yarn.mscale = 1.3;
  rope_case<float>(gqa, 4096, yarn, true);
  rope_case<double>(gqa, gqa.seq, yarn, true);
}

// --qk-layernorm's head rows: the same copies as the CPU twin, bit for bit,
// each storage dtype; scatter leaves v alone.
template <typename T>
void qk_heads_case(const k::QkvLayout& L) {
  const std::string what = fmt::format("qk_heads {} s={} b={} a={} g={} d={}", tname(dtype_of<T>()), L.seq, L.batch,
                                       L.heads, L.groups, L.head_dim);
  std::vector<T> qkv(static_cast<size_t>(L.tokens() * L.row())), heads(static_cast<size_t>(L.tokens() * (L.heads + L.groups) * L.head_dim));
  auto make = [](float f) {
    if constexpr (std::is_same_v<T, bf16>) return float_to_bf16(f);
    else return static_cast<T>(f);
  };
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = make(static_cast<float>(i % 251) - 125.f);
  for (size_t i = 0; i < heads.size(); ++i) heads[i] = make(0.5f * static_cast<float>(i % 97));
  Arena g = gpu_arena(kArenaBytes);
  Tensor Q = view(qkv, {L.tokens(), L.row()}), H = view(heads, {static_cast<int64_t>(heads.size())});
  Tensor gQ = to_device(g, Q), gH = g.alloc(H.shape(), H.dtype());
  k::qk_heads_gather(gQ, L, gH);
  std::vector<T> want(heads.size());
  k::qk_heads_gather(Q, L, view(want, H.shape()));
  expect_bitwise(to_host<T>(gH), want, what + " gather");
  gH = to_device(g, H);
  k::qk_heads_scatter(gH, L, gQ);
  k::qk_heads_scatter(H, L, Q);
  expect_bitwise(to_host<T>(gQ), qkv, what + " scatter");
}

TEST(CudaTwin, QkHeadsGatherScatterMatchCpu) {
  MT_REQUIRE_GPU();
  k::QkvLayout gqa{.seq = 7, .batch = 3, .heads = 6, .groups = 2, .head_dim = 16};
  k::QkvLayout mqa{.seq = 5, .batch = 2, .heads = 3, .groups = 1, .head_dim = 5};
  for (const k::QkvLayout& L : {gqa, mqa}) {
    qk_heads_case<float>(L);
    qk_heads_case<double>(L);
    qk_heads_case<bf16>(L);
  }
}

// --multi-latent-attention's packing into the fused layout, its gradient
// unpacking (dkpe summed over the heads, in qkv's type or the accumulation
// type) and the value dims of the attention output: the CPU twin's bits.
template <typename T>
void mla_case(const k::MlaDims& m) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const std::string what = fmt::format("mla {} N={} a={} dn={} dr={} dv={}", tname(dtype_of<T>()), m.tokens, m.heads,
                                       m.dn, m.dr, m.dv);
  const int64_t N = m.tokens, a = m.heads, D = m.D();
  auto make = [](float f) {
    if constexpr (std::is_same_v<T, bf16>) return float_to_bf16(f);
    else return static_cast<T>(f);
  };
  auto filled = [&](int64_t n, int salt) {
    std::vector<T> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = make(0.37f * static_cast<float>((i * 7 + salt) % 113) - 20.f);
    return v;
  };
  std::vector<T> q = filled(N * a * D, 1), kv = filled(N * a * (m.dn + m.dv), 2), kpe = filled(N * m.dr, 3);
  std::vector<T> qkv(static_cast<size_t>(N * 3 * a * D));
  Arena g = gpu_arena(kArenaBytes);
  const Tensor Q = view(q, {N, a * D}), KV = view(kv, {N, a * (m.dn + m.dv)}), P = view(kpe, {N, m.dr}),
               X = view(qkv, {N, 3 * a * D});
  const Tensor gX = g.alloc(X.shape(), X.dtype());
  k::mla_pack(to_device(g, Q), to_device(g, KV), to_device(g, P), m, gX);
  k::mla_pack(Q, KV, P, m, X);
  expect_bitwise(to_host<T>(gX), qkv, what + " pack");
  // Unpack a gradient with distinct values everywhere (the padding included).
  std::vector<T> dx = filled(N * 3 * a * D, 5), dq(q.size()), dkv(kv.size()), dkpe(kpe.size());
  std::vector<A> dkpe_acc(kpe.size());
  const Tensor DX = view(dx, X.shape()), gDX = to_device(g, DX);
  const Tensor gdq = g.alloc(Q.shape(), Q.dtype()), gdkv = g.alloc(KV.shape(), KV.dtype()),
               gdp = g.alloc(P.shape(), P.dtype()), gdpa = g.alloc(P.shape(), dtype_of<A>());
  k::mla_unpack(gDX, m, gdq, gdkv, gdp);
  k::mla_unpack(DX, m, view(dq, Q.shape()), view(dkv, KV.shape()), view(dkpe, P.shape()));
  expect_bitwise(to_host<T>(gdq), dq, what + " unpack dq");
  expect_bitwise(to_host<T>(gdkv), dkv, what + " unpack dkv");
  expect_bitwise(to_host<T>(gdp), dkpe, what + " unpack dkpe");
  k::mla_unpack(gDX, m, gdq, gdkv, gdpa);
  k::mla_unpack(DX, m, view(dq, Q.shape()), view(dkv, KV.shape()), view(dkpe_acc, P.shape()));
  expect_bitwise(to_host<A>(gdpa), dkpe_acc, what + " unpack dkpe (accumulation type)");
  // The value dims of ctx, and the zero-padded gradient.
  std::vector<T> ctx = filled(N * a * D, 7), cv(static_cast<size_t>(N * a * m.dv));
  const Tensor C = view(ctx, {N, a * D}), CV = view(cv, {N, a * m.dv});
  const Tensor gC = to_device(g, C), gCV = g.alloc(CV.shape(), CV.dtype());
  k::mla_ctx(gC, gCV, m, false);
  k::mla_ctx(C, CV, m, false);
  expect_bitwise(to_host<T>(gCV), cv, what + " ctx value dims");
  k::mla_ctx(gC, gCV, m, true);
  k::mla_ctx(C, CV, m, true);
  expect_bitwise(to_host<T>(gC), ctx, what + " ctx gradient padded");
}

TEST(CudaTwin, MlaPackUnpackMatchCpu) {
  MT_REQUIRE_GPU();
  for (const k::MlaDims& m : {k::MlaDims{9, 3, 8, 4, 6}, k::MlaDims{5, 1, 6, 2, 8}, k::MlaDims{4, 16, 128, 64, 128}}) {
    mla_case<float>(m);
    mla_case<double>(m);
    mla_case<bf16>(m);
  }
}

// ---------------------------------------------------------------- bf16 storage

// Under --bf16 qkv, fc1 and their gradients are stored in bf16: the twins
// widen, compute in fp32 and round once as they store. Against the CPU twin
// on the same bf16 values: pointwise math within a bf16 step (libm and FMA
// differences can move a rounding), bias_add and bias_grad bit for bit.
TEST(CudaTwin, Bf16StorageOpsMatchCpu) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  const int64_t N = 37;
  for (const int64_t F : {int64_t{136}, int64_t{129}}) {  // Packs of 8 bf16, then element by element
    auto x = bf16_randn(N * 2 * F, 91, 1.5), dy = bf16_randn(N * F, 92, 1.0);
    std::vector<bf16> y(static_cast<size_t>(N * F)), dx(x.size());
    Tensor X = view(x, {N, 2 * F}), Dy = view(dy, {N, F});
    Tensor gX = to_device(g, X), gDy = to_device(g, Dy), gY = g.alloc({N, F}, DType::kBF16),
           gDx = g.alloc({N, 2 * F}, DType::kBF16);
    k::swiglu_forward(X, view(y, {N, F}));
    k::swiglu_forward(gX, gY);
    expect_bf16_close(to_host<bf16>(gY), y, "swiglu bf16 forward");
    k::swiglu_backward(X, Dy, view(dx, {N, 2 * F}));
    k::swiglu_backward(gX, gDy, gDx);
    expect_bf16_close(to_host<bf16>(gDx), dx, "swiglu bf16 backward");
    for (GeluKind kind : {GeluKind::kExact, GeluKind::kTanh, GeluKind::kSquaredRelu}) {
      const int64_t n = N * F;
      Tensor X1 = X.view({2 * n}).slice(0, n), gX1 = gX.view({2 * n}).slice(0, n);
      std::vector<bf16> y1(static_cast<size_t>(n)), dx1(static_cast<size_t>(n));
      Tensor gY1 = g.alloc({n}, DType::kBF16), gDx1 = g.alloc({n}, DType::kBF16);
      k::gelu_forward(kind, X1, view(y1, {n}));
      k::gelu_forward(kind, gX1, gY1);
      expect_bf16_close(to_host<bf16>(gY1), y1, "gelu bf16 forward");
      k::gelu_backward(kind, X1, Dy.view({n}), view(dx1, {n}));
      k::gelu_backward(kind, gX1, gDy.view({n}), gDx1);
      expect_bf16_close(to_host<bf16>(gDx1), dx1, "gelu bf16 backward");
    }
  }
  {
    k::QkvLayout L{.seq = 7, .batch = 3, .heads = 6, .groups = 2, .head_dim = 16};
    std::vector<float> cs(static_cast<size_t>(L.seq * 8)), sn(cs.size());
    k::rope_table(10000.0, L.seq, L.head_dim, view(cs, {L.seq, 8}), view(sn, {L.seq, 8}));
    Tensor gCos = to_device(g, view(cs, {L.seq, 8})), gSin = to_device(g, view(sn, {L.seq, 8}));
    auto q = bf16_randn(L.tokens() * L.row(), 93, 1.0);
    Tensor Q = view(q, {L.tokens(), L.row()}), gQ = to_device(g, Q);
    k::rope_forward(Q, L, view(cs, {L.seq, 8}), view(sn, {L.seq, 8}));
    k::rope_forward(gQ, L, gCos, gSin);
    expect_bf16_close(to_host<bf16>(gQ), q, "rope bf16 forward");
    k::rope_backward(Q, L, view(cs, {L.seq, 8}), view(sn, {L.seq, 8}));
    k::rope_backward(gQ, L, gCos, gSin);
    expect_bf16_close(to_host<bf16>(gQ), q, "rope bf16 backward");
  }
  for (const int64_t d : {int64_t{16}, int64_t{32}}) {  // partial rotation: r = d/2 (element by element, then Packs of 8)
    k::QkvLayout L{.seq = 5, .batch = 2, .heads = 4, .groups = 2, .head_dim = d};
    const int64_t r = d / 2, half = r / 2;
    std::vector<float> cs(static_cast<size_t>(L.seq * half)), sn(cs.size());
    k::rope_table(k::RopeSpec{10000.0, r}, L.seq, view(cs, {L.seq, half}), view(sn, {L.seq, half}));
    Tensor gCos = to_device(g, view(cs, {L.seq, half})), gSin = to_device(g, view(sn, {L.seq, half}));
    auto q = bf16_randn(L.tokens() * L.row(), 98, 1.0);
    Tensor Q = view(q, {L.tokens(), L.row()}), gQ = to_device(g, Q);
    k::rope_forward(Q, L, view(cs, {L.seq, half}), view(sn, {L.seq, half}), r);
    k::rope_forward(gQ, L, gCos, gSin, r);
    expect_bf16_close(to_host<bf16>(gQ), q, "partial rope bf16 forward");
    k::rope_backward(Q, L, view(cs, {L.seq, half}), view(sn, {L.seq, half}), r);
    k::rope_backward(gQ, L, gCos, gSin, r);
    expect_bf16_close(to_host<bf16>(gQ), q, "partial rope bf16 backward");
  }
  {
    const int64_t F = 129;
    auto y = bf16_randn(N * F, 94, 1.0), dy = bf16_randn(N * F, 95, 1.0);
    auto b = randn<float>(F, 96), db = randn<float>(F, 97);
    Tensor Y = view(y, {N, F}), gY = to_device(g, Y), gB = to_device(g, view(b, {F})),
           gDy = to_device(g, view(dy, {N, F})), gDb = to_device(g, view(db, {F}));
    k::bias_add(Y, view(b, {F}));
    k::bias_add(gY, gB);
    expect_bitwise(to_host<bf16>(gY), y, "bias_add bf16 y");
    k::bias_grad(view(dy, {N, F}), view(db, {F}));
    k::bias_grad(gDy, gDb);
    expect_bitwise(to_host<float>(gDb), db, "bias_grad bf16 dy (accumulated, rows in order)");
  }
}

// The bf16 residual stream (--bf16 without --fp32-residual-connection):
// mixed fp32/bf16 adds, bf16 dropout, norms over a bf16 x with bf16 dx (dy
// bf16 or fp32), embedding and positions into and out of bf16. Elementwise
// ops and the ordered embedding/position gradients bit for bit; the norms'
// reductions within a bf16 step (y, dx) and the fp32 tolerances (dw, db).
TEST(CudaTwin, Bf16ResidualStreamOpsMatchCpu) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  {
    const int64_t n = 1003;  // Packs of 8, then the tail one by one
    auto ah = bf16_randn(n, 101, 2.0);
    auto bf = randn<float>(n, 102, 1.0);
    auto bh = bf16_randn(n, 103, 1.0);
    for (int mask = 1; mask < 8; ++mask) {
      const bool ab = mask & 1, bb = mask & 2, yb = mask & 4;
      std::vector<float> af(ah.size());
      for (size_t i = 0; i < af.size(); ++i) af[i] = bf16_to_float(ah[i]);
      Tensor A = ab ? view(ah, {n}) : view(af, {n}), B = bb ? view(bh, {n}) : view(bf, {n});
      Tensor gA = to_device(g, A), gB = to_device(g, B);
      const DType yt = yb ? DType::kBF16 : DType::kF32;
      const std::string what = fmt::format("add {}+{}->{}", tname(A.dtype()), tname(B.dtype()), tname(yt));
      // 64-byte aligned (Packs), then at an odd offset (one element per step).
      for (bool aligned : {true, false}) {
        Tensor gY = aligned ? g.alloc({n}, yt) : g.alloc({n + 1}, yt).slice(1, n + 1);
        k::add(gA, gB, gY);
        const std::string w2 = what + (aligned ? "" : ", unaligned y");
        if (yb) {
          std::vector<bf16> y(static_cast<size_t>(n));
          k::add(A, B, view(y, {n}));
          expect_bitwise(to_host<bf16>(gY), y, w2);
        } else {
          std::vector<float> y(static_cast<size_t>(n));
          k::add(A, B, view(y, {n}));
          expect_bitwise(to_host<float>(gY), y, w2);
        }
      }
    }
    std::vector<bf16> y(static_cast<size_t>(n));
    Tensor gX = to_device(g, view(ah, {n})), gY = g.alloc({n}, DType::kBF16);
    k::dropout_forward(view(ah, {n}), view(y, {n}), 0.25, 5, 6, 77);
    k::dropout_forward(gX, gY, 0.25, 5, 6, 77);
    expect_bitwise(to_host<bf16>(gY), y, "dropout bf16");
  }
  // The packed kernels (1024, 2056; then with them off, the column-a-thread
  // kernels), the column kernels for narrow rows (40), and the backward's
  // wide path (4100).
  for (const auto& [C, packed] : {std::pair<int64_t, bool>{1024, true}, {2056, true}, {40, true}, {1024, false},
                                 {2056, false}, {4100, true}}) {
    set_norm_packed(packed);
    const int64_t N = 37;
    auto xh = bf16_randn(N * C, 104 + C, 1.3);
    auto w = randn<float>(C, 105, 0.3, 1.0), b = randn<float>(C, 106, 0.2);
    for (bool rms : {false, true}) {
      const std::string what =
          fmt::format("{} bf16 x C={}{}", rms ? "rmsnorm" : "layernorm", C, packed ? "" : ", packed kernel off");
      std::vector<bf16> y(static_cast<size_t>(N * C));
      std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      Tensor X = view(xh, {N, C}), gX = to_device(g, X), gW = to_device(g, view(w, {C})), gB = to_device(g, view(b, {C}));
      Tensor gY = g.alloc({N, C}, DType::kBF16), gMean = g.alloc({N}, DType::kF32), gRstd = g.alloc({N}, DType::kF32);
      if (rms) {
        k::rmsnorm_forward(X, view(w, {C}), 1e-5, view(y, {N, C}), view(rstd, {N}));
        k::rmsnorm_forward(gX, gW, 1e-5, gY, gRstd);
      } else {
        k::layernorm_forward(X, view(w, {C}), view(b, {C}), 1e-5, view(y, {N, C}), view(mean, {N}), view(rstd, {N}));
        k::layernorm_forward(gX, gW, gB, 1e-5, gY, gMean, gRstd);
        expect_close(to_host<float>(gMean), mean, Tol<float>::tight, Tol<float>::tight, what + " mean");
      }
      expect_close(to_host<float>(gRstd), rstd, Tol<float>::tight, 0, what + " rstd");
      expect_bf16_close(to_host<bf16>(gY), y, what + " y");
      for (bool dy_bf16 : {true, false}) {
        auto dyh = bf16_randn(N * C, 107, 1.0);
        auto dyf = randn<float>(N * C, 108, 1.0);
        auto dx = bf16_randn(N * C, 109, 0.5);
        auto dw = randn<float>(C, 110), db = randn<float>(C, 111);
        Tensor Dy = dy_bf16 ? view(dyh, {N, C}) : view(dyf, {N, C});
        Tensor gDy = to_device(g, Dy), gDx = to_device(g, view(dx, {N, C})), gDw = to_device(g, view(dw, {C})),
               gDb = to_device(g, view(db, {C})), gMean2 = to_device(g, view(mean, {N})),
               gRstd2 = to_device(g, view(rstd, {N}));
        if (rms) {
          k::rmsnorm_backward(gDy, gX, gW, gRstd2, gDx, gDw);
          k::rmsnorm_backward(Dy, X, view(w, {C}), view(rstd, {N}), view(dx, {N, C}), view(dw, {C}));
        } else {
          k::layernorm_backward(gDy, gX, gW, gMean2, gRstd2, gDx, gDw, gDb);
          k::layernorm_backward(Dy, X, view(w, {C}), view(mean, {N}), view(rstd, {N}), view(dx, {N, C}), view(dw, {C}),
                                view(db, {C}));
          expect_close(to_host<float>(gDb), db, Tol<float>::sum, Tol<float>::sum, what + " db");
        }
        const std::string bw = what + (dy_bf16 ? ", bf16 dy" : ", fp32 dy");
        expect_bf16_close(to_host<bf16>(gDx), dx, bw + " dx");
        expect_close(to_host<float>(gDw), dw, Tol<float>::sum, Tol<float>::sum, bw + " dw");
      }
    }
  }
  {
    const int64_t Tn = 6, B = 3, N = Tn * B, C = 70, Vs = 9;
    std::vector<int32_t> tok(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) tok[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5) % 12);  // some outside
    auto table = randn<float>(Vs * C, 112), pos = randn<float>(Tn * C, 113);
    Tensor Tok(tok.data(), {N}, DType::kI32), gTok = to_device(g, Tok), gTable = to_device(g, view(table, {Vs, C})),
           gPos = to_device(g, view(pos, {Tn, C}));
    std::vector<bf16> e(static_cast<size_t>(N * C));
    Tensor gE = g.alloc({N, C}, DType::kBF16);
    k::embedding_forward(Tok, view(table, {Vs, C}), 2, view(e, {N, C}));
    k::embedding_forward(gTok, gTable, 2, gE);
    expect_bitwise(to_host<bf16>(gE), e, "embedding forward into bf16");
    k::position_add_forward(view(pos, {Tn, C}), B, view(e, {N, C}));
    k::position_add_forward(gPos, B, gE);
    expect_bitwise(to_host<bf16>(gE), e, "position add into bf16");
    auto dout = bf16_randn(N * C, 114, 1.0);
    auto dt = randn<float>(Vs * C, 115), dp = randn<float>(Tn * C, 116);
    Tensor gD = to_device(g, view(dout, {N, C})), gDt = to_device(g, view(dt, {Vs, C})), gDp = to_device(g, view(dp, {Tn, C}));
    k::embedding_backward(Tok, view(dout, {N, C}), 2, view(dt, {Vs, C}));
    k::embedding_backward(gTok, gD, 2, gDt);
    expect_bitwise(to_host<float>(gDt), dt, "embedding backward from bf16");
    k::position_add_backward(view(dout, {N, C}), B, view(dp, {Tn, C}));
    k::position_add_backward(gD, B, gDp);
    expect_bitwise(to_host<float>(gDp), dp, "position add backward from bf16");
  }
}

// ---------------------------------------------------------------- embedding

template <typename T, typename Tok>
void embedding_case(int64_t N, int64_t Vs, int64_t C, int64_t vocab_start) {
  const std::string what = fmt::format("embedding {} tokens {} N={} Vs={} C={} vocab_start={}", tname(dtype_of<T>()),
                                       tname(dtype_of<Tok>()), N, Vs, C, vocab_start);
  // Tokens over a vocabulary 3x the shard, so some fall outside it, with repeats.
  std::vector<Tok> tok(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tok[static_cast<size_t>(i)] = static_cast<Tok>((i * 7919 + 13) % (3 * Vs));
  // Repeats inside the shard: their gradients add up in row order.
  for (int64_t i = 2; i < N; i += 5) tok[static_cast<size_t>(i)] = static_cast<Tok>(vocab_start + 1);
  auto w = randn<T>(Vs * C, 51), dout = randn<T>(N * C, 52), dw = randn<T>(Vs * C, 53);
  std::vector<T> out(static_cast<size_t>(N * C), T(7));
  Arena g = gpu_arena(kArenaBytes);
  Tensor Tk = view(tok, {N}), W = view(w, {Vs, C});
  Tensor gTk = to_device(g, Tk), gW = to_device(g, W), gOut = to_device(g, view(out, {N, C}));
  k::embedding_forward(Tk, W, vocab_start, view(out, {N, C}));
  k::embedding_forward(gTk, gW, vocab_start, gOut);
  expect_bitwise(to_host<T>(gOut), out, what + " forward");

  Tensor gDout = to_device(g, view(dout, {N, C})), gDw = to_device(g, view(dw, {Vs, C}));
  k::embedding_backward(Tk, view(dout, {N, C}), vocab_start, view(dw, {Vs, C}));
  k::embedding_backward(gTk, gDout, vocab_start, gDw);
  expect_bitwise(to_host<T>(gDw), dw, what + " backward (accumulated, rows in order)");
}

TEST(CudaTwin, EmbeddingForwardBackwardMatchCpuBitwise) {
  MT_REQUIRE_GPU();
  embedding_case<float, int32_t>(37, 50, 129, 0);
  embedding_case<float, int64_t>(37, 50, 129, 50);  // the second of three vocabulary shards
  embedding_case<double, int32_t>(300, 17, 33, 34);
  embedding_case<double, int64_t>(5, 11, 700, 0);
  embedding_case<float, int32_t>(0, 11, 16, 0);
  // More rows than one tile of the sort (1024), long runs of one token, and
  // more columns than one block (256).
  embedding_case<float, int32_t>(2500, 40, 300, 40);
  embedding_case<double, int64_t>(1100, 7, 20, 0);
}

// The op profile times CUDA calls with events on the stream (core/op_profile.h).
TEST(CudaTwin, OpProfileTimesGpuCallsWithEvents) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  const Tensor a = g.alloc({4096}, DType::kF32), b = g.alloc({4096}, DType::kF32);
  a.zero();
  b.zero();
  profile::set_enabled(true);
  profile::reset();
  k::add_inplace(a, b);
  k::add_inplace(a, b);
  const std::vector<profile::OpStat> stats = profile::collect();
  profile::set_enabled(false);
  profile::reset();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].op, "add_inplace");
  EXPECT_EQ(stats[0].device, Device::kCuda);
  EXPECT_EQ(stats[0].calls, 2);
  EXPECT_GE(stats[0].ms, 0.0);
}

template <typename T>
void position_case(int64_t Tn, int64_t B, int64_t C) {
  const std::string what = fmt::format("position_add {} T={} B={} C={}", tname(dtype_of<T>()), Tn, B, C);
  const int64_t N = Tn * B;
  auto pos = randn<T>((Tn + 2) * C, 61), out = randn<T>(N * C, 62), dout = randn<T>(N * C, 63),
       dpos = randn<T>((Tn + 2) * C, 64);
  Arena g = gpu_arena(kArenaBytes);
  Tensor gPos = to_device(g, view(pos, {Tn + 2, C})), gOut = to_device(g, view(out, {N, C}));
  k::position_add_forward(view(pos, {Tn + 2, C}), B, view(out, {N, C}));
  k::position_add_forward(gPos, B, gOut);
  expect_bitwise(to_host<T>(gOut), out, what + " forward");
  Tensor gDout = to_device(g, view(dout, {N, C})), gDpos = to_device(g, view(dpos, {Tn + 2, C}));
  k::position_add_backward(view(dout, {N, C}), B, view(dpos, {Tn + 2, C}));
  k::position_add_backward(gDout, B, gDpos);
  expect_bitwise(to_host<T>(gDpos), dpos, what + " backward (accumulated; rows past T untouched)");
}

TEST(CudaTwin, PositionAddMatchesCpuBitwise) {
  MT_REQUIRE_GPU();
  position_case<float>(37, 3, 129);
  position_case<double>(37, 3, 129);
  position_case<float>(5, 1, 1000);
  position_case<float>(0, 2, 8);
}

// ---------------------------------------------------------------- elementwise

template <typename T>
void bias_and_add_case(int64_t N, int64_t C) {
  const DType dt = dtype_of<T>();
  const std::string what = fmt::format("{} N={} C={}", tname(dt), N, C);
  auto y = randn<T>(N * C, 71), b = randn<T>(C, 72), db = randn<T>(C, 73), a2 = randn<T>(N * C, 74);
  Arena g = gpu_arena(kArenaBytes);
  Tensor gY = to_device(g, view(y, {N, C})), gB = to_device(g, view(b, {C})), gDb = to_device(g, view(db, {C}));
  Tensor gA2 = to_device(g, view(a2, {N, C}));

  k::bias_add(view(y, {N, C}), view(b, {C}));
  k::bias_add(gY, gB);
  expect_bitwise(to_host<T>(gY), y, "bias_add " + what);

  k::bias_grad(view(y, {N, C}), view(db, {C}));
  k::bias_grad(gY, gDb);
  expect_bitwise(to_host<T>(gDb), db, "bias_grad (accumulated, rows in order) " + what);

  // add into a fresh output, then aliasing y = a and y = b, then add_inplace.
  std::vector<T> sum(y.size());
  Tensor gSum = g.alloc({N, C}, dt);
  k::add(view(y, {N, C}), view(a2, {N, C}), view(sum, {N, C}));
  k::add(gY, gA2, gSum);
  expect_bitwise(to_host<T>(gSum), sum, "add " + what);
  k::add(view(y, {N, C}), view(a2, {N, C}), view(y, {N, C}));
  k::add(gY, gA2, gY);
  expect_bitwise(to_host<T>(gY), y, "add with y aliasing a " + what);
  k::add(view(y, {N, C}), view(a2, {N, C}), view(a2, {N, C}));
  k::add(gY, gA2, gA2);
  expect_bitwise(to_host<T>(gA2), a2, "add with y aliasing b " + what);
  k::add_inplace(view(y, {N, C}), view(a2, {N, C}));
  k::add_inplace(gY, gA2);
  expect_bitwise(to_host<T>(gY), y, "add_inplace " + what);
  if (N * C > 1) {  // off a 16-byte boundary: the element-wise kernel
    const int64_t n = N * C;
    Tensor hY = view(y, {n}).slice(1, n), hA = view(a2, {n}).slice(1, n);
    k::add_inplace(hY, hA);
    k::add_inplace(gY.view({n}).slice(1, n), gA2.view({n}).slice(1, n));
    expect_bitwise(to_host<T>(gY), y, "add_inplace unaligned " + what);
  }

  k::scale_inplace(view(y, {N, C}), 0.37);
  k::scale_inplace(gY, 0.37);
  expect_bitwise(to_host<T>(gY), y, "scale_inplace " + what);
}

TEST(CudaTwin, BiasAddGradAddScaleMatchCpuBitwise) {
  MT_REQUIRE_GPU();
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 129}, {1000, 3}, {1, 1}, {0, 5}}) {
    bias_and_add_case<float>(N, C);
    bias_and_add_case<double>(N, C);
  }
}

// Values that stress bf16 rounding: ties to even both ways, the largest
// finite, infinities, subnormals, signed zeros, then random values.
std::vector<float> cast_inputs() {
  const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                           0x00000001u, 0x00008000u, 0x80018000u, 0x00000000u, 0x80000000u, 0x3f7fffffu};
  std::vector<float> v;
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, 4);
    v.push_back(f);
  }
  std::vector<float> r = randn<float>(1001, 81, 100.0);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

template <typename S, typename D>
void cast_case() {
  const std::string what = fmt::format("cast {} -> {}", tname(dtype_of<S>()), tname(dtype_of<D>()));
  std::vector<float> base = cast_inputs();
  std::vector<S> src(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    if constexpr (std::is_same_v<S, bf16>) src[i] = float_to_bf16(base[i]);
    else if constexpr (std::is_same_v<S, double>) src[i] = static_cast<double>(base[i]) * (1.0 + 1e-9);  // bits below fp32
    else src[i] = base[i];
  }
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<D> dst(src.size());
  Arena g = gpu_arena(kArenaBytes);
  Tensor gSrc = to_device(g, view(src, {n})), gDst = g.alloc({n}, dtype_of<D>());
  k::cast(gSrc, gDst);
  if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, bf16>) {
    // The CPU twin's bf16 -> bf16 path converts the float VALUE to the 16-bit
    // payload (static_cast<bf16>(float) aggregate-initialises bits); the CUDA
    // twin copies the bits, which is what a cast means. Check the identity.
    expect_bitwise(to_host<D>(gDst), src, what + " (identity)");
  } else {
    k::cast(view(src, {n}), view(dst, {n}));
    expect_bitwise(to_host<D>(gDst), dst, what);
    // Source and destination one element off a 16-byte boundary: the element-wise kernel.
    std::vector<D> dst1(src.size() - 1);
    k::cast(view(src, {n}).slice(1, n), view(dst1, {n - 1}));
    Tensor gDst1 = g.alloc({n}, dtype_of<D>()).slice(1, n);
    k::cast(gSrc.slice(1, n), gDst1);
    expect_bitwise(to_host<D>(gDst1), dst1, what + " (unaligned)");
  }
}

TEST(CudaTwin, CastAllDtypePairsMatchCpuBitwise) {
  MT_REQUIRE_GPU();
  cast_case<float, float>();
  cast_case<float, double>();
  cast_case<float, bf16>();
  cast_case<double, float>();
  cast_case<double, double>();
  cast_case<double, bf16>();
  cast_case<bf16, float>();
  cast_case<bf16, double>();
  // Under the simulated device the "CUDA" cast is the CPU twin, whose bf16 ->
  // bf16 path is not an identity (see cast_case).
  if (!simdev::enabled()) cast_case<bf16, bf16>();
  // Empty.
  Arena g = gpu_arena(kArenaBytes);
  k::cast(g.alloc({0}, DType::kF32), g.alloc({0}, DType::kBF16));
}

template <typename T>
void dropout_case(int64_t n, double p, uint64_t offset) {
  const std::string what = fmt::format("dropout {} n={} p={} offset={}", tname(dtype_of<T>()), n, p, offset);
  auto x = randn<T>(n, 91);
  std::vector<T> y(x.size(), T(5));
  Arena g = gpu_arena(kArenaBytes);
  Tensor gX = to_device(g, view(x, {n})), gY = to_device(g, view(y, {n}));
  k::dropout_forward(view(x, {n}), view(y, {n}), p, 1234, 77, offset);
  k::dropout_forward(gX, gY, p, 1234, 77, offset);
  expect_bitwise(to_host<T>(gY), y, what);
  // In place (y aliasing x), as the model calls it.
  k::dropout_forward(view(x, {n}), view(x, {n}), p, 99, 3, offset);
  k::dropout_forward(gX, gX, p, 99, 3, offset);
  expect_bitwise(to_host<T>(gX), x, what + " in place");
}

TEST(CudaTwin, DropoutMatchesCpuMaskBitwise) {
  MT_REQUIRE_GPU();
  for (int64_t n : {10007, 3, 0}) {
    dropout_case<float>(n, 0.3, 0);
    dropout_case<float>(n, 0.1, 1001);  // a sequence-parallel shard: odd index_offset
    dropout_case<double>(n, 0.5, (uint64_t{1} << 33) + 5);
    dropout_case<float>(n, 0.0, 0);  // p = 0: copy
  }
}

// --moe-input-jitter-eps: the CPU twin's multipliers, bitwise (Philox on
// both sides, the same lo + width u in the compute type).
template <typename T>
void jitter_case(int64_t n, double eps, uint64_t offset) {
  const std::string what = fmt::format("jitter {} n={} eps={} offset={}", tname(dtype_of<T>()), n, eps, offset);
  std::vector<T> x;
  if constexpr (std::is_same_v<T, bf16>) x = bf16_randn(n, 93, 1.0);
  else x = randn<T>(n, 93);
  std::vector<T> y(x.size(), x.empty() ? T() : x[0]);
  Arena g = gpu_arena(kArenaBytes);
  Tensor gX = to_device(g, view(x, {n})), gY = to_device(g, view(y, {n}));
  k::jitter(view(x, {n}), view(y, {n}), eps, 4321, 17, offset);
  k::jitter(gX, gY, eps, 4321, 17, offset);
  expect_bitwise(to_host<T>(gY), y, what);
  k::jitter(view(x, {n}), view(x, {n}), eps, 7, 2, offset);  // in place, as the model's backward
  k::jitter(gX, gX, eps, 7, 2, offset);
  expect_bitwise(to_host<T>(gX), x, what + " in place");
}

TEST(CudaTwin, JitterMatchesCpuBitwise) {
  MT_REQUIRE_GPU();
  for (int64_t n : {10007, 3, 0}) {
    jitter_case<float>(n, 0.1, 0);
    jitter_case<float>(n, 0.01, 1001);
    jitter_case<double>(n, 0.3, (uint64_t{1} << 33) + 5);
    jitter_case<bf16>(n, 0.1, 64);
  }
}

template <typename T>
void sum_squares_case(int64_t n) {
  const std::string what = fmt::format("sum_squares {} n={}", tname(dtype_of<T>()), n);
  auto x = randn<T>(n, 101 + n, 1.0, 0.1);
  Arena g = gpu_arena(kArenaBytes);
  Tensor gX = to_device(g, view(x, {n}));
  const double want = k::sum_squares(view(x, {n}));
  const double got = k::sum_squares(gX), again = k::sum_squares(gX);
  EXPECT_NEAR(got, want, 1e-12 * (1.0 + std::abs(want))) << what;
  EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << what << ": not deterministic";
}

TEST(CudaTwin, SumSquaresMatchesCpuAndRepeats) {
  MT_REQUIRE_GPU();
  // 3'000'001 > 1024 blocks x 256 threads: the capped grid strides.
  for (int64_t n : {0, 1, 1000, 3000001}) {
    sum_squares_case<float>(n);
    sum_squares_case<double>(n);
  }
}

// The batched form: each total bitwise the single-tensor call's (and the
// CPU twin's batched form equals its own single calls), empty tensors 0, a
// NaN shows in its own slot only.
TEST(CudaTwin, SumSquaresEachMatchesSingleCalls) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  auto a = randn<float>(1000, 121), c = randn<float>(70000, 123);
  auto b = randn<double>(333, 122);
  c[5] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Tensor> host = {view(a, {1000}), view(b, {333}), Tensor(a.data(), {0}, DType::kF32),
                                    view(c, {70000})};
  std::vector<Tensor> dev;
  for (const Tensor& t : host) dev.push_back(t.numel() ? to_device(g, t) : g.alloc({0}, DType::kF32));
  const std::vector<double> each = k::sum_squares_each(dev), cpu_each = k::sum_squares_each(host);
  ASSERT_EQ(each.size(), 4u);
  ASSERT_EQ(cpu_each.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(each[i], k::sum_squares(dev[i])) << "tensor " << i;
    EXPECT_EQ(cpu_each[i], k::sum_squares(host[i])) << "tensor " << i;
    EXPECT_NEAR(each[i], cpu_each[i], 1e-12 * cpu_each[i]) << "tensor " << i;
  }
  EXPECT_EQ(each[2], 0.0);
  EXPECT_TRUE(std::isnan(each[3]));
  EXPECT_TRUE(k::sum_squares_each({}).empty());
}

// --log-num-zeros-in-grad: the zero counts equal the CPU twin's, for a
// tensor with a capped, striding grid, -0 counted, NaN and denormals not;
// and the sum-of-squares mode that shares the passes is left unchanged.
TEST(CudaTwin, CountZerosMatchesCpu) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  auto a = randn<float>(3000001, 131);
  for (size_t i = 0; i < a.size(); i += 7) a[i] = (i % 2) ? 0.0f : -0.0f;
  a[1] = std::numeric_limits<float>::quiet_NaN();
  a[3] = 1e-40f;
  auto b = randn<double>(333, 132);
  b[0] = 0.0, b[332] = -0.0;
  const std::vector<Tensor> host = {view(a, {3000001}), view(b, {333}), Tensor(a.data(), {0}, DType::kF32)};
  std::vector<Tensor> dev;
  for (const Tensor& t : host) dev.push_back(t.numel() ? to_device(g, t) : g.alloc({0}, DType::kF32));
  const std::vector<int64_t> got = k::count_zeros_each(dev), want = k::count_zeros_each(host);
  EXPECT_EQ(got, want);
  EXPECT_EQ(want, (std::vector<int64_t>{428572, 2, 0}));
  // Scaled by a clipping-like coefficient: a[3] = 1e-40 flushes to 0, the
  // rest (|x| > ~1e-7 from randn) does not.
  const std::vector<int64_t> got_s = k::count_zeros_each(dev, 1e-6), want_s = k::count_zeros_each(host, 1e-6);
  EXPECT_EQ(got_s, want_s);
  EXPECT_EQ(want_s[0], 428573);
  // The sum-of-squares mode of the shared passes: the CPU's value.
  EXPECT_NEAR(k::sum_squares(dev[1]), k::sum_squares(host[1]), 1e-12 * k::sum_squares(host[1]));
}

// ---------------------------------------------------------------- adamw

template <typename T>
void adamw_case(int64_t n, double grad_scale, bool lowp) {
  const std::string what =
      fmt::format("adamw {} n={} grad_scale={}{}", tname(dtype_of<T>()), n, grad_scale, lowp ? " lowp" : "");
  auto p = randn<T>(n, 111), m = randn<T>(n, 112, 0.01), v = randn<T>(n, 113, 0.01);
  for (T& x : v) x = x * x;  // v >= 0
  std::vector<bf16> lp(static_cast<size_t>(n));
  Arena g = gpu_arena(kArenaBytes);
  Tensor gP = to_device(g, view(p, {n})), gM = to_device(g, view(m, {n})), gV = to_device(g, view(v, {n}));
  Tensor gLp = lowp ? g.alloc({n}, DType::kBF16) : Tensor();
  k::AdamWOptions o;
  o.lr = 3e-4;
  o.weight_decay = 0.1;
  o.beta2 = 0.95;
  o.grad_scale = grad_scale;
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = step;
    auto grad = randn<T>(n, 120 + step, 0.5);
    Tensor gG = to_device(g, view(grad, {n}));
    k::adamw_step(view(p, {n}), view(grad, {n}), view(m, {n}), view(v, {n}), o,
                  lowp ? view(lp, {n}) : Tensor());
    k::adamw_step(gP, gG, gM, gV, o, gLp);
    const std::string at = fmt::format("{} step {}", what, step);
    expect_bitwise(to_host<T>(gP), p, at + " param");
    expect_bitwise(to_host<T>(gM), m, at + " m");
    expect_bitwise(to_host<T>(gV), v, at + " v");
    if (lowp) expect_bitwise(to_host<bf16>(gLp), lp, at + " bf16 copy");
  }
}

TEST(CudaTwin, AdamWMatchesCpuBitwise) {
  MT_REQUIRE_GPU();
  for (int64_t n : {10007, 1, 0}) {
    adamw_case<float>(n, 1.0, false);
    adamw_case<float>(n, 0.37, false);
    adamw_case<float>(n, 1.0, true);
    adamw_case<float>(n, 0.37, true);
    adamw_case<double>(n, 1.0, false);
    adamw_case<double>(n, 0.37, false);
  }
}

// ---------------------------------------------------------------- sgd

template <typename T>
void sgd_case(int64_t n, double momentum, double wd, double grad_scale, bool lowp) {
  const std::string what = fmt::format("sgd {} n={} momentum={} wd={} grad_scale={}{}", tname(dtype_of<T>()), n,
                                       momentum, wd, grad_scale, lowp ? " lowp" : "");
  auto p = randn<T>(n, 211), buf = std::vector<T>(static_cast<size_t>(n), T(0));
  std::vector<bf16> lp(static_cast<size_t>(n));
  Arena g = gpu_arena(kArenaBytes);
  const bool mom = momentum != 0.0;
  Tensor gP = to_device(g, view(p, {n})), gB = mom ? to_device(g, view(buf, {n})) : Tensor();
  Tensor gLp = lowp ? g.alloc({n}, DType::kBF16) : Tensor();
  k::SGDOptions o;
  o.lr = 0.05;
  o.momentum = momentum;
  o.weight_decay = wd;
  o.grad_scale = grad_scale;
  for (int step = 1; step <= 3; ++step) {
    auto grad = randn<T>(n, 220 + step, 0.5);
    Tensor gG = to_device(g, view(grad, {n}));
    k::sgd_step(view(p, {n}), view(grad, {n}), mom ? view(buf, {n}) : Tensor(), o, lowp ? view(lp, {n}) : Tensor());
    k::sgd_step(gP, gG, gB, o, gLp);
    const std::string at = fmt::format("{} step {}", what, step);
    expect_bitwise(to_host<T>(gP), p, at + " param");
    if (mom) expect_bitwise(to_host<T>(gB), buf, at + " momentum buffer");
    if (lowp) expect_bitwise(to_host<bf16>(gLp), lp, at + " bf16 copy");
  }
}

TEST(CudaTwin, SgdMatchesCpuBitwise) {
  MT_REQUIRE_GPU();
  for (int64_t n : {10007, 1, 0}) {
    sgd_case<float>(n, 0.9, 0.1, 1.0, false);
    sgd_case<float>(n, 0.9, 0.1, 0.37, true);
    sgd_case<float>(n, 0.0, 0.0, 1.0, true);
    sgd_case<float>(n, 0.5, 0.0, 0.37, false);
    sgd_case<double>(n, 0.9, 0.1, 0.37, false);
    sgd_case<double>(n, 0.0, 0.1, 1.0, false);
  }
}

// ---------------------------------------------------------------- cross entropy

template <typename T, typename Tok>
void xent_case(int64_t N, int64_t V, int64_t vocab_start) {
  const DType dt = dtype_of<T>();
  const std::string what = fmt::format("xent {} targets {} N={} V={} vocab_start={}", tname(dt),
                                       tname(dtype_of<Tok>()), N, V, vocab_start);
  auto logits = randn<T>(N * V, 131 + N, 3.0);
  // Targets: inside the shard, outside it on both sides, and one ignored (-1).
  std::vector<Tok> tg(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    int64_t t = vocab_start + (i * 7919) % V;
    if (i % 4 == 1) t = vocab_start + V + i;                 // a later shard
    if (i % 4 == 2 && vocab_start > 0) t = vocab_start - 1;  // an earlier shard
    if (i % 4 == 3) t = -1;                                  // ignored
    tg[static_cast<size_t>(i)] = static_cast<Tok>(t);
  }
  std::vector<T> mx(static_cast<size_t>(N)), se(mx.size()), tl(mx.size()), loss(mx.size());
  Arena g = gpu_arena(size_t{256} << 20);
  Tensor L = view(logits, {N, V}), Tg = view(tg, {N});
  Tensor gL = to_device(g, L), gTg = to_device(g, Tg);
  Tensor gMx = g.alloc({N}, dt), gSe = g.alloc({N}, dt), gTl = g.alloc({N}, dt), gLoss = g.alloc({N}, dt);

  // 1. partials
  k::xent_partials(L, Tg, vocab_start, view(mx, {N}), view(se, {N}), view(tl, {N}));
  k::xent_partials(gL, gTg, vocab_start, gMx, gSe, gTl);
  expect_bitwise(to_host<T>(gMx), mx, what + " max");
  expect_bitwise(to_host<T>(gTl), tl, what + " target logit");
  expect_close(to_host<T>(gSe), se, Tol<T>::wide, 0, what + " sumexp");

  // 2. rescale to a larger "global" max (as after the TP all-reduce), from the CPU's sums.
  std::vector<T> gmax(mx.size());
  for (size_t i = 0; i < mx.size(); ++i) gmax[i] = mx[i] + T(0.75);
  Tensor gSe2 = to_device(g, view(se, {N})), gMx2 = to_device(g, view(mx, {N})), gGmax = to_device(g, view(gmax, {N}));
  k::xent_rescale(view(se, {N}), view(mx, {N}), view(gmax, {N}));
  k::xent_rescale(gSe2, gMx2, gGmax);
  expect_close(to_host<T>(gSe2), se, Tol<T>::tight, 0, what + " rescale");

  // 3. loss from identical (CPU) partials.
  Tensor gTl2 = to_device(g, view(tl, {N})), gGmax2 = to_device(g, view(gmax, {N}));
  Tensor gSe3 = to_device(g, view(se, {N}));
  k::xent_loss(view(gmax, {N}), view(se, {N}), view(tl, {N}), Tg, view(loss, {N}));
  k::xent_loss(gGmax2, gSe3, gTl2, gTg, gLoss);
  expect_close(to_host<T>(gLoss), loss, Tol<T>::tight, Tol<T>::tight, what + " loss");

  // 4. backward from identical partials, into a separate buffer and in place.
  auto dloss = randn<T>(N, 141, 1.0, 1.0);
  Tensor gDloss = to_device(g, view(dloss, {N}));
  std::vector<T> dl(logits.size());
  Tensor gD = g.alloc({N, V}, dt);
  k::xent_backward(L, Tg, vocab_start, view(gmax, {N}), view(se, {N}), view(dloss, {N}), view(dl, {N, V}));
  k::xent_backward(gL, gTg, vocab_start, gGmax2, gSe3, gDloss, gD);
  const std::vector<T> gd = to_host<T>(gD);
  expect_close(gd, dl, Tol<T>::tight, 1e-30, what + " dlogits");
  if constexpr (std::is_same_v<T, float>) {
    // bf16 gradient: bitwise the device fp32 gradient cast to bf16 ...
    Tensor gDb = g.alloc({N, V}, DType::kBF16), gCast = g.alloc({N, V}, DType::kBF16);
    k::xent_backward_half(gL, gTg, vocab_start, gGmax2, gSe3, gDloss, gDb);
    k::cast(gD, gCast);
    const std::vector<bf16> db = to_host<bf16>(gDb);
    expect_bitwise(db, to_host<bf16>(gCast), what + " bf16 dlogits vs fp32 + cast");
    // ... and the CPU's bf16 gradient within one bf16 rounding.
    std::vector<bf16> cdb(logits.size());
    k::xent_backward_half(L, Tg, vocab_start, view(gmax, {N}), view(se, {N}), view(dloss, {N}), view(cdb, {N, V}));
    expect_close(widen(db), widen(cdb), 1.0 / 64, 1e-30, what + " bf16 dlogits vs CPU");
  }
  k::xent_backward(gL, gTg, vocab_start, gGmax2, gSe3, gDloss, gL);  // dlogits aliasing logits
  expect_bitwise(to_host<T>(gL), gd, what + " dlogits in place");
}

TEST(CudaTwin, CrossEntropyMatchesCpu) {
  MT_REQUIRE_GPU();
  xent_case<float, int32_t>(37, 129, 0);
  xent_case<float, int64_t>(8, 50257, 0);  // a GPT-2-wide row
  xent_case<double, int32_t>(37, 129, 129);
  xent_case<double, int64_t>(5, 50257, 50257);
  xent_case<float, int64_t>(13, 1000, 1000);  // the second of several vocabulary shards
}

TEST(CudaTwin, CrossEntropyEmptyBatch) {
  MT_REQUIRE_GPU();
  Arena g = gpu_arena(kArenaBytes);
  Tensor L = g.alloc({0, 129}, DType::kF32), Tg = g.alloc({0}, DType::kI32), R = g.alloc({0}, DType::kF32);
  k::xent_partials(L, Tg, 0, R, R, R);
  k::xent_rescale(R, R, R);
  k::xent_loss(R, R, R, Tg, R);
  k::xent_backward(L, Tg, 0, R, R, R, L);
  k::xent_backward_half(L, Tg, 0, R, R, R, g.alloc({0, 129}, DType::kBF16));
}

}  // namespace
}  // namespace mt::test
