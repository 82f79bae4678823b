// Megatron's configuration rules, table-driven: each rule triggered alone
// from a valid base configuration, then several at once.
#include "plan/validate.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "../support/plan_helpers.h"

namespace mt::plan {
namespace {

using testing::plan_from;
using testing::rules_of;

// world 16 = TP 2 x PP 2 x DP 4; 8 layers; global batch 16 -> 4 micro-batches.
const std::string kBase =
    "--world-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
    "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
    "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --global-batch-size 16 ";

TEST(Validate, BaseIsValid) {
  PlanReport r = plan_from(kBase);
  EXPECT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.dp, 4);
  EXPECT_EQ(r.num_microbatches, 4);
}

// Multi-latent attention as Megatron accepts it: learned positions (RoPE
// fusion off) with YaRN, rope positions with --no-rope-fusion and --rope-type
// rope, or with YaRN; the MLA-only sizes alone without it are ignored, as
// Megatron ignores them.
TEST(Validate, MultiLatentAttentionMegatronAccepts) {
  for (const char* extra :
       {"--multi-latent-attention", "--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-layernorm",
        "--multi-latent-attention --position-embedding-type rope --rope-type rope --no-rope-fusion",
        "--multi-latent-attention --position-embedding-type rope --rotary-scaling-factor 40 --mscale-all-dim 1",
        "--kv-lora-rank 64 --q-lora-rank 32", "--multi-latent-attention --add-qkv-bias",
        "--multi-latent-attention --q-lora-rank 64 --mla-down-proj-fusion"}) {
    PlanReport r = plan_from(kBase + extra);
    EXPECT_TRUE(r.valid()) << extra << " -> " << rules_of(r);
  }
}

// Megatron's launch-script flags with no effect here, in combinations
// Megatron accepts: valid (the hierarchical CP sizes with the planner's note).
TEST(Validate, NoEffectFlagsMegatronAccepts) {
  for (const std::string& extra :
       {"--context-parallel-size 2 --world-size 32 --global-batch-size 32 --cp-comm-type a2a+p2p "
        "--hierarchical-context-parallel-sizes 2 1",
        "--num-virtual-stages-per-pipeline-rank 2 --overlap-p2p-communication-warmup-flush",
        "--defer-embedding-wgrad-compute --wgrad-deferral-limit 0 --cross-entropy-fusion-impl native "
        "--cross-entropy-loss-fusion --disable-gloo-process-groups --async-strategy nvrx --te-rng-tracker "
        "--straggler-minmax-count 2"}) {
    PlanReport r = plan_from(kBase + extra);
    EXPECT_TRUE(r.valid()) << extra << " -> " << rules_of(r);
    const bool noted = std::any_of(r.no_effect.begin(), r.no_effect.end(), [](const std::string& n) {
      return n.rfind("--hierarchical-context-parallel-sizes:", 0) == 0;
    });
    EXPECT_EQ(noted, extra.find("hierarchical") != std::string::npos) << extra;
  }
  EXPECT_EQ(plan_from(kBase + "--hierarchical-context-parallel-sizes 16777216 16777216 16777216").errors.size(), 1u)
      << "the product saturates instead of overflowing";
  EXPECT_EQ(plan_from(kBase + "--straggler-minmax-count x").errors.size(), 1u);
}

struct RuleCase {
  std::string extra;  // flags appended to (or overriding) the base
  std::string rule;   // the one rule that must fire
  std::string flag;   // a flag the message must name
};

void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.rule << " <- " << c.extra; }

class SingleRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(SingleRule, FiresAloneAndNamesItsFlags) {
  const RuleCase& c = GetParam();
  PlanReport r = plan_from(kBase + c.extra);
  ASSERT_EQ(r.errors.size(), 1u) << c.extra << " -> " << rules_of(r);
  const Violation& v = r.errors[0];
  EXPECT_EQ(v.rule, c.rule) << v.message;
  EXPECT_NE(std::find(v.flags.begin(), v.flags.end(), c.flag), v.flags.end()) << c.rule << " does not name " << c.flag;
  EXPECT_FALSE(v.message.empty());
  EXPECT_FALSE(v.suggestion.empty()) << c.rule;
}

