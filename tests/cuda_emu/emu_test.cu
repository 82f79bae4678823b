// The emulator itself (emu.h), on small kernels written for it: block
// barriers, __shared__ memory and warp shuffles give CUDA's results, and each
// check emu.h promises fires (poisoned shared memory, the scheduling order
// exposing a missing barrier, deadlocks, divergent barriers, host pointers,
// launch configurations, __launch_bounds__, the 48 KiB of static shared
// memory, memcpy kinds). Compiled only through translate.py, like the
// kernels it vouches for; never by nvcc.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
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
  cudaFree(y);
}

}  // namespace
