#pragma once
// bf16 tensor-core building blocks for the CUDA twins (sm_80 and later):
// the warp-wide mma.sync.m16n8k16 (bf16 inputs, fp32 accumulation) and the
// packing of fp32 values into its bf16 operand registers.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16" for .bf16). In a warp, lane =
// 4 g + t (g = lane / 4 in 0..7, t = lane % 4 in 0..3). A register holds two
// bf16 values, the one with the smaller column (A) or row (B) index in its low
// 16 bits.
//   A, 16 x 16 row-major (M x K): a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]
//                                 a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B, 16 x 8 (K x N):            b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   C, D, 16 x 8 fp32:            c0, c1 = C[g][2t, 2t+1] c2, c3 = C[g+8][2t, 2t+1]
// Two consequences the attention kernels build on:
//  - a row-major [n][k] tile in shared memory (k contiguous) gives B = tile^T
//    with one 32-bit load per register (b0 = tile[g][2t, 2t+1]); a B that is
//    the tile itself needs the tile stored transposed;
//  - the accumulators of two adjacent n-blocks (columns 16 kb .. 16 kb + 15)
//    are, packed to bf16, exactly the A fragment of the 16-column k-block kb
//    (a0 = C_2kb[c0, c1], a1 = C_2kb[c2, c3], a2 = C_2kb+1[c0, c1],
//    a3 = C_2kb+1[c2, c3]), so a product P V can take P straight from the
//    registers that computed it.
// The host emulator (tests/cuda_emu) runs the same code with an emulated,
// warp-collective mma (emu::mma_m16n8k16_bf16) and ldmatrix, and cp.async
// copies that land as late as PTX allows.

#include <cstdint>

#include "kernels/cuda/pointwise_common.cuh"

namespace mt::kernels::cuda::tc {

// d += A B for one warp (every lane calls it with its fragments).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(MT_CUDA_EMULATOR)
  ::emu::mma_m16n8k16_bf16(d, a, b, d);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  // No bf16 mma before sm_80. The build targets sm_80 and sm_90a (CMake's
  // default); a build for an older GPU compiles this, and the tensor-core
  // kernels then stop with a trap instead of computing garbage.
  __trap();
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8 x 8 bf16
// matrices from shared memory; lane 8 m + i passes the 16-byte aligned
// address of row i of matrix m, and r[m] of lane 4 i + j receives row i,
// columns 2j, 2j + 1 of matrix m (trans: column i, rows 2j, 2j + 1) -- that
// is, r[m] is the fragment register a0 / b0 of mma.cuh's layouts for the
// 8 x 8 block, read straight (a row-major [m][k] A or [n][k] B tile) or
// transposed (a row-major [k][n] B tile; kTrans, the .trans form).
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* row) {
#if defined(MT_CUDA_EMULATOR)
  ::emu::ldmatrix(r, 4, kTrans, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// cp.async.cg.shared.global: 16 bytes from global `src` to shared `dst`
// (both 16-byte aligned), or 16 zero bytes when !valid (src is then not
// read, but must still be a valid address). The copy lands at the
// cp_async_wait that covers its group (cp_async_commit closes a group).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(MT_CUDA_EMULATOR)
  ::emu::cp_async(dst, src, valid ? 16u : 0u);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(MT_CUDA_EMULATOR)
  ::emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
// (Before sm_80 the four helpers above compile to nothing: the tensor-core
// kernels, their only users, trap there at their first mma.)
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(MT_CUDA_EMULATOR)
  ::emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// 2^x on the special function unit (ex2.approx.ftz: relative error about
// 2^-22, 2^-inf = 0, subnormal results flushed to 0): one instruction where
// expf takes about ten. The tensor-core softmax works in base 2 with it.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(MT_CUDA_EMULATOR)
  return exp2f(x);
#elif defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return x;  // host pass of nvcc: never called
#endif
}
constexpr float kLog2e = 1.4426950408889634f;

// Two fp32 values as one register of bf16 operands (round to nearest even,
// as mt::float_to_bf16), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(pointwise::bf16_bits_from_float(lo)) |
         static_cast<uint32_t>(pointwise::bf16_bits_from_float(hi)) << 16;
}

// The 32-bit word at p (two consecutive bf16 in shared memory; p 4-byte aligned).
__device__ __forceinline__ uint32_t ld_pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two consecutive bf16 at p (any alignment of 2 bytes) as one register.
__device__ __forceinline__ uint32_t ld_two(const uint16_t* p0, const uint16_t* p1) {
  return static_cast<uint32_t>(*p0) | static_cast<uint32_t>(*p1) << 16;
}

// Four consecutive elements as fp32, from 16-byte (fp32) or 8-byte (bf16)
// aligned memory in one vector load.
struct alignas(16) F4 {
  float x, y, z, w;
};
struct alignas(8) U2 {
  uint32_t x, y;
};
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const F4 f = *reinterpret_cast<const F4*>(p);
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&v)[4]) {
  const U2 u = *reinterpret_cast<const U2*>(p);
  v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
  v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
}

// Two consecutive elements (p 8-byte aligned for fp32, 4-byte for bf16) as
// one register of bf16 operands: fp32 rounded to nearest even, bf16 bits as
// they are (an A fragment straight from global memory).
__device__ __forceinline__ uint32_t load2_bf16x2(const float* p) { return pack_bf16x2(p[0], p[1]); }
__device__ __forceinline__ uint32_t load2_bf16x2(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two fp32 results stored to consecutive elements (p 8-byte aligned for fp32,
// 4-byte for bf16): as they are, or rounded to nearest even into one word.
__device__ __forceinline__ void store2(float* p, float lo, float hi) { p[0] = lo, p[1] = hi; }
__device__ __forceinline__ void store2(bf16* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(lo, hi);
}

}  // namespace mt::kernels::cuda::tc
