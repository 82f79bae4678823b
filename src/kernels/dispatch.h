#pragma once
// How an op reaches its implementation. Each op header (kernels/<op>.h)
// declares the op once in mt::kernels, plus the same signature in
// mt::kernels::cpu (defined in kernels/cpu/<op>.cc) and, later,
// mt::kernels::cuda (kernels/cuda/<op>.cu). The mt::kernels function is an
// inline dispatcher on the first tensor's device. Ops accept fp32 and fp64
// (fp64 is the reference path the finite-difference tests use); GEMM and
// attention also accept bf16 inputs with fp32 accumulation.

#include "core/status.h"
#include "core/tensor.h"

#define MT_DISPATCH(op, dev, ...)                                              \
  do {                                                                         \
    MT_CHECK((dev) == ::mt::Device::kCpu, #op ": no CUDA twin in this build"); \
    return ::mt::kernels::cpu::op(__VA_ARGS__);                                \
  } while (0)

namespace mt::kernels {

// Both tensors have `n` elements and one of the listed dtypes.
inline void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  MT_CHECK(a.numel() == b.numel(), std::string(what) + ": element counts differ (" + a.shape().str() +
                                       " vs " + b.shape().str() + ")");
}

}  // namespace mt::kernels
