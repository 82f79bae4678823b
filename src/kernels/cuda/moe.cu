// CUDA twins of kernels/cpu/moe.cc (kernels/moe.h has the contract).
//
// moe_route, moe_route_backward: one thread per token running the CPU
//   twin's row functions (kernels/moe_row.h; E is at most a few hundred: the
//   router is a small fraction of a layer).
// moe_dispatch_map: two kernels with one block per expert: the first counts
//   the expert's slots (a block sum), the second takes the counts of the
//   lower experts as its offset and numbers its slots in slot order by a
//   block-wide scan of 256 slots at a time: the CPU's map exactly. Every
//   block reads all N k slot choices (E N k int32 reads in all).
// moe_drop: one thread per slot (t, j) counts the slots of its segment that
//   chose the same expert and come before it (moe_row::drop_before), and
//   keeps its expert when fewer than the capacity do: O((N k / segments)^2)
//   reads of idx and probs, spread over the whole grid, the count stopping
//   at the capacity. Exact: no ordering ambiguity, the CPU's choice.
// moe_permute: grid-stride copy of rows. moe_unpermute: grid-stride over
//   out [N, C], j ascending as the CPU. moe_unpermute_backward: dy
//   grid-stride; dprobs one warp per (t, j), lanes strided over C and a
//   fixed shuffle tree (deterministic; rounding differs from the CPU's
//   sequential sum).
#include "core/cuda/check.cuh"
#include "kernels/cuda/pointwise_common.cuh"
#include "kernels/moe.h"
#include "kernels/moe_row.h"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

template <typename T>
__global__ void route_fwd(int64_t N, int64_t E, int64_t k, bool pre, bool sig, const T* __restrict__ b, int64_t G,
                          int64_t gk, T scale, const T* __restrict__ l, int32_t* __restrict__ ix, T* __restrict__ p,
                          T* __restrict__ s, T* __restrict__ z) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < N) moe_row::route(l + t * E, E, k, pre, sig, b, G, gk, scale, ix + t * k, p + t * k, s + t * E, z + t);
}

template <typename T>
__global__ void route_bwd(int64_t N, int64_t E, int64_t k, int64_t G, bool pre, bool sig, T scale, T zz,
                          const T* __restrict__ dp,
                          const int32_t* __restrict__ ix, const T* __restrict__ p, const T* __restrict__ s,
                          const T* __restrict__ zl, const T* __restrict__ a, const T* __restrict__ l,
                          T* __restrict__ dl) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < N)
    moe_row::route_backward(dp + t * k, ix + t * k, p + t * k, s + t * E, zl[t], a ? a + (t % G) * E : nullptr, zz,
                            E, k, pre, sig,
                            l ? l + t * E : nullptr, scale, dl + t * E);
}

// counts[e] = the slots choosing expert e: block e, threads strided over the
// slots, one block sum.
__global__ void __launch_bounds__(kThreads) dispatch_count(int64_t M, const int32_t* __restrict__ ix,
                                                           int32_t* __restrict__ counts) {
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  int32_t n = 0;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) n += ix[i] == e ? 1 : 0;
  n = block_sum(n);
  if (threadIdx.x == 0) counts[e] = n;
}

