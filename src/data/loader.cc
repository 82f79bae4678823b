#include "data/loader.h"

#include <fmt/format.h>

#include <random>

namespace mt::data {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed, int64_t large) {
  MT_CHECK(n >= 0, "torch_randperm: n must be non-negative");
  std::mt19937 gen(static_cast<uint32_t>(seed & 0xffffffffu));  // at::mt19937(seed): init_genrand(seed)
  std::vector<int64_t> r(static_cast<size_t>(n));
  if (n < large) {
    for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t z = static_cast<int64_t>(static_cast<uint32_t>(gen()) % static_cast<uint64_t>(n - i));
      std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
    }
    return r;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hi = static_cast<uint32_t>(gen()), lo = static_cast<uint32_t>(gen());
    const int64_t z = static_cast<int64_t>(((hi << 32) | lo) % static_cast<uint64_t>(i + 1));
    r[static_cast<size_t>(i)] = r[static_cast<size_t>(z)];
    r[static_cast<size_t>(z)] = i;
  }
  return r;
}

void make_sample(const int64_t* text, int64_t row, const SampleOptions& o, MicroBatch* mb) {
  const int64_t T = mb->seq, base = row * T;
  int64_t pos = 0;
  int32_t seg = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t tok = text[t], lab = text[t + 1];
    float loss = 1.0f;
    if (o.eod_mask_loss && tok == o.eod) loss = 0.0f;
    if (lab == -1) loss = 0.0f;  // padded label
    mb->position_ids[base + t] = o.reset_position_ids ? pos : t;
    mb->segment_ids[base + t] = o.reset_attention_mask ? seg : 0;
    ++pos;
    if (tok == o.eod) {  // positions after an EOD restart; attention stops at it
      pos = 0;
      ++seg;
    }
    mb->tokens[base + t] = tok == -1 ? 0 : tok;
    mb->labels[base + t] = lab == -1 ? 0 : lab;
    mb->loss_mask[base + t] = loss;
  }
}

std::vector<bool> attention_mask(const MicroBatch& mb, int64_t row) {
  const int64_t T = mb.seq;
  std::vector<bool> m(static_cast<size_t>(T * T), true);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j)
      m[i * T + j] = mb.segment_ids[row * T + i] != mb.segment_ids[row * T + j];
  return m;
}

DataLoader::DataLoader(std::shared_ptr<const SampleSource> source, int64_t mbs, int64_t dp_rank, int64_t dp_size,
                       int64_t consumed, SampleOptions opts, Sampler sampler)
    : src_(std::move(source)), mbs_(mbs), rank_(dp_rank), dp_(dp_size), consumed_(consumed), opts_(opts),
      sampler_(sampler) {
  MT_CHECK(mbs_ >= 1 && dp_ >= 1 && rank_ >= 0 && rank_ < dp_, "bad data-parallel layout for the loader");
  text_.resize(static_cast<size_t>(src_->seq_length() + 1));
}

Result<std::vector<int64_t>> DataLoader::next_ids() {
  const int64_t step = mbs_ * dp_, total = src_->size();
  std::vector<int64_t> ids(static_cast<size_t>(mbs_));
  if (sampler_ == Sampler::kSingle) {
    if (consumed_ + step > total)
      return Status::invalid(fmt::format("{} is exhausted: {} samples consumed of {}, a step needs {} more; "
                                         "ask for fewer --train-iters or give more data (or --dataloader-type cyclic)",
                                         src_->describe(), consumed_, total, step));
    for (int64_t b = 0; b < mbs_; ++b) ids[static_cast<size_t>(b)] = consumed_ + rank_ * mbs_ + b;
    return ids;
  }
  // MegatronPretrainingRandomSampler.__iter__ with data_sharding.
  const int64_t bucket = total / step * mbs_, active = bucket * dp_;  // active = total - total % step
  if (bucket == 0)
    return Status::invalid(fmt::format("{} has {} samples, fewer than one step of --micro-batch-size x data-parallel "
                                       "size = {}: the cyclic sampler has nothing to draw from",
                                       src_->describe(), total, step));
  const int64_t epoch = consumed_ / active, in_epoch = consumed_ % active;
  if (in_epoch % step != 0)
    return Status::invalid(fmt::format("--dataloader-type cyclic: {} consumed samples are not a whole number of "
                                       "steps of {} (Megatron asserts the same)",
                                       consumed_, step));
  if (perm_epoch_ != epoch) perm_ = torch_randperm(bucket, static_cast<uint64_t>(epoch)), perm_epoch_ = epoch;
  const int64_t offset = in_epoch / dp_;  // this rank's samples already taken from its bucket
  for (int64_t b = 0; b < mbs_; ++b) ids[static_cast<size_t>(b)] = rank_ * bucket + perm_[static_cast<size_t>(offset + b)];
  return ids;
}

Result<MicroBatch> DataLoader::next() {
  const int64_t step = mbs_ * dp_;
  auto ids = next_ids();
  if (!ids) return ids.status();
  MicroBatch mb;
  mb.batch = mbs_;
  mb.seq = src_->seq_length();
  const size_t n = static_cast<size_t>(mb.batch * mb.seq);
  mb.tokens.resize(n), mb.labels.resize(n), mb.loss_mask.resize(n), mb.position_ids.resize(n), mb.segment_ids.resize(n);
  for (int64_t b = 0; b < mbs_; ++b) {
    const int64_t id = (*ids)[static_cast<size_t>(b)];
    MT_RETURN_IF_ERROR(src_->sample_tokens(id, text_.data()));
    make_sample(text_.data(), b, opts_, &mb);
    mb.sample_ids.push_back(id);
  }
  consumed_ += step;
  return mb;
}

}  // namespace mt::data
