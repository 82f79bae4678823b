// --step-batch-size-schedule and --rampup-batch-size: the parser against
// Megatron's rules, the iteration count and the ramp against literal
// transcriptions of Megatron's loops, and the planner's checks.
#include "plan/batch_schedule.h"

#include <gtest/gtest.h>

#include <random>

#include "core/flags.h"

#include "../support/plan_helpers.h"

namespace mt::plan {
namespace {

using testing::plan_from;
using testing::rules_of;

std::vector<BatchStep> parsed(const std::string& text, int64_t seq) {
  auto r = parse_step_batch_size_schedule(text, seq);
  EXPECT_TRUE(r.is_ok()) << text << ": " << r.status().message();
  return r.is_ok() ? *r : std::vector<BatchStep>{};
}

TEST(StepBatchSchedule, ParsesMegatronsExample) {
  // The example of Megatron's help: tokens, converted with seq 2048 by floor division.
  const auto s = parsed("0:768 250B:1536 500B:3072 750B:6144", 2048);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].threshold, 0);
  EXPECT_EQ(s[0].batch, 768);
  EXPECT_EQ(s[1].threshold, 250000000000 / 2048);
  EXPECT_EQ(s[2].threshold, 500000000000 / 2048);
  EXPECT_EQ(s[3].threshold, 750000000000 / 2048);
  EXPECT_EQ(s[3].batch, 6144);
}

TEST(StepBatchSchedule, SuffixesCommasDecimalsAndOrder) {
  // Lower-case suffixes, commas as separators, decimals truncated after the
  // multiplier (Python's int(float(x) * m)), entries sorted by threshold.
  const auto s = parsed(" 2.5k:8,0:4   1.0000005M:16 ", 10);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].threshold, 0);
  EXPECT_EQ(s[0].batch, 4);
  EXPECT_EQ(s[1].threshold, 250);     // 2500 tokens / 10
  EXPECT_EQ(s[2].threshold, 100000);  // int(1000000.5) = 1000000 tokens / 10
  EXPECT_EQ(s[2].batch, 16);
  // A first threshold below one sample is threshold 0.
  EXPECT_EQ(parsed("9:8", 10)[0].threshold, 0);
  EXPECT_EQ(parsed("0:1K", 10)[0].batch, 1000);
}

TEST(StepBatchSchedule, RefusesWhatMegatronRefuses) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"", "no entries"}, Case{" , ", "no entries"}, Case{"0:0", "must be positive"},
                        Case{"0:-8", "must be positive"}, Case{"20:8", "threshold 0"}, Case{"0:4 5:8", "strictly increasing"},
                        Case{"0:4 10:8 10:16", "strictly increasing"}, Case{"0:4x", "not a number"},
                        Case{"0:nan", "not a number"}, Case{"0:inf", "not a number"}, Case{"0:4:5", "not a number"},
                        Case{"0", "THRESHOLD:BATCH_SIZE"}, Case{"0:", "empty"}, Case{"0:4 1e300:8", "out of range"},
                        Case{":4", "empty"}}) {
    auto r = parse_step_batch_size_schedule(c.text, 10);
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.text << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("--step-batch-size-schedule"), std::string::npos) << r.status().message();
  }
}

TEST(StepBatchSchedule, BatchAtTakesTheLastThresholdReached) {
  const std::vector<BatchStep> s{{0, 4}, {10, 8}, {30, 16}};
  EXPECT_EQ(batch_at(s, 0), 4);
  EXPECT_EQ(batch_at(s, 9), 4);
  EXPECT_EQ(batch_at(s, 10), 8);
  EXPECT_EQ(batch_at(s, 29), 8);
  EXPECT_EQ(batch_at(s, 30), 16);
  EXPECT_EQ(batch_at(s, 1 << 30), 16);
}

// A schedule of 1 + up to max_extra steps: first batch 1..8, thresholds 1..max_gap
// apart, batches 1..32.
std::vector<BatchStep> random_schedule(std::mt19937& rng, int max_extra, int max_gap) {
  std::vector<BatchStep> s{{0, 1 + static_cast<int64_t>(rng() % 8)}};
  const int n = static_cast<int>(rng() % static_cast<unsigned>(max_extra + 1));
  for (int k = 0; k < n; ++k)
    s.push_back({s.back().threshold + 1 + static_cast<int64_t>(rng() % static_cast<unsigned>(max_gap)),
                 1 + static_cast<int64_t>(rng() % 32)});
  return s;
}

