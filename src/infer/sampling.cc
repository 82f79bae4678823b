#include "infer/sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/rng.h"

namespace mt::infer {

namespace {
constexpr uint64_t kSampleStream = 0x6d742d73616d70ull;  // "mt-samp"

double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF32 ? static_cast<double>(t.ptr<float>()[i]) : t.ptr<double>()[i];
}

int64_t resolve_limit(const Tensor& logits, int64_t vocab_limit) {
  MT_CHECK(logits.dtype() == DType::kF32 || logits.dtype() == DType::kF64, "Sampler: logits must be fp32 or fp64");
  const int64_t V = logits.numel();
  const int64_t lim = vocab_limit > 0 ? vocab_limit : V;
  MT_CHECK(lim >= 1 && lim <= V, fmt::format("Sampler: vocab_limit {} outside [1, {}]", lim, V));
  return lim;
}
}  // namespace

double philox_uniform53(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  philox_block(seed, stream, index, w);
  const uint64_t bits = (static_cast<uint64_t>(w[0]) << 21) ^ w[1];
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

Status SamplingOptions::validate() const {
  std::vector<std::string> e;
  if (!(temperature >= 0) || !std::isfinite(temperature))
    e.push_back(fmt::format("--temperature {} must be >= 0 (0 means greedy)", temperature));
  if (top_k < 0) e.push_back(fmt::format("--top-k {} must be >= 0 (0 turns it off, 1 is greedy)", top_k));
  if (!(top_p >= 0 && top_p <= 1)) e.push_back(fmt::format("--top-p {} must be in [0, 1] (0 turns it off)", top_p));
  if (top_k > 0 && top_p > 0)
    e.push_back(fmt::format("--top-k {} and --top-p {} are both given: Megatron refuses the pair (\"Cannot have "
                            "top-p and top-k both greater than zero\"); give one of them",
                            top_k, top_p));
  if (e.empty()) return Status::ok();
  std::string m = "invalid sampling options:";
  for (auto& s : e) m += "\n  - " + s;
  return Status::invalid(m);
}

std::vector<double> Sampler::distribution(const Tensor& logits, int64_t vocab_limit) const {
  const int64_t lim = resolve_limit(logits, vocab_limit);
  const int64_t V = logits.numel();
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  if (opt_.greedy()) {
    int64_t best = 0;
    for (int64_t i = 1; i < lim; ++i)
      if (at(logits, i) > at(logits, best)) best = i;
    p[static_cast<size_t>(best)] = 1;
    return p;
  }
  // Softmax of logits / temperature over the allowed ids.
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < lim; ++i) mx = std::max(mx, at(logits, i) / opt_.temperature);
  double sum = 0;
  for (int64_t i = 0; i < lim; ++i) {
    p[static_cast<size_t>(i)] = std::exp(at(logits, i) / opt_.temperature - mx);
    sum += p[static_cast<size_t>(i)];
  }
  for (int64_t i = 0; i < lim; ++i) p[static_cast<size_t>(i)] /= sum;
  const bool use_k = opt_.top_k > 1 && opt_.top_k < lim;
  const bool use_p = opt_.top_p > 0 && opt_.top_p < 1;
  if (use_k || use_p) {
    std::vector<int64_t> order(static_cast<size_t>(lim));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
    size_t keep = order.size();
    if (use_k) keep = static_cast<size_t>(opt_.top_k);
    if (use_p) {
      // Mass of the top-k survivors, renormalised, so that p refers to what is left.
      double kept_mass = 0;
      for (size_t i = 0; i < keep; ++i) kept_mass += p[static_cast<size_t>(order[i])];
      double cum = 0;
      size_t n = 0;
      while (n < keep) {
        cum += p[static_cast<size_t>(order[n])] / kept_mass;
        ++n;
        if (cum >= opt_.top_p) break;
      }
      keep = n;
    }
    std::vector<double> q(static_cast<size_t>(V), 0.0);
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += p[static_cast<size_t>(order[i])];
    for (size_t i = 0; i < keep; ++i) q[static_cast<size_t>(order[i])] = p[static_cast<size_t>(order[i])] / mass;
    p.swap(q);
  }
  return p;
}

int32_t Sampler::sample(const Tensor& logits, int64_t vocab_limit) {
  const std::vector<double> p = distribution(logits, vocab_limit);
  const uint64_t draw = draws_++;
  if (opt_.greedy()) return static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
  const double u = philox_uniform53(opt_.seed, kSampleStream, draw);
  double cum = 0;
  int64_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = static_cast<int64_t>(i);
    cum += p[i];
    if (u < cum) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // u within rounding of 1: the last kept token
}

}  // namespace mt::infer
