#pragma once
// The CUDA emulator: runs the real kernel code of src/kernels/cuda/*.cu on the
// host, so that the CUDA twin tests (tests/kernels/cuda_*_test.cc) check the
// kernels' logic against the CPU twins on every build, without a GPU or nvcc.
//
// How a .cu becomes host C++: translate.py rewrites each launch
// `k<<<grid, block, shared, stream>>>(args)` into an emu::launch call (with
// the kernel's address, which cudaFuncSetAttribute knows it by), each
// `__shared__` declaration into a static array that emu::shared_block
// poisons per block, each `extern __shared__ T name[];` into a pointer to the
// block's dynamic shared memory (emu::dynamic_shared), and
// `__launch_bounds__(n)` into a check at the kernel's entry; it prepends
// `#include "emu.h"` and keeps every line where it was (compiler errors and
// __LINE__ point at the .cu). The result is compiled by g++ against this
// header, fake/cuda_runtime.h (the runtime API, see there) and
// fake/cublasLt.h (a validating cuBLASLt fake, see cublaslt.cc).
//
// What is emulated, as CUDA defines it:
//  - the grid: blocks run one after another; every CUDA thread of a block is
//    a fiber with its own stack (emu.cc) on the launching host thread, so
//    threadIdx, blockIdx, blockDim and gridDim have their CUDA values and
//    block-local state (registers, local arrays) is per thread;
//  - __syncthreads: a real block barrier; every thread of the block must
//    reach it at the same call site, and a barrier that can never complete
//    (a thread exited or waits elsewhere) aborts as a deadlock;
//  - __shared__ memory: one copy per block, filled with 0xFF bytes (NaN in
//    every float type) when the block starts, at most 48 KiB per block;
//  - dynamic shared memory (extern __shared__, the third <<<>>> argument):
//    one 128-byte aligned buffer per block, filled with 0xFF bytes when the
//    block starts, with sm_90's limits: up to 48 KiB unless the host raised
//    the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (at most
//    227 KiB); a launch above the kernel's maximum sets cudaErrorInvalidValue
//    and runs nothing; static plus dynamic bytes of a block at most 227 KiB;
//    the buffer ends at a guard page, so running past its end (rounded up to
//    128 bytes) faults;
//  - warp shuffles (__shfl_down_sync, __shfl_xor_sync): lanes exchange
//    through the warp's registers at a warp barrier; the mask must name
//    exactly the warp's lanes, and every lane must take part;
//  - the bf16 tensor-core mma (mma.sync.aligned.m16n8k16.row.col.f32.bf16.
//    bf16.f32, as emu::mma_m16n8k16_bf16): a warp barrier like the shuffles,
//    with PTX's fragment layouts, in a whole 32-lane warp only; kernel
//    headers pick it over their inline asm under MT_CUDA_EMULATOR;
//  - the math the kernels call: expf/exp, logf/log, erff/erf, tanhf/tanh,
//    fmaxf/fmax, sqrt, min/max, the CUDA overloads of exp/log/... for float,
//    and the intrinsics __fadd_rn ... __dsqrt_rn (correctly rounded, never
//    fused into an FMA), __float_as_uint, __uint_as_float;
//  - launches: the configuration is checked as a GPU checks it (block at most
//    1024 threads, 1024 x 1024 x 64; grid x below 2^31, y and z at most
//    65535; __launch_bounds__), an invalid one sets cudaErrorInvalidConfiguration
//    and runs nothing; every pointer argument must be null or device memory;
//    kernels run to completion before the launch returns (synchronous streams);
//  - the scheduling order: within a block, each thread runs until it
//    finishes or waits (at a barrier or shuffle), the threads taken in
//    ascending order where blockIdx.x + y + z is even and descending order
//    where it is odd, so a missing __syncthreads between one thread's write
//    and another's read shows up (stale or poisoned data) in one of the two;
//    and warp by warp, each warp's threads resumed until all of them wait at
//    __syncthreads, so one warp runs ahead of the others up to the next
//    block barrier (a write that should wait for another warp's reads, a
//    missing barrier before a buffer is refilled, overtakes those reads);
//  - the runtime (fake/cuda_runtime.h): one device; cudaMalloc is poisoned,
//    registered host memory; copies check their cudaMemcpyKind against it;
//    streams are synchronous.
//  - ldmatrix (emu::ldmatrix: .m8n8.x1/.x2/.x4, with or without .trans, of
//    b16 from shared memory): a warp barrier like the mma; every row address
//    must lie in the block's shared memory, 16-byte aligned;
//  - cp.async (emu::cp_async, cp_async_commit, cp_async_wait: .cg, 16 bytes,
//    global to shared, with zero fill), at the two extremes PTX allows, by
//    the block's parity like the scheduling order below: where blockIdx.x +
//    y + z is even a copy lands only when its thread waits for its group
//    with cp.async.wait_group (or exits), so a read of the destination before
//    that wait, or after a wait that leaves the copy's group pending, sees
//    the bytes that were there before (poison, or the previous tile), as the
//    slowest GPU would; where it is odd a copy lands as it is issued, so a
//    refill of a buffer that other threads have not finished reading (a
//    missing __syncthreads before it) overwrites what they read.
//  - vector memory accesses (pointwise::ld_pack / st_pack): the address
//    must be aligned to the access's size, or to 16 bytes for a larger
//    access (two or more 16-byte instructions), as on the GPU;
// Not emulated: atomics, warp votes, __syncwarp, other mma shapes and types,
// other inline PTX, cooperative groups, textures, device-side printf (no
// kernel uses them; a kernel that does fails to compile or to launch here
// until this grows).
//
// What it cannot catch:
//  - races between blocks (blocks never overlap), races inside a block that
//    neither scheduling order exposes (a thread is never interrupted between
//    two waits), the GPU's memory model and memory fences; host code reading
//    device memory directly (it is host memory here: tests under
//    MT_SIMULATE_CUDA catch that instead);
//  - warp-divergence hazards beyond the checks above (lanes of a warp run one
//    after another, never in lockstep), out-of-bounds accesses that stay
//    inside an allocation;
//  - resource limits other than the ones listed: registers, occupancy, the
//    shared memory of __shared__ declarations a block never reaches;
//  - speed, and device math: CUDA's expf/erff/tanhf differ from glibc's by
//    up to 2 ulp, and nvcc fuses a * b + c into an FMA where this build does
//    not (-ffp-contract=off), so tolerances are only checked against the
//    host's rounding; the tensor cores' order of summation (unspecified by
//    PTX) is one fixed order here (see mma_m16n8k16_bf16);
//  - cuBLASLt's real heuristics, algorithms and rounding (see cublaslt.cc).

