// The emulator itself (emu.h), on small kernels written for it: block
// barriers, __shared__ and dynamic shared memory, warp shuffles and the bf16
// mma give CUDA's results, and each check emu.h promises fires (poisoned
// shared memory, the scheduling order exposing a missing barrier, deadlocks,
// divergent barriers, host pointers, launch configurations,
// __launch_bounds__, the 48 KiB of static shared memory, the dynamic shared
// memory limits and cudaFuncSetAttribute, whole-warp mmas, memcpy kinds,
// aligned vector accesses);
// ldmatrix gives PTX's fragments and cp.async lands as late as PTX allows.
// Compiled only through translate.py, like the kernels it vouches for; never
// by nvcc.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

// n floats of device memory holding `init` (NaN when omitted: cudaMalloc's poison).
float* device_floats(size_t n, const std::vector<float>& init = {}) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  if (!init.empty()) {
    EXPECT_EQ(cudaMemcpyAsync(p, init.data(), n * sizeof(float), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  }
  return static_cast<float*>(p);
}

std::vector<float> host_floats(const float* d, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpyAsync(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  return v;
}

// n bf16 values (as bits) of device memory holding `init`.
uint16_t* device_bf16(const std::vector<uint16_t>& init) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, init.size() * sizeof(uint16_t)), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(p, init.data(), init.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, nullptr),
            cudaSuccess);
  return static_cast<uint16_t*>(p);
}

std::vector<float> iota(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Each block reverses its blockDim.x elements through shared memory.
__global__ void reverse_in_block(const float* x, float* y) {
  __shared__ float tile[256];
  const unsigned base = blockIdx.x * blockDim.x, t = threadIdx.x;
  tile[t] = x[base + t];
  __syncthreads();
  y[base + t] = tile[blockDim.x - 1 - t];
}

// One warp: y[2 lane] = shuffle-down sum (valid in lane 0), y[2 lane + 1] = butterfly sum (every lane).
__global__ void warp_sums(const float* x, float* y) {
  const float v = x[threadIdx.x];
  float down = v, butterfly = v;
  for (int off = 16; off > 0; off >>= 1) {
    down += __shfl_down_sync(0xffffffffu, down, off);
    butterfly += __shfl_xor_sync(0xffffffffu, butterfly, off);
  }
  y[2 * threadIdx.x] = down;
  y[2 * threadIdx.x + 1] = butterfly;
}

__global__ void read_unwritten_shared(float* y) {
  __shared__ float s[32];
  y[threadIdx.x] = s[threadIdx.x];
}

// Thread 0 sums what the block stored, without the __syncthreads it needs.
__global__ void sum_without_barrier(const float* x, float* y) {
  __shared__ float s[64];
  s[threadIdx.x] = x[threadIdx.x];
  if (threadIdx.x == 0) {
    float t = 0;
    for (int i = 0; i < 64; ++i) t += s[i];
    y[blockIdx.x] = t;
  }
}

__global__ void barrier_in_branch(float* y) {
  if (threadIdx.x < 16) __syncthreads();
  y[threadIdx.x] = 1;
}

__global__ void two_barriers(float* y) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  y[threadIdx.x] = 1;
}

__global__ void half_warp_shuffle(float* y) { y[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, y[threadIdx.x], 1); }

__global__ void __launch_bounds__(64) at_most_64_threads(float* y) { y[threadIdx.x] = 1; }

__global__ void too_much_shared(float* y) {
  __shared__ double big[7000];  // 56000 bytes
  big[threadIdx.x] = 1;
  y[threadIdx.x] = static_cast<float>(big[threadIdx.x]);
}

// Each block stores its `per_thread` elements per thread in dynamic shared
// memory, then every thread reads back those of the next thread (a barrier
// between): y is x with each block's runs of per_thread rotated by one run.
__global__ void rotate_through_dynamic_shared(const float* x, float* y, unsigned per_thread) {
  extern __shared__ float buf[];
  const unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x * per_thread;
  for (unsigned i = 0; i < per_thread; ++i) buf[t * per_thread + i] = x[base + t * per_thread + i];
  __syncthreads();
  const unsigned next = (t + 1) % blockDim.x;
  for (unsigned i = 0; i < per_thread; ++i) y[base + t * per_thread + i] = buf[next * per_thread + i];
}

