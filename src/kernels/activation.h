#pragma once
// MLP activations.
//   GELU exact:  y = x/2 (1 + erf(x/sqrt(2)))                       (F.gelu: Megatron without the fused bias-GELU)
//   GELU tanh:   y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (--openai-gelu, and Megatron's default
//                fused bias-GELU; ModelConfig::gelu_tanh() picks)
//   squared ReLU: y = max(x, 0)^2                                 (--squared-relu; Megatron's squared_relu)
//   SwiGLU:      x [N, 2F] = [gate | up] along the last dim (Megatron's
//                torch.chunk(x, 2, -1)); y [N, F] = silu(gate) * up.
// Backward WRITES dx (it does not accumulate). x is stored in fp32, fp64 or
// bf16 (bf16 computes in fp32: a bf16 x gives the bits an fp32 x holding the
// same values gives); the forward's y has x's dtype, or bf16 for fp32 x
// (rounded once as stored: the bf16 GEMM input under --bf16); backward's dy
// and dx have x's dtype, bf16 dx rounded once as stored.
// Tensor parallel: elementwise on the column-parallel fc1 output; with
// SwiGLU each rank's fc1 shard holds [gate shard | up shard], so the op
// runs unchanged on a shard.

#include "kernels/dispatch.h"

namespace mt::kernels {

// The non-gated MLP activation gelu_forward/gelu_backward compute: a GELU
// form, or squared ReLU (kept in one op: the same elementwise shape).
enum class GeluKind { kExact, kTanh, kSquaredRelu };

namespace cpu {
void gelu_forward(GeluKind kind, const Tensor& x, const Tensor& y);
void gelu_backward(GeluKind kind, const Tensor& x, const Tensor& dy, const Tensor& dx);
void swiglu_forward(const Tensor& x, const Tensor& y);
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/activation.cu), on the rank's stream.
namespace cuda {
void gelu_forward(GeluKind kind, const Tensor& x, const Tensor& y);
void gelu_backward(GeluKind kind, const Tensor& x, const Tensor& dy, const Tensor& dx);
void swiglu_forward(const Tensor& x, const Tensor& y);
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
}  // namespace cuda
#endif

inline void gelu_forward(GeluKind kind, const Tensor& x, const Tensor& y) {
  MT_DISPATCH(gelu_forward, x.device(), kind, x, y);
}
inline void gelu_backward(GeluKind kind, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  MT_DISPATCH(gelu_backward, x.device(), kind, x, dy, dx);
}
// x: [N, 2F], y: [N, F].
inline void swiglu_forward(const Tensor& x, const Tensor& y) { MT_DISPATCH(swiglu_forward, x.device(), x, y); }
// x: [N, 2F], dy: [N, F], dx: [N, 2F].
inline void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  MT_DISPATCH(swiglu_backward, x.device(), x, dy, dx);
}

}  // namespace mt::kernels
