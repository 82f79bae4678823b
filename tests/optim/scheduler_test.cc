// OptimizerParamScheduler against the closed forms of
// ../shared/spec/megatron-reference.md §6, written out by hand at chosen
// counters (table-driven), plus flag conversion, validation and state.

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/scheduler.h"

namespace mt::optim {
namespace {

using std::numbers::pi;
using json = nlohmann::json;

// max 1.0, min 0.1, W = 100, D = 1100 (decay length 1000), WSD anneal over the last 400 (A = 700).
SchedulerConfig base(const std::string& style, const std::string& wsd_style = "exponential", double init = 0.0) {
  SchedulerConfig c;
  c.max_lr = 1.0, c.min_lr = 0.1, c.warmup_init_lr = init;
  c.warmup_steps = 100, c.decay_steps = 1100;
  c.decay_style = style;
  c.wsd_decay_steps = 400, c.wsd_decay_style = wsd_style;
  c.start_wd = c.end_wd = 0.01, c.wd_incr_steps = 1100, c.wd_incr_style = "constant";
  return c;
}

struct LrCase {
  const char* style;
  const char* wsd_style;
  double init;
  int64_t n;
  double expected;
};

// Each expected value is the spec's formula evaluated by hand at n.
const LrCase kLrCases[] = {
    // warmup: init + (max - init) n / W, for every style
    {"linear", "", 0.0, 0, 0.0},
    {"linear", "", 0.0, 25, 0.25},
    {"cosine", "", 0.0, 50, 0.5},
    {"constant", "", 0.0, 100, 1.0},
    {"linear", "", 0.05, 0, 0.05},
    {"linear", "", 0.05, 40, 0.05 + 0.95 * 0.4},
    {"WSD", "linear", 0.05, 100, 1.0},
    {"inverse-square-root", "", 0.05, 60, 0.05 + 0.95 * 0.6},
    // constant: max after warmup, also past D
    {"constant", "", 0.0, 101, 1.0},
    {"constant", "", 0.0, 5000, 1.0},
    // linear: min + (1 - r)(max - min), r = (n - W) / (D - W)
    {"linear", "", 0.0, 101, 0.1 + 0.9 * (1 - 0.001)},
    {"linear", "", 0.0, 350, 0.1 + 0.9 * 0.75},
    {"linear", "", 0.0, 600, 0.55},
    {"linear", "", 0.0, 1100, 0.1},
    {"linear", "", 0.0, 1101, 0.1},
    // cosine: min + (1 + cos(pi r)) / 2 (max - min)
    {"cosine", "", 0.0, 350, 0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.25))},
    {"cosine", "", 0.0, 600, 0.55},
    {"cosine", "", 0.0, 850, 0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.75))},
    {"cosine", "", 0.0, 1100, 0.1},
    {"cosine", "", 0.0, 99999, 0.1},
    // inverse-square-root: max(min, max sqrt(max(W,1)) / sqrt(max(n,1))); min past D
    {"inverse-square-root", "", 0.0, 400, 0.5},
    {"inverse-square-root", "", 0.0, 900, 1.0 / 3.0},
    {"inverse-square-root", "", 0.0, 1000, 10.0 / std::sqrt(1000.0)},
    {"inverse-square-root", "", 0.0, 1200, 0.1},  // n > D wins over 10/sqrt(1200)
    // WSD: stable until A = 700, then u = (n - 700) / 400
    {"WSD", "exponential", 0.0, 500, 1.0},
    {"WSD", "exponential", 0.0, 700, 1.0},
    {"WSD", "exponential", 0.0, 800, 0.1 + 0.9 * (2 * std::pow(0.5, 0.25) - 1)},
    {"WSD", "exponential", 0.0, 900, 0.1 + 0.9 * (2 * std::sqrt(0.5) - 1)},
    {"WSD", "exponential", 0.0, 1100, 0.1},
    {"WSD", "linear", 0.0, 800, 0.1 + 0.9 * 0.75},
    {"WSD", "linear", 0.0, 900, 0.55},
    {"WSD", "linear", 0.0, 1100, 0.1},
    {"WSD", "cosine", 0.0, 800, 0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.25))},
    {"WSD", "cosine", 0.0, 1000, 0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.75))},
    {"WSD", "minus_sqrt", 0.0, 800, 0.55},
    {"WSD", "minus_sqrt", 0.0, 900, 0.1 + 0.9 * (1 - std::sqrt(0.5))},
    {"WSD", "minus_sqrt", 0.0, 1100, 0.1},
    {"WSD", "minus_sqrt", 0.0, 1101, 0.1},
};

