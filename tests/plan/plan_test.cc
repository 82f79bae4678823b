// The planner end to end on the seeds' examples: the calculator example, the
// LLaMA parallel-configuration table, FLOPs, throughput and the renderers.
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "../support/plan_helpers.h"
#include "model/gpt.h"
#include "plan/render.h"

namespace mt::plan {
namespace {

using testing::plan_from;
using testing::rules_of;

TEST(SeedCalculator, ReproducesEveryNumber) {
  // 32 GPUs, TP=4, PP=2 -> DP=4; micro 2 x DP 4 x accumulation 8 = 64;
  // 13e9 parameters x 16 bytes = 208 GB; bubble P=2, M=8 = 0.111;
  // 64 x 2048 tokens / 0.8 s = 163,840 tokens/s.
  PlanReport r = plan_from(
      "--world-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --num-parameters 13e9 "
      "--seq-length 2048 --micro-batch-size 2 --global-batch-size 64 --step-time 0.8");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  EXPECT_EQ(r.dp, 4);
  EXPECT_EQ(r.job.batch.micro_batch_size * r.dp * r.num_microbatches, 64);
  EXPECT_EQ(r.num_microbatches, 8);
  EXPECT_EQ(r.global_batch, 64);
  EXPECT_EQ(r.memory.model_state_bytes_per_param, 16);
  EXPECT_DOUBLE_EQ(r.memory.model_state_bytes, 208e9);
  EXPECT_DOUBLE_EQ(r.bubble_formula, 1.0 / 9.0);
  EXPECT_EQ(std::round(r.bubble_formula * 1000) / 1000, 0.111);
  EXPECT_NEAR(r.bubble_simulated, 1.0 / 9.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.tokens_per_iteration, 64.0 * 2048);
  EXPECT_DOUBLE_EQ(r.throughput.tokens_per_s, 163840.0);
  EXPECT_TRUE(r.throughput.measured);

  const std::string text = render_text(r);
  for (const char* s : {"TP x PP x CP x DP   4 x 2 x 1 x 4 = 32", "micro-batch 2 x DP 4 x accumulation 8 = global batch 64",
                        "x 16 bytes = 208.0 GB", "= 1/9 = 0.111", "163,840 tokens/s"})
    EXPECT_NE(text.find(s), std::string::npos) << "missing '" << s << "' in\n" << text;
}

struct LlamaRow {
  std::string name, arch, layout;
  bool fits_as_given;
  std::string cheapest_fit;  // first option set that fits 80 GB ("" = none)
};

// Public LLaMA configurations (Llama-2 7B/13B/70B, Llama-3.1 405B), bf16,
// micro-batch 1, the seed's parallel layouts.
const std::string kLlama =
    "--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear "
    "--untie-embeddings-and-output-weights --bf16 --micro-batch-size 1 --device h100 ";
const std::vector<LlamaRow> kLlamaTable = {
    {"7B", "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 --seq-length 4096 "
           "--max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024",
     "--world-size 8 --tensor-model-parallel-size 1", false, "--use-distributed-optimizer"},
    {"13B", "--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --ffn-hidden-size 13824 --seq-length 4096 "
            "--max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024",
     "--world-size 8 --tensor-model-parallel-size 2", false, "--use-distributed-optimizer"},
    {"70B", "--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --group-query-attention --num-query-groups 8 "
            "--ffn-hidden-size 28672 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024",
     "--world-size 64 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4", false,
     "--use-distributed-optimizer --sequence-parallel"},
    {"405B", "--num-layers 126 --hidden-size 16384 --num-attention-heads 128 --group-query-attention --num-query-groups 8 "
             "--ffn-hidden-size 53248 --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --global-batch-size 512 "
             "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--world-size 128 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 2", false,
     "--sequence-parallel --use-distributed-optimizer --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"},
};

TEST(LlamaTable, PlansValidAndStatesWhatFits80GB) {
  const double expected_params[] = {6738415616, 13015864320, 68980842496, 405878554624};
  for (size_t i = 0; i < kLlamaTable.size(); ++i) {
    const LlamaRow& row = kLlamaTable[i];
    PlanReport r = plan_from(kLlama + row.arch + " " + row.layout);
    ASSERT_TRUE(r.valid()) << row.name << ": " << rules_of(r);
    EXPECT_DOUBLE_EQ(r.total_params, expected_params[i]) << row.name;
    EXPECT_NEAR(r.memory.device_bytes / 1e9, 85.5, 0.1);  // H100 80GB: 81559 MiB
    ASSERT_FALSE(r.fit_options.empty());
    EXPECT_EQ(r.fit_options[0].options, "as given");
    EXPECT_EQ(r.fit_options[0].fits, row.fits_as_given) << row.name;
    std::string cheapest;
    for (const auto& f : r.fit_options)
      if (f.fits) {
        cheapest = f.options;
        break;
      }
    EXPECT_EQ(cheapest, row.cheapest_fit) << row.name;
    // Each cheaper option set lowers the peak, never raises it.
    EXPECT_LE(r.fit_options.back().peak_bytes, r.fit_options.front().peak_bytes) << row.name;
  }
}

TEST(LlamaTable, SeedRowThatMultipliesTo256IsRejected) {
  // The seed's 405B row: 128 GPUs with TP8 PP8 DP2 CP2 multiplies to 256.
  PlanReport r = plan_from(kLlama + kLlamaTable[3].arch + " " + kLlamaTable[3].layout + " --data-parallel-size 2");
  ASSERT_FALSE(r.valid());
  ASSERT_EQ(r.errors.size(), 1u) << rules_of(r);
  const Violation& v = r.errors[0];
  EXPECT_EQ(v.rule, "data-parallel-product");
  EXPECT_NE(v.message.find("256"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("128"), std::string::npos) << v.message;
  EXPECT_NE(v.suggestion.find("--world-size 256"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("--data-parallel-size 1"), std::string::npos) << v.suggestion;
}

TEST(Flops, MatchesClassicClosedForm) {
  // MHA, F = 4h, no MoE: 72 B s L h^2 (1 + s/(12h) + V/(12hL)).
  PlanReport r = plan_from(
      "--world-size 8 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
      "--max-position-embeddings 2048 --vocab-size 50257 --micro-batch-size 4 --global-batch-size 64");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  const double B = 64, s = 2048, L = 24, h = 2048, V = 50304;
  const double classic = 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * h * L));
  EXPECT_NEAR(r.flops_per_iteration / classic, 1.0, 1e-12);
}

TEST(Flops, GqaSwigluAndMoeTerms) {
  model::ModelConfig m;
  m.num_layers = 2, m.hidden_size = 64, m.num_attention_heads = 8, m.seq_length = 16;
  m.group_query_attention = true, m.num_query_groups = 2, m.swiglu = true, m.ffn_hidden_size = 128;
  // q = 64, k = 16: per token 6h(3*F*L) + L*6*(h(q+2k) + q h) + 6hV, plus B s^2 L 6 q.
  const double T = 4 * 16, V = 256;
  const double expect = T * (6 * 64 * 3 * 128 * 2 + 2 * 6 * (64 * (64 + 32) + 64 * 64) + 6 * 64 * V) + 4 * 16 * 16 * 2 * 6 * 64;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), expect);
  m.num_experts = 8, m.moe_router_topk = 2, m.moe_ffn_hidden_size = 32;
  const double moe = T * (6 * 64 * 3 * 32 * 2 * 2 + 2 * 6 * (64 * (64 + 32) + 64 * 64) + 6 * 64 * V) + 4 * 16 * 16 * 2 * 6 * 64;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), moe);
  // --moe-layer-freq [0,1]: layer 0's MLP dense (F = 128), layer 1's the
  // top-2 experts of 32 and a shared expert of 16 (Megatron's num_dense_layers
  // and num_moe_layers terms).
  m.moe_layer_freq = "[0,1]", m.moe_shared_expert_intermediate_size = 16;
  const double mixed = T * (6 * 64 * 3 * (128 + 32 * 2 + 16) + 2 * 6 * (64 * (64 + 32) + 64 * 64) + 6 * 64 * V) +
                       4 * 16 * 16 * 2 * 6 * 64;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), mixed);
}

