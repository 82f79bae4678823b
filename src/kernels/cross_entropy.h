#pragma once
// Softmax cross-entropy over a vocabulary that may be split across
// tensor-parallel ranks (Megatron's vocab_parallel_cross_entropy). Each rank
// holds logits [N, Vs] for vocabulary ids [vocab_start, vocab_start + Vs):
//   1. xent_partials: per row local max, sum exp(l - local max), and the
//      target's logit if the target is in this shard (else 0).
//   2. (TP > 1) all-reduce MAX of the maxes; xent_rescale the sums to the
//      global max; all-reduce SUM of sums and of target logits.
//   3. xent_loss: loss_i = log(sum_i) + max_i - target_logit_i.
//   4. xent_backward: dlogits = (softmax - onehot) * dloss_i, written over the
//      logits in place when dlogits aliases logits (saves a [N, V] buffer).
// Targets are int32 or int64; a negative target is ignored (loss 0, no grad).
// Logits fp32 or fp64; the per-row vectors [N] share the logits' dtype.

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void xent_partials(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                   const Tensor& sumexp, const Tensor& target_logit);
void xent_rescale(const Tensor& sumexp, const Tensor& local_max, const Tensor& global_max);
void xent_loss(const Tensor& max, const Tensor& sumexp, const Tensor& target_logit, const Tensor& targets,
               const Tensor& loss);
void xent_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                   const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits);
void xent_backward_half(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                        const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/cross_entropy.cu), on the rank's stream.
namespace cuda {
void xent_partials(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                   const Tensor& sumexp, const Tensor& target_logit);
void xent_rescale(const Tensor& sumexp, const Tensor& local_max, const Tensor& global_max);
void xent_loss(const Tensor& max, const Tensor& sumexp, const Tensor& target_logit, const Tensor& targets,
               const Tensor& loss);
void xent_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                   const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits);
void xent_backward_half(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                        const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits);
}  // namespace cuda
#endif

inline void xent_partials(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                          const Tensor& sumexp, const Tensor& target_logit) {
  MT_DISPATCH(xent_partials, logits.device(), logits, targets, vocab_start, max, sumexp, target_logit);
}
// sumexp *= exp(local_max - global_max), in place.
inline void xent_rescale(const Tensor& sumexp, const Tensor& local_max, const Tensor& global_max) {
  MT_DISPATCH(xent_rescale, sumexp.device(), sumexp, local_max, global_max);
}
inline void xent_loss(const Tensor& max, const Tensor& sumexp, const Tensor& target_logit,
                      const Tensor& targets, const Tensor& loss) {
  MT_DISPATCH(xent_loss, loss.device(), max, sumexp, target_logit, targets, loss);
}
// dlogits may alias logits.
inline void xent_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                          const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  MT_DISPATCH(xent_backward, logits.device(), logits, targets, vocab_start, max, sumexp, dloss, dlogits);
}

// 16-bit compute: the same gradient written straight to bf16 (or fp16, CPU
// twin only), dlogits [N, V] (fp32 logits), for the output layer's 16-bit GEMMs. Bitwise equal to
// xent_backward followed by a cast, without the fp32 [N, V] pass.
inline void xent_backward_half(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& max,
                               const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  MT_DISPATCH(xent_backward_half, logits.device(), logits, targets, vocab_start, max, sumexp, dloss, dlogits);
}
}  // namespace mt::kernels
