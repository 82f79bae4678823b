// Causal self-attention forward and backward (kernels/attention.h) on GPT-2
// 124M's shapes (B=4, 12 heads of 64, T=256 by default), against PyTorch's
// attention in the same run (bench/attention_torch_bench.py: the explicit
// softmax(QK^T/sqrt(d) + causal mask) V of nanoGPT-style models with
// autograd, PyTorch 1.13 having no fused CPU attention; tuned environment of
// ../shared/TOOLCHAIN.md). Prints medians in ms per layer, effective GFLOP/s
// (causal FLOPs: fwd 2 GEMMs, bwd 5, over the lower triangle) and the ratio.
//
//   attention_bench [--threads 2] [--seq 256] [--batch 4] [--heads 12] [--groups 12] [--reps 20] [--no-torch]
//
// --device cuda (a CUDA build on a GPU): our SIMT fp32 kernels, our bf16
// tensor-core kernels (AttentionOptions::bf16_matmul) on fp32 tensors, and
// the same on bf16 qkv/out/dout/dqkv (the model's --bf16 path) on the GPU, against
// PyTorch's fused scaled_dot_product_attention in bf16 (flash attention,
// is_causal, GQA) from the `python3` on PATH (bench/attention_torch_bench.py
// --device cuda; --torch-cmd replaces "python3 <source>/bench/attention_torch_bench.py",
// e.g. where the source tree has moved; --variant bf16 runs that variant
// alone, for a profiler). A fourth row times the bf16 one with the dK/dV
// kernel's lean build (kernels::cuda::set_dkv_lean; --variant lean alone). The benchmark model's shape, for example:
//   attention_bench --device cuda --seq 2048 --batch 4 --heads 16 --groups 4 --head-dim 128
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "core/threads.h"
#ifdef MT_HAVE_CUDA
#include "core/cuda/runtime.h"
#endif
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "peer_timing.h"

using namespace mt;
using mt::bench::run_peer;
using mt::bench::time_ms;

namespace {

// Causal FLOPs: each of the GEMM-like products over the T(T+1)/2 lower
// triangle; forward 2 products, backward 5 (S and dP recomputed, dV, dK, dQ).
struct Flops {
  double fwd, bwd;
};
Flops causal_flops(int64_t T, int64_t B, int64_t H, int64_t D) {
  const double tri = static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T + 1) / 2;
  return {2 * 2 * tri * static_cast<double>(D), 5 * 2 * tri * static_cast<double>(D)};
}

