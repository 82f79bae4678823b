#include "data/loader.h"

#include <fmt/format.h>

namespace mt::data {

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
                       int64_t consumed, SampleOptions opts)
    : src_(std::move(source)), mbs_(mbs), rank_(dp_rank), dp_(dp_size), consumed_(consumed), opts_(opts) {
  MT_CHECK(mbs_ >= 1 && dp_ >= 1 && rank_ >= 0 && rank_ < dp_, "bad data-parallel layout for the loader");
  text_.resize(static_cast<size_t>(src_->seq_length() + 1));
}

Result<MicroBatch> DataLoader::next() {
  const int64_t step = mbs_ * dp_;
  if (consumed_ + step > src_->size())
    return Status::invalid(fmt::format("{} is exhausted: {} samples consumed of {}, a step needs {} more; "
                                       "ask for fewer --train-iters or give more data",
                                       src_->describe(), consumed_, src_->size(), step));
  MicroBatch mb;
  mb.batch = mbs_;
  mb.seq = src_->seq_length();
  const size_t n = static_cast<size_t>(mb.batch * mb.seq);
  mb.tokens.resize(n), mb.labels.resize(n), mb.loss_mask.resize(n), mb.position_ids.resize(n), mb.segment_ids.resize(n);
  for (int64_t b = 0; b < mbs_; ++b) {
    const int64_t id = consumed_ + rank_ * mbs_ + b;
    src_->sample_tokens(id, text_.data());
    make_sample(text_.data(), b, opts_, &mb);
    mb.sample_ids.push_back(id);
  }
  consumed_ += step;
  return mb;
}

}  // namespace mt::data
