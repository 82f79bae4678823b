// Memory: Megatron's estimate against the spec's worked example (§12.9),
// our per-stage count against hand-computed tensor sizes.
#include "plan/memory.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../support/plan_helpers.h"

namespace mt::plan {
namespace {

using testing::plan_from;
using testing::rules_of;

constexpr double kMiB = 1024.0 * 1024.0;

// GPT ~13B: L=40 h=5120 a=40 F=4h, GPT-2 vocab, s=2048, b=1, TP4 PP2 DP4,
// GBS 32 (M=8), SP, selective recompute, distributed optimizer, bf16.
const std::string k13B =
    "--world-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
    "--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 2048 "
    "--max-position-embeddings 2048 --vocab-size 50257 --micro-batch-size 1 --global-batch-size 32 "
    "--sequence-parallel --recompute-granularity selective --use-distributed-optimizer --bf16 ";

double mb2(double bytes) { return std::round(bytes / kMiB * 100) / 100; }  // Megatron prints MB with 2 decimals

TEST(MegatronEstimate, WorkedExample13B) {
  PlanReport r = plan_from(k13B);
  ASSERT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.padded_vocab, 50688);
  EXPECT_EQ(r.megatron_params.per_layer, 314593280);
  EXPECT_EQ(r.megatron_params.embedding, 259522560);
  EXPECT_EQ(r.megatron_params.total, 12843264000);
  const auto& e = r.memory.megatron;
  EXPECT_DOUBLE_EQ(e.params_on_most_loaded_shard, 1638159360.0);
  EXPECT_DOUBLE_EQ(e.weight_and_optimizer_bytes, 14743434240.0);
  EXPECT_DOUBLE_EQ(e.activation_bytes, 3570409472.0);
  EXPECT_TRUE(e.sp_formula);
  EXPECT_DOUBLE_EQ(mb2(e.weight_and_optimizer_bytes), 14060.43);
  EXPECT_DOUBLE_EQ(mb2(e.activation_bytes), 3405.01);
  EXPECT_DOUBLE_EQ(mb2(e.total_bytes()), 17465.44);
}

TEST(MegatronEstimate, WorkedExampleVariants) {
  // Without the distributed optimizer: 18 bytes per parameter.
  PlanReport no_do = plan_from(k13B + "--global-batch-size 32");
  JobConfig j = no_do.job;
  j.parallel.use_distributed_optimizer = false;
  MemoryLayout l{no_do.padded_vocab, 4, 8, 4, 1, 8};
  EXPECT_DOUBLE_EQ(mb2(megatron_theoretical_memory(j, l).weight_and_optimizer_bytes), 28120.87);

  PlanReport vpp = plan_from(k13B + "--num-layers-per-virtual-pipeline-stage 10 --microbatch-group-size-per-virtual-pipeline-stage 2");
  ASSERT_TRUE(vpp.valid()) << rules_of(vpp);
  EXPECT_EQ(vpp.vpp, 2);
  EXPECT_DOUBLE_EQ(mb2(vpp.memory.megatron.activation_bytes), 4256.26);
  EXPECT_EQ(vpp.memory.megatron.printed_in_flight, 3);

  PlanReport m1 = plan_from(k13B + "--global-batch-size 4");
  ASSERT_TRUE(m1.valid()) << rules_of(m1);
  EXPECT_EQ(m1.num_microbatches, 1);
  EXPECT_DOUBLE_EQ(mb2(m1.memory.megatron.activation_bytes), 1702.50);

  for (const char* variant : {"", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"}) {
    // SP off (or no selective recompute): the non-SP formula.
    std::string args = k13B;
    args.replace(args.find("--sequence-parallel "), 20, "");
    if (*variant) args.replace(args.find("--recompute-granularity selective "), 34, "");
    PlanReport ns = plan_from(args + variant);
    ASSERT_TRUE(ns.valid()) << rules_of(ns);
    EXPECT_FALSE(ns.memory.megatron.sp_formula);
    EXPECT_DOUBLE_EQ(mb2(ns.memory.megatron.activation_bytes), 6741.03) << variant;
  }
}

TEST(StageMemory, RealTensorCountsOf13B) {
  // The spec counts the real tensors: 1,649,024,000 per rank on stage 0
  // (biases, position embedding) and 1,638,548,480 on stage 1 (final norm,
  // tied output copy).
  PlanReport r = plan_from(k13B);
  ASSERT_EQ(r.memory.stages.size(), 2u);
  EXPECT_DOUBLE_EQ(r.memory.stages[0].dense_params, 1649024000.0);
  EXPECT_DOUBLE_EQ(r.memory.stages[1].dense_params, 1638548480.0);
  // bf16 with the distributed optimizer over DP 4: 2 + 4 + 12/4 bytes.
  EXPECT_DOUBLE_EQ(r.memory.stages[0].param_bytes, 1649024000.0 * 2);
  EXPECT_DOUBLE_EQ(r.memory.stages[0].grad_bytes, 1649024000.0 * 4);
  EXPECT_DOUBLE_EQ(r.memory.stages[0].optimizer_bytes, 1649024000.0 * 3);
  // Whole stages, before the TP split: they add up to the model, plus the
  // tied output copy the last stage keeps.
  EXPECT_DOUBLE_EQ(r.memory.stages[0].stage_params + r.memory.stages[1].stage_params,
                   r.total_params + 50688.0 * 5120);
  EXPECT_DOUBLE_EQ(r.memory.stages[0].stage_params, 20.0 * r.params.per_layer + 50688.0 * 5120 + 2048.0 * 5120);
  // 1F1B with 8 micro-batches: stage 0 holds 2, stage 1 holds 1.
  EXPECT_EQ(r.memory.stages[0].in_flight, 2);
  EXPECT_EQ(r.memory.stages[1].in_flight, 1);
}

TEST(StageMemory, SmallModelByHand) {
  // L=2, h=64, a=4, F=256, V=128 (already a multiple of 128), s=32, b=2,
  // fp32, LayerNorm, biases, learned positions (max 32), tied, one rank,
  // no dropout.
  PlanReport r = plan_from(
      "--world-size 1 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 --hidden-dropout 0 --attention-dropout 0 --device cpu");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  const double h = 64, F = 256, V = 128, s = 32, b = 2;
  const double per_layer = 2 * 2 * h           // two LayerNorms (weight + bias)
                           + h * 3 * h + 3 * h  // QKV
                           + h * h + h          // projection
                           + h * F + F          // fc1
                           + F * h + h;         // fc2
  EXPECT_EQ(r.params.per_layer, static_cast<int64_t>(per_layer));
  const double total = 2 * per_layer + V * h + 32 * h + 2 * h;  // layers, embedding, positions, final norm
  EXPECT_DOUBLE_EQ(r.total_params, total);
  const StageMemory& st = r.memory.stages[0];
  EXPECT_DOUBLE_EQ(st.dense_params, total);
  EXPECT_DOUBLE_EQ(st.param_bytes, total * 4);
  EXPECT_DOUBLE_EQ(st.grad_bytes, total * 4);
  EXPECT_DOUBLE_EQ(st.optimizer_bytes, total * 8);
  // Saved activations per layer (fp32, flash attention, no masks):
  // ln1 in/out + ln2 in/out 4*sbh, QKV 3*sbh, attention output sbh,
  // log-sum-exp s*b*a, fc1 out s*b*F, GELU out s*b*F.
  const double tok = s * b;
  const double layer = 4 * (4 * tok * h + 3 * tok * h + tok * h + tok * F * 2) + 4 * tok * 4;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(r.job, {r.padded_vocab, 1, 1, 1, 1, 1}, r.job.model.is_moe()), layer);
  // Stage extras: token ids (8*tok), final-norm and output inputs (2*4*tok*h),
  // fp32 logits (4*tok*V), labels and loss mask (12*tok).
  const double extras = 8 * tok + 2 * 4 * tok * h + 4 * tok * V + 12 * tok;
  EXPECT_DOUBLE_EQ(st.activation_per_microbatch, 2 * layer + extras);
  EXPECT_EQ(st.in_flight, 1);
  EXPECT_DOUBLE_EQ(st.activation_bytes, 2 * layer + extras);
  // Model state: fp32 16 bytes per parameter; checkpoint 12 (weights, m, v).
  EXPECT_DOUBLE_EQ(r.memory.model_state_bytes, total * 16);
  EXPECT_DOUBLE_EQ(r.memory.checkpoint_bytes, total * 12);
}

// --moe-layer-freq [0,0,1,1] with PP 2: the first stage holds the two dense
// layers (no experts, no router), the second the two MoE layers; each
// stage's count follows its own layers, and the activations too.
TEST(StageMemory, DenseAndMoeLayersPerStage) {
  PlanReport r = plan_from(
      "--world-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 32 --max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 --global-batch-size 2 "
      "--hidden-dropout 0 --attention-dropout 0 --device cpu --disable-bias-linear --num-experts 4 --moe-router-topk 2 "
      "--moe-ffn-hidden-size 32 --moe-layer-freq [0]*2+[1]*2");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  const double h = 64, F = 256, E = 4, Fe = 32;
  const double attn = 2 * 2 * h + h * 3 * h + h * h;  // LayerNorms, QKV, projection (no biases)
  const double dense = attn + 2 * h * F, moe = attn + E * h + E * 2 * h * Fe;
  EXPECT_EQ(r.params.dense_per_layer, static_cast<int64_t>(dense));
  EXPECT_EQ(r.params.per_layer, static_cast<int64_t>(moe));
  EXPECT_DOUBLE_EQ(r.total_params, 2 * dense + 2 * moe + 128 * h + 32 * h + 2 * h);
  ASSERT_EQ(r.memory.stages.size(), 2u);
  const StageMemory &s0 = r.memory.stages[0], &s1 = r.memory.stages[1];
  EXPECT_DOUBLE_EQ(s0.expert_params, 0);
  EXPECT_DOUBLE_EQ(s0.dense_params, 2 * dense + 128 * h + 32 * h);  // layers, embedding, positions
  EXPECT_DOUBLE_EQ(s1.expert_params, 2 * E * 2 * h * Fe);
  EXPECT_DOUBLE_EQ(s1.dense_params, 2 * (attn + E * h) + 2 * h + 128 * h);  // + final norm, output layer (tied copy)
  const MemoryLayout one{r.padded_vocab, 1, 1, 1, 1, 1};
  const double dense_act = layer_activation_bytes(r.job, one, false), moe_act = layer_activation_bytes(r.job, one, true);
  EXPECT_NE(dense_act, moe_act);
  const double tok = 32 * 2;
  EXPECT_DOUBLE_EQ(s0.activation_per_microbatch, 2 * dense_act + 8 * tok);
  EXPECT_DOUBLE_EQ(s1.activation_per_microbatch, 2 * moe_act + 2 * 4 * tok * h + 4 * tok * 128 + 12 * tok);
  // A pattern of the wrong length is an error naming the flag.
  PlanReport bad = plan_from(
      "--world-size 1 --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 128 "
      "--micro-batch-size 2 --disable-bias-linear --num-experts 4 --moe-layer-freq [1,0,1]");
  EXPECT_FALSE(bad.valid());
  ASSERT_NE(rules_of(bad).find("moe-layer-freq"), std::string::npos) << rules_of(bad);
  bool named = false;
  for (const auto& e : bad.errors) named = named || e.message.find("the list has 3 terms but --num-layers is 4") != std::string::npos;
  EXPECT_TRUE(named);
}

// --moe-shared-expert-gate: one [1, h] weight per MoE layer, replicated, in
// every count (ours per stage and Megatron's).
TEST(StageMemory, SharedExpertGateCounted) {
  const std::string base =
      "--world-size 1 --num-layers 3 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 --device cpu --disable-bias-linear "
      "--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 16 "
      "--moe-layer-freq [1,0,1] ";
  PlanReport plain = plan_from(base), gated = plan_from(base + "--moe-shared-expert-gate");
  ASSERT_TRUE(plain.valid() && gated.valid()) << rules_of(gated);
  const double h = 64, moe_layers = 2;
  EXPECT_DOUBLE_EQ(gated.total_params - plain.total_params, moe_layers * h);
  EXPECT_DOUBLE_EQ(gated.memory.stages[0].dense_params - plain.memory.stages[0].dense_params, moe_layers * h);
  EXPECT_EQ(gated.megatron_params.total - plain.megatron_params.total, static_cast<int64_t>(moe_layers * h));
  PlanReport bad = plan_from("--world-size 1 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                             "--vocab-size 128 --disable-bias-linear --num-experts 4 --moe-shared-expert-gate");
  EXPECT_FALSE(bad.valid());
  EXPECT_NE(rules_of(bad).find("moe-shared-expert-gate-needs-expert"), std::string::npos) << rules_of(bad);
}

// --expert-tensor-parallel-size 1 under TP 2 + SP: each rank routes its
// sequence shard (half the rows, k each) into whole experts, where ETP = TP
// routes the whole sequence into half-width experts: the expert activations
// are the same, the dispatched input [rows, h] half.
TEST(StageMemory, WholeExpertsRouteTheSequenceShard) {
  const std::string base =
      "--world-size 2 --tensor-model-parallel-size 2 --sequence-parallel --num-layers 2 --hidden-size 64 "
      "--num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 "
      "--device cpu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 ";
  PlanReport split = plan_from(base), whole = plan_from(base + "--expert-tensor-parallel-size 1");
  ASSERT_TRUE(split.valid() && whole.valid()) << rules_of(split) << rules_of(whole);
  EXPECT_EQ(split.etp, 2);
  EXPECT_EQ(whole.etp, 1);
  const double tok = 32 * 2, h = 64, k = 2;
  const double a = layer_activation_bytes(split.job, {split.padded_vocab, 1, 1, 2, 1, 1}, true);
  const double b = layer_activation_bytes(whole.job, {whole.padded_vocab, 1, 2, 1, 1, 1}, true);
  EXPECT_DOUBLE_EQ(a - b, 4 * tok * k * h / 2);
}

TEST(StageMemory, RecomputeSequenceParallelAndDistOptShrinkTheRightTerms) {
  const std::string base =
      "--world-size 8 --tensor-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
      "--seq-length 512 --max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --bf16 ";
  PlanReport plain = plan_from(base);
  PlanReport sp = plan_from(base + "--sequence-parallel");
  PlanReport full = plan_from(base + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  PlanReport dopt = plan_from(base + "--use-distributed-optimizer");
  ASSERT_TRUE(plain.valid() && sp.valid() && full.valid() && dopt.valid());
  const auto& p = plain.memory.stages[0];
  EXPECT_LT(sp.memory.stages[0].activation_bytes, p.activation_bytes);
  EXPECT_LT(full.memory.stages[0].activation_bytes, sp.memory.stages[0].activation_bytes);
  EXPECT_DOUBLE_EQ(sp.memory.stages[0].param_bytes, p.param_bytes);
  // Full recompute keeps only each layer's input: 2 bytes x s x b x h per layer.
  EXPECT_GT(full.memory.stages[0].transient_bytes, p.transient_bytes);
  // Distributed optimizer over DP 4: optimizer bytes / 4, weights and grads unchanged.
  EXPECT_DOUBLE_EQ(dopt.memory.stages[0].optimizer_bytes, p.optimizer_bytes / 4);
  EXPECT_DOUBLE_EQ(dopt.memory.stages[0].grad_bytes, p.grad_bytes);
}

TEST(BytesPerParam, MegatronTable) {
  PrecisionConfig fp32, bf16{.bf16 = true}, fp16{.fp16 = true};
  EXPECT_EQ(bytes_per_param(fp32).total(), 16);
  EXPECT_EQ(bytes_per_param(bf16).total(), 18);
  EXPECT_EQ(bytes_per_param(fp16).total(), 20);
  EXPECT_EQ(bytes_per_param(bf16).total(4), 6 + 12.0 / 4);
  EXPECT_EQ(bytes_per_param(fp16).total(8), 4 + 16.0 / 8);
  EXPECT_EQ(bytes_per_param(fp32).total(2), 8 + 8.0 / 2);
  // --optimizer sgd: one fp32 momentum buffer instead of Adam's two moments;
  // none with --sgd-momentum 0.
  EXPECT_EQ(bytes_per_param(bf16, 1).total(), 14);
  EXPECT_EQ(bytes_per_param(fp16, 1).total(), 16);
  EXPECT_EQ(bytes_per_param(fp32, 0).total(), 8);
  EXPECT_EQ((OptimizerChoice{.name = "sgd"}.state_tensors()), 1);
  EXPECT_EQ((OptimizerChoice{.name = "sgd", .sgd_momentum = 0}.state_tensors()), 0);
  EXPECT_EQ(OptimizerChoice{}.state_tensors(), 2);
}

}  // namespace
}  // namespace mt::plan
