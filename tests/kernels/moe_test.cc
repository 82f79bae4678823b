// MoE routing and permutation kernels (kernels/moe.h) on the CPU: the top-k
// choice and probabilities against a sort-based reference, the router's
// gradient against central differences (both softmax orders, a scaling
// factor, the load-balancing and z-loss terms), and the dispatch map,
// permutation and combination against their definitions.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/moe.h"
#include "test_util.h"

namespace mt {
namespace {

using test::Buf;
using test::fill_normal;
namespace k = kernels;

struct Route {
  Buf<int32_t> idx;
  Buf<double> probs, scores, lse;
};

Route route(std::vector<double>& logits, int64_t N, int64_t E, int64_t topk, bool pre, double scale, bool sig = false,
            std::vector<double>* bias = nullptr) {
  Route r{Buf<int32_t>({N, topk}), Buf<double>({N, topk}), Buf<double>({N, E}), Buf<double>({N})};
  k::moe_route(Tensor(logits.data(), {N, E}, DType::kF64), k::MoeRouter{pre, sig, scale},
               bias ? Tensor(bias->data(), {E}, DType::kF64) : Tensor(), r.idx.t(), r.probs.t(), r.scores.t(), r.lse.t());
  return r;
}

TEST(MoeKernels, RouteMatchesSortedSoftmaxReference) {
  for (bool pre : {false, true})
    for (int64_t topk : {1, 2, 4}) {
      const int64_t N = 13, E = 8;
      const double scale = pre ? 1.0 : 2.5;
      std::vector<double> logits(static_cast<size_t>(N * E));
      fill_normal(logits, 11 + static_cast<uint64_t>(topk), 2.0);
      logits[3] = logits[5];  // a tie in row 0: the lower expert comes first
      Route r = route(logits, N, E, topk, pre, scale);
      for (int64_t t = 0; t < N; ++t) {
        const double* l = logits.data() + t * E;
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        double z = 0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(l[e]);
        EXPECT_NEAR(r.lse[static_cast<size_t>(t)], std::log(z), 1e-13);
        double chosen = 0;
        for (int64_t j = 0; j < topk; ++j) chosen += std::exp(l[order[static_cast<size_t>(j)]]);
        for (int64_t j = 0; j < topk; ++j) {
          const int e = order[static_cast<size_t>(j)];
          ASSERT_EQ(r.idx[static_cast<size_t>(t * topk + j)], e) << "row " << t << " choice " << j;
          const double want = scale * std::exp(l[e]) / (pre ? z : chosen);
          EXPECT_NEAR(r.probs[static_cast<size_t>(t * topk + j)], want, 1e-14 * std::max(1.0, scale));
        }
        for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(r.scores[static_cast<size_t>(t * E + e)], std::exp(l[e]) / z, 1e-15);
      }
    }
}

TEST(MoeKernels, RouteBackwardMatchesFiniteDifferences) {
  for (bool pre : {false, true})
    for (bool aux : {false, true}) {
      const int64_t N = 5, E = 6, topk = 2;
      const double scale = 1.7, z = aux ? 0.3 : 0.0;
      std::vector<double> logits(static_cast<size_t>(N * E)), dprobs(static_cast<size_t>(N * topk)),
          auxw(static_cast<size_t>(E));
      fill_normal(logits, 3, 1.5);
      fill_normal(dprobs, 4);
      fill_normal(auxw, 5);
      auto loss = [&]() {
        Route r = route(logits, N, E, topk, pre, scale);
        double s = 0;
        for (int64_t i = 0; i < N * topk; ++i) s += dprobs[static_cast<size_t>(i)] * r.probs[static_cast<size_t>(i)];
        for (int64_t t = 0; t < N; ++t) {
          if (aux)
            for (int64_t e = 0; e < E; ++e) s += auxw[static_cast<size_t>(e)] * r.scores[static_cast<size_t>(t * E + e)];
          s += z * r.lse[static_cast<size_t>(t)] * r.lse[static_cast<size_t>(t)];
        }
        return s;
      };
      Route r = route(logits, N, E, topk, pre, scale);
      Buf<double> dlogits({N, E});
      k::moe_route_backward(Tensor(dprobs.data(), {N, topk}, DType::kF64), r.idx.t(), r.probs.t(), r.scores.t(),
                            r.lse.t(), aux ? Tensor(auxw.data(), {E}, DType::kF64) : Tensor(), z,
                            k::MoeRouter{pre, false, scale}, Tensor(), dlogits.t());
      test::expect_fd_grad(logits, loss, dlogits.v, pre ? "pre-softmax router" : "top-k softmax router", 1e-6, 1e-7);
    }
}

// --moe-router-score-function sigmoid (DeepSeek-V3): the top k by sigmoid +
// expert bias, probabilities the chosen sigmoids normalised over the k (or
// the sigmoid alone for k = 1), scores the sigmoids normalised to sum 1.
// The shared expert's gate (--moe-shared-expert-gate): sigmoid against
// 1 / (1 + e^-x) in long double, and its backward against central
// differences of the forward, in place as the model calls both, fp64 and
// fp32, logits out to +-100 (where fp32's exp(-x) overflows to inf and the
// sigmoid must still be 0).
TEST(MoeKernels, SigmoidAndItsBackward) {
  std::vector<double> x(64), dy(64);
  fill_normal(x, 5, 4.0), fill_normal(dy, 6);
  x[0] = 100, x[1] = -100, x[2] = 0;
  std::vector<double> y = x, dx = dy;
  k::moe_sigmoid(Tensor(y.data(), {64, 1}, DType::kF64), Tensor(y.data(), {64, 1}, DType::kF64));
  k::moe_sigmoid_backward(Tensor(y.data(), {64}, DType::kF64), Tensor(dx.data(), {64}, DType::kF64),
                          Tensor(dx.data(), {64}, DType::kF64));
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = 1.0L / (1.0L + std::exp(-static_cast<long double>(x[i])));
    EXPECT_NEAR(y[i], static_cast<double>(want), 4e-16) << i;
    const double h = 1e-6, f = [](double v) { return 1.0 / (1.0 + std::exp(-v)); }(x[i] + h),
                 b = 1.0 / (1.0 + std::exp(-(x[i] - h)));
    EXPECT_NEAR(dx[i], dy[i] * (f - b) / (2 * h), 1e-8) << i;
  }
  EXPECT_EQ(y[2], 0.5);
  std::vector<float> xf(x.begin(), x.end()), yf(xf.size());
  k::moe_sigmoid(Tensor(xf.data(), {64}, DType::kF32), Tensor(yf.data(), {64}, DType::kF32));
  for (size_t i = 0; i < xf.size(); ++i) EXPECT_NEAR(yf[i], y[i], 5e-7) << i;  // x rounded to fp32 too
  EXPECT_EQ(yf[1], 0.f);
  EXPECT_EQ(yf[0], 1.f);
}

TEST(MoeKernels, SigmoidRouteMatchesItsDefinition) {
  auto sg = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  for (bool with_bias : {false, true})
    for (int64_t topk : {1, 2, 3}) {
      const int64_t N = 9, E = 6;
      const double scale = 2.5;
      std::vector<double> logits(static_cast<size_t>(N * E)), bias(static_cast<size_t>(E));
      fill_normal(logits, 31 + static_cast<uint64_t>(topk), 2.0);
      fill_normal(bias, 32, 0.5);
      Route r = route(logits, N, E, topk, false, scale, true, with_bias ? &bias : nullptr);
      for (int64_t t = 0; t < N; ++t) {
        const double* l = logits.data() + t * E;
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        auto key = [&](int e) { return sg(l[e]) + (with_bias ? bias[static_cast<size_t>(e)] : 0.0); };
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
        double z = 0, all = 0, chosen = 0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(l[e]), all += sg(l[e]);
        EXPECT_NEAR(r.lse[static_cast<size_t>(t)], std::log(z), 1e-13);
        for (int64_t j = 0; j < topk; ++j) chosen += sg(l[order[static_cast<size_t>(j)]]);
        for (int64_t j = 0; j < topk; ++j) {
          const int e = order[static_cast<size_t>(j)];
          ASSERT_EQ(r.idx[static_cast<size_t>(t * topk + j)], e) << "row " << t << " choice " << j;
          const double want = scale * (topk > 1 ? sg(l[e]) / (chosen + 1e-20) : sg(l[e]));
          EXPECT_NEAR(r.probs[static_cast<size_t>(t * topk + j)], want, 1e-14 * scale);
        }
        for (int64_t e = 0; e < E; ++e)
          EXPECT_NEAR(r.scores[static_cast<size_t>(t * E + e)], sg(l[e]) / (all + 1e-20), 1e-15);
      }
    }
}

// Group-limited routing: 8 experts in 4 groups, each token choosing among
// the k / 2 groups whose top 2 selection scores sum highest (logits; the
// softmax with pre_softmax; sigmoid + bias), against a sort-based reference.
TEST(MoeKernels, GroupLimitedRouteMatchesReference) {
  auto sg = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  const int64_t N = 23, E = 8, G = 4, Eg = E / G;
  for (int mode = 0; mode < 3; ++mode)
    for (int64_t topk : {2, 4}) {
      const int64_t gk = topk / 2;  // top-2 from one group (its sum of 2), top-4 from two (sums of 2)
      const bool pre = mode == 1, sig = mode == 2;
      std::vector<double> logits(static_cast<size_t>(N * E)), bias(static_cast<size_t>(E));
      fill_normal(logits, 41 + static_cast<uint64_t>(mode * 10 + topk), 1.5);
      fill_normal(bias, 42, 0.3);
      Route r{Buf<int32_t>({N, topk}), Buf<double>({N, topk}), Buf<double>({N, E}), Buf<double>({N})};
      k::moe_route(Tensor(logits.data(), {N, E}, DType::kF64), k::MoeRouter{pre, sig, 1.0, G, gk},
                   sig ? Tensor(bias.data(), {E}, DType::kF64) : Tensor(), r.idx.t(), r.probs.t(), r.scores.t(),
                   r.lse.t());
      int differs = 0;  // rows where the groups change the choice
      for (int64_t t = 0; t < N; ++t) {
        const double* l = logits.data() + t * E;
        double z = 0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(l[e]);
        auto key = [&](int e) {
          return sig ? sg(l[e]) + bias[static_cast<size_t>(e)] : pre ? std::exp(l[e]) / z : l[e];
        };
        std::vector<double> gscore(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) {
          std::vector<double> v;
          for (int64_t e = g * Eg; e < (g + 1) * Eg; ++e) v.push_back(key(static_cast<int>(e)));
          std::sort(v.rbegin(), v.rend());
          for (int64_t i = 0; i < topk / gk; ++i) gscore[static_cast<size_t>(g)] += v[static_cast<size_t>(i)];
        }
        std::vector<int> gorder(static_cast<size_t>(G));
        std::iota(gorder.begin(), gorder.end(), 0);
        std::stable_sort(gorder.begin(), gorder.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
        std::vector<int> order;
        for (int e = 0; e < E; ++e)
          if (std::find(gorder.begin(), gorder.begin() + gk, e / Eg) != gorder.begin() + gk) order.push_back(e);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) > key(b); });
        std::vector<int> all(static_cast<size_t>(E));
        std::iota(all.begin(), all.end(), 0);
        std::stable_sort(all.begin(), all.end(), [&](int a, int b) { return key(a) > key(b); });
        for (int64_t j = 0; j < topk; ++j) {
          ASSERT_EQ(r.idx[static_cast<size_t>(t * topk + j)], order[static_cast<size_t>(j)])
              << "mode " << mode << " k " << topk << " row " << t << " choice " << j;
          differs += order[static_cast<size_t>(j)] != all[static_cast<size_t>(j)];
        }
      }
      EXPECT_GT(differs, 0) << "mode " << mode << " k " << topk << ": the groups never changed a choice";
    }
}

