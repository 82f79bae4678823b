#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace mt::optim {

std::vector<std::string> loss_scale_problems(const LossScaleConfig& c) {
  std::vector<std::string> e;
  if (c.loss_scale && !(*c.loss_scale > 0))
    e.push_back(fmt::format("[--loss-scale] {} is not positive (fix: a power of 2 such as 4096, or drop it for "
                            "dynamic scaling under --fp16)", *c.loss_scale));
  if (!(c.min_loss_scale > 0))
    e.push_back(fmt::format("[--min-loss-scale] {} is not positive (Megatron's default is 1)", c.min_loss_scale));
  if (c.min_loss_scale > c.initial_loss_scale)
    e.push_back(fmt::format("[--min-loss-scale, --initial-loss-scale] the minimum {} is above the initial scale {}",
                            c.min_loss_scale, c.initial_loss_scale));
  if (!(c.initial_loss_scale > 0) || !std::isfinite(static_cast<float>(c.initial_loss_scale)))
    e.push_back(fmt::format("[--initial-loss-scale] {} must be positive and finite in fp32 (default 2^32)",
                            c.initial_loss_scale));
  if (!(c.loss_scale_window > 0))
    e.push_back(fmt::format("[--loss-scale-window] {} is not positive (default 1000)", c.loss_scale_window));
  if (c.hysteresis < 1) e.push_back(fmt::format("[--hysteresis] {} must be at least 1 (default 2)", c.hysteresis));
  return e;
}

GradScaler GradScaler::constant(double scale) {
  GradScaler g;
  g.scale_ = static_cast<float>(scale);
  return g;
}

GradScaler GradScaler::dynamic(const LossScaleConfig& c) {
  GradScaler g;
  g.dynamic_ = true;
  g.scale_ = static_cast<float>(c.initial_loss_scale);
  g.min_scale_ = static_cast<float>(c.min_loss_scale);
  g.growth_interval_ = c.loss_scale_window;
  g.hysteresis_ = c.hysteresis;
  g.hysteresis_tracker_ = c.hysteresis;
  return g;
}

void GradScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5f, min_scale_);
    return;
  }
  ++growth_tracker_;
  if (static_cast<double>(growth_tracker_) == growth_interval_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ = scale_ * 2.0f;
  }
}

nlohmann::json GradScaler::state_json() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}, {"hysteresis_tracker", hysteresis_tracker_}};
}

void GradScaler::load_state_json(const nlohmann::json& j) {
  if (!dynamic_) return;  // a constant scale comes from --loss-scale, as in Megatron
  scale_ = j.value("scale", scale_);
  growth_tracker_ = j.value("growth_tracker", growth_tracker_);
  hysteresis_tracker_ = j.value("hysteresis_tracker", hysteresis_tracker_);
}

}  // namespace mt::optim
