#include "core/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
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
  Clock::time_point t0, t1;
  void* ev0 = nullptr;
  void* ev1 = nullptr;
};

struct State {
  std::vector<Pending> pending;
  std::vector<void*> free_events;
  std::map<std::pair<std::string, Device>, std::pair<int64_t, double>> totals;  // calls, ms
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
    t.first += 1;
    t.second += ms;
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

void OpScope::begin(const char* op, Device device) {
  State& s = state();
  active_ = true;
  if (s.depth++ > 0) return;  // inside another timed call: counted there
  if (s.pending.size() >= kMaxPending) drain();
  Pending p{op, device, {}, {}, nullptr, nullptr};
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

void reset() {
  drain();
  state().totals.clear();
}

std::vector<OpStat> collect() {
  drain();
  std::vector<OpStat> out;
  for (const auto& [key, v] : state().totals) out.push_back({key.first, key.second, v.first, v.second});
  std::sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) { return a.ms > b.ms; });
  return out;
}

std::string table(const std::vector<OpStat>& stats, int64_t iterations, double wall_ms) {
  double total = 0;
  for (const OpStat& s : stats) total += s.ms;
  const double iters = static_cast<double>(std::max<int64_t>(1, iterations));
  std::string t = fmt::format("op profile over {} iteration(s): ops {:.2f} ms per iteration of {:.2f} ms wall ({:.1f}%)\n",
                              iterations, total / iters, wall_ms / iters, wall_ms > 0 ? 100 * total / wall_ms : 0.0);
  t += fmt::format("  {:<28} {:>6} {:>10} {:>12} {:>7}\n", "op", "device", "calls/it", "ms/it", "share");
  for (const OpStat& s : stats)
    t += fmt::format("  {:<28} {:>6} {:>10.1f} {:>12.3f} {:>6.1f}%\n", s.op, device_name(s.device),
                     static_cast<double>(s.calls) / iters, s.ms / iters, total > 0 ? 100 * s.ms / total : 0.0);
  return t;
}

}  // namespace mt::profile