TEST(MoeKernels, SigmoidRouteBackwardMatchesFiniteDifferences) {
  for (int64_t topk : {1, 2})
    for (bool aux : {false, true}) {
      const int64_t N = 5, E = 6;
      const double scale = 1.7, z = aux ? 0.3 : 0.0;
      std::vector<double> logits(static_cast<size_t>(N * E)), dprobs(static_cast<size_t>(N * topk)),
          auxw(static_cast<size_t>(E)), bias(static_cast<size_t>(E));
      fill_normal(logits, 13, 1.5);
      fill_normal(dprobs, 14);
      fill_normal(auxw, 15);
      fill_normal(bias, 16, 0.3);  // chooses other experts than the sigmoids alone would, in some rows
      auto loss = [&]() {
        Route r = route(logits, N, E, topk, false, scale, true, &bias);
        double s = 0;
        for (int64_t i = 0; i < N * topk; ++i) s += dprobs[static_cast<size_t>(i)] * r.probs[static_cast<size_t>(i)];
        for (int64_t t = 0; t < N; ++t) {
          if (aux)
            for (int64_t e = 0; e < E; ++e) s += auxw[static_cast<size_t>(e)] * r.scores[static_cast<size_t>(t * E + e)];
          s += z * r.lse[static_cast<size_t>(t)] * r.lse[static_cast<size_t>(t)];
        }
        return s;
      };
      Route r = route(logits, N, E, topk, false, scale, true, &bias);
      Buf<double> dlogits({N, E});
      k::moe_route_backward(Tensor(dprobs.data(), {N, topk}, DType::kF64), r.idx.t(), r.probs.t(), r.scores.t(),
                            r.lse.t(), aux ? Tensor(auxw.data(), {E}, DType::kF64) : Tensor(), z,
                            k::MoeRouter{false, true, scale}, Tensor(logits.data(), {N, E}, DType::kF64), dlogits.t());
      test::expect_fd_grad(logits, loss, dlogits.v, "sigmoid router", 1e-6, 1e-7);
    }
}

