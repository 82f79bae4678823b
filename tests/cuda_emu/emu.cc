// The emulator's execution model (emu.h): launches, the per-thread fibers of
// a block and their scheduler, __syncthreads, warp shuffles, __shared__
// arrays and the launch checks.
//
// Every CUDA thread of a block is a fiber: its own stack, switched to and
// from by emu_switch_stack below (x86-64: callee-saved registers, MXCSR and
// the x87 control word; no system call, unlike swapcontext, which made a
// switch about 200 times slower). The scheduler resumes the block's threads
// in turn; a thread runs until it finishes or waits at a barrier whose
// other participants have not all arrived. Barriers count arrivals; the last
// arrival opens the barrier and carries on. A pass in which no thread could
// run while some are unfinished is a deadlock, reported with the barrier.

#include "emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

// Saves the callee-saved state of the running context on its stack, stores
// its stack pointer in *save_sp, and resumes the context saved at load_sp.
extern "C" void emu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl emu_switch_stack
  .hidden emu_switch_stack
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");

namespace emu {
namespace {

constexpr size_t kStackBytes = size_t{256} << 10;  // per CUDA thread, plus a guard page below
constexpr size_t kStaticSharedBytes = size_t{48} << 10;
constexpr unsigned kMaxThreadsPerBlock = 1024;

struct Barrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
  std::source_location site;  // __syncthreads: where the current generation's first thread waits
};

struct Fiber {
  void* sp = nullptr;
  uint3 tid{};
  unsigned linear = 0;
  bool done = false;
  const Barrier* waiting = nullptr;  // blocked until waiting->generation != wait_generation
  uint64_t wait_generation = 0;
  unsigned shuffles = 0;  // shuffles so far; the parity picks the exchange buffer
};

struct Warp {
  Barrier barrier;
  unsigned lanes = 0;
  uint64_t value[2][32] = {};  // double-buffered: a lane's next shuffle cannot overwrite an unread value
};

struct Block {
  Barrier barrier;
  std::vector<Warp> warps;
  std::vector<std::pair<void*, size_t>> shared;  // __shared__ arrays poisoned in this block
  size_t shared_bytes = 0;
};

// The running launch (one at a time, under g_launch_mu).
std::mutex g_launch_mu;
thread_local bool t_in_launch = false;
const char* g_kernel = nullptr;
const Config* g_config = nullptr;
void (*g_body)(void*) = nullptr;
void* g_ctx = nullptr;
Block g_block;
std::vector<Fiber> g_fibers;
Fiber* g_current = nullptr;
void* g_scheduler_sp = nullptr;
std::vector<char*> g_stacks;  // stack tops, reused by every launch

[[noreturn]] void fail(const char* fmt, ...) {
  std::fprintf(stderr, "emu: ");
  if (g_kernel) {
    std::fprintf(stderr, "kernel %s (launched at %s:%u)", g_kernel, g_config->where.file_name(),
                 static_cast<unsigned>(g_config->where.line()));
    if (g_current)
      std::fprintf(stderr, ", block (%u,%u,%u) thread (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
                   threadIdx.y, threadIdx.z);
    std::fprintf(stderr, ": ");
  }
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  std::abort();
}

void yield() { emu_switch_stack(&g_current->sp, g_scheduler_sp); }

void wait(Barrier& b) {
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  g_current->waiting = &b;
  g_current->wait_generation = b.generation;
  yield();
}

[[noreturn]] void fiber_main() {
  g_body(g_ctx);
  g_current->done = true;
  yield();
  __builtin_unreachable();
}

void ensure_stacks(unsigned n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (g_stacks.size() < n) {
    void* base =
        mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fail("cannot map a %zu-byte thread stack", kStackBytes);
    if (mprotect(base, page, PROT_NONE) != 0) fail("cannot protect a stack guard page");
    g_stacks.push_back(static_cast<char*>(base) + page + kStackBytes);
  }
}

// A fresh context on the stack ending at top that starts in fiber_main: the
// frame emu_switch_stack pops (control words, six registers, return address).
void* initial_frame(char* top) {
  uint32_t mxcsr = 0;
  uint16_t fpu_cw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  auto* sp = reinterpret_cast<uint64_t*>(top);  // 16-byte aligned
  *--sp = 0;                                    // fiber_main's (absent) return address: entry alignment
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);
  for (int r = 0; r < 6; ++r) *--sp = 0;
  *--sp = mxcsr | static_cast<uint64_t>(fpu_cw) << 32;
  return sp;
}

[[noreturn]] void deadlock(unsigned nt) {
  unsigned exited = 0, at_block = 0;
  const Barrier* warp_barrier = nullptr;
  unsigned warp = 0;
  for (const Fiber& f : g_fibers) {
    if (f.done)
      ++exited;
    else if (f.waiting == &g_block.barrier)
      ++at_block;
    else if (!warp_barrier)
      warp_barrier = f.waiting, warp = f.linear / 32;
  }
  g_current = nullptr;
  if (at_block)
    fail("block (%u,%u,%u) deadlocks: %u of %u threads wait at __syncthreads (%s:%u), %u threads exited%s", blockIdx.x,
         blockIdx.y, blockIdx.z, at_block, nt, g_block.barrier.site.file_name(),
         static_cast<unsigned>(g_block.barrier.site.line()), exited,
         warp_barrier ? " and the others wait in warp shuffles" : "");
  fail("block (%u,%u,%u) deadlocks: lanes of warp %u wait in a shuffle for lanes that exited (%u threads exited)",
       blockIdx.x, blockIdx.y, blockIdx.z, warp, exited);
}

