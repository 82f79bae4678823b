// Full training step of GPT-2 124M, ours against PyTorch in the same run.
//
//   ./build/bench/gpt_bench --threads 2 --steps 5
//
// options: --threads N (2)  --steps N timed steps (5)  --warmup N untimed steps (3)
//          --layers N (12)  --no-torch  --no-bf16  --no-fp32  --fp16  --torch-foreach auto|on|off
//
// --fp16 adds our --fp16 step (IEEE half storage, fp32 master weights; the
// loss scale does not change the work). Its GEMMs run on fp32 units here
// (oneDNN has fp16 kernels only with AVX512-FP16), so its MFU is over the
// fp32 peak and it has no target: the figure says what fp16 costs beside bf16.
//
// Shapes: 12 layers, hidden 768, 12 heads, vocabulary 50257 padded to 50304,
// 1024 learned positions, B=4, T=256, GELU, LayerNorm, tied embeddings,
// dropout 0 (issue 5's last "Must show").
//
// One training step, both sides:
//   ours    model.zero_grads(); forward; backward; opt.clip_grad_norm(1.0);
//           opt.step(lr, wd) (AdamW; with --bf16 compute it also refreshes the
//           bf16 weight copies, model.sync_low_precision())
//   PyTorch opt.zero_grad(set_to_none=True); loss = model(x, y); loss.backward();
//           clip_grad_norm_(1.0); torch.optim.AdamW.step() (bench/gpt_torch_bench.py,
//           a nanoGPT-style fp32 nn.Module), run by /usr/bin/python3 in PyTorch's
//           tuned environment (../shared/TOOLCHAIN.md "PyTorch as a fair peer"):
//           OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp
//           (package libopenblas0-openmp, installed by setup.sh), same thread count.
// Reported: median tokens/s over the timed steps (after the warm-up steps),
// phase medians (forward, backward, clip, optimizer), ratio to PyTorch fp32
// (targets: fp32 >= 1.5x, bf16 >= 2.5x), a second table for forward+backward
// alone (the model issue's measure, same targets, plus >= 80% of the best
// GEMM for fp32), and
// MFU = model FLOPs (Megatron's formula, GPTModel::flops_per_micro_batch) per
// second over the peak measured in this run (an FMA / vdpbf16ps register loop
// on every thread), beside the share of the TOOLCHAIN.md ceilings (527 fp32,
// 1054 bf16 GFLOP/s on 2 cores, measured on Zen 5; a Zen 4 host, whose
// AVX-512 runs on 256-bit units, measures about half) and of the best oneDNN
// GEMM on the model's shapes. The load average, each section's own CPU use
// and the CPU other processes used meanwhile (/proc/stat) are printed: the 2
// cores are shared, and figures taken under load are low. Run it when
// `uptime` shows a quiet machine. A benchmark: never asserts times.
#include <immintrin.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

using namespace mt;

namespace {

constexpr double kToolchainPeakF32 = 527e9, kToolchainPeakBF16 = 1054e9;  // ../shared/TOOLCHAIN.md, 2 cores

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

// Busy CPU seconds of the whole machine so far (all processes; /proc/stat).
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + sys + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU use of this process and its waited-for children.
double own_cpu_seconds() {
  rusage u{}, c{};
  getrusage(RUSAGE_SELF, &u);
  getrusage(RUSAGE_CHILDREN, &c);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime) + s(c.ru_utime) + s(c.ru_stime);
}

// Cores' worth of CPU used by OTHER processes between begin() and end().
struct OtherLoad {
  double busy0 = 0, own0 = 0, wall0 = 0;
  void begin() { busy0 = machine_busy_seconds(), own0 = own_cpu_seconds(), wall0 = now(); }
  double end() const {
    const double wall = now() - wall0;
    return std::max(0.0, (machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0)) / std::max(1e-9, wall);
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --- peak of the machine, measured now ------------------------------------
// 12 independent FMA chains per thread (latency 4 x 2 pipes needs >= 8).
__attribute__((target("avx512f"))) double fma_chains_f32(int64_t iters) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}
constexpr double kFlopsPerIterF32 = 12.0 * 16 * 2;

__attribute__((target("avx512f,avx512bf16"))) double dot_chains_bf16(int64_t iters) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_setzero_ps();
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, a);
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}
constexpr double kFlopsPerIterBF16 = 12.0 * 32 * 2;