TEST(MoeKernels, DispatchPermuteAndCombineFollowTheirDefinitions) {
  const int64_t N = 11, E = 5, topk = 2, C = 7;
  std::vector<double> logits(static_cast<size_t>(N * E));
  fill_normal(logits, 21, 3.0);
  Route r = route(logits, N, E, topk, false, 1.0);
  Buf<int32_t> counts({E}), src({N * topk}), pos({N, topk});
  k::moe_dispatch_map(r.idx.t(), counts.t(), src.t(), pos.t());
  // Experts in order, each expert's tokens ascending; pos and src inverse.
  int64_t p = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = 0;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < topk; ++j)
        if (r.idx[static_cast<size_t>(t * topk + j)] == e) {
          EXPECT_EQ(pos[static_cast<size_t>(t * topk + j)], p) << "expert " << e << " token " << t;
          EXPECT_EQ(src[static_cast<size_t>(p)], t);
          ++p, ++n;
        }
    EXPECT_EQ(counts[static_cast<size_t>(e)], n);
  }
  ASSERT_EQ(p, N * topk);

  Buf<double> x({N, C}), xp({N * topk, C});
  fill_normal(x.v, 22);
  k::moe_permute(x.t(), src.t(), xp.t());
  for (int64_t q = 0; q < N * topk; ++q)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(xp[static_cast<size_t>(q * C + c)], x[static_cast<size_t>(src[static_cast<size_t>(q)] * C + c)]);

  // Combination and its gradient: out = sum_j w y[pos]; the gradient of
  // sum(g * out) against finite differences in y and w.
  Buf<double> y({N * topk, C}), g({N, C});
  fill_normal(y.v, 23);
  fill_normal(g.v, 24);
  std::vector<double> w = r.probs.v;
  auto combined = [&](bool with_w) {
    Buf<double> out({N, C});
    k::moe_unpermute(y.t(), pos.t(), with_w ? Tensor(w.data(), {N, topk}, DType::kF64) : Tensor(), out.t());
    return out;
  };
  Buf<double> out = combined(true), plain = combined(false);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double want = 0, want_plain = 0;
      for (int64_t j = 0; j < topk; ++j) {
        const double v = y[static_cast<size_t>(pos[static_cast<size_t>(t * topk + j)] * C + c)];
        want += w[static_cast<size_t>(t * topk + j)] * v, want_plain += v;
      }
      EXPECT_NEAR(out[static_cast<size_t>(t * C + c)], want, 1e-14);
      EXPECT_NEAR(plain[static_cast<size_t>(t * C + c)], want_plain, 1e-14);
    }
  // moe_unpermute without weights is moe_permute's adjoint: <permute(x), y> = <x, unpermute(y)>.
  EXPECT_NEAR(test::dot(xp.v, y.v), test::dot(x.v, plain.v), 1e-12);
  Buf<double> dy({N * topk, C}), dw({N, topk});
  k::moe_unpermute_backward(g.t(), y.t(), pos.t(), Tensor(w.data(), {N, topk}, DType::kF64), dy.t(), dw.t());
  auto loss = [&]() { return test::dot(combined(true).v, g.v); };
  test::expect_fd_grad(y.v, loss, dy.v, "d y", 1e-5, 1e-9);
  test::expect_fd_grad(w, loss, dw.v, "d probs", 1e-5, 1e-9);
}

