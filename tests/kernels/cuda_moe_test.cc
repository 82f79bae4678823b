// CUDA twins of the MoE kernels (kernels/moe.h) against their CPU twins:
// routing and the dispatch map exactly, the router gradient and the
// combination within rounding, fp32, fp64 and bf16 storage.

#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "kernels/moe.h"
#include "test_util.h"

namespace mt {
namespace {

using test::gpu_arena;
using test::to_device;
using test::to_host;
namespace k = kernels;

template <typename T>
std::vector<T> normal(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  test::fill_normal(v, seed, scale);
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
void moe_case(int64_t N, int64_t E, int64_t topk, int64_t C, bool pre, double tol, bool sig = false, int64_t G = 0,
              int64_t gk = 0, int64_t aux_rows = 1) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " E " << E << " k " << topk << " C " << C << " pre " << pre
                                    << " sigmoid " << sig);
  const k::MoeRouter router{pre, sig, 1.5, G, gk};
  const DType dt = dtype_of<T>();
  Arena g = gpu_arena();
  std::vector<T> logits = normal<T>(static_cast<size_t>(N * E), 1, 2.0), dprobs = normal<T>(static_cast<size_t>(N * topk), 2),
                 aux = normal<T>(static_cast<size_t>(aux_rows * E), 3), x = normal<T>(static_cast<size_t>(N * C), 4),
                 y = normal<T>(static_cast<size_t>(N * topk * C), 5), dout = normal<T>(static_cast<size_t>(N * C), 6);
  const Tensor hl(logits.data(), {N, E}, dt);
  std::vector<T> bias = normal<T>(static_cast<size_t>(E), 7, 0.3);  // the sigmoid router's expert bias
  const Tensor hb = sig ? Tensor(bias.data(), {E}, dt) : Tensor();
  // CPU reference.
  std::vector<int32_t> idx(static_cast<size_t>(N * topk)), counts(static_cast<size_t>(E)), src(idx.size()), pos(idx.size());
  std::vector<T> probs(idx.size()), scores(static_cast<size_t>(N * E)), lse(static_cast<size_t>(N)),
      dlogits(scores.size()), xp(static_cast<size_t>(N * topk * C)), out(static_cast<size_t>(N * C)), dy(y.size()),
      dw(idx.size());
  const Tensor ti(idx.data(), {N, topk}, DType::kI32), tp(probs.data(), {N, topk}, dt), ts(scores.data(), {N, E}, dt),
      tl(lse.data(), {N}, dt), tpos(pos.data(), {N, topk}, DType::kI32);
  k::moe_route(hl, router, hb, ti, tp, ts, tl);
  k::moe_route_backward(Tensor(dprobs.data(), {N, topk}, dt), ti, tp, ts, tl, Tensor(aux.data(), {aux_rows, E}, dt), 0.25, router,
                        sig ? hl : Tensor(), Tensor(dlogits.data(), {N, E}, dt));
  k::moe_dispatch_map(ti, Tensor(counts.data(), {E}, DType::kI32), Tensor(src.data(), {N * topk}, DType::kI32), tpos);
  k::moe_permute(Tensor(x.data(), {N, C}, dt), Tensor(src.data(), {N * topk}, DType::kI32), Tensor(xp.data(), {N * topk, C}, dt));
  k::moe_unpermute(Tensor(y.data(), {N * topk, C}, dt), tpos, tp, Tensor(out.data(), {N, C}, dt));
  k::moe_unpermute_backward(Tensor(dout.data(), {N, C}, dt), Tensor(y.data(), {N * topk, C}, dt), tpos, tp,
                            Tensor(dy.data(), {N * topk, C}, dt), Tensor(dw.data(), {N, topk}, dt));
  // The same on the GPU.
  const Tensor gl = to_device(g, hl), gi = g.alloc({N, topk}, DType::kI32), gp = g.alloc({N, topk}, dt),
               gs = g.alloc({N, E}, dt), glse = g.alloc({N}, dt), gdl = g.alloc({N, E}, dt),
               gc = g.alloc({E}, DType::kI32), gsrc = g.alloc({N * topk}, DType::kI32),
               gpos = g.alloc({N, topk}, DType::kI32), gxp = g.alloc({N * topk, C}, dt), gout = g.alloc({N, C}, dt),
               gdy = g.alloc({N * topk, C}, dt), gdw = g.alloc({N, topk}, dt);
  k::moe_route(gl, router, sig ? to_device(g, hb) : Tensor(), gi, gp, gs, glse);
  EXPECT_EQ(to_host<int32_t>(gi), idx);
  test::expect_close(to_host<T>(gp), probs, tol, tol, "probs");
  test::expect_close(to_host<T>(gs), scores, tol, tol, "scores");
  test::expect_close(to_host<T>(glse), lse, tol, tol, "lse");
  k::moe_route_backward(to_device(g, Tensor(dprobs.data(), {N, topk}, dt)), gi, gp, gs, glse,
                        to_device(g, Tensor(aux.data(), {aux_rows, E}, dt)), 0.25, router, sig ? gl : Tensor(), gdl);
  test::expect_close(to_host<T>(gdl), dlogits, tol, tol, "dlogits");
  // From here on the CPU's routing, so that both sides permute alike.
  const Tensor gti = to_device(g, ti), gtp = to_device(g, tp);
  k::moe_dispatch_map(gti, gc, gsrc, gpos);
  EXPECT_EQ(to_host<int32_t>(gc), counts);
  EXPECT_EQ(to_host<int32_t>(gsrc), src);
  EXPECT_EQ(to_host<int32_t>(gpos), pos);
  k::moe_permute(to_device(g, Tensor(x.data(), {N, C}, dt)), gsrc, gxp);
  EXPECT_EQ(to_host<T>(gxp), xp);
  const Tensor gy = to_device(g, Tensor(y.data(), {N * topk, C}, dt));
  k::moe_unpermute(gy, gpos, gtp, gout);
  test::expect_close(to_host<T>(gout), out, tol, tol, "out");  // the same j order; FMA contraction may differ
  k::moe_unpermute_backward(to_device(g, Tensor(dout.data(), {N, C}, dt)), gy, gpos, gtp, gdy, gdw);
  EXPECT_EQ(to_host<T>(gdy), dy);
  test::expect_close(to_host<T>(gdw), dw, tol, tol * C, "dprobs");
  // bf16 storage of y, out, dout and dy (fp32 compute).
  if constexpr (std::is_same_v<T, float>) {
    std::vector<bf16> yb(y.size()), db(dout.size()), ob(out.size()), dyb(y.size());
    for (size_t i = 0; i < y.size(); ++i) yb[i] = float_to_bf16(y[i]);
    for (size_t i = 0; i < dout.size(); ++i) db[i] = float_to_bf16(dout[i]);
    std::vector<float> dwb(dw.size());
    const Tensor hyb(yb.data(), {N * topk, C}, DType::kBF16), hdb(db.data(), {N, C}, DType::kBF16);
    k::moe_unpermute(hyb, tpos, tp, Tensor(ob.data(), {N, C}, DType::kBF16));
    k::moe_unpermute_backward(hdb, hyb, tpos, tp, Tensor(dyb.data(), {N * topk, C}, DType::kBF16),
                              Tensor(dwb.data(), {N, topk}, DType::kF32));
    const Tensor gyb = to_device(g, hyb), gob = g.alloc({N, C}, DType::kBF16), gdyb = g.alloc({N * topk, C}, DType::kBF16);
    k::moe_unpermute(gyb, gpos, gtp, gob);
    k::moe_unpermute_backward(to_device(g, hdb), gyb, gpos, gtp, gdyb, gdw);
    const std::vector<bf16> go = to_host<bf16>(gob), gdy2 = to_host<bf16>(gdyb);
    std::vector<float> gof(go.size()), obf(ob.size());  // within one bf16 rounding
    for (size_t i = 0; i < ob.size(); ++i) gof[i] = bf16_to_float(go[i]), obf[i] = bf16_to_float(ob[i]);
    test::expect_close(gof, obf, 1.0 / 128, 1e-6, "bf16 out");
    for (size_t i = 0; i < dyb.size(); ++i) ASSERT_EQ(gdy2[i].bits, dyb[i].bits) << "bf16 dy " << i;
    test::expect_close(to_host<float>(gdw), dwb, tol, tol * C, "bf16 dprobs");
  }
}

// Token dropping: the kept choices exactly, then the map, combination and
// its gradient with dropped slots (pos -1), against the CPU twins.
template <typename T>
void drop_case(int64_t N, int64_t E, int64_t topk, int64_t segments, int64_t capacity, bool by_position, bool ties) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " E " << E << " k " << topk << " segments " << segments
                                    << " capacity " << capacity << " position " << by_position << " ties " << ties);
  const int64_t C = 9;
  const DType dt = dtype_of<T>();
  Arena g = gpu_arena();
  std::vector<T> logits = normal<T>(static_cast<size_t>(N * E), 11, 2.0), y = normal<T>(static_cast<size_t>(N * topk * C), 12),
                 dout = normal<T>(static_cast<size_t>(N * C), 13);
  std::vector<int32_t> idx(static_cast<size_t>(N * topk)), kept(idx.size()), counts(static_cast<size_t>(E)),
      src(idx.size(), -7), pos(idx.size());
  std::vector<T> probs(idx.size()), scores(static_cast<size_t>(N * E)), lse(static_cast<size_t>(N)),
      out(static_cast<size_t>(N * C)), dy(y.size(), T(0)), dw(idx.size());
  const Tensor ti(idx.data(), {N, topk}, DType::kI32), tp(probs.data(), {N, topk}, dt),
      tk(kept.data(), {N, topk}, DType::kI32), tpos(pos.data(), {N, topk}, DType::kI32);
  k::moe_route(Tensor(logits.data(), {N, E}, dt), k::MoeRouter{}, Tensor(), ti, tp, Tensor(scores.data(), {N, E}, dt),
               Tensor(lse.data(), {N}, dt));
  if (ties)
    for (T& p : probs) p = static_cast<T>(static_cast<int>(p * 8) / 8.0);
  k::moe_drop(ti, tp, segments, capacity, by_position, tk);
  k::moe_dispatch_map(tk, Tensor(counts.data(), {E}, DType::kI32), Tensor(src.data(), {N * topk}, DType::kI32), tpos);
  k::moe_unpermute(Tensor(y.data(), {N * topk, C}, dt), tpos, tp, Tensor(out.data(), {N, C}, dt));
  k::moe_unpermute_backward(Tensor(dout.data(), {N, C}, dt), Tensor(y.data(), {N * topk, C}, dt), tpos, tp,
                            Tensor(dy.data(), {N * topk, C}, dt), Tensor(dw.data(), {N, topk}, dt));
  const Tensor gi = to_device(g, ti), gp = to_device(g, tp), gk = g.alloc({N, topk}, DType::kI32),
               gc = g.alloc({E}, DType::kI32), gsrc = to_device(g, Tensor(std::vector<int32_t>(idx.size(), -7).data(),
                                                                          {N * topk}, DType::kI32)),
               gpos = g.alloc({N, topk}, DType::kI32), gout = g.alloc({N, C}, dt),
               gdy = to_device(g, Tensor(std::vector<T>(y.size(), T(0)).data(), {N * topk, C}, dt)),
               gdw = g.alloc({N, topk}, dt);
  k::moe_drop(gi, gp, segments, capacity, by_position, gk);
  ASSERT_EQ(to_host<int32_t>(gk), kept);
  k::moe_dispatch_map(gk, gc, gsrc, gpos);
  EXPECT_EQ(to_host<int32_t>(gc), counts);
  EXPECT_EQ(to_host<int32_t>(gsrc), src);
  EXPECT_EQ(to_host<int32_t>(gpos), pos);
  const Tensor gy = to_device(g, Tensor(y.data(), {N * topk, C}, dt));
  k::moe_unpermute(gy, gpos, gp, gout);
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  test::expect_close(to_host<T>(gout), out, tol, tol, "out");
  k::moe_unpermute_backward(to_device(g, Tensor(dout.data(), {N, C}, dt)), gy, gpos, gp, gdy, gdw);
  EXPECT_EQ(to_host<T>(gdy), dy);
  test::expect_close(to_host<T>(gdw), dw, tol, tol * C, "dprobs");
}

