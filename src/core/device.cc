#include "core/device.h"

#include <fmt/format.h>

#ifdef MT_HAVE_CUDA
namespace mt::cuda {
int device_count(std::string* why);  // core/cuda/device_query.cu
}
#endif

namespace mt {

BackendInfo backend_info() {
  BackendInfo b;
#ifdef MT_HAVE_CUDA
  b.cuda_compiled = true;
  std::string why;
  b.cuda_devices = cuda::device_count(&why);
  b.cuda_status = b.cuda_devices > 0 ? fmt::format("{} GPU{}", b.cuda_devices, b.cuda_devices == 1 ? "" : "s")
                                     : "no usable GPU (" + why + ")";
#else
  b.cuda_status = "not compiled (no CUDA compiler at build time)";
#endif
  return b;
}

}  // namespace mt
