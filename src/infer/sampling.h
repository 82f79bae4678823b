#pragma once
// Next-token sampling from one row of logits: greedy, temperature, top-k,
// top-p (nucleus), seeded and reproducible.
//
// Order of the steps (Hugging Face's generate order; Megatron's sampler
// applies the same ones; validate() refuses top-k together with top-p, as
// Megatron does, so at most one of steps 4 and 5 filters):
//   1. tokens >= vocab_limit (Megatron's vocabulary padding) are never drawn;
//   2. greedy when temperature == 0 or top_k == 1: the arg-max (lowest id on ties);
//   3. logits / temperature, softmax (in double);
//   4. top-k (k > 1): keep the k most probable tokens (ties: lower id first);
//   5. top-p (0 < p < 1): sort by probability (ties: lower id first) and keep the
//      smallest prefix whose mass is >= p (the token that crosses p is kept);
//   6. renormalise and draw by inverse CDF over the kept tokens in id order.
// Random numbers: Philox4x32-10 (core/rng.h), u = 53-bit uniform of
// (seed, stream "mt-sample", index = draw number). Counter-based, so a draw is
// a pure function of (seed, draw number): the same on every platform and
// compiler (std::mt19937 is too, but std::uniform_real_distribution is not
// specified bit for bit), and a run can be repeated or resumed at any draw.

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mt::infer {

struct SamplingOptions {
  double temperature = 1.0;  // --temperature; 0: greedy
  int64_t top_k = 0;         // --top-k; 0: off, 1: greedy
  double top_p = 0.0;        // --top-p; 0 (or 1): off
  uint64_t seed = 1234;      // --seed
  // Every out-of-range value, with its flag name.
  Status validate() const;
  bool greedy() const { return temperature == 0 || top_k == 1; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& opt) : opt_(opt) {}
  // logits: [V] (or [1, V]) fp32 or fp64. vocab_limit in [1, V]: ids at or
  // above it are excluded (0 means V). Advances the draw counter (also when greedy).
  int32_t sample(const Tensor& logits, int64_t vocab_limit = 0);
  // The distribution step 6 draws from (0 for excluded tokens); for greedy,
  // 1 at the arg-max. Does not advance the counter.
  std::vector<double> distribution(const Tensor& logits, int64_t vocab_limit = 0) const;
  uint64_t draws() const { return draws_; }
  void set_draws(uint64_t n) { draws_ = n; }
  const SamplingOptions& options() const { return opt_; }

 private:
  SamplingOptions opt_;
  uint64_t draws_ = 0;
};

// Uniform double in [0, 1) with 53 random bits for (seed, stream, index).
double philox_uniform53(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace mt::infer
