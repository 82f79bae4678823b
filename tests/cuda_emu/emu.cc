// The emulator's execution model (emu.h): launches, the per-thread fibers of
// a block and their scheduler, __syncthreads, warp shuffles and mmas,
// __shared__ arrays, dynamic shared memory and the launch checks.
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
// sm_90 (H100, H200): a block's shared memory, static plus dynamic, is at
// most 227 KiB (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr size_t kMaxSharedBytesPerBlock = 232448;
constexpr size_t kDynamicSharedAlign = 128;
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
  unsigned collectives = 0;  // warp shuffles, mmas and ldmatrix so far; the parity picks the exchange buffer
  // cp.async copies not landed yet, oldest first, and where each committed
  // group ends in that list (copies past the last end are uncommitted).
  struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned src_bytes;
  };
  std::vector<AsyncCopy> copies;
  std::vector<size_t> group_ends;
};

// What a lane contributed to a warp collective, so that an mma can tell a
// lane that reached the same warp barrier from a shuffle.
enum class Collective : uint8_t { kShuffle, kMma, kLdmatrix };

// A lane's mma operands, as its registers hold them.
struct MmaFragments {
  unsigned a[4], b[2];
  float c[4];
};

struct Warp {
  Barrier barrier;
  unsigned lanes = 0;
  // Double-buffered by the parity of Fiber::collectives: a lane that leaves
  // a warp barrier early and reaches the next collective cannot overwrite
  // what a slower lane has yet to read, and it cannot reach the one after
  // that until every lane has arrived at (so finished reading before) it.
  Collective kind[2][32] = {};
  uint64_t value[2][32] = {};  // shuffles
  MmaFragments mma[2][32] = {};
  float mma_d[2][16][8] = {};  // the warp's D, computed by the lane that opens the barrier
  const void* ld_row[2][32] = {};  // ldmatrix: each lane's row address
  unsigned ld_out[2][32][4] = {};  // and each lane's registers, read by the lane that opens the barrier
};

struct Block {
  Barrier barrier;
  bool barrier_opened = false;  // set by the __syncthreads that opens it, cleared by the scheduler
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
// Dynamic shared memory, reused by every block and launch: the most a block
// may have, mapped once, followed by a PROT_NONE guard page. The running
// launch's buffer is its last Config.shared_bytes, rounded up to 128, so that
// an access past its end faults.
char* g_dynamic_end = nullptr;
char* g_dynamic = nullptr;

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

void land_copies(Fiber& f, size_t n);

[[noreturn]] void fiber_main() {
  g_body(g_ctx);
  land_copies(*g_current, g_current->copies.size());  // a thread's copies land by its exit at the latest
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
         warp_barrier ? " and the others wait in warp shuffles or mmas" : "");
  fail("block (%u,%u,%u) deadlocks: lanes of warp %u wait in a shuffle or mma for lanes that exited "
       "(%u threads exited)",
       blockIdx.x, blockIdx.y, blockIdx.z, warp, exited);
}

// Points g_dynamic at `bytes` (at most kMaxSharedBytesPerBlock, rounded up
// to 128) that end at the guard page.
void ensure_dynamic_shared(size_t bytes) {
  if (!g_dynamic_end) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t mapped = (kMaxSharedBytesPerBlock + page - 1) / page * page;
    void* base = mmap(nullptr, mapped + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) fail("cannot map %zu bytes of dynamic shared memory", mapped);
    g_dynamic_end = static_cast<char*>(base) + mapped;
    if (mprotect(g_dynamic_end, page, PROT_NONE) != 0) fail("cannot protect the dynamic shared memory's guard page");
  }
  g_dynamic = g_dynamic_end - (bytes + kDynamicSharedAlign - 1) / kDynamicSharedAlign * kDynamicSharedAlign;
}

