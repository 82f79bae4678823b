#pragma once
// Which compute backends this binary has, and which devices it can see.
// The CUDA backend is compiled only where nvcc exists (see CMakeLists.txt);
// without a GPU at run time it reports zero devices and the reason.

#include <string>

namespace mt {

struct BackendInfo {
  bool cuda_compiled = false;
  int cuda_devices = 0;
  std::string cuda_status;  // "3 GPUs", or why none are usable
};

BackendInfo backend_info();

}  // namespace mt
