#pragma once
// Causal self-attention, multi-head or grouped-query, as a tiled
// (flash-attention style) kernel. Forward streams key/value tiles with an
// online softmax and saves only the output and the log-sum-exp per query row;
// backward recomputes each score tile from q, k and lse. Nothing T x T is ever
// allocated: per thread, one score tile (kTileQ x kTileK) and a few d-wide
// tiles on the stack.
//
//   qkv  [T*B, (a+2g)d]  Megatron's fused layout (kernels/qkv_layout.h), rope applied
//   out  [T*B, a*d]      context, heads in order (Megatron's [s, b, a*d])
//   lse  [B, a, T]       log-sum-exp of the scaled, masked scores per row
//   dqkv [T*B, (a+2g)d]  written (not accumulated)
// dtypes: qkv fp32, fp64 or bf16 (bf16 inputs, fp32 accumulation); lse fp32
// (fp64 when qkv is fp64); out, dout, dqkv the same as lse, except that with
// bf16 qkv each of them may also be bf16, independently (so that --bf16 can
// keep ctx, dctx and dqkv in bf16; CUDA: a bf16 dqkv needs head_dim >= 2). A
// bf16 out or dqkv is the fp32 result rounded once to nearest even as it is
// stored, bit for bit the cast of an fp32 output; a bf16 out or dout is
// widened exactly, so the results are bit for bit those for fp32 tensors
// holding the same values. Other combinations fail an MT_CHECK naming the
// tensor and the dtypes it may have (kernels/attention_types.h).
// Attention dropout (Megatron's attention_dropout on the probabilities) uses
// Philox keyed by (seed, stream) and the element's global (b, head, i, j), so
// backward regenerates the mask and a tensor-parallel rank, passing its
// head_offset, draws the same mask the serial model would.
// Tensor parallel: heads and groups are this rank's (a/tp, g/tp); no
// communication inside. CPU: parallel over (b, head, query tile) forward and
// (b, group) backward, so dK/dV of a group never race. CUDA: the same forward
// grid; backward as three atomic-free kernels (D = rowsum(dO*O); dK/dV per
// (key tile, group, b); dQ per (query tile, head, b)), see kernels/cuda/attention.cu;
// bf16 tensor cores there when AttentionOptions::bf16_matmul allows them.

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/qkv_layout.h"

namespace mt::kernels {

inline constexpr int64_t kAttnTileQ = 64;
inline constexpr int64_t kAttnTileK = 64;
inline constexpr int64_t kAttnMaxHeadDim = 256;

struct AttentionOptions {
  double scale = 0;          // softmax scale; Megatron: 1/sqrt(d)
  double dropout = 0;        // probability of zeroing an attention probability
  uint64_t seed = 0;         // dropout key
  uint64_t stream = 0;       // dropout stream (layer, step)
  int64_t head_offset = 0;   // global index of this rank's first head
  // Permission, not a demand: a backend with bf16 matrix units may round Q,
  // K, V, dO (as loaded) and P, dS (as they enter their products) to bf16,
  // accumulating in fp32, as Megatron's bf16 attention does. The CUDA twin
  // then runs its tensor-core kernels (head_dim 64 or 128, fp32 or bf16 qkv);
  // the CPU twin always computes in the input's precision. GPTModel sets it
  // under --bf16.
  bool bf16_matmul = false;
};

namespace cpu {
void attention_forward(const Tensor& qkv, const QkvLayout& layout, const AttentionOptions& opt,
                       const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                        const QkvLayout& layout, const AttentionOptions& opt, const Tensor& dqkv);
}  // namespace cpu
#ifdef MT_HAVE_CUDA
// The CUDA twins (kernels/cuda/attention.cu), on the rank's stream.
namespace cuda {
void attention_forward(const Tensor& qkv, const QkvLayout& layout, const AttentionOptions& opt,
                       const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                        const QkvLayout& layout, const AttentionOptions& opt, const Tensor& dqkv);
// Whether calls with this qkv (and 16-byte aligned out, dout, dqkv) run the
// bf16 tensor-core kernels rather than the fp32 SIMT ones.
bool attention_uses_tensor_cores(const Tensor& qkv, const QkvLayout& layout, const AttentionOptions& opt);
}  // namespace cuda
#endif

// Model FLOPs of causal attention's forward (core/op_profile.h): Q K^T and
// P V over the T (T + 1) / 2 visible (query, key) pairs of each head.
inline double attention_forward_flops(const QkvLayout& L) {
  const double T = static_cast<double>(L.seq);
  return 4.0 * static_cast<double>(L.batch) * static_cast<double>(L.heads) * static_cast<double>(L.head_dim) * T *
         (T + 1) / 2;
}

inline void attention_forward(const Tensor& qkv, const QkvLayout& layout, const AttentionOptions& opt,
                              const Tensor& out, const Tensor& lse) {
  ::mt::profile::OpScope flops_scope("attention_forward", qkv.device(), attention_forward_flops(layout));
  MT_DISPATCH(attention_forward, qkv.device(), qkv, layout, opt, out, lse);
}
inline void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                               const QkvLayout& layout, const AttentionOptions& opt, const Tensor& dqkv) {
  ::mt::profile::OpScope flops_scope("attention_backward", qkv.device(), 2.5 * attention_forward_flops(layout));
  MT_DISPATCH(attention_backward, qkv.device(), qkv, out, dout, lse, layout, opt, dqkv);
}

}  // namespace mt::kernels
