#pragma once
// Decoder: incremental (KV-cache) forward of a GPTModel for text generation.
// Prefill the prompt in one call (or several), then append one token at a
// time; every call appends to per-layer key/value caches and returns logits.
// The logits are those of GPTModel::forward on the same tokens (same
// parameters, same layer math: norms, biases, GELU/SwiGLU, learned or RoPE
// positions, GQA, post-norm residuals), up to the order of floating-point
// operations inside attention (tests: within 1e-5 relative in fp32).
//
// Memory (one Arena each):
//   cache    per layer K and V, [T_max, g, d] each, model dtype
//   scratch  one chunk of at most `max_chunk` new tokens: x, x_mid [c,h],
//            norm out [c,h] + stats [c], qkv [c,(a+2g)d], ctx [c,a d],
//            tmp [c,h], fc1 [c,fc1], act [c,F], token ids [c]
//   tables   RoPE cos/sin [T_max, d/2] when the model uses RoPE
// Inference uses the fp32 (or fp64) parameters even when the model trains
// with bf16 GEMMs, and never touches the model's activation slots, so a
// model created with GPTOptions::slots = 0 (parameters only) suffices.
// One sequence (batch 1). Not thread-safe; the model must outlive it and its
// parameters must not change while a sequence is cached.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/gpt.h"

namespace mt::infer {

struct DecoderOptions {
  // Cache capacity in positions; 0: the model's limit (max_position_embeddings
  // for learned positions, else max(seq_length, max_position_embeddings)).
  int64_t max_tokens = 0;
  // Tokens per internal chunk of a long prefill (bounds scratch); 0: 256.
  int64_t max_chunk = 0;
};

class Decoder {
 public:
  // Errors (kInvalidArgument): capacity beyond what learned positions allow,
  // non-positive sizes.
  static Result<std::unique_ptr<Decoder>> create(const model::GPTModel& model, const DecoderOptions& opt = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Appends `tokens` at positions [length(), length() + n) and writes logits:
  //   logits undefined        none (e.g. a prefill whose last logits are not needed)
  //   [V] or [1, V]           the last new token's
  //   [n, V]                  every new token's (row i: position length() + i)
  // in the model dtype (V = the padded vocabulary, model.vocab()).
  // Errors: kInvalidArgument when the cache would overflow (naming the
  // capacity) or a token id is outside [0, V); the cache is then unchanged.
  Status append(std::span<const int32_t> tokens, const Tensor& logits);
  // Forgets positions >= n (n <= length()); reset() is truncate(0).
  void truncate(int64_t n);
  void reset() { truncate(0); }

  int64_t length() const { return length_; }
  int64_t capacity() const { return T_max_; }
  int64_t vocab() const { return V_; }
  size_t cache_bytes() const { return cache_.capacity(); }
  size_t scratch_bytes() const { return scratch_.capacity(); }
  const model::GPTModel& model() const { return m_; }

 private:
  Decoder(const model::GPTModel& m, int64_t max_tokens, int64_t max_chunk);
  struct Layer;
  void run_chunk(const int32_t* tokens, int64_t n, const Tensor& logits_rows, bool last_only);
  // Rows [r0, r1) of the weight only (r1 < 0: all of them).
  void linear(const Tensor& x, int w, int b, const Tensor& y, int64_t r0 = 0, int64_t r1 = -1) const;
  // --multi-latent-attention: qkv's n rows (packed, not yet roped) from ln.
  void mla_qkv(const Layer& p, const Tensor& ln, int64_t n);
  void norm(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd) const;
  void qk_norm(const Layer& p, const kernels::QkvLayout& L, int64_t n);
  void moe(const Layer& p, const Tensor& ln, int64_t n, const Tensor& out);

  const model::GPTModel& m_;
  int64_t T_max_ = 0, chunk_ = 0, length_ = 0;
  int64_t h_ = 0, V_ = 0, a_ = 0, g_ = 0, d_ = 0, qkv_ = 0, F_ = 0, fc1_ = 0;  // F_, fc1_: the experts' with --num-experts
  int64_t Fd_ = 0, fc1d_ = 0;                                                  // the dense MLP's
  DType dt_ = DType::kF32;
  std::vector<Layer> layers_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [T_max, g, d]
  int word_ = -1, pos_ = -1, final_w_ = -1, final_b_ = -1, out_ = -1;
  Arena cache_, scratch_, tables_;
  std::vector<Tensor> buf_;  // scratch views, [max_chunk, ...] each
  Tensor rope_cos_, rope_sin_;
};

}  // namespace mt::infer
