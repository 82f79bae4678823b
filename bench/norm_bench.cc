// RMSNorm (or, with --layernorm, LayerNorm) forward and backward
// (kernels/norm.h) over x [rows, cols], against PyTorch in the same run
// (bench/norm_torch_bench.py: F.rms_norm / F.layer_norm and autograd).
// Prints the median ms per call, the bytes our kernels must move per second,
// and PyTorch's time over ours.
//
//   norm_bench [--rows 8192] [--cols 2048] [--reps 20] [--layernorm] [--no-torch]
//              [--device cpu|cuda] [--threads 2] [--torch-cmd CMD] [--variant all|packed|column]
//
// --device cpu: fp32 tensors, `--threads` OpenMP threads, Debian's
// /usr/bin/python3 as the peer (PyTorch 1.13: explicit RMSNorm). --device cuda
// (a CUDA build on a GPU): the model's --bf16 residual stream (bf16 x, y, dy
// and dx; fp32 weight, rstd and dw), each sample 20 back-to-back calls
// between synchronisations; two rows: the packed kernels (the default) and
// the column-a-thread kernels (kernels::cuda::set_norm_packed(false));
// --variant packed|column runs one alone, for a profiler. The peer is the
// `python3` on PATH (bf16, weight cast to bf16 as bench/llama_torch_train.py
// does); --torch-cmd replaces "python3 <source>/bench/norm_torch_bench.py".
// Our backward also adds into dx (the residual stream's gradient: 2 bytes
// read per element more than PyTorch's, which adds it in a separate kernel).
// The packed kernels take rows of 1024 to 4096 columns, a multiple of 8
// (kernels::cuda::set_norm_packed); other widths run the column kernels in
// both rows, and the output says so.
// The benchmark model's shape (micro-batch 4 x sequence 2048, hidden 2048):
//   norm_bench --device cuda --rows 8192 --cols 2048
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
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "peer_timing.h"

using namespace mt;
using mt::bench::run_peer;
using mt::bench::time_ms;

namespace {

struct Problem {
  int64_t rows, cols;
  bool layernorm;
};

// Host data, the same for both devices (rows of x near unit scale).
struct HostData {
  std::vector<float> x, dy, dx, w, b;
};
HostData host_data(const Problem& p) {
  HostData h;
  const size_t n = static_cast<size_t>(p.rows * p.cols), c = static_cast<size_t>(p.cols);
  uint64_t s = 1;
  auto rnd = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>((s >> 40) & 0xffff) / 65536.0f - 0.5f;
  };
  h.x.resize(n), h.dy.resize(n), h.dx.resize(n), h.w.resize(c), h.b.resize(c);
  for (float& v : h.x) v = 2 * rnd();
  for (float& v : h.dy) v = rnd();
  for (float& v : h.dx) v = rnd();
  for (float& v : h.w) v = 1 + rnd();
  for (float& v : h.b) v = rnd();
  return h;
}

// One forward and one backward of the chosen norm on these tensors.
struct Norm {
  const Problem& p;
  Tensor x, y, w, b, mean, rstd, dy, dx, dw, db;
  void forward() const {
    if (p.layernorm) kernels::layernorm_forward(x, w, b, 1e-5, y, mean, rstd);
    else kernels::rmsnorm_forward(x, w, 1e-5, y, rstd);
  }
  void backward() const {
    if (p.layernorm) kernels::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
    else kernels::rmsnorm_backward(dy, x, w, rstd, dx, dw);
  }
};

// Bytes our kernels must move per call: forward x in, y out; backward dy and
// x in, dx in and out (elements of `elem` bytes; left out: the per-row
// statistics, the parameters, and the backward's column partials, written
// and read back once per block of rows: 3% more at 8192 x 2048).
void print_row(const char* name, const Problem& p, double elem, double fwd, double bwd) {
  const double n = static_cast<double>(p.rows * p.cols);
  std::printf("  %-24s fwd %8.4f ms (%6.1f GB/s)  bwd %8.4f ms (%6.1f GB/s)  fwd+bwd %8.4f ms\n", name, fwd,
              2 * n * elem / fwd * 1e-6, bwd, 4 * n * elem / bwd * 1e-6, fwd + bwd);
}

