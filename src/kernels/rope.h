#pragma once
// Rotary position embedding, Megatron's default (non-interleaved, "rotate
// half"): for each q and k head vector x of width d, positions t,
//   inv_freq_i = base^(-2i/d), i < d/2;  angle = t * inv_freq_i
//   y[i]       = x[i] cos - x[i+d/2] sin
//   y[i+d/2]   = x[i+d/2] cos + x[i] sin
// (megatron/core/models/common/embeddings/rotary_pos_embedding.py:
//  emb = cat(freqs, freqs); x*cos + rotate_half(x)*sin, rotate_half = cat(-x2, x1)).
// Applied in place on the fused QKV buffer (kernels/qkv_layout.h); v is left
// alone. Backward is the inverse rotation applied in place to dQKV.
// qkv fp32, fp64 or bf16 (bf16 rotates in fp32 and rounds once as stored).
// cos/sin tables: [T, d/2] in the compute dtype (fp32 for fp32 and bf16 qkv,
// fp64 for fp64), made by rope_table.
// Context parallel later passes the table rows of its own positions.

#include "kernels/dispatch.h"
#include "kernels/qkv_layout.h"

namespace mt::kernels {

namespace cpu {
void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin);
void rope_apply(const Tensor& qkv, const QkvLayout& layout, const Tensor& cos, const Tensor& sin, bool inverse);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/rope.cu), on the rank's stream.
namespace cuda {
void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin);
void rope_apply(const Tensor& qkv, const QkvLayout& layout, const Tensor& cos, const Tensor& sin, bool inverse);
}  // namespace cuda
#endif

inline void rope_table(double base, int64_t seq, int64_t head_dim, const Tensor& cos, const Tensor& sin) {
  MT_DISPATCH(rope_table, cos.device(), base, seq, head_dim, cos, sin);
}
inline void rope_forward(const Tensor& qkv, const QkvLayout& l, const Tensor& cos, const Tensor& sin) {
  MT_DISPATCH(rope_apply, qkv.device(), qkv, l, cos, sin, false);
}
inline void rope_backward(const Tensor& dqkv, const QkvLayout& l, const Tensor& cos, const Tensor& sin) {
  MT_DISPATCH(rope_apply, dqkv.device(), dqkv, l, cos, sin, true);
}

}  // namespace mt::kernels
