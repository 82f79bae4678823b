#pragma once
// Micro-batches for training: tokens, labels, loss mask and position ids for
// one data-parallel rank, the samples Megatron's MegatronPretrainingSampler
// gives that rank (spec §2.12), resumable from a consumed-sample count.
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

// Fills row `row` of `mb` from s+1 tokens of text.
void make_sample(const int64_t* text, int64_t row, const SampleOptions& opts, MicroBatch* mb);
// Megatron's boolean "masked" attention mask [T, T] for row `row` (true = cannot attend), for tests.
std::vector<bool> attention_mask(const MicroBatch& mb, int64_t row);

class DataLoader {
 public:
  // Samples are read in order from `consumed_samples`; every step of
  // micro_batch_size * dp_size ids, rank r takes ids [r*mbs, (r+1)*mbs).
  DataLoader(std::shared_ptr<const SampleSource> source, int64_t micro_batch_size, int64_t dp_rank, int64_t dp_size,
             int64_t consumed_samples, SampleOptions opts);
  // The next micro-batch of this rank; fails when the dataset is exhausted.
  Result<MicroBatch> next();
  int64_t consumed_samples() const { return consumed_; }

 private:
  std::shared_ptr<const SampleSource> src_;
  int64_t mbs_, rank_, dp_, consumed_;
  SampleOptions opts_;
  std::vector<int64_t> text_;
};

}  // namespace mt::data
