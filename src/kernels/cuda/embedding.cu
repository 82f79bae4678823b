// CUDA twins of kernels/cpu/embedding.cc: vocabulary-sharded embedding
// lookup and gradient, learned position add and its gradient, fp32 or fp64
// tables, int32 or int64 tokens (kernels/embedding.h has the contract).
//
// embedding_forward: grid-stride loop over out [N, C]; element e is row
//   i = e / C, column c = e % C; a token outside [vocab_start, vocab_start +
//   Vs) yields 0.
// embedding_backward (ACCUMULATES): one thread per column c, looping the rows
//   i = 0..N-1 in order and doing dweight[tok_i - vocab_start, c] += dout[i, c]
//   directly in memory, exactly the CPU twin's per-column order, so the result
//   is bitwise the CPU's and deterministic. Parallelism is only C threads
//   (a read-modify-write chain of N steps each); correct first, a sorted-
//   token segmented version can replace it if it shows in profiles.
// position_add_forward: grid-stride loop, out[r, c] += pos[r / B, c].
// position_add_backward (ACCUMULATES): one thread per (t, c), adding
//   dout[t*B + b, c] for b = 0..B-1 in order onto dpos[t, c]: bitwise the CPU's.
#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/embedding.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

template <typename T, typename Tok>
__global__ void embed_fwd(int64_t n, int64_t C, int64_t Vs, int64_t v0, const Tok* __restrict__ tokens,
                          const T* __restrict__ w, T* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    const int64_t i = e / C, c = e - i * C;
    const int64_t t = static_cast<int64_t>(tokens[i]) - v0;
    out[e] = (t >= 0 && t < Vs) ? w[t * C + c] : T(0);
  }
}

// One thread per column; rows in order (see the header comment).
template <typename T, typename Tok>
__global__ void embed_bwd(int64_t N, int64_t C, int64_t Vs, int64_t v0, const Tok* __restrict__ tokens,
                          const T* __restrict__ dout, T* __restrict__ dw) {
  const int64_t c = gs_begin();
  if (c >= C) return;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = static_cast<int64_t>(tokens[i]) - v0;
    if (t < 0 || t >= Vs) continue;
    dw[t * C + c] += dout[i * C + c];
  }
}

template <typename T>
__global__ void pos_add_fwd(int64_t n, int64_t C, int64_t B, const T* __restrict__ pos, T* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    const int64_t r = e / C, c = e - r * C;
    out[e] += pos[(r / B) * C + c];
  }
}

// n = (N / B) * C items; item e is position t = e / C, column c = e % C.
template <typename T>
__global__ void pos_add_bwd(int64_t n, int64_t C, int64_t B, const T* __restrict__ dout, T* __restrict__ dpos) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    const int64_t t = e / C, c = e - t * C;
    T acc = dpos[e];
    for (int64_t b = 0; b < B; ++b) acc += dout[(t * B + b) * C + c];
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
    const T* w = weight.ptr<T>();
    T* o = out.ptr<T>();
    const int64_t n = N * C;
    if (n == 0) return;
    with_tokens(tokens, [&](auto tp) {
      embed_fwd<<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, Vs, v0, tp, w, o);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t v0, const Tensor& dweight) {
  const int64_t C = dweight.dim(-1), Vs = C == 0 ? 0 : dweight.numel() / C, N = tokens.numel();
  MT_CHECK(dout.numel() == N * C, "embedding_backward: dout must be [N, C]");
  check_on_gpu({&tokens, &dout, &dweight}, "embedding_backward");
  float_types(dweight.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T* d = dout.ptr<T>();
    T* dw = dweight.ptr<T>();
    if (N == 0 || C == 0) return;
    with_tokens(tokens, [&](auto tp) {
      embed_bwd<<<::mt::cuda::blocks_for(C, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(N, C, Vs, v0, tp, d, dw);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void position_add_forward(const Tensor& pos, int64_t B, const Tensor& out) {
  const int64_t C = out.dim(-1), N = C == 0 ? 0 : out.numel() / C;
  MT_CHECK(B > 0, "position_add_forward: batch must be positive");
  MT_CHECK(pos.numel() >= (N / B) * C, "position_add_forward: too few positions");
  check_on_gpu({&pos, &out}, "position_add_forward");
  float_types(out.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T* p = pos.ptr<T>();
    T* o = out.ptr<T>();
    const int64_t n = N * C;
    if (n == 0) return;
    pos_add_fwd<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, B, p, o);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void position_add_backward(const Tensor& dout, int64_t B, const Tensor& dpos) {
  const int64_t C = dout.dim(-1), N = C == 0 ? 0 : dout.numel() / C;
  MT_CHECK(B > 0, "position_add_backward: batch must be positive");
  check_on_gpu({&dout, &dpos}, "position_add_backward");
  float_types(dout.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T* d = dout.ptr<T>();
    T* dp = dpos.ptr<T>();
    const int64_t n = (N / B) * C;
    if (n == 0) return;
    pos_add_bwd<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, B, d, dp);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