TEST(CudaTwin, MoeTokenDroppingMatchesCpu) {
  MT_REQUIRE_GPU();
  drop_case<float>(40, 4, 2, 1, 7, false, false);
  drop_case<float>(40, 4, 2, 2, 3, true, false);
  drop_case<double>(36, 6, 3, 3, 2, false, true);  // ties broken by the earlier token
  drop_case<double>(36, 6, 3, 1, 0, false, false);  // everything dropped
  drop_case<float>(300, 8, 2, 2, 20, false, false);
}

// The shared expert's gate: sigmoid and its backward, fp32 and fp64, in place.
template <typename T>
void sigmoid_case(int64_t n, double tol) {
  SCOPED_TRACE(::testing::Message() << "sigmoid n " << n);
  const DType dt = dtype_of<T>();
  Arena g = gpu_arena();
  std::vector<T> x = normal<T>(static_cast<size_t>(n), 8, 6.0), dy = normal<T>(static_cast<size_t>(n), 9);
  x[0] = T(90), x[1] = T(-90);
  std::vector<T> y = x, dx = dy;
  k::moe_sigmoid(Tensor(y.data(), {n, 1}, dt), Tensor(y.data(), {n, 1}, dt));
  k::moe_sigmoid_backward(Tensor(y.data(), {n}, dt), Tensor(dx.data(), {n}, dt), Tensor(dx.data(), {n}, dt));
  const Tensor gy = to_device(g, Tensor(x.data(), {n, 1}, dt)), gdx = to_device(g, Tensor(dy.data(), {n}, dt));
  k::moe_sigmoid(gy, gy);
  k::moe_sigmoid_backward(gy.view({n}), gdx, gdx);
  test::expect_close(to_host<T>(gy), y, tol, tol, "sigmoid");
  test::expect_close(to_host<T>(gdx), dx, tol, tol, "sigmoid backward");
}