// Token dropping (--moe-expert-capacity-factor) against its definition,
// Megatron's apply_router_token_dropping written as a sort: in each segment
// of consecutive tokens each expert keeps the `capacity` slots first in a
// stable sort by descending probability (position: by token), the rest -1.
std::vector<int32_t> drop_reference(const std::vector<int32_t>& idx, const std::vector<double>& probs, int64_t N,
                                    int64_t k, int64_t segments, int64_t capacity, bool by_position) {
  std::vector<int32_t> kept = idx;
  const int64_t Ns = N / segments;
  for (int64_t s = 0; s < segments; ++s) {
    int32_t E = 0;
    for (int64_t i = s * Ns * k; i < (s + 1) * Ns * k; ++i) E = std::max(E, idx[static_cast<size_t>(i)] + 1);
    for (int32_t e = 0; e < E; ++e) {
      std::vector<int64_t> slots;
      for (int64_t i = s * Ns * k; i < (s + 1) * Ns * k; ++i)
        if (idx[static_cast<size_t>(i)] == e) slots.push_back(i);
      if (!by_position)
        std::stable_sort(slots.begin(), slots.end(),
                         [&](int64_t a, int64_t b) { return probs[static_cast<size_t>(a)] > probs[static_cast<size_t>(b)]; });
      for (size_t r = static_cast<size_t>(capacity); r < slots.size(); ++r) kept[static_cast<size_t>(slots[r])] = -1;
    }
  }
  return kept;
}

