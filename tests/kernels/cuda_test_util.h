#pragma once
// Helpers for the CUDA twin tests (tests/kernels/cuda_*_test.cc): every CUDA
// kernel runs on the same inputs as its CPU twin, and the CPU result is the
// reference. Without a usable GPU (or in a build without the CUDA backend)
// each test skips and says why; CI on a machine with nvcc but no GPU still
// compiles all of this.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "core/sim_device.h"
#include "core/tensor.h"

// Skips the calling test unless the CUDA backend is compiled and a GPU is usable.
// (The simulated device of core/sim_device.h runs the CPU twins: nothing to compare.)
#define MT_REQUIRE_GPU()                                                               \
  do {                                                                                 \
    ::mt::BackendInfo _bi = ::mt::backend_info();                                      \
    if (!_bi.cuda_compiled || _bi.cuda_devices == 0 || ::mt::simdev::enabled())        \
      GTEST_SKIP() << "CUDA twin test skipped: CUDA backend " << _bi.cuda_status;      \
  } while (0)

namespace mt::test {

// Device memory for one test: a CUDA arena of `bytes`.
inline Arena gpu_arena(size_t bytes = size_t{256} << 20) { return Arena(bytes, "cuda twin test", Device::kCuda); }

// A device copy of a host tensor.
inline Tensor to_device(Arena& a, const Tensor& host) {
  Tensor d = a.alloc(host.shape(), host.dtype());
  copy_tensor(host, d);
  return d;
}

// A device copy of a host tensor that starts `offset` elements into its
// allocation (offset 1 of a 2- or 4-byte dtype: rows not 16-byte aligned,
// the case where vectorised kernels must fall back).
inline Tensor to_device_at(Arena& a, const Tensor& host, int64_t offset) {
  Tensor d = a.alloc({host.numel() + offset}, host.dtype()).slice(offset, offset + host.numel()).view(host.shape());
  copy_tensor(host, d);
  return d;
}

// The device tensor's elements on the host (waits for the stream).
template <typename T>
std::vector<T> to_host(const Tensor& dev) {
  std::vector<T> v(static_cast<size_t>(dev.numel()));
  copy_tensor(dev, Tensor(v.data(), dev.shape(), dev.dtype()));
  return v;
}

// |got - want| <= atol + rtol * |want| for every element; reports the worst one.
template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    double excess = std::abs(g - w) - (atol + rtol * std::abs(w));
    if (!(excess <= worst) || std::isnan(g) != std::isnan(w)) {
      if (std::isnan(excess) || excess > worst) worst = std::isnan(excess) ? INFINITY : excess, worst_i = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << worst_i << " is " << static_cast<double>(got[worst_i])
                        << ", CPU twin " << static_cast<double>(want[worst_i]) << " (rtol " << rtol << ", atol "
                        << atol << ")";
}

}  // namespace mt::test
