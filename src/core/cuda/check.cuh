#pragma once
// For .cu files: MT_CUDA_CHECK, the rank's stream, and launch helpers.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/cuda/runtime.h"
#include "core/status.h"

namespace mt::cuda {

// Aborts through check_failed: "<call> failed on device D: cudaErrorX (text)".
[[noreturn]] void cuda_failed(const char* file, int line, const char* call, cudaError_t err);

inline cudaStream_t stream() { return static_cast<cudaStream_t>(stream_handle()); }

// Blocks of `threads` covering n work items.
inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace mt::cuda

#define MT_CUDA_CHECK(call)                                                     \
  do {                                                                          \
    cudaError_t _e = (call);                                                    \
    if (_e != cudaSuccess) ::mt::cuda::cuda_failed(__FILE__, __LINE__, #call, _e); \
  } while (0)

// After a kernel launch: catches bad launch configurations at the call site.
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())
