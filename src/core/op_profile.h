#pragma once
// Per-op time profile: with MT_PROFILE_OPS=1 in the environment, every
// kernel call that goes through a dispatcher (kernels/dispatch.h) is timed,
// and `megatron train` prints a table of time per op at the end of the run
// (iterations after the first; the first includes one-time setup) and adds
// it to the metrics file. CPU ops are timed by the host clock; CUDA ops by a
// pair of events recorded on the rank's stream around the call, so the
// figure is the GPU's time for the op's kernels, read back only when the
// table is made (no synchronisation per op). Calls made inside another
// timed call are counted in the outer one. Disabled (the default), a
// dispatcher pays one test of a cached flag.

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt::profile {

// MT_PROFILE_OPS set to a value other than "0" or empty (read once), unless
// set_enabled() overrode it.
bool enabled();
void set_enabled(bool on);

// Times the enclosing scope as one call of `op` on `device` (op: a string
// literal, kept by pointer).
class OpScope {
 public:
  OpScope(const char* op, Device device) {
    if (enabled()) begin(op, device);
  }
  ~OpScope() {
    if (active_) end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void begin(const char* op, Device device);
  void end();
  bool active_ = false;  // begin() ran: end() must undo its nesting depth
  int64_t slot_ = -1;    // this call's pending entry; -1 when nested in another timed call
};

struct OpStat {
  std::string op;
  Device device = Device::kCpu;
  int64_t calls = 0;
  double ms = 0;  // total
};

// Forgets everything timed so far (waits for the device's pending events).
void reset();
// The totals so far, largest first (waits for the device's pending events).
std::vector<OpStat> collect();
// A table of collect(): op, device, calls, total ms, ms per iteration, share.
std::string table(const std::vector<OpStat>& stats, int64_t iterations, double wall_ms);

}  // namespace mt::profile