class LrSchedule : public ::testing::TestWithParam<LrCase> {};

TEST_P(LrSchedule, MatchesClosedForm) {
  const LrCase& c = GetParam();
  auto s = OptimizerParamScheduler::create(base(c.style, *c.wsd_style ? c.wsd_style : "exponential", c.init));
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  s->step(c.n);
  EXPECT_EQ(s->num_steps(), c.n);
  EXPECT_NEAR(s->lr(), c.expected, 1e-12) << c.style << "/" << c.wsd_style << " at n=" << c.n;
}

INSTANTIATE_TEST_SUITE_P(Styles, LrSchedule, ::testing::ValuesIn(kLrCases));

TEST(LrSchedule, InverseSquareRootWithoutWarmupStartsAtMax) {
  SchedulerConfig c = base("inverse-square-root");
  c.warmup_steps = 0;
  OptimizerParamScheduler s(c);
  EXPECT_DOUBLE_EQ(s.lr(), 1.0);  // sqrt(max(0,1)) / sqrt(max(0,1))
  s.step(4);
  EXPECT_DOUBLE_EQ(s.lr(), 0.5);
}

TEST(LrSchedule, PerGroupEndpoints) {
  OptimizerParamScheduler s(base("linear"));
  s.step(350);
  EXPECT_NEAR(s.lr_for(2.0, 0.0), 2.0 * 0.75, 1e-12);
}

TEST(LrSchedule, IncrementsAccumulateLikeOneStep) {
  // Iteration i trains with lr((i-1) GBS): the counter is a sum of increments.
  OptimizerParamScheduler a(base("cosine")), b(base("cosine"));
  for (int i = 0; i < 37; ++i) a.step(16);
  b.step(37 * 16);
  EXPECT_EQ(a.num_steps(), b.num_steps());
  EXPECT_EQ(a.lr(), b.lr());
}

struct WdCase {
  const char* style;
  int64_t n;
  double expected;
};

// start 0.01, end 0.1 over 1000 samples (constant: 0.05 throughout).
const WdCase kWdCases[] = {
    {"constant", 0, 0.05},
    {"constant", 500, 0.05},
    {"constant", 5000, 0.05},
    {"linear", 0, 0.01},
    {"linear", 250, 0.01 + 0.25 * 0.09},
    {"linear", 1000, 0.1},
    {"linear", 1001, 0.1},
    {"cosine", 0, 0.01},
    {"cosine", 250, 0.01 + 0.09 * 0.5 * (1 + std::cos(pi * 0.75))},
    {"cosine", 500, 0.055},
    {"cosine", 750, 0.01 + 0.09 * 0.5 * (1 + std::cos(pi * 0.25))},
    {"cosine", 1000, 0.1},
    {"cosine", 2000, 0.1},
};

class WdSchedule : public ::testing::TestWithParam<WdCase> {};

TEST_P(WdSchedule, MatchesClosedForm) {
  const WdCase& c = GetParam();
  SchedulerConfig cfg = base("linear");
  cfg.wd_incr_style = c.style;
  cfg.wd_incr_steps = 1000;
  if (std::string(c.style) == "constant") cfg.start_wd = cfg.end_wd = 0.05;
  else cfg.start_wd = 0.01, cfg.end_wd = 0.1;
  auto s = OptimizerParamScheduler::create(cfg);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  s->step(c.n);
  EXPECT_NEAR(s->wd(), c.expected, 1e-14) << c.style << " at n=" << c.n;
}

INSTANTIATE_TEST_SUITE_P(Styles, WdSchedule, ::testing::ValuesIn(kWdCases));

// ---- validation

