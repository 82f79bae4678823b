#pragma once
// --mock-data: Megatron's MockGPTLowLevelDataset. 100000 synthetic documents
// whose lengths are numpy.random.default_rng(0).integers(1, 4096, int32)
// and whose tokens are 1, 2, ..., length - 1 (mod the tokenizer's vocabulary
// size) followed by the end-of-document token. The GPT dataset indices are
// then built over it exactly as over a real dataset, so a mock run sees
// Megatron's mock samples in Megatron's order.

#include <cstdint>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"

namespace mt::data {

// numpy.random.default_rng(seed): SeedSequence(seed) -> PCG64 (XSL-RR 128/64),
// with numpy's buffered 32-bit draws and Lemire's bounded integers, so the
// draws equal numpy's bit for bit.
class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed);
  uint64_t next64();
  uint32_t next32();
  // Generator.integers(low, high, dtype=np.int32): one draw in [low, high).
  int32_t integers_int32(int32_t low, int32_t high);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has32_ = false;
  uint32_t buffered32_ = 0;
};

class MockDocuments final : public Documents {
 public:
  static constexpr uint64_t kSeed = 0;
  static constexpr int64_t kSize = 100000;
  static constexpr int32_t kMaxSequenceLength = 4096;

  MockDocuments(int64_t vocab_size, int32_t eod);
  const std::string& prefix() const override { return name_; }
  int64_t num_sequences() const override { return kSize; }
  int64_t num_tokens() const override { return total_tokens_; }
  int32_t sequence_length(int64_t i) const override;
  std::vector<int32_t> sequence_lengths() const override { return lengths_; }
  void read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const override;

 private:
  std::string name_ = "mock";
  int64_t vocab_size_;
  int32_t eod_;
  std::vector<int32_t> lengths_;
  int64_t total_tokens_ = 0;
};

}  // namespace mt::data