// --multi-latent-attention: Megatron's MLA branch of
// num_floating_point_operations, written out: per token and layer 6 x (q
// rank (h + a (dn + dr) + 1) + kv rank (h + a (dn + dv) + 1) + h dr + a dv h),
// and per (token, position) 6 x (a (dn + dr) / 2 + a dv / 2); without a q
// rank, h a (dn + dr) for the query.
TEST(Flops, MultiLatentAttentionTerms) {
  model::ModelConfig m;
  m.num_layers = 2, m.hidden_size = 64, m.num_attention_heads = 4, m.seq_length = 16, m.ffn_hidden_size = 128;
  m.multi_latent_attention = true, m.q_lora_rank = 24, m.kv_lora_rank = 16, m.qk_head_dim = 8;
  m.qk_pos_emb_head_dim = 4, m.v_head_dim = 6;
  const double T = 4 * 16, V = 256, h = 64, a = 4;
  const double mlp = 6 * h * 2 * 128 * 2, logits = 6 * h * V;
  const double attn = 6 * (24 * (h + a * 12 + 1) + 16 * (h + a * (8 + 6) + 1) + h * 4 + a * 6 * h);
  const double core = 6 * (a * 12 / 2 + a * 6 / 2);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), T * (mlp + 2 * attn + logits) + 4 * 16 * 16 * 2 * core);
  m.q_lora_rank.reset();
  const double attn_q = 6 * (h * a * 12 + 16 * (h + a * (8 + 6) + 1) + h * 4 + a * 6 * h);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), T * (mlp + 2 * attn_q + logits) + 4 * 16 * 16 * 2 * core);
}

