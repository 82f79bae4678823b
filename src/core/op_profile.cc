#include "core/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "core/cuda/runtime.h"
#include "core/sim_device.h"
#include "core/status.h"

namespace mt::profile {
namespace {

using Clock = std::chrono::steady_clock;

int g_enabled = -1;  // -1: not read yet

// One timed call: host clock for CPU ops, an event pair for CUDA ops.
struct Pending {
  const char* op;
  Device device;
  double flops = 0;
  Clock::time_point t0, t1;
  void* ev0 = nullptr;
  void* ev1 = nullptr;
};

struct State {
  std::vector<Pending> pending;
  std::vector<void*> free_events;
  struct Total {
    int64_t calls = 0;
    double ms = 0, flops = 0;
  };
  std::map<std::pair<std::string, Device>, Total> totals;
  std::set<std::string> labels;  // intern()ed op names (node-based: stable c_str())
  int depth = 0;  // nesting of OpScopes: only the outermost times
};

State& state() {
  static State s;
  return s;
}

void* take_event() {
#ifdef MT_HAVE_CUDA
  State& s = state();
  if (!s.free_events.empty()) {
    void* e = s.free_events.back();
    s.free_events.pop_back();
    return e;
  }
  return cuda::event_create();
#else
  MT_CHECK(false, "op profile: a CUDA op in a build without the CUDA backend");
#endif
}

// Moves the pending calls into the totals (reading CUDA events waits for them).
void drain() {
  State& s = state();
  for (const Pending& p : s.pending) {
    double ms = 0;
    if (p.ev0) {
#ifdef MT_HAVE_CUDA
      ms = cuda::event_elapsed_ms(p.ev0, p.ev1);
      s.free_events.push_back(p.ev0);
      s.free_events.push_back(p.ev1);
#endif
    } else {
      ms = std::chrono::duration<double, std::milli>(p.t1 - p.t0).count();
    }
    auto& t = s.totals[{p.op, p.device}];
    t.calls += 1;
    t.ms += ms;
    t.flops += p.flops;
  }
  s.pending.clear();
}

constexpr size_t kMaxPending = size_t{1} << 16;

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

}  // namespace

bool enabled() {
  if (g_enabled < 0) {
    const char* v = std::getenv("MT_PROFILE_OPS");
    g_enabled = v && *v && std::strcmp(v, "0") != 0 ? 1 : 0;
  }
  return g_enabled == 1;
}

void set_enabled(bool on) { g_enabled = on ? 1 : 0; }

void OpScope::begin(const char* op, Device device, double flops) {
  State& s = state();
  active_ = true;
  if (s.depth++ > 0) return;  // inside another timed call: counted there
  if (s.pending.size() >= kMaxPending) drain();
  Pending p{op, device, flops, {}, {}, nullptr, nullptr};
  if (device == Device::kCuda && !simdev::enabled()) {  // simulated: CPU twins, host clock
    p.ev0 = take_event();
    p.ev1 = take_event();
#ifdef MT_HAVE_CUDA
    cuda::event_record(p.ev0);
#endif
  } else {
    p.t0 = Clock::now();
  }
  s.pending.push_back(p);
  slot_ = static_cast<int64_t>(s.pending.size()) - 1;
}

void OpScope::end() {
  State& s = state();
  --s.depth;
  if (slot_ < 0) return;  // nested
  Pending& p = s.pending[static_cast<size_t>(slot_)];
  if (p.ev1) {
#ifdef MT_HAVE_CUDA
    cuda::event_record(p.ev1);
#endif
  } else {
    p.t1 = Clock::now();
  }
}

const char* intern(const std::string& label) { return state().labels.insert(label).first->c_str(); }

const char* gemm_label(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType in, DType out) {
  return intern(fmt::format("gemm {}x{}x{} {}{} {}>{}", M, N, K, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N',
                            dtype_name(in), dtype_name(out)));
}

void reset() {
  drain();
  state().totals.clear();
}

std::vector<OpStat> collect() {
  drain();
  std::vector<OpStat> out;
  for (const auto& [key, v] : state().totals) out.push_back({key.first, key.second, v.calls, v.ms, v.flops});
  std::sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) { return a.ms > b.ms; });
  return out;
}

std::string table(const std::vector<OpStat>& stats, int64_t iterations, double wall_ms) {
  double total = 0;
  for (const OpStat& s : stats) total += s.ms;
  const double iters = static_cast<double>(std::max<int64_t>(1, iterations));
  std::string t = fmt::format("op profile over {} iteration(s): ops {:.2f} ms per iteration of {:.2f} ms wall ({:.1f}%)\n",
                              iterations, total / iters, wall_ms / iters, wall_ms > 0 ? 100 * total / wall_ms : 0.0);
  size_t width = 28;
  for (const OpStat& s : stats) width = std::max(width, s.op.size());
  t += fmt::format("  {:<{}} {:>6} {:>10} {:>12} {:>7} {:>9}\n", "op", width, "device", "calls/it", "ms/it", "share",
                   "TFLOP/s");
  for (const OpStat& s : stats) {
    const std::string rate = s.flops > 0 && s.ms > 0 ? fmt::format("{:.4g}", s.tflops()) : "";
    t += fmt::format("  {:<{}} {:>6} {:>10.1f} {:>12.3f} {:>6.1f}% {:>9}\n", s.op, width, device_name(s.device),
                     static_cast<double>(s.calls) / iters, s.ms / iters, total > 0 ? 100 * s.ms / total : 0.0, rate);
  }
  return t;
}

}  // namespace mt::profile
