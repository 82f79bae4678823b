// GEMM on the GPU through cuBLASLt: the CUDA twin of kernels/cpu/gemm.cc,
// with the same row-major contract (kernels/gemm.h).
//
// cuBLASLt is column-major. A row-major [R, C] matrix is the column-major
// [C, R] matrix with the same bytes, so the row-major product
//   C[M,N] = op(A)[M,K] op(B)[K,N]
// is computed as the column-major product C^T[N,M] = op(B)^T op(A)^T, i.e.
// cuBLASLt's "A" is our B and its "B" is our A, each with the transpose flag
// it already has (a row-major matrix read column-major is already transposed).
//
// dtypes (as on the CPU):
//   fp32 x fp32 -> fp32   CUBLAS_COMPUTE_32F: true fp32 products, no TF32,
//                          so fp32 runs match the CPU to rounding;
//   bf16 x bf16 -> fp32 or bf16   CUBLAS_COMPUTE_32F: bf16 tensor cores, fp32
//                          accumulate (a bf16 C is the rounded fp32 result);
//   fp64 x fp64 -> fp64   CUBLAS_COMPUTE_64F (the finite-difference reference).
// A plan (descriptors + the heuristic's first algorithm) is cached per shape,
// transposes, dtypes and beta, per device; the workspace is 32 MiB per device
// (NVIDIA's recommendation for Hopper).

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda/check.cuh"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace mt::kernels::cuda {

namespace {

#define MT_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                 \
    cublasStatus_t _s = (call);                                                                        \
    MT_CHECK(_s == CUBLAS_STATUS_SUCCESS,                                                              \
             fmt::format("{} failed: {} ({})", #call, cublasLtGetStatusName(_s), cublasLtGetStatusString(_s))); \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// (device, trans_a, trans_b, M, N, K, input dtype, output dtype, beta != 0, alignment of A, B, C)
using PlanKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int, int, bool, uint32_t, uint32_t, uint32_t>;

// The largest power of two <= 256 dividing the address: cuBLASLt's heuristic
// assumes 256-byte aligned operands unless told otherwise, and arena views
// are only 64-byte aligned (slices less).
uint32_t alignment_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C/D
  cublasLtMatmulAlgo_t algo{};
};

std::mutex g_mu;
std::map<int, DeviceState> g_devices;
std::map<PlanKey, Plan> g_plans;

DeviceState& device_state(int dev) {
  DeviceState& s = g_devices[dev];
  if (!s.handle) {
    MT_CUBLAS_CHECK(cublasLtCreate(&s.handle));
    s.workspace = ::mt::cuda::device_malloc(kWorkspaceBytes, "cuBLASLt workspace");
  }
  return s;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF64: return CUDA_R_64F;
    default: MT_CHECK(false, fmt::format("gemm: unsupported dtype {}", dtype_name(t)));
  }
  return CUDA_R_32F;
}

const Plan& plan_for(const DeviceState& ds, int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, DType in,
                     DType out, bool beta_nonzero, uint32_t align_a, uint32_t align_b, uint32_t align_c) {
  PlanKey key{dev, ta, tb, M, N, K, static_cast<int>(in), static_cast<int>(out), beta_nonzero, align_a, align_b, align_c};
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second;

  Plan p;
  const bool f64 = in == DType::kF64;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                           f64 ? CUDA_R_64F : CUDA_R_32F));
  // cuBLASLt's A is our B: stored row-major [K,N] (or [N,K] when tb), i.e.
  // column-major [N,K] with ld N (or [K,N] with ld K, then transposed).
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cudaDataType_t ti = cuda_type(in), to = cuda_type(out);
  if (tb) MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ti, K, N, K));
  else MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ti, N, K, N));
  // cuBLASLt's B is our A: stored [M,K] (column-major [K,M], ld K) or [K,M] when ta.
  if (ta) MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ti, M, K, M));
  else MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ti, K, M, K));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, to, N, M, N));

  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                       sizeof(ws)));
  // cuBLASLt's A is our B and its B our A; C and D are our C.
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                                       sizeof(align_b)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                                       sizeof(align_a)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                       sizeof(align_c)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                       sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ds.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  MT_CHECK(found > 0, fmt::format("gemm: cuBLASLt has no algorithm for {}{} M={} N={} K={} ({} inputs, {} output)",
                                  ta ? "A^T" : "A", tb ? " B^T" : " B", M, N, K, dtype_name(in), dtype_name(out)));
  p.algo = result.algo;
  return g_plans.emplace(key, p).first->second;
}