void run_block(const dim3& block, bool reverse) {
  const unsigned nt = block.x * block.y * block.z;
  g_block.barrier = Barrier{};
  g_block.barrier.expected = nt;
  g_block.warps.assign((nt + 31) / 32, Warp{});
  for (unsigned w = 0; w < g_block.warps.size(); ++w) {
    g_block.warps[w].lanes = std::min(32u, nt - 32 * w);
    g_block.warps[w].barrier.expected = g_block.warps[w].lanes;
  }
  g_block.shared.clear();
  g_block.shared_bytes = 0;
  g_fibers.assign(nt, Fiber{});
  for (unsigned t = 0; t < nt; ++t) {
    Fiber& f = g_fibers[t];
    f.linear = t;
    f.tid = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    f.sp = initial_frame(g_stacks[t]);
  }
  for (unsigned live = nt; live > 0;) {
    bool ran = false;
    for (unsigned k = 0; k < nt; ++k) {
      Fiber& f = g_fibers[reverse ? nt - 1 - k : k];
      if (f.done || (f.waiting && f.waiting->generation == f.wait_generation)) continue;
      f.waiting = nullptr;
      g_current = &f;
      threadIdx = f.tid;
      emu_switch_stack(&g_scheduler_sp, f.sp);
      ran = true;
      if (f.done) --live;
    }
    if (!ran) deadlock(nt);
  }
  g_current = nullptr;
}

bool valid_config(const Config& c) {
  const dim3 &g = c.grid, &b = c.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  return b.x >= 1 && b.y >= 1 && b.z >= 1 && b.x <= 1024 && b.y <= 1024 && b.z <= 64 &&
         threads <= kMaxThreadsPerBlock && g.x >= 1 && g.y >= 1 && g.z >= 1 && g.x <= 0x7fffffffu && g.y <= 65535 &&
         g.z <= 65535;
}

}  // namespace

void run_grid(const char* kernel, const Config& c, void (*body)(void*), void* ctx) {
  if (t_in_launch) fail("%s launched from a kernel: dynamic parallelism is not emulated", kernel);
  if (trace())
    std::fprintf(stderr, "[emu] %s at %s:%u grid (%u,%u,%u) block (%u,%u,%u)\n", kernel, c.where.file_name(),
                 static_cast<unsigned>(c.where.line()), c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
  if (!valid_config(c)) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (!is_valid_stream(c.stream)) {
    set_last_error(cudaErrorInvalidResourceHandle);
    return;
  }
  std::lock_guard<std::mutex> lock(g_launch_mu);
  t_in_launch = true;
  g_kernel = kernel;
  g_config = &c;
  if (c.shared_bytes != 0) fail("%zu bytes of dynamic shared memory: not emulated", c.shared_bytes);
  g_body = body;
  g_ctx = ctx;
  gridDim = c.grid;
  blockDim = c.block;
  ensure_stacks(c.block.x * c.block.y * c.block.z);
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        run_block(c.block, ((x + y + z) & 1) != 0);
      }
  g_kernel = nullptr;
  g_config = nullptr;
  t_in_launch = false;
}

void check_pointer_argument(const char* kernel, const Config& c, int index, const void* p) {
  if (p && !is_device_memory(p)) {
    g_kernel = kernel;
    g_config = &c;
    fail("argument %d is %p, which is not device memory (a host pointer passed to a kernel?)", index, p);
  }
}

void launch_bounds(int max_threads, int) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  if (threads > static_cast<unsigned>(max_threads))
    fail("launched with %u threads per block, above its __launch_bounds__ of %d (the GPU refuses the launch)", threads,
         max_threads);
}

void shared_block(void* array, size_t bytes) {
  for (const auto& s : g_block.shared)
    if (s.first == array) return;
  g_block.shared.emplace_back(array, bytes);
  g_block.shared_bytes += bytes;
  if (g_block.shared_bytes > kStaticSharedBytes)
    fail("its __shared__ arrays take %zu bytes, above the %zu bytes of static shared memory", g_block.shared_bytes,
         kStaticSharedBytes);
  std::memset(array, 0xFF, bytes);
}

void syncthreads(const std::source_location& site) {
  Barrier& b = g_block.barrier;
  if (b.arrived == 0) {
    b.site = site;
  } else if (b.site.line() != site.line() || std::strcmp(b.site.file_name(), site.file_name()) != 0) {
    fail("__syncthreads at %s:%u while other threads of the block wait at %s:%u (divergent barrier)", site.file_name(),
         static_cast<unsigned>(site.line()), b.site.file_name(), static_cast<unsigned>(b.site.line()));
  }
  wait(b);
}

uint64_t shuffle(unsigned mask, uint64_t bits, Shuffle kind, int arg) {
  Fiber& f = *g_current;
  const unsigned lane = f.linear % 32;
  Warp& w = g_block.warps[f.linear / 32];
  const unsigned lanes_mask = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1;
  if (mask != lanes_mask)
    fail("shuffle with mask 0x%08x in a warp whose lanes are 0x%08x (only whole-warp shuffles are emulated)", mask,
         lanes_mask);
  const unsigned src = kind == Shuffle::kDown ? lane + static_cast<unsigned>(arg) : lane ^ static_cast<unsigned>(arg);
  const unsigned parity = f.shuffles++ & 1;
  w.value[parity][lane] = bits;
  wait(w.barrier);
  if (src >= 32) return bits;  // beyond the warp: CUDA returns the caller's own value
  if (src >= w.lanes) fail("shuffle reads lane %u of a warp of %u lanes", src, w.lanes);
  return w.value[parity][src];
}

}  // namespace emu
