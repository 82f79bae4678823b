// GEMM's CUDA twin (cuBLASLt) against the CPU twin (oneDNN) on the same
// inputs: every transpose pair, fp32 / bf16 / fp64, beta 0 and 1 over a
// non-zero C, alpha != 1, odd shapes, and the empty reduction.

#include <fmt/format.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/gemm.h"
#include "test_util.h"

namespace mt::test {
namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
};

// Runs one case on both devices for input type T (float, double, or bf16
// inputs with float C) and compares C.
template <typename In, typename Out>
void run_case(const Case& c, double rtol, double atol) {
  std::vector<float> af(static_cast<size_t>(c.M * c.K)), bf(static_cast<size_t>(c.K * c.N)),
      cf(static_cast<size_t>(c.M * c.N));
  fill_normal(af, 11 + c.M, 1.0);
  fill_normal(bf, 23 + c.N, 1.0);
  fill_normal(cf, 37 + c.K, 1.0);
  auto conv_in = [](const std::vector<float>& v) {
    std::vector<In> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<In, bf16>) out[i] = float_to_bf16(v[i]);
      else out[i] = static_cast<In>(v[i]);
    }
    return out;
  };
  std::vector<In> a = conv_in(af), b = conv_in(bf);
  std::vector<Out> cpu_c(cf.begin(), cf.end());
  Shape as = c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
  Shape bs = c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
  Tensor A(a.data(), as, dtype_of<In>()), B(b.data(), bs, dtype_of<In>());
  Tensor C(cpu_c.data(), Shape{c.M, c.N}, dtype_of<Out>());

  Arena g = gpu_arena();
  Tensor dA = to_device(g, A), dB = to_device(g, B), dC = to_device(g, C);
  kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, B, c.beta, C);
  kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA, dB, c.beta, dC);
  expect_close(to_host<Out>(dC), cpu_c, rtol, atol,
               fmt::format("gemm {}{} {}x{}x{} alpha {} beta {} ({})", c.ta ? "T" : "N", c.tb ? "T" : "N", c.M,
                           c.N, c.K, c.alpha, c.beta, dtype_name(dtype_of<In>())));
}

const Case kCases[] = {
    {false, false, 37, 129, 65, 1.0f, 0.0f}, {false, true, 64, 96, 300, 1.0f, 1.0f},
    {true, false, 129, 33, 17, 1.0f, 1.0f},  {true, true, 5, 7, 513, 1.0f, 0.0f},
    {false, true, 256, 384, 768, 1.0f, 0.0f}, {true, false, 768, 256, 200, 1.0f, 1.0f},
};

TEST(CudaTwin, GemmFp32MatchesCpuForAllTransposes) {
  MT_REQUIRE_GPU();
  for (const Case& c : kCases) run_case<float, float>(c, 1e-4, 1e-4);
  run_case<float, float>({false, true, 31, 47, 59, 0.5f, 1.0f}, 1e-4, 1e-4);  // alpha != 1
  run_case<float, float>({true, true, 31, 47, 59, -2.0f, 0.0f}, 1e-4, 1e-4);
}

TEST(CudaTwin, GemmBf16InputsFp32OutputMatchCpu) {
  MT_REQUIRE_GPU();
  // Same bf16 inputs, both accumulate in fp32: differences are summation order only.
  for (const Case& c : kCases) run_case<bf16, float>(c, 1e-3, 1e-3);
}

