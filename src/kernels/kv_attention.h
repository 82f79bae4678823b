#pragma once
// Causal attention of a few new tokens against a key/value cache: the
// incremental-decoding twin of kernels/attention.h (which attends a whole
// sequence to itself). One sequence; grouped-query aware.
//
//   qkv      [n, (a+2g)d]   the new tokens' fused QKV rows (kernels/qkv_layout.h,
//                           seq = n, batch = 1), rope already applied
//   k_cache, v_cache  [T_max, g, d]  keys and values of positions 0..T_max-1;
//                           rows [0, pos + n) must be valid (kv_cache_append
//                           first), later rows are not read
//   out      [n, a*d]       context, heads in order (as attention_forward)
// New token i sits at absolute position pos + i and attends to keys
// 0..pos+i. Softmax in the tensors' type (fp32 or fp64), scores scaled by
// `scale` as q is (the same order of operations as attention_forward), no
// dropout (inference). Parallel over (head, query); no allocation beyond one
// score row per thread.
// Tensor parallel: heads and groups are this rank's; no communication.

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/qkv_layout.h"

namespace mt::kernels {

namespace cpu {
void kv_cache_append(const Tensor& qkv, const QkvLayout& layout, int64_t pos, const Tensor& k_cache,
                     const Tensor& v_cache);
void kv_attention(const Tensor& qkv, const QkvLayout& layout, const Tensor& k_cache, const Tensor& v_cache,
                  int64_t pos, double scale, const Tensor& out);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/kv_attention.cu), on the rank's stream.
namespace cuda {
void kv_cache_append(const Tensor& qkv, const QkvLayout& layout, int64_t pos, const Tensor& k_cache,
                     const Tensor& v_cache);
void kv_attention(const Tensor& qkv, const QkvLayout& layout, const Tensor& k_cache, const Tensor& v_cache,
                  int64_t pos, double scale, const Tensor& out);
}  // namespace cuda
#endif

// Copies the k and v parts of qkv's n rows into cache rows [pos, pos + n).
inline void kv_cache_append(const Tensor& qkv, const QkvLayout& layout, int64_t pos, const Tensor& k_cache,
                            const Tensor& v_cache) {
  MT_DISPATCH(kv_cache_append, qkv.device(), qkv, layout, pos, k_cache, v_cache);
}
inline void kv_attention(const Tensor& qkv, const QkvLayout& layout, const Tensor& k_cache, const Tensor& v_cache,
                         int64_t pos, double scale, const Tensor& out) {
  MT_DISPATCH(kv_attention, qkv.device(), qkv, layout, k_cache, v_cache, pos, scale, out);
}

}  // namespace mt::kernels
