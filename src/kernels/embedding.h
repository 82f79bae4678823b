#pragma once
// Embedding lookup and gradient, vocabulary-shard ready (Megatron's
// VocabParallelEmbedding): this rank holds rows [vocab_start, vocab_start+Vs)
// of the word embedding; a token outside them yields a zero row (the TP
// all-reduce of the outputs then sums the one owning shard's row).
//   tokens [N] int32/int64 in [s, b] row order; weight [Vs, C]; out [N, C].
// embedding_backward ACCUMULATES dweight[tok - vocab_start] += dout[row];
// deterministic (parallel over columns, rows in order).
// Learned positions: out[r] += pos[r / B] (positions 0..T-1), backward
// dpos[t] += sum over b of dout[t*B + b].
// dtypes: weight, dweight, pos and dpos fp32 or fp64 (T); out and dout T, or
// bf16 with fp32 T (the bf16 residual stream: values rounded once as
// stored, widened exactly as read).

#include "kernels/dispatch.h"

namespace mt::kernels {

namespace cpu {
void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, const Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, const Tensor& dweight);
void position_add_forward(const Tensor& pos, int64_t batch, const Tensor& out);
void position_add_backward(const Tensor& dout, int64_t batch, const Tensor& dpos);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/embedding.cu), on the rank's stream.
namespace cuda {
void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, const Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, const Tensor& dweight);
void position_add_forward(const Tensor& pos, int64_t batch, const Tensor& out);
void position_add_backward(const Tensor& dout, int64_t batch, const Tensor& dpos);
}  // namespace cuda
#endif

inline void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start,
                              const Tensor& out) {
  MT_DISPATCH(embedding_forward, out.device(), tokens, weight, vocab_start, out);
}
inline void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                               const Tensor& dweight) {
  MT_DISPATCH(embedding_backward, dout.device(), tokens, dout, vocab_start, dweight);
}
inline void position_add_forward(const Tensor& pos, int64_t batch, const Tensor& out) {
  MT_DISPATCH(position_add_forward, out.device(), pos, batch, out);
}
inline void position_add_backward(const Tensor& dout, int64_t batch, const Tensor& dpos) {
  MT_DISPATCH(position_add_backward, dout.device(), dout, batch, dpos);
}

}  // namespace mt::kernels
