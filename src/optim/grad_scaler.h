#pragma once
// Loss scaling for 16-bit training, as Megatron's grad scalers
// (megatron/core/optimizer/grad_scaler.py):
//   - constant (--loss-scale S): every backward starts from S x d(loss);
//   - dynamic (--fp16 without --loss-scale): the scale starts at
//     --initial-loss-scale, halves (never below --min-loss-scale) on the
//     --hysteresis-th iteration with an inf or NaN gradient since the scale
//     last grew (and on every such iteration after that), and doubles after
//     --loss-scale-window iterations in a row without one.
// The trainer multiplies the loss gradient by scale(), multiplies the reduced
// gradients by inv_scale() and, when any is inf or NaN on any rank, skips the
// optimizer step and the scheduler step; update() then moves the scale. The
// scale is an fp32 value and inv_scale is 1/scale computed in fp64 and
// rounded to fp32, as Megatron's tensors are.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::optim {

struct LossScaleConfig {
  std::optional<double> loss_scale;    // --loss-scale: constant; unset: dynamic under --fp16
  double initial_loss_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_loss_scale = 1.0;         // --min-loss-scale
  double loss_scale_window = 1000;     // --loss-scale-window (a float in Megatron)
  int64_t hysteresis = 2;              // --hysteresis
  // A constant scale (Megatron takes --loss-scale 0, falsy, as unset).
  bool constant() const { return loss_scale && *loss_scale > 0; }
};

// The configuration problems (each naming its flag), empty when valid.
std::vector<std::string> loss_scale_problems(const LossScaleConfig& c);

class GradScaler {
 public:
  static GradScaler constant(double scale);
  static GradScaler dynamic(const LossScaleConfig& c);
  // constant(--loss-scale) when given, else dynamic (Megatron's choice).
  static GradScaler from(const LossScaleConfig& c) { return c.constant() ? constant(*c.loss_scale) : dynamic(c); }

  bool is_dynamic() const { return dynamic_; }
  float scale() const { return scale_; }
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }
  // After each iteration: whether any gradient was inf or NaN.
  void update(bool found_inf);

  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  // Megatron's state_dict keys: scale, growth_tracker, hysteresis_tracker.
  nlohmann::json state_json() const;
  void load_state_json(const nlohmann::json& j);

 private:
  GradScaler() = default;
  bool dynamic_ = false;
  float scale_ = 1.0f, min_scale_ = 1.0f;
  double growth_interval_ = 1000;
  int64_t hysteresis_ = 2;
  int64_t growth_tracker_ = 0, hysteresis_tracker_ = 2;
};

}  // namespace mt::optim
