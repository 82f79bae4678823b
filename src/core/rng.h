#pragma once
// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11, the
// generator cuRAND and PyTorch's CUDA backend use). A random value is a pure
// function of (seed, stream, index), so:
//  - dropout masks are regenerated in backward instead of stored, and are the
//    same on CPU and (later) CUDA;
//  - initialisation is parallel-invariant: a tensor-parallel rank draws only
//    the elements of its shard, by their global indices, and gets exactly the
//    values the full tensor would have held (DESIGN.md principle 5);
//  - nothing depends on thread count or call order.
// Streams separate uses (one per parameter for init, one per dropout site and
// step for dropout); see model/gpt.h for the assignment.

#include <cmath>
#include <cstdint>

#include "core/hostdev.h"

namespace mt {

struct Philox {
  // Returns 4 random 32-bit words for 128-bit counter (c0..c3) under key (k0,k1).
  MT_HOST_DEVICE static inline void round10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; ++r) {
      uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
      uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
      uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      uint32_t n0 = hi1 ^ c[1] ^ k0, n1 = lo1, n2 = hi0 ^ c[3] ^ k1, n3 = lo0;
      c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
      k0 += W0; k1 += W1;
    }
  }
};

// Four uniform words for (seed, stream, block); `block` indexes groups of 4.
MT_HOST_DEVICE inline void philox_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4]) {
  uint32_t c[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  Philox::round10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  out[0] = c[0]; out[1] = c[1]; out[2] = c[2]; out[3] = c[3];
}

// Uniform in [0, 1) with 24 random bits, for element `index` of `stream`.
MT_HOST_DEVICE inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  philox_block(seed, stream, index >> 2, w);
  return static_cast<float>(w[index & 3] >> 8) * (1.0f / 16777216.0f);
}

// --moe-input-jitter-eps's factor lo + width u for element `index`, fused
// (one rounding), so that the CPU and CUDA twins agree bit for bit whatever
// their compilers contract.
template <typename T>
MT_HOST_DEVICE inline T philox_jitter(T lo, T width, uint64_t seed, uint64_t stream, uint64_t index) {
  const T u = static_cast<T>(philox_uniform(seed, stream, index));
  if constexpr (sizeof(T) == sizeof(float)) return fmaf(width, u, lo);
  else return fma(width, u, lo);
}

// Standard normal for element `index` of `stream` (Box-Muller on one Philox
// block; each index uses its own block, so any slice can be drawn alone).
MT_HOST_DEVICE inline double philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  philox_block(seed, stream, index, w);
  uint64_t a = (static_cast<uint64_t>(w[0]) << 21) ^ w[1];  // 53 bits
  uint64_t b = (static_cast<uint64_t>(w[2]) << 21) ^ w[3];
  double u1 = (static_cast<double>(a & ((uint64_t{1} << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = static_cast<double>(b & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace mt
