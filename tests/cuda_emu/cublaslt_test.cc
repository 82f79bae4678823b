// The emulator's cuBLASLt fake (cublaslt.cc) against products computed by
// hand, with no repository code involved: every transpose pair, ld > rows,
// alpha and beta, beta == 0 leaving C unread, bf16 and fp64 inputs; and the
// rejections its documented contract demands. gemm.cu's CUDA twin test
// trusts the fake only as far as this holds.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// A = [1 2 3; 4 5 6] (2x3), B = [7 8; 9 10; 11 12] (3x2): A B = [58 64; 139 154].
const std::vector<float> kWant = {58, 139, 64, 154};            // column-major
const std::vector<float> kAn = {1, 4, 2, 5, 3, 6};              // A stored 2x3, ld 2
const std::vector<float> kAt = {1, 2, 3, 4, 5, 6};              // A^T stored 3x2, ld 3
const std::vector<float> kApad = {1, 4, -99, 2, 5, -99, 3, 6};  // A 2x3 with ld 3 (a padding row)
const std::vector<float> kBn = {7, 9, 11, 8, 10, 12};           // B stored 3x2, ld 3
const std::vector<float> kBt = {7, 8, 9, 10, 11, 12};           // B^T stored 2x3, ld 2
constexpr auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
constexpr auto F32 = CUDA_R_32F;
constexpr auto C32 = CUBLAS_COMPUTE_32F;
constexpr size_t kWorkspace = size_t{4} << 20;

// cudaMalloc'd copy of v (256-byte aligned); `offset` leading elements of padding.
template <typename E>
E* to_device(const std::vector<E>& v, size_t offset = 0) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, (v.size() + offset) * sizeof(E)), cudaSuccess);
  E* d = static_cast<E*>(p) + offset;
  EXPECT_EQ(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(E), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  return d;
}