TEST(CudaTwin, MoeSigmoidMatchesCpu) {
  MT_REQUIRE_GPU();
  sigmoid_case<float>(1000, 2e-7);
  sigmoid_case<double>(333, 1e-15);
}

TEST(CudaTwin, MoeRoutingAndPermutationMatchCpu) {
  MT_REQUIRE_GPU();
  moe_case<float>(37, 8, 2, 40, false, 2e-6);
  moe_case<float>(300, 16, 4, 33, true, 2e-6);
  moe_case<double>(129, 6, 1, 70, false, 1e-13);
  moe_case<double>(5, 3, 3, 8, true, 1e-13);
  moe_case<float>(41, 8, 2, 16, false, 2e-6, /*sig=*/true);  // DeepSeek-V3's sigmoid router with its expert bias
  moe_case<double>(19, 6, 1, 8, false, 1e-13, /*sig=*/true);
  moe_case<float>(33, 8, 4, 12, false, 2e-6, /*sig=*/true, /*G=*/4, /*gk=*/2);  // group-limited routing
  moe_case<double>(17, 8, 2, 9, true, 1e-13, /*sig=*/false, /*G=*/4, /*gk=*/2);
  moe_case<float>(36, 8, 2, 12, false, 2e-6, false, 0, 0, /*aux_rows=*/3);  // seq_aux_loss: aux per sequence
}

}  // namespace
}  // namespace mt