void print_peer(double tf, double tb, double fwd, double bwd, const char* ours) {
  std::printf("  %-24s fwd %8.4f ms               bwd %8.4f ms               fwd+bwd %8.4f ms\n", "PyTorch", tf, tb,
              tf + tb);
  std::printf("  ratio (PyTorch time / ours, %s): fwd %.2fx  bwd %.2fx  fwd+bwd %.2fx\n", ours, tf / fwd, tb / bwd,
              (tf + tb) / (fwd + bwd));
}

std::string peer_args(const Problem& p, int reps) {
  return " --rows " + std::to_string(p.rows) + " --cols " + std::to_string(p.cols) + " --reps " +
         std::to_string(reps) + (p.layernorm ? " --layernorm" : "");
}

int run_cuda(const Problem& p, int reps, bool torch, const std::string& torch_cmd, int only) {
#ifndef MT_HAVE_CUDA
  (void)p, (void)reps, (void)torch, (void)torch_cmd, (void)only;
  std::fprintf(stderr, "norm_bench: --device cuda needs a CUDA build (this one has no CUDA backend)\n");
  return 2;
#else
  const BackendInfo info = backend_info();
  if (info.cuda_devices < 1) {
    std::fprintf(stderr, "norm_bench: --device cuda: %s\n", info.cuda_status.c_str());
    return 2;
  }
  const HostData h = host_data(p);
  const int64_t R = p.rows, C = p.cols;
  Arena g(static_cast<size_t>(R * C) * (4 * sizeof(float) + 4 * 2) + static_cast<size_t>(8 * (R + C)) * sizeof(float) +
              (4 << 20),
          "norm_bench", Device::kCuda);
  auto up = [&](const std::vector<float>& v, Shape s, DType dt) {
    const Tensor f = g.alloc(s, DType::kF32), t = dt == DType::kF32 ? f : g.alloc(s, dt);
    copy_tensor(Tensor(const_cast<float*>(v.data()), s, DType::kF32), f);
    if (dt != DType::kF32) kernels::cast(f, t);
    return t;
  };
  const DType h16 = DType::kBF16;
  const bool packable = C % 8 == 0 && C >= 1024 && C <= 4096;
  const Norm n{p,
               up(h.x, {R, C}, h16),
               g.alloc({R, C}, h16),
               up(h.w, {C}, DType::kF32),
               up(h.b, {C}, DType::kF32),
               g.alloc({R}, DType::kF32),
               g.alloc({R}, DType::kF32),
               up(h.dy, {R, C}, h16),
               up(h.dx, {R, C}, h16),
               up(h.w, {C}, DType::kF32),
               up(h.b, {C}, DType::kF32)};
  constexpr int kCalls = 20;
  std::printf("%s forward and backward, %lld x %lld, bf16 x/y/dy/dx, fp32 weights, on %s, median of %d x %d calls\n",
              p.layernorm ? "LayerNorm" : "RMSNorm", static_cast<long long>(R), static_cast<long long>(C),
              info.cuda_name.c_str(), reps, kCalls);
  struct Variant {
    const char* name;
    bool packed;  // kernels::cuda::set_norm_packed
  };
  const Variant variants[] = {{"ours, packed", true}, {"ours, column a thread", false}};
  double ours_fwd = 0, ours_bwd = 0;
  if (!packable) std::printf("  (%lld columns: not a multiple of 8 from 1024 to 4096, so both rows run the column kernels)\n",
                             static_cast<long long>(C));
  for (const Variant& v : variants) {
    if (only >= 0 && &v != &variants[only]) continue;
    kernels::cuda::set_norm_packed(v.packed);
    const double fwd = time_ms(reps, kCalls, [&] {
      for (int i = 0; i < kCalls; ++i) n.forward();
      cuda::synchronize();
    });
    // dx, dw and db accumulate: their values grow over the calls, the time does not.
    const double bwd = time_ms(reps, kCalls, [&] {
      for (int i = 0; i < kCalls; ++i) n.backward();
      cuda::synchronize();
    });
    print_row(v.name, p, 2, fwd, bwd);
    if (&v == &variants[0] || only >= 0) ours_fwd = fwd, ours_bwd = bwd;
  }
  kernels::cuda::set_norm_packed(true);
  if (!torch) return 0;
  const std::string base =
      torch_cmd.empty() ? std::string("python3 ") + MT_SOURCE_DIR + "/bench/norm_torch_bench.py" : torch_cmd;
  double tf = 0, tb = 0;
  if (!run_peer(base + " --device cuda" + peer_args(p, reps), tf, tb)) return 1;
  print_peer(tf, tb, ours_fwd, ours_bwd, only == 1 ? "column a thread" : "packed");
  return 0;
#endif
}