// bf16 C (the qkv and fc1 outputs under --bf16): both twins round their
// fp32-accumulated sums once; summation orders differ, so a value may land
// one bf16 step apart. beta 1 adds the old bf16 C.
TEST(CudaTwin, GemmBf16OutputMatchesCpu) {
  MT_REQUIRE_GPU();
  for (const Case& c : kCases) {
    std::vector<float> af(static_cast<size_t>(c.M * c.K)), bf(static_cast<size_t>(c.K * c.N)),
        cf(static_cast<size_t>(c.M * c.N));
    fill_normal(af, 3 + c.M, 1.0);
    fill_normal(bf, 5 + c.N, 1.0);
    fill_normal(cf, 7 + c.K, 1.0);
    std::vector<bf16> a(af.size()), b(bf.size()), cpu(cf.size());
    for (size_t i = 0; i < af.size(); ++i) a[i] = float_to_bf16(af[i]);
    for (size_t i = 0; i < bf.size(); ++i) b[i] = float_to_bf16(bf[i]);
    for (size_t i = 0; i < cf.size(); ++i) cpu[i] = float_to_bf16(cf[i]);
    Tensor A(a.data(), c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, DType::kBF16);
    Tensor B(b.data(), c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, DType::kBF16);
    Tensor C(cpu.data(), Shape{c.M, c.N}, DType::kBF16);
    Arena g = gpu_arena();
    Tensor dA = to_device(g, A), dB = to_device(g, B), dC = to_device(g, C);
    kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, A, B, c.beta, C);
    kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, dA, dB, c.beta, dC);
    std::vector<bf16> gpu = to_host<bf16>(dC);
    const double atol = 1e-3 * std::sqrt(static_cast<double>(c.K));  // fp32 order differences near zero
    for (size_t i = 0; i < gpu.size(); ++i) {
      const double w = bf16_to_float(cpu[i]), got = bf16_to_float(gpu[i]);
      ASSERT_LE(std::abs(got - w), atol + std::abs(w) / 128)
          << fmt::format("gemm bf16 C {}{} {}x{}x{} beta {}", c.ta ? "T" : "N", c.tb ? "T" : "N", c.M, c.N, c.K,
                         c.beta)
          << " element " << i << ": " << got << " vs CPU " << w;
    }
  }
}

TEST(CudaTwin, GemmFp64MatchesCpuReference) {
  MT_REQUIRE_GPU();
  for (const Case& c : kCases) run_case<double, double>(c, 1e-12, 1e-12);
  run_case<double, double>({false, false, 13, 11, 9, 0.25, 1.0}, 1e-12, 1e-12);
}

TEST(CudaTwin, GemmOperandsOnlyFourByteAligned) {
  MT_REQUIRE_GPU();
  // Views one element into their buffers (as slices of arenas can be): the
  // plan must not assume cuBLASLt's default 256-byte alignment.
  const int64_t M = 33, N = 65, K = 47;
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(N * K)), c(static_cast<size_t>(M * N));
  fill_normal(a, 1, 1.0);
  fill_normal(b, 2, 1.0);
  Tensor A(a.data(), {M, K}, DType::kF32), B(b.data(), {N, K}, DType::kF32), C(c.data(), {M, N}, DType::kF32);
  kernels::gemm(false, true, M, N, K, 1.0f, A, B, 0.0f, C);
  Arena g = gpu_arena(size_t{1} << 20);
  auto shifted = [&](const Tensor& host) {
    Tensor buf = g.alloc({host.numel() + 1}, DType::kF32);
    Tensor v = buf.slice(1, host.numel() + 1).view(host.shape());
    copy_tensor(host, v);
    return v;
  };
  // The same shape first on aligned operands, so a plan cached for them must
  // not be reused for the misaligned call.
  Tensor aA = to_device(g, A), aB = to_device(g, B), aC = g.alloc({M, N}, DType::kF32);
  kernels::gemm(false, true, M, N, K, 1.0f, aA, aB, 0.0f, aC);
  expect_close(to_host<float>(aC), c, 1e-4, 1e-4, "gemm on aligned operands");
  Tensor dA = shifted(A), dB = shifted(B), dC = shifted(C);
  kernels::gemm(false, true, M, N, K, 1.0f, dA, dB, 0.0f, dC);
  expect_close(to_host<float>(dC), c, 1e-4, 1e-4, "gemm on 4-byte aligned operands");
}