TEST(MoeKernels, TokenDroppingKeepsEachExpertsCapacityPerSegment) {
  const int64_t N = 24, E = 4, topk = 2;
  std::vector<double> logits(static_cast<size_t>(N * E));
  fill_normal(logits, 41, 2.0);
  Route r = route(logits, N, E, topk, false, 1.0);
  // Probabilities rounded to tenths: many ties, broken by the earlier token.
  std::vector<double> tied = r.probs.v;
  for (double& p : tied) p = std::round(p * 10) / 10;
  int dropped_somewhere = 0;
  for (const std::vector<double>* probs : {&r.probs.v, &tied})
    for (int64_t segments : {1, 2, 3})
      for (int64_t capacity : {0, 1, 3, 5, 100})
        for (bool by_position : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "segments " << segments << " capacity " << capacity << " position "
                                            << by_position << " tied " << (probs == &tied));
          Buf<int32_t> kept({N, topk});
          std::vector<double> p = *probs;
          k::moe_drop(r.idx.t(), Tensor(p.data(), {N, topk}, DType::kF64), segments, capacity, by_position, kept.t());
          const std::vector<int32_t> want = drop_reference(r.idx.v, p, N, topk, segments, capacity, by_position);
          ASSERT_EQ(kept.v, want);
          const int64_t n = std::count(want.begin(), want.end(), -1);
          if (capacity == 100) {
            EXPECT_EQ(n, 0);
          }
          if (capacity == 0) {
            EXPECT_EQ(n, N * topk);
          }
          dropped_somewhere += n > 0 && n < N * topk;
        }
  EXPECT_GT(dropped_somewhere, 0);
  // The two policies keep different slots here (else the flag would be untested).
  Buf<int32_t> a({N, topk}), b({N, topk});
  k::moe_drop(r.idx.t(), r.probs.t(), 1, 4, false, a.t());
  k::moe_drop(r.idx.t(), r.probs.t(), 1, 4, true, b.t());
  EXPECT_NE(a.v, b.v);
}

