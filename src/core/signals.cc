#include "core/signals.h"

#include <fmt/format.h>
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/status.h"

namespace mt {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

// One thread's alternate stack; disabled before it is freed at thread exit.
struct SignalStack {
  std::unique_ptr<char[]> mem;
  ~SignalStack() {
    if (!mem) return;
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
  }
};

}  // namespace

void ensure_signal_stack() {
  thread_local SignalStack stack;
  if (stack.mem) return;
  stack_t cur{};
  MT_CHECK(sigaltstack(nullptr, &cur) == 0, fmt::format("sigaltstack: {}", std::strerror(errno)));
  if (!(cur.ss_flags & SS_DISABLE)) return;  // the thread has one already (a sanitizer's, say)
  // The frame holds the full register state (AVX-512: ~2.7 KB); leave room for the handler too.
  const long min = sysconf(_SC_MINSIGSTKSZ);
  const size_t size = static_cast<size_t>(std::max<long>(64 * 1024, 4 * min));
  stack.mem.reset(new char[size]);
  stack_t ss{};
  ss.ss_sp = stack.mem.get();
  ss.ss_size = size;
  MT_CHECK(sigaltstack(&ss, nullptr) == 0, fmt::format("sigaltstack: {}", std::strerror(errno)));
}

void install_stop_signal_handler(int signo) {
#pragma omp parallel  // every pool thread, the calling one included (it is the team's master)
  ensure_signal_stack();
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_ONSTACK;
  MT_CHECK(sigaction(signo, &sa, nullptr) == 0, fmt::format("sigaction({}): {}", signo, std::strerror(errno)));
}

bool stop_requested() { return g_stop.load(std::memory_order_relaxed); }

void clear_stop_request() { g_stop.store(false, std::memory_order_relaxed); }

}  // namespace mt