int run_cuda(int64_t T, int64_t B, int64_t H, int64_t G, int64_t D, int reps, bool torch, const std::string& torch_cmd,
             int only) {
#ifndef MT_HAVE_CUDA
  (void)T, (void)B, (void)H, (void)G, (void)D, (void)reps, (void)torch, (void)torch_cmd, (void)only;
  std::fprintf(stderr, "attention_bench: --device cuda needs a CUDA build (this one has no CUDA backend)\n");
  return 2;
#else
  const BackendInfo info = backend_info();
  if (info.cuda_devices < 1) {
    std::fprintf(stderr, "attention_bench: --device cuda: %s\n", info.cuda_status.c_str());
    return 2;
  }
  kernels::QkvLayout L{T, B, H, G, D};
  const int64_t N = T * B;
  std::vector<float> qkv(static_cast<size_t>(N * L.row())), dout(static_cast<size_t>(N * H * D));
  uint64_t s = 1;
  auto rnd = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>((s >> 40) & 0xffff) / 65536.0f - 0.5f;
  };
  for (float& x : qkv) x = rnd();
  for (float& x : dout) x = rnd();
  // fp32 qkv, out, dout, dqkv and lse, then bf16 copies of all but lse.
  const size_t bytes = (2 * qkv.size() + 2 * dout.size() + static_cast<size_t>(B * H * T)) * (sizeof(float) + 2) +
                       (1 << 20);
  Arena g(bytes, "attention_bench", Device::kCuda);
  const Tensor tq = g.alloc({N, L.row()}, DType::kF32), to = g.alloc({N, H * D}, DType::kF32),
               tdo = g.alloc({N, H * D}, DType::kF32), tl = g.alloc({B, H, T}, DType::kF32),
               tdq = g.alloc({N, L.row()}, DType::kF32);
  copy_tensor(Tensor(qkv.data(), tq.shape(), DType::kF32), tq);
  copy_tensor(Tensor(dout.data(), tdo.shape(), DType::kF32), tdo);
  const Flops f = causal_flops(T, B, H, D);
  std::printf("causal attention B=%lld T=%lld heads=%lld groups=%lld d=%lld on %s, median of %d\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
              static_cast<long long>(G), static_cast<long long>(D), info.cuda_name.c_str(), reps);
  // The model's --bf16 path keeps qkv, the output, its gradient and dqkv in
  // bf16 (model/gpt.cc): the same tensor-core kernels reading and writing
  // half the bytes. That last variant is the one compared with PyTorch.
  const Tensor hq = g.alloc({N, L.row()}, DType::kBF16), ho = g.alloc({N, H * D}, DType::kBF16),
               hdo = g.alloc({N, H * D}, DType::kBF16), hdq = g.alloc({N, L.row()}, DType::kBF16);
  kernels::cast(tq, hq);
  kernels::cast(tdo, hdo);
  struct Variant {
    const char* name;
    bool tc;
    Tensor q, o, dout, dq;
    bool lean;  // kernels::cuda::set_dkv_lean
  };
  const Variant variants[] = {{"fp32 SIMT", false, tq, to, tdo, tdq, false},
                              {"bf16 TC, fp32 io", true, tq, to, tdo, tdq, false},
                              {"bf16 TC, bf16 io", true, hq, ho, hdo, hdq, false},
                              {"bf16, lean dK/dV", true, hq, ho, hdo, hdq, true}};
  double ours_fwd = 0, ours_bwd = 0;
  for (const Variant& v : variants) {
    if (only >= 0 && &v != &variants[only]) continue;  // --variant bf16|lean (e.g. under a profiler)
    kernels::cuda::set_dkv_lean(v.lean);
    kernels::AttentionOptions o{1.0 / std::sqrt(static_cast<double>(D))};
    o.bf16_matmul = v.tc;
    const bool used = kernels::cuda::attention_uses_tensor_cores(v.q, L, o);
    const double fwd = time_ms(reps, 1, [&] {
      kernels::attention_forward(v.q, L, o, v.o, tl);
      cuda::synchronize();
    });
    const double bwd = time_ms(reps, 1, [&] {
      kernels::attention_backward(v.q, v.o, v.dout, tl, L, o, v.dq);
      cuda::synchronize();
    });
    std::printf("  ours %-17s fwd %8.3f ms (%6.1f TFLOP/s)  bwd %8.3f ms (%6.1f TFLOP/s)  fwd+bwd %8.3f ms%s\n",
                v.name, fwd, f.fwd / fwd * 1e-9, bwd, f.bwd / bwd * 1e-9, fwd + bwd,
                used == v.tc ? "" : "  (tensor cores NOT used)");
    if (&v == &variants[2]) ours_fwd = fwd, ours_bwd = bwd;  // the model's bf16 path: compared with PyTorch
  }
  kernels::cuda::set_dkv_lean(false);
  if (!torch) return 0;
  const std::string base =
      torch_cmd.empty() ? std::string("python3 ") + MT_SOURCE_DIR + "/bench/attention_torch_bench.py" : torch_cmd;
  const std::string cmd = base + " --device cuda --seq " +
                          std::to_string(T) + " --batch " + std::to_string(B) + " --heads " + std::to_string(H) +
                          " --groups " + std::to_string(G) + " --head-dim " + std::to_string(D) + " --reps " +
                          std::to_string(reps);
  double tf = 0, tb = 0;
  if (!run_peer(cmd, tf, tb)) return 1;
  std::printf("  PyTorch sdpa bf16      fwd %8.3f ms (%6.1f TFLOP/s)  bwd %8.3f ms (%6.1f TFLOP/s)  fwd+bwd %8.3f ms\n",
              tf, f.fwd / tf * 1e-9, tb, f.bwd / tb * 1e-9, tf + tb);
  std::printf("  ratio (PyTorch time / ours, bf16 TC, bf16 io): fwd %.2fx  bwd %.2fx  fwd+bwd %.2fx\n", tf / ours_fwd,
              tb / ours_bwd, (tf + tb) / (ours_fwd + ours_bwd));
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20;
  int64_t T = 256, B = 4, H = 12, G = 12, D = 64;
  bool torch = true;
  int only = -1;  // --variant: the one variant to run (index into run_cuda's list), or all
  std::string device = "cpu", torch_cmd;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* n) { return !std::strcmp(argv[i], n) && i + 1 < argc; };
    if (arg("--threads")) threads = std::atoi(argv[++i]);
    else if (arg("--seq")) T = std::atoll(argv[++i]);
    else if (arg("--batch")) B = std::atoll(argv[++i]);
    else if (arg("--heads")) H = std::atoll(argv[++i]);
    else if (arg("--groups")) G = std::atoll(argv[++i]);
    else if (arg("--head-dim")) D = std::atoll(argv[++i]);
    else if (arg("--reps")) reps = std::atoi(argv[++i]);
    else if (arg("--device")) device = argv[++i];
    else if (arg("--torch-cmd")) torch_cmd = argv[++i];
    else if (arg("--variant")) {
      const std::string v = argv[++i];
      if (v != "all" && v != "bf16" && v != "lean") {
        std::fprintf(stderr,
                     "attention_bench: --variant must be all, bf16 (the model's --bf16 path alone) or lean (the same "
                     "with the lean dK/dV build), not %s\n",
                     v.c_str());
        return 2;
      }
      only = v == "bf16" ? 2 : v == "lean" ? 3 : -1;
    }
    else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
    else {
      std::fprintf(stderr, "attention_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (device == "cuda") return run_cuda(T, B, H, G, D, reps, torch, torch_cmd, only);
  if (device != "cpu") {
    std::fprintf(stderr, "attention_bench: --device must be cpu or cuda, not %s\n", device.c_str());
    return 2;
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
  const double fwd = time_ms(reps, 1, [&] { kernels::attention_forward(tq, L, o, to, tl); });
  const double bwd = time_ms(reps, 1, [&] { kernels::attention_backward(tq, to, tdo, tl, L, o, tdq); });
  const Flops f = causal_flops(T, B, H, D);
  const double f_fwd = f.fwd, f_bwd = f.bwd;
  std::printf("causal attention B=%lld T=%lld heads=%lld groups=%lld d=%lld fp32, %d threads, median of %d\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
              static_cast<long long>(G), static_cast<long long>(D), threads, reps);
  std::printf("  ours     fwd %8.2f ms (%6.1f GFLOP/s)  bwd %8.2f ms (%6.1f GFLOP/s)  fwd+bwd %8.2f ms\n", fwd,
              f_fwd / fwd * 1e-6, bwd, f_bwd / bwd * 1e-6, fwd + bwd);
  if (torch && G == H) {
    // OpenBLAS's AVX-512 kernels only where the CPU has AVX-512 (else AVX2's).
    const std::string cmd = std::string("OPENBLAS_CORETYPE=") +
                            (__builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell") +
                            " LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp /usr/bin/python3 " + MT_SOURCE_DIR + "/bench/attention_torch_bench.py --threads " +
                            std::to_string(threads) + " --seq " + std::to_string(T) + " --batch " + std::to_string(B) +
                            " --heads " + std::to_string(H) + " --head-dim " + std::to_string(D) + " --reps " +
                            std::to_string(reps);
    double tf = 0, tb = 0;
    if (!run_peer(cmd, tf, tb)) return 1;
    std::printf("  PyTorch  fwd %8.2f ms (%6.1f GFLOP/s)  bwd %8.2f ms (%6.1f GFLOP/s)  fwd+bwd %8.2f ms\n", tf,
                f_fwd / tf * 1e-6, tb, f_bwd / tb * 1e-6, tf + tb);
    std::printf("  ratio (PyTorch time / ours): fwd %.2fx  bwd %.2fx  fwd+bwd %.2fx\n", tf / fwd, tb / bwd,
                (tf + tb) / (fwd + bwd));
  }
  return 0;
}
