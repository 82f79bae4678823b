// Forward+backward throughput of GPT-2 124M (12 layers, h 768, 12 heads,
// vocabulary 50257 padded to 50304, B=4, T=256) in fp32 and with bf16 GEMMs,
// against the PyTorch reference model on the same shapes in the same run,
// and as a fraction of the GEMM peak measured in the same run (the best
// oneDNN GEMM over the model's own shapes). Never asserts times.
//   gpt_bench [--threads 2] [--iters 3] [--layers 12] [--no-torch]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "model/gpt.h"

using namespace mt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best GFLOP/s over the model's GEMM shapes (forward and both backward forms).
double gemm_peak(DType dt, int64_t N, int64_t h, int64_t V) {
  struct S { bool ta, tb; int64_t M, Nn, K; };
  const S shapes[] = {{false, true, N, 3 * h, h}, {false, true, N, 4 * h, h}, {false, true, N, h, 4 * h},
                      {false, false, N, h, 4 * h}, {true, false, 4 * h, h, N}, {false, true, N, V, h}};
  Arena arena(size_t{1} << 30, "gemm-peak");
  double best = 0;
  for (const S& s : shapes) {
    ArenaScope scope(arena);
    Tensor a = arena.alloc({s.M * s.K}, dt), b = arena.alloc({s.K * s.Nn}, dt), c = arena.alloc({s.M * s.Nn}, DType::kF32);
    kernels::gemm(s.ta, s.tb, s.M, s.Nn, s.K, 1.0f, a, b, 0.0f, c);
    for (int r = 0; r < 3; ++r) {
      double t0 = now();
      kernels::gemm(s.ta, s.tb, s.M, s.Nn, s.K, 1.0f, a, b, 0.0f, c);
      best = std::max(best, 2.0 * s.M * s.Nn * s.K / (now() - t0));
    }
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 3, layers = 12;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
  }
  set_num_threads(threads);
  model::ModelConfig cfg;
  cfg.num_layers = layers, cfg.hidden_size = 768, cfg.num_attention_heads = 12, cfg.seq_length = 256;
  cfg.max_position_embeddings = 1024, cfg.vocab_size = 50257, cfg.hidden_dropout = 0, cfg.attention_dropout = 0;
  const int64_t B = 4, T = 256, V = cfg.padded_vocab(1);
  std::vector<int32_t> tok(B * T), lab(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 7919) % 50257), lab[i] = static_cast<int32_t>((i * 104729) % 50257);
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);

  std::printf("GPT-2 124M-shape: L=%d h=768 a=12 V=%lld B=%lld T=%lld, %d threads\n", layers, (long long)V, (long long)B,
              (long long)T, threads);
  const double peak32 = gemm_peak(DType::kF32, B * T, 768, V), peak16 = gemm_peak(DType::kBF16, B * T, 768, V);
  std::printf("GEMM peak (oneDNN, model shapes): fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", peak32 * 1e-9, peak16 * 1e-9);
  double tps[2] = {0, 0}, flops = 0;
  for (int bf = 0; bf < 2; ++bf) {
    model::GPTOptions opt;
    opt.micro_batch = B, opt.bf16_compute = bf == 1;
    auto m = model::GPTModel::create(cfg, opt);
    if (!m.is_ok()) {
      std::fprintf(stderr, "%s\n", m.status().message().c_str());
      return 1;
    }
    (*m)->init_parameters(1234);
    flops = (*m)->flops_per_micro_batch();
    double best = 1e30;
    for (int it = 0; it <= iters; ++it) {
      (*m)->zero_grads();
      double t0 = now();
      (*m)->forward(0, tt, lt, 0, false);
      (*m)->backward(0);
      double dt = now() - t0;
      if (it > 0) best = std::min(best, dt);  // the first is warm-up
    }
    tps[bf] = B * T / best;
    const double achieved = flops / best;
    std::printf("ours %-5s %8.1f tokens/s  %7.1f GFLOP/s  = %5.1f%% of the fp32 GEMM peak, %5.1f%% of the bf16 peak\n",
                bf ? "bf16" : "fp32", tps[bf], achieved * 1e-9, 100 * achieved / peak32, 100 * achieved / peak16);
  }
  if (torch) {
    const std::string cmd = std::string("OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp "
                                        "MT_BENCH_THREADS=") + std::to_string(threads) + " /usr/bin/python3 " + MT_SOURCE_DIR +
                            "/bench/gpt_torch_bench.py " + std::to_string(layers) + " 768 12 " + std::to_string(V) + " 4 256 " +
                            std::to_string(iters);
    FILE* p = popen(cmd.c_str(), "r");
    double ttps = 0;
    char line[256];
    while (p && std::fgets(line, sizeof line, p)) std::sscanf(line, "tokens_per_s %lf", &ttps);
    if (p) pclose(p);
    if (ttps > 0) {
      std::printf("PyTorch fp32 (tuned OpenBLAS) %8.1f tokens/s  %7.1f GFLOP/s\n", ttps, flops / (B * T) * ttps * 1e-9);
      std::printf("ratio ours/PyTorch: fp32 %.2fx (target 1.5x), bf16 %.2fx (target 2.5x)\n", tps[0] / ttps, tps[1] / ttps);
    } else {
      std::printf("PyTorch reference did not run (needs /usr/bin/python3 with torch)\n");
    }
  }
  return 0;
}
