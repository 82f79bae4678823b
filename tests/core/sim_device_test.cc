// The simulated device (core/sim_device.h): kernels and copies reach its
// memory, and any other host access faults at once. Each case runs in a
// fresh child process (threadsafe death tests re-execute the binary), where
// MT_SIMULATE_CUDA=1 is set before anything reads it.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "core/sim_device.h"
#include "kernels/elementwise.h"

namespace mt {
namespace {

// Copies in, adds on the "device", copies out; exits 3 on a wrong value,
// then touches device memory from the host (which must fault).
void round_trip_then_touch() {
  setenv("MT_SIMULATE_CUDA", "1", 1);
  if (!simdev::enabled() || backend_info().cuda_devices != 1) std::exit(4);
  Arena dev(1 << 16, "sim", Device::kCuda);
  std::vector<float> a{1, 2, 3, 4}, b{10, 20, 30, 40}, out(4);
  Tensor da = dev.alloc({4}, DType::kF32), db = dev.alloc({4}, DType::kF32);
  if (da.device() != Device::kCuda) std::exit(5);
  copy_tensor(Tensor(a.data(), {4}, DType::kF32), da);
  copy_tensor(Tensor(b.data(), {4}, DType::kF32), db);
  kernels::add_inplace(da, db);  // dispatched to the CPU twin inside a HostScope
  copy_tensor(da, Tensor(out.data(), {4}, DType::kF32));
  for (int i = 0; i < 4; ++i)
    if (out[static_cast<size_t>(i)] != a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)]) std::exit(3);
  db.zero();
  volatile float* p = static_cast<float*>(da.data());
  p[0] = 1.0f;  // a host write to device memory: SIGSEGV
  std::exit(0);
}

TEST(SimDevice, KernelsAndCopiesWorkAndHostAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(round_trip_then_touch(), ::testing::KilledBySignal(SIGSEGV), "");
}

}  // namespace
}  // namespace mt
