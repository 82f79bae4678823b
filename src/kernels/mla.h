#pragma once
// Multi-latent attention's glue (--multi-latent-attention, model/config.h)
// between its projections and the fused attention kernel. MLA's queries
// and keys have D = dn + dr dims per head (dn = --qk-head-dim, dr =
// --qk-pos-emb-head-dim), its values dv (--v-head-dim), and there is one
// key/value head per query head: the fused layout of kernels/qkv_layout.h
// with g = a groups of d = D, each token row [q_0 k_0 v_0 | q_1 k_1 v_1 | ...].
//
//   mla_pack:   q   [N, a, dn + dr]  per head [nope | pe]   (linear_q_up / linear_q_proj)
//               kv  [N, a, dn + dv]  per head [k_nope | v]  (linear_kv_up)
//               kpe [N, dr]          the position key every head shares (linear_kv_down)
//            -> qkv [N, (3a) D]      q slot [pe | nope], k slot [kpe | k_nope],
//                                    v slot [v | 0] (padded with zeros to D)
//   The position dims come first so that RoPE (kernels/rope.h, rot_dim dr,
//   interleaved pairs) rotates them where it rotates any head; the q.k dot
//   product is the same sum in another order. Megatron's MLA rotates the pe
//   dims after splitting them into even and odd halves, which pairs the
//   same dims (2i, 2i + 1) and permutes q's and k's alike, so the scores
//   are the same. The padded values give an attention output whose last
//   D - dv dims per head are zero (Megatron pads V the same way for its THD
//   path).
//   mla_unpack: the inverse for the gradients: dq, dkv written, dkpe the sum
//               over the a heads of the k slots' pe dims (accumulated in
//               fp32, fp64 for fp64, head 0 first; written).
//   mla_ctx:    forward: ctx [N, a D] -> ctx_v [N, a dv] (each head's first dv);
//               backward: dctx_v -> dctx with zeros in the padded dims.
// dtypes: every tensor the same (fp32, fp64 or bf16), except dkpe, which
// may also be the accumulation type (fp32 for bf16). Copies are exact.

#include <cstdint>

#include <fmt/format.h>

#include "kernels/dispatch.h"

namespace mt::kernels {

struct MlaDims {
  int64_t tokens = 0;  // N
  int64_t heads = 0;   // a (this rank's)
  int64_t dn = 0, dr = 0, dv = 0;
  int64_t D() const { return dn + dr; }
  void check() const {
    MT_CHECK(tokens >= 0 && heads > 0 && dn > 0 && dr > 0 && dv > 0 && dv <= dn + dr,
             fmt::format("MLA: heads {} dn {} dr {} dv {}: each must be positive and v-head-dim at most "
                         "qk-head-dim + qk-pos-emb-head-dim",
                         heads, dn, dr, dv));
  }
};

inline void check_mla(const MlaDims& m, const Tensor& q, const Tensor& kv, const Tensor& kpe, const Tensor& qkv,
                      const char* op) {
  m.check();
  const int64_t N = m.tokens, a = m.heads;
  MT_CHECK(q.numel() == N * a * m.D() && kv.numel() == N * a * (m.dn + m.dv) && kpe.numel() == N * m.dr &&
               qkv.numel() == N * 3 * a * m.D(),
           fmt::format("{}: sizes q {} kv {} kpe {} qkv {} do not match tokens {} heads {} dims {}/{}/{}", op,
                       q.shape().str(), kv.shape().str(), kpe.shape().str(), qkv.shape().str(), N, a, m.dn, m.dr,
                       m.dv));
  MT_CHECK(q.dtype() == qkv.dtype() && kv.dtype() == qkv.dtype(),
           fmt::format("{}: q, kv and qkv must have one dtype", op));
  MT_CHECK(qkv.dtype() == DType::kF32 || qkv.dtype() == DType::kF64 || qkv.dtype() == DType::kBF16,
           fmt::format("{}: {} tensors, expected fp32, fp64 or bf16", op, dtype_name(qkv.dtype())));
}

// mla_unpack's dkpe: qkv's dtype (true) or the accumulation type (false: fp32
// for fp32 and bf16, fp64 for fp64); anything else fails naming the op.
inline bool mla_dkpe_in_storage_type(const Tensor& dkpe, const Tensor& dqkv, const char* op) {
  if (dkpe.dtype() == dqkv.dtype()) return true;
  const DType acc = dqkv.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  MT_CHECK(dkpe.dtype() == acc, fmt::format("{}: dkpe is {}, expected {} or {}", op, dtype_name(dkpe.dtype()),
                                            dtype_name(dqkv.dtype()), dtype_name(acc)));
  return false;
}

// mla_ctx's shapes: ctx [N, a D] and ctx_v [N, a dv], one dtype.
inline void check_mla_ctx(const MlaDims& m, const Tensor& ctx, const Tensor& ctx_v) {
  m.check();
  MT_CHECK(ctx.numel() == m.tokens * m.heads * m.D() && ctx_v.numel() == m.tokens * m.heads * m.dv &&
               ctx.dtype() == ctx_v.dtype(),
           fmt::format("mla_ctx: ctx {} and ctx_v {} must be [N, a D] and [N, a dv] of one dtype", ctx.shape().str(),
                       ctx_v.shape().str()));
  MT_CHECK(ctx.dtype() == DType::kF32 || ctx.dtype() == DType::kF64 || ctx.dtype() == DType::kBF16,
           fmt::format("mla_ctx: {} tensors, expected fp32, fp64 or bf16", dtype_name(ctx.dtype())));
}

namespace cpu {
void mla_pack(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& m, const Tensor& qkv);
void mla_unpack(const Tensor& dqkv, const MlaDims& m, const Tensor& dq, const Tensor& dkv, const Tensor& dkpe);
void mla_ctx(const Tensor& ctx, const Tensor& ctx_v, const MlaDims& m, bool backward);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
namespace cuda {
void mla_pack(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& m, const Tensor& qkv);
void mla_unpack(const Tensor& dqkv, const MlaDims& m, const Tensor& dq, const Tensor& dkv, const Tensor& dkpe);
void mla_ctx(const Tensor& ctx, const Tensor& ctx_v, const MlaDims& m, bool backward);
}  // namespace cuda
#endif

inline void mla_pack(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& m, const Tensor& qkv) {
  MT_DISPATCH(mla_pack, qkv.device(), q, kv, kpe, m, qkv);
}
inline void mla_unpack(const Tensor& dqkv, const MlaDims& m, const Tensor& dq, const Tensor& dkv, const Tensor& dkpe) {
  MT_DISPATCH(mla_unpack, dqkv.device(), dqkv, m, dq, dkv, dkpe);
}
// backward false: ctx -> ctx_v; true: ctx_v (the gradient) -> ctx, zero-padded.
inline void mla_ctx(const Tensor& ctx, const Tensor& ctx_v, const MlaDims& m, bool backward) {
  MT_DISPATCH(mla_ctx, ctx.device(), ctx, ctx_v, m, backward);
}

}  // namespace mt::kernels