TEST(MoeKernels, DroppedSlotsGetNoRowAndNoGradient) {
  const int64_t N = 13, E = 4, topk = 2, C = 5;
  std::vector<double> logits(static_cast<size_t>(N * E));
  fill_normal(logits, 51, 2.0);
  Route r = route(logits, N, E, topk, false, 1.0);
  Buf<int32_t> kept({N, topk}), counts({E}), src({N * topk}), pos({N, topk});
  k::moe_drop(r.idx.t(), r.probs.t(), 1, 3, false, kept.t());
  for (int32_t& v : src.v) v = 777;  // after the kept slots src stays as it was
  k::moe_dispatch_map(kept.t(), counts.t(), src.t(), pos.t());
  int64_t M = 0, p = 0;
  for (int64_t e = 0; e < E; ++e) {
    M += counts[static_cast<size_t>(e)];
    EXPECT_LE(counts[static_cast<size_t>(e)], 3);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < topk; ++j)
        if (kept[static_cast<size_t>(t * topk + j)] == e) {
          EXPECT_EQ(pos[static_cast<size_t>(t * topk + j)], p);
          EXPECT_EQ(src[static_cast<size_t>(p)], t);
          ++p;
        }
  }
  ASSERT_EQ(p, M);
  ASSERT_LT(M, N * topk);
  for (int64_t i = 0; i < N * topk; ++i) {
    EXPECT_EQ(pos[static_cast<size_t>(i)] < 0, kept[static_cast<size_t>(i)] < 0);
    if (i >= M) {
      EXPECT_EQ(src[static_cast<size_t>(i)], 777);
    }
  }
  // out[t] = sum over the kept j of w y[pos]; the gradient against finite
  // differences (dropped probabilities get 0, as Megatron's probs x mask).
  Buf<double> y({N * topk, C}), g({N, C});
  fill_normal(y.v, 52);
  fill_normal(g.v, 53);
  std::vector<double> w = r.probs.v;
  auto combined = [&]() {
    Buf<double> out({N, C});
    k::moe_unpermute(y.t(), pos.t(), Tensor(w.data(), {N, topk}, DType::kF64), out.t());
    return out;
  };
  Buf<double> out = combined();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t j = 0; j < topk; ++j) {
        const int32_t q = pos[static_cast<size_t>(t * topk + j)];
        if (q >= 0) want += w[static_cast<size_t>(t * topk + j)] * y[static_cast<size_t>(q * C + c)];
      }
      EXPECT_NEAR(out[static_cast<size_t>(t * C + c)], want, 1e-14);
    }
  Buf<double> dy({N * topk, C}), dw({N, topk});
  for (double& v : dy.v) v = 12345;
  k::moe_unpermute_backward(g.t(), y.t(), pos.t(), Tensor(w.data(), {N, topk}, DType::kF64), dy.t(), dw.t());
  for (int64_t q = M; q < N * topk; ++q)  // rows past M: untouched; their gradient is 0
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(dy[static_cast<size_t>(q * C + c)], 12345);
      dy[static_cast<size_t>(q * C + c)] = 0;
    }
  for (int64_t i = 0; i < N * topk; ++i)
    if (pos[static_cast<size_t>(i)] < 0) {
      EXPECT_EQ(dw[static_cast<size_t>(i)], 0.0);
    }
  auto loss = [&]() { return test::dot(combined().v, g.v); };
  test::expect_fd_grad(y.v, loss, dy.v, "d y", 1e-5, 1e-9);
  test::expect_fd_grad(w, loss, dw.v, "d probs", 1e-5, 1e-9);
}