// Reads dynamic shared memory before anything wrote it, then writes it (so
// that a buffer carried over from the previous block would show).
__global__ void read_unwritten_dynamic_shared(float* y) {
  extern __shared__ float buf[];
  y[blockIdx.x * blockDim.x + threadIdx.x] = buf[threadIdx.x];
  __syncthreads();
  buf[threadIdx.x] = 1;
}

// y[0]: the dynamic shared memory is 128-byte aligned; y[1]: two extern
// __shared__ arrays of a kernel start at the same address (as in CUDA).
__global__ void dynamic_shared_layout(float* y) {
  extern __shared__ unsigned char raw[];
  extern __shared__ float as_float[];
  if (threadIdx.x == 0) {
    y[0] = reinterpret_cast<uintptr_t>(raw) % 128 == 0 ? 1.0f : 0.0f;
    y[1] = static_cast<void*>(raw) == static_cast<void*>(as_float) ? 1.0f : 0.0f;
  }
}

// Launched without cudaFuncSetAttribute: 48 KiB of dynamic shared memory at most.
__global__ void default_dynamic_limit(float* y) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = 2;
  y[threadIdx.x] = buf[threadIdx.x];
}

// 8 KiB of static shared memory beside the dynamic.
__global__ void static_and_dynamic_shared(float* y) {
  extern __shared__ float buf[];
  __shared__ float fixed[2048];
  fixed[threadIdx.x] = 1;
  buf[threadIdx.x] = fixed[threadIdx.x];
  y[threadIdx.x] = buf[threadIdx.x];
}

// Writes one float past the end of a dynamic shared memory of 128 bytes.
__global__ void past_dynamic_shared(float* y) {
  extern __shared__ float buf[];
  buf[32 + threadIdx.x] = 1;
  y[threadIdx.x] = buf[threadIdx.x];
}

// Template kernels: launched with every template argument named (the
// emulator finds the kernel's cudaFuncSetAttribute maximum by its address),
// or with U left to deduction (the address is unknown: 48 KiB at most).
namespace templated {
template <typename T, int N>
__global__ void fill_through_dynamic_shared(T* y) {
  extern __shared__ T cells[];
  cells[threadIdx.x] = static_cast<T>(N);
  __syncthreads();
  y[threadIdx.x] = cells[blockDim.x - 1 - threadIdx.x];
}
template <typename T, typename U>
__global__ void copy_through_dynamic_shared(T* y, const U* x) {
  extern __shared__ unsigned char bytes[];
  T* cells = reinterpret_cast<T*>(bytes);
  cells[threadIdx.x] = static_cast<T>(x[threadIdx.x]);
  y[threadIdx.x] = cells[threadIdx.x];
}
}  // namespace templated

// Two bf16 values as one mma operand register, lo in the low half.
__device__ unsigned bf16x2(uint16_t lo, uint16_t hi) { return unsigned{lo} | unsigned{hi} << 16; }

