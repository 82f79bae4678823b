// Signals delivered while oneDNN's JIT GEMM runs (core/signals.h): another
// thread interrupts this one thousands of times while it runs fp32 GEMMs of
// the shapes that crashed the trainer; every result must equal the
// uninterrupted one bitwise and the heap must stay intact. Without the
// alternate signal stack the signal frame lands on the heap (oneDNN points rsp
// into its workspace) and this test aborts in free() or sees wrong numbers.

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/signals.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "test_util.h"

namespace mt {
namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
};

TEST(SignalSafety, StopSignalDuringGemmLeavesHeapAndResultsIntact) {
  install_stop_signal_handler(SIGUSR1);
  clear_stop_request();
  // Shapes of a small GPT's linear forward and backward (hidden 64, 4 x 32 tokens) and a larger one.
  const std::vector<Case> cases = {{false, true, 128, 192, 64}, {true, false, 64, 192, 128}, {false, false, 128, 64, 192},
                                   {false, true, 128, 256, 64},  {true, false, 256, 64, 128}, {false, true, 256, 256, 256}};
  std::vector<std::vector<float>> A(cases.size()), B(cases.size()), want(cases.size());
  auto run = [&](size_t i, std::vector<float>& c) {
    const Case& k = cases[i];
    c.assign(static_cast<size_t>(k.M * k.N), 0.0f);
    kernels::gemm(k.ta, k.tb, k.M, k.N, k.K, 1.0f, Tensor(A[i].data(), {k.M * k.K}, DType::kF32),
                  Tensor(B[i].data(), {k.K * k.N}, DType::kF32), 0.0f, Tensor(c.data(), {k.M * k.N}, DType::kF32));
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    A[i].resize(static_cast<size_t>(cases[i].M * cases[i].K));
    B[i].resize(static_cast<size_t>(cases[i].K * cases[i].N));
    test::fill_normal(A[i], 2 * i + 1);
    test::fill_normal(B[i], 2 * i + 2);
    run(i, want[i]);
  }

  std::atomic<bool> done{false};
  std::atomic<int64_t> sent{0};
  const pthread_t target = pthread_self();
  std::thread sender([&] {
    while (!done.load()) {
      pthread_kill(target, SIGUSR1);
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int64_t mismatches = 0, rounds = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  std::vector<float> got;
  while (std::chrono::steady_clock::now() < until) {
    for (size_t i = 0; i < cases.size(); ++i) {
      run(i, got);  // allocates and frees (the result, oneDNN's packing buffers)
      if (std::memcmp(got.data(), want[i].data(), got.size() * sizeof(float)) != 0) ++mismatches;
    }
    ++rounds;
  }
  done.store(true);
  sender.join();
  // Exercise the allocator so that a corrupted chunk is found here rather than later.
  std::vector<std::vector<char>> blocks;
  for (int i = 0; i < 2000; ++i) blocks.emplace_back(static_cast<size_t>(16 + (i * 97) % 5000));
  blocks.clear();
  EXPECT_TRUE(stop_requested());
  EXPECT_GT(sent.load(), 1000);
  EXPECT_EQ(mismatches, 0) << "of " << rounds * static_cast<int64_t>(cases.size()) << " GEMMs";
}

}  // namespace
}  // namespace mt
