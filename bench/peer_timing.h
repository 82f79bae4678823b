#pragma once
// Timing and the PyTorch peer for the kernel benchmarks that print ours
// beside PyTorch's in the same run (attention_bench, norm_bench).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace mt::bench {

// The upper median (the middle element, or the later of the middle two).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `reps` samples (after one warm-up) of f's time in ms divided
// by `calls`, the number of calls f makes (and waits for) per sample.
template <typename F>
double time_ms(int reps, int calls, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  return median(t);
}

// Runs the PyTorch side (a bench/*_torch_bench.py command line): its one
// output line holds the median forward and backward milliseconds.
inline bool run_peer(const std::string& cmd, double& fwd_ms, double& bwd_ms) {
  FILE* p = popen(cmd.c_str(), "r");
  const bool ok = p && std::fscanf(p, "%lf %lf", &fwd_ms, &bwd_ms) == 2;
  if (p) pclose(p);
  if (!ok) std::printf("  PyTorch: failed to run %s\n", cmd.c_str());
  return ok;
}

}  // namespace mt::bench