void check_operand(const Tensor& t, int64_t rows, int64_t cols, const char* name) {
  MT_CHECK(t.numel() >= rows * cols,
           fmt::format("gemm: {} has {} elements, needs {} x {}", name, t.numel(), rows, cols));
  MT_CHECK(t.device() == Device::kCuda, fmt::format("gemm: {} is not a CUDA tensor", name));
}

}  // namespace

namespace {

// D = alpha op(A) op(B) + beta C; C is read only (it may be D itself).
void matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A, const Tensor& B,
            float beta, const Tensor& C, const Tensor& D) {
  check_operand(A, M, K, "A");
  check_operand(B, K, N, "B");
  check_operand(C, M, N, "C");
  check_operand(D, M, N, "D");
  MT_CHECK(C.dtype() == D.dtype(), "gemm: C and D must have one dtype");
  if (M == 0 || N == 0) return;
  DType out = D.dtype();
  switch (A.dtype()) {
    case DType::kF32:
      MT_CHECK(B.dtype() == DType::kF32 && out == DType::kF32, "gemm: fp32 A needs fp32 B and C");
      break;
    case DType::kBF16:
      MT_CHECK(B.dtype() == DType::kBF16 && (out == DType::kF32 || out == DType::kBF16),
               fmt::format("gemm: bf16 A needs bf16 B and an fp32 or bf16 C (got B {}, C {})", dtype_name(B.dtype()),
                           dtype_name(out)));
      MT_CHECK(alpha == 1.0f, "gemm bf16: alpha must be 1");
      MT_CHECK(beta == 0.0f || beta == 1.0f, "gemm (matmul primitive): beta must be 0 or 1");
      break;
    case DType::kF64:
      MT_CHECK(B.dtype() == DType::kF64 && out == DType::kF64, "gemm: fp64 A needs fp64 B and C");
      break;
    default:
      MT_CHECK(false, fmt::format("gemm: unsupported dtype {}", dtype_name(A.dtype())));
  }
  Tensor d = D.view(Shape{D.numel()}).slice(0, M * N);
  if (K == 0) {  // D = beta C (cuBLASLt rejects an empty reduction)
    if (beta == 0.0f) return d.zero();
    if (C.data() != D.data()) ::mt::cuda::copy_d2d(d.data(), C.data(), d.nbytes());
    if (beta != 1.0f) ::mt::kernels::cuda::scale_inplace(d, beta);
    return;
  }
  int dev = ::mt::cuda::current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceState& ds = device_state(dev);
  // C and D share one layout, so one alignment preference covers both.
  const Plan& p = plan_for(ds, dev, ta, tb, M, N, K, A.dtype(), out, beta != 0.0f, alignment_of(A.data()),
                           alignment_of(B.data()), std::min(alignment_of(C.data()), alignment_of(D.data())));
  if (A.dtype() == DType::kF64) {
    double a = alpha, b = beta;
    MT_CUBLAS_CHECK(cublasLtMatmul(ds.handle, p.op, &a, B.data(), p.a, A.data(), p.b, &b, C.data(), p.c, D.data(),
                                   p.c, &p.algo, ds.workspace, kWorkspaceBytes, ::mt::cuda::stream()));
  } else {
    float a = alpha, b = beta;
    MT_CUBLAS_CHECK(cublasLtMatmul(ds.handle, p.op, &a, B.data(), p.a, A.data(), p.b, &b, C.data(), p.c, D.data(),
                                   p.c, &p.algo, ds.workspace, kWorkspaceBytes, ::mt::cuda::stream()));
  }
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A, const Tensor& B,
          float beta, const Tensor& C) {
  matmul(ta, tb, M, N, K, alpha, A, B, beta, C, C);
}

void gemm_add(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B, const Tensor& R,
              const Tensor& D) {
  // cuBLASLt's epilogue adds C to the accumulator and rounds once, as
  // gemm into D followed by add(D, R) would (the accumulator is already in
  // D's type); the bits match whenever the heuristic picks the same
  // algorithm with and without beta.
  matmul(ta, tb, M, N, K, 1.0f, A, B, 1.0f, R, D);
}

}  // namespace mt::kernels::cuda
