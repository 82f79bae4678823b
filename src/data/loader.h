#pragma once
// Micro-batches for training: tokens, labels, loss mask and position ids for
// one data-parallel rank, the samples Megatron's sampler gives that rank,
// resumable from a consumed-sample count:
//   single (MegatronPretrainingSampler, spec §2.12): in order; every step of
//     micro_batch_size x DP ids, rank r takes [r mbs, (r+1) mbs); the
//     dataset running out is an error.
//   cyclic (MegatronPretrainingRandomSampler with data sharding, its
//     default): epochs over the dataset, each rank on its own bucket of
//     B = (size / (mbs x DP)) x mbs consecutive ids, [r B, (r+1) B), visited
//     in the order torch.randperm(B) gives with a generator seeded with the
//     epoch number; epoch = consumed / A, A = B x DP (the size less the
//     last incomplete step), and the rank's position in its bucket is
//     (consumed mod A) / DP. It never runs out.
//
// Per sample (spec §2.9, _get_ltor_masks_and_position_ids): tokens =
// text[0:s], labels = text[1:s+1]; --eod-mask-loss zeroes the loss where the
// *input* token is EOD; --reset-position-ids restarts positions after each
// EOD; --reset-attention-mask stops attention across an EOD, given here as
// a segment id per token (a token sees earlier tokens of its own segment);
// padded positions (-1) get loss 0 and token/label 0.

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "data/gpt_dataset.h"

namespace mt::data {

struct SampleOptions {
  int32_t eod = -1;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
};

struct MicroBatch {
  int64_t batch = 0, seq = 0;            // B, T
  std::vector<int64_t> tokens;           // [B, T]
  std::vector<int64_t> labels;           // [B, T]
  std::vector<float> loss_mask;          // [B, T]
  std::vector<int64_t> position_ids;     // [B, T]
  std::vector<int32_t> segment_ids;      // [B, T]; all 0 unless --reset-attention-mask
  std::vector<int64_t> sample_ids;       // [B]: global sample ids, for tests and logs
};

enum class Sampler { kSingle, kCyclic };

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU,
// as PyTorch 2 computes it: an mt19937 seeded with the seed's low 32 bits;
// for n below `large` (PyTorch's uint32 max / 20) the swap loop
//   for i < n-1: z = next32() % (n - i); swap(r[i], r[i + z])
// over r = 0..n-1, else the inside-out Fisher-Yates with 64-bit draws
// (next32() << 32 | next32()) % (i + 1), as PyTorch 2.6 and later do
// (pytorch#143682, January 2025); earlier versions use the swap loop for
// every n, so a rank's bucket of 2^32/20 samples or more is drawn as
// Megatron draws it on PyTorch >= 2.6.
inline constexpr int64_t kTorchRandpermLarge = 4294967295LL / 20;
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed, int64_t large = kTorchRandpermLarge);

// Fills row `row` of `mb` from s+1 tokens of text.
void make_sample(const int64_t* text, int64_t row, const SampleOptions& opts, MicroBatch* mb);
// Megatron's boolean "masked" attention mask [T, T] for row `row` (true = cannot attend), for tests.
std::vector<bool> attention_mask(const MicroBatch& mb, int64_t row);

class DataLoader {
 public:
  // The samples from `consumed_samples` on, in the sampler's order (above).
  DataLoader(std::shared_ptr<const SampleSource> source, int64_t micro_batch_size, int64_t dp_rank, int64_t dp_size,
             int64_t consumed_samples, SampleOptions opts, Sampler sampler = Sampler::kSingle);
  // The next micro-batch of this rank; single: fails when the dataset is
  // exhausted; cyclic: fails only when the dataset has fewer samples than
  // one step (micro_batch_size x DP).
  Result<MicroBatch> next();
  int64_t consumed_samples() const { return consumed_; }
  // The global sample ids of this rank's next micro-batch (no data read;
  // the cyclic sampler may draw the epoch's permutation).
  Result<std::vector<int64_t>> next_ids();

 private:
  std::shared_ptr<const SampleSource> src_;
  int64_t mbs_, rank_, dp_, consumed_;
  SampleOptions opts_;
  Sampler sampler_;
  std::vector<int64_t> text_;
  int64_t perm_epoch_ = -1;    // cyclic: the epoch perm_ was drawn for
  std::vector<int64_t> perm_;  // cyclic: torch.randperm(bucket) of that epoch
};

}  // namespace mt::data
