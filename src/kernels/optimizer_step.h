#pragma once
// The optimizers' elementwise updates: AdamW and SGD with momentum.
//
// AdamW as PyTorch's torch.optim.AdamW and Megatron's default optimizer
// (apex/TE FusedAdam with adam_w_mode) define it, for step t >= 1:
//   p   -= lr * wd * p                       (decoupled weight decay)
//   m    = b1 m + (1 - b1) g
//   v    = b2 v + (1 - b2) g^2
//   p   -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// fp32 parameters (the fp32 master copy under bf16) and fp32 state; fp64
// accepted for tests. Global gradient norm: sqrt of the sum over tensors of
// sum_squares (kernels/elementwise.h); Megatron clips with
// coeff = clip / (norm + 1e-6), applied when coeff < 1. With a distributed
// optimizer each rank steps only its shard (the op is elementwise).

#include <vector>

#include "kernels/dispatch.h"

namespace mt::kernels {

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  int64_t step = 1;  // 1-based, after incrementing for this update
  // g is used as g * grad_scale (rounded to the parameters' dtype, exactly as
  // scaling the gradient in place first would): gradient clipping fused into
  // the update, saving a pass over every gradient.
  double grad_scale = 1.0;
};

namespace cpu {
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWOptions& o,
                const Tensor& lowp);
}
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/optimizer_step.cu), on the rank's stream.
namespace cuda {
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWOptions& o,
                const Tensor& lowp);
}  // namespace cuda
#endif

// lowp (optional, fp32 parameters only): a bf16 tensor that receives the
// updated parameters rounded to bf16 in the same pass (the bf16 GEMM copy).
inline void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWOptions& o, const Tensor& lowp = Tensor()) {
  MT_DISPATCH(adamw_step, param.device(), param, grad, m, v, o, lowp);
}

// SGD as torch.optim.SGD (dampening 0, no Nesterov) and Megatron's
// --optimizer sgd (TE/apex FusedSGD) define it, with coupled (L2) weight decay:
//   g    = g * grad_scale + wd * p           (the decay term only when wd != 0)
//   buf  = momentum * buf + g;  g = buf      (only when momentum != 0)
//   p   -= lr * g
// torch creates buf = g at a parameter's first step; starting from buf = 0
// gives the same value (0 * momentum + g == g exactly), so no first-step flag.
struct SGDOptions {
  double lr = 1e-3, momentum = 0.9, weight_decay = 0.0;
  double grad_scale = 1.0;  // as AdamWOptions::grad_scale
};

namespace cpu {
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDOptions& o, const Tensor& lowp);
}
#ifdef MT_HAVE_CUDA
namespace cuda {
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDOptions& o, const Tensor& lowp);
}  // namespace cuda
#endif

// buf: the momentum buffer (same numel as param); not read when momentum is 0.
inline void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDOptions& o,
                     const Tensor& lowp = Tensor()) {
  MT_DISPATCH(sgd_step, param.device(), param, grad, buf, o, lowp);
}

// sqrt(sum of squares of every tensor).
double global_grad_norm(const std::vector<Tensor>& grads);
// Scales every gradient by clip / (norm + 1e-6) when that is below 1; returns the norm.
double clip_grad_norm(const std::vector<Tensor>& grads, double clip);

}  // namespace mt::kernels
