// CUDA twins of kernels/cpu/cross_entropy.cc: vocabulary-parallel softmax
// cross-entropy (kernels/cross_entropy.h has the contract), fp32 or fp64
// logits, int32 or int64 targets, vocab_start for the tensor-parallel shard.
//
// xent_partials: one block of kThreads per row (rows are V wide, V may be
//   50k+; row offsets are int64), ONE read of the row (a row of training's
//   32k-50k fp32 logits does not stay in L2 between two passes): each thread
//   runs an online softmax over its strided subset (running max m, sum of
//   exp(l - m) rescaled when m grows); the row max is block_max (exact in any
//   order), each thread's sum is rescaled to it and block_sum adds them
//   (fixed tree: deterministic). The sum is the CPU twin's two-pass one up to
//   rounding (a few ulp). Thread 0 writes max, sum and the target's logit (0
//   when the target is outside this shard).
// xent_rescale / xent_loss: grid-stride loops over the N rows.
// xent_backward: one block per row; thread j-strided over the row writes
//   d[j] = (g * exp(l[j] - max)) * (1 / sum), minus g at the target, where
//   g = dloss[i] (0 for an ignored row). Each element is read and written by
//   the same thread, so dlogits may alias logits.
// xent_backward_half: the same float value through the same device function,
//   rounded to bf16 as written, so it is bitwise xent_backward + cast here.
// exp is expf for fp32 and exp for fp64, as the CPU twin's precision (its
// fp32 exp is a 1-ulp polynomial, so fp32 agrees to a few ulp, not bitwise).
// The products and the target subtraction use mul_rn/sub_rn, so nvcc cannot
// fuse "value - g" into an FMA: the target element rounds like the CPU's
// "d[t] = value; d[t] -= g".
#include <type_traits>

#include "core/cuda/check.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/pointwise_common.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace ::mt::kernels::cuda::pointwise;

// g * exp(l - m) * inv, minus g when this is the target column.
template <typename T>
__device__ __forceinline__ T xent_grad(T g, T l, T m, T inv, bool is_target) {
  T val = mul_rn(mul_rn(g, exp_t(l - m)), inv);
  return is_target ? sub_rn(val, g) : val;
}

template <typename T, typename Tok>
__global__ void partials_k(int64_t V, const T* __restrict__ lg, const Tok* __restrict__ tg, int64_t v0, T* mx,
                           T* se, T* tl) {
  const int64_t i = blockIdx.x;
  const T* r = lg + i * V;
  // One pass over the row: each thread keeps the running max m of its
  // elements and their sum s of exp(l - m), rescaling s when m grows; the
  // block then takes the row max and adds the threads' sums rescaled to it.
  T m = r[0], s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const T v = r[j];
    if (v > m) {
      s = s * exp_t(m - v) + T(1);
      m = v;
    } else {
      s += exp_t(v - m);
    }
  }
  const T row_max = block_max(m, r[0]);
  s = block_sum(s == T(0) ? T(0) : s * exp_t(m - row_max));
  m = row_max;
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(tg[i]) - v0;
    mx[i] = m;
    se[i] = s;
    tl[i] = (t >= 0 && t < V) ? r[t] : T(0);
  }
}

template <typename T>
__global__ void rescale_k(int64_t n, T* se, const T* __restrict__ lmax, const T* __restrict__ gmax) {
  for (int64_t i = gs_begin(); i < n; i += gs_stride()) se[i] *= exp_t(lmax[i] - gmax[i]);
}

__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }

template <typename T, typename Tok>
__global__ void loss_k(int64_t n, const T* __restrict__ mx, const T* __restrict__ se, const T* __restrict__ tl,
                       const Tok* __restrict__ tg, T* loss) {
  for (int64_t i = gs_begin(); i < n; i += gs_stride())
    loss[i] = tg[i] < 0 ? T(0) : log_t(se[i]) + mx[i] - tl[i];
}

// One block per row; Out is T (xent_backward) or bf16 (xent_backward_half, T = float).
template <typename T, typename Out, typename Tok>
__global__ void backward_k(int64_t V, const T* lg, const Tok* __restrict__ tg, int64_t v0, const T* __restrict__ mx,
                           const T* __restrict__ se, const T* __restrict__ dl, Out* dlg) {
  const int64_t i = blockIdx.x;
  const T* r = lg + i * V;
  Out* d = dlg + i * V;
  const int64_t tgt = static_cast<int64_t>(tg[i]);
  const T g = tgt < 0 ? T(0) : dl[i], m = mx[i], inv = div_rn(T(1), se[i]);
  const int64_t t = tgt - v0;
  const bool has_target = tgt >= 0 && t >= 0 && t < V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const T val = xent_grad(g, r[j], m, inv, has_target && j == t);
    if constexpr (std::is_same_v<Out, bf16>) d[j] = bf16{bf16_bits_from_float(val)};
    else d[j] = val;
  }
}