INSTANTIATE_TEST_SUITE_P(
    Rules, SingleRule,
    ::testing::Values(
        RuleCase{"--world-size 18", "world-divisible", "--world-size"},
        RuleCase{"--data-parallel-size 2", "data-parallel-product", "--data-parallel-size"},
        RuleCase{"--global-batch-size 10", "global-batch-divisible", "--global-batch-size"},
        // Megatron's checks on flags accepted with no effect here.
        RuleCase{"--overlap-param-gather-with-optimizer-step", "overlap-param-gather-with-optimizer-step", "--overlap-param-gather"},
        RuleCase{"--enable-cuda-graph --cuda-graph-impl local", "cuda-graph-flags", "--enable-cuda-graph"},
        RuleCase{"--cuda-graph-impl local --recompute-granularity full --recompute-method uniform --recompute-num-layers 1", "cuda-graph-full-recompute", "--cuda-graph-impl"},
        RuleCase{"--deterministic-mode --cross-entropy-loss-fusion", "deterministic-mode", "--cross-entropy-loss-fusion"},
        RuleCase{"--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", "cross-entropy-fusion-impl", "--cross-entropy-fusion-impl"},
        RuleCase{"--defer-embedding-wgrad-compute --pipeline-model-parallel-size 1 --world-size 8 --global-batch-size 8", "defer-embedding-wgrad-pp", "--pipeline-model-parallel-size"},
        RuleCase{"--defer-embedding-wgrad-compute --no-gradient-accumulation-fusion", "defer-embedding-wgrad-fusion", "--no-gradient-accumulation-fusion"},
        RuleCase{"--defer-embedding-wgrad-compute --wgrad-deferral-limit -1", "wgrad-deferral-limit-negative", "--defer-embedding-wgrad-compute"},
        RuleCase{"--wgrad-deferral-limit two", "wgrad-deferral-limit-integer", "--wgrad-deferral-limit"},
        RuleCase{"--overlap-p2p-communication-warmup-flush", "overlap-p2p-warmup-flush", "--overlap-p2p-communication-warmup-flush"},
        RuleCase{"--hierarchical-context-parallel-sizes 2 2", "hierarchical-cp-sizes-product", "--context-parallel-size"},
        RuleCase{"--hierarchical-context-parallel-sizes 1 x", "hierarchical-cp-sizes-integer", "--hierarchical-context-parallel-sizes"},
        RuleCase{"--num-attention-heads 6 --hidden-size 384 --tensor-model-parallel-size 4 --world-size 32 --global-batch-size 32 --num-query-groups 2 --group-query-attention --num-attention-heads 10 --hidden-size 640", "heads-divisible", "--num-attention-heads"},
        RuleCase{"--group-query-attention --num-query-groups 3 --num-attention-heads 12 --hidden-size 384", "query-groups-tp", "--num-query-groups"},
        RuleCase{"--group-query-attention --num-query-groups 4 --num-attention-heads 6 --hidden-size 384", "heads-per-group", "--num-query-groups"},
        RuleCase{"--hidden-size 260 --ffn-hidden-size 1024", "hidden-heads", "--hidden-size"},
        RuleCase{"--ffn-hidden-size 1023", "ffn-divisible", "--ffn-hidden-size"},
        RuleCase{"--max-position-embeddings 256", "seq-vs-positions", "--max-position-embeddings"},
        RuleCase{"--num-layers 7", "layers-divisible", "--num-layers"},
        RuleCase{"--num-layers-per-virtual-pipeline-stage 3", "vpp-layers-divisible", "--num-layers-per-virtual-pipeline-stage"},
        RuleCase{"--num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2", "one-vpp-spec", "--num-virtual-stages-per-pipeline-rank"},
        RuleCase{"--num-virtual-stages-per-pipeline-rank 2 --global-batch-size 12", "interleaved-microbatches", "--global-batch-size"},
        RuleCase{"--num-virtual-stages-per-pipeline-rank 2 --pipeline-model-parallel-size 1 --world-size 8 --global-batch-size 8", "vpp-needs-pp", "--pipeline-model-parallel-size"},
        RuleCase{"--num-virtual-stages-per-pipeline-rank 3", "vpp-stages-divisible", "--num-virtual-stages-per-pipeline-rank"},
        RuleCase{"--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 4", "pipeline-split", "--decoder-first-pipeline-num-layers"},
        RuleCase{"--decoder-first-pipeline-num-layers 4 --num-layers-per-virtual-pipeline-stage 2", "uneven-with-vpp-layers", "--num-layers-per-virtual-pipeline-stage"},
        RuleCase{"--context-parallel-size 2 --world-size 32 --seq-length 510 --max-position-embeddings 512", "cp-seq-divisible", "--context-parallel-size"},
        RuleCase{"--cp-comm-type ring", "cp-comm-type", "--cp-comm-type"},
        RuleCase{"--cp-comm-type p2p a2a", "cp-comm-type-layers", "--cp-comm-type"},
        RuleCase{"--cp-comm-type a2a+p2p", "cp-comm-type-hierarchical", "--cp-comm-type"},
        RuleCase{"--sequence-parallel --tensor-model-parallel-size 1 --world-size 8 --global-batch-size 8", "sp-needs-tp", "--sequence-parallel"},
        RuleCase{"--sequence-parallel --seq-length 511", "sp-seq-divisible", "--seq-length"},
        RuleCase{"--recompute-granularity selective --recompute-method uniform", "recompute-selective-method", "--recompute-method"},
        RuleCase{"--recompute-granularity selective --recompute-num-layers 1", "recompute-selective-layers", "--recompute-num-layers"},
        RuleCase{"--recompute-granularity full --recompute-num-layers 1", "recompute-full-method", "--recompute-method"},
        RuleCase{"--recompute-granularity full --recompute-method block", "recompute-full-layers", "--recompute-num-layers"},
        RuleCase{"--recompute-granularity full --recompute-method block --recompute-num-layers 5", "recompute-num-layers-range", "--recompute-num-layers"},
        RuleCase{"--recompute-method uniform", "recompute-granularity-missing", "--recompute-granularity"},
        RuleCase{"--recompute-modules core_attn", "recompute-modules-selective", "--recompute-modules"},
        RuleCase{"--recompute-granularity selective --recompute-modules moe_act mlp", "recompute-modules-known", "--recompute-modules"},
        RuleCase{"--bf16 --fp16", "precision", "--fp16"},
        RuleCase{"--fp32-residual-connection", "fp32-residual-needs-half", "--fp32-residual-connection"},
        RuleCase{"--expert-model-parallel-size 2", "moe-experts-required", "--num-experts"},
        RuleCase{"--num-experts 6 --disable-bias-linear --expert-model-parallel-size 4", "moe-experts-divisible", "--num-experts"},
        RuleCase{"--num-experts 4 --disable-bias-linear --moe-router-topk 5", "moe-topk", "--moe-router-topk"},
        RuleCase{"--num-experts 4 --disable-bias-linear --moe-shared-expert-intermediate-size 1023", "moe-shared-expert-divisible", "--moe-shared-expert-intermediate-size"},
        RuleCase{"--moe-shared-expert-intermediate-size 1024", "moe-shared-expert-needs-experts", "--num-experts"},
        RuleCase{"--num-experts 4 --disable-bias-linear --moe-router-enable-expert-bias", "moe-expert-bias-sigmoid", "--moe-router-score-function"},
        RuleCase{"--num-experts 4 --disable-bias-linear --expert-model-parallel-size 4 --expert-tensor-parallel-size 4", "expert-grid-divisible", "--expert-model-parallel-size"},
        RuleCase{"--num-experts 4", "moe-bias-etp", "--disable-bias-linear"},
        RuleCase{"--num-experts 4 --disable-bias-linear --moe-router-topk 1", "moe-top1-pre-softmax", "--moe-router-pre-softmax"},
        RuleCase{"--num-experts 4 --disable-bias-linear --moe-router-group-topk 1", "moe-group-routing", "--moe-router-num-groups"},
        RuleCase{"--multi-latent-attention --group-query-attention --num-query-groups 2", "mla-gqa", "--group-query-attention"},
        RuleCase{"--multi-latent-attention --rotary-interleaved", "mla-rotary-interleaved", "--rotary-interleaved"},
        RuleCase{"--multi-latent-attention --position-embedding-type rope --rope-type rope", "mla-rope-fusion", "--no-rope-fusion"},
        RuleCase{"--multi-latent-attention --qk-pos-emb-head-dim 7", "mla-pos-dims-even", "--qk-pos-emb-head-dim"},
        RuleCase{"--multi-latent-attention --rope-type rope --rotary-percent 0.01", "mla-rotary-percent", "--rotary-percent"},
        RuleCase{"--multi-latent-attention --v-head-dim 200", "mla-v-head-dim", "--v-head-dim"},
        RuleCase{"--multi-latent-attention --qk-layernorm", "mla-qk-norm-without-q-lora", "--q-lora-rank"},
        RuleCase{"--rope-type yarn", "rope-type-yarn-without-mla", "--rope-type"},
        RuleCase{"--multi-latent-attention --mla-down-proj-fusion", "mla-down-proj-fusion", "--q-lora-rank"},
        RuleCase{"--recompute-granularity selective --recompute-modules mla_up_proj", "recompute-mla-up-proj", "--multi-latent-attention"},
        RuleCase{"--overlap-param-gather", "overlap-param-gather", "--use-distributed-optimizer"},
        RuleCase{"--distribute-saved-activations", "distribute-saved-activations", "--distribute-saved-activations"},
        RuleCase{"--num-parameters 13e9", "num-parameters-with-architecture", "--num-parameters"},
        RuleCase{"--mtp-num-layers 1", "mtp-position-embedding", "--position-embedding-type"},
        RuleCase{"--mtp-num-layers 1 --position-embedding-type rope --hidden-size 255 --kv-channels 32",
                 "mtp-hidden-divisible", "--hidden-size"},
        RuleCase{"--mtp-num-layers 1 --position-embedding-type rope --recompute-granularity full --recompute-method "
                 "uniform --recompute-num-layers 2",
                 "mtp-recompute-num-layers", "--recompute-num-layers"},
        // The last virtual stage holds only the loss: Megatron's MTP layer is MoE there, the last layer dense.
        RuleCase{"--mtp-num-layers 1 --position-embedding-type rope --num-layers 2 --num-experts 4 --disable-bias-linear "
                 "--moe-layer-freq [1]+[0] --num-virtual-stages-per-pipeline-rank 2 "
                 "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
                 "mtp-layer-kind", "--moe-layer-freq"}),
    [](const ::testing::TestParamInfo<RuleCase>& info) {
      std::string n = info.param.rule;
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

// Group-limited routing: the groups must divide the experts.
TEST(Validate, MoeGroupsDivideTheExperts) {
  PlanReport r = plan_from(kBase + "--num-experts 4 --disable-bias-linear --moe-router-num-groups 3 --moe-router-group-topk 1");
  ASSERT_EQ(r.errors.size(), 1u) << rules_of(r);
  EXPECT_EQ(r.errors[0].rule, "moe-group-routing");
  EXPECT_NE(r.errors[0].message.find("4 experts in 3 groups"), std::string::npos) << r.errors[0].message;
  EXPECT_TRUE(plan_from(kBase + "--num-experts 4 --disable-bias-linear --moe-router-num-groups 2 --moe-router-group-topk 1").valid());
}

TEST(Validate, RequiredFlagsEachNamed) {
  PlanReport r = plan_from("--world-size 8");
  std::string rules = rules_of(r);
  for (const char* flag : {"--seq-length", "--num-layers", "--hidden-size", "--num-attention-heads",
                           "--max-position-embeddings", "--micro-batch-size", "--vocab-size"}) {
    bool named = false;
    for (const auto& e : r.errors)
      for (const auto& f : e.flags) named |= f == flag;
    EXPECT_TRUE(named) << flag << " not reported; rules: " << rules;
  }
}

TEST(Validate, SeveralRulesAtOnce) {
  PlanReport r = plan_from(kBase + "--world-size 18 --num-layers 7 --max-position-embeddings 256 --bf16 --fp16 --ffn-hidden-size 1023");
  std::string rules = rules_of(r);
  for (const char* rule : {"world-divisible", "layers-divisible", "seq-vs-positions", "precision", "ffn-divisible"})
    EXPECT_NE(rules.find(rule), std::string::npos) << rule << " missing from " << rules;
  EXPECT_EQ(r.errors.size(), 5u) << rules;
}

TEST(Validate, SeedInvalidVariantNamesTheThreeFlags) {
  // TP=4, PP=2, DP=4 on 30 GPUs.
  PlanReport r = plan_from("--world-size 30 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
                           "--data-parallel-size 4 --num-parameters 13e9 --seq-length 2048 --micro-batch-size 2 --global-batch-size 64");
  ASSERT_FALSE(r.valid());
  bool found = false;
  for (const auto& e : r.errors) {
    if (e.rule != "data-parallel-product") continue;
    found = true;
    for (const char* f : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--data-parallel-size"})
      EXPECT_NE(std::find(e.flags.begin(), e.flags.end(), f), e.flags.end()) << f;
    EXPECT_NE(e.message.find("32"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("30"), std::string::npos) << e.message;
    EXPECT_NE(e.suggestion.find("--world-size 32"), std::string::npos) << e.suggestion;
  }
  EXPECT_TRUE(found) << rules_of(r);
}

TEST(Validate, SuggestionsAreLegal) {
  // Applying the suggested world size makes the configuration valid.
  PlanReport bad = plan_from(kBase + "--world-size 18");
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].suggestion.find("--world-size 16"), std::string::npos) << bad.errors[0].suggestion;
  PlanReport gbs = plan_from(kBase + "--global-batch-size 10");
  EXPECT_NE(gbs.errors[0].suggestion.find("--global-batch-size 8"), std::string::npos) << gbs.errors[0].suggestion;
  EXPECT_NE(gbs.errors[0].suggestion.find("--global-batch-size 12"), std::string::npos) << gbs.errors[0].suggestion;
  PlanReport heads = plan_from(kBase + "--num-attention-heads 12 --hidden-size 384 --tensor-model-parallel-size 8 --world-size 64 --global-batch-size 16");
  ASSERT_FALSE(heads.valid());
  EXPECT_EQ(heads.errors[0].rule, "heads-divisible");
  EXPECT_NE(heads.errors[0].suggestion.find("--tensor-model-parallel-size 6"), std::string::npos) << heads.errors[0].suggestion;
}

TEST(Validate, QueryGroupsFewerThanTpIsAllowedWithReplication) {
  PlanReport r = plan_from(kBase + "--group-query-attention --num-query-groups 1");
  EXPECT_TRUE(r.valid()) << rules_of(r);
  ASSERT_FALSE(r.warnings.empty());
}

TEST(Validate, Helpers) {
  EXPECT_EQ(nearby_multiples(8, 30), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(nearby_multiples(8, 26), (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(nearby_multiples(8, 3), (std::vector<int64_t>{8}));
  EXPECT_EQ(nearby_multiples(8, 16), (std::vector<int64_t>{16}));
  EXPECT_EQ(nearest_divisor(12, 8), 6);
  EXPECT_EQ(nearest_divisor(40, 3), 4);
  EXPECT_EQ(nearest_divisor(7, 3), 1);
}

}  // namespace
}  // namespace mt::plan
