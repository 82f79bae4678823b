#pragma once
// Mixture-of-experts routing and token permutation (Megatron's TopKRouter
// and the token dispatcher's permute/unpermute for experts held locally).
//
// N tokens (rows), E experts, k = top-k. A "slot" is one (token t, choice j)
// pair; the M = N k slots (those moe_drop kept) are permuted so that each expert's slots are
// consecutive, experts in order and, inside an expert, tokens ascending (the
// order of Megatron's permute, which walks the routing map expert by expert).
//
// moe_route: logits [N, E] (T = fp32 or fp64) ->
//   idx    [N, k] int32: the k largest logits' experts, largest first (ties:
//          the lower expert first)
//   probs  [N, k] T:     softmax over the k chosen logits (Megatron's default,
//          the Mixtral renormalised top-k), or with pre_softmax the full
//          softmax's values at the chosen experts; times `scale`
//          (--moe-router-topk-scaling-factor, 1 without it)
//   scores [N, E] T:     the softmax over all E logits (the load-balancing
//          loss reads it: compute_routing_scores_for_aux_loss)
//   lse    [N] T:        log-sum-exp over the E logits (the z-loss)
//   With sigmoid (--moe-router-score-function sigmoid, DeepSeek-V3's
//   router): scores are the sigmoids normalised to sum 1 per token, the top
//   k are chosen by sigmoid + bias ([E] T, the expert bias; undefined: 0),
//   probs are the chosen sigmoids normalised over the k (k > 1) or the
//   sigmoid itself (k = 1), times `scale`; pre_softmax is ignored.
//   With groups (MoeRouter::num_groups, group_topk) the top k come from the
//   chosen groups only (Megatron's group-limited routing); probabilities and
//   scores are computed as without.
// moe_route_backward: the gradient of
//   sum_{t,j} dprobs[t,j] probs[t,j] + sum_{t,e} aux[e] scores[t,e] + z sum_t lse[t]^2
// with respect to the logits, written (not accumulated) to dlogits [N, E].
// With sigmoid it reads the logits [N, E] (route's inputs) instead of probs
// and scores; logits may be undefined otherwise.
// aux [E] T (optional): d(aux loss)/d(scores[t, e]), the same for every
// token (Megatron's switch loss is linear in the scores: coeff E /
// (k T_total^2) times the expert's global token count); or [G, E], token t
// reading row t mod G (the seq_aux_loss: G = B sequences in [s, b] rows).
//
// moe_drop (token dropping: --moe-expert-capacity-factor, Megatron's
//   apply_router_token_dropping): the N tokens form `segments` equal groups
//   of consecutive tokens (the tokens one Megatron rank routes: a sequence-
//   parallel shard); in each group every expert keeps at most `capacity` of
//   the slots choosing it: those with the largest probs (ties: the earlier
//   token), or with by_position the earliest tokens. kept [N, k] int32 =
//   idx where kept, -1 where dropped. Megatron picks with torch.topk, whose
//   order among equal values is unspecified; here ties are broken by token.
// moe_dispatch_map: idx [N, k] -> counts [E] int32 (slots per expert), src
//   [M] int32 (the token of each permuted slot) and pos [N, k] int32 (the
//   permuted slot of each (t, j)). Deterministic. An idx entry -1 (dropped
//   by moe_drop) gets no slot: pos -1, not counted; src then holds the
//   M' = sum(counts) kept slots first and is untouched after them.
// moe_permute: out[p] = x[src[p]] (rows of width C; x and out one dtype).
// moe_unpermute: out[t] = sum_j w[t,j] y[pos[t,j]], j ascending, in the
//   compute type (fp32 for bf16 storage), w = probs, or 1 without probs (the
//   gradient of moe_permute). y [M, C]: T or bf16, M <= N k rows, every
//   pos below M; out: T or bf16. Slots with pos -1 (dropped) add nothing.
// moe_unpermute_backward: dy[pos[t,j]] = probs[t,j] dout[t] (dy: T or bf16)
//   and dprobs[t,j] = sum_c dout[t,c] y[pos[t,j],c] (T); a dropped slot (pos
//   -1) gets dprobs 0 and writes no dy row (Megatron multiplies the dropped
//   probabilities by 0).
// moe_sigmoid: y = 1 / (1 + exp(-x)) elementwise (fp32 or fp64; y may alias
//   x): the shared expert's gate (--moe-shared-expert-gate).
// moe_sigmoid_backward: dx = dy y (1 - y) from the forward's y (dx may alias
//   dy).

#include "kernels/dispatch.h"