int run_cpu(const Problem& p, int reps, int threads, bool torch) {
  set_num_threads(threads);
  HostData h = host_data(p);
  const int64_t R = p.rows, C = p.cols;
  std::vector<float> y(h.x.size()), mean(static_cast<size_t>(R)), rstd(static_cast<size_t>(R)), dw(h.w.size()),
      db(h.b.size());
  const Norm n{p,
               Tensor(h.x.data(), {R, C}, DType::kF32),
               Tensor(y.data(), {R, C}, DType::kF32),
               Tensor(h.w.data(), {C}, DType::kF32),
               Tensor(h.b.data(), {C}, DType::kF32),
               Tensor(mean.data(), {R}, DType::kF32),
               Tensor(rstd.data(), {R}, DType::kF32),
               Tensor(h.dy.data(), {R, C}, DType::kF32),
               Tensor(h.dx.data(), {R, C}, DType::kF32),
               Tensor(dw.data(), {C}, DType::kF32),
               Tensor(db.data(), {C}, DType::kF32)};
  std::printf("%s forward and backward, %lld x %lld, fp32, %d threads, median of %d\n",
              p.layernorm ? "LayerNorm" : "RMSNorm", static_cast<long long>(R), static_cast<long long>(C), threads,
              reps);
  const double fwd = time_ms(reps, 1, [&] { n.forward(); });
  const double bwd = time_ms(reps, 1, [&] { n.backward(); });
  print_row("ours", p, 4, fwd, bwd);
  if (!torch) return 0;
  const std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR +
                          "/bench/norm_torch_bench.py --device cpu --threads " + std::to_string(threads) +
                          peer_args(p, reps);
  double tf = 0, tb = 0;
  if (!run_peer(cmd, tf, tb)) return 1;
  print_peer(tf, tb, fwd, bwd, "fp32");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20, only = -1;
  Problem p{8192, 2048, false};
  bool torch = true;
  std::string device = "cpu", torch_cmd;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* n) { return !std::strcmp(argv[i], n) && i + 1 < argc; };
    if (arg("--threads")) threads = std::atoi(argv[++i]);
    else if (arg("--rows")) p.rows = std::atoll(argv[++i]);
    else if (arg("--cols")) p.cols = std::atoll(argv[++i]);
    else if (arg("--reps")) reps = std::atoi(argv[++i]);
    else if (arg("--device")) device = argv[++i];
    else if (arg("--torch-cmd")) torch_cmd = argv[++i];
    else if (arg("--variant")) {
      const std::string v = argv[++i];
      if (v != "all" && v != "packed" && v != "column") {
        std::fprintf(stderr, "norm_bench: --variant must be all, packed or column, not %s\n", v.c_str());
        return 2;
      }
      only = v == "packed" ? 0 : v == "column" ? 1 : -1;
    } else if (!std::strcmp(argv[i], "--layernorm")) p.layernorm = true;
    else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
    else {
      std::fprintf(stderr, "norm_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (p.rows < 1 || p.cols < 1 || reps < 1 || threads < 1) {
    std::fprintf(stderr, "norm_bench: --rows, --cols, --reps and --threads must be at least 1\n");
    return 2;
  }
  if (device == "cpu" && (only >= 0 || !torch_cmd.empty())) {
    std::fprintf(stderr, "norm_bench: --variant and --torch-cmd are for --device cuda (the CPU has one kernel, and "
                         "its peer is /usr/bin/python3)\n");
    return 2;
  }
  if (device == "cuda") return run_cuda(p, reps, torch, torch_cmd, only);
  if (device != "cpu") {
    std::fprintf(stderr, "norm_bench: --device must be cpu or cuda, not %s\n", device.c_str());
    return 2;
  }
  return run_cpu(p, reps, threads, torch);
}
