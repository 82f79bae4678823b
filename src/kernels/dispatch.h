#pragma once
// How an op reaches its implementation. Each op header (kernels/<op>.h)
// declares the op once in mt::kernels, plus the same signature in
// mt::kernels::cpu (defined in kernels/cpu/<op>.cc) and, in a build with
// the CUDA backend (MT_HAVE_CUDA), mt::kernels::cuda (kernels/cuda/<op>.cu).
// The mt::kernels function is an inline dispatcher on one tensor's device;
// the caller keeps all tensors of one call on one device. CUDA twins take
// the same dtypes, run on the rank's stream (core/cuda/runtime.h) and are
// tested against their CPU twin (tests/kernels/cuda_*_test.cc). Ops accept fp32 and fp64
// (fp64 is the reference path the finite-difference tests use); GEMM and
// attention also accept bf16 inputs with fp32 accumulation.

#include "core/op_profile.h"
#include "core/sim_device.h"
#include "core/status.h"
#include "core/tensor.h"

// A kCuda tensor under the simulated device (core/sim_device.h) runs the CPU
// twin with device memory opened for the call.
#ifdef MT_HAVE_CUDA
#define MT_DISPATCH_CUDA(op, ...) return ::mt::kernels::cuda::op(__VA_ARGS__)
#else
#define MT_DISPATCH_CUDA(op, ...) \
  MT_CHECK(false, #op ": a CUDA tensor in a build without the CUDA backend")
#endif
// Every call is one OpScope of the op profile (core/op_profile.h).
#define MT_DISPATCH(op, dev, ...)                       \
  do {                                                  \
    ::mt::profile::OpScope _op_scope(#op, (dev));       \
    if ((dev) == ::mt::Device::kCuda) {                 \
      if (::mt::simdev::enabled()) {                    \
        ::mt::simdev::HostScope _open_device_memory;    \
        return ::mt::kernels::cpu::op(__VA_ARGS__);     \
      }                                                 \
      MT_DISPATCH_CUDA(op, __VA_ARGS__);                \
    }                                                   \
    return ::mt::kernels::cpu::op(__VA_ARGS__);         \
  } while (0)

namespace mt::kernels {

// Both tensors have `n` elements and one of the listed dtypes.
inline void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  MT_CHECK(a.numel() == b.numel(), std::string(what) + ": element counts differ (" + a.shape().str() +
                                       " vs " + b.shape().str() + ")");
}

}  // namespace mt::kernels