namespace mt::kernels {

// The router's score function and probability options.
struct MoeRouter {
  bool pre_softmax = false;  // --moe-router-pre-softmax (softmax only)
  bool sigmoid = false;      // --moe-router-score-function sigmoid
  double scale = 1.0;        // --moe-router-topk-scaling-factor
  // --moe-router-num-groups / --moe-router-group-topk (0: none): the experts
  // in num_groups equal groups, each token choosing among the group_topk
  // groups whose top (k / group_topk) scores sum highest (kernels/moe_row.h).
  int64_t num_groups = 0, group_topk = 0;
};

#define MT_MOE_OPS(X)                                                                                           \
  X(void moe_route(const Tensor& logits, const MoeRouter& router, const Tensor& bias, const Tensor& idx,          \
                   const Tensor& probs, const Tensor& scores, const Tensor& lse))                                \
  X(void moe_route_backward(const Tensor& dprobs, const Tensor& idx, const Tensor& probs, const Tensor& scores,   \
                            const Tensor& lse, const Tensor& aux, double z, const MoeRouter& router,            \
                            const Tensor& logits, const Tensor& dlogits))                                        \
  X(void moe_drop(const Tensor& idx, const Tensor& probs, int64_t segments, int64_t capacity, bool by_position,   \
                  const Tensor& kept))                                                                           \
  X(void moe_dispatch_map(const Tensor& idx, const Tensor& counts, const Tensor& src, const Tensor& pos))        \
  X(void moe_permute(const Tensor& x, const Tensor& src, const Tensor& out))                                     \
  X(void moe_unpermute(const Tensor& y, const Tensor& pos, const Tensor& probs, const Tensor& out))              \
  X(void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& pos, const Tensor& probs,     \
                                const Tensor& dy, const Tensor& dprobs))                                        \
  X(void moe_sigmoid(const Tensor& x, const Tensor& y))                                                          \
  X(void moe_sigmoid_backward(const Tensor& y, const Tensor& dy, const Tensor& dx))
#define MT_MOE_DECLARE(sig) sig;
namespace cpu {
MT_MOE_OPS(MT_MOE_DECLARE)
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/moe.cu), on the rank's stream.
namespace cuda {
MT_MOE_OPS(MT_MOE_DECLARE)
}  // namespace cuda
#endif
#undef MT_MOE_DECLARE
#undef MT_MOE_OPS

// Group-limited routing's arguments (both twins): E divisible into the groups,
// 1 <= group_topk <= groups, group_topk <= k, and the limits of moe_row.h.
inline void check_groups(const MoeRouter& r, int64_t E, int64_t k) {
  if (r.group_topk == 0) return;
  MT_CHECK(r.num_groups >= 1 && E % r.num_groups == 0 && r.group_topk <= r.num_groups && r.group_topk <= k &&
               r.group_topk <= 32 && k / r.group_topk <= 32 && k <= r.group_topk * (E / r.num_groups),
           "moe_route: group-limited routing needs E divisible by the groups, 1 <= group_topk <= groups, "
           "group_topk <= k <= group_topk x E / groups, group_topk and k / group_topk at most 32");
}

inline void moe_route(const Tensor& logits, const MoeRouter& router, const Tensor& bias, const Tensor& idx,
                      const Tensor& probs, const Tensor& scores, const Tensor& lse) {
  MT_DISPATCH(moe_route, logits.device(), logits, router, bias, idx, probs, scores, lse);
}
inline void moe_route_backward(const Tensor& dprobs, const Tensor& idx, const Tensor& probs, const Tensor& scores,
                               const Tensor& lse, const Tensor& aux, double z, const MoeRouter& router,
                               const Tensor& logits, const Tensor& dlogits) {
  MT_DISPATCH(moe_route_backward, dlogits.device(), dprobs, idx, probs, scores, lse, aux, z, router, logits, dlogits);
}
inline void moe_drop(const Tensor& idx, const Tensor& probs, int64_t segments, int64_t capacity, bool by_position,
                     const Tensor& kept) {
  MT_DISPATCH(moe_drop, kept.device(), idx, probs, segments, capacity, by_position, kept);
}
inline void moe_dispatch_map(const Tensor& idx, const Tensor& counts, const Tensor& src, const Tensor& pos) {
  MT_DISPATCH(moe_dispatch_map, idx.device(), idx, counts, src, pos);
}
// The dispatch map of the router's choices idx; with kept defined (token
// dropping), of those moe_drop keeps, written to kept first.
inline void moe_dispatch_kept(const Tensor& idx, const Tensor& probs, int64_t segments, int64_t capacity,
                              bool by_position, const Tensor& kept, const Tensor& counts, const Tensor& src,
                              const Tensor& pos) {
  if (kept.defined()) moe_drop(idx, probs, segments, capacity, by_position, kept);
  moe_dispatch_map(kept.defined() ? kept : idx, counts, src, pos);
}
inline void moe_permute(const Tensor& x, const Tensor& src, const Tensor& out) {
  MT_DISPATCH(moe_permute, out.device(), x, src, out);
}
inline void moe_unpermute(const Tensor& y, const Tensor& pos, const Tensor& probs, const Tensor& out) {
  MT_DISPATCH(moe_unpermute, out.device(), y, pos, probs, out);
}
inline void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& pos, const Tensor& probs,
                                   const Tensor& dy, const Tensor& dprobs) {
  MT_DISPATCH(moe_unpermute_backward, dout.device(), dout, y, pos, probs, dy, dprobs);
}
inline void moe_sigmoid(const Tensor& x, const Tensor& y) { MT_DISPATCH(moe_sigmoid, y.device(), x, y); }
inline void moe_sigmoid_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  MT_DISPATCH(moe_sigmoid_backward, dx.device(), y, dy, dx);
}

}  // namespace mt::kernels
