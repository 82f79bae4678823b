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

template <typename T>
MT_HOST_DEVICE inline T sigmoid_of(T x) {
  return T(1) / (T(1) + exp_of(-x));
}
// Megatron's guard against an all-zero sum of sigmoid scores.
template <typename T>
MT_HOST_DEVICE inline T sigmoid_eps() {
  return T(1e-20);
}

// Group-limited routing's limits (checked where the flags are read).
inline constexpr int64_t kMaxGroupTopk = 32;  // groups chosen per token
inline constexpr int64_t kMaxPerGroup = 32;   // top-k / group-topk scores summed per group

// The top k experts by key(e) (largest first, the lower expert on ties) into
// it. With groups G > 0 (--moe-router-num-groups, --moe-router-group-topk
// gk): the experts form G equal groups; a group's score is the sum of its
// k / gk largest keys; only the gk best groups' experts (the lower group on
// ties) may be chosen (Megatron's group_limited_topk).
template <typename T, typename Key>
MT_HOST_DEVICE inline void select_topk(int64_t E, int64_t k, int64_t G, int64_t gk, Key key, int32_t* it) {
  int32_t chosen[kMaxGroupTopk];
  int64_t nchosen = 0;
  if (G > 0 && gk > 0) {
    const int64_t Eg = E / G, m = k / gk;
    auto group_score = [&](int64_t g) {
      T best[kMaxPerGroup];  // the m largest keys of group g, descending
      int64_t n = 0;
      for (int64_t e = g * Eg; e < (g + 1) * Eg; ++e) {
        const T v = key(e);
        int64_t i = n < m ? n++ : m;
        if (i == m && !(v > best[m - 1])) continue;
        if (i == m) i = m - 1;
        while (i > 0 && v > best[i - 1]) best[i] = best[i - 1], --i;
        best[i] = v;
      }
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += best[i];
      return s;
    };
    for (int64_t j = 0; j < gk; ++j) {
      int64_t bg = -1;
      T bs = 0;
      for (int64_t g = 0; g < G; ++g) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == g;
        if (taken) continue;
        const T sc = group_score(g);
        if (bg < 0 || sc > bs) bg = g, bs = sc;
      }
      chosen[nchosen++] = static_cast<int32_t>(bg);
    }
  }
  auto allowed = [&](int64_t e) {
    if (nchosen == 0) return true;
    const int64_t g = e / (E / G);
    for (int64_t i = 0; i < nchosen; ++i)
      if (chosen[i] == g) return true;
    return false;
  };
  for (int64_t j = 0; j < k; ++j) {  // the largest key not yet taken
    int64_t best = -1;
    T bv = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (!allowed(e)) continue;
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || it[i] == e;
      const T v = key(e);
      if (!taken && (best < 0 || v > bv)) best = e, bv = v;
    }
    it[j] = static_cast<int32_t>(best);
  }
}

// l [E] logits -> s [E] softmax, *z log-sum-exp, it [k] the top-k experts
// (largest first, the lower expert on ties), p [k] their probabilities.
// sig (--moe-router-score-function sigmoid): s the sigmoids normalised to
// sum 1 (the load-balancing loss's scores), the top k by sigmoid + b (b:
// the expert bias, may be null), p the chosen sigmoids normalised over the
// k (k > 1) or the sigmoid itself (k = 1); *z stays the logits' lse.
template <typename T>
MT_HOST_DEVICE inline void route(const T* l, int64_t E, int64_t k, bool pre, bool sig, const T* b, int64_t G,
                                 int64_t gk, T scale, int32_t* it, T* p, T* s, T* z) {
  T mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += exp_of(l[e] - mx);
  *z = mx + log_of(sum);
  if (sig) {
    T ss = 0;
    for (int64_t e = 0; e < E; ++e) ss += sigmoid_of(l[e]);
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid_of(l[e]) / (ss + sigmoid_eps<T>());
    select_topk<T>(E, k, G, gk, [&](int64_t e) { return sigmoid_of(l[e]) + (b ? b[e] : T(0)); }, it);
    T q = 0;
    for (int64_t j = 0; j < k; ++j) q += sigmoid_of(l[it[j]]);
    for (int64_t j = 0; j < k; ++j) p[j] = scale * (k > 1 ? sigmoid_of(l[it[j]]) / (q + sigmoid_eps<T>()) : sigmoid_of(l[it[j]]));
    return;
  }
  for (int64_t e = 0; e < E; ++e) s[e] = exp_of(l[e] - mx) / sum;
  // The top k by logit, the order of the softmax too; with groups the group
  // scores sum the logits, or with pre_softmax the probabilities (Megatron's).
  if (pre && G > 0 && gk > 0) select_topk<T>(E, k, G, gk, [&](int64_t e) { return s[e]; }, it);
  else select_topk<T>(E, k, G, gk, [&](int64_t e) { return l[e]; }, it);
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
// (a may be null), from route()'s outputs it, p, s and lse; with sig, from
// the logits l (route's input) instead of p and s.
template <typename T>
MT_HOST_DEVICE inline void route_backward(const T* dp, const int32_t* it, const T* p, const T* s, T lse, const T* a,
                                          T zz, int64_t E, int64_t k, bool pre, bool sig, const T* l, T scale, T* dl) {
  if (sig) {
    // d/d(sigmoid_e): the normalised scores' (a), the chosen probabilities'.
    T ss = 0;
    for (int64_t e = 0; e < E; ++e) ss += sigmoid_of(l[e]);
    ss += sigmoid_eps<T>();
    T as = 0;  // sum_e a_e sigma_e / ss
    if (a)
      for (int64_t e = 0; e < E; ++e) as += a[e] * sigmoid_of(l[e]) / ss;
    for (int64_t e = 0; e < E; ++e) dl[e] = a ? (a[e] - as) / ss : T(0);
    if (k > 1) {
      T q = 0, pd = 0;
      for (int64_t j = 0; j < k; ++j) q += sigmoid_of(l[it[j]]);
      q += sigmoid_eps<T>();
      for (int64_t j = 0; j < k; ++j) pd += dp[j] * sigmoid_of(l[it[j]]) / q;
      for (int64_t j = 0; j < k; ++j) dl[it[j]] += scale * (dp[j] - pd) / q;
    } else {
      dl[it[0]] += scale * dp[0];
    }
    for (int64_t e = 0; e < E; ++e) {
      const T sg = sigmoid_of(l[e]);
      dl[e] = sg * (T(1) - sg) * dl[e] + 2 * zz * lse * exp_of(l[e] - lse);
    }
    return;
  }
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

// moe_drop's order among the slots of one expert in one segment: whether
// slot (prob pj, token tj) comes before slot (pi, ti): the larger prob
// first, the earlier token on ties (a NaN prob last); by_position: the
// earlier token. A strict weak order (std::nth_element needs one).
template <typename T>
MT_HOST_DEVICE inline bool drop_before(T pj, int64_t tj, T pi, int64_t ti, bool by_position) {
  if (by_position) return tj < ti;
  const bool nj = pj != pj, ni = pi != pi;
  if (nj || ni) return nj == ni ? tj < ti : ni;
  return pj > pi || (pj == pi && tj < ti);
}

}  // namespace mt::kernels::moe_row