void expect_invalid(const SchedulerConfig& c, const std::string& needle) {
  Status st = validate(c);
  ASSERT_FALSE(st.is_ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(SchedulerValidate, RulesNameTheFlags) {
  EXPECT_TRUE(validate(base("linear")).is_ok());
  SchedulerConfig c = base("linear");
  c.min_lr = 2.0;
  expect_invalid(c, "--min-lr (2.0) must not exceed --lr (1.0)");
  c = base("linear"), c.min_lr = -1, c.max_lr = -0.5;
  expect_invalid(c, "--min-lr is -1.0");
  c = base("linear"), c.warmup_init_lr = 1.5;
  expect_invalid(c, "--lr-warmup-init");
  c = base("linear"), c.warmup_steps = 1100;
  expect_invalid(c, "must be shorter than the LR decay");
  c = base("linear"), c.decay_steps = 0, c.warmup_steps = 0;
  expect_invalid(c, "must be > 0");
  c = base("WSD"), c.wsd_decay_steps = -1;
  expect_invalid(c, "--lr-wsd-decay-iters");
  c = base("WSD", "quadratic");
  expect_invalid(c, "--lr-wsd-decay-style 'quadratic'");
  c = base("exponential");
  expect_invalid(c, "--lr-decay-style 'exponential'");
  c = base("linear"), c.start_wd = 0.1, c.end_wd = 0.01, c.wd_incr_style = "linear";
  expect_invalid(c, "--end-weight-decay (0.01) must be >= --start-weight-decay (0.1)");
  c = base("linear"), c.start_wd = 0.01, c.end_wd = 0.1;  // constant style
  expect_invalid(c, "constant needs equal start and end");
  c = base("linear"), c.start_wd = 0.0, c.end_wd = 0.1, c.wd_incr_style = "cosine", c.wd_incr_steps = 0;
  expect_invalid(c, "positive increment length");
  // All problems in one message.
  c = base("linear"), c.min_lr = 2.0, c.warmup_steps = 2000;
  Status st = validate(c);
  EXPECT_NE(st.message().find("2 problems"), std::string::npos) << st.message();
  EXPECT_FALSE(OptimizerParamScheduler::create(c).is_ok());
}

// ---- flags -> samples

TEST(SchedulerFromFlags, IterationFlagsScaleByGlobalBatch) {
  ScheduleFlags f;
  f.lr = 6e-4, f.min_lr = 6e-5, f.lr_decay_style = "cosine";
  f.train_iters = 100, f.global_batch_size = 8, f.lr_warmup_iters = 10;
  auto c = scheduler_from_flags(f);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->max_lr, 6e-4);
  EXPECT_EQ(c->min_lr, 6e-5);
  EXPECT_EQ(c->decay_steps, 800);    // --train-iters * GBS when --lr-decay-iters is absent
  EXPECT_EQ(c->warmup_steps, 80);
  EXPECT_EQ(c->wd_incr_steps, 800);  // always --train-iters * GBS
  EXPECT_EQ(c->start_wd, 0.01);      // --weight-decay default
  EXPECT_EQ(c->end_wd, 0.01);
  EXPECT_EQ(c->wsd_decay_steps, -1);

  f.lr_decay_iters = 50, f.lr_warmup_iters = 0, f.lr_warmup_fraction = 0.15;
  f.lr_decay_style = "WSD", f.lr_wsd_decay_iters = 20, f.lr_wsd_decay_style = "minus_sqrt";
  f.weight_decay_incr_style = "linear", f.start_weight_decay = 0.0, f.end_weight_decay = 0.1;
  c = scheduler_from_flags(f);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->decay_steps, 400);
  EXPECT_DOUBLE_EQ(c->warmup_steps, 0.15 * 400);  // fraction of D, possibly fractional
  EXPECT_EQ(c->wsd_decay_steps, 160);
  EXPECT_EQ(c->wsd_decay_style, "minus_sqrt");
  EXPECT_EQ(c->wd_incr_steps, 800);
  EXPECT_EQ(c->start_wd, 0.0);
  EXPECT_EQ(c->end_wd, 0.1);
  EXPECT_EQ(c->wd_incr_style, "linear");
}

