#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/moe_row.h"

namespace mt::kernels::cpu {
namespace {

void check_route_shapes(const Tensor& logits, const Tensor& idx, const Tensor& probs, const Tensor& scores,
                        const Tensor& lse, const char* op) {
  MT_CHECK(logits.ndim() == 2, std::string(op) + ": logits must be [N, E]");
  const int64_t N = logits.dim(0), E = logits.dim(1);
  MT_CHECK(idx.ndim() == 2 && idx.dim(0) == N && idx.dtype() == DType::kI32 && idx.dim(1) >= 1 && idx.dim(1) <= E,
           std::string(op) + ": idx must be [N, k] int32 with 1 <= k <= E");
  MT_CHECK(probs.numel() == idx.numel() && probs.dtype() == logits.dtype(), std::string(op) + ": probs must be [N, k]");
  MT_CHECK(scores.numel() == N * E && scores.dtype() == logits.dtype(), std::string(op) + ": scores must be [N, E]");
  MT_CHECK(lse.numel() == N && lse.dtype() == logits.dtype(), std::string(op) + ": lse must be [N]");
}

// Every slot of pos is -1 (dropped) or a row of y's M.
void check_slots(const Tensor& pos, int64_t M, const char* op) {
  const int32_t* ps = pos.ptr<int32_t>();
  for (int64_t i = 0; i < pos.numel(); ++i)
    MT_CHECK(ps[i] >= -1 && ps[i] < M, std::string(op) + ": a slot of pos is outside y's rows");
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouter& router, const Tensor& bias, const Tensor& idx,
               const Tensor& probs, const Tensor& scores, const Tensor& lse) {
  check_route_shapes(logits, idx, probs, scores, lse, "moe_route");
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  MT_CHECK(!bias.defined() || (bias.numel() == E && bias.dtype() == logits.dtype() && router.sigmoid),
           "moe_route: the expert bias must be [E] in the logits' dtype, with the sigmoid score function");
  check_groups(router, E, k);
  float_types(logits.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const T* l = logits.ptr<T>();
    const T* b = opt_ptr<T>(bias);
    T *p = probs.ptr<T>(), *s = scores.ptr<T>(), *z = lse.ptr<T>();
    int32_t* ix = idx.ptr<int32_t>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t)
      moe_row::route(l + t * E, E, k, router.pre_softmax, router.sigmoid, b, router.num_groups, router.group_topk,
                     static_cast<T>(router.scale), ix + t * k, p + t * k, s + t * E, z + t);
  });
}

void moe_route_backward(const Tensor& dprobs, const Tensor& idx, const Tensor& probs, const Tensor& scores,
                        const Tensor& lse, const Tensor& aux, double z, const MoeRouter& router, const Tensor& logits,
                        const Tensor& dlogits) {
  check_route_shapes(dlogits, idx, probs, scores, lse, "moe_route_backward");
  const int64_t N = dlogits.dim(0), E = dlogits.dim(1), k = idx.dim(1);
  MT_CHECK(dprobs.numel() == N * k && dprobs.dtype() == dlogits.dtype(), "moe_route_backward: dprobs must be [N, k]");
  const int64_t G = aux.defined() ? aux.numel() / E : 1;  // aux rows: token t reads row t mod G
  MT_CHECK(!aux.defined() || (aux.numel() == G * E && G >= 1 && aux.dtype() == dlogits.dtype()),
           "moe_route_backward: aux must be [E] or [G, E]");
  MT_CHECK(!router.sigmoid || (logits.numel() == N * E && logits.dtype() == dlogits.dtype()),
           "moe_route_backward: the sigmoid score function needs the logits [N, E]");
  float_types(dlogits.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const T *dp = dprobs.ptr<T>(), *p = probs.ptr<T>(), *s = scores.ptr<T>(), *zl = lse.ptr<T>();
    const T* a = opt_ptr<T>(aux);
    const T* l = opt_ptr<T>(logits);
    const int32_t* ix = idx.ptr<int32_t>();
    T* dl = dlogits.ptr<T>();
    const T sc = static_cast<T>(router.scale), zz = static_cast<T>(z);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t)
      moe_row::route_backward(dp + t * k, ix + t * k, p + t * k, s + t * E, zl[t], a ? a + (t % G) * E : nullptr, zz,
                              E, k, router.pre_softmax,
                              router.sigmoid, l ? l + t * E : nullptr, sc, dl + t * E);
  });
}