// Block e numbers expert e's slots in slot order: the lower experts' counts
// as the offset, then blockDim.x slots at a time an exclusive scan of "is
// mine" flags (Hillis-Steele in shared memory), the running total carried.
__global__ void __launch_bounds__(kThreads) dispatch_pos(int64_t M, int64_t k, const int32_t* __restrict__ ix,
                                                         const int32_t* __restrict__ counts, int32_t* __restrict__ src,
                                                         int32_t* __restrict__ pos) {
  __shared__ int32_t scan[kThreads];
  __shared__ int64_t base;
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  if (threadIdx.x == 0) {
    int64_t o = 0;
    for (int32_t i = 0; i < e; ++i) o += counts[i];
    base = o;
  }
  __syncthreads();
  for (int64_t i0 = 0; i0 < M; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x;
    const int32_t mine = i < M && ix[i] == e ? 1 : 0;
    if (e == 0 && i < M && ix[i] < 0) pos[i] = -1;  // dropped (moe_drop): no slot
    scan[threadIdx.x] = mine;
    __syncthreads();
    for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
      const int32_t add = threadIdx.x >= static_cast<unsigned>(off) ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    if (mine) {
      const int64_t p = base + scan[threadIdx.x] - 1;  // inclusive scan - 1: the slots before this one
      pos[i] = static_cast<int32_t>(p);
      src[p] = static_cast<int32_t>(i / k);
    }
    __syncthreads();  // everyone has read base and scan before they change
    if (threadIdx.x == 0) base += scan[blockDim.x - 1];
    __syncthreads();
  }
}

template <typename T>
__global__ void drop_slots(int64_t M, int64_t Ms, int64_t k, int64_t capacity, bool by_position,
                           const int32_t* __restrict__ ix, const T* __restrict__ p, int32_t* __restrict__ kept) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M) return;
  const int32_t e = ix[i];
  const int64_t s0 = (i / Ms) * Ms, ti = i / k;
  const T pi = p[i];
  int64_t before = 0;
  for (int64_t j = s0; j < s0 + Ms && before < capacity; ++j)
    if (ix[j] == e && j != i && moe_row::drop_before(p[j], j / k, pi, ti, by_position)) ++before;
  kept[i] = before < capacity ? e : -1;
}

template <typename S>
__global__ void permute_rows(int64_t n, int64_t C, const int32_t* __restrict__ src, const S* __restrict__ x,
                             S* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t p, c;
    divmod(e, C, p, c);
    out[e] = x[static_cast<int64_t>(src[p]) * C + c];
  }
}

template <typename T, typename S, typename Y>
__global__ void unpermute_rows(int64_t n, int64_t C, int64_t k, const int32_t* __restrict__ pos,
                               const T* __restrict__ w, const S* __restrict__ y, Y* __restrict__ out) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t t, c;
    divmod(e, C, t, c);
    T acc = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (pos[t * k + j] < 0) continue;  // dropped
      const T v = ld<T>(y[static_cast<int64_t>(pos[t * k + j]) * C + c]);
      acc += w ? w[t * k + j] * v : v;
    }
    out[e] = to_out<Y>(acc);
  }
}

template <typename T, typename SO, typename SD>
__global__ void unpermute_bwd_dy(int64_t n, int64_t C, int64_t k, const int32_t* __restrict__ pos,
                                 const T* __restrict__ w, const SO* __restrict__ d, SD* __restrict__ dy) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) {
    int64_t tj, c;  // slot (t, j) = tj, flat over [N, k]
    divmod(e, C, tj, c);
    if (pos[tj] < 0) continue;  // dropped: no row
    dy[static_cast<int64_t>(pos[tj]) * C + c] = to_out<SD>(w[tj] * ld<T>(d[(tj / k) * C + c]));
  }
}

template <typename T, typename SO, typename SY>
__global__ void unpermute_bwd_dprobs(int64_t NK, int64_t C, int64_t k, const int32_t* __restrict__ pos,
                                     const SO* __restrict__ d, const SY* __restrict__ y, T* __restrict__ dw) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= NK) return;
  const int64_t t = warp / k, p = pos[warp];
  if (p < 0) {  // dropped: no gradient (the whole warp leaves together)
    if (lane == 0) dw[warp] = 0;
    return;
  }
  T acc = 0;
  for (int64_t c = lane; c < C; c += 32) acc += ld<T>(d[t * C + c]) * ld<T>(y[p * C + c]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (lane == 0) dw[warp] = acc;
}

template <typename T>
__global__ void sigmoid_fwd(int64_t n, const T* x, T* y) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) y[e] = moe_row::sigmoid_of(x[e]);
}