// Kernel headers test this to call the emulated warp-collective operations
// (emu::mma_m16n8k16_bf16) where the GPU build has inline PTX.
#define MT_CUDA_EMULATOR 1

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <tuple>
#include <type_traits>

// Function qualifiers: plain host functions.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))

// The current thread's coordinates (set by the scheduler before it resumes a thread).
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace emu {

// A launch's configuration, checked by launch(): <<<grid, block, shared_bytes, stream>>>.
struct Config {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  std::source_location where;
};
inline Config config(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr,
                     std::source_location where = std::source_location::current()) {
  return {grid, block, shared_bytes, stream, where};
}

// Runs body(ctx) once per CUDA thread of every block of c, or records
// cudaErrorInvalidConfiguration (cudaErrorInvalidValue: more dynamic shared
// memory than the kernel's maximum) and returns. `kernel` names it in
// messages; `func` is its address, for its cudaFuncSetAttribute settings.
void run_grid(const char* kernel, const Config& c, const void* func, void (*body)(void*), void* ctx);
// Aborts unless p is null or inside device memory (kernel argument `index`).
void check_pointer_argument(const char* kernel, const Config& c, int index, const void* p);

template <typename A>
void check_argument(const char* kernel, const Config& c, int index, const A& a) {
  if constexpr (std::is_pointer_v<A>) check_pointer_argument(kernel, c, index, a);
}

// The address of the kernel that translate.py's launch names (what
// cudaFuncSetAttribute knows it by), or null where the launch leaves template
// arguments to be deduced from the call's arguments (`k<float><<<...>>>(x,
// tokens)` for k<T, Tok>): `&k<float>` names no single function then. A
// requires-expression in a generic lambda turns that into `false` rather than
// an error (g++; the emulator is g++-only). A null address gets the default
// 48 KiB maximum of dynamic shared memory (run_grid).
#define EMU_KERNEL_ADDRESS(...)                                          \
  ([](auto) -> const void* {                                             \
    if constexpr (requires { &__VA_ARGS__; })                            \
      return reinterpret_cast<const void*>(&__VA_ARGS__);                \
    else                                                                 \
      return nullptr;                                                    \
  }(0))

// kernel<<<c>>>(args...): the arguments are evaluated once, before the
// launch, and each thread calls `call` with its own copies of them (a
// kernel's parameters are by value). `func` is EMU_KERNEL_ADDRESS(kernel).
template <typename Call, typename... Args>
void launch(const char* kernel, const Config& c, const void* func, Call call, Args... args) {
  [[maybe_unused]] int index = 0;
  (check_argument(kernel, c, index++, args), ...);
  struct Ctx {
    Call* call;
    std::tuple<Args...>* args;
  };
  std::tuple<Args...> stored(args...);
  Ctx ctx{&call, &stored};
  run_grid(
      kernel, c, func,
      [](void* p) {
        Ctx* x = static_cast<Ctx*>(p);
        std::apply(*x->call, *x->args);
      },
      &ctx);
}

// At a __global__ function's entry (translate.py, from __launch_bounds__):
// aborts if the block has more threads than the kernel was compiled for.
void launch_bounds(int max_threads, int min_blocks_per_sm = 0);

// At each __shared__ declaration (translate.py): the first thread of a block
// to reach it fills the array with 0xFF bytes; the block's distinct
// __shared__ arrays must fit the 48 KiB of static shared memory.
void shared_block(void* array, size_t bytes);

// The block's dynamic shared memory (extern __shared__, translate.py): the
// launch's Config.shared_bytes, 128-byte aligned, filled with 0xFF bytes when
// the block starts; every extern __shared__ array of a kernel starts there.
void* dynamic_shared();

// Block barrier; `site` is the __syncthreads call.
void syncthreads(const std::source_location& site);

// `bits` as lane src of the calling warp passes it, src = lane + arg (kDown)
// or lane ^ arg (kXor); a src past the warp's 32 lanes gives the caller's own
// value, as in CUDA. Every lane of `mask`, which must be the whole warp,
// calls it together.
enum class Shuffle { kDown, kXor };
uint64_t shuffle(unsigned mask, uint64_t bits, Shuffle kind, int arg);

template <typename T>
T shuffle_as(unsigned mask, T v, Shuffle kind, int arg) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "shuffle of a register value");
  uint64_t bits = 0;
  __builtin_memcpy(&bits, &v, sizeof(T));
  bits = shuffle(mask, bits, kind, arg);
  T r;
  __builtin_memcpy(&r, &bits, sizeof(T));
  return r;
}

