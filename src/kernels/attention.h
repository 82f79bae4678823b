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
// communication inside. Context parallel (AttentionOptions::cp_size): qkv
// holds the whole sequence (the model all-gathers it), out, dout and lse
// only this rank's query rows, and dqkv this rank's contribution to every
// row. CPU: parallel over (b, head, query tile) forward and
// (b, group) backward, so dK/dV of a group never race. CUDA: the same forward
// grid; backward as three atomic-free kernels (D = rowsum(dO*O); dK/dV per
// (key tile, group, b); dQ per (query tile, head, b)), see kernels/cuda/attention.cu;
// bf16 tensor cores there when AttentionOptions::bf16_matmul allows them.

#include <cstdint>

#include "core/hostdev.h"
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
  // Context parallelism (Megatron's load-balanced split): the sequence is cut
  // into 2 cp_size chunks of C = T / (2 cp_size) positions, and this call
  // computes the queries of chunks cp_rank and 2 cp_size - 1 - cp_rank only,
  // against every key of qkv (all T positions, all-gathered over the CP group
  // and put back in sequence order). out, dout and lse then hold those
  // T / cp_size query rows, in chunk order ([T/cp * B, a*d] and [B, a, T/cp]);
  // dqkv stays [T*B, (a+2g)d]: dQ in the local queries' rows, zeros in the
  // other queries' rows, and this rank's share of dK and dV in every row
  // (summing dqkv over the CP group gives the full gradient). Causal masks
  // and dropout use global positions, so the union of the CP ranks' calls
  // is bit for bit the cp_size = 1 call.
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  // Document masking (--reset-attention-mask): [B, T] int32 on qkv's device,
  // the first position of each position's document (nondecreasing along a
  // sequence, doc_start[b, i] <= i); key j is visible to query i when
  // doc_start[b, i] <= j <= i. Undefined: plain causal.
  Tensor doc_start = Tensor();
};

// The query rows of one attention call (see AttentionOptions::cp_size): n
// chunks of len consecutive positions, chunk c starting at position start[c];
// local row r is position start[r / len] + r % len. Query tiles of `tile`
// rows never straddle two chunks.
struct QueryChunks {
  int64_t n = 1, len = 0;
  int64_t start[2] = {0, 0};
  MT_HOST_DEVICE int64_t rows() const { return n * len; }
  MT_HOST_DEVICE int64_t position(int64_t r) const { return start[r / len] + r % len; }
  MT_HOST_DEVICE int64_t tiles_per_chunk(int64_t tile) const { return (len + tile - 1) / tile; }
  MT_HOST_DEVICE int64_t tiles(int64_t tile) const { return n * tiles_per_chunk(tile); }
  // Tile qt: its first local row, first position and row count.
  struct Tile {
    int64_t local, pos, rows;
  };
  MT_HOST_DEVICE Tile tile(int64_t qt, int64_t tile) const { return tile_at(place(qt, tile), tile); }
  // Tile qt as its chunk and its first row within the chunk; next() is the
  // place of tile qt + 1 without a division (a kernel that walks the tiles,
  // as the CUDA dK/dV kernel does, steps with it).
  struct Place {
    int64_t chunk, off;
  };
  MT_HOST_DEVICE Place place(int64_t qt, int64_t tile) const {
    const int64_t per = tiles_per_chunk(tile);
    return Place{qt / per, (qt % per) * tile};
  }
  MT_HOST_DEVICE Place next(Place at, int64_t tile) const {
    at.off += tile;
    if (at.off >= len) ++at.chunk, at.off = 0;
    return at;
  }
  MT_HOST_DEVICE Tile tile_at(Place at, int64_t tile) const {
    const int64_t left = len - at.off;
    return Tile{at.chunk * len + at.off, (at.chunk == 0 ? start[0] : start[1]) + at.off, left < tile ? left : tile};
  }
};

MT_HOST_DEVICE inline QueryChunks query_chunks(int64_t seq, int64_t cp_size, int64_t cp_rank) {
  QueryChunks q;
  if (cp_size <= 1) {
    q.len = seq;
    return q;
  }
  q.n = 2;
  q.len = seq / (2 * cp_size);
  q.start[0] = cp_rank * q.len;
  q.start[1] = (2 * cp_size - 1 - cp_rank) * q.len;
  return q;
}
inline QueryChunks query_chunks(const QkvLayout& L, const AttentionOptions& o) {
  return query_chunks(L.seq, o.cp_size, o.cp_rank);
}
// MT_CHECKs the CP fields against the layout (cp_rank in range, T a
// multiple of 2 cp_size) and doc_start's shape, dtype and device.
inline void check_options(const QkvLayout& L, const AttentionOptions& o, const Tensor& qkv) {
  MT_CHECK(o.cp_size >= 1 && o.cp_rank >= 0 && o.cp_rank < o.cp_size,
           "attention: cp_rank must lie in [0, cp_size)");
  MT_CHECK(o.cp_size == 1 || L.seq % (2 * o.cp_size) == 0,
           "attention: with context parallelism the sequence must be a multiple of 2 x cp_size");
  if (o.doc_start.defined())
    MT_CHECK(o.doc_start.numel() == L.batch * L.seq && o.doc_start.dtype() == DType::kI32 &&
                 o.doc_start.device() == qkv.device(),
             "attention: doc_start must be int32 [B, T] on qkv's device");
}

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
// A benchmark's switch between two builds of the tensor-core dK/dV kernel
// (same results, bit for bit): off, the default (the build measured on the
// H200); on, the lean build (the next step's lse and D read a step ahead, no
// division in the step loop, no mask tests on wholly visible steps; see
// attn_bwd_dkv_tc). attention_bench times both; process-wide, not for
// concurrent calls.
void set_dkv_lean(bool on);
}  // namespace cuda
#endif

// Model FLOPs of causal attention's forward (core/op_profile.h): Q K^T and
// P V over the T (T + 1) / 2 visible (query, key) pairs of each head.
// With context parallelism a rank's T / cp queries (two chunks placed as
// Megatron places them) see T (T + 1) / (2 cp) pairs: exactly its 1/cp share.
inline double attention_forward_flops(const QkvLayout& L, int64_t cp_size = 1) {
  const double T = static_cast<double>(L.seq);
  return 4.0 * static_cast<double>(L.batch) * static_cast<double>(L.heads) * static_cast<double>(L.head_dim) * T *
         (T + 1) / 2 / static_cast<double>(cp_size);
}

inline void attention_forward(const Tensor& qkv, const QkvLayout& layout, const AttentionOptions& opt,
                              const Tensor& out, const Tensor& lse) {
  ::mt::profile::OpScope flops_scope("attention_forward", qkv.device(), attention_forward_flops(layout, opt.cp_size));
  check_options(layout, opt, qkv);
  MT_DISPATCH(attention_forward, qkv.device(), qkv, layout, opt, out, lse);
}
inline void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                               const QkvLayout& layout, const AttentionOptions& opt, const Tensor& dqkv) {
  ::mt::profile::OpScope flops_scope("attention_backward", qkv.device(), 2.5 * attention_forward_flops(layout, opt.cp_size));
  check_options(layout, opt, qkv);
  if (opt.cp_size > 1) dqkv.zero();  // the rows of other ranks' queries
  MT_DISPATCH(attention_backward, qkv.device(), qkv, out, dout, lse, layout, opt, dqkv);
}

}  // namespace mt::kernels
