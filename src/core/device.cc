#include "core/device.h"

#include <fmt/format.h>

#include <cstring>

#include "core/cuda/runtime.h"
#include "core/sim_device.h"

#ifdef MT_HAVE_CUDA
namespace mt::cuda {
int device_count(std::string* why);  // core/cuda/device_query.cu
std::string device_name(int device);
}
#endif

namespace mt {

BackendInfo backend_info() {
  BackendInfo b;
  if (simdev::enabled()) {
#ifdef MT_HAVE_CUDA
    b.cuda_compiled = true;
#endif
    b.cuda_devices = 1;
    b.cuda_status = "1 simulated GPU (MT_SIMULATE_CUDA=1: host memory, CPU kernels; for tests)";
    b.cuda_name = "simulated";
    return b;
  }
#ifdef MT_HAVE_CUDA
  b.cuda_compiled = true;
  std::string why;
  b.cuda_devices = cuda::device_count(&why);
  if (b.cuda_devices > 0) b.cuda_name = cuda::device_name(0);
  b.cuda_status = b.cuda_devices > 0 ? fmt::format("{} GPU{}", b.cuda_devices, b.cuda_devices == 1 ? "" : "s")
                                     : "no usable GPU (" + why + ")";
#else
  b.cuda_status = "not compiled (no CUDA compiler at build time)";
#endif
  return b;
}

void copy_tensor(const Tensor& src, const Tensor& dst) {
  MT_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
           fmt::format("copy_tensor: {} {} into {} {}", dtype_name(src.dtype()), src.shape().str(),
                       dtype_name(dst.dtype()), dst.shape().str()));
  size_t n = src.nbytes();
  if (src.device() == Device::kCpu && dst.device() == Device::kCpu) {
    if (n) std::memmove(dst.data(), src.data(), n);
    return;
  }
  if (simdev::enabled()) {
    simdev::HostScope open;
    if (n) std::memmove(dst.data(), src.data(), n);
    return;
  }
#ifdef MT_HAVE_CUDA
  if (src.device() == Device::kCpu) cuda::copy_h2d(dst.data(), src.data(), n);
  else if (dst.device() == Device::kCpu) cuda::copy_d2h(dst.data(), src.data(), n);
  else cuda::copy_d2d(dst.data(), src.data(), n);
#else
  MT_CHECK(false, "copy_tensor: a CUDA tensor in a build without the CUDA backend");
#endif
}

void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) {
  MT_CHECK(src.dtype() == dst.dtype() && src.device() == dst.device() && src.ndim() == 2 && dst.ndim() == 2 &&
               src.dim(0) == dst.dim(0) && width >= 0 && src_col >= 0 && dst_col >= 0 &&
               src_col + width <= src.dim(1) && dst_col + width <= dst.dim(1),
           fmt::format("copy_columns: {} columns [{}, {}) of {} {} into [{}, {}) of {} {}", width, src_col,
                       src_col + width, dtype_name(src.dtype()), src.shape().str(), dst_col, dst_col + width,
                       dtype_name(dst.dtype()), dst.shape().str()));
  const size_t es = dtype_size(src.dtype()), rows = static_cast<size_t>(src.dim(0));
  const size_t sp = static_cast<size_t>(src.dim(1)) * es, dp = static_cast<size_t>(dst.dim(1)) * es;
  const size_t wb = static_cast<size_t>(width) * es;
  const char* s = static_cast<const char*>(src.data()) + static_cast<size_t>(src_col) * es;
  char* d = static_cast<char*>(dst.data()) + static_cast<size_t>(dst_col) * es;
  auto host = [&] {
    for (size_t r = 0; r < rows; ++r) std::memmove(d + r * dp, s + r * sp, wb);
  };
  if (src.device() == Device::kCpu) return host();
  if (simdev::enabled()) {
    simdev::HostScope open;
    return host();
  }
#ifdef MT_HAVE_CUDA
  cuda::copy_d2d_2d(d, dp, s, sp, wb, rows);
#else
  MT_CHECK(false, "copy_columns: a CUDA tensor in a build without the CUDA backend");
#endif
}

void device_profiler_capture(bool on) {
  if (simdev::enabled()) return;
#ifdef MT_HAVE_CUDA
  cuda::profiler_capture(on);
#else
  (void)on;
#endif
}

}  // namespace mt
