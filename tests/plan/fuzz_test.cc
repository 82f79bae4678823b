// Random flag combinations: the planner always answers valid or invalid, and
// never crashes, hangs or prints a non-finite number.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../support/plan_helpers.h"
#include "plan/render.h"

namespace mt::plan {
namespace {

bool all_finite(const nlohmann::json& j) {
  if (j.is_number_float()) return std::isfinite(j.get<double>());
  if (j.is_structured())
    for (const auto& v : j)
      if (!all_finite(v)) return false;
  return true;
}

TEST(PlanFuzz, RandomCombinationsNeverCrash) {
  std::mt19937_64 rng(20261129);
  const std::vector<std::string> int_flags = {
      "world-size", "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
      "expert-model-parallel-size", "expert-tensor-parallel-size", "data-parallel-size",
      "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
      "microbatch-group-size-per-virtual-pipeline-stage", "decoder-first-pipeline-num-layers",
      "decoder-last-pipeline-num-layers", "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads",
      "kv-channels", "num-query-groups", "seq-length", "max-position-embeddings", "vocab-size",
      "make-vocab-size-divisible-by", "micro-batch-size", "global-batch-size", "num-experts", "moe-router-topk",
      "moe-ffn-hidden-size", "recompute-num-layers", "gpus-per-node"};
  const std::vector<std::string> switches = {
      "sequence-parallel", "use-distributed-optimizer", "bf16", "fp16", "swiglu", "group-query-attention",
      "untie-embeddings-and-output-weights", "disable-bias-linear", "use-tp-pp-dp-mapping", "overlap-grad-reduce",
      "overlap-param-gather", "no-overlap-p2p-communication", "account-for-embedding-in-pipeline-split",
      "account-for-loss-in-pipeline-split", "recompute-activations", "distribute-saved-activations"};
  const std::vector<std::string> values = {"0", "-1", "1", "2", "3", "4", "7", "8", "12", "16", "64", "96", "128",
                                           "1000", "4096", "65536", "1e3", "abc", "", "99999999999999999999",
                                           "9223372036854775807", "16777216", "2.5"};
  int valid = 0, invalid = 0, flag_errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> args;
    // Mostly start from a complete model so that perturbations reach the
    // later stages of the planner (memory, schedule, throughput).
    if (rng() % 4 != 0)
      args = testing::split_args("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
                                 "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1");
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) {
      switch (rng() % 5) {
        case 0:
          args.push_back("--" + switches[rng() % switches.size()]);
          break;
        case 1:
          args.push_back("--recompute-granularity");
          args.push_back(rng() % 2 ? "full" : "selective");
          if (rng() % 2) args.insert(args.end(), {"--recompute-method", rng() % 2 ? "uniform" : "block"});
          break;
        default: {
          args.push_back("--" + int_flags[rng() % int_flags.size()]);
          // mostly small sane numbers, sometimes garbage
          if (rng() % 6 == 0) args.push_back(values[rng() % values.size()]);
          else args.push_back(std::to_string(1 << (rng() % 12)));
        }
      }
    }
    JobConfig job;
    PlanOptions opts;
    opts.device = rng() % 2 ? "h100" : "cpu";
    FlagSet flags("megatron plan");
    register_job_flags(flags, job);
    register_plan_option_flags(flags, opts);
    if (!flags.parse(args)) {
      ++flag_errors;
      continue;
    }
    PlanReport r = make_plan(job, opts);
    nlohmann::json j = to_json(r);
    std::string text = render_text(r);
    ASSERT_FALSE(text.empty());
    if (r.valid()) {
      ++valid;
      ASSERT_TRUE(all_finite(j)) << testing::rules_of(r);
      ASSERT_GE(r.memory.peak_bytes, 0);
      ASSERT_GT(r.throughput.step_time_s, 0);
    } else {
      ++invalid;
      for (const auto& e : r.errors) ASSERT_FALSE(e.message.empty());
    }
  }
  std::printf("fuzz: %d valid, %d invalid, %d rejected at flag parsing\n", valid, invalid, flag_errors);
  // The generator must exercise every outcome.
  EXPECT_GT(valid, 20);
  EXPECT_GT(invalid, 100);
  EXPECT_GT(flag_errors, 100);
}

TEST(PlanFuzz, HugeValuesDoNotOverflow) {
  for (const char* args : {
           "--world-size 16777216 --tensor-model-parallel-size 16777216 --pipeline-model-parallel-size 16777216 "
           "--context-parallel-size 16777216 --data-parallel-size 16777216 --micro-batch-size 1 --seq-length 8",
           "--num-layers 65536 --hidden-size 16777216 --num-attention-heads 65536 --ffn-hidden-size 16777216 "
           "--seq-length 67108864 --max-position-embeddings 67108864 --vocab-size 4294967296 --micro-batch-size 16777216 "
           "--global-batch-size 4294967296 --num-experts 1048576 --moe-router-topk 1048576",
           "--world-size 16777216 --num-layers 1 --hidden-size 1 --num-attention-heads 1 --seq-length 1 "
           "--max-position-embeddings 1 --vocab-size 1 --micro-batch-size 16777216 --make-vocab-size-divisible-by 1048576 "
           "--tensor-model-parallel-size 16777216"}) {
    PlanReport r = testing::plan_from(args);
    nlohmann::json j = to_json(r);
    if (r.valid()) EXPECT_TRUE(all_finite(j)) << args;
    else EXPECT_FALSE(r.errors.empty());
  }
}

}  // namespace
}  // namespace mt::plan
