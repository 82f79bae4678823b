#include "optim/scheduler.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace mt::optim {
namespace {

using json = nlohmann::json;

bool is_decay_style(const std::string& s) {
  return s == "constant" || s == "linear" || s == "cosine" || s == "inverse-square-root" || s == "WSD";
}
bool is_wsd_style(const std::string& s) {
  return s == "exponential" || s == "linear" || s == "cosine" || s == "minus_sqrt";
}
bool is_wd_style(const std::string& s) { return s == "constant" || s == "linear" || s == "cosine"; }

Status join(const std::vector<std::string>& errors, const char* what) {
  if (errors.empty()) return Status::ok();
  std::string m = fmt::format("{} ({} problem{}):", what, errors.size(), errors.size() == 1 ? "" : "s");
  for (const auto& e : errors) m += "\n  - " + e;
  return Status::invalid(m);
}

// A number as Python's repr would show it (shortest round-trip form).
std::string num(double v) { return json(v).dump(); }

}  // namespace

Status validate(const SchedulerConfig& c) {
  std::vector<std::string> e;
  if (!(c.min_lr >= 0.0)) e.push_back(fmt::format("--min-lr is {}; it must be >= 0", num(c.min_lr)));
  if (!(c.max_lr >= c.min_lr))
    e.push_back(fmt::format("--min-lr ({}) must not exceed --lr ({})", num(c.min_lr), num(c.max_lr)));
  if (!(c.warmup_init_lr <= c.max_lr))
    e.push_back(fmt::format("--lr-warmup-init ({}) must not exceed --lr ({})", num(c.warmup_init_lr), num(c.max_lr)));
  if (!(c.decay_steps > 0))
    e.push_back(fmt::format("the LR decay length is {} samples; it must be > 0 (set --lr-decay-iters, "
                            "--lr-decay-samples, --train-iters or --train-samples)",
                            num(c.decay_steps)));
  if (!(c.warmup_steps >= 0)) e.push_back(fmt::format("the LR warmup is {} samples; it must be >= 0", num(c.warmup_steps)));
  if (!(c.warmup_steps < c.decay_steps))
    e.push_back(fmt::format("the LR warmup ({} samples) must be shorter than the LR decay ({} samples); "
                            "reduce --lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction or raise --lr-decay-iters",
                            num(c.warmup_steps), num(c.decay_steps)));
  if (!is_decay_style(c.decay_style))
    e.push_back(fmt::format("--lr-decay-style '{}' is not one of constant, linear, cosine, inverse-square-root, WSD",
                            c.decay_style));
  if (c.decay_style == "WSD") {
    if (!(c.wsd_decay_steps >= 0))
      e.push_back("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
    if (!is_wsd_style(c.wsd_decay_style))
      e.push_back(fmt::format("--lr-wsd-decay-style '{}' is not one of exponential, linear, cosine, minus_sqrt",
                              c.wsd_decay_style));
  }
  if (!(c.start_wd >= 0.0))
    e.push_back(fmt::format("--start-weight-decay is {}; it must be >= 0", num(c.start_wd)));
  if (!(c.end_wd >= c.start_wd))
    e.push_back(fmt::format("--end-weight-decay ({}) must be >= --start-weight-decay ({})", num(c.end_wd),
                            num(c.start_wd)));
  if (!is_wd_style(c.wd_incr_style)) {
    e.push_back(fmt::format("--weight-decay-incr-style '{}' is not one of constant, linear, cosine", c.wd_incr_style));
  } else if (c.wd_incr_style == "constant") {
    if (c.start_wd != c.end_wd)
      e.push_back(fmt::format("--weight-decay-incr-style constant needs equal start and end weight decay (got {} "
                              "and {}); use --weight-decay alone",
                              num(c.start_wd), num(c.end_wd)));
  } else if (!(c.wd_incr_steps > 0)) {
    e.push_back(fmt::format("--weight-decay-incr-style {} needs a positive increment length (got {} samples; it is "
                            "--train-iters * --global-batch-size or --train-samples)",
                            c.wd_incr_style, num(c.wd_incr_steps)));
  }
  return join(e, "invalid learning-rate / weight-decay schedule");
}

Result<OptimizerParamScheduler> OptimizerParamScheduler::create(const SchedulerConfig& cfg) {
  MT_RETURN_IF_ERROR(validate(cfg));
  return OptimizerParamScheduler(cfg);
}

OptimizerParamScheduler::OptimizerParamScheduler(const SchedulerConfig& cfg) : cfg_(cfg) {
  Status st = validate(cfg);
  MT_CHECK(st.is_ok(), st.message());
}

double OptimizerParamScheduler::lr_for(double max_lr, double min_lr) const {
  const double n = static_cast<double>(num_steps_);
  const double W = cfg_.warmup_steps, D = cfg_.decay_steps;
  // Linear warmup for the initial part.
  if (W > 0 && n <= W) return cfg_.warmup_init_lr + (max_lr - cfg_.warmup_init_lr) * n / W;
  if (cfg_.decay_style == "constant") return max_lr;
  if (n > D) return min_lr;
  if (cfg_.decay_style == "inverse-square-root") {
    const double w = std::max(W, 1.0), s = std::max(n, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(s));
  }
  const double ratio = (n - W) / (D - W);
  MT_CHECK(ratio >= 0.0 && ratio <= 1.0, "scheduler: decay ratio outside [0, 1]");
  const double delta = max_lr - min_lr;
  double coeff = 0;
  if (cfg_.decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (cfg_.decay_style == "cosine") {
    coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  } else if (cfg_.decay_style == "WSD") {
    const double anneal_start = D - cfg_.wsd_decay_steps;
    if (n <= anneal_start) {
      coeff = 1.0;
    } else {
      const double u = (n - anneal_start) / cfg_.wsd_decay_steps;
      const std::string& s = cfg_.wsd_decay_style;
      if (s == "linear") coeff = 1.0 - u;
      else if (s == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * u) + 1.0);
      else if (s == "exponential") coeff = 2.0 * std::pow(0.5, u) - 1.0;
      else coeff = 1.0 - std::sqrt(u);  // minus_sqrt
    }
  } else {
    MT_CHECK(false, "scheduler: unknown decay style " + cfg_.decay_style);
  }
  return min_lr + coeff * delta;
}

double OptimizerParamScheduler::wd() const {
  const double n = static_cast<double>(num_steps_);
  if (n > cfg_.wd_incr_steps) return cfg_.end_wd;
  if (cfg_.wd_incr_style == "constant") return cfg_.end_wd;
  const double ratio = n / cfg_.wd_incr_steps;
  MT_CHECK(ratio >= 0.0 && ratio <= 1.0, "scheduler: weight-decay ratio outside [0, 1]");
  const double delta = cfg_.end_wd - cfg_.start_wd;
  const double coeff =
      cfg_.wd_incr_style == "linear" ? ratio : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
  return cfg_.start_wd + coeff * delta;
}

void OptimizerParamScheduler::step(int64_t increment) {
  MT_CHECK(increment >= 0, "OptimizerParamScheduler::step: negative increment");
  num_steps_ += increment;
}

json OptimizerParamScheduler::state_json() const {
  return json{{"max_lr", cfg_.max_lr},           {"lr_warmup_steps", cfg_.warmup_steps},
              {"num_steps", num_steps_},         {"lr_decay_style", cfg_.decay_style},
              {"lr_decay_steps", cfg_.decay_steps}, {"min_lr", cfg_.min_lr},
              {"start_wd", cfg_.start_wd},       {"end_wd", cfg_.end_wd},
              {"wd_incr_style", cfg_.wd_incr_style}, {"wd_incr_steps", cfg_.wd_incr_steps}};
}

namespace {

// The first of `keys` present in `s`, or nullptr.
const json* find_key(const json& s, std::initializer_list<const char*> keys, std::string* which) {
  for (const char* k : keys) {
    auto it = s.find(k);
    if (it != s.end()) {
      *which = k;
      return &*it;
    }
  }
  return nullptr;
}

struct Checker {
  bool use_ckpt, override_values;
  std::vector<std::string> errors;

  // Megatron's _check_and_set for a number.
  double number(const json& s, std::initializer_list<const char*> keys, double cls_value, const char* name,
                const char* flag) {
    std::string key;
    const json* v = find_key(s, keys, &key);
    if (!v) {
      errors.push_back(fmt::format("scheduler state has no '{}' (for {})", *keys.begin(), name));
      return cls_value;
    }
    if (!v->is_number()) {
      errors.push_back(fmt::format("scheduler state '{}' is {}, expected a number", key, v->dump()));
      return cls_value;
    }
    const double sd = v->get<double>();
    if (override_values) return cls_value;
    if (!use_ckpt && cls_value != sd)
      errors.push_back(mismatch(num(cls_value), num(sd), name, flag));
    return sd;
  }
  std::string text(const json& s, std::initializer_list<const char*> keys, const std::string& cls_value,
                   const char* name, const char* flag) {
    std::string key;
    const json* v = find_key(s, keys, &key);
    if (!v) {
      errors.push_back(fmt::format("scheduler state has no '{}' (for {})", *keys.begin(), name));
      return cls_value;
    }
    if (!v->is_string()) {
      errors.push_back(fmt::format("scheduler state '{}' is {}, expected a string", key, v->dump()));
      return cls_value;
    }
    const std::string sd = v->get<std::string>();
    if (override_values) return cls_value;
    if (!use_ckpt && cls_value != sd) errors.push_back(mismatch(cls_value, sd, name, flag));
    return sd;
  }
  static std::string mismatch(const std::string& cls, const std::string& sd, const char* name, const char* flag) {
    return fmt::format(
        "OptimizerParamScheduler: class input value {} and checkpoint value {} for {} do not match ({}; pass "
        "--use-checkpoint-opt-param-scheduler to take the checkpoint's values or --override-opt-param-scheduler "
        "to keep the command line's)",
        cls, sd, name, flag);
  }
};

}  // namespace

Status OptimizerParamScheduler::load_state(const json& s, bool use_checkpoint_values, bool override_values) {
  if (use_checkpoint_values && override_values)
    return Status::invalid(
        "--use-checkpoint-opt-param-scheduler and --override-opt-param-scheduler are mutually exclusive");
  if (!s.is_object()) return Status::invalid(fmt::format("scheduler state is {}, expected a JSON object", s.dump()));
  Checker c{use_checkpoint_values, override_values, {}};
  SchedulerConfig n = cfg_;
  n.max_lr = c.number(s, {"max_lr", "start_lr"}, cfg_.max_lr, "learning rate", "--lr");
  n.min_lr = c.number(s, {"min_lr"}, cfg_.min_lr, "minimum learning rate", "--min-lr");
  n.warmup_steps = c.number(s, {"lr_warmup_steps", "warmup_iter", "warmup_steps"}, cfg_.warmup_steps,
                            "warmup iterations", "--lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction");
  n.decay_steps = c.number(s, {"lr_decay_steps", "end_iter", "decay_steps"}, cfg_.decay_steps,
                           "total number of iterations", "--lr-decay-iters/--lr-decay-samples/--train-iters");
  n.decay_style = c.text(s, {"lr_decay_style", "decay_style"}, cfg_.decay_style, "learning rate decay style",
                         "--lr-decay-style");
  int64_t saved_steps = 0;
  {
    std::string key;
    const json* v = find_key(s, {"num_steps", "num_iters"}, &key);
    if (!v) c.errors.push_back("scheduler state has no 'num_steps'");
    else if (!v->is_number_integer() || v->get<int64_t>() < 0)
      c.errors.push_back(fmt::format("scheduler state '{}' is {}, expected a non-negative integer", key, v->dump()));
    else saved_steps = v->get<int64_t>();
  }
  if (s.contains("start_wd")) {
    n.start_wd = c.number(s, {"start_wd"}, cfg_.start_wd, "start weight decay", "--start-weight-decay");
    n.end_wd = c.number(s, {"end_wd"}, cfg_.end_wd, "end weight decay", "--end-weight-decay");
    n.wd_incr_steps = c.number(s, {"wd_incr_steps"}, cfg_.wd_incr_steps, "total number of weight decay iterations",
                               "--train-iters/--train-samples");
    n.wd_incr_style = c.text(s, {"wd_incr_style"}, cfg_.wd_incr_style, "weight decay incr style",
                             "--weight-decay-incr-style");
  }
  MT_RETURN_IF_ERROR(join(c.errors, "cannot restore the optimizer-parameter scheduler from the checkpoint"));
  Status st = validate(n);
  if (!st.is_ok()) return Status::invalid("the checkpoint's scheduler settings are invalid: " + st.message());
  cfg_ = n;
  num_steps_ += saved_steps;
  return Status::ok();
}

Result<SchedulerConfig> scheduler_from_flags(const ScheduleFlags& f) {
  std::vector<std::string> e;
  if (!f.lr) e.push_back("--lr is required");
  if (f.train_iters.has_value() == f.train_samples.has_value())
    e.push_back(f.train_iters ? "--train-iters and --train-samples are mutually exclusive; give one"
                              : "either --train-iters or --train-samples must be given");
  if (f.lr_warmup_fraction) {
    if (f.lr_warmup_iters != 0) e.push_back("--lr-warmup-fraction and --lr-warmup-iters are mutually exclusive");
    if (f.lr_warmup_samples != 0) e.push_back("--lr-warmup-fraction and --lr-warmup-samples are mutually exclusive");
    if (!(*f.lr_warmup_fraction >= 0.0 && *f.lr_warmup_fraction <= 1.0))
      e.push_back(fmt::format("--lr-warmup-fraction is {}; expected a value in [0, 1]", num(*f.lr_warmup_fraction)));
  }
  if (f.train_iters) {
    if (*f.train_iters <= 0) e.push_back(fmt::format("--train-iters is {}; it must be > 0", *f.train_iters));
    if (f.global_batch_size <= 0)
      e.push_back(fmt::format("--global-batch-size is {}; it must be > 0", f.global_batch_size));
    if (f.lr_decay_samples) e.push_back("--lr-decay-samples needs --train-samples (with --train-iters use --lr-decay-iters)");
    if (f.lr_warmup_samples != 0)
      e.push_back("--lr-warmup-samples needs --train-samples (with --train-iters use --lr-warmup-iters)");
    if (f.lr_wsd_decay_samples)
      e.push_back("--lr-wsd-decay-samples needs --train-samples (with --train-iters use --lr-wsd-decay-iters)");
  }
  if (f.train_samples) {
    if (*f.train_samples <= 0) e.push_back(fmt::format("--train-samples is {}; it must be > 0", *f.train_samples));
    if (f.lr_decay_iters) e.push_back("--lr-decay-iters needs --train-iters (with --train-samples use --lr-decay-samples)");
    if (f.lr_warmup_iters != 0)
      e.push_back("--lr-warmup-iters needs --train-iters (with --train-samples use --lr-warmup-samples)");
    if (f.lr_wsd_decay_iters)
      e.push_back("--lr-wsd-decay-iters needs --train-iters (with --train-samples use --lr-wsd-decay-samples)");
  }
  if (f.lr_warmup_iters < 0) e.push_back(fmt::format("--lr-warmup-iters is {}; it must be >= 0", f.lr_warmup_iters));
  if (f.lr_warmup_samples < 0)
    e.push_back(fmt::format("--lr-warmup-samples is {}; it must be >= 0", f.lr_warmup_samples));
  if (f.weight_decay_incr_style == "constant") {
    if (f.start_weight_decay || f.end_weight_decay)
      e.push_back("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine "
                  "(with constant, use --weight-decay)");
  } else if (!f.start_weight_decay || !f.end_weight_decay) {
    e.push_back(fmt::format("--weight-decay-incr-style {} needs both --start-weight-decay and --end-weight-decay",
                            f.weight_decay_incr_style));
  }
  MT_RETURN_IF_ERROR(join(e, "invalid learning-rate / weight-decay flags"));

  SchedulerConfig c;
  c.max_lr = *f.lr;
  c.min_lr = f.min_lr;
  c.warmup_init_lr = f.lr_warmup_init;
  c.decay_style = f.lr_decay_style;
  c.wsd_decay_style = f.lr_wsd_decay_style;
  c.wd_incr_style = f.weight_decay_incr_style;
  if (f.weight_decay_incr_style == "constant") {
    c.start_wd = c.end_wd = f.weight_decay;
  } else {
    c.start_wd = *f.start_weight_decay;
    c.end_wd = *f.end_weight_decay;
  }
  if (f.train_iters) {
    const double gbs = static_cast<double>(f.global_batch_size);
    const int64_t decay_iters = f.lr_decay_iters.value_or(*f.train_iters);
    c.decay_steps = static_cast<double>(decay_iters) * gbs;
    c.wd_incr_steps = static_cast<double>(*f.train_iters) * gbs;
    if (f.lr_wsd_decay_iters) c.wsd_decay_steps = static_cast<double>(*f.lr_wsd_decay_iters) * gbs;
    c.warmup_steps = f.lr_warmup_fraction ? *f.lr_warmup_fraction * c.decay_steps
                                          : static_cast<double>(f.lr_warmup_iters) * gbs;
  } else {
    c.decay_steps = static_cast<double>(f.lr_decay_samples.value_or(*f.train_samples));
    c.wd_incr_steps = static_cast<double>(*f.train_samples);
    if (f.lr_wsd_decay_samples) c.wsd_decay_steps = static_cast<double>(*f.lr_wsd_decay_samples);
    c.warmup_steps = f.lr_warmup_fraction ? *f.lr_warmup_fraction * c.decay_steps
                                          : static_cast<double>(f.lr_warmup_samples);
  }
  MT_RETURN_IF_ERROR(validate(c));
  return c;
}

}  // namespace mt::optim
