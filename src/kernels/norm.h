#pragma once
// LayerNorm and RMSNorm over the last dimension of x [N, C].
//   LayerNorm: y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps) (biased var)
//   RMSNorm:   y = x * rstd * w,               rstd = 1/sqrt(mean(x^2) + eps)
// Forward saves mean [N] (LayerNorm only) and rstd [N] for backward.
// Backward ACCUMULATES: dx += ..., dw += ..., db += ... (the residual stream's
// gradient is already in dx; weight gradients accumulate over micro-batches).
// dtypes: the parameters w, b (and dw, db), mean and rstd are fp32 or fp64
// (T); x, y, dy and dx are T too, except that with fp32 parameters
//  - the forward's y may be bf16 (rounded once as stored: the bf16 GEMM input
//    under --bf16, bit for bit what casting an fp32 y would give);
//  - x and dx (one dtype) may be bf16, and so may dy independently: the bf16
//    residual stream under --bf16 without --fp32-residual-connection. Values
//    are widened exactly, everything is computed in fp32 as for fp32 tensors,
//    and a bf16 dx is rounded once: dx = bf16(dx + the row's term). Sequence parallel: norms act per
// token, so a sequence shard runs them unchanged (weight grads are then
// all-reduced over the TP group by the caller).

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db);
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/norm.cu), on the rank's stream.
namespace cuda {
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db);
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw);
// A benchmark's switch between two sets of kernels (same contract, results
// within the tests' tolerances): on, the default, the packed forward and
// backward wherever the parameters are fp32, C is a multiple of 8 from 1024
// to 4096 and the tensors are 16-byte aligned; off, the column-a-thread
// kernels (the ones timed on the H200 before). norm_bench times both;
// process-wide, not for concurrent calls.
void set_norm_packed(bool on);
}  // namespace cuda
#endif

// b may be undefined (no bias).
inline void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                              const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  MT_DISPATCH(layernorm_forward, x.device(), x, w, b, eps, y, mean, rstd);
}
// db may be undefined (no bias).
inline void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  MT_DISPATCH(layernorm_backward, x.device(), dy, x, w, mean, rstd, dx, dw, db);
}
inline void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                            const Tensor& rstd) {
  MT_DISPATCH(rmsnorm_forward, x.device(), x, w, eps, y, rstd);
}
inline void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                             const Tensor& dx, const Tensor& dw) {
  MT_DISPATCH(rmsnorm_backward, x.device(), dy, x, w, rstd, dx, dw);
}

}  // namespace mt::kernels