void check_targets(const Tensor& t, int64_t N) {
  MT_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64, "cross entropy: targets must be int32 or int64");
  MT_CHECK(t.numel() == N, "cross entropy: one target per row");
}

// f(ptr) with the targets as const int32_t* or const int64_t* (check_targets ran).
template <typename F>
void with_targets(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kI32) f(static_cast<const int32_t*>(t.ptr<int32_t>()));
  else f(static_cast<const int64_t*>(t.ptr<int64_t>()));
}

}  // namespace

void xent_partials(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                   const Tensor& sumexp, const Tensor& target_logit) {
  int64_t V = logits.dim(-1), N = V == 0 ? 0 : logits.numel() / V;
  check_targets(targets, N);
  check_on_gpu({&logits, &targets, &max, &sumexp, &target_logit}, "xent_partials");
  float_types(logits.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T* lg = logits.ptr<T>();
    T *mx = max.ptr<T>(), *se = sumexp.ptr<T>(), *tl = target_logit.ptr<T>();
    if (N == 0) return;
    with_targets(targets, [&](auto tp) {
      partials_k<<<row_grid(N), kThreads, 0, ::mt::cuda::stream()>>>(V, lg, tp, v0, mx, se, tl);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void xent_rescale(const Tensor& sumexp, const Tensor& local_max, const Tensor& global_max) {
  check_on_gpu({&sumexp, &local_max, &global_max}, "xent_rescale");
  float_types(sumexp.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const int64_t n = sumexp.numel();
    if (n == 0) return;
    T* se = sumexp.ptr<T>();
    const T *lm = local_max.ptr<T>(), *gm = global_max.ptr<T>();
    rescale_k<T><<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, se, lm, gm);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void xent_loss(const Tensor& max, const Tensor& sumexp, const Tensor& target_logit, const Tensor& targets,
               const Tensor& loss) {
  check_targets(targets, loss.numel());
  check_on_gpu({&max, &sumexp, &target_logit, &targets, &loss}, "xent_loss");
  float_types(loss.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const int64_t n = loss.numel();
    if (n == 0) return;
    const T *mx = max.ptr<T>(), *se = sumexp.ptr<T>(), *tl = target_logit.ptr<T>();
    T* lp = loss.ptr<T>();
    with_targets(targets, [&](auto tp) {
      loss_k<<<grid_for(n), kThreads, 0, ::mt::cuda::stream()>>>(n, mx, se, tl, tp, lp);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void xent_backward(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                   const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  int64_t V = logits.dim(-1), N = V == 0 ? 0 : logits.numel() / V;
  check_targets(targets, N);
  MT_CHECK(dlogits.numel() == logits.numel(), "xent_backward: dlogits size");
  check_on_gpu({&logits, &targets, &max, &sumexp, &dloss, &dlogits}, "xent_backward");
  float_types(logits.dtype(), [&](auto tag_) {
    using T = decltype(tag_);
    const T *lg = logits.ptr<T>(), *mx = max.ptr<T>(), *se = sumexp.ptr<T>(), *dl = dloss.ptr<T>();
    T* d = dlogits.ptr<T>();
    if (N == 0) return;
    with_targets(targets, [&](auto tp) {
      backward_k<T, T><<<row_grid(N), kThreads, 0, ::mt::cuda::stream()>>>(V, lg, tp, v0, mx, se, dl, d);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void xent_backward_half(const Tensor& logits, const Tensor& targets, int64_t v0, const Tensor& max,
                        const Tensor& sumexp, const Tensor& dloss, const Tensor& dlogits) {
  int64_t V = logits.dim(-1), N = V == 0 ? 0 : logits.numel() / V;
  check_targets(targets, N);
  MT_CHECK(logits.dtype() == DType::kF32 && dlogits.dtype() == DType::kBF16 && dlogits.numel() == logits.numel(),
           "xent_backward_half: fp32 logits [N, V] and bf16 dlogits [N, V]");
  check_on_gpu({&logits, &targets, &max, &sumexp, &dloss, &dlogits}, "xent_backward_half");
  const float *lg = logits.ptr<float>(), *mx = max.ptr<float>(), *se = sumexp.ptr<float>(), *dl = dloss.ptr<float>();
  bf16* d = dlogits.ptr<bf16>();
  if (N == 0) return;
  with_targets(targets, [&](auto tp) {
    backward_k<float, bf16><<<row_grid(N), kThreads, 0, ::mt::cuda::stream()>>>(V, lg, tp, v0, mx, se,
                                                                                             dl, d);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::kernels::cuda
