// CUDA twins of kernels/cpu/embedding.cc: vocabulary-sharded embedding
// lookup and gradient, learned position add and its gradient, fp32 or fp64
// tables, int32 or int64 tokens, activations in the tables' type or bf16
// (kernels/embedding.h has the contract).
//
// embedding_forward: grid-stride loop over out [N, C]; element e is row
//   i = e / C, column c = e % C; a token outside [vocab_start, vocab_start +
//   Vs) yields 0.
// embedding_backward (ACCUMULATES): the CPU twin adds dout[i, :] onto row
//   tok_i - vocab_start of dweight for i = 0..N-1 in order, so each dweight
//   element receives its rows' gradients in ascending i. Two kernels keep
//   exactly that order with parallelism over (distinct token, column):
//   1. embed_rank: the stable sort of the rows by token, as ranks (rank_i =
//      the rows with a smaller key, or the same key and a smaller index; key
//      = the shard row, or Vs for a token outside the shard), one thread per
//      row counting through the keys in shared-memory tiles (N^2 / threads
//      comparisons: 8192 rows take microseconds); writes the permutation and
//      the sorted keys into the op's scratch buffer (cuda::op_scratch).
//   2. embed_bwd_segments: grid (sorted position, column block); a block at
//      the first position of a key's run walks the run in order (ascending i,
//      by stability), summing onto the dweight element in a register, and
//      stores it once. Bitwise the CPU's and deterministic.
// position_add_forward: grid-stride loop, out[r, c] += pos[r / B, c].
// position_add_backward (ACCUMULATES): one thread per (t, c), adding
//   dout[t*B + b, c] for b = 0..B-1 in order onto dpos[t, c]: bitwise the CPU's.
#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/embedding.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

template <typename T, typename Y, typename Tok>
__global__ void embed_fwd(int64_t n, int64_t C, int64_t Vs, int64_t v0, const Tok* __restrict__ tokens,
                          const T* __restrict__ w, Y* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t i, c;
    divmod(e, C, i, c);
    const int64_t t = static_cast<int64_t>(tokens[i]) - v0;
    out[e] = to_out<Y>((t >= 0 && t < Vs) ? w[t * C + c] : T(0));
  }
}

// The sort key of row i: its shard row, or Vs outside the shard.
template <typename Tok>
__device__ __forceinline__ int32_t embed_key(const Tok* tokens, int64_t i, int64_t Vs, int64_t v0) {
  const int64_t t = static_cast<int64_t>(tokens[i]) - v0;
  return static_cast<int32_t>(t >= 0 && t < Vs ? t : Vs);
}

constexpr int kRankTile = 1024;

// 1. perm[rank_i] = i and skey[rank_i] = key_i, rank_i being row i's place in
// the stable sort by key. One thread per row.
template <typename Tok>
__global__ void __launch_bounds__(kThreads) embed_rank(int64_t N, int64_t Vs, int64_t v0,
                                                       const Tok* __restrict__ tokens, int32_t* __restrict__ perm,
                                                       int32_t* __restrict__ skey) {
  __shared__ int32_t tile[kRankTile];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int32_t key = i < N ? embed_key(tokens, i, Vs, v0) : 0;
  int64_t rank = 0;
  for (int64_t j0 = 0; j0 < N; j0 += kRankTile) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kRankTile), N - j0));
    __syncthreads();  // the previous tile's readers are done
    for (int k = threadIdx.x; k < n; k += blockDim.x) tile[k] = embed_key(tokens, j0 + k, Vs, v0);
    __syncthreads();
    for (int k = 0; k < n; ++k) {
      const int32_t kj = tile[k];
      rank += (kj < key || (kj == key && j0 + k < i)) ? 1 : 0;
    }
  }
  if (i < N) {
    perm[rank] = static_cast<int32_t>(i);
    skey[rank] = key;
  }
}

// 2. Grid (N, ceil(C / kThreads)): the block at the first sorted position of
// an in-shard key's run adds the run's dout rows, in order, onto its columns.
template <typename T, typename S>
__global__ void __launch_bounds__(kThreads) embed_bwd_segments(int64_t N, int64_t C, int64_t Vs,
                                                               const int32_t* __restrict__ perm,
                                                               const int32_t* __restrict__ skey,
                                                               const S* __restrict__ dout, T* __restrict__ dw) {
  const int64_t r = blockIdx.x;
  const int32_t key = skey[r];
  if (key >= Vs || (r > 0 && skey[r - 1] == key)) return;  // outside the shard, or not a run's start
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  T* w = dw + static_cast<int64_t>(key) * C + c;
  T acc = *w;
  for (int64_t k = r; k < N && skey[k] == key; ++k) acc += ld<T>(dout[static_cast<int64_t>(perm[k]) * C + c]);
  *w = acc;
}


template <typename T, typename S>
__global__ void pos_add_fwd(int64_t n, int64_t C, int64_t B, const T* __restrict__ pos, S* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t r, c;
    divmod(e, C, r, c);
    out[e] = to_out<S>(ld<T>(out[e]) + pos[div_idx(r, B) * C + c]);
  }
}

