// GEMM libraries on GPT-2 124M shapes (B*T = 1024 tokens): oneDNN sgemm,
// oneDNN bf16 matmul and, when linked, OpenBLAS cblas_sgemm, in one run.
// Prints GFLOP/s per shape and the best; used to choose the GEMM library
// (kernels/gemm.h) and by bench/gpt_bench as the peak to compare against.
//   gemm_bench [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/arena.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#ifdef MT_HAVE_OPENBLAS
#include <cblas.h>
#endif

using namespace mt;

struct Case {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};

template <typename F>
double gflops(int64_t M, int64_t N, int64_t K, F&& f) {
  f();  // warm-up (and primitive creation)
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return 2.0 * M * N * K / best * 1e-9;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  set_num_threads(threads);
  const Case cases[] = {
      {"qkv fwd   x W^T", false, true, 1024, 2304, 768},   {"qkv dx    dy W ", false, false, 1024, 768, 2304},
      {"proj fwd  x W^T", false, true, 1024, 768, 768},    {"fc1 fwd   x W^T", false, true, 1024, 3072, 768},
      {"fc2 fwd   x W^T", false, true, 1024, 768, 3072},   {"fc1 dx    dy W ", false, false, 1024, 768, 3072},
      {"fc1 dW    dy^T x", true, false, 3072, 768, 1024},  {"logits    x E^T", false, true, 1024, 50304, 768},
      {"logits dx dy E ", false, false, 1024, 768, 50304}, {"logits dE dy^T x", true, false, 50304, 768, 1024},
  };
  Arena arena(size_t{1} << 30, "gemm_bench");
  std::printf("threads %d; GFLOP/s (best of 5)\n%-18s %10s %10s %10s\n", threads, "shape", "dnnl-f32",
              "dnnl-bf16", "openblas");
  double best_f32 = 0, best_bf16 = 0, sum_f32 = 0, sum_bf16 = 0, sum_ob = 0;
  constexpr int n = sizeof(cases) / sizeof(cases[0]);
  double f32[n] = {}, h[n] = {}, ob[n] = {};
  // All oneDNN runs first: OpenBLAS's worker threads keep spinning for a while
  // after each call and would steal the cores from whatever runs next (measured:
  // oneDNN at half speed right after an OpenBLAS call).
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < n; ++i) {
      const Case& c = cases[i];
      ArenaScope scope(arena);
      Tensor a = arena.alloc({c.M * c.K}, DType::kF32), b = arena.alloc({c.K * c.N}, DType::kF32);
      Tensor cc = arena.alloc({c.M * c.N}, DType::kF32);
      Tensor ah = arena.alloc({c.M * c.K}, DType::kBF16), bh = arena.alloc({c.K * c.N}, DType::kBF16);
      for (int64_t j = 0; j < a.numel(); ++j) a.ptr<float>()[j] = 0.01f * static_cast<float>(j % 97);
      for (int64_t j = 0; j < b.numel(); ++j) b.ptr<float>()[j] = 0.01f * static_cast<float>(j % 89);
      if (pass == 0) {
        f32[i] = gflops(c.M, c.N, c.K, [&] { kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, 1, a, b, 0, cc); });
        h[i] = gflops(c.M, c.N, c.K, [&] { kernels::gemm(c.ta, c.tb, c.M, c.N, c.K, 1, ah, bh, 0, cc); });
      } else {
#ifdef MT_HAVE_OPENBLAS
        ob[i] = gflops(c.M, c.N, c.K, [&] {
          cblas_sgemm(CblasRowMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans, c.M,
                      c.N, c.K, 1.0f, a.ptr<float>(), c.ta ? c.M : c.K, b.ptr<float>(), c.tb ? c.K : c.N, 0.0f,
                      cc.ptr<float>(), c.N);
        });
#endif
      }
    }
  for (int i = 0; i < n; ++i) {
    std::printf("%-18s %10.1f %10.1f %10.1f\n", cases[i].name, f32[i], h[i], ob[i]);
    best_f32 = std::max(best_f32, f32[i]);
    best_bf16 = std::max(best_bf16, h[i]);
    sum_f32 += f32[i], sum_bf16 += h[i], sum_ob += ob[i];
  }
  std::printf("mean               %10.1f %10.1f %10.1f\n", sum_f32 / n, sum_bf16 / n, sum_ob / n);
  std::printf("best fp32 %.1f GFLOP/s, best bf16 %.1f GFLOP/s\n", best_f32, best_bf16);
  return 0;
}