void moe_drop(const Tensor& idx, const Tensor& probs, int64_t segments, int64_t capacity, bool by_position,
              const Tensor& kept) {
  MT_CHECK(idx.ndim() == 2 && idx.dtype() == DType::kI32 && kept.dtype() == DType::kI32 &&
               kept.numel() == idx.numel() && probs.numel() == idx.numel(),
           "moe_drop: idx and kept [N, k] int32, probs [N, k]");
  const int64_t N = idx.dim(0), k = idx.dim(1);
  MT_CHECK(segments >= 1 && N % segments == 0 && capacity >= 0,
           "moe_drop: the tokens must split into equal segments and the capacity be >= 0");
  const int64_t Ns = N / segments;
  float_types(probs.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const int32_t* ix = idx.ptr<int32_t>();
    const T* p = probs.ptr<T>();
    int32_t* kp = kept.ptr<int32_t>();
    std::memcpy(kp, ix, static_cast<size_t>(N * k) * sizeof(int32_t));
    std::vector<std::vector<int64_t>> by_expert;  // one segment's slots (t k + j) per expert
    for (int64_t s = 0; s < segments; ++s) {
      for (auto& v : by_expert) v.clear();
      for (int64_t i = s * Ns * k; i < (s + 1) * Ns * k; ++i) {
        MT_CHECK(ix[i] >= 0, "moe_drop: expert index out of range");
        if (static_cast<size_t>(ix[i]) >= by_expert.size()) by_expert.resize(static_cast<size_t>(ix[i]) + 1);
        by_expert[static_cast<size_t>(ix[i])].push_back(i);
      }
      for (auto& v : by_expert) {
        if (static_cast<int64_t>(v.size()) <= capacity) continue;
        // Slot numbers ascend with the token, so the token order is the slot order.
        std::nth_element(v.begin(), v.begin() + capacity, v.end(), [&](int64_t a, int64_t b) {
          return moe_row::drop_before(p[a], a / k, p[b], b / k, by_position);
        });
        for (auto it = v.begin() + capacity; it != v.end(); ++it) kp[*it] = -1;
      }
    }
  });
}

void moe_dispatch_map(const Tensor& idx, const Tensor& counts, const Tensor& src, const Tensor& pos) {
  const int64_t N = idx.dim(0), k = idx.dim(1), E = counts.numel();
  MT_CHECK(idx.dtype() == DType::kI32 && counts.dtype() == DType::kI32 && src.dtype() == DType::kI32 &&
               pos.dtype() == DType::kI32,
           "moe_dispatch_map: int32 tensors expected");
  MT_CHECK(src.numel() == N * k && pos.numel() == N * k, "moe_dispatch_map: src and pos must have N k elements");
  const int32_t* ix = idx.ptr<int32_t>();
  int32_t *c = counts.ptr<int32_t>(), *sr = src.ptr<int32_t>(), *ps = pos.ptr<int32_t>();
  std::fill(c, c + E, 0);
  for (int64_t i = 0; i < N * k; ++i) {
    MT_CHECK(ix[i] >= -1 && ix[i] < E, "moe_dispatch_map: expert index out of range");
    if (ix[i] >= 0) ++c[ix[i]];
  }
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int64_t e = 1; e < E; ++e) next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + c[e - 1];
  for (int64_t i = 0; i < N * k; ++i) {  // tokens ascending: each expert's slots in token order
    if (ix[i] < 0) {  // dropped
      ps[i] = -1;
      continue;
    }
    const int64_t p = next[static_cast<size_t>(ix[i])]++;
    ps[i] = static_cast<int32_t>(p);
    sr[p] = static_cast<int32_t>(i / k);
  }
}

void moe_permute(const Tensor& x, const Tensor& src, const Tensor& out) {
  MT_CHECK(x.dtype() == out.dtype(), "moe_permute: x and out must have one dtype");
  const int64_t C = x.dim(-1), M = src.numel(), N = x.numel() / C;
  MT_CHECK(out.numel() == M * C, "moe_permute: out must be [M, C]");
  const size_t row = static_cast<size_t>(C) * dtype_size(x.dtype());
  const char* xp = static_cast<const char*>(x.data());
  char* op = static_cast<char*>(out.data());
  const int32_t* s = src.ptr<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < M; ++p) {
    MT_CHECK(s[p] >= 0 && s[p] < N, "moe_permute: source row out of range");
    std::memcpy(op + static_cast<size_t>(p) * row, xp + static_cast<size_t>(s[p]) * row, row);
  }
}

