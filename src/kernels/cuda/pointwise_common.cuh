#pragma once
// Helpers shared by the pointwise and row-reduction CUDA twins (norm,
// activation, rope, embedding, elementwise, adamw, cross_entropy): host-side
// dtype dispatch with the CPU twins' messages, grid sizing for grid-stride
// loops, deterministic block reductions, correctly rounded arithmetic that
// the compiler may not contract into FMAs, and bf16 rounding bit-identical to
// mt::float_to_bf16.
//
// Determinism: every reduction here has a fixed shape (fixed block size,
// shuffle-down within a warp, then warp 0 over the per-warp sums in warp
// order), so the same inputs give the same bits on every run. No atomics.

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/cuda/check.cuh"
#include "core/tensor.h"
#include "kernels/out_types.h"

namespace mt::kernels::cuda::pointwise {

// Threads per block of every kernel here; a multiple of 32 (block_sum needs whole warps).
inline constexpr int kThreads = 256;
// Grid-stride loops cap the grid: enough blocks to fill any GPU, and a grid
// size far below the 2^31 - 1 limit whatever n is.
inline constexpr int64_t kMaxBlocks = 65535;

// Blocks for a grid-stride loop over n items (at least 1; callers skip n == 0).
inline unsigned grid_for(int64_t n) {
  unsigned b = ::mt::cuda::blocks_for(n, kThreads);
  return b > kMaxBlocks ? static_cast<unsigned>(kMaxBlocks) : b;
}

// Grid for a one-block-per-row kernel (gridDim.x is at most 2^31 - 1).
inline unsigned row_grid(int64_t rows) {
  MT_CHECK(rows >= 1 && rows <= 0x7fffffff, "CUDA kernel: row count out of the grid's range");
  return static_cast<unsigned>(rows);
}

// Pointer of type T, or nullptr for an undefined (optional) tensor.
template <typename T>
T* opt_ptr(const Tensor& t) {
  return t.defined() ? t.ptr<T>() : nullptr;
}

// Every defined tensor of a CUDA twin's call lives on the GPU (a host pointer
// in a kernel would be an illegal address reported far from the call).
inline void check_on_gpu(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts)
    MT_CHECK(!t->defined() || t->device() == Device::kCuda,
             std::string(op) + ": every tensor must be on the GPU (a host tensor was passed to the CUDA twin)");
}

// ---------------------------------------------------------------- device helpers

// First index and stride of a grid-stride loop, in int64 (sizes may pass 2^31).
__device__ __forceinline__ int64_t gs_begin() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gs_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Correctly rounded +, -, *, /, sqrt that nvcc never fuses into an FMA:
// with them a device expression rounds exactly like the same expression in
// the CPU twins compiled with -ffp-contract=off.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// exp in the type's own precision, as the CPU twins use it (expf for fp32, exp for fp64).
__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }

// mt::float_to_bf16 bit for bit: quiet NaN, else round to nearest even.
__device__ __forceinline__ uint16_t bf16_bits_from_float(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float float_from_bf16_bits(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// A stored value widened to the compute type T (exact).
template <typename T, typename S>
__device__ __forceinline__ T ld(S v) {
  if constexpr (std::is_same_v<S, bf16>) return static_cast<T>(float_from_bf16_bits(v.bits));
  else return static_cast<T>(v);
}

// v rounded to the output type Y (bf16: as bf16_bits_from_float).
template <typename Y, typename T>
__device__ __forceinline__ Y to_out(T v) {
  if constexpr (std::is_same_v<Y, bf16>) return bf16{bf16_bits_from_float(static_cast<float>(v))};
  else return static_cast<Y>(v);
}

// ---------------------------------------------------------------- packed access
// Pack<S, W>: W consecutive elements of S moved as one unit, aligned to its
// size up to 16 bytes, so that a load or store of a Pack is one 16-byte (or
// 8- or 4-byte) memory instruction instead of W narrow ones (a 32-byte Pack
// is two). Kernels that take Packs need every pointer aligned to
// pack_align<S, W>() and row lengths that are multiples of W (the host
// checks with packs_fit, else launches the element-wise kernel).
template <typename S, int W>
struct alignas(sizeof(S) * W >= 16 ? 16 : sizeof(S) * W) Pack {
  S v[W];
};
template <typename S, int W>
constexpr size_t pack_align() {
  return alignof(Pack<S, W>);
}
// Elements per 16 bytes of S: the widest single load (bf16: 8, fp32: 4, fp64: 2).
template <typename S>
inline constexpr int kVec = static_cast<int>(16 / sizeof(S));

template <int W, typename S>
__device__ __forceinline__ Pack<S, W> ld_pack(const S* p) {
#if defined(MT_CUDA_EMULATOR)
  emu::check_vector_access(p, alignof(Pack<S, W>), "ld_pack");
#endif
  return *reinterpret_cast<const Pack<S, W>*>(p);
}
template <int W, typename S>
__device__ __forceinline__ void st_pack(S* p, const Pack<S, W>& v) {
#if defined(MT_CUDA_EMULATOR)
  emu::check_vector_access(p, alignof(Pack<S, W>), "st_pack");
#endif
  *reinterpret_cast<Pack<S, W>*>(p) = v;
}

// Host: every defined pointer aligned to `align` bytes.
inline bool packs_fit(size_t align, std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p && reinterpret_cast<uintptr_t>(p) % align != 0) return false;
  return true;
}

// q = e / d, r = e % d for 0 <= e, 0 < d. 64-bit integer division is a long
// subroutine on the GPU (dozens of instructions), 32-bit a short one: index
// arithmetic takes the 32-bit one whenever both operands fit, which they do
// for every tensor below 2^32 elements.
__device__ __forceinline__ void divmod(int64_t e, int64_t d, int64_t& q, int64_t& r) {
  if (((e | d) >> 32) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(e) / static_cast<uint32_t>(d);
    q = q32;
    r = e - static_cast<int64_t>(q32) * d;
  } else {
    q = e / d;
    r = e - q * d;
  }
}
__device__ __forceinline__ int64_t div_idx(int64_t e, int64_t d) {
  int64_t q, r;
  divmod(e, d, q, r);
  return q;
}

// Sum over the 32 lanes of a warp; the total is valid in lane 0 only
// (shuffle-down tree: a fixed association order).
template <typename T>
__device__ __forceinline__ T warp_sum_to_lane0(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max_to_lane0(T v) {
  for (int off = 16; off > 0; off >>= 1) {
    T o = __shfl_down_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Sum of v over the block, returned to every thread (all threads get lane 0
// of warp 0's bits). REQUIRES: blockDim.x a multiple of 32, at most 1024,
// blockDim.y == blockDim.z == 1, and every thread of the block calls it (it
// holds __syncthreads). Safe to call back to back.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum_to_lane0(v);
  __syncthreads();  // an earlier call's readers of part[0] are done
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? part[lane] : T(0);
    w = warp_sum_to_lane0(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// Maximum of v over the block (same contract as block_sum); `lowest` fills
// the lanes of missing warps.
template <typename T>
__device__ T block_max(T v, T lowest) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max_to_lane0(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? part[lane] : lowest;
    w = warp_max_to_lane0(w);
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

}  // namespace mt::kernels::cuda::pointwise