// gemm_add (D = op(A) op(B) + R: the residual in cuBLASLt's epilogue)
// against the CPU twin's gemm then add, R unchanged, for fp32 and for bf16
// inputs with an fp32 D; and with K = 0, D = R exactly.
TEST(CudaTwin, GemmAddMatchesCpu) {
  MT_REQUIRE_GPU();
  const int64_t M = 64, N = 96, K = 300;
  std::vector<float> af(M * K), bf(N * K), r(M * N);
  fill_normal(af, 41, 1.0);
  fill_normal(bf, 42, 1.0);
  fill_normal(r, 43, 10.0);
  std::vector<bf16> ah(af.size()), bh(bf.size());
  for (size_t i = 0; i < af.size(); ++i) ah[i] = float_to_bf16(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) bh[i] = float_to_bf16(bf[i]);
  for (bool bf16_in : {false, true}) {
    const DType in = bf16_in ? DType::kBF16 : DType::kF32;
    Tensor A(bf16_in ? static_cast<void*>(ah.data()) : af.data(), Shape{M, K}, in),
        B(bf16_in ? static_cast<void*>(bh.data()) : bf.data(), Shape{N, K}, in), R(r.data(), Shape{M, N}, DType::kF32);
    std::vector<float> want(r.size());
    kernels::gemm_add(false, true, M, N, K, A, B, R, Tensor(want.data(), Shape{M, N}, DType::kF32));
    Arena g = gpu_arena();
    Tensor dA = to_device(g, A), dB = to_device(g, B), dR = to_device(g, R), dD = g.alloc(Shape{M, N}, DType::kF32);
    kernels::gemm_add(false, true, M, N, K, dA, dB, dR, dD);
    expect_close(to_host<float>(dD), want, 1e-4, 1e-3, fmt::format("gemm_add ({} inputs)", dtype_name(in)));
    expect_close(to_host<float>(dR), r, 0, 0, "gemm_add leaves R");
    // R only 16-byte aligned, D 64-byte aligned: one plan must suit both.
    Tensor dR16 = g.alloc(Shape{M * N + 4}, DType::kF32).slice(4, M * N + 4).view({M, N});
    copy_tensor(R, dR16);
    kernels::gemm_add(false, true, M, N, K, dA, dB, dR16, dD);
    expect_close(to_host<float>(dD), want, 1e-4, 1e-3, fmt::format("gemm_add, R 16-byte aligned ({})", dtype_name(in)));
    Tensor dE = g.alloc(Shape{0}, in);
    kernels::gemm_add(false, true, M, N, 0, dE, dE, dR, dD);
    expect_close(to_host<float>(dD), r, 0, 0, "gemm_add K=0 copies R");
  }
  // bf16 R and D (the bf16 residual stream): the fp32 product plus R rounded
  // once on both sides; the accumulation orders differ, so a sum near a
  // rounding boundary may land one bf16 step apart.
  {
    std::vector<bf16> rh(r.size()), want(r.size());
    for (size_t i = 0; i < r.size(); ++i) rh[i] = float_to_bf16(r[i]);
    Tensor A(ah.data(), Shape{M, K}, DType::kBF16), B(bh.data(), Shape{N, K}, DType::kBF16),
        R(rh.data(), Shape{M, N}, DType::kBF16);
    kernels::gemm_add(false, true, M, N, K, A, B, R, Tensor(want.data(), Shape{M, N}, DType::kBF16));
    Arena g = gpu_arena();
    Tensor dA = to_device(g, A), dB = to_device(g, B), dR = to_device(g, R), dD = g.alloc(Shape{M, N}, DType::kBF16);
    kernels::gemm_add(false, true, M, N, K, dA, dB, dR, dD);
    const std::vector<bf16> got = to_host<bf16>(dD);
    for (size_t i = 0; i < got.size(); ++i) {
      const double gv = bf16_to_float(got[i]), wv = bf16_to_float(want[i]);
      ASSERT_LE(std::abs(gv - wv), 1e-3 + std::abs(wv) / 128) << "gemm_add bf16 R, D element " << i;
    }
    const std::vector<bf16> r_after = to_host<bf16>(dR);
    for (size_t i = 0; i < rh.size(); ++i) ASSERT_EQ(r_after[i].bits, rh[i].bits) << "gemm_add bf16 changed R";
  }
}

TEST(CudaTwin, GemmEmptyReductionScalesC) {
  MT_REQUIRE_GPU();
  // K = 0: C = beta C (closed form; the CPU library's leading-dimension
  // rules make K = 0 a case only this twin is asked about).
  std::vector<float> c0(72);
  fill_normal(c0, 5, 1.0);
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    Arena g = gpu_arena(size_t{1} << 20);
    Tensor dC = to_device(g, Tensor(c0.data(), Shape{8, 9}, DType::kF32));
    Tensor dA = g.alloc(Shape{0}, DType::kF32), dB = g.alloc(Shape{0}, DType::kF32);
    kernels::gemm(false, true, 8, 9, 0, 1.0f, dA, dB, beta, dC);
    std::vector<float> want(c0.size());
    for (size_t i = 0; i < c0.size(); ++i) want[i] = beta * c0[i];
    expect_close(to_host<float>(dC), want, 0, 0, fmt::format("gemm K=0 beta {}", beta));
  }
}

}  // namespace
}  // namespace mt::test