// --mtp-num-layers, Megatron's terms: the MTP layers counted with the
// decoder's (attention, and the MLP of the last layer's kind), each depth's
// norms (3h) and eh_proj (2h^2), and one more logit computation per depth.
TEST(Flops, MultiTokenPredictionTerms) {
  model::ModelConfig m;
  m.num_layers = 2, m.hidden_size = 64, m.num_attention_heads = 4, m.seq_length = 16, m.ffn_hidden_size = 128;
  const double T = 4 * 16, V = 256, h = 64, F = 128;
  const double attn = 6 * (h * 3 * h + h * h), core = 6 * h, mlp = 6 * h * 2 * F, logits = 6 * h * V;
  const double base = T * (2 * (mlp + attn) + logits) + 4 * 16 * 16 * 2 * core;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4), base);
  m.mtp_num_layers = 2;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4),
                   T * (4 * (mlp + attn) + 6 * 2 * (3 * h + 2 * h * h) + 3 * logits) + 4 * 16 * 16 * 4 * core);
  // MoE as the last layer: the MTP layers' MLP is the top-k experts'.
  m.num_experts = 4, m.moe_router_topk = 2, m.moe_ffn_hidden_size = 32, m.moe_layer_freq = "[0]+[1]";
  const double moe = 6 * h * 2 * (2 * 32);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(m, 256, 4),
                   T * (mlp + 3 * moe + 4 * attn + 6 * 2 * (3 * h + 2 * h * h) + 3 * logits) + 4 * 16 * 16 * 4 * core);
}

// The plan's text and JSON name the MTP layers; the last stage holds them
// (its buffers larger than without), and the embedding group's traffic
// appears with untied embeddings.
TEST(Render, MultiTokenPrediction) {
  const std::string flags =
      "--world-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 32 --max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 --global-batch-size 8 "
      "--device cpu --position-embedding-type rope --untie-embeddings-and-output-weights";
  PlanReport a = testing::plan_from(flags), b = testing::plan_from(flags + " --mtp-num-layers 2");
  ASSERT_TRUE(a.valid() && b.valid()) << testing::rules_of(b);
  const std::string text = render_text(b);
  EXPECT_NE(text.find("multi-token pred.   2 MTP layers on the last stage (like layer 3), loss weight 0.1"),
            std::string::npos)
      << text;
  EXPECT_EQ(to_json(b)["model"]["multi_token_prediction"]["mtp_num_layers"], 2);
  EXPECT_EQ(b.memory.trainer_stages[0].params, a.memory.trainer_stages[0].params) << "the first stage holds none";
  EXPECT_GT(b.memory.trainer_stages[1].params, a.memory.trainer_stages[1].params);
  EXPECT_GT(b.memory.trainer_stages[1].activations, a.memory.trainer_stages[1].activations);
  EXPECT_GT(b.comm_stages[0].pp_bytes, a.comm_stages[0].pp_bytes) << "the embedding group's all-reduce";
  PlanReport bad = testing::plan_from(flags + " --mtp-num-layers 1 --position-embedding-type learned_absolute");
  EXPECT_FALSE(bad.valid());
  EXPECT_NE(testing::rules_of(bad).find("mtp-position-embedding"), std::string::npos) << testing::rules_of(bad);
}

