// Causal self-attention forward and backward (kernels/attention.h) on GPT-2
// 124M's shapes (B=4, 12 heads of 64, T=256 by default), against PyTorch's
// attention in the same run (bench/attention_torch_bench.py: the explicit
// softmax(QK^T/sqrt(d) + causal mask) V of nanoGPT-style models with
// autograd, PyTorch 1.13 having no fused CPU attention; tuned environment of
// ../shared/TOOLCHAIN.md). Prints medians in ms per layer, effective GFLOP/s
// (causal FLOPs: fwd 2 GEMMs, bwd 5, over the lower triangle) and the ratio.
//
//   attention_bench [--threads 2] [--seq 256] [--batch 4] [--heads 12] [--groups 12] [--reps 20] [--no-torch]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/attention.h"

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20;
  int64_t T = 256, B = 4, H = 12, G = 12, D = 64;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* n) { return !std::strcmp(argv[i], n) && i + 1 < argc; };
    if (arg("--threads")) threads = std::atoi(argv[++i]);
    else if (arg("--seq")) T = std::atoll(argv[++i]);
    else if (arg("--batch")) B = std::atoll(argv[++i]);
    else if (arg("--heads")) H = std::atoll(argv[++i]);
    else if (arg("--groups")) G = std::atoll(argv[++i]);
    else if (arg("--head-dim")) D = std::atoll(argv[++i]);
    else if (arg("--reps")) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
    else {
      std::fprintf(stderr, "attention_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  set_num_threads(threads);
  kernels::QkvLayout L{T, B, H, G, D};
  const int64_t N = T * B;
  std::vector<float> qkv(static_cast<size_t>(N * L.row())), out(static_cast<size_t>(N * H * D)),
      dout(out.size()), lse(static_cast<size_t>(B * H * T)), dqkv(qkv.size());
  uint64_t s = 1;
  auto rnd = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>((s >> 40) & 0xffff) / 65536.0f - 0.5f;
  };
  for (float& x : qkv) x = rnd();
  for (float& x : dout) x = rnd();
  kernels::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(D))};
  Tensor tq(qkv.data(), {N, L.row()}, DType::kF32), to(out.data(), {N, H * D}, DType::kF32),
      tdo(dout.data(), {N, H * D}, DType::kF32), tl(lse.data(), {B, H, T}, DType::kF32),
      tdq(dqkv.data(), {N, L.row()}, DType::kF32);
  const double fwd = time_ms(reps, [&] { kernels::attention_forward(tq, L, o, to, tl); });
  const double bwd = time_ms(reps, [&] { kernels::attention_backward(tq, to, tdo, tl, L, o, tdq); });
  // Causal FLOPs: each of the GEMM-like products over the T(T+1)/2 lower triangle.
  const double tri = static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T + 1) / 2;
  const double f_fwd = 2 * 2 * tri * static_cast<double>(D), f_bwd = 5 * 2 * tri * static_cast<double>(D);
  std::printf("causal attention B=%lld T=%lld heads=%lld groups=%lld d=%lld fp32, %d threads, median of %d\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
              static_cast<long long>(G), static_cast<long long>(D), threads, reps);
  std::printf("  ours     fwd %8.2f ms (%6.1f GFLOP/s)  bwd %8.2f ms (%6.1f GFLOP/s)  fwd+bwd %8.2f ms\n", fwd,
              f_fwd / fwd * 1e-6, bwd, f_bwd / bwd * 1e-6, fwd + bwd);
  if (torch && G == H) {
    const std::string cmd = std::string("OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp "
                                        "/usr/bin/python3 ") + MT_SOURCE_DIR + "/bench/attention_torch_bench.py --threads " +
                            std::to_string(threads) + " --seq " + std::to_string(T) + " --batch " + std::to_string(B) +
                            " --heads " + std::to_string(H) + " --head-dim " + std::to_string(D) + " --reps " +
                            std::to_string(reps);
    FILE* p = popen(cmd.c_str(), "r");
    double tf = 0, tb = 0;
    if (!p || std::fscanf(p, "%lf %lf", &tf, &tb) != 2) {
      std::printf("  PyTorch: failed to run %s\n", cmd.c_str());
      if (p) pclose(p);
      return 1;
    }
    pclose(p);
    std::printf("  PyTorch  fwd %8.2f ms (%6.1f GFLOP/s)  bwd %8.2f ms (%6.1f GFLOP/s)  fwd+bwd %8.2f ms\n", tf,
                f_fwd / tf * 1e-6, tb, f_bwd / tb * 1e-6, tf + tb);
    std::printf("  ratio (PyTorch time / ours): fwd %.2fx  bwd %.2fx  fwd+bwd %.2fx\n", tf / fwd, tb / bwd,
                (tf + tb) / (fwd + bwd));
  }
  return 0;
}