void moe_unpermute(const Tensor& y, const Tensor& pos, const Tensor& probs, const Tensor& out) {
  const int64_t C = out.dim(-1), N = out.numel() / C, k = pos.numel() / std::max<int64_t>(N, 1);
  MT_CHECK(pos.numel() == N * k && y.numel() % std::max<int64_t>(C, 1) == 0 && y.numel() <= N * k * C,
           "moe_unpermute: y [M <= N k, C], pos [N, k], out [N, C]");
  check_slots(pos, y.numel() / std::max<int64_t>(C, 1), "moe_unpermute");
  storage_types(y.dtype(), [&](auto ytag) { using S = decltype(ytag); using T = compute_t<S>;
    storage_types(out.dtype(), [&](auto otag) { using Y = decltype(otag);
      MT_CHECK(!probs.defined() || (probs.dtype() == dtype_of<T>() && probs.numel() == N * k),
               "moe_unpermute: probs must be [N, k] in the compute type (fp32 for bf16 y)");
      const S* yp = y.ptr<S>();
      const T* w = opt_ptr<T>(probs);
      const int32_t* ps = pos.ptr<int32_t>();
      Y* o = out.ptr<Y>();
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t c = 0; c < C; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < k; ++j) {
            if (ps[t * k + j] < 0) continue;  // dropped
            const T v = ld<T>(yp[static_cast<int64_t>(ps[t * k + j]) * C + c]);
            acc += w ? w[t * k + j] * v : v;
          }
          o[t * C + c] = to_out<Y>(acc);
        }
    });
  });
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& pos, const Tensor& probs,
                            const Tensor& dy, const Tensor& dprobs) {
  const int64_t C = dout.dim(-1), N = dout.numel() / C, k = pos.numel() / std::max<int64_t>(N, 1);
  MT_CHECK(pos.numel() == N * k && y.numel() % std::max<int64_t>(C, 1) == 0 && y.numel() <= N * k * C &&
               dy.numel() == y.numel() && probs.numel() == N * k &&
               dprobs.numel() == N * k && probs.dtype() == dprobs.dtype(),
           "moe_unpermute_backward: dout [N, C], y and dy [M <= N k, C], pos, probs and dprobs [N, k]");
  check_slots(pos, y.numel() / std::max<int64_t>(C, 1), "moe_unpermute_backward");
  float_types(probs.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    x_types<T>(dout.dtype(), "moe_unpermute_backward", "dout", [&](auto otag) {
      x_types<T>(y.dtype(), "moe_unpermute_backward", "y", [&](auto ytag) {
        x_types<T>(dy.dtype(), "moe_unpermute_backward", "dy", [&](auto dtag) {
          using SO = decltype(otag);
          using SY = decltype(ytag);
          using SD = decltype(dtag);
          {
            const SO* d = dout.ptr<SO>();
            const SY* yp = y.ptr<SY>();
            const T* w = probs.ptr<T>();
            const int32_t* ps = pos.ptr<int32_t>();
            SD* dyp = dy.ptr<SD>();
            T* dw = dprobs.ptr<T>();
#pragma omp parallel for schedule(static)
            for (int64_t t = 0; t < N; ++t)
              for (int64_t j = 0; j < k; ++j) {
                const int64_t p = ps[t * k + j];
                if (p < 0) {  // dropped: no row, no gradient
                  dw[t * k + j] = 0;
                  continue;
                }
                T dot = 0;
                for (int64_t c = 0; c < C; ++c) {
                  const T g = ld<T>(d[t * C + c]);
                  dot += g * ld<T>(yp[p * C + c]);
                  dyp[p * C + c] = to_out<SD>(w[t * k + j] * g);
                }
                dw[t * k + j] = dot;
              }
          }
        });
      });
    });
  });
}

void moe_sigmoid(const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "moe_sigmoid");
  MT_CHECK(x.dtype() == y.dtype(), "moe_sigmoid: x and y must share one dtype");
  float_types(y.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const T* xp = x.ptr<T>();
    T* yp = y.ptr<T>();
    for (int64_t i = 0; i < y.numel(); ++i) yp[i] = moe_row::sigmoid_of(xp[i]);
  });
}

void moe_sigmoid_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_numel(y, dx, "moe_sigmoid_backward");
  check_same_numel(dy, dx, "moe_sigmoid_backward");
  MT_CHECK(y.dtype() == dx.dtype() && dy.dtype() == dx.dtype(), "moe_sigmoid_backward: y, dy and dx must share one dtype");
  float_types(dx.dtype(), [&](auto tag_) { using T = decltype(tag_);
    const T *yp = y.ptr<T>(), *g = dy.ptr<T>();
    T* d = dx.ptr<T>();
    for (int64_t i = 0; i < dx.numel(); ++i) d[i] = g[i] * yp[i] * (T(1) - yp[i]);
  });
}

}  // namespace mt::kernels::cpu