// One warp per block, on the block's A (16 x 16, row-major), B (16 x 8,
// row-major: B[k][n] at 8 k + n) and C (16 x 8, row-major): d1 = A B + C,
// then (after a shuffle, which shares the warp barrier) d2 = A B + d1
// computed in place (d aliasing c). Fragments as PTX lays them out (emu.h).
__global__ void mma_twice(const uint16_t* A, const uint16_t* B, const float* C, float* D1, float* D2, float* S) {
  A += blockIdx.x * 256, B += blockIdx.x * 128, C += blockIdx.x * 128;
  D1 += blockIdx.x * 128, D2 += blockIdx.x * 128, S += blockIdx.x * 32;
  const unsigned lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const unsigned a[4] = {bf16x2(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                         bf16x2(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         bf16x2(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         bf16x2(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const unsigned b[2] = {bf16x2(B[2 * t * 8 + g], B[(2 * t + 1) * 8 + g]),
                         bf16x2(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
  const unsigned at[4] = {g * 8 + 2 * t, g * 8 + 2 * t + 1, (g + 8) * 8 + 2 * t, (g + 8) * 8 + 2 * t + 1};
  float c[4], d[4];
  for (int i = 0; i < 4; ++i) c[i] = C[at[i]];
  emu::mma_m16n8k16_bf16(d, a, b, c);
  for (int i = 0; i < 4; ++i) D1[at[i]] = d[i];
  S[lane] = __shfl_xor_sync(0xffffffffu, d[0], 1);
  emu::mma_m16n8k16_bf16(d, a, b, d);
  for (int i = 0; i < 4; ++i) D2[at[i]] = d[i];
}

// A 16-byte vector access (what pointwise::ld_pack checks) 4 bytes off.
__global__ void vector_access_misaligned(float* y) {
  emu::check_vector_access(y + 1, 16, "ld_pack");
  y[threadIdx.x] = 0;
}

__global__ void mma_in_half_warp(float* y) {
  const unsigned a[4] = {}, b[2] = {};
  float d[4] = {};
  emu::mma_m16n8k16_bf16(d, a, b, d);
  y[threadIdx.x] = d[0];
}

// Lanes 0..15 shuffle while lanes 16..31 mma at the same warp barrier.
__global__ void mma_beside_shuffle(float* y) {
  const unsigned a[4] = {}, b[2] = {};
  float d[4] = {};
  if (threadIdx.x < 16)
    d[0] = __shfl_xor_sync(0xffffffffu, d[0], 1);
  else
    emu::mma_m16n8k16_bf16(d, a, b, d);
  y[threadIdx.x] = d[0];
}

// ldmatrix: a 16 x 16 tile of distinct values (tile[r][c] = 256 r + c + 1)
// in shared memory with rows 24 elements (48 bytes) apart; the four 8 x 8
// quarters are matrices 0..3 (rows 0-7 | 8-15, columns 0-7 | 8-15, in the
// order (0,0) (8,0) (0,8) (8,8)). Each lane writes what .x4, .x4.trans, .x2
// and .x1 give it: out[lane * 11 + k].
// (Dynamic shared memory: 128-byte aligned, so its rows are 16-byte aligned.)
__global__ void ldmatrix_quarters(unsigned* out) {
  extern __shared__ uint16_t tile[];  // 16 * 24
  const unsigned lane = threadIdx.x;
  for (unsigned e = lane; e < 16 * 24; e += 32) tile[e] = static_cast<uint16_t>(e / 24 * 256 + e % 24 + 1);
  __syncthreads();
  const unsigned m = lane / 8, i = lane % 8;
  const uint16_t* row = tile + ((m & 1) * 8 + i) * 24 + (m >> 1) * 8;
  unsigned r[4], rt[4], r2[2], r1[1];
  emu::ldmatrix(r, 4, false, row);
  emu::ldmatrix(rt, 4, true, row);
  emu::ldmatrix(r2, 2, false, lane < 16 ? row : nullptr);  // lanes 16..31: ignored
  emu::ldmatrix(r1, 1, true, lane < 8 ? row : tile + 1);   // misaligned, but ignored
  unsigned* o = out + lane * 11;
  for (int k = 0; k < 4; ++k) o[k] = r[k], o[4 + k] = rt[k];
  o[8] = r2[0], o[9] = r2[1], o[10] = r1[0];
}

__global__ void ldmatrix_misaligned(unsigned* out) {
  extern __shared__ uint16_t tile[];  // 8 * 16
  for (unsigned e = threadIdx.x; e < 8 * 16; e += 32) tile[e] = 0;
  __syncthreads();
  unsigned r[1];
  emu::ldmatrix(r, 1, false, tile + threadIdx.x % 8 * 16 + (threadIdx.x == 3 ? 4 : 0));
  out[threadIdx.x] = r[0];
}

__global__ void ldmatrix_from_global(unsigned* out) {
  unsigned r[1];
  emu::ldmatrix(r, 1, false, out + threadIdx.x % 8 * 4);
  out[threadIdx.x] = r[0];
}

// cp.async: each of 4 threads copies its 16 bytes of src (and, for group 2,
// writes zeros) into a poisoned shared array and records what it reads at
// each step: out[t * 12 + k] = word 0 of its chunks (A, B) at (before any
// wait, after wait_group 1, after wait_group 0).
__global__ void cp_async_groups(const unsigned* src, unsigned* out) {
  extern __shared__ unsigned a[];  // 4 * 4, then b
  unsigned* b = a + 16;
  const unsigned t = threadIdx.x;
  for (unsigned e = t; e < 32; e += blockDim.x) (e < 16 ? a[e] : b[e - 16]) = 0xAAAAAAAAu;
  __syncthreads();
  emu::cp_async(a + 4 * t, src + 4 * t, 16);
  emu::cp_async_commit();
  emu::cp_async(b + 4 * t, src, 0);  // zero fill
  emu::cp_async_commit();
  unsigned* o = out + t * 12;
  o[0] = a[4 * t], o[1] = b[4 * t];
  emu::cp_async_wait(1);
  o[2] = a[4 * t], o[3] = b[4 * t];
  emu::cp_async_wait(0);
  o[4] = a[4 * t], o[5] = b[4 * t];
  // Uncommitted copies are not waited for; they land when the thread exits.
  emu::cp_async(a + 4 * t, src + 16 + 4 * t, 16);
  emu::cp_async_wait(0);
  o[6] = a[4 * t];
  emu::cp_async_commit();
  emu::cp_async_wait(0);
  o[7] = a[4 * t + 3];
}

// Each block reads its copy's first word before any wait: out[blockIdx.x].
__global__ void cp_async_read_before_wait(const unsigned* src, unsigned* out) {
  extern __shared__ unsigned a[];  // 4
  a[0] = 0xAAAAAAAAu;
  emu::cp_async(a, src, 16);
  emu::cp_async_commit();
  out[blockIdx.x] = a[0];
  emu::cp_async_wait(0);
}

__global__ void cp_async_to_global(const unsigned* src, unsigned* out) {
  emu::cp_async(out + 4 * threadIdx.x, src, 16);
  emu::cp_async_commit();
  emu::cp_async_wait(0);
}

__global__ void cp_async_misaligned(const unsigned* src, unsigned* out) {
  extern __shared__ unsigned a[];  // 8
  emu::cp_async(a, src + 1, 16);
  out[threadIdx.x] = a[0];
}

TEST(CudaEmu, OneDevice) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
}

TEST(CudaEmu, SharedMemoryIsPerBlockAndBarriersOrderIt) {
  float* x = device_floats(512, iota(512));
  float* y = device_floats(512);
  reverse_in_block<<<2, 256>>>(x, y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = host_floats(y, 512);
  for (unsigned i = 0; i < 512; ++i) ASSERT_EQ(got[i], static_cast<float>(i / 256 * 256 + 255 - i % 256)) << i;
  cudaFree(x);
  cudaFree(y);
}

TEST(CudaEmu, WarpShufflesExchangeLanes) {
  float* x = device_floats(32, iota(32));
  float* y = device_floats(64);
  warp_sums<<<1, 32>>>(x, y);
  const std::vector<float> got = host_floats(y, 64);
  EXPECT_EQ(got[0], 496.0f);  // 0 + 1 + ... + 31
  for (unsigned lane = 0; lane < 32; ++lane) EXPECT_EQ(got[2 * lane + 1], 496.0f) << "lane " << lane;
  cudaFree(x);
  cudaFree(y);
}

TEST(CudaEmu, UnwrittenSharedMemoryReadsNaN) {
  float* y = device_floats(32, std::vector<float>(32, 0.0f));
  read_unwritten_shared<<<1, 32>>>(y);
  for (float v : host_floats(y, 32)) EXPECT_TRUE(std::isnan(v));
  cudaFree(y);
}

TEST(CudaEmu, MissingBarrierShowsInOneOfTheSchedulingOrders) {
  float* x = device_floats(64, std::vector<float>(64, 1.0f));
  float* y = device_floats(2);
  sum_without_barrier<<<2, 64>>>(x, y);
  const std::vector<float> got = host_floats(y, 2);
  EXPECT_TRUE(std::isnan(got[0])) << "block 0 (ascending order): thread 0 sums before the others store";
  EXPECT_EQ(got[1], 64.0f) << "block 1 (descending order): thread 0 runs last";
  cudaFree(x);
  cudaFree(y);
}

// Every thread reads buf, the warp shuffles, then thread 0 refills buf with
// no __syncthreads after the other warps' reads: out[t] = what thread t read.
__global__ void refill_without_barrier(float* out) {
  __shared__ float buf[1];
  if (threadIdx.x == 0) buf[0] = 1.0f;
  __syncthreads();
  float v = buf[0];
  v = __shfl_xor_sync(0xffffffffu, v, 1);
  if (threadIdx.x == 0) buf[0] = 2.0f;
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

TEST(CudaEmu, AWarpRunsAheadToTheNextBarrier) {
  float* y = device_floats(128);
  refill_without_barrier<<<2, 64>>>(y);
  const std::vector<float> got = host_floats(y, 128);
  // Block 0 (ascending): warp 0 runs to its end, refill included, before warp 1 reads.
  for (int t = 0; t < 32; ++t) EXPECT_EQ(got[t], 1.0f) << "block 0 thread " << t;
  for (int t = 32; t < 64; ++t) EXPECT_EQ(got[t], 2.0f) << "block 0 thread " << t << ": the refill overtakes it";
  // Block 1 (descending): warp 1 runs first and reads before the refill.
  for (int t = 0; t < 64; ++t) EXPECT_EQ(got[64 + t], 1.0f) << "block 1 thread " << t;
  cudaFree(y);
}

TEST(CudaEmu, InvalidConfigurationsRunNothingAndSetTheLastError) {
  float* y = device_floats(32, std::vector<float>(32, 0.0f));
  at_most_64_threads<<<1, 2048>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "reading the error clears it";
  at_most_64_threads<<<dim3(1, 70000), 32>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 0.0f);
  cudaFree(y);
}

TEST(CudaEmu, DynamicSharedMemoryIsPerBlockAndBarriersOrderIt) {
  constexpr unsigned kThreads = 256, kPerThread = 64, kBytes = kThreads * kPerThread * sizeof(float);  // 64 KiB
  constexpr unsigned kN = 2 * kThreads * kPerThread;
  float* x = device_floats(kN, iota(kN));
  float* y = device_floats(kN);
  ASSERT_EQ(cudaFuncSetAttribute(rotate_through_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
            cudaSuccess);
  rotate_through_dynamic_shared<<<2, kThreads, kBytes>>>(x, y, kPerThread);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = host_floats(y, kN);
  for (unsigned i = 0; i < kN; ++i) {
    const unsigned block = i / (kThreads * kPerThread), t = i / kPerThread % kThreads, k = i % kPerThread;
    ASSERT_EQ(got[i], static_cast<float>((block * kThreads + (t + 1) % kThreads) * kPerThread + k)) << i;
  }
  cudaFree(x);
  cudaFree(y);
}

TEST(CudaEmu, UnwrittenDynamicSharedMemoryReadsNaNInEveryBlock) {
  float* y = device_floats(64, std::vector<float>(64, 0.0f));
  read_unwritten_dynamic_shared<<<2, 32, 32 * sizeof(float)>>>(y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = host_floats(y, 64);
  for (unsigned i = 0; i < 64; ++i) EXPECT_TRUE(std::isnan(got[i])) << "block " << i / 32 << " thread " << i % 32;
  cudaFree(y);
}

TEST(CudaEmu, DynamicSharedMemoryIsAlignedAndSharedByItsArrays) {
  float* y = device_floats(2, std::vector<float>(2, 0.0f));
  dynamic_shared_layout<<<1, 32, 100>>>(y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = host_floats(y, 2);
  EXPECT_EQ(got[0], 1.0f) << "128-byte aligned";
  EXPECT_EQ(got[1], 1.0f) << "both extern __shared__ arrays at one address";
  cudaFree(y);
}

TEST(CudaEmu, DynamicSharedMemoryAbove48KiBNeedsTheAttribute) {
  float* y = device_floats(32, std::vector<float>(32, 0.0f));
  default_dynamic_limit<<<1, 32, (48 << 10) + 4>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 0.0f) << "the refused launch ran";
  default_dynamic_limit<<<1, 32, 48 << 10>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 2.0f);

  EXPECT_EQ(cudaFuncSetAttribute(default_dynamic_limit, cudaFuncAttributeMaxDynamicSharedMemorySize, 300000),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(default_dynamic_limit, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(default_dynamic_limit, cudaFuncAttributeMaxDynamicSharedMemorySize, -1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(default_dynamic_limit, static_cast<cudaFuncAttribute>(9), 0), cudaErrorInvalidValue)
      << "only the dynamic shared memory maximum is emulated";
  default_dynamic_limit<<<1, 32, (48 << 10) + 4>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "the failed calls left the default in place";

  // The whole 227 KiB of an sm_90 block, through the const void* overload.
  ASSERT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(&default_dynamic_limit),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 232448),
            cudaSuccess);
  cudaMemsetAsync(y, 0, 32 * sizeof(float), nullptr);
  default_dynamic_limit<<<1, 32, 232448>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 2.0f);
  default_dynamic_limit<<<1, 32, 232448 + 4>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  // Lowering the maximum applies to the next launch.
  ASSERT_EQ(cudaFuncSetAttribute(default_dynamic_limit, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024),
            cudaSuccess);
  default_dynamic_limit<<<1, 32, 2048>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  cudaFree(y);
}

TEST(CudaEmu, TemplateKernelsFindTheirDynamicSharedMaximum) {
  float* y = device_floats(32, std::vector<float>(32, 0.0f));
  ASSERT_EQ(cudaFuncSetAttribute(templated::fill_through_dynamic_shared<float, 7>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 100000),
            cudaSuccess);
  ::templated::fill_through_dynamic_shared<float, 7><<<1, 32, 100000>>>(y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 7.0f);
  templated::fill_through_dynamic_shared<float, 8><<<1, 32, 100000>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "another instance keeps the default maximum";

  float* x = device_floats(32, iota(32));
  templated::copy_through_dynamic_shared<float><<<1, 32, 48 << 10>>>(y, x);  // U deduced
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(host_floats(y, 32), iota(32));
  cudaFree(x);
  cudaFree(y);
}

// A = bf16 values in [-1, 1) for a 16 x 16 and a 16 x 8 matrix per block, C
// in fp32; D compared with a double-precision reference, and with the
// emulator's documented order of summation (emu.h) exactly.
TEST(CudaEmu, MmaM16n8k16Bf16MatchesTheMatrixProduct) {
  constexpr unsigned kBlocks = 2;  // ascending and descending scheduling orders
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto bf16 = [&] {
    uint32_t bits;
    const float f = uniform(rng);
    std::memcpy(&bits, &f, 4);
    return static_cast<uint16_t>(bits >> 16);  // truncated: any bf16 value will do
  };
  auto value = [](uint16_t h) {
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  std::vector<uint16_t> a(kBlocks * 256), b(kBlocks * 128);
  std::vector<float> c(kBlocks * 128);
  for (auto& v : a) v = bf16();
  for (auto& v : b) v = bf16();
  for (auto& v : c) v = uniform(rng);
  uint16_t* da = device_bf16(a);
  uint16_t* db = device_bf16(b);
  float* dc = device_floats(c.size(), c);
  float* d1 = device_floats(c.size());
  float* d2 = device_floats(c.size());
  float* s = device_floats(kBlocks * 32);
  mma_twice<<<kBlocks, 32>>>(da, db, dc, d1, d2, s);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got1 = host_floats(d1, c.size()), got2 = host_floats(d2, c.size());
  const std::vector<float> got_s = host_floats(s, kBlocks * 32);
  for (unsigned blk = 0; blk < kBlocks; ++blk) {
    for (unsigned m = 0; m < 16; ++m)
      for (unsigned n = 0; n < 8; ++n) {
        const unsigned i = blk * 128 + m * 8 + n;
        double ref = c[i], scale = std::fabs(c[i]);
        float ordered = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {
          const float p = value(a[blk * 256 + m * 16 + k]) * value(b[blk * 128 + k * 8 + n]);
          ref += p, scale += std::fabs(p), ordered += p;
        }
        EXPECT_NEAR(got1[i], ref, 1e-6 * scale) << "block " << blk << " D[" << m << "][" << n << "]";
        EXPECT_EQ(got1[i], ordered + c[i]) << "block " << blk << " D[" << m << "][" << n << "]";
        EXPECT_NEAR(got2[i], ref + (ref - c[i]), 2e-6 * (scale + std::fabs(ref)))
            << "in place: block " << blk << " D[" << m << "][" << n << "]";
      }
    for (unsigned lane = 0; lane < 32; ++lane) {  // the shuffle between the mmas: lane ^ 1's d0 = D[g][2t]
      const unsigned src = lane ^ 1;
      EXPECT_EQ(got_s[blk * 32 + lane], got1[blk * 128 + (src >> 2) * 8 + 2 * (src & 3)]) << "lane " << lane;
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(d1);
  cudaFree(d2);
  cudaFree(s);
}

// The layouts PTX gives ldmatrix (emu.h), checked element by element.
TEST(CudaEmu, LdmatrixGivesPtxFragments) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 32 * 11 * sizeof(unsigned)), cudaSuccess);
  unsigned* d = static_cast<unsigned*>(p);
  ldmatrix_quarters<<<1, 32, 16 * 24 * 2>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<unsigned> got(32 * 11);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d, got.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, nullptr),
            cudaSuccess);
  // Element (r, c) of matrix m is tile[(m & 1) * 8 + r][(m >> 1) * 8 + c].
  auto at = [](unsigned m, unsigned r, unsigned c) { return ((m & 1) * 8 + r) * 256 + (m >> 1) * 8 + c + 1; };
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned i = lane / 4, j = lane % 4;
    const unsigned* o = got.data() + lane * 11;
    for (unsigned m = 0; m < 4; ++m) {
      EXPECT_EQ(o[m], at(m, i, 2 * j) | at(m, i, 2 * j + 1) << 16) << "x4 lane " << lane << " matrix " << m;
      EXPECT_EQ(o[4 + m], at(m, 2 * j, i) | at(m, 2 * j + 1, i) << 16) << "x4.trans lane " << lane << " matrix " << m;
    }
    EXPECT_EQ(o[8], at(0, i, 2 * j) | at(0, i, 2 * j + 1) << 16) << "x2 lane " << lane;
    EXPECT_EQ(o[9], at(1, i, 2 * j) | at(1, i, 2 * j + 1) << 16) << "x2 lane " << lane;
    EXPECT_EQ(o[10], at(0, 2 * j, i) | at(0, 2 * j + 1, i) << 16) << "x1.trans lane " << lane;
  }
  cudaFree(p);
}

// cp.async lands as late as PTX allows (emu.h): not before the thread's
// wait_group covers its group.
TEST(CudaEmu, CpAsyncLandsAtTheWaitThatCoversItsGroup) {
  std::vector<unsigned> src(32);
  for (unsigned e = 0; e < 32; ++e) src[e] = 100 + e;
  void* ps = nullptr;
  void* po = nullptr;
  ASSERT_EQ(cudaMalloc(&ps, 32 * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&po, 4 * 12 * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(ps, src.data(), 32 * sizeof(unsigned), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  cp_async_groups<<<1, 4, 32 * 4>>>(static_cast<const unsigned*>(ps), static_cast<unsigned*>(po));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<unsigned> got(4 * 12);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), po, got.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, nullptr),
            cudaSuccess);
  for (unsigned t = 0; t < 4; ++t) {
    const unsigned* o = got.data() + t * 12;
    EXPECT_EQ(o[0], 0xAAAAAAAAu) << "thread " << t << ": nothing lands before a wait";
    EXPECT_EQ(o[1], 0xAAAAAAAAu) << "thread " << t;
    EXPECT_EQ(o[2], 100 + 4 * t) << "thread " << t << ": wait_group 1 lands the older group";
    EXPECT_EQ(o[3], 0xAAAAAAAAu) << "thread " << t << ": and leaves the newer one pending";
    EXPECT_EQ(o[4], 100 + 4 * t) << "thread " << t;
    EXPECT_EQ(o[5], 0u) << "thread " << t << ": src-size 0 writes zeros";
    EXPECT_EQ(o[6], 100 + 4 * t) << "thread " << t << ": an uncommitted copy is not waited for";
    EXPECT_EQ(o[7], 116 + 4 * t + 3) << "thread " << t << ": committed, it lands";
  }
  cudaFree(ps);
  cudaFree(po);
}

// In odd blocks copies land as they are issued (emu.h): the other extreme.
TEST(CudaEmu, CpAsyncLandsAtOnceInOddBlocks) {
  std::vector<unsigned> src = {7, 8, 9, 10};
  void* ps = nullptr;
  void* po = nullptr;
  ASSERT_EQ(cudaMalloc(&ps, 4 * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&po, 3 * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(ps, src.data(), 4 * sizeof(unsigned), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  cp_async_read_before_wait<<<3, 1, 16>>>(static_cast<const unsigned*>(ps), static_cast<unsigned*>(po));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<unsigned> got(3);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), po, 3 * sizeof(unsigned), cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  EXPECT_EQ(got[0], 0xAAAAAAAAu) << "block 0: at the wait";
  EXPECT_EQ(got[1], 7u) << "block 1: at once";
  EXPECT_EQ(got[2], 0xAAAAAAAAu) << "block 2: at the wait";
  cudaFree(ps);
  cudaFree(po);
}

TEST(CudaEmu, CopiesCheckTheirKind) {
  float* d = device_floats(4, std::vector<float>(4, 0.0f));
  std::vector<float> h(4, 1.0f), h2(4);
  EXPECT_EQ(cudaMemcpyAsync(h2.data(), h.data(), 16, cudaMemcpyHostToDevice, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(d, h.data(), 16, cudaMemcpyDeviceToHost, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(d, d + 1, 16, cudaMemcpyDeviceToDevice, nullptr), cudaErrorInvalidValue)
      << "the source runs past the allocation";
  EXPECT_EQ(cudaMemsetAsync(h.data(), 0, 16, nullptr), cudaErrorInvalidValue);
  cudaFree(d);
}

TEST(CudaEmuDeathTest, ChecksAbortWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* y = device_floats(256, std::vector<float>(256, 0.0f));
  std::vector<float> host(256);
  EXPECT_DEATH(barrier_in_branch<<<1, 32>>>(y), "deadlocks: 16 of 32 threads wait at __syncthreads");
  EXPECT_DEATH(two_barriers<<<1, 32>>>(y), "divergent barrier");
  EXPECT_DEATH(half_warp_shuffle<<<1, 32>>>(y), "only whole-warp shuffles");
  EXPECT_DEATH(at_most_64_threads<<<1, 128>>>(y), "above its __launch_bounds__ of 64");
  EXPECT_DEATH(too_much_shared<<<1, 32>>>(y), "above the 49152 bytes of static shared memory");
  EXPECT_DEATH(at_most_64_threads<<<1, 32>>>(host.data()), "argument 0 .* is not device memory");
  ASSERT_EQ(cudaFuncSetAttribute(static_and_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448),
            cudaSuccess);
  EXPECT_DEATH(static_and_dynamic_shared<<<1, 32, 232448>>>(y),
               "__shared__ arrays take 8192 bytes and it was launched with 232448 bytes of dynamic shared memory: "
               "240640 in all, above the 232448 bytes");
  EXPECT_DEATH(past_dynamic_shared<<<1, 32, 128>>>(y), "");  // the guard page: SIGSEGV
  EXPECT_DEATH(templated::copy_through_dynamic_shared<float><<<1, 32, (48 << 10) + 4>>>(y, y),
               "leaves the kernel's template arguments to deduction");
  EXPECT_DEATH(mma_in_half_warp<<<1, 16>>>(y), "which has 16 lanes: it needs a whole 32-lane warp");
  EXPECT_DEATH(mma_in_half_warp<<<1, 48>>>(y), "warp 1, which has 16 lanes");
  EXPECT_DEATH(mma_beside_shuffle<<<1, 32>>>(y), "while its lane 0 shuffles");
  EXPECT_DEATH(vector_access_misaligned<<<1, 32>>>(y), "ld_pack: a 16-byte access at .*, which is not 16-byte aligned");
  unsigned* u = reinterpret_cast<unsigned*>(y);
  EXPECT_DEATH(ldmatrix_misaligned<<<1, 32, 256>>>(u), "ldmatrix row address .* \\(lane 3\\) is not 16-byte aligned");
  EXPECT_DEATH(ldmatrix_from_global<<<1, 32>>>(u), "\\(lane 0\\) is not 16 bytes inside the block's shared memory");
  EXPECT_DEATH(ldmatrix_misaligned<<<1, 16, 256>>>(u), "ldmatrix in warp 0, which has 16 lanes");
  EXPECT_DEATH(cp_async_to_global<<<1, 1>>>(u, u + 64), "cp.async destination .* is not 16 bytes inside the block's shared");
  EXPECT_DEATH(cp_async_misaligned<<<1, 1, 32>>>(u, u), "both addresses must be 16-byte aligned");
  cudaFree(y);
}

TEST(CudaEmu, StaticAndDynamicSharedMemoryFitTogether) {
  float* y = device_floats(32, std::vector<float>(32, 0.0f));
  ASSERT_EQ(cudaFuncSetAttribute(static_and_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448),
            cudaSuccess);
  static_and_dynamic_shared<<<1, 32, 232448 - 8192>>>(y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : host_floats(y, 32)) EXPECT_EQ(v, 1.0f);
  cudaFree(y);
}

}  // namespace