template <typename T>
__global__ void sigmoid_bwd(int64_t n, const T* y, const T* dy, T* dx) {
  for (int64_t e = gs_begin(); e < n; e += gs_stride()) dx[e] = dy[e] * y[e] * (T(1) - y[e]);
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouter& router, const Tensor& bias, const Tensor& idx,
               const Tensor& probs, const Tensor& scores, const Tensor& lse) {
  MT_CHECK(logits.ndim() == 2 && idx.ndim() == 2, "moe_route: logits must be [N, E] and idx [N, k]");
  const int64_t N = logits.dim(0), E = logits.dim(1), k = idx.dim(1);
  MT_CHECK(idx.dtype() == DType::kI32 && k >= 1 && k <= E && idx.numel() == N * k && probs.numel() == N * k &&
               scores.numel() == N * E && lse.numel() == N && probs.dtype() == logits.dtype() &&
               scores.dtype() == logits.dtype() && lse.dtype() == logits.dtype(),
           "moe_route: logits [N, E], idx [N, k] int32 (1 <= k <= E), probs [N, k], scores [N, E] and lse [N] in "
           "the logits' dtype");
  MT_CHECK(!bias.defined() || (bias.numel() == E && bias.dtype() == logits.dtype() && router.sigmoid),
           "moe_route: the expert bias must be [E] in the logits' dtype, with the sigmoid score function");
  check_groups(router, E, k);
  check_on_gpu({&logits, &idx, &probs, &scores, &lse, &bias}, "moe_route");
  if (N == 0) return;
  float_types(logits.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    route_fwd<T><<<::mt::cuda::blocks_for(N, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(
        N, E, k, router.pre_softmax, router.sigmoid, opt_ptr<T>(bias), router.num_groups, router.group_topk,
        static_cast<T>(router.scale), logits.ptr<T>(),
        idx.ptr<int32_t>(), probs.ptr<T>(), scores.ptr<T>(), lse.ptr<T>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void moe_route_backward(const Tensor& dprobs, const Tensor& idx, const Tensor& probs, const Tensor& scores,
                        const Tensor& lse, const Tensor& aux, double z, const MoeRouter& router, const Tensor& logits,
                        const Tensor& dlogits) {
  MT_CHECK(dlogits.ndim() == 2 && idx.ndim() == 2, "moe_route_backward: dlogits must be [N, E] and idx [N, k]");
  const int64_t N = dlogits.dim(0), E = dlogits.dim(1), k = idx.dim(1);
  const DType dt = dlogits.dtype();
  const int64_t G = aux.defined() && E > 0 ? aux.numel() / E : 1;  // aux rows: token t reads row t mod G
  MT_CHECK(idx.dtype() == DType::kI32 && k >= 1 && k <= E && dprobs.numel() == N * k && probs.numel() == N * k &&
               scores.numel() == N * E && lse.numel() == N && (!aux.defined() || (G >= 1 && aux.numel() == G * E)) &&
               dprobs.dtype() == dt && probs.dtype() == dt && scores.dtype() == dt && lse.dtype() == dt &&
               (!aux.defined() || aux.dtype() == dt),
           "moe_route_backward: shapes as moe_route's, dprobs [N, k], aux [E] or [G, E], all in dlogits' dtype");
  MT_CHECK(!router.sigmoid || (logits.numel() == N * E && logits.dtype() == dt),
           "moe_route_backward: the sigmoid score function needs the logits [N, E]");
  check_on_gpu({&dprobs, &idx, &probs, &scores, &lse, &aux, &logits, &dlogits}, "moe_route_backward");
  if (N == 0) return;
  float_types(dlogits.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    route_bwd<T><<<::mt::cuda::blocks_for(N, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(
        N, E, k, G, router.pre_softmax, router.sigmoid, static_cast<T>(router.scale), static_cast<T>(z), dprobs.ptr<T>(),
        idx.ptr<int32_t>(), probs.ptr<T>(), scores.ptr<T>(), lse.ptr<T>(), opt_ptr<T>(aux), opt_ptr<T>(logits),
        dlogits.ptr<T>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void moe_drop(const Tensor& idx, const Tensor& probs, int64_t segments, int64_t capacity, bool by_position,
              const Tensor& kept) {
  MT_CHECK(idx.ndim() == 2 && idx.dtype() == DType::kI32 && kept.dtype() == DType::kI32 &&
               kept.numel() == idx.numel() && probs.numel() == idx.numel(),
           "moe_drop: idx and kept [N, k] int32, probs [N, k]");
  const int64_t N = idx.dim(0), k = idx.dim(1), M = idx.numel();
  MT_CHECK(segments >= 1 && N % segments == 0 && capacity >= 0,
           "moe_drop: the tokens must split into equal segments and the capacity be >= 0");
  check_on_gpu({&idx, &probs, &kept}, "moe_drop");
  if (M == 0) return;
  float_types(probs.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    drop_slots<T><<<::mt::cuda::blocks_for(M, kThreads), kThreads, 0, ::mt::cuda::stream()>>>(
        M, M / segments, k, capacity, by_position, idx.ptr<int32_t>(), probs.ptr<T>(), kept.ptr<int32_t>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void moe_dispatch_map(const Tensor& idx, const Tensor& counts, const Tensor& src, const Tensor& pos) {
  const int64_t M = idx.numel(), k = idx.dim(1), E = counts.numel();
  MT_CHECK(idx.dtype() == DType::kI32 && counts.dtype() == DType::kI32 && src.dtype() == DType::kI32 &&
               pos.dtype() == DType::kI32,
           "moe_dispatch_map: int32 tensors expected");
  MT_CHECK(src.numel() == M && pos.numel() == M, "moe_dispatch_map: src and pos must have N k elements");
  check_on_gpu({&idx, &counts, &src, &pos}, "moe_dispatch_map");
  if (E == 0) return;
  MT_CHECK(E <= 0x7fffffff, "moe_dispatch_map: too many experts for the grid");
  dispatch_count<<<static_cast<unsigned>(E), kThreads, 0, ::mt::cuda::stream()>>>(M, idx.ptr<int32_t>(),
                                                                                  counts.ptr<int32_t>());
  MT_CUDA_CHECK_LAUNCH();
  dispatch_pos<<<static_cast<unsigned>(E), kThreads, 0, ::mt::cuda::stream()>>>(
      M, k, idx.ptr<int32_t>(), counts.ptr<int32_t>(), src.ptr<int32_t>(), pos.ptr<int32_t>());
  MT_CUDA_CHECK_LAUNCH();
}

void moe_permute(const Tensor& x, const Tensor& src, const Tensor& out) {
  MT_CHECK(x.dtype() == out.dtype(), "moe_permute: x and out must have one dtype");
  const int64_t C = x.dim(-1), M = src.numel();
  MT_CHECK(out.numel() == M * C, "moe_permute: out must be [M, C]");
  check_on_gpu({&x, &src, &out}, "moe_permute");
  const int64_t n = M * C;
  if (n == 0) return;
  storage_types(x.dtype(), [&](auto tag_) {
    using S = decltype(tag_);
    permute_rows<S><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, C, src.ptr<int32_t>(), x.ptr<S>(),
                                                                         out.ptr<S>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void moe_unpermute(const Tensor& y, const Tensor& pos, const Tensor& probs, const Tensor& out) {
  const int64_t C = out.dim(-1), N = out.numel() / C, k = N ? pos.numel() / N : 0;
  MT_CHECK(pos.numel() == N * k && (C == 0 || y.numel() % C == 0) && y.numel() <= N * k * C,
           "moe_unpermute: y [M <= N k, C], pos [N, k], out [N, C]");
  check_on_gpu({&y, &pos, &probs, &out}, "moe_unpermute");
  const int64_t n = N * C;
  if (n == 0) return;
  storage_types(y.dtype(), [&](auto ytag) {
    using S = decltype(ytag);
    using T = compute_t<S>;
    storage_types(out.dtype(), [&](auto otag) {
      using Y = decltype(otag);
      MT_CHECK(!probs.defined() || (probs.dtype() == dtype_of<T>() && probs.numel() == N * k),
               "moe_unpermute: probs must be [N, k] in the compute type (fp32 for bf16 y)");
      unpermute_rows<T, S, Y><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
          n, C, k, pos.ptr<int32_t>(), opt_ptr<T>(probs), y.ptr<S>(), out.ptr<Y>());
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& pos, const Tensor& probs,
                            const Tensor& dy, const Tensor& dprobs) {
  const int64_t C = dout.dim(-1), N = dout.numel() / C, k = N ? pos.numel() / N : 0;
  MT_CHECK(pos.numel() == N * k && (C == 0 || y.numel() % C == 0) && y.numel() <= N * k * C &&
               dy.numel() == y.numel() && probs.numel() == N * k &&
               dprobs.numel() == N * k && probs.dtype() == dprobs.dtype(),
           "moe_unpermute_backward: dout [N, C], y and dy [M <= N k, C], pos, probs and dprobs [N, k]");
  check_on_gpu({&dout, &y, &pos, &probs, &dy, &dprobs}, "moe_unpermute_backward");
  if (N * k * C == 0) return;
  float_types(probs.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    x_types<T>(dout.dtype(), "moe_unpermute_backward", "dout", [&](auto otag) {
      x_types<T>(y.dtype(), "moe_unpermute_backward", "y", [&](auto ytag) {
        x_types<T>(dy.dtype(), "moe_unpermute_backward", "dy", [&](auto dtag) {
          using SO = decltype(otag);
          using SY = decltype(ytag);
          using SD = decltype(dtag);
          {
            const int64_t n = N * k * C;
            unpermute_bwd_dy<T, SO, SD><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(
                n, C, k, pos.ptr<int32_t>(), probs.ptr<T>(), dout.ptr<SO>(), dy.ptr<SD>());
            MT_CUDA_CHECK_LAUNCH();
            const int64_t warps = N * k;
            unpermute_bwd_dprobs<T, SO, SY><<<::mt::cuda::blocks_for(warps * 32, kThreads), kThreads, 0,
                                              ::mt::cuda::stream()>>>(warps, C, k, pos.ptr<int32_t>(),
                                                                      dout.ptr<SO>(), y.ptr<SY>(), dprobs.ptr<T>());
            MT_CUDA_CHECK_LAUNCH();
          }
        });
      });
    });
  });
}

void moe_sigmoid(const Tensor& x, const Tensor& y) {
  check_same_numel(x, y, "moe_sigmoid");
  MT_CHECK(x.dtype() == y.dtype(), "moe_sigmoid: x and y must share one dtype");
  check_on_gpu({&x, &y}, "moe_sigmoid");
  const int64_t n = y.numel();
  if (n == 0) return;
  float_types(y.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    sigmoid_fwd<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, x.ptr<T>(), y.ptr<T>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

void moe_sigmoid_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_numel(y, dx, "moe_sigmoid_backward");
  check_same_numel(dy, dx, "moe_sigmoid_backward");
  MT_CHECK(y.dtype() == dx.dtype() && dy.dtype() == dx.dtype(), "moe_sigmoid_backward: y, dy and dx must share one dtype");
  check_on_gpu({&y, &dy, &dx}, "moe_sigmoid_backward");
  const int64_t n = dx.numel();
  if (n == 0) return;
  float_types(dx.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    sigmoid_bwd<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, y.ptr<T>(), dy.ptr<T>(), dx.ptr<T>());
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