template <typename H>
void moe_half_storage_rounds_once() {
  const int64_t N = 4, topk = 2, C = 5;
  Buf<int32_t> pos({N, topk});
  for (int64_t i = 0; i < N * topk; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>((i * 3) % (N * topk));
  std::vector<float> yf(static_cast<size_t>(N * topk * C)), w(static_cast<size_t>(N * topk)), g(static_cast<size_t>(N * C));
  fill_normal(yf, 31);
  fill_normal(w, 32);
  fill_normal(g, 33);
  std::vector<H> yb(yf.size()), gb(g.size());
  for (size_t i = 0; i < yf.size(); ++i) yb[i] = test::to_half<H>(yf[i]), yf[i] = test::from_half(yb[i]);
  for (size_t i = 0; i < g.size(); ++i) gb[i] = test::to_half<H>(g[i]), g[i] = test::from_half(gb[i]);
  Buf<float> out32({N, C}), dy32({N * topk, C}), dw32({N, topk}), dwb({N, topk});
  std::vector<H> outb(static_cast<size_t>(N * C)), dyb(yf.size());
  const Tensor wt(w.data(), {N, topk}, DType::kF32);
  k::moe_unpermute(Tensor(yf.data(), {N * topk, C}, DType::kF32), pos.t(), wt, out32.t());
  k::moe_unpermute(Tensor(yb.data(), {N * topk, C}, dtype_of<H>()), pos.t(), wt, Tensor(outb.data(), {N, C}, dtype_of<H>()));
  for (size_t i = 0; i < outb.size(); ++i) EXPECT_EQ(outb[i].bits, test::to_half<H>(out32[i]).bits);
  k::moe_unpermute_backward(Tensor(g.data(), {N, C}, DType::kF32), Tensor(yf.data(), {N * topk, C}, DType::kF32),
                            pos.t(), wt, dy32.t(), dw32.t());
  k::moe_unpermute_backward(Tensor(gb.data(), {N, C}, dtype_of<H>()), Tensor(yb.data(), {N * topk, C}, dtype_of<H>()),
                            pos.t(), wt, Tensor(dyb.data(), {N * topk, C}, dtype_of<H>()), dwb.t());
  for (size_t i = 0; i < dyb.size(); ++i) EXPECT_EQ(dyb[i].bits, test::to_half<H>(dy32[i]).bits);
  for (size_t i = 0; i < dwb.size(); ++i) EXPECT_EQ(dwb[i], dw32[i]);
}

TEST(MoeKernels, HalfStorageRoundsOnceAsStored) {
  moe_half_storage_rounds_once<bf16>();
  moe_half_storage_rounds_once<f16>();
}

}  // namespace
}  // namespace mt
