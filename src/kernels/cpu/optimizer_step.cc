#include "kernels/optimizer_step.h"

#include <cmath>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/elementwise.h"

namespace mt::kernels {
namespace cpu {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWOptions& o,
                const Tensor& lowp) {
  check_same_numel(param, grad, "adamw_step");
  if (lowp.defined()) {
    MT_CHECK((lowp.dtype() == DType::kBF16 || lowp.dtype() == DType::kF16) && param.dtype() == DType::kF32,
             "adamw_step: lowp must be bf16 or fp16 for fp32 parameters");
    check_same_numel(param, lowp, "adamw_step");
  }
  check_same_numel(param, m, "adamw_step");
  check_same_numel(param, v, "adamw_step");
  MT_CHECK(o.step >= 1, "adamw_step: step is 1-based");
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  float_types(param.dtype(), [&](auto tag_) { using T = decltype(tag_);
    T *p = param.ptr<T>(), *mp = m.ptr<T>(), *vp = v.ptr<T>();
    const T* g = grad.ptr<T>();
    const T decay = static_cast<T>(1.0 - o.lr * o.weight_decay),
            b1 = static_cast<T>(o.beta1), b2 = static_cast<T>(o.beta2), eps = static_cast<T>(o.eps),
            step = static_cast<T>(o.lr / bc1), rbc2 = static_cast<T>(1.0 / std::sqrt(bc2)),
            gs = static_cast<T>(o.grad_scale);
    const bool scaled = o.grad_scale != 1.0;
    // lowp_tag: std::false_type (no copy), bf16 or f16 (the copy's type).
    auto body = [&](auto scale_on, auto lowp_tag) {
      using L = decltype(lowp_tag);
      L* lp = nullptr;
      if constexpr (!std::is_same_v<L, std::false_type>) lp = lowp.ptr<L>();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < param.numel(); ++i) {
        T gi = g[i];
        if constexpr (decltype(scale_on)::value) gi = gi * gs;
        T mi = b1 * mp[i] + (T(1) - b1) * gi;
        T vi = b2 * vp[i] + (T(1) - b2) * gi * gi;
        mp[i] = mi;
        vp[i] = vi;
        const T pi = p[i] * decay - step * mi / (std::sqrt(vi) * rbc2 + eps);
        p[i] = pi;
        if constexpr (!std::is_same_v<L, std::false_type>) lp[i] = to_out<L>(static_cast<float>(pi));
      }
    };
    using yes = std::true_type;
    using no = std::false_type;
    auto with_lowp = [&](auto scale_on) {
      if constexpr (std::is_same_v<T, float>) {
        if (lowp.defined() && lowp.dtype() == DType::kBF16) return body(scale_on, bf16{});
        if (lowp.defined()) {  // fp16: the updated parameters rounded in one vectorised pass after
          body(scale_on, no{});
          return f16_round_n(param.ptr<float>(), lowp.ptr<f16>(), param.numel());
        }
      }
      body(scale_on, no{});
    };
    if (scaled) with_lowp(yes{});
    else with_lowp(no{});
  });
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDOptions& o, const Tensor& lowp) {
  check_same_numel(param, grad, "sgd_step");
  if (lowp.defined()) {
    MT_CHECK((lowp.dtype() == DType::kBF16 || lowp.dtype() == DType::kF16) && param.dtype() == DType::kF32,
             "sgd_step: lowp must be bf16 or fp16 for fp32 parameters");
    check_same_numel(param, lowp, "sgd_step");
  }
  const bool momentum = o.momentum != 0.0 && param.numel() > 0;
  MT_CHECK(!momentum || buf.defined(), "sgd_step: momentum != 0 needs a momentum buffer");
  if (momentum) check_same_numel(param, buf, "sgd_step");
  float_types(param.dtype(), [&](auto tag_) { using T = decltype(tag_);
    T* p = param.ptr<T>();
    T* bp = momentum ? buf.ptr<T>() : nullptr;
    const T* g = grad.ptr<T>();
    const T lr = static_cast<T>(o.lr), mu = static_cast<T>(o.momentum), wd = static_cast<T>(o.weight_decay),
            gs = static_cast<T>(o.grad_scale);
    const int64_t n = param.numel();
    bf16* lb = nullptr;
    if constexpr (std::is_same_v<T, float>)
      if (lowp.defined() && lowp.dtype() == DType::kBF16) lb = lowp.ptr<bf16>();
    // One loop per combination of the options, decided at compile time (no
    // branch in the vectorised loop).
    auto body = [&](auto scaled, auto decay, auto mom, auto copy) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        T gi = g[i];
        if constexpr (decltype(scaled)::value) gi = gi * gs;
        if constexpr (decltype(decay)::value) gi = gi + wd * p[i];
        if constexpr (decltype(mom)::value) {
          gi = mu * bp[i] + gi;
          bp[i] = gi;
        }
        const T pi = p[i] - lr * gi;
        p[i] = pi;
        if constexpr (decltype(copy)::value) lb[i] = to_out<bf16>(static_cast<float>(pi));
      }
    };
    using yes = std::true_type;
    using no = std::false_type;
    auto with_copy = [&](auto... on) { lb ? body(on..., yes{}) : body(on..., no{}); };
    auto with_mom = [&](auto... on) { momentum ? with_copy(on..., yes{}) : with_copy(on..., no{}); };
    auto with_decay = [&](auto... on) { o.weight_decay != 0.0 ? with_mom(on..., yes{}) : with_mom(on..., no{}); };
    o.grad_scale != 1.0 ? with_decay(yes{}) : with_decay(no{});
    if constexpr (std::is_same_v<T, float>)
      if (lowp.defined() && lowp.dtype() == DType::kF16) f16_round_n(p, lowp.ptr<f16>(), n);
  });
}

}  // namespace cpu

double global_grad_norm(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const Tensor& g : grads) s += sum_squares(g);
  return std::sqrt(s);
}

double clip_grad_norm(const std::vector<Tensor>& grads, double clip) {
  double norm = global_grad_norm(grads);
  double coeff = clip / (norm + 1e-6);
  if (coeff < 1.0)
    for (const Tensor& g : grads) scale_inplace(g, coeff);
  return norm;
}

}  // namespace mt::kernels