// Megatron's update_train_iters for a step schedule, line by line.
ScheduledRun megatron_loop(const std::vector<BatchStep>& s, int64_t train_samples) {
  ScheduledRun r;
  while (r.samples < train_samples) {
    r.samples += batch_at(s, r.samples);
    r.iterations += 1;
  }
  return r;
}

TEST(StepBatchSchedule, IterationsMatchMegatronsLoop) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::vector<BatchStep> s = random_schedule(rng, 3, 60);
    const int64_t samples = static_cast<int64_t>(rng() % 400);
    const ScheduledRun want = megatron_loop(s, samples), got = scheduled_run(s, samples);
    EXPECT_EQ(got.iterations, want.iterations) << "trial " << trial;
    EXPECT_EQ(got.samples, want.samples) << "trial " << trial;
  }
}

// The batches Megatron's loop uses from `from` to `to` samples: its
// update_num_microbatches before every iteration, changes recorded.
std::vector<BatchStep> megatron_used(const std::vector<BatchStep>& s, int64_t from, int64_t to) {
  std::vector<BatchStep> used{{from, batch_at(s, from)}};
  for (int64_t c = from; c < to;) {
    const int64_t b = batch_at(s, c);
    if (b != used.back().batch) used.push_back({c, b});
    c += b;
  }
  return used;
}

TEST(StepBatchSchedule, StepsInForceAreTheOnesMegatronsLoopUses) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 300; ++trial) {
    const std::vector<BatchStep> s = random_schedule(rng, 4, 40);
    const int64_t from = static_cast<int64_t>(rng() % 50), to = from + static_cast<int64_t>(rng() % 300);
    const auto want = megatron_used(s, from, to), got = steps_in_force(s, from, to);
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].threshold, want[k].threshold) << "trial " << trial << " step " << k;
      EXPECT_EQ(got[k].batch, want[k].batch) << "trial " << trial << " step " << k;
    }
  }
  // A batch that jumps over a threshold never uses that step.
  const auto jumped = steps_in_force({{0, 8}, {4, 2}, {6, 16}}, 0, 100);
  ASSERT_EQ(jumped.size(), 2u);
  EXPECT_EQ(jumped[1].batch, 16);
  // Without an end: every step the run reaches.
  EXPECT_EQ(steps_in_force({{0, 4}, {1000000000000, 8}}, 0, INT64_MAX).size(), 2u);
}

// The former RampupBatchsizeNumMicroBatchesCalculator.update, line by line.
int64_t ramp(int64_t start, int64_t incr, int64_t samples, int64_t gbs, int64_t consumed) {
  const int64_t n = (gbs - start) / incr;
  const double per = static_cast<double>(samples) / static_cast<double>(n);
  if (consumed > samples) return gbs;
  return start + static_cast<int64_t>(static_cast<double>(consumed) / per) * incr;
}

TEST(RampupBatchSize, EquivalentStepScheduleGivesTheSameBatchAtEverySample) {
  struct Case {
    int64_t start, incr, samples, gbs;
  };
  for (const Case& c : {Case{16, 16, 1000, 64}, Case{32, 32, 5859375, 1536}, Case{8, 8, 3, 80}, Case{1, 3, 100, 31},
                        Case{4, 4, 7, 8}, Case{2, 2, 999, 10}}) {
    const int64_t seq = 7;
    auto text = rampup_as_step_schedule(c.start, c.incr, c.samples, c.gbs, seq);
    ASSERT_TRUE(text.is_ok()) << text.status().message();
    const auto steps = parsed(*text, seq);
    ASSERT_FALSE(steps.empty()) << *text;
    // Every consumed count up to past the ramp (sampled for the long one).
    const int64_t stride = c.samples > 100000 ? 997 : 1;
    for (int64_t x = 0; x <= c.samples + 2; x += stride)
      ASSERT_EQ(batch_at(steps, x), ramp(c.start, c.incr, c.samples, c.gbs, x))
          << "start " << c.start << " incr " << c.incr << " samples " << c.samples << " at " << x << ": " << *text;
  }
}

