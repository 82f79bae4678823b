#pragma once
// GEMM: C = alpha * op(A) @ op(B) + beta * C, all row-major and contiguous.
//   op(A): [M,K] (A stored [M,K], or [K,M] when trans_a)
//   op(B): [K,N] (B stored [K,N], or [N,K] when trans_b)
//   C: [M,N]
// dtypes: A,B,C fp32 (oneDNN sgemm); A,B bf16 with C fp32 or bf16 (oneDNN
// matmul, fp32 accumulation, a bf16 C rounded once to nearest even as
// stored; REQUIRES alpha == 1 and beta in {0, 1}); all fp64 (a plain loop, for
// the finite-difference tests only).
// Linear layers (y = x W^T + b, W [out,in] as in PyTorch/Megatron) use:
//   forward  y  = x W^T      gemm(false, true , N, out, in)
//   backward dx = dy W       gemm(false, false, N, in, out)
//            dW += dy^T x    gemm(true , false, out, in, N, beta = 1)
// oneDNN was chosen by measurement (bench/gemm_bench.cc; ../shared/TOOLCHAIN.md).
//
// gemm_add: D = op(A) @ op(B) + R, the residual connection after a layer's
// output projection in one call: D and R of one dtype, R read only and not
// overlapping D. fp32 (or fp64) D: the bits of gemm(..., beta 0, D) followed
// by add(D, R, D) (the product is rounded to D's type, then the sum once).
// bf16 D and R (bf16 A and B: the bf16 residual stream): the fp32 product
// plus R, rounded to bf16 once. The CUDA twin does it in cuBLASLt's
// epilogue (R read once, no temporary, no second kernel); the CPU twin runs
// gemm then add (fp32), or copies R into D and accumulates the product
// with beta 1 (bf16).

#include <fmt/format.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
          const Tensor& B, float beta, const Tensor& C);
void gemm_add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
              const Tensor& R, const Tensor& D);
}
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/gemm.cu), on the rank's stream.
namespace cuda {
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
          const Tensor& B, float beta, const Tensor& C);
void gemm_add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
              const Tensor& R, const Tensor& D);
}  // namespace cuda
#endif

// The op-profile scope of one GEMM call writing `out`: labelled by shape,
// 2 M N K FLOPs (the dispatcher's own "gemm" scope nests inside it).
inline ::mt::profile::OpScope gemm_profile_scope(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                                 const Tensor& A, const Tensor& out) {
  return ::mt::profile::OpScope(
      ::mt::profile::enabled() ? ::mt::profile::gemm_label(trans_a, trans_b, M, N, K, A.dtype(), out.dtype()) : "gemm",
      out.device(), 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
}

inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const Tensor& A, const Tensor& B, float beta, const Tensor& C) {
  const ::mt::profile::OpScope shape_scope = gemm_profile_scope(trans_a, trans_b, M, N, K, A, C);
  MT_DISPATCH(gemm, C.device(), trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

inline void gemm_add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                     const Tensor& R, const Tensor& D) {
  MT_CHECK(R.dtype() == D.dtype() &&
               (D.dtype() == DType::kF32 || D.dtype() == DType::kF64 ||
                ((D.dtype() == DType::kBF16 || D.dtype() == DType::kF16) && A.dtype() == D.dtype())),
           fmt::format("gemm_add: R and D must share one dtype, fp32 or fp64, or bf16 with bf16 A and B (fp16 "
                       "likewise) (got R {}, "
                       "D {}, A {})",
                       dtype_name(R.dtype()), dtype_name(D.dtype()), dtype_name(A.dtype())));
  MT_CHECK(R.numel() >= M * N && D.numel() >= M * N,
           fmt::format("gemm_add: R and D need {} x {} elements (have {}, {})", M, N, R.numel(), D.numel()));
  const auto* r = static_cast<const char*>(R.data());
  const auto* d = static_cast<const char*>(D.data());
  const size_t bytes = static_cast<size_t>(M * N) * dtype_size(D.dtype());
  MT_CHECK(r + bytes <= d || d + bytes <= r, "gemm_add: R overlaps D (write the sum to another tensor)");
  const ::mt::profile::OpScope shape_scope = gemm_profile_scope(trans_a, trans_b, M, N, K, A, D);
  MT_DISPATCH(gemm_add, D.device(), trans_a, trans_b, M, N, K, A, B, R, D);
}

}  // namespace mt::kernels