void run_block(const dim3& block, bool reverse) {
  const unsigned nt = block.x * block.y * block.z;
  g_block.barrier = Barrier{};
  g_block.barrier.expected = nt;
  // Only the barriers are reset: the exchange buffers (4 KiB a warp) are
  // always written before they are read.
  g_block.warps.resize((nt + 31) / 32);
  for (unsigned w = 0; w < g_block.warps.size(); ++w) {
    g_block.warps[w].barrier = Barrier{};
    g_block.warps[w].lanes = std::min(32u, nt - 32 * w);
    g_block.warps[w].barrier.expected = g_block.warps[w].lanes;
  }
  g_block.shared.clear();
  g_block.shared_bytes = 0;
  std::memset(g_dynamic, 0xFF, g_config->shared_bytes);
  g_fibers.assign(nt, Fiber{});
  for (unsigned t = 0; t < nt; ++t) {
    Fiber& f = g_fibers[t];
    f.linear = t;
    f.tid = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    f.sp = initial_frame(g_stacks[t]);
  }
  // Warp by warp (ascending or descending), each warp run until none of its
  // threads can move (all wait at __syncthreads or are done): a warp races
  // as far ahead of the others as a GPU may let it, so a write that another
  // warp's earlier read needed protecting (a missing __syncthreads after the
  // read) lands before that read.
  // When a __syncthreads opens, the order starts again from its first warp.
  const unsigned warps = static_cast<unsigned>(g_block.warps.size());
  g_block.barrier_opened = false;
  for (unsigned live = nt; live > 0;) {
    bool ran = false;
    for (unsigned wk = 0; wk < warps; ++wk) {
      const unsigned w = reverse ? warps - 1 - wk : wk, first = 32 * w, lanes = g_block.warps[w].lanes;
      for (bool moved = true; moved && !g_block.barrier_opened;) {
        moved = false;
        for (unsigned lk = 0; lk < lanes && !g_block.barrier_opened; ++lk) {
          Fiber& f = g_fibers[first + (reverse ? lanes - 1 - lk : lk)];
          if (f.done || (f.waiting && f.waiting->generation == f.wait_generation)) continue;
          f.waiting = nullptr;
          g_current = &f;
          threadIdx = f.tid;
          emu_switch_stack(&g_scheduler_sp, f.sp);
          ran = moved = true;
          if (f.done) --live;
        }
      }
      if (g_block.barrier_opened) {
        g_block.barrier_opened = false;
        wk = static_cast<unsigned>(-1);  // from the first warp again
      }
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

float bf16_lo(unsigned r) { return std::bit_cast<float>(r << 16); }
float bf16_hi(unsigned r) { return std::bit_cast<float>(r & 0xffff0000u); }

// D = A B + C of the warp whose fragments are `lanes` (emu.h has the layouts).
void mma_warp(const MmaFragments (&lanes)[32], float (&d)[16][8]) {
  float A[16][16], B[16][8], C[16][8];
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned g = lane >> 2, t = lane & 3;
    const MmaFragments& f = lanes[lane];
    for (unsigned h = 0; h < 2; ++h) {  // h: rows g + 8 h of A and C, rows 2t + 8 h of B
      for (unsigned kh = 0; kh < 2; ++kh) {  // kh: columns 2t + 8 kh of A
        const unsigned r = f.a[h + 2 * kh];
        A[g + 8 * h][2 * t + 8 * kh] = bf16_lo(r);
        A[g + 8 * h][2 * t + 8 * kh + 1] = bf16_hi(r);
      }
      B[2 * t + 8 * h][g] = bf16_lo(f.b[h]);
      B[2 * t + 8 * h + 1][g] = bf16_hi(f.b[h]);
      C[g + 8 * h][2 * t] = f.c[2 * h];
      C[g + 8 * h][2 * t + 1] = f.c[2 * h + 1];
    }
  }
  for (unsigned m = 0; m < 16; ++m)
    for (unsigned n = 0; n < 8; ++n) {
      // Each product of two bf16 values is exact in fp32 (8 + 8 significant
      // bits); the sum is rounded after every addition, in ascending k, and
      // c comes last. (This file is built with -ffp-contract=off: no FMA.)
      float s = 0.0f;
      for (unsigned k = 0; k < 16; ++k) s += A[m][k] * B[k][n];
      d[m][n] = s + C[m][n];
    }
}

// Lands the first n pending cp.async copies of f.
void land_copies(Fiber& f, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Fiber::AsyncCopy& c = f.copies[i];
    if (c.src_bytes) std::memcpy(c.dst, c.src, 16);
    else std::memset(c.dst, 0, 16);
  }
  f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(n));
  for (size_t& e : f.group_ends) e -= n;
}

// Whether [p, p + bytes) lies inside one of the block's shared arrays or its dynamic shared memory.
bool in_shared(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (const auto& s : g_block.shared) {
    const char* a = static_cast<const char*>(s.first);
    if (c >= a && c + bytes <= a + s.second) return true;
  }
  return g_dynamic && c >= g_dynamic && c + bytes <= g_dynamic + g_config->shared_bytes;
}

}  // namespace

