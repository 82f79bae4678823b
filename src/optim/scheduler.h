#pragma once
// OptimizerParamScheduler: Megatron's learning-rate and weight-decay schedule
// (megatron/core/optimizer_param_scheduler.py; ../shared/spec/megatron-reference.md §6),
// reproduced formula for formula, and the conversion of Megatron's flags into
// its units.
//
// Units are SAMPLES. The trainer calls step(increment) after every successful
// optimizer step with increment = num_microbatches * micro_batch * DP (= the
// global batch size), so iteration i (1-based) trains with lr() read before its
// step, i.e. lr(n = (i-1) * GBS), and Megatron's log line prints lr() read after
// it, lr(i * GBS). The counter starts at 0 (Megatron's step(0) in __init__).
//
// LR at counter n (W = warmup_steps, D = decay_steps):
//   W > 0 and n <= W:        warmup_init_lr + (max_lr - warmup_init_lr) * n / W
//   constant:                max_lr
//   n > D:                   min_lr
//   inverse-square-root:     max(min_lr, max_lr * sqrt(max(W,1)) / sqrt(max(n,1)))
//   else r = (n-W)/(D-W), lr = min_lr + c (max_lr - min_lr) with
//     linear c = 1-r; cosine c = (1+cos(pi r))/2;
//     WSD: A = D - wsd_decay_steps; n <= A: c = 1; else u = (n-A)/wsd_decay_steps and
//          exponential c = 2*0.5^u - 1, linear 1-u, cosine (1+cos(pi u))/2, minus_sqrt 1-sqrt(u).
// WD at counter n: n > wd_incr_steps: end_wd; constant: end_wd; else r = n/wd_incr_steps,
//   wd = start_wd + c (end_wd - start_wd), linear c = r, cosine c = (1+cos(pi (1-r)))/2.
//
// Saved state (state_json) has Megatron's keys: max_lr, lr_warmup_steps,
// num_steps, lr_decay_style, lr_decay_steps, min_lr, start_wd, end_wd,
// wd_incr_style, wd_incr_steps. WSD settings and warmup_init_lr are not saved
// (as in Megatron) and always come from the command line.
//
// Thread safety: none (plain value type).

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mt::optim {

struct SchedulerConfig {
  double max_lr = 0.0;          // --lr
  double min_lr = 0.0;          // --min-lr
  double warmup_init_lr = 0.0;  // --lr-warmup-init
  double warmup_steps = 0.0;    // W, samples (may be fractional with --lr-warmup-fraction)
  double decay_steps = 0.0;     // D, samples
  std::string decay_style = "linear";  // constant | linear | cosine | inverse-square-root | WSD
  double wsd_decay_steps = -1.0;       // samples; < 0 means not given (required for WSD)
  std::string wsd_decay_style = "exponential";  // exponential | linear | cosine | minus_sqrt
  double start_wd = 0.01, end_wd = 0.01;  // --start-weight-decay / --end-weight-decay
  double wd_incr_steps = 0.0;             // samples (--train-iters * GBS or --train-samples)
  std::string wd_incr_style = "constant";  // constant | linear | cosine
};

// Every rule Megatron asserts in the scheduler's constructor, as one Status
// listing all violations with flag names: min_lr >= 0, min_lr <= max_lr,
// warmup_init_lr <= max_lr, decay_steps > 0, warmup_steps < decay_steps, known
// styles, WSD needs wsd_decay_steps >= 0, start_wd >= 0, end_wd >= start_wd,
// constant wd style needs start_wd == end_wd, linear/cosine need wd_incr_steps > 0.
Status validate(const SchedulerConfig& cfg);

class OptimizerParamScheduler {
 public:
  // Validates cfg (see validate()).
  static Result<OptimizerParamScheduler> create(const SchedulerConfig& cfg);
  // REQUIRES: validate(cfg).is_ok() (checked with MT_CHECK).
  explicit OptimizerParamScheduler(const SchedulerConfig& cfg);

  // LR for the default parameter group at the current counter.
  double lr() const { return lr_for(cfg_.max_lr, cfg_.min_lr); }
  // LR for a group with its own max/min (Megatron's per-group max_lr/min_lr,
  // e.g. --decoupled-lr); same schedule, other endpoints.
  double lr_for(double max_lr, double min_lr) const;
  // Weight decay at the current counter (multiply by the group's wd_mult).
  double wd() const;

  // Advances the sample counter (REQUIRES: increment >= 0).
  void step(int64_t increment);
  int64_t num_steps() const { return num_steps_; }

  const SchedulerConfig& config() const { return cfg_; }

  // Megatron's state_dict(), as a JSON object.
  nlohmann::json state_json() const;
  // Megatron's load_state_dict() on a freshly created scheduler: for max_lr,
  // min_lr, lr_warmup_steps, lr_decay_steps, lr_decay_style (and start_wd,
  // end_wd, wd_incr_steps, wd_incr_style when present):
  //   override_values (--override-opt-param-scheduler): keep the configured value;
  //   use_checkpoint_values (--use-checkpoint-opt-param-scheduler): take the saved one;
  //   neither: they must be equal, else kInvalidArgument "class input value X and
  //   checkpoint value Y for <name> do not match" naming the flag.
  // Then the counter ADVANCES by the saved num_steps. Both flags at once, a
  // missing key or a wrong type is an error; on error *this is unchanged.
  // Also accepts Megatron's older key names (start_lr, warmup_iter, warmup_steps,
  // end_iter, decay_steps, decay_style, num_iters).
  Status load_state(const nlohmann::json& state, bool use_checkpoint_values, bool override_values);

 private:
  SchedulerConfig cfg_;
  int64_t num_steps_ = 0;
};

// Megatron's flags as the trainer parsed them; std::nullopt = not given.
struct ScheduleFlags {
  std::optional<double> lr;                      // --lr (required)
  double min_lr = 0.0;                           // --min-lr
  std::string lr_decay_style = "linear";         // --lr-decay-style
  std::optional<int64_t> lr_decay_iters;         // --lr-decay-iters
  std::optional<int64_t> lr_decay_samples;       // --lr-decay-samples
  int64_t lr_warmup_iters = 0;                   // --lr-warmup-iters
  int64_t lr_warmup_samples = 0;                 // --lr-warmup-samples
  std::optional<double> lr_warmup_fraction;      // --lr-warmup-fraction
  double lr_warmup_init = 0.0;                   // --lr-warmup-init
  std::optional<int64_t> lr_wsd_decay_iters;     // --lr-wsd-decay-iters
  std::optional<int64_t> lr_wsd_decay_samples;   // --lr-wsd-decay-samples
  std::string lr_wsd_decay_style = "exponential";  // --lr-wsd-decay-style
  double weight_decay = 0.01;                    // --weight-decay
  std::optional<double> start_weight_decay;      // --start-weight-decay
  std::optional<double> end_weight_decay;        // --end-weight-decay
  std::string weight_decay_incr_style = "constant";  // --weight-decay-incr-style
  std::optional<int64_t> train_iters;            // --train-iters
  std::optional<int64_t> train_samples;          // --train-samples
  int64_t global_batch_size = 0;                 // --global-batch-size
};

// Megatron's get_optimizer_param_scheduler() plus the argument rules it relies
// on (arguments.py): exactly one of --train-iters / --train-samples; the iter
// flags only with --train-iters and the sample flags only with --train-samples;
// --lr-warmup-fraction excludes --lr-warmup-iters/--lr-warmup-samples;
// constant wd style excludes --start/--end-weight-decay (both become
// --weight-decay), other styles need both. Iteration flags are multiplied by
// the global batch size. The result is validated (validate()). Every violated
// rule is listed in one kInvalidArgument Status.
Result<SchedulerConfig> scheduler_from_flags(const ScheduleFlags& flags);

}  // namespace mt::optim
