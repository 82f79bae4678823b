#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/common.h"
#include "kernels/cpu/vec_math.h"

namespace mt::kernels::cpu {
namespace {

inline int64_t target_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI32 ? t.ptr<int32_t>()[i] : t.ptr<int64_t>()[i];
}

template <typename T>
void partials(int64_t N, int64_t V, const T* lg, const Tensor& tg, int64_t v0, T* mx, T* se, T* tl) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* r = lg + i * V;
    T m = r[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < V; ++j) m = std::max(m, r[j]);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += vexp(r[j] - m);
    int64_t t = target_at(tg, i) - v0;
    mx[i] = m;
    se[i] = s;
    tl[i] = (t >= 0 && t < V) ? r[t] : T(0);
  }
}

template <typename T>
void backward(int64_t N, int64_t V, const T* lg, const Tensor& tg, int64_t v0, const T* mx, const T* se,
              const T* dl, T* dlg) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* r = lg + i * V;
    T* d = dlg + i * V;
    int64_t tgt = target_at(tg, i);
    T g = tgt < 0 ? T(0) : dl[i], m = mx[i], inv = T(1) / se[i];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = g * vexp(r[j] - m) * inv;
    int64_t t = tgt - v0;
    if (tgt >= 0 && t >= 0 && t < V) d[t] -= g;
  }
}

// dlogits in bf16 or fp16: the same float arithmetic as backward<float>,
// rounded as it is written (no fp32 [N, V] pass and no separate cast).
template <typename H>
void backward_half(int64_t N, int64_t V, const float* lg, const Tensor& tg, int64_t v0, const float* mx,
                   const float* se, const float* dl, H* out) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* r = lg + i * V;
    H* d = out + i * V;
    const int64_t tgt = target_at(tg, i);
    const float g = tgt < 0 ? 0.0f : dl[i], m = mx[i], inv = 1.0f / se[i];
    const int64_t t = tgt - v0;
    const bool has_target = tgt >= 0 && t >= 0 && t < V;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = to_out<H>(g * vexp(r[j] - m) * inv);
    if (has_target) d[t] = to_out<H>(g * vexp(r[t] - m) * inv - g);
  }
}

void check_targets(const Tensor& t, int64_t N) {
  MT_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64, "cross entropy: targets must be int32 or int64");
  MT_CHECK(t.numel() == N, "cross entropy: one target per row");
}

}  // namespace

void xent_partials(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                   const Tensor& sumexp, const Tensor& target_logit) {
  int64_t V = logits.dim(-1), N = logits.numel() / V;
  check_targets(targets, N);
  MT_FLOAT_TYPES(logits.dtype(), T,
                 partials<T>(N, V, logits.ptr<T>(), targets, v0, max.ptr<T>(), sumexp.ptr<T>(),
                             target_logit.ptr<T>()));
}

void xent_rescale(const Tensor& sumexp, const Tensor& local_max, const Tensor& global_max) {
  float_types(sumexp.dtype(), [&](auto tag_) { using T = decltype(tag_);
    for (int64_t i = 0; i < sumexp.numel(); ++i)
      sumexp.ptr<T>()[i] *= std::exp(local_max.ptr<T>()[i] - global_max.ptr<T>()[i]);
  });
}

void xent_loss(const Tensor& max, const Tensor& sumexp, const Tensor& target_logit, const Tensor& targets,
               const Tensor& loss) {
  check_targets(targets, loss.numel());
  float_types(loss.dtype(), [&](auto tag_) { using T = decltype(tag_);
    for (int64_t i = 0; i < loss.numel(); ++i)
      loss.ptr<T>()[i] = target_at(targets, i) < 0
                             ? T(0)
                             : std::log(sumexp.ptr<T>()[i]) + max.ptr<T>()[i] - target_logit.ptr<T>()[i];
  });
}

void xent_backward(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                   const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  int64_t V = logits.dim(-1), N = logits.numel() / V;
  check_targets(targets, N);
  MT_CHECK(dlogits.numel() == logits.numel(), "xent_backward: dlogits size");
  MT_FLOAT_TYPES(logits.dtype(), T,
                 backward<T>(N, V, logits.ptr<T>(), targets, v0, max.ptr<T>(), sumexp.ptr<T>(), dloss.ptr<T>(),
                             dlogits.ptr<T>()));
}

void xent_backward_half(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                        const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  int64_t V = logits.dim(-1), N = logits.numel() / V;
  check_targets(targets, N);
  MT_CHECK(logits.dtype() == DType::kF32 && (dlogits.dtype() == DType::kBF16 || dlogits.dtype() == DType::kF16) &&
               dlogits.numel() == logits.numel(),
           "xent_backward_half: fp32 logits [N, V] and bf16 or fp16 dlogits [N, V]");
  if (dlogits.dtype() == DType::kBF16)
    backward_half(N, V, logits.ptr<float>(), targets, v0, max.ptr<float>(), sumexp.ptr<float>(), dloss.ptr<float>(),
                  dlogits.ptr<bf16>());
  else
    backward_half(N, V, logits.ptr<float>(), targets, v0, max.ptr<float>(), sumexp.ptr<float>(), dloss.ptr<float>(),
                  dlogits.ptr<f16>());
}

}  // namespace mt::kernels::cpu