TEST(SchedulerFromFlags, SampleFlagsAreUsedDirectly) {
  ScheduleFlags f;
  f.lr = 1e-3, f.train_samples = 1000, f.lr_warmup_samples = 100, f.global_batch_size = 8;
  auto c = scheduler_from_flags(f);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->decay_steps, 1000);
  EXPECT_EQ(c->warmup_steps, 100);
  EXPECT_EQ(c->wd_incr_steps, 1000);
  f.lr_decay_samples = 900, f.lr_decay_style = "WSD", f.lr_wsd_decay_samples = 300;
  c = scheduler_from_flags(f);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->decay_steps, 900);
  EXPECT_EQ(c->wsd_decay_steps, 300);
  EXPECT_EQ(c->wd_incr_steps, 1000);
}

TEST(SchedulerFromFlags, TrainingFollowsMegatronsIterationLr) {
  // Iteration i trains with lr((i-1) GBS); the log prints lr(i GBS).
  ScheduleFlags f;
  f.lr = 1.0, f.min_lr = 0.0, f.train_iters = 10, f.global_batch_size = 4, f.lr_warmup_iters = 2;
  auto c = scheduler_from_flags(f);
  ASSERT_TRUE(c.is_ok());
  OptimizerParamScheduler s(*c);
  std::vector<double> trained;
  for (int i = 1; i <= 4; ++i) {
    trained.push_back(s.lr());
    s.step(4);
  }
  EXPECT_DOUBLE_EQ(trained[0], 0.0);   // n = 0
  EXPECT_DOUBLE_EQ(trained[1], 0.5);   // n = 4 of W = 8
  EXPECT_DOUBLE_EQ(trained[2], 1.0);   // n = 8 = W
  EXPECT_DOUBLE_EQ(trained[3], 1.0 - 4.0 / 32.0);  // linear, r = (12 - 8) / (40 - 8)
}

