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
//
// Ops that know their arithmetic also count model FLOPs, and the table gives
// their rate: GEMM 2 M N K per call, labelled by shape ("gemm 8192x3072x2048
// NT bf16>bf16": M x N x K, A and B transposed or not, input > output dtype)
// so that each of a model's GEMMs shows its own TFLOP/s; causal attention
// 4 B a d T (T + 1) / 2 forward and 2.5 times that backward (the convention
// of FlashAttention's figures, whatever the kernel recomputes).

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
  // flops: the call's model FLOPs (0: not counted).
  OpScope(const char* op, Device device, double flops = 0) {
    if (enabled()) begin(op, device, flops);
  }
  ~OpScope() {
    if (active_) end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void begin(const char* op, Device device, double flops);
  void end();
  bool active_ = false;  // begin() ran: end() must undo its nesting depth
  int64_t slot_ = -1;    // this call's pending entry; -1 when nested in another timed call
};

struct OpStat {
  std::string op;
  Device device = Device::kCpu;
  int64_t calls = 0;
  double ms = 0;     // total
  double flops = 0;  // total model FLOPs of the calls (0: the op does not count them)
  double tflops() const { return ms > 0 ? flops / (ms * 1e9) : 0.0; }
};

// A stable C string equal to `label` (for an OpScope op built at run time,
// e.g. a GEMM's shape); the same pointer for the same text.
const char* intern(const std::string& label);
// The GEMM label described above.
const char* gemm_label(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, DType in, DType out);

// Forgets everything timed so far (waits for the device's pending events).
void reset();
// The totals so far, largest first (waits for the device's pending events).
std::vector<OpStat> collect();
// A table of collect(): op, device, calls, ms per iteration, share, and
// TFLOP/s for ops that count FLOPs.
std::string table(const std::vector<OpStat>& stats, int64_t iterations, double wall_ms);

}  // namespace mt::profile
