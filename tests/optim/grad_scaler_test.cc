// The grad scalers against Megatron's rules (megatron/core/optimizer/
// grad_scaler.py), with the expected scales worked out by hand from them.

#include "optim/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mt::optim {
namespace {

std::vector<double> scales(GradScaler g, const std::vector<bool>& found_inf) {
  std::vector<double> out;
  for (bool f : found_inf) {
    g.update(f);
    out.push_back(g.scale());
  }
  return out;
}

TEST(GradScaler, DynamicBacksOffAfterHysteresisAndGrowsAfterTheWindow) {
  LossScaleConfig c;
  c.loss_scale_window = 3;  // hysteresis 2, initial 2^32, min 1: Megatron's defaults otherwise
  const double k = std::ldexp(1.0, 32);
  // inf, inf (hysteresis used up: halve), inf (halve again), three clean
  // iterations (double, hysteresis restored), inf (absorbed), three clean
  // (double), three clean (double).
  EXPECT_EQ(scales(GradScaler::dynamic(c), {true, true, true, false, false, false, true, false, false, false, false,
                                            false, false}),
            (std::vector<double>{k, k / 2, k / 4, k / 4, k / 4, k / 2, k / 2, k / 2, k / 2, k, k, k, 2 * k}));
  GradScaler g = GradScaler::dynamic(c);
  EXPECT_TRUE(g.is_dynamic());
  EXPECT_EQ(g.scale(), static_cast<float>(k));
  EXPECT_EQ(g.inv_scale(), std::ldexp(1.0f, -32));
}

TEST(GradScaler, DynamicNeverGoesBelowTheMinimum) {
  LossScaleConfig c;
  c.initial_loss_scale = 4, c.min_loss_scale = 1, c.hysteresis = 1;
  EXPECT_EQ(scales(GradScaler::dynamic(c), {true, true, true, true}), (std::vector<double>{2, 1, 1, 1}));
  c.initial_loss_scale = 10, c.min_loss_scale = 3;  // halving 5 gives 2.5: the minimum 3 instead
  EXPECT_EQ(scales(GradScaler::dynamic(c), {true, true, true}), (std::vector<double>{5, 3, 3}));
}

TEST(GradScaler, FractionalWindowNeverGrows) {
  // --loss-scale-window is a float in Megatron, compared for equality with
  // an integer count: 2.5 is never reached, so the scale never grows.
  LossScaleConfig c;
  c.initial_loss_scale = 8, c.loss_scale_window = 2.5;
  EXPECT_EQ(scales(GradScaler::dynamic(c), std::vector<bool>(10, false)), std::vector<double>(10, 8.0));
}

TEST(GradScaler, ConstantIgnoresInfAndItsInverseIsRoundedFromFp64) {
  GradScaler g = GradScaler::constant(3.0);
  EXPECT_FALSE(g.is_dynamic());
  EXPECT_EQ(scales(g, {true, false, true}), (std::vector<double>{3, 3, 3}));
  EXPECT_EQ(g.inv_scale(), static_cast<float>(1.0 / 3.0));
  GradScaler h = GradScaler::constant(3.0);
  h.load_state_json({{"scale", 8.0}, {"growth_tracker", 1}, {"hysteresis_tracker", 1}});
  EXPECT_EQ(h.scale(), 3.0f);  // a constant scale is --loss-scale's, whatever a checkpoint says
}

TEST(GradScaler, StateRoundTripsAsMegatronNamesIt) {
  LossScaleConfig c;
  c.loss_scale_window = 4;
  GradScaler a = GradScaler::dynamic(c);
  for (bool f : {true, true, false, false}) a.update(f);
  const nlohmann::json j = a.state_json();
  EXPECT_EQ(j["scale"].get<double>(), std::ldexp(1.0, 31));
  EXPECT_EQ(j["growth_tracker"].get<int64_t>(), 2);
  EXPECT_EQ(j["hysteresis_tracker"].get<int64_t>(), 0);
  GradScaler b = GradScaler::dynamic(c);
  b.load_state_json(j);
  for (bool f : {false, false, true, false}) a.update(f), b.update(f);
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
  EXPECT_EQ(a.hysteresis_tracker(), b.hysteresis_tracker());
  EXPECT_EQ(b.scale(), static_cast<float>(std::ldexp(1.0, 32)));  // grew after 4 clean, inf absorbed by hysteresis 2
}

TEST(GradScaler, ProblemsNameTheirFlags) {
  LossScaleConfig c;
  EXPECT_TRUE(loss_scale_problems(c).empty());
  c.loss_scale = -2;
  c.min_loss_scale = 8, c.initial_loss_scale = 4;
  c.loss_scale_window = 0;
  c.hysteresis = 0;
  const auto p = loss_scale_problems(c);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_NE(p[0].find("[--loss-scale] -2 is not positive"), std::string::npos) << p[0];
  EXPECT_NE(p[1].find("[--min-loss-scale, --initial-loss-scale]"), std::string::npos) << p[1];
  EXPECT_NE(p[2].find("[--loss-scale-window]"), std::string::npos) << p[2];
  EXPECT_NE(p[3].find("[--hysteresis] 0"), std::string::npos) << p[3];
}

}  // namespace
}  // namespace mt::optim