// n = (N / B) * C items; item e is position t = e / C, column c = e % C.
template <typename T, typename S>
__global__ void pos_add_bwd(int64_t n, int64_t C, int64_t B, const S* __restrict__ dout, T* __restrict__ dpos) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t t, c;
    divmod(e, C, t, c);
    T acc = dpos[e];
    for (int64_t b = 0; b < B; ++b) acc += ld<T>(dout[(t * B + b) * C + c]);
    dpos[e] = acc;
  }
}

// Calls f(ptr) with the tokens as const int32_t* or const int64_t* (the CPU
// twin reads int32 when the dtype says so and int64 otherwise, whose ptr<>
// check rejects any other dtype).
template <typename F>
void with_tokens(const Tensor& tokens, F&& f) {
  if (tokens.dtype() == DType::kI32) f(static_cast<const int32_t*>(tokens.ptr<int32_t>()));
  else f(static_cast<const int64_t*>(tokens.ptr<int64_t>()));
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t v0, const Tensor& out) {
  const int64_t C = weight.dim(-1), Vs = C == 0 ? 0 : weight.numel() / C, N = tokens.numel();
  MT_CHECK(out.numel() == N * C, "embedding_forward: out must be [N, C]");
  check_on_gpu({&tokens, &weight, &out}, "embedding_forward");
  float_types(weight.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    out_types<T>(out.dtype(), "embedding_forward", [&](auto ytag_) {
      using Y = decltype(ytag_);
      const T* w = weight.ptr<T>();
      Y* o = out.ptr<Y>();
      const int64_t n = N * C;
      if (n == 0) return;
      with_tokens(tokens, [&](auto tp) {
        embed_fwd<<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, Vs, v0, tp, w, o);
        MT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t v0, const Tensor& dweight) {
  const int64_t C = dweight.dim(-1), Vs = C == 0 ? 0 : dweight.numel() / C, N = tokens.numel();
  MT_CHECK(dout.numel() == N * C, "embedding_backward: dout must be [N, C]");
  check_on_gpu({&tokens, &dout, &dweight}, "embedding_backward");
  float_types(dweight.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    x_types<T>(dout.dtype(), "embedding_backward", "dout", [&](auto stag_) {
    using S = decltype(stag_);
    const S* d = dout.ptr<S>();
    T* dw = dweight.ptr<T>();
    if (N == 0 || C == 0) return;
    MT_CHECK(N < (int64_t{1} << 31) && Vs < (int64_t{1} << 31),
             fmt::format("embedding_backward (CUDA): {} tokens and {} shard rows must each be below 2^31", N, Vs));
    MT_CHECK(C <= int64_t{65535} * kThreads, "embedding_backward (CUDA): embedding width above 65535 * 256");
    int32_t* perm = static_cast<int32_t*>(
        ::mt::cuda::op_scratch("embedding_backward sort scratch", static_cast<size_t>(2 * N) * sizeof(int32_t)));
    int32_t* skey = perm + N;
    with_tokens(tokens, [&](auto tp) {
      embed_rank<<<::mt::cuda::blocks_for(N, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(N, Vs, v0, tp, perm,
                                                                                            skey);
      MT_CUDA_CHECK_LAUNCH();
    });
    const dim3 grid(static_cast<unsigned>(N), ::mt::cuda::blocks_for(C, kThreads));
    embed_bwd_segments<T, S><<<grid, kThreads, 0, ::mt::cuda::stream()>>>(N, C, Vs, perm, skey, d, dw);
    MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void position_add_forward(const Tensor& pos, int64_t B, const Tensor& out) {
  const int64_t C = out.dim(-1), N = C == 0 ? 0 : out.numel() / C;
  MT_CHECK(B > 0, "position_add_forward: batch must be positive");
  MT_CHECK(pos.numel() >= (N / B) * C, "position_add_forward: too few positions");
  check_on_gpu({&pos, &out}, "position_add_forward");
  float_types(pos.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    x_types<T>(out.dtype(), "position_add_forward", "out", [&](auto stag_) {
      using S = decltype(stag_);
      const T* p = pos.ptr<T>();
      S* o = out.ptr<S>();
      const int64_t n = N * C;
      if (n == 0) return;
      pos_add_fwd<T, S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, B, p, o);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void position_add_backward(const Tensor& dout, int64_t B, const Tensor& dpos) {
  const int64_t C = dout.dim(-1), N = C == 0 ? 0 : dout.numel() / C;
  MT_CHECK(B > 0, "position_add_backward: batch must be positive");
  check_on_gpu({&dout, &dpos}, "position_add_backward");
  float_types(dpos.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    x_types<T>(dout.dtype(), "position_add_backward", "dout", [&](auto stag_) {
      using S = decltype(stag_);
      const S* d = dout.ptr<S>();
      T* dp = dpos.ptr<T>();
      const int64_t n = (N / B) * C;
      if (n == 0) return;
      pos_add_bwd<T, S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, B, d, dp);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mt::kernels::cuda
