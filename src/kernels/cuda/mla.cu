// CUDA twins of kernels/cpu/mla.cc (kernels/mla.h): multi-latent
// attention's packing of q, kv and the shared position key into the fused
// QKV layout, its inverse for the gradients, and the attention output's
// value dims. Grid-stride loops, one thread per element written; dkpe's
// sum over the heads runs in one thread per (token, dim), head 0 first, as
// the CPU twin, so both give the same bits.
#include <type_traits>

#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/mla.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

// Item e: element c of slot s (0 q, 1 k, 2 v) of head h of token r in qkv,
// e = ((r a + h) 3 + s) D + c.
template <typename S>
__global__ void mla_pack_k(int64_t n, int64_t a, int64_t dn, int64_t dr, int64_t dv, const S* q, const S* kv,
                           const S* kpe, S* qkv) {
  const int64_t D = dn + dr;
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t rest, c, rh, s;
    divmod(e, D, rest, c);
    divmod(rest, 3, rh, s);
    const int64_t r = rh / a;
    S v;
    if (s == 0) v = c < dr ? q[rh * D + dn + c] : q[rh * D + c - dr];
    else if (s == 1) v = c < dr ? kpe[r * dr + c] : kv[rh * (dn + dv) + c - dr];
    else v = c < dv ? kv[rh * (dn + dv) + dn + c] : to_out<S>(0.0f);
    qkv[e] = v;
  }
}

// Items [0, nq): dq's elements; [nq, nq + nkv): dkv's; the rest dkpe's
// (r, c), summed over the heads in order.
template <typename S, typename Y>
__global__ void mla_unpack_k(int64_t nq, int64_t nkv, int64_t n, int64_t a, int64_t dn, int64_t dr, int64_t dv,
                             const S* x, S* dq, S* dkv, Y* dkpe) {
  using T = compute_t<S>;
  const int64_t D = dn + dr;
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    if (e < nq) {
      int64_t rh, j;
      divmod(e, D, rh, j);
      dq[e] = x[rh * 3 * D + (j < dn ? dr + j : j - dn)];
    } else if (e < nq + nkv) {
      int64_t rh, j;
      divmod(e - nq, dn + dv, rh, j);
      dkv[e - nq] = x[rh * 3 * D + (j < dn ? D + dr + j : 2 * D + j - dn)];
    } else {
      int64_t r, c;
      divmod(e - nq - nkv, dr, r, c);
      const S* k = x + r * a * 3 * D + D + c;
      T sum = ld<T>(k[0]);
      for (int64_t h = 1; h < a; ++h) sum = add_rn(sum, ld<T>(k[h * 3 * D]));
      dkpe[e - nq - nkv] = to_out<Y>(sum);
    }
  }
}

// Item e: element c of row i of ctx_v (forward) or of ctx (backward).
template <typename S>
__global__ void mla_ctx_k(int64_t n, int64_t D, int64_t dv, S* ctx, S* ctx_v, bool backward) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    if (!backward) {
      int64_t i, c;
      divmod(e, dv, i, c);
      ctx_v[e] = ctx[i * D + c];
    } else {
      int64_t i, c;
      divmod(e, D, i, c);
      ctx[e] = c < dv ? ctx_v[i * dv + c] : to_out<S>(0.0f);
    }
  }
}

}  // namespace

void mla_pack(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& m, const Tensor& qkv) {
  check_mla(m, q, kv, kpe, qkv, "mla_pack");
  MT_CHECK(kpe.dtype() == qkv.dtype(), "mla_pack: kpe must have qkv's dtype");
  check_on_gpu({&q, &kv, &kpe, &qkv}, "mla_pack");
  const int64_t n = qkv.numel();
  if (n == 0) return;
  storage_types(qkv.dtype(), [&](auto tag) {
    using S = decltype(tag);
    mla_pack_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, m.heads, m.dn, m.dr, m.dv, q.ptr<S>(),
                                                                       kv.ptr<S>(), kpe.ptr<S>(), qkv.ptr<S>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void mla_unpack(const Tensor& dqkv, const MlaDims& m, const Tensor& dq, const Tensor& dkv, const Tensor& dkpe) {
  check_mla(m, dq, dkv, dkpe, dqkv, "mla_unpack");
  check_on_gpu({&dqkv, &dq, &dkv, &dkpe}, "mla_unpack");
  const bool dkpe_storage = mla_dkpe_in_storage_type(dkpe, dqkv, "mla_unpack");
  const int64_t nq = dq.numel(), nkv = dkv.numel(), n = nq + nkv + dkpe.numel();
  if (n == 0) return;
  storage_types(dqkv.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using T = compute_t<S>;
    const auto run = [&](auto ytag) {
      using Y = decltype(ytag);
      mla_unpack_k<S, Y><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
          nq, nkv, n, m.heads, m.dn, m.dr, m.dv, dqkv.ptr<S>(), dq.ptr<S>(), dkv.ptr<S>(), dkpe.ptr<Y>());
      MT_CUDA_CHECK_LAUNCH();
    };
    if (dkpe_storage) return run(S{});
    if constexpr (!std::is_same_v<S, T>) run(T{});
  });
}

void mla_ctx(const Tensor& ctx, const Tensor& ctx_v, const MlaDims& m, bool backward) {
  check_mla_ctx(m, ctx, ctx_v);
  check_on_gpu({&ctx, &ctx_v}, "mla_ctx");
  const int64_t n = backward ? ctx.numel() : ctx_v.numel();
  if (n == 0) return;
  storage_types(ctx.dtype(), [&](auto tag) {
    using S = decltype(tag);
    mla_ctx_k<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, m.D(), m.dv, ctx.ptr<S>(), ctx_v.ptr<S>(),
                                                                      backward);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
