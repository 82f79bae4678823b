#pragma once
// Elementwise and reduction ops the layers need: bias add and its gradient,
// residual adds, dtype casts, seeded dropout, scaling, sum of squares.
// fp32 or fp64 unless stated. bias_add's y and bias_grad's dy may also be
// bf16 (the bias and its gradient then fp32; bf16 y rounded once as stored).
// add and add_inplace take any mix of fp32 and bf16 operands (the bf16
// residual stream plus an fp32 partial result): the sum in fp32, rounded
// once to y's type; fp64 operands must all be fp64. dropout's x and y share
// one dtype, fp32, fp64 or bf16 (bf16 computed in fp32, rounded once).
//
// Dropout: keep element i when philox_uniform(seed, stream, i + index_offset)
// >= p, and scale kept values by 1/(1-p) (PyTorch/Megatron semantics).
// backward regenerates the same mask from (seed, stream, offset): no mask is
// stored. index_offset lets a sequence-parallel shard draw the elements it
// would have had in the unsplit tensor.

#include <cstdint>

#include <vector>

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void bias_add(const Tensor& y, const Tensor& b);
void bias_grad(const Tensor& dy, const Tensor& db);
void add(const Tensor& a, const Tensor& b, const Tensor& y);
void add_inplace(const Tensor& y, const Tensor& x);
void cast(const Tensor& src, const Tensor& dst);
void scale_inplace(const Tensor& y, double s);
void dropout(const Tensor& x, const Tensor& y, double p, uint64_t seed, uint64_t stream, uint64_t index_offset);
void jitter(const Tensor& x, const Tensor& y, double eps, uint64_t seed, uint64_t stream, uint64_t index_offset);
double sum_squares(const Tensor& x);
std::vector<double> sum_squares_each(const std::vector<Tensor>& xs);
std::vector<int64_t> count_zeros_each(const std::vector<Tensor>& xs, double scale);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/elementwise.cu), on the rank's stream.
namespace cuda {
void bias_add(const Tensor& y, const Tensor& b);
void bias_grad(const Tensor& dy, const Tensor& db);
void add(const Tensor& a, const Tensor& b, const Tensor& y);
void add_inplace(const Tensor& y, const Tensor& x);
void cast(const Tensor& src, const Tensor& dst);
void scale_inplace(const Tensor& y, double s);
void dropout(const Tensor& x, const Tensor& y, double p, uint64_t seed, uint64_t stream, uint64_t index_offset);
void jitter(const Tensor& x, const Tensor& y, double eps, uint64_t seed, uint64_t stream, uint64_t index_offset);
double sum_squares(const Tensor& x);
std::vector<double> sum_squares_each(const std::vector<Tensor>& xs);
std::vector<int64_t> count_zeros_each(const std::vector<Tensor>& xs, double scale);
}  // namespace cuda
#endif

// y [N, C] += b [C] per row.
inline void bias_add(const Tensor& y, const Tensor& b) { MT_DISPATCH(bias_add, y.device(), y, b); }
// db [C] += column sums of dy [N, C].
inline void bias_grad(const Tensor& dy, const Tensor& db) { MT_DISPATCH(bias_grad, dy.device(), dy, db); }
// y = a + b (y may alias a or b).
inline void add(const Tensor& a, const Tensor& b, const Tensor& y) { MT_DISPATCH(add, y.device(), a, b, y); }
// y += x.
inline void add_inplace(const Tensor& y, const Tensor& x) { MT_DISPATCH(add_inplace, y.device(), y, x); }
// Any of fp32/fp64/bf16 to any (round to nearest even into bf16).
inline void cast(const Tensor& src, const Tensor& dst) { MT_DISPATCH(cast, dst.device(), src, dst); }
inline void scale_inplace(const Tensor& y, double s) { MT_DISPATCH(scale_inplace, y.device(), y, s); }
// y = dropout(x); y may alias x. The same call on dy gives the backward.
inline void dropout_forward(const Tensor& x, const Tensor& y, double p, uint64_t seed, uint64_t stream,
                            uint64_t index_offset = 0) {
  MT_DISPATCH(dropout, y.device(), x, y, p, seed, stream, index_offset);
}
inline void dropout_backward(const Tensor& dy, const Tensor& dx, double p, uint64_t seed, uint64_t stream,
                             uint64_t index_offset = 0) {
  MT_DISPATCH(dropout, dx.device(), dy, dx, p, seed, stream, index_offset);
}
// y = x * J, J uniform in [1 - eps, 1 + eps] per element (Megatron's MoE
// router input jitter, torch's Uniform(1 - eps, 1 + eps).rsample: low + u
// (high - low)), u = philox_uniform(seed, stream, index_offset + i) in
// [0, 1) (the fused low + u width can round up to 1 + eps); y may alias x. The same call on dy gives the backward (d(xJ)/dx = J).
inline void jitter(const Tensor& x, const Tensor& y, double eps, uint64_t seed, uint64_t stream,
                   uint64_t index_offset = 0) {
  MT_DISPATCH(jitter, y.device(), x, y, eps, seed, stream, index_offset);
}
// Sum of squares in double (for the global gradient norm).
inline double sum_squares(const Tensor& x) { MT_DISPATCH(sum_squares, x.device(), x); }
// sum_squares of every tensor of xs (all on one device), each bitwise its own
// sum_squares(), with one wait for a device at the end instead of one per
// tensor (the gradient norm and the finiteness check of a whole model).
inline std::vector<double> sum_squares_each(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  MT_DISPATCH(sum_squares_each, xs[0].device(), xs);
}
// The number of elements x of each tensor of xs (all on one device, fp32 or
// fp64) with x * T(scale) == 0 (+0 or -0; NaN is not): --log-num-zeros-in-grad,
// counted as Megatron counts them, after the gradients are scaled by the
// clipping coefficient (which flushes the tiniest values to 0).
inline std::vector<int64_t> count_zeros_each(const std::vector<Tensor>& xs, double scale = 1.0) {
  if (xs.empty()) return {};
  MT_DISPATCH(count_zeros_each, xs[0].device(), xs, scale);
}

}  // namespace mt::kernels