// The trainer's buffers and traffic for every pipeline rank: with
// DeepSeek-style dense first layers (--moe-layer-freq [0,0,1,1], PP 2, EP 2)
// pipeline rank 0 holds no experts and sends no tokens over EP, rank 1 holds
// and sends them all; the text names the most loaded rank beside rank 0.
TEST(TrainerPlan, EveryPipelineRankAndTheMostLoaded) {
  PlanReport r = testing::plan_from(
      "--world-size 4 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --num-layers 4 --hidden-size 64 "
      "--num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 128 --micro-batch-size 2 "
      "--global-batch-size 8 --device cpu --disable-bias-linear --num-experts 4 --moe-router-topk 2 "
      "--moe-ffn-hidden-size 256 --moe-layer-freq [0]*2+[1]*2");
  ASSERT_TRUE(r.valid()) << testing::rules_of(r);
  ASSERT_EQ(r.memory.trainer_stages.size(), 2u);
  ASSERT_EQ(r.comm_stages.size(), 2u);
  for (int64_t p = 0; p < 2; ++p) {  // each rank's figure is its own model's size tables
    auto go = trainer_model_options(r, p);
    ASSERT_TRUE(go.is_ok());
    auto mp = model::GPTModel::planned_bytes(r.job.model, *go);
    ASSERT_TRUE(mp.is_ok());
    const TrainerBuffers& t = r.memory.trainer_stages[static_cast<size_t>(p)];
    EXPECT_EQ(t.params, static_cast<double>(mp->params));
    EXPECT_EQ(t.activations, static_cast<double>(mp->activations));
    EXPECT_EQ(t.scratch, static_cast<double>(mp->scratch));
    EXPECT_EQ(mp->expert_params > 0, p == 1) << "only rank 1 holds MoE layers";
  }
  EXPECT_EQ(r.memory.trainer.total(), r.memory.trainer_stages[0].total());
  EXPECT_EQ(r.comm_stages[0].ep_bytes, 0.0);
  EXPECT_GT(r.comm_stages[1].ep_bytes, 0.0);
  EXPECT_EQ(r.comm.ep_bytes, r.comm_stages[0].ep_bytes);
  EXPECT_EQ(r.memory.trainer_peak_stage, 1);
  const std::string text = render_text(r);
  EXPECT_NE(text.find("this build's CPU trainer, pipeline rank 0: "), std::string::npos) << text;
  EXPECT_NE(text.find("this build's CPU trainer, pipeline rank 1 (the most loaded): "), std::string::npos) << text;
  EXPECT_NE(text.find("(this build's trainer, pipeline rank 1, the busiest)"), std::string::npos) << text;
}

TEST(Throughput, PredictedAndMeasured) {
  const std::string base =
      "--world-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 1024 "
      "--num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --micro-batch-size 1 "
      "--global-batch-size 32 --bf16 --device a100 ";
  PlanReport pred = plan_from(base + "--assumed-efficiency 0.5");
  ASSERT_TRUE(pred.valid());
  EXPECT_FALSE(pred.throughput.measured);
  EXPECT_DOUBLE_EQ(pred.throughput.peak_tflops, 312);
  // MFU = efficiency x (1 - bubble); bubble = 1/(1+8).
  EXPECT_NEAR(pred.throughput.mfu, 0.5 * (1 - 1.0 / 9), 1e-12);
  PlanReport meas = plan_from(base + "--step-time 2 --peak-tflops 100");
  EXPECT_DOUBLE_EQ(meas.throughput.tokens_per_s, 32.0 * 1024 / 2);
  EXPECT_DOUBLE_EQ(meas.throughput.tflops_per_device, meas.flops_per_iteration / (2 * 1e12 * 16));
  EXPECT_DOUBLE_EQ(meas.throughput.mfu, meas.throughput.tflops_per_device / 100);
}

TEST(Throughput, H200ReportsTheShareOfItsMeasuredGemmCeiling) {
  const std::string base =
      "--world-size 1 --num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
      "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --step-time 0.5 ";
  PlanReport h200 = plan_from(base + "--bf16 --device h200");
  ASSERT_TRUE(h200.valid());
  EXPECT_DOUBLE_EQ(h200.throughput.peak_tflops, 989.4);
  EXPECT_DOUBLE_EQ(h200.throughput.gemm_ceiling_tflops, 790);
  EXPECT_DOUBLE_EQ(h200.throughput.of_gemm_ceiling, h200.throughput.tflops_per_device / 790);
  nlohmann::json j = to_json(h200);
  EXPECT_DOUBLE_EQ(j["compute"]["gemm_ceiling_tflops"].get<double>(), 790);
  EXPECT_NE(render_text(h200).find("of the 790 TFLOP/s bf16 GEMM ceiling measured on this device"), std::string::npos);
  // No ceiling where none was measured (h100), for fp32, or under --peak-tflops.
  for (const std::string& extra : {std::string("--bf16 --device h100"), std::string("--device h200"),
                                   std::string("--bf16 --device h200 --peak-tflops 500")}) {
    PlanReport r = plan_from(base + extra);
    ASSERT_TRUE(r.valid()) << extra;
    EXPECT_EQ(r.throughput.gemm_ceiling_tflops, 0) << extra;
    EXPECT_FALSE(to_json(r)["compute"].contains("gemm_ceiling_tflops")) << extra;
  }
}