void run_grid(const char* kernel, const Config& c, const void* func, void (*body)(void*), void* ctx) {
  if (t_in_launch) fail("%s launched from a kernel: dynamic parallelism is not emulated", kernel);
  if (trace())
    std::fprintf(stderr, "[emu] %s at %s:%u grid (%u,%u,%u) block (%u,%u,%u) dynamic shared %zu\n", kernel,
                 c.where.file_name(), static_cast<unsigned>(c.where.line()), c.grid.x, c.grid.y, c.grid.z, c.block.x,
                 c.block.y, c.block.z, c.shared_bytes);
  if (!valid_config(c)) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  // Above 48 KiB only after cudaFuncSetAttribute raised the kernel's maximum
  // (which is at most 227 KiB): the GPU refuses the launch with an invalid value.
  if (c.shared_bytes > max_dynamic_shared_bytes(func)) {
    if (!func) {
      g_kernel = kernel;
      g_config = &c;
      fail("%zu bytes of dynamic shared memory, and the launch leaves the kernel's template arguments to deduction, "
           "so its cudaFuncSetAttribute maximum is unknown here: name every template argument at the launch",
           c.shared_bytes);
    }
    if (trace())
      std::fprintf(stderr, "[emu] %s: %zu bytes of dynamic shared memory, above its maximum of %zu\n", kernel,
                   c.shared_bytes, max_dynamic_shared_bytes(func));
    set_last_error(cudaErrorInvalidValue);
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
  ensure_dynamic_shared(c.shared_bytes);
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
  g_dynamic = nullptr;
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
  if (g_block.shared_bytes + g_config->shared_bytes > kMaxSharedBytesPerBlock)
    fail("its __shared__ arrays take %zu bytes and it was launched with %zu bytes of dynamic shared memory: "
         "%zu in all, above the %zu bytes of shared memory a block may have",
         g_block.shared_bytes, g_config->shared_bytes, g_block.shared_bytes + g_config->shared_bytes,
         kMaxSharedBytesPerBlock);
  std::memset(array, 0xFF, bytes);
}

void* dynamic_shared() {
  if (!g_current) fail("dynamic shared memory used outside a kernel");
  return g_dynamic;
}

void syncthreads(const std::source_location& site) {
  Barrier& b = g_block.barrier;
  if (b.arrived == 0) {
    b.site = site;
  } else if (b.site.line() != site.line() || std::strcmp(b.site.file_name(), site.file_name()) != 0) {
    fail("__syncthreads at %s:%u while other threads of the block wait at %s:%u (divergent barrier)", site.file_name(),
         static_cast<unsigned>(site.line()), b.site.file_name(), static_cast<unsigned>(b.site.line()));
  }
  if (b.arrived + 1 == b.expected) {
    // The last arrival opens the barrier and, unlike at a warp barrier, does
    // not run on: the scheduler starts again from the first warp in its
    // order (run_block), so that warp, not this one, runs ahead first.
    b.arrived = 0;
    ++b.generation;
    g_block.barrier_opened = true;
    g_current->waiting = nullptr;
    yield();
    return;
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
  const unsigned parity = f.collectives++ & 1;
  w.kind[parity][lane] = Collective::kShuffle;
  w.value[parity][lane] = bits;
  wait(w.barrier);
  if (src >= 32) return bits;  // beyond the warp: CUDA returns the caller's own value
  if (src >= w.lanes) fail("shuffle reads lane %u of a warp of %u lanes", src, w.lanes);
  return w.value[parity][src];
}


void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  if (!g_current) fail("mma_m16n8k16_bf16 called outside a kernel");
  Fiber& f = *g_current;
  const unsigned lane = f.linear % 32, warp = f.linear / 32;
  Warp& w = g_block.warps[warp];
  if (w.lanes != 32)
    fail("mma.m16n8k16 in warp %u, which has %u lanes: it needs a whole 32-lane warp", warp, w.lanes);
  const unsigned parity = f.collectives++ & 1;
  w.kind[parity][lane] = Collective::kMma;
  MmaFragments& mine = w.mma[parity][lane];
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i], mine.c[i] = c[i];
  mine.b[0] = b[0], mine.b[1] = b[1];
  // The last lane to arrive opens the barrier and runs on before any other
  // lane resumes (fibers are cooperative): it computes the warp's D once.
  const bool opens = w.barrier.arrived + 1 == w.barrier.expected;
  wait(w.barrier);
  for (unsigned l = 0; l < 32; ++l)
    if (w.kind[parity][l] != Collective::kMma)
      fail("mma.m16n8k16 in warp %u while its lane %u %s (every lane must take part in the same mma)", warp, l,
           w.kind[parity][l] == Collective::kShuffle ? "shuffles" : "runs an ldmatrix");
  if (opens) mma_warp(w.mma[parity], w.mma_d[parity]);
  const unsigned g = lane >> 2, t = lane & 3;
  const float(&D)[16][8] = w.mma_d[parity];
  d[0] = D[g][2 * t];
  d[1] = D[g][2 * t + 1];
  d[2] = D[g + 8][2 * t];
  d[3] = D[g + 8][2 * t + 1];
}

