// The CUDA side of core/device.h. Any error from the runtime (no driver:
// 35, driver but no device: 100, ...) means "no GPU": callers fall back to
// the CPU backend and GPU tests skip.
#include <cuda_runtime.h>

#include <string>

namespace mt::cuda {

int device_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (n == 0) *why = "the driver reports no devices";
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "unknown GPU";
  }
  return prop.name;
}

}  // namespace mt::cuda