TEST(RampupBatchSize, RefusesWhatTheRampRefused) {
  EXPECT_FALSE(rampup_as_step_schedule(0, 8, 100, 64, 8).is_ok());   // start must be positive
  EXPECT_FALSE(rampup_as_step_schedule(8, 0, 100, 64, 8).is_ok());   // increment must be positive
  EXPECT_FALSE(rampup_as_step_schedule(8, 8, 0, 64, 8).is_ok());     // 0 / 0.0 in Megatron
  EXPECT_FALSE(rampup_as_step_schedule(128, 8, 100, 64, 8).is_ok()); // start above the global batch
  EXPECT_FALSE(rampup_as_step_schedule(8, 5, 100, 64, 8).is_ok());   // 56 not a multiple of 5
  EXPECT_FALSE(rampup_as_step_schedule(64, 8, 100, 64, 8).is_ok());  // no increment: Megatron divides by 0
  // Too long to write out, or past int64 in tokens: a note instead (quickly).
  EXPECT_NE(rampup_as_step_schedule(1, 1, 1000, 4294967296, 8).status().message().find("4294967295 steps"),
            std::string::npos);
  EXPECT_FALSE(rampup_as_step_schedule(1, 1, INT64_MAX, 3, 1).is_ok());
  EXPECT_FALSE(rampup_as_step_schedule(1, 1, 1000000000000000000, 3, 64).is_ok());
}

// world 16 = TP 2 x PP 2 x DP 4, micro-batch 1: 4 sequences per micro-batch step.
const std::string kBase =
    "--world-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
    "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
    "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 ";

TEST(StepBatchSchedulePlan, PlansTheLastStep) {
  PlanReport r = plan_from(kBase + "--step-batch-size-schedule 0:8,1M:16,2M:32");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  ASSERT_EQ(r.batch_steps.size(), 3u);
  EXPECT_EQ(r.batch_steps[1].threshold, 1000000 / 512);
  EXPECT_EQ(r.global_batch, 32);
  EXPECT_EQ(r.num_microbatches, 8);
  EXPECT_EQ(r.requested_global_batch, 4);  // Megatron's args: micro-batch x DP
  EXPECT_EQ(r.eval_global_batch, 4);
  EXPECT_EQ(r.eval_microbatches, 1);
  EXPECT_DOUBLE_EQ(r.tokens_per_iteration, 32.0 * 512);
}

TEST(StepBatchSchedulePlan, RefusesEachProblem) {
  struct Case {
    std::string extra, rule;
  };
  for (const Case& c : {Case{"--step-batch-size-schedule 0:8 --global-batch-size 8", "step-schedule-global-batch"},
                        Case{"--step-batch-size-schedule 0:8 --decrease-batch-size-if-needed", "step-schedule-decrease"},
                        Case{"--step-batch-size-schedule 0:8,1K:10,2K:14", "step-schedule-divisible"},
                        Case{"--step-batch-size-schedule 0:16,1K:8", "step-schedule-shrinks"},
                        Case{"--step-batch-size-schedule 1K:8", "step-schedule"},
                        // The interleaved rule for each step's micro-batches (PP 2: 1 is too few).
                        Case{"--step-batch-size-schedule 0:4,1K:16 --num-virtual-stages-per-pipeline-rank 2",
                             "interleaved-microbatches"},
                        Case{"--global-batch-size 16 --eval-global-batch-size 6", "eval-global-batch-divisible"},
                        Case{"--global-batch-size 16 --eval-micro-batch-size 2", "eval-micro-batch"},
                        Case{"--global-batch-size 16 --rampup-batch-size 4 4", "rampup-batch-size"},
                        Case{"--global-batch-size 16 --rampup-batch-size 4 4 x", "rampup-batch-size"}}) {
    PlanReport r = plan_from(kBase + c.extra);
    ASSERT_EQ(r.errors.size(), 1u) << c.extra << " -> " << rules_of(r);
    EXPECT_EQ(r.errors[0].rule, c.rule) << c.extra << ": " << r.errors[0].message;
    EXPECT_FALSE(r.errors[0].suggestion.empty()) << c.rule;
  }
}

