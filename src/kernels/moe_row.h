#pragma once
// One token's routing and its gradient (kernels/moe.h has the contract):
// header functions the CPU twin's loop and the CUDA twin's thread per token
// both call, so the two compute the same arithmetic in the same order.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/hostdev.h"

namespace mt::kernels::moe_row {

template <typename T>
MT_HOST_DEVICE inline T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return expf(x);
  else return exp(x);
}
template <typename T>
MT_HOST_DEVICE inline T log_of(T x) {
  if constexpr (std::is_same_v<T, float>) return logf(x);
  else return log(x);
}

// l [E] logits -> s [E] softmax, *z log-sum-exp, it [k] the top-k experts
// (largest first, the lower expert on ties), p [k] their probabilities.
template <typename T>
MT_HOST_DEVICE inline void route(const T* l, int64_t E, int64_t k, bool pre, T scale, int32_t* it, T* p, T* s, T* z) {
  T mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += exp_of(l[e] - mx);
  *z = mx + log_of(sum);
  for (int64_t e = 0; e < E; ++e) s[e] = exp_of(l[e] - mx) / sum;
  // Top k by repeated selection: the largest logit not yet taken.
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || it[i] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = e;
    }
    it[j] = static_cast<int32_t>(best);
  }
  if (pre) {
    for (int64_t j = 0; j < k; ++j) p[j] = scale * s[it[j]];
  } else {
    const T top = l[it[0]];  // the largest chosen logit
    T ssum = 0;
    for (int64_t j = 0; j < k; ++j) ssum += exp_of(l[it[j]] - top);
    for (int64_t j = 0; j < k; ++j) p[j] = scale * (exp_of(l[it[j]] - top) / ssum);
  }
}

// dl [E] = d/d(logits) of sum_j dp[j] p[j] + sum_e a[e] s[e] + zz lse^2
// (a may be null), from route()'s outputs it, p, s and lse.
template <typename T>
MT_HOST_DEVICE inline void route_backward(const T* dp, const int32_t* it, const T* p, const T* s, T lse, const T* a,
                                          T zz, int64_t E, int64_t k, bool pre, T scale, T* dl) {
  // d(loss)/d(scores): the aux loss, and the chosen probabilities with pre_softmax.
  for (int64_t e = 0; e < E; ++e) dl[e] = a ? a[e] : T(0);
  if (pre)
    for (int64_t j = 0; j < k; ++j) dl[it[j]] += scale * dp[j];
  T dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += s[e] * dl[e];
  for (int64_t e = 0; e < E; ++e) dl[e] = s[e] * (dl[e] - dot) + 2 * zz * lse * s[e];
  if (!pre) {  // the softmax over the chosen logits: p^ = probs / scale
    T ds = 0;
    for (int64_t j = 0; j < k; ++j) ds += (p[j] / scale) * (scale * dp[j]);
    for (int64_t j = 0; j < k; ++j) dl[it[j]] += (p[j] / scale) * (scale * dp[j] - ds);
  }
}

}  // namespace mt::kernels::moe_row