template <typename E>
std::vector<E> to_host(const E* d, size_t n) {
  std::vector<E> v(n);
  EXPECT_EQ(cudaMemcpyAsync(v.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {  // exact for these small integers
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    h[i] = static_cast<uint16_t>(u >> 16);
  }
  return h;
}

struct Problem {
  cublasOperation_t ta, tb;
  cudaDataType in = F32, out = F32;
  cublasComputeType_t compute = C32;
  cudaDataType scale = F32;
  uint64_t ar, ac;
  int64_t lda;
  uint64_t br, bc;
  int64_t ldb;
  uint64_t cr = 2, cc = 2;
  int64_t ldc = 2;
  uint32_t align = 256;           // every MIN_ALIGNMENT preference
  size_t workspace = kWorkspace;  // passed to cublasLtMatmul
  size_t transa_size = sizeof(cublasOperation_t);
};

class CublasLtFake : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cublasLtCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMalloc(&workspace_, kWorkspace), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cublasLtDestroy(handle_), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cudaFree(workspace_), cudaSuccess);
  }

  // Plans and runs D = alpha op(A) op(B) + beta C with D == C; the first failing status.
  cublasStatus_t gemm(const Problem& p, const void* alpha, const void* A, const void* B, const void* beta, void* C) {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulDescCreate(&d, p.compute, p.scale);
    cublasLtMatrixLayoutCreate(&a, p.in, p.ar, p.ac, p.lda);
    cublasLtMatrixLayoutCreate(&b, p.in, p.br, p.bc, p.ldb);
    cublasLtMatrixLayoutCreate(&c, p.out, p.cr, p.cc, p.ldc);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, p.transa_size);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof(p.tb));
    const uint64_t max_ws = kWorkspace;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i)
      s = cublasLtMatmulPreferenceSetAttribute(
          pref, static_cast<cublasLtMatmulPreferenceAttributes_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
          &p.align, sizeof(p.align));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoGetHeuristic(handle_, d, a, b, c, c, pref, 1, &r, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found != 1) s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmul(handle_, d, alpha, A, a, B, b, beta, C, c, C, c, &r.algo, workspace_, p.workspace, nullptr);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(d);
    return s;
  }

  // fp32 A B into a fresh C (filled with c0), compared with alpha kWant + beta c0.
  void expect_product(const Problem& p, const std::vector<float>& a, const std::vector<float>& b, float alpha = 1,
                      float beta = 0, float c0 = 0) {
    float* A = to_device(a);
    float* B = to_device(b);
    float* C = to_device(std::vector<float>(4, c0));
    ASSERT_EQ(gemm(p, &alpha, A, B, &beta, C), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> got = to_host(C, 4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], alpha * kWant[i] + (beta != 0 ? beta * c0 : 0)) << "element " << i;
    cudaFree(A), cudaFree(B), cudaFree(C);
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

TEST_F(CublasLtFake, ProductsMatchHandComputedForEveryTranspose) {
  expect_product({N, N, F32, F32, C32, F32, 2, 3, 2, 3, 2, 3}, kAn, kBn);
  expect_product({T, N, F32, F32, C32, F32, 3, 2, 3, 3, 2, 3}, kAt, kBn);
  expect_product({N, T, F32, F32, C32, F32, 2, 3, 2, 2, 3, 2}, kAn, kBt);
  expect_product({T, T, F32, F32, C32, F32, 3, 2, 3, 2, 3, 2}, kAt, kBt);
}

TEST_F(CublasLtFake, LeadingDimensionAlphaAndBeta) {
  expect_product({N, N, F32, F32, C32, F32, 2, 3, 3, 3, 2, 3}, kApad, kBn);                  // lda 3 > 2 rows
  expect_product({N, N, F32, F32, C32, F32, 2, 3, 2, 3, 2, 3}, kAn, kBn, 0.5f, 2.0f, 1.0f);  // 0.5 A B + 2 C
  expect_product({N, N, F32, F32, C32, F32, 2, 3, 2, 3, 2, 3}, kAn, kBn, 1.0f, 0.0f, NAN);   // beta 0: C unread
}

TEST_F(CublasLtFake, Bf16InputsAndFp64) {
  const float one = 1, zero = 0;
  uint16_t* A = to_device(to_bf16(kAt));
  uint16_t* B = to_device(to_bf16(kBn));
  float* C = to_device(std::vector<float>(4, 0));
  ASSERT_EQ(gemm({T, N, CUDA_R_16BF, F32, C32, F32, 3, 2, 3, 3, 2, 3}, &one, A, B, &zero, C), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(to_host(C, 4), kWant);
  cudaFree(A), cudaFree(B), cudaFree(C);

  const double al = 1, be = 1;
  double* Ad = to_device(std::vector<double>(kAn.begin(), kAn.end()));
  double* Bd = to_device(std::vector<double>(kBt.begin(), kBt.end()));
  double* Cd = to_device(std::vector<double>(4, 1.0));
  ASSERT_EQ(
      gemm({N, T, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, 2, 3, 2, 2, 3, 2}, &al, Ad, Bd, &be, Cd),
      CUBLAS_STATUS_SUCCESS);
  const std::vector<double> got = to_host(Cd, 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], kWant[i] + 1.0) << "element " << i;
  cudaFree(Ad), cudaFree(Bd), cudaFree(Cd);
}

TEST_F(CublasLtFake, RejectsWhatTheContractForbids) {
  const float one = 1, zero = 0;
  float* A = to_device(kAn);
  float* A4 = to_device(kAn, 1);  // 4 bytes past a 256-byte boundary
  float* B = to_device(kBn);
  float* C = to_device(std::vector<float>(6, 0));
  const Problem ok{N, N, F32, F32, C32, F32, 2, 3, 2, 3, 2, 3};
  auto with = [&](auto change) {
    Problem p = ok;
    change(p);
    return p;
  };
  EXPECT_EQ(gemm(ok, &one, A, B, &zero, C), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(with([](Problem& p) { p.lda = 1; }), &one, A, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE)
      << "lda < rows";
  EXPECT_EQ(gemm(with([](Problem& p) { p.br = 2, p.bc = 3, p.ldb = 2, p.cc = 3; }), &one, A, B, &zero, C),
            CUBLAS_STATUS_INVALID_VALUE)
      << "op(A) 2x3 times op(B) 2x3";
  EXPECT_EQ(gemm(with([](Problem& p) { p.ta = T; }), &one, A, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE)
      << "TRANSA on a layout described after the op";
  EXPECT_EQ(gemm(with([](Problem& p) { p.cc = 3; }), &one, A, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE)
      << "C 2x3 for a 2x2 product";
  EXPECT_EQ(gemm(with([](Problem& p) { p.transa_size = 8; }), &one, A, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE)
      << "TRANSA with sizeInBytes 8";
  EXPECT_EQ(gemm(ok, &one, A4, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE) << "A 4-byte aligned, planned for 256";
  EXPECT_EQ(gemm(with([](Problem& p) { p.align = 4; }), &one, A4, B, &zero, C), CUBLAS_STATUS_SUCCESS)
      << "the same, planned for 4";
  EXPECT_EQ(to_host(C, 4), kWant);
  EXPECT_EQ(gemm(with([](Problem& p) { p.workspace = 16; }), &one, A, B, &zero, C), CUBLAS_STATUS_INVALID_VALUE)
      << "workspace smaller than the heuristic's";
  EXPECT_EQ(gemm(with([](Problem& p) { p.scale = CUDA_R_64F; }), &one, A, B, &zero, C), CUBLAS_STATUS_NOT_SUPPORTED)
      << "scale type 64F with compute 32F";
  EXPECT_EQ(gemm(with([](Problem& p) { p.in = CUDA_R_16BF, p.out = CUDA_R_64F; }), &one, A, B, &zero, C),
            CUBLAS_STATUS_NOT_SUPPORTED)
      << "bf16 inputs, fp64 output";
  std::vector<float> host_a = kAn;
  EXPECT_EQ(gemm(ok, &one, host_a.data(), B, &zero, C), CUBLAS_STATUS_INVALID_VALUE) << "A in host memory";
  cudaFree(A), cudaFree(A4 - 1), cudaFree(B), cudaFree(C);
}

TEST_F(CublasLtFake, AlgoIsBoundToTheProblemItWasPlannedFor) {
  const float one = 1, zero = 0;
  float* A = to_device(kAn);
  float* Apad = to_device(kApad);
  float* B = to_device(kBn);
  float* C = to_device(std::vector<float>(4, 0));
  cublasLtMatmulDesc_t d;
  cublasLtMatrixLayout_t a, a_ld3, b, c;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulDescCreate(&d, C32, F32);
  cublasLtMatrixLayoutCreate(&a, F32, 2, 3, 2);
  cublasLtMatrixLayoutCreate(&a_ld3, F32, 2, 3, 3);
  cublasLtMatrixLayoutCreate(&b, F32, 3, 2, 3);
  cublasLtMatrixLayoutCreate(&c, F32, 2, 2, 2);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle_, d, a, b, c, c, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(r.workspaceSize, 0u) << "no MAX_WORKSPACE_BYTES preference: no workspace";
  EXPECT_EQ(cublasLtMatmul(handle_, d, &one, Apad, a_ld3, B, b, &zero, C, c, C, c, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(handle_, d, &one, A, a, B, b, &zero, C, c, C, c, &r.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(to_host(C, 4), kWant);
  cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {a, a_ld3, b, c}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(d);
  cudaFree(A), cudaFree(Apad), cudaFree(B), cudaFree(C);
}

}  // namespace