TEST(StepBatchSchedulePlan, ChecksOnlyTheBatchesTheRunUses) {
  // Resumed at 8 samples on DP 8 (micro-batch 1: 8 a step): the step of 4
  // is behind it, as Megatron allows after scaling up; a fresh run is refused.
  const std::string args = kBase + "--world-size 32 --step-batch-size-schedule 0:4,2K:16,1M:8";
  JobConfig job;
  PlanOptions opts;
  FlagSet flags("megatron plan");
  register_job_flags(flags, job);
  register_plan_option_flags(flags, opts);
  ASSERT_TRUE(flags.parse(testing::split_args(args)).is_ok());
  EXPECT_EQ(rules_of(make_plan(job, opts)), "step-schedule-divisible step-schedule-shrinks ");
  opts.batch_from_samples = 8;
  EXPECT_EQ(rules_of(make_plan(job, opts)), "step-schedule-shrinks ");
  opts.batch_to_samples = 1000000 / 512;  // ends before the step that shrinks
  PlanReport r = make_plan(job, opts);
  ASSERT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.global_batch, 16);
  EXPECT_EQ(r.batch_steps.size(), 3u);
  EXPECT_EQ(r.batch_steps_used.size(), 1u);  // 16 from sample 8 on
}

TEST(StepBatchSchedulePlan, AnInvalidScheduleIsOneProblem) {
  // No interleaved-rule error on the micro-batch x DP fallback.
  for (const char* sched : {"0:5,1K:16", "0:16,1K:8", "1K:8", "0:8e18"}) {
    PlanReport r = plan_from(kBase + "--num-virtual-stages-per-pipeline-rank 2 --step-batch-size-schedule " + sched);
    ASSERT_EQ(r.errors.size(), 1u) << sched << " -> " << rules_of(r);
    EXPECT_EQ(r.errors[0].flags[0], "--step-batch-size-schedule") << sched;
  }
}

TEST(StepBatchSchedulePlan, InterleavedRuleNamesTheStep) {
  PlanReport r = plan_from(kBase + "--step-batch-size-schedule 0:4,1K:16 --num-virtual-stages-per-pipeline-rank 2");
  ASSERT_EQ(r.errors.size(), 1u) << rules_of(r);
  EXPECT_NE(r.errors[0].message.find("the schedule's batch 4"), std::string::npos) << r.errors[0].message;
  EXPECT_EQ(r.errors[0].flags[0], "--step-batch-size-schedule");
}

TEST(DecreaseBatchSize, RoundsDownAndKeepsTheRequestedBatch) {
  PlanReport r = plan_from(kBase + "--global-batch-size 18 --decrease-batch-size-if-needed --eval-global-batch-size 8");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.global_batch, 16);
  EXPECT_EQ(r.num_microbatches, 4);
  EXPECT_EQ(r.requested_global_batch, 18);  // Megatron's args.global_batch_size
  // Megatron's default validation batch is the requested one, which must divide.
  PlanReport d = plan_from(kBase + "--global-batch-size 18 --decrease-batch-size-if-needed");
  EXPECT_EQ(rules_of(d), "eval-global-batch-divisible ");
  // Fewer sequences than one micro-batch step.
  PlanReport z = plan_from(kBase + "--global-batch-size 3 --decrease-batch-size-if-needed --eval-global-batch-size 4");
  EXPECT_EQ(rules_of(z), "global-batch-at-least-one ");
}

TEST(RampupBatchSize, AcceptedWithANoteGivingTheSchedule) {
  PlanReport r = plan_from(kBase + "--global-batch-size 64 --rampup-batch-size 16 16 1000");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.global_batch, 64);  // ignored, as by Megatron
  ASSERT_EQ(r.no_effect.size(), 1u);
  EXPECT_NE(r.no_effect[0].find("\"0:16 171008:32 341504:48 512000:64\""), std::string::npos) << r.no_effect[0];
  PlanReport big = plan_from(kBase + "--global-batch-size 4294967296 --rampup-batch-size 4 4 1000");
  ASSERT_EQ(big.no_effect.size(), 1u);
  EXPECT_NE(big.no_effect[0].find("the ramp has 1073741823 steps"), std::string::npos) << big.no_effect[0];
}

}  // namespace
}  // namespace mt::plan
