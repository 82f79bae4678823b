#include "data/mock_dataset.h"

#include <array>

#include "core/status.h"

namespace mt::data {
namespace {

// numpy's SeedSequence for one non-negative integer entropy below 2^32 and
// no spawn key: a pool of 4 uint32 words mixed from the entropy, then
// generate_state(n32) hashes the pool, cycling, into n32 words.
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t* hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

std::vector<uint32_t> seed_sequence_state(uint64_t seed, size_t n32) {
  // The entropy as little-endian uint32 words (0 is one word, [0]).
  std::vector<uint32_t> entropy;
  do {
    entropy.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed != 0);
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hc = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0, &hc);
  for (size_t s = 0; s < kPoolSize; ++s)
    for (size_t d = 0; d < kPoolSize; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], &hc));
  for (size_t s = kPoolSize; s < entropy.size(); ++s)
    for (size_t d = 0; d < kPoolSize; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], &hc));

  std::vector<uint32_t> out(n32);
  uint32_t hb = kInitB;
  for (size_t i = 0; i < n32; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

using u128 = unsigned __int128;
constexpr u128 kPcgMultiplier = (static_cast<u128>(0x2360ed051fc65da4ULL) << 64) | 0x4385df649fccf645ULL;

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // generate_state(4, uint64) -> words (s_hi, s_lo, inc_hi, inc_lo), each
  // uint64 two little-endian uint32 words.
  const std::vector<uint32_t> w = seed_sequence_state(seed, 8);
  auto u64 = [&](int i) { return static_cast<uint64_t>(w[2 * i]) | static_cast<uint64_t>(w[2 * i + 1]) << 32; };
  const u128 initstate = static_cast<u128>(u64(0)) << 64 | u64(1);
  const u128 initseq = static_cast<u128>(u64(2)) << 64 | u64(3);
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = initseq << 1 | 1;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t NumpyGenerator::next64() {
  state_ = state_ * kPcgMultiplier + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyGenerator::next32() {
  if (has32_) {
    has32_ = false;
    return buffered32_;
  }
  const uint64_t v = next64();
  has32_ = true;
  buffered32_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v);
}

int32_t NumpyGenerator::integers_int32(int32_t low, int32_t high) {
  MT_CHECK(high > low, "integers_int32 needs low < high");
  const uint32_t rng = static_cast<uint32_t>(static_cast<int64_t>(high) - 1 - low);  // inclusive span
  if (rng == 0) return low;
  if (rng == 0xFFFFFFFFu) return static_cast<int32_t>(static_cast<uint32_t>(low) + next32());
  // Lemire's nearly-divisionless method, as numpy's buffered_bounded_lemire_uint32.
  const uint32_t excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(next32()) * excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < excl) {
    const uint32_t threshold = (0xFFFFFFFFu - rng) % excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(next32()) * excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<int32_t>(static_cast<uint32_t>(low) + static_cast<uint32_t>(m >> 32));
}

MockDocuments::MockDocuments(int64_t vocab_size, int32_t eod) : vocab_size_(vocab_size), eod_(eod) {
  MT_CHECK(vocab_size > 0, "mock data needs a positive vocabulary size");
  NumpyGenerator g(kSeed);
  lengths_.resize(kSize);
  for (auto& l : lengths_) {
    l = g.integers_int32(1, kMaxSequenceLength);
    total_tokens_ += l;
  }
}

int32_t MockDocuments::sequence_length(int64_t i) const {
  MT_CHECK(i >= 0 && i < kSize, "mock sequence index out of range");
  return lengths_[static_cast<size_t>(i)];
}

void MockDocuments::read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  const int64_t len = sequence_length(seq);
  MT_CHECK(offset >= 0 && count >= 0 && offset + count <= len, "mock read outside the sequence");
  // Token t of a sequence of length L: (t + 1) mod V for t < L - 1, then EOD.
  for (int64_t k = 0; k < count; ++k) {
    const int64_t t = offset + k;
    out[k] = t == len - 1 ? eod_ : (t + 1) % vocab_size_;
  }
}

}  // namespace mt::data
