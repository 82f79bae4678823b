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

#include <cstdint>

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
          const Tensor& B, float beta, const Tensor& C);
}
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/gemm.cu), on the rank's stream.
namespace cuda {
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
          const Tensor& B, float beta, const Tensor& C);
}  // namespace cuda
#endif

inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const Tensor& A, const Tensor& B, float beta, const Tensor& C) {
  MT_DISPATCH(gemm, C.device(), trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

}  // namespace mt::kernels
