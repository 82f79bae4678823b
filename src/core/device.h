#pragma once
// Which compute backends this binary has, and which devices it can see.
// The CUDA backend is compiled only where nvcc exists (see CMakeLists.txt);
// without a GPU at run time it reports zero devices and the reason.

#include <string>

#include "core/tensor.h"

namespace mt {

struct BackendInfo {
  bool cuda_compiled = false;
  int cuda_devices = 0;
  std::string cuda_status;  // "3 GPUs", or why none are usable
  std::string cuda_name;    // device 0's name ("NVIDIA H200"), when there is one
};

BackendInfo backend_info();

// Copies src's bytes into dst (same dtype and element count) across any pair
// of devices. Waits when dst is on the host, so the caller can read it.
void copy_tensor(const Tensor& src, const Tensor& dst);

// Copies columns [src_col, src_col + width) of every row of the 2-D src
// [R, Ws] into columns [dst_col, dst_col + width) of dst [R, Wd] (same
// dtype, same rows, one device): concatenating or splitting along the last
// dimension (multi-token prediction's [embedding | hidden] input, and a
// column-parallel output gathered along its features).
void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width);

// Opens (on) or closes the CUDA profiler's capture range (cudaProfilerStart /
// cudaProfilerStop, what nsys --capture-range=cudaProfilerApi records) on a
// real GPU; nothing on the CPU or the simulated device.
void device_profiler_capture(bool on);

}  // namespace mt