void expect_flag_error(const ScheduleFlags& f, const std::string& needle) {
  auto c = scheduler_from_flags(f);
  ASSERT_FALSE(c.is_ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

TEST(SchedulerFromFlags, RejectsInconsistentFlags) {
  ScheduleFlags ok;
  ok.lr = 1e-3, ok.train_iters = 10, ok.global_batch_size = 4;
  ASSERT_TRUE(scheduler_from_flags(ok).is_ok());
  ScheduleFlags f = ok;
  f.lr.reset();
  expect_flag_error(f, "--lr is required");
  f = ok, f.train_samples = 100;
  expect_flag_error(f, "mutually exclusive");
  f = ok, f.train_iters.reset();
  expect_flag_error(f, "either --train-iters or --train-samples");
  f = ok, f.lr_warmup_fraction = 0.1, f.lr_warmup_iters = 2;
  expect_flag_error(f, "--lr-warmup-fraction and --lr-warmup-iters");
  f = ok, f.lr_decay_samples = 10;
  expect_flag_error(f, "--lr-decay-samples needs --train-samples");
  f = ok, f.train_iters.reset(), f.train_samples = 100, f.lr_warmup_iters = 3;
  expect_flag_error(f, "--lr-warmup-iters needs --train-iters");
  f = ok, f.start_weight_decay = 0.1;
  expect_flag_error(f, "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style");
  f = ok, f.weight_decay_incr_style = "cosine", f.start_weight_decay = 0.0;
  expect_flag_error(f, "needs both --start-weight-decay and --end-weight-decay");
  f = ok, f.lr_decay_style = "WSD";
  expect_flag_error(f, "--lr-decay-style WSD needs --lr-wsd-decay-iters");
  f = ok, f.min_lr = 1.0;
  expect_flag_error(f, "--min-lr (1.0) must not exceed --lr (0.001)");
  f = ok, f.lr_warmup_iters = 10;
  expect_flag_error(f, "must be shorter than the LR decay");
  f = ok, f.global_batch_size = 0;
  expect_flag_error(f, "--global-batch-size is 0");
}

// ---- state

TEST(SchedulerState, RoundTripThroughJsonTextIsExact) {
  SchedulerConfig c = base("cosine");
  c.max_lr = 6e-4, c.min_lr = 6e-5, c.warmup_steps = 0.1 * 1100;  // a non-integer-looking double
  c.start_wd = 0.0, c.end_wd = 0.1, c.wd_incr_style = "linear";
  OptimizerParamScheduler a(c);
  a.step(333);
  const json st = a.state_json();
  for (const char* k : {"max_lr", "lr_warmup_steps", "num_steps", "lr_decay_style", "lr_decay_steps", "min_lr",
                        "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"})
    EXPECT_TRUE(st.contains(k)) << k;
  EXPECT_EQ(st.size(), 10u);
  const json reread = json::parse(st.dump());
  OptimizerParamScheduler b(c);
  ASSERT_TRUE(b.load_state(reread, false, false).is_ok());
  EXPECT_EQ(b.num_steps(), 333);
  EXPECT_EQ(b.lr(), a.lr());  // bitwise
  EXPECT_EQ(b.wd(), a.wd());
  a.step(16), b.step(16);
  EXPECT_EQ(b.lr(), a.lr());
}

TEST(SchedulerState, MismatchIsReportedLikeMegatron) {
  OptimizerParamScheduler saved(base("linear"));
  saved.step(200);
  const json st = saved.state_json();
  SchedulerConfig other = base("linear");
  other.max_lr = 2.0;
  OptimizerParamScheduler s(other);
  Status e = s.load_state(st, false, false);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.message().find("class input value 2.0 and checkpoint value 1.0 for learning rate do not match"),
            std::string::npos)
      << e.message();
  EXPECT_NE(e.message().find("--lr"), std::string::npos);
  EXPECT_EQ(s.num_steps(), 0);  // unchanged on error
  EXPECT_EQ(s.config().max_lr, 2.0);

  // Style mismatch, and weight-decay entries are checked too.
  OptimizerParamScheduler s2(base("cosine"));
  e = s2.load_state(st, false, false);
  EXPECT_NE(e.message().find("class input value cosine and checkpoint value linear for learning rate decay style"),
            std::string::npos)
      << e.message();
  SchedulerConfig wd = base("linear");
  wd.start_wd = wd.end_wd = 0.02;
  OptimizerParamScheduler s3(wd);
  e = s3.load_state(st, false, false);
  EXPECT_NE(e.message().find("for start weight decay do not match"), std::string::npos) << e.message();

  // --use-checkpoint-opt-param-scheduler takes the saved values.
  OptimizerParamScheduler s4(other);
  ASSERT_TRUE(s4.load_state(st, true, false).is_ok());
  EXPECT_EQ(s4.config().max_lr, 1.0);
  EXPECT_EQ(s4.num_steps(), 200);
  EXPECT_EQ(s4.lr(), saved.lr());
  // --override-opt-param-scheduler keeps the command line's; num_steps still restored.
  OptimizerParamScheduler s5(other);
  ASSERT_TRUE(s5.load_state(st, false, true).is_ok());
  EXPECT_EQ(s5.config().max_lr, 2.0);
  EXPECT_EQ(s5.num_steps(), 200);
  // Both flags: an error.
  OptimizerParamScheduler s6(other);
  e = s6.load_state(st, true, true);
  EXPECT_NE(e.message().find("mutually exclusive"), std::string::npos);
}

TEST(SchedulerState, OlderKeyNamesAndBadInput) {
  OptimizerParamScheduler s(base("linear"));
  json old = {{"start_lr", 1.0}, {"min_lr", 0.1}, {"warmup_iter", 100}, {"end_iter", 1100},
              {"decay_style", "linear"}, {"num_iters", 42}};
  ASSERT_TRUE(s.load_state(old, false, false).is_ok());
  EXPECT_EQ(s.num_steps(), 42);
  OptimizerParamScheduler t(base("linear"));
  json bad = old;
  bad["num_iters"] = "x";
  Status e = t.load_state(bad, false, false);
  EXPECT_NE(e.message().find("expected a non-negative integer"), std::string::npos) << e.message();
  bad = old;
  bad.erase("min_lr");
  e = t.load_state(bad, false, false);
  EXPECT_NE(e.message().find("no 'min_lr'"), std::string::npos) << e.message();
  EXPECT_FALSE(t.load_state(json::array(), false, false).is_ok());
}

}  // namespace
}  // namespace mt::optim