// Best of 5 runs of `threads` threads each running the loop; FLOP/s.
template <typename F>
double register_peak(F loop, double flops_per_iter, int threads) {
  const int64_t iters = 20'000'000;  // ~0.1 s per thread for fp32 on Zen 5
  double best = 0, sink = 0;
  for (int r = 0; r < 5; ++r) {
    const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += loop(iters);
    best = std::max(best, flops_per_iter * static_cast<double>(iters) * threads / (now() - t0));
  }
  if (sink == 12345.678) std::printf(" ");  // keep the loops
  return best;
}

// Best GFLOP/s of oneDNN over the model's GEMM shapes (forward and both backward forms).
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
      best = std::max(best, 2.0 * static_cast<double>(s.M * s.Nn * s.K) / (now() - t0));
    }
  }
  return best;
}

// --- one side's result ------------------------------------------------------
struct StepTimes {
  bool ok = false;
  double step = 0, zero = 0, fwd = 0, bwd = 0, clip = 0, opt = 0, fwdbwd = 0;  // median seconds
  double sync = 0;        // sync_low_precision alone (bf16), measured outside the step
  double cpu_util = 0;    // CPU s / wall s over the timed steps
  double others = 0;      // cores' worth of CPU other processes used meanwhile
  double first_loss = 0, last_loss = 0;
  std::string load_before, load_after, note;
};

