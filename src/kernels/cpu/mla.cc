#include "kernels/mla.h"

#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"

namespace mt::kernels::cpu {

void mla_pack(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& m, const Tensor& qkv) {
  check_mla(m, q, kv, kpe, qkv, "mla_pack");
  MT_CHECK(kpe.dtype() == qkv.dtype(), "mla_pack: kpe must have qkv's dtype");
  storage_types(qkv.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const int64_t a = m.heads, dn = m.dn, dr = m.dr, dv = m.dv, D = m.D();
    const S* Q = q.ptr<S>();
    const S* KV = kv.ptr<S>();
    const S* P = kpe.ptr<S>();
    S* X = qkv.ptr<S>();
    const size_t es = sizeof(S);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m.tokens; ++r)
      for (int64_t h = 0; h < a; ++h) {
        const S* qh = Q + (r * a + h) * D;
        const S* kvh = KV + (r * a + h) * (dn + dv);
        S* x = X + (r * a + h) * 3 * D;
        std::memcpy(x, qh + dn, es * dr);            // q: pe
        std::memcpy(x + dr, qh, es * dn);            //    nope
        std::memcpy(x + D, P + r * dr, es * dr);     // k: the shared pe
        std::memcpy(x + D + dr, kvh, es * dn);       //    nope
        std::memcpy(x + 2 * D, kvh + dn, es * dv);   // v
        std::memset(static_cast<void*>(x + 2 * D + dv), 0, es * (D - dv));
      }
  });
}

void mla_unpack(const Tensor& dqkv, const MlaDims& m, const Tensor& dq, const Tensor& dkv, const Tensor& dkpe) {
  check_mla(m, dq, dkv, dkpe, dqkv, "mla_unpack");
  const bool dkpe_storage = mla_dkpe_in_storage_type(dkpe, dqkv, "mla_unpack");
  storage_types(dqkv.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using T = compute_t<S>;
    const auto run = [&](auto ytag) {
      using Y = decltype(ytag);
      const int64_t a = m.heads, dn = m.dn, dr = m.dr, dv = m.dv, D = m.D();
      const S* X = dqkv.ptr<S>();
      S* Q = dq.ptr<S>();
      S* KV = dkv.ptr<S>();
      Y* P = dkpe.ptr<Y>();
      const size_t es = sizeof(S);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < m.tokens; ++r) {
        for (int64_t h = 0; h < a; ++h) {
          const S* x = X + (r * a + h) * 3 * D;
          S* qh = Q + (r * a + h) * D;
          S* kvh = KV + (r * a + h) * (dn + dv);
          std::memcpy(qh + dn, x, es * dr);
          std::memcpy(qh, x + dr, es * dn);
          std::memcpy(kvh, x + D + dr, es * dn);
          std::memcpy(kvh + dn, x + 2 * D, es * dv);
        }
        for (int64_t c = 0; c < dr; ++c) {
          T s = ld<T>(X[r * a * 3 * D + D + c]);
          for (int64_t h = 1; h < a; ++h) s += ld<T>(X[(r * a + h) * 3 * D + D + c]);
          P[r * dr + c] = to_out<Y>(s);
        }
      }
    };
    if (dkpe_storage) return run(S{});
    if constexpr (!std::is_same_v<S, T>) run(T{});
  });
}

void mla_ctx(const Tensor& ctx, const Tensor& ctx_v, const MlaDims& m, bool backward) {
  check_mla_ctx(m, ctx, ctx_v);
  storage_types(ctx.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const int64_t rows = m.tokens * m.heads, D = m.D(), dv = m.dv;
    S* c = ctx.ptr<S>();
    S* v = ctx_v.ptr<S>();
    const size_t es = sizeof(S);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      if (!backward) {
        std::memcpy(v + i * dv, c + i * D, es * dv);
      } else {
        std::memcpy(c + i * D, v + i * dv, es * dv);
        std::memset(static_cast<void*>(c + i * D + dv), 0, es * (D - dv));
      }
    }
  });
}

}  // namespace mt::kernels::cpu
