// CUDA twins of kernels/cpu/optimizer_step.cc: one fused AdamW or SGD step
// (kernels/optimizer_step.h has the contracts), fp32 or fp64, with the fused
// gradient scale and the optional bf16 copy of the updated fp32 parameters.
//
// Launch: grid-stride loop, one element per step, int64 indices; no
// reductions. Bitwise equal to the CPU twin: the CPU file is compiled with
// -ffp-contract=off (and IEEE sqrt and division), so every operation here is
// a correctly rounded intrinsic (add_rn, mul_rn, div_rn, sqrt_rn: never fused
// into an FMA) applied in the CPU expression's order, and the scalar
// constants (bias corrections, decay, step size) are computed on the host by
// the CPU twin's own double arithmetic and rounded to T the same way.
#include <cmath>

#include "core/cuda/check.cuh"
#include "kernels/optimizer_step.h"
#include "kernels/cuda/pointwise_common.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

template <typename T>
struct AdamConsts {
  T decay, b1, one_minus_b1, b2, one_minus_b2, eps, step, rbc2, gs;
};

// CPU twin, per element:
//   gi = g * gs (when scaled)
//   m  = b1 * m + (1 - b1) * gi
//   v  = b2 * v + (1 - b2) * gi * gi
//   p  = p * decay - step * m / (sqrt(v) * rbc2 + eps)
//   lp = bf16(float(p)) (when lowp)
template <typename T>
__global__ void adamw_k(int64_t n, T* p, const T* __restrict__ g, T* m, T* v, AdamConsts<T> k, bool scaled,
                        bf16* lp) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    T gi = g[e];
    if (scaled) gi = mul_rn(gi, k.gs);
    const T mi = add_rn(mul_rn(k.b1, m[e]), mul_rn(k.one_minus_b1, gi));
    const T vi = add_rn(mul_rn(k.b2, v[e]), mul_rn(mul_rn(k.one_minus_b2, gi), gi));
    m[e] = mi;
    v[e] = vi;
    const T pi = sub_rn(mul_rn(p[e], k.decay), div_rn(mul_rn(k.step, mi), add_rn(mul_rn(sqrt_rn(vi), k.rbc2), k.eps)));
    p[e] = pi;
    if (lp) lp[e] = bf16{bf16_bits_from_float(static_cast<float>(pi))};
  }
}

// CPU twin of sgd_step, per element:
//   gi = g * gs (when scaled);  gi = gi + wd * p (when decay)
//   b  = mu * b + gi; gi = b (when momentum)
//   p  = p - lr * gi;  lp = bf16(p) (when lowp)
template <typename T>
__global__ void sgd_k(int64_t n, T* p, const T* __restrict__ g, T* b, T lr, T mu, T wd, T gs, bool scaled, bool decay,
                      bf16* lp) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    T gi = g[e];
    if (scaled) gi = mul_rn(gi, gs);
    if (decay) gi = add_rn(gi, mul_rn(wd, p[e]));
    if (b) {
      gi = add_rn(mul_rn(mu, b[e]), gi);
      b[e] = gi;
    }
    const T pi = sub_rn(p[e], mul_rn(lr, gi));
    p[e] = pi;
    if (lp) lp[e] = bf16{bf16_bits_from_float(static_cast<float>(pi))};
  }
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDOptions& o, const Tensor& lowp) {
  check_same_numel(param, grad, "sgd_step");
  if (lowp.defined()) {
    MT_CHECK(lowp.dtype() == DType::kBF16 && param.dtype() == DType::kF32, "sgd_step: lowp must be bf16 for fp32 parameters");
    check_same_numel(param, lowp, "sgd_step");
  }
  const bool momentum = o.momentum != 0.0 && param.numel() > 0;
  MT_CHECK(!momentum || buf.defined(), "sgd_step: momentum != 0 needs a momentum buffer");
  if (momentum) check_same_numel(param, buf, "sgd_step");
  check_on_gpu({&param, &grad, &buf, &lowp}, "sgd_step");
  float_types(param.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const int64_t n = param.numel();
    if (n == 0) return;
    bf16* lp = lowp.defined() ? lowp.ptr<bf16>() : nullptr;
    sgd_k<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
        n, param.ptr<T>(), grad.ptr<T>(), momentum ? buf.ptr<T>() : nullptr, static_cast<T>(o.lr),
        static_cast<T>(o.momentum), static_cast<T>(o.weight_decay), static_cast<T>(o.grad_scale), o.grad_scale != 1.0,
        o.weight_decay != 0.0, lp);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWOptions& o,
                const Tensor& lowp) {
  check_same_numel(param, grad, "adamw_step");
  if (lowp.defined()) {
    MT_CHECK(lowp.dtype() == DType::kBF16 && param.dtype() == DType::kF32, "adamw_step: lowp must be bf16 for fp32 parameters");
    check_same_numel(param, lowp, "adamw_step");
  }
  check_same_numel(param, m, "adamw_step");
  check_same_numel(param, v, "adamw_step");
  MT_CHECK(o.step >= 1, "adamw_step: step is 1-based");
  check_on_gpu({&param, &grad, &m, &v, &lowp}, "adamw_step");
  // Host constants: the CPU twin's expressions, verbatim.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  float_types(param.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    T *p = param.ptr<T>(), *mp = m.ptr<T>(), *vp = v.ptr<T>();
    const T* g = grad.ptr<T>();
    AdamConsts<T> k;
    k.decay = static_cast<T>(1.0 - o.lr * o.weight_decay);
    k.b1 = static_cast<T>(o.beta1);
    k.b2 = static_cast<T>(o.beta2);
    k.one_minus_b1 = T(1) - k.b1;
    k.one_minus_b2 = T(1) - k.b2;
    k.eps = static_cast<T>(o.eps);
    k.step = static_cast<T>(o.lr / bc1);
    k.rbc2 = static_cast<T>(1.0 / std::sqrt(bc2));
    k.gs = static_cast<T>(o.grad_scale);
    const bool scaled = o.grad_scale != 1.0;
    bf16* lp = lowp.defined() ? lowp.ptr<bf16>() : nullptr;
    const int64_t n = param.numel();
    if (n == 0) return;
    adamw_k<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, p, g, mp, vp, k, scaled, lp);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