StepTimes run_ours(const model::ModelConfig& cfg, DType compute, int64_t B, const Tensor& tokens, const Tensor& labels,
                int warmup, int steps, double* flops) {
  StepTimes r;
  model::GPTOptions o;
  const bool bf16 = compute != DType::kF32;  // 16-bit compute: bf16 or fp16
  o.micro_batch = B, o.half_compute = bf16, o.half = compute == DType::kF16 ? DType::kF16 : DType::kBF16;
  auto m = model::GPTModel::create(cfg, o);
  if (!m.is_ok()) {
    r.note = m.status().message();
    return r;
  }
  model::GPTModel& model = **m;
  model.init_parameters(1234);
  optim::Optimizer opt(model, optim::OptimizerConfig{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  *flops = model.flops_per_micro_batch();
  std::vector<double> step, zero, fwd, bwd, clip, ostep, fb;
  r.load_before = loadavg();
  double cpu0 = 0, wall0 = 0;
  OtherLoad other;
  for (int it = 0; it < warmup + steps; ++it) {
    if (it == warmup) cpu0 = cpu_seconds(), wall0 = now(), other.begin();
    const long f0 = minor_faults();
    const double t0 = now();
    model.zero_grads();
    const double t1 = now();
    const double loss = model.forward(0, tokens, labels, static_cast<uint64_t>(it), true);
    const double t2 = now();
    model.backward(0);
    const double t3 = now();
    opt.clip_grad_norm(1.0);
    const double t4 = now();
    opt.step(6e-4, 0.1);
    const double t5 = now();
    if (it == 0) r.first_loss = loss;
    r.last_loss = loss;
    if (it >= warmup) {
      step.push_back(t5 - t0), zero.push_back(t1 - t0), fwd.push_back(t2 - t1), bwd.push_back(t3 - t2);
      clip.push_back(t4 - t3), ostep.push_back(t5 - t4), fb.push_back(t3 - t1);
      std::fprintf(stderr, "  ours %s step %d: %.3f s, loss %.4f, %ld page faults\n", dtype_name(compute), it - warmup,
                   t5 - t0, loss, minor_faults() - f0);
    }
  }
  r.cpu_util = (cpu_seconds() - cpu0) / std::max(1e-9, now() - wall0);
  r.others = other.end();
  r.load_after = loadavg();
  if (bf16) {
    std::vector<double> s;
    for (int i = 0; i < 3; ++i) {
      const double t0 = now();
      model.sync_low_precision();
      s.push_back(now() - t0);
    }
    r.sync = median(s);
  }
  r.step = median(step), r.zero = median(zero), r.fwd = median(fwd), r.bwd = median(bwd), r.clip = median(clip);
  r.opt = median(ostep), r.fwdbwd = median(fb);
  r.ok = steps > 0;
  return r;
}

StepTimes run_torch(int layers, int64_t V, int64_t maxpos, int64_t B, int64_t T, int warmup, int steps, int threads,
                 const std::string& foreach) {
  StepTimes r;
  const char* omp_blas = "/usr/lib/x86_64-linux-gnu/openblas-openmp";
  if (!std::ifstream(std::string(omp_blas) + "/libblas.so.3").good())
    r.note = "WARNING: libopenblas0-openmp is missing (setup.sh installs it): PyTorch runs UNTUNED. ";
  // OpenBLAS's AVX-512 kernels where the CPU has AVX-512, else its AVX2 ones
  // (SkylakeX on an AVX2-only host dies with an illegal instruction).
  const char* coretype = __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
  const std::string cmd = std::string("OPENBLAS_CORETYPE=") + coretype + " LD_LIBRARY_PATH=" + omp_blas +
                          " /usr/bin/python3 " + MT_SOURCE_DIR + "/bench/gpt_torch_bench.py --layers " +
                          std::to_string(layers) + " --hidden 768 --heads 12 --vocab " + std::to_string(V) +
                          " --max-pos " + std::to_string(maxpos) + " --batch " + std::to_string(B) + " --seq " +
                          std::to_string(T) + " --steps " + std::to_string(steps) + " --warmup " +
                          std::to_string(warmup) + " --threads " + std::to_string(threads) + " --foreach " + foreach;
  r.load_before = loadavg();
  OtherLoad other;
  other.begin();
  FILE* p = popen(cmd.c_str(), "r");
  std::map<std::string, std::string> kv;
  char line[1024];
  while (p && std::fgets(line, sizeof line, p)) {
    char key[64], val[900];
    if (std::sscanf(line, "%63s %899[^\n]", key, val) == 2) kv[key] = val;
  }
  const int rc = p ? pclose(p) : -1;
  r.others = other.end();  // includes the Python start-up and model build (not timed)
  r.load_after = loadavg();
  auto num = [&](const char* k) { return kv.count(k) ? std::atof(kv[k].c_str()) : 0.0; };
  r.step = num("step_s_median"), r.zero = num("zero_s"), r.fwd = num("fwd_s"), r.bwd = num("bwd_s");
  r.clip = num("clip_s"), r.opt = num("opt_s"), r.cpu_util = num("cpu_util");
  const double fbt = num("fwdbwd_tokens_per_s");
  r.fwdbwd = fbt > 0 ? static_cast<double>(B * T) / fbt : 0;
  r.ok = rc == 0 && r.step > 0;
  r.note += "torch " + kv["torch"] + ", AdamW foreach=" + kv["foreach"] + ", BLAS " + kv["blas"];
  if (!r.ok) r.note += " (exit status " + std::to_string(rc) + "; needs /usr/bin/python3 with python3-torch)";
  return r;
}

void print_phases(const char* name, const StepTimes& r) {
  std::printf("  %-13s step %7.3f s = zero %6.3f + fwd %6.3f + bwd %6.3f + clip %6.3f + adamw %6.3f", name, r.step,
              r.zero, r.fwd, r.bwd, r.clip, r.opt);
  if (r.sync > 0) std::printf(" (of which 16-bit copy sync %.3f)", r.sync);
  std::printf("\n    own cpu %.2f cores, other processes %.2f cores, load average %s -> %s\n", r.cpu_util, r.others,
              r.load_before.c_str(), r.load_after.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 5, warmup = 3, layers = 12;
  bool torch = true, do_bf16 = true, do_fp32 = true, do_fp16 = false;
  std::string foreach = "auto";
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* s) { return !std::strcmp(argv[i], s) && i + 1 < argc; };
    if (arg("--threads")) threads = std::atoi(argv[++i]);
    else if (arg("--steps") || arg("--iters")) steps = std::atoi(argv[++i]);
    else if (arg("--warmup")) warmup = std::atoi(argv[++i]);
    else if (arg("--layers")) layers = std::atoi(argv[++i]);
    else if (arg("--torch-foreach")) foreach = argv[++i];
    else if (!std::strcmp(argv[i], "--no-torch")) torch = false;
    else if (!std::strcmp(argv[i], "--no-bf16")) do_bf16 = false;
    else if (!std::strcmp(argv[i], "--no-fp32")) do_fp32 = false;
    else if (!std::strcmp(argv[i], "--fp16")) do_fp16 = true;
    else {
      std::fprintf(stderr, "gpt_bench: unknown argument %s\nusage: gpt_bench [--threads 2] [--steps 5] [--warmup 3] "
                           "[--layers 12] [--no-torch] [--no-bf16] [--no-fp32] [--fp16] [--torch-foreach auto|on|off]\n", argv[i]);
      return 2;
    }
  }
  steps = std::max(steps, 1);
  set_num_threads(threads);
  model::ModelConfig cfg;
  cfg.num_layers = layers, cfg.hidden_size = 768, cfg.num_attention_heads = 12, cfg.seq_length = 256;
  cfg.max_position_embeddings = 1024, cfg.vocab_size = 50257, cfg.hidden_dropout = 0, cfg.attention_dropout = 0;
  const int64_t B = 4, T = 256, V = cfg.padded_vocab(1), tokens_per_step = B * T;
  std::vector<int32_t> tok(B * T), lab(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 7919) % 50257), lab[i] = static_cast<int32_t>((i * 104729) % 50257);
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);

  std::printf("GPT-2 124M training step: L=%d h=768 a=12 V=%lld B=%lld T=%lld, %d threads, %d warm-up + %d timed steps "
              "(median)\n", layers, (long long)V, (long long)B, (long long)T, threads, warmup, steps);
  std::printf("load average at start: %s\n", loadavg().c_str());

  // Peaks, measured now.
  const bool has512 = __builtin_cpu_supports("avx512f"), hasbf16 = has512 && __builtin_cpu_supports("avx512bf16");
  OtherLoad peak_other;
  peak_other.begin();
  const double fma32 = has512 ? register_peak(fma_chains_f32, kFlopsPerIterF32, threads) : 0;
  const double fma16 = hasbf16 ? register_peak(dot_chains_bf16, kFlopsPerIterBF16, threads) : 0;
  const double gemm32 = gemm_peak(DType::kF32, B * T, 768, V), gemm16 = gemm_peak(DType::kBF16, B * T, 768, V);
  const double peak32 = fma32 > 0 ? fma32 : kToolchainPeakF32, peak16 = fma16 > 0 ? fma16 : kToolchainPeakBF16;
  std::printf("peak (register loop, %d threads): fp32 %.0f GFLOP/s (%.0f%% of TOOLCHAIN 527), bf16 %.0f GFLOP/s (%.0f%% of "
              "TOOLCHAIN 1054)%s\n", threads, fma32 * 1e-9, 100 * fma32 / kToolchainPeakF32, fma16 * 1e-9,
              100 * fma16 / kToolchainPeakBF16, has512 ? "" : " [no AVX-512: MFU uses the TOOLCHAIN figures]");
  std::printf("best oneDNN GEMM on the model's shapes: fp32 %.0f GFLOP/s, bf16 %.0f GFLOP/s (other processes used %.2f "
              "cores meanwhile)\n", gemm32 * 1e-9, gemm16 * 1e-9, peak_other.end());
  std::fflush(stdout);

  double flops = 0;
  StepTimes ours[3];  // fp32, bf16, fp16
  const DType modes[3] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int k = 0; k < 3; ++k) {
    if ((k == 0 && !do_fp32) || (k == 1 && !do_bf16) || (k == 2 && !do_fp16)) continue;
    ours[k] = run_ours(cfg, modes[k], B, tt, lt, warmup, steps, &flops);
    if (!ours[k].ok) std::fprintf(stderr, "ours %s failed: %s\n", dtype_name(modes[k]), ours[k].note.c_str());
  }
  if (flops == 0) {  // only PyTorch ran: the FLOP count still comes from our model's formula
    model::GPTOptions o;
    o.micro_batch = B, o.slots = 0;
    auto m = model::GPTModel::create(cfg, o);
    if (m.is_ok()) flops = (*m)->flops_per_micro_batch();
  }
  StepTimes pt;
  if (torch) {
    pt = run_torch(layers, V, cfg.max_position_embeddings, B, T, warmup, steps, threads, foreach);
    if (!pt.ok) std::printf("PyTorch reference did not run: %s\n", pt.note.c_str());
  }

  std::printf("\nmodel FLOPs per step (Megatron's formula, fwd+bwd): %.1f GFLOP\n", flops * 1e-9);
  std::printf("phase medians:\n");
  if (ours[0].ok) print_phases("ours fp32", ours[0]);
  if (ours[1].ok) print_phases("ours bf16", ours[1]);
  if (ours[2].ok) print_phases("ours fp16", ours[2]);
  if (pt.ok) print_phases("PyTorch fp32", pt);
  if (pt.ok) std::printf("  (%s)\n", pt.note.c_str());

  std::printf("\n%-13s %10s %9s %9s %8s %8s %8s %12s %9s\n", "training step", "tokens/s", "GFLOP/s", "vs PT32",
              "target", "MFU", "of TC", "of GEMM best", "fwd+bwd/s");
  auto row = [&](const char* name, const StepTimes& r, bool bf, const char* target) {
    if (!r.ok) return;
    const double tps = static_cast<double>(tokens_per_step) / r.step, ach = flops / r.step;
    const double peak = bf ? peak16 : peak32, tc = bf ? kToolchainPeakBF16 : kToolchainPeakF32, gb = bf ? gemm16 : gemm32;
    char ratio[32] = "-";
    if (pt.ok) std::snprintf(ratio, sizeof ratio, "%.2fx", pt.step / r.step);
    std::printf("%-13s %10.1f %9.1f %9s %8s %7.1f%% %7.1f%% %11.1f%% %9.1f\n", name, tps, ach * 1e-9, ratio, target,
                100 * ach / peak, 100 * ach / tc, 100 * ach / gb, static_cast<double>(tokens_per_step) / r.fwdbwd);
  };
  row("ours fp32", ours[0], false, ">=1.5x");
  row("ours bf16", ours[1], true, ">=2.5x");
  row("ours fp16", ours[2], false, "");
  row("PyTorch fp32", pt, false, "");
  // Forward + backward alone (the model issue's measure: no optimizer, no clip).
  std::printf("\n%-13s %10s %9s %9s %8s %8s %12s\n", "fwd+bwd", "tokens/s", "GFLOP/s", "vs PT32", "target", "MFU",
              "of GEMM best");
  auto fb_row = [&](const char* name, const StepTimes& r, bool bf, const char* target) {
    if (!r.ok) return;
    const double ach = flops / r.fwdbwd, peak = bf ? peak16 : peak32, gb = bf ? gemm16 : gemm32;
    char ratio[32] = "-";
    if (pt.ok) std::snprintf(ratio, sizeof ratio, "%.2fx", pt.fwdbwd / r.fwdbwd);
    std::printf("%-13s %10.1f %9.1f %9s %8s %7.1f%% %11.1f%%\n", name, static_cast<double>(tokens_per_step) / r.fwdbwd,
                ach * 1e-9, ratio, target, 100 * ach / peak, 100 * ach / gb);
  };
  fb_row("ours fp32", ours[0], false, ">=1.5x");
  fb_row("ours bf16", ours[1], true, ">=2.5x");
  fb_row("ours fp16", ours[2], false, "");
  fb_row("PyTorch fp32", pt, false, "");
  std::printf("(MFU: over the register-loop peak measured above, fp32 or bf16 by the compute dtype; of TC: over "
              "TOOLCHAIN.md's 527 / 1054 GFLOP/s; of GEMM best: over the fastest oneDNN GEMM on the model's shapes)\n");
  std::printf("load average at end: %s\n", loadavg().c_str());
  return 0;
}