void check_vector_access(const void* p, size_t bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail("%s: a %zu-byte access at %p, which is not %zu-byte aligned (the GPU faults: misaligned address)", what, bytes,
         p, bytes);
}

void ldmatrix(unsigned* r, int count, bool trans, const void* row) {
  if (!g_current) fail("ldmatrix called outside a kernel");
  if (count != 1 && count != 2 && count != 4) fail("ldmatrix.x%d: only .x1, .x2 and .x4 exist", count);
  Fiber& f = *g_current;
  const unsigned lane = f.linear % 32, warp = f.linear / 32;
  Warp& w = g_block.warps[warp];
  if (w.lanes != 32) fail("ldmatrix in warp %u, which has %u lanes: it needs a whole 32-lane warp", warp, w.lanes);
  if (lane < 8u * static_cast<unsigned>(count)) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
      fail("ldmatrix row address %p (lane %u) is not 16-byte aligned", row, lane);
    if (!in_shared(row, 16))
      fail("ldmatrix row address %p (lane %u) is not 16 bytes inside the block's shared memory", row, lane);
  }
  const unsigned parity = f.collectives++ & 1;
  w.kind[parity][lane] = Collective::kLdmatrix;
  w.ld_row[parity][lane] = row;
  const bool opens = w.barrier.arrived + 1 == w.barrier.expected;
  wait(w.barrier);
  for (unsigned l = 0; l < 32; ++l)
    if (w.kind[parity][l] != Collective::kLdmatrix)
      fail("ldmatrix in warp %u while its lane %u takes part in another collective (every lane must take part in "
           "the same ldmatrix)",
           warp, l);
  if (opens) {  // every lane's registers, read before any lane runs on (and writes shared memory)
    for (unsigned m = 0; m < static_cast<unsigned>(count); ++m) {
      uint16_t M[8][8];
      for (unsigned i = 0; i < 8; ++i) std::memcpy(M[i], w.ld_row[parity][8 * m + i], 16);
      for (unsigned l = 0; l < 32; ++l) {
        const unsigned i = l / 4, j = l % 4;
        const uint16_t lo = trans ? M[2 * j][i] : M[i][2 * j], hi = trans ? M[2 * j + 1][i] : M[i][2 * j + 1];
        w.ld_out[parity][l][m] = lo | static_cast<unsigned>(hi) << 16;
      }
    }
  }
  for (int m = 0; m < count; ++m) r[m] = w.ld_out[parity][lane][m];
}

void cp_async(void* dst, const void* src, unsigned src_bytes) {
  if (!g_current) fail("cp.async called outside a kernel");
  if (src_bytes != 0 && src_bytes != 16) fail("cp.async with src-size %u: only 16 (a copy) or 0 (zeros) are emulated", src_bytes);
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail("cp.async of 16 bytes from %p to %p: both addresses must be 16-byte aligned", src, dst);
  if (!in_shared(dst, 16)) fail("cp.async destination %p is not 16 bytes inside the block's shared memory", dst);
  if (src_bytes && !is_device_memory(src)) fail("cp.async source %p is not device memory", src);
  if (((blockIdx.x + blockIdx.y + blockIdx.z) & 1) != 0) {  // as early as possible (emu.h)
    if (src_bytes) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
    return;
  }
  g_current->copies.push_back({dst, src, src_bytes});
}

void cp_async_commit() {
  if (!g_current) fail("cp.async.commit_group called outside a kernel");
  g_current->group_ends.push_back(g_current->copies.size());
}

void cp_async_wait(int n) {
  if (!g_current) fail("cp.async.wait_group called outside a kernel");
  if (n < 0) fail("cp.async.wait_group %d", n);
  Fiber& f = *g_current;
  const size_t groups = f.group_ends.size(), keep = static_cast<size_t>(n);
  if (groups <= keep) return;
  land_copies(f, f.group_ends[groups - keep - 1]);
  f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + static_cast<std::ptrdiff_t>(groups - keep));
}

}  // namespace emu