TEST(Render, JsonCarriesTheGridAndTimeline) {
  PlanReport r = plan_from(
      "--world-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 256 "
      "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --vocab-size 50257 --micro-batch-size 1 "
      "--global-batch-size 8 --gpus-per-node 4");
  ASSERT_TRUE(r.valid());
  nlohmann::json j = to_json(r);
  EXPECT_TRUE(j["valid"].get<bool>());
  EXPECT_EQ(j["ranks"].size(), 8u);
  EXPECT_EQ(j["groups"]["tp"], nlohmann::json::parse("[[0,1],[2,3],[4,5],[6,7]]"));
  EXPECT_EQ(j["groups"]["pp"], nlohmann::json::parse("[[0,4],[1,5],[2,6],[3,7]]"));
  EXPECT_EQ(j["groups"]["dp"], nlohmann::json::parse("[[0,2],[1,3],[4,6],[5,7]]"));
  EXPECT_EQ(j["layout"]["num_nodes"], 2);
  EXPECT_EQ(j["ranks"][5]["node"], 1);
  EXPECT_EQ(j["ranks"][5]["gpu"], 1);
  EXPECT_EQ(j["pipeline"]["timeline"]["ranks"].size(), 2u);
  EXPECT_EQ(j["batch"]["num_microbatches"], 4);  // 8 / (1 x DP 2)
  EXPECT_EQ(j["pipeline"]["timeline"]["ranks"][0].size(), 4u * 2);  // F and B of each micro-batch
  EXPECT_EQ(j["memory"]["stages"].size(), 2u);
}

// --multi-latent-attention: its shape in the text and the JSON, the
// softmax scale it implies (YaRN x40 with --mscale-all-dim 1:
// (0.1 ln 40 + 1)^2 / sqrt(128 + 64)).
TEST(Render, MultiLatentAttentionShape) {
  PlanReport r = plan_from(
      "--world-size 8 --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512 "
      "--max-position-embeddings 512 --vocab-size 50257 --micro-batch-size 1 --global-batch-size 8 "
      "--multi-latent-attention --q-lora-rank 192 --kv-lora-rank 64 --rotary-scaling-factor 40 --mscale-all-dim 1");
  ASSERT_TRUE(r.valid()) << rules_of(r);
  const std::string text = render_text(r);
  EXPECT_NE(text.find("multi-latent: q rank 192, kv rank 64, heads of 128 + 64 rotated (YaRN x40), values 128"),
            std::string::npos)
      << text;
  const nlohmann::json m = to_json(r)["model"]["multi_latent_attention"];
  EXPECT_EQ(m["q_lora_rank"], 192);
  EXPECT_EQ(m["rope_type"], "yarn");
  const double s = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(m["softmax_scale"].get<double>(), s * s / std::sqrt(192.0), 1e-15);
}

TEST(Render, HtmlIsSelfContained) {
  PlanReport r = plan_from("--world-size 4 --tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 "
                           "--num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --vocab-size 100 --micro-batch-size 1");
  nlohmann::json j = to_json(r);
  // A hostile string in the JSON must not close the script element.
  j["warnings"].push_back("</script><script>alert(1)</script>");
  std::string page = render_html(j, false);
  EXPECT_EQ(page.find("</script><script>alert"), std::string::npos);
  EXPECT_NE(page.find("const PLAN = {"), std::string::npos);
  EXPECT_EQ(page.find("/*@"), std::string::npos) << "a template marker was left";
  // No network: no external scripts, styles, images or fetches of absolute URLs.
  std::regex external(R"((src|href)\s*=\s*["']?(https?:)?//)", std::regex::icase);
  EXPECT_FALSE(std::regex_search(page, external));
  EXPECT_EQ(page.find("@import"), std::string::npos);
}

}  // namespace
}  // namespace mt::plan