// PTX mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0..d3},
// {a0..a3}, {b0, b1}, {c0..c3}: D = A B + C for the 16 x 16 bf16 A (M x K),
// the 16 x 8 bf16 B (K x N) and the 16 x 8 fp32 C and D, each spread over the
// warp's registers as PTX lays them out. With lane = 4 g + t (g in 0..7,
// t in 0..3), a register holds two bf16 values, the smaller index in its low
// 16 bits:
//   a0 = A[g][2t, 2t+1]  a1 = A[g+8][2t, 2t+1]  a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   b0 = B[2t, 2t+1][g]  b1 = B[2t+8, 2t+9][g]
//   c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]  (d likewise)
// All 32 lanes of a whole warp call it together (a warp barrier, like the
// shuffles). Each element of D is computed in fp32: the 16 products (exact:
// a bf16 product fits a float's significand) summed in ascending k from 0,
// then c added. The hardware's order is unspecified; tests allow for that.
// d may alias c.
void mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]);

// A vector load or store at p that the GPU issues as `bytes`-wide
// instructions (kernels' Pack accesses: their size, at most 16): the GPU
// faults with a misaligned address unless p is aligned to `bytes`; here the
// kernel stops with the address and the access named.
void check_vector_access(const void* p, size_t bytes, const char* what);

// PTX ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16 {r[0..count)},
// [row]: `count` (1, 2 or 4) 8 x 8 matrices of 16-bit elements; row i of
// matrix m is the 16 bytes at the shared address `row` of lane 8 m + i (the
// other lanes' addresses are ignored, as in PTX). Lane 4 i + j receives in
// r[m] the elements (i, 2j) and (i, 2j + 1) of matrix m, or with trans
// (2j, i) and (2j + 1, i): the matrix transposed; the first element in the
// low 16 bits. All 32 lanes of a whole warp call it together.
void ldmatrix(unsigned* r, int count, bool trans, const void* row);

// PTX cp.async.cg.shared.global [dst], [src], 16, src_bytes (src_bytes 16
// or 0: 16 bytes copied, or 16 zeros written); cp.async.commit_group;
// cp.async.wait_group n (the calling thread's copies of all but its newest n
// committed groups land now, in even blocks; in odd blocks every copy landed
// as it was issued: emu.h, above).
void cp_async(void* dst, const void* src, unsigned src_bytes);
void cp_async_commit();
void cp_async_wait(int n);

// Between emu.cc and cuda_runtime.cc.
bool is_valid_stream(cudaStream_t stream);
void set_last_error(cudaError_t error);
// The dynamic shared memory a launch of the kernel at `func` may ask for
// (cudaFuncAttributeMaxDynamicSharedMemorySize; 48 KiB until set).
size_t max_dynamic_shared_bytes(const void* func);

}  // namespace emu

inline void __syncthreads(const std::source_location site = std::source_location::current()) { emu::syncthreads(site); }

template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
  return emu::shuffle_as(mask, v, emu::Shuffle::kDown, static_cast<int>(delta));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return emu::shuffle_as(mask, v, emu::Shuffle::kXor, lane_mask);
}

// Correctly rounded arithmetic (IEEE, round to nearest even). The translated
// sources are compiled with -ffp-contract=off, so none of these is fused
// with a neighbouring operation, as nvcc promises for the _rn intrinsics.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }

// CUDA's math library overloads these names for float in the global
// namespace (expf etc. come from <cmath>).
using std::erf;
using std::exp;
using std::fmax;
using std::log;
using std::sqrt;
using std::tanh;

// CUDA's integer min and max (its float ones are fminf/fmaxf; no kernel uses them).
template <typename T>
T min(T a, T b) {
  static_assert(std::is_integral_v<T>, "emu.h has CUDA's integer min only");
  return b < a ? b : a;
}
template <typename T>
T max(T a, T b) {
  static_assert(std::is_integral_v<T>, "emu.h has CUDA's integer max only");
  return a < b ? b : a;
}
