// Activation recomputation in GPTModel: full (uniform, block) and selective
// change memory, not numbers. Losses and every gradient are compared bit for
// bit with the model that keeps everything, with dropout on, two micro-batches
// in flight; the activation and scratch arenas are checked against the size
// arithmetic written out independently here.

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/gpt.h"

namespace mt::model {
namespace {

ModelConfig gpt2_style() {
  ModelConfig c;
  c.num_layers = 4, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 12;
  c.max_position_embeddings = 16, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;  // V = 96
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  c.init_method_std = 0.2;
  return c;
}

ModelConfig llama_style() {  // 3 layers: uniform groups of 2 leave a clipped last group
  ModelConfig c = gpt2_style();
  c.num_layers = 3, c.hidden_size = 48, c.num_attention_heads = 6, c.group_query_attention = true;
  c.num_query_groups = 2, c.normalization = Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 80;
  c.position_embedding = PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true, c.norm_epsilon = 1e-6;
  return c;
}

ModelConfig qk_style() {  // --qk-layernorm: LayerNorm q/k norms with zero-centred weights, RoPE
  ModelConfig c = gpt2_style();
  c.qk_layernorm = true, c.apply_layernorm_1p = true, c.position_embedding = PositionEmbedding::kRope;
  return c;
}

ModelConfig qwen3_style() {  // --qk-layernorm on a LLaMA (RMSNorm q/k norms), head dim 16 != h/a
  ModelConfig c = llama_style();
  c.qk_layernorm = true, c.kv_channels = 16;
  return c;
}

ModelConfig post_ln_style() {
  ModelConfig c = gpt2_style();
  c.apply_residual_connection_post_layernorm = true, c.openai_gelu = true;
  return c;
}

ModelConfig mixtral_style() {  // MoE: 4 experts, top-2, load-balancing and z-losses
  ModelConfig c = llama_style();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 40;
  c.moe_aux_loss_coeff = 0.1, c.moe_z_loss_coeff = 0.01;
  return c;
}

ModelConfig moe_gpt_style() {  // MoE GPT: top-1 with the pre-softmax router, no biases
  ModelConfig c = gpt2_style();
  c.add_bias_linear = false, c.num_experts = 3, c.moe_router_topk = 1, c.moe_router_pre_softmax = true;
  c.moe_aux_loss_coeff = 0.1;
  return c;
}

ModelConfig shared_style() {  // mixtral with a shared expert
  ModelConfig c = mixtral_style();
  c.moe_shared_expert_intermediate_size = 48;
  return c;
}

ModelConfig sigmoid_style() {  // DeepSeek-V3's sigmoid router and expert bias
  ModelConfig c = shared_style();
  c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
  return c;
}

// --moe-layer-freq: dense and MoE layers mixed, so that a recomputed
// group's workspace position holds either kind (uniform groups of 2: layer 0
// dense and layer 2 MoE share position 0); and the sigmoid router with its
// bias on layers 0 and 2 (freq 2).
ModelConfig moe_freq_style() {
  ModelConfig c = mixtral_style();
  c.moe_layer_freq = "[0]+[1]*2";
  return c;
}
ModelConfig moe_freq_sigmoid_style() {
  ModelConfig c = sigmoid_style();
  c.moe_layer_freq = "2";
  return c;
}

ModelConfig jitter_style() {  // --moe-input-jitter-eps on the sigmoid router with dense layer 1
  ModelConfig c = moe_freq_sigmoid_style();
  c.moe_input_jitter_eps = 0.2;
  return c;
}

// --multi-latent-attention: DeepSeek-style (low-rank queries, RMSNorm q/kv
// norms, YaRN, values narrower than the heads) and the GPT functional test's
// (linear_q_proj, LayerNorm, no q/kv norms).
ModelConfig mla_style() {
  ModelConfig c = llama_style();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.q_lora_rank = 12, c.kv_lora_rank = 10, c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4, c.v_head_dim = 4, c.qk_layernorm = true, c.rotary_scaling_factor = 40;
  return c;
}
ModelConfig mla_gpt_style() {
  ModelConfig c = gpt2_style();
  c.multi_latent_attention = true, c.kv_lora_rank = 8, c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4, c.v_head_dim = 8;
  return c;
}

// --mtp-num-layers: two depths on the LLaMA, one on the sigmoid-routed MoE
// whose last layer (and so its MTP layer) is MoE, one on MLA. The MTP
// layers keep their activations under full recomputation and follow the
// selective modules as the decoder's layers.
ModelConfig mtp_style() {
  ModelConfig c = llama_style();
  c.mtp_num_layers = 2;
  return c;
}
ModelConfig mtp_moe_style() {
  ModelConfig c = moe_freq_sigmoid_style();
  c.mtp_num_layers = 1;
  return c;
}
ModelConfig mtp_repeated_style() {  // --mtp-use-repeated-layer: the MoE MTP layer at three depths
  ModelConfig c = moe_freq_sigmoid_style();
  c.mtp_num_layers = 3, c.mtp_use_repeated_layer = true;
  return c;
}
ModelConfig mtp_mla_style() {
  ModelConfig c = mla_style();
  c.mtp_num_layers = 1;
  return c;
}

RecomputeOptions full(RecomputeMethod m, int64_t n) {
  RecomputeOptions r;
  r.granularity = RecomputeGranularity::kFull, r.method = m, r.num_layers = n;
  return r;
}
RecomputeOptions selective(bool core_attn = true, bool moe_act = false, bool mla_up = false) {
  RecomputeOptions r;
  r.granularity = RecomputeGranularity::kSelective, r.core_attn = core_attn, r.moe_act = moe_act, r.mla_up = mla_up;
  return r;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<char>> grads;  // raw bytes per parameter
  std::vector<char> logits;              // slot 0's logits after forward
  GPTMemoryPlan plan;
  size_t scratch_high_water = 0, acts_capacity = 0;
};

// Two micro-batches in flight (1F1B-like order: F0 F1 B1 B0), dropout on.
RunResult run(const ModelConfig& cfg, RecomputeOptions rc, bool bf16 = false, bool fp32_residual = false) {
  GPTOptions opt;
  opt.micro_batch = 2, opt.slots = 2, opt.recompute = rc, opt.half_compute = bf16, opt.fp32_residual = fp32_residual;
  auto created = GPTModel::create(cfg, opt);
  EXPECT_TRUE(created.is_ok()) << created.status().message();
  GPTModel& m = **created;
  m.init_parameters(77);
  const int64_t B = opt.micro_batch, T = cfg.seq_length;
  std::mt19937 g(5);
  std::vector<std::vector<int32_t>> tok(2, std::vector<int32_t>(B * T)), lab(2, std::vector<int32_t>(B * T));
  for (int mb = 0; mb < 2; ++mb) {
    for (auto& t : tok[mb]) t = static_cast<int32_t>(g() % *cfg.vocab_size);
    for (auto& t : lab[mb]) t = static_cast<int32_t>(g() % *cfg.vocab_size);
    lab[mb][1] = -1;
  }
  RunResult r;
  m.zero_grads();
  for (int mb = 0; mb < 2; ++mb) {
    Tensor tt(tok[mb].data(), {B, T}, DType::kI32), lt(lab[mb].data(), {B, T}, DType::kI32);
    r.losses.push_back(m.forward(mb, tt, lt, /*dropout_step=*/100 + mb, /*training=*/true));
    if (mb == 0) {
      const Tensor lg = m.logits(0);
      r.logits.assign(static_cast<char*>(lg.data()), static_cast<char*>(lg.data()) + lg.nbytes());
    }
  }
  m.backward(1, 0.5);
  m.backward(0, 0.5);
  for (const Tensor& gr : m.grads())
    r.grads.emplace_back(static_cast<char*>(gr.data()), static_cast<char*>(gr.data()) + gr.nbytes());
  r.plan = m.memory_plan();
  r.scratch_high_water = m.scratch_arena().high_water();
  r.acts_capacity = m.activation_arena().capacity();
  auto planned = GPTModel::planned_bytes(cfg, opt);
  EXPECT_TRUE(planned.is_ok());
  EXPECT_EQ(planned->total(), r.plan.total()) << "planned_bytes() disagrees with the model it describes";
  EXPECT_EQ(planned->activations, r.plan.activations);
  EXPECT_EQ(planned->scratch, r.plan.scratch);
  return r;
}

struct Case {
  const char* name;
  ModelConfig (*cfg)();
  bool bf16;
  bool fp32_residual = false;  // --fp32-residual-connection (with bf16)
};

class RecomputeNumerics : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeNumerics, BitwiseIdenticalLossesLogitsAndGradients) {
  const Case c = GetParam();
  const ModelConfig cfg = c.cfg();
  const RunResult base = run(cfg, RecomputeOptions{}, c.bf16, c.fp32_residual);
  std::vector<std::pair<std::string, RecomputeOptions>> modes = {
      {"full uniform 1", full(RecomputeMethod::kUniform, 1)},
      {"full uniform 2", full(RecomputeMethod::kUniform, 2)},
      {"full uniform L", full(RecomputeMethod::kUniform, cfg.num_layers)},
      {"full block 1", full(RecomputeMethod::kBlock, 1)},
      {"full block 2", full(RecomputeMethod::kBlock, 2)},
      {"selective", selective()},
      {"selective core_attn + moe_act", selective(true, true)},  // --recompute-modules core_attn moe_act
      {"selective moe_act", selective(false, true)}};
  if (cfg.mla()) {  // --recompute-modules mla_up_proj: Q/K/V recomputed from the up projections' inputs
    modes.push_back({"selective mla_up_proj", selective(false, false, true)});
    modes.push_back({"selective core_attn + mla_up_proj", selective(true, false, true)});
  }
  for (const auto& [name, rc] : modes) {
    SCOPED_TRACE(name);
    const RunResult r = run(cfg, rc, c.bf16, c.fp32_residual);
    ASSERT_EQ(r.losses.size(), base.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&r.losses[i], &base.losses[i], sizeof(double)), 0)
          << "loss " << i << ": " << r.losses[i] << " vs " << base.losses[i];
    EXPECT_TRUE(r.logits == base.logits) << "logits differ";
    for (size_t p = 0; p < base.grads.size(); ++p) EXPECT_TRUE(r.grads[p] == base.grads[p]) << "gradient " << p;
    // (moe_act alone keeps everything a model without experts keeps.)
    if (rc.core_attn || rc.mla_up || rc.granularity != RecomputeGranularity::kSelective || cfg.is_moe())
      EXPECT_LT(r.plan.activations, base.plan.activations);
    else
      EXPECT_EQ(r.plan.activations, base.plan.activations);
    // The scratch plan is exact: the arena's high-water mark reaches it.
    EXPECT_EQ(r.scratch_high_water, r.plan.scratch);
  }
  EXPECT_EQ(base.scratch_high_water, base.plan.scratch);
  EXPECT_EQ(base.acts_capacity, base.plan.activations);
}

INSTANTIATE_TEST_SUITE_P(Configs, RecomputeNumerics,
                         ::testing::Values(Case{"gpt2", gpt2_style, false}, Case{"llama", llama_style, false},
                                           Case{"postln", post_ln_style, false}, Case{"gpt2_bf16", gpt2_style, true},
                                           Case{"llama_bf16", llama_style, true}, Case{"qk", qk_style, false},
                                           Case{"qwen3", qwen3_style, false}, Case{"qwen3_bf16", qwen3_style, true},
                                           Case{"qwen3_bf16_fp32res", qwen3_style, true, true},
                                           Case{"llama_bf16_fp32res", llama_style, true, true},
                                           Case{"mixtral", mixtral_style, false}, Case{"mixtral_bf16", mixtral_style, true},
                                           Case{"moe_gpt", moe_gpt_style, false},
                                           Case{"shared_expert", shared_style, false},
                                           Case{"shared_expert_bf16", shared_style, true},
                                           Case{"sigmoid", sigmoid_style, false}, Case{"sigmoid_bf16", sigmoid_style, true},
                                           Case{"moe_freq", moe_freq_style, false},
                                           Case{"moe_freq_bf16", moe_freq_style, true},
                                           Case{"moe_freq_sigmoid", moe_freq_sigmoid_style, false},
                                           Case{"jitter", jitter_style, false}, Case{"jitter_bf16", jitter_style, true},
                                           Case{"mla", mla_style, false}, Case{"mla_bf16", mla_style, true},
                                           Case{"mla_gpt", mla_gpt_style, false},
                                           Case{"mla_gpt_bf16", mla_gpt_style, true},
                                           Case{"mtp", mtp_style, false}, Case{"mtp_bf16", mtp_style, true},
                                           Case{"mtp_bf16_fp32res", mtp_style, true, true},
                                           Case{"mtp_moe", mtp_moe_style, false},
                                           Case{"mtp_moe_bf16", mtp_moe_style, true},
                                           Case{"mtp_mla", mtp_mla_style, false},
                                           Case{"mtp_repeated", mtp_repeated_style, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// The size arithmetic, written out: every tensor rounded up to 64 bytes.
size_t A(int64_t elements, size_t es = 4) { return (static_cast<size_t>(elements) * es + 63) / 64 * 64; }

TEST(RecomputeMemory, ActivationAndScratchBytesFollowTheSizeTable) {
  const ModelConfig cfg = gpt2_style();  // L = 4, h = 32, a = 4, d = 8, F = 128, V = 96, LayerNorm
  const int64_t B = 2, T = 12, N = B * T, h = 32, a = 4, ad = 32, qkv = 96, F = 128, V = 96, L = 4;
  // One layer: x_mid, ln1, ln2 [N,h]; two means, two rstds [N]; qkv; ctx; lse [B,a,T]; fc1, act [N,F].
  const size_t attn = A(N * ad) + A(B * a * T);
  const size_t layer = 3 * A(N * h) + 4 * A(N) + A(N * qkv) + attn + 2 * A(N * F);
  const size_t resid = A(N * h);
  // tokens, labels (int32), resid[L], final norm out + mean + rstd, logits, 4 loss vectors.
  const size_t fixed = 2 * A(N) + resid + A(N * h) + 2 * A(N) + A(N * V) + 4 * A(N);
  // Scratch of the model that keeps everything: dlnf, dresid + layer_backward's
  // dtmp, dln [N,h], dact [N,F], dfc1 [N,F], dctx [N,ad], dqkv [N,qkv] (the
  // output layer's dloss [N] is freed before the layers run).
  const size_t scratch_none = 2 * A(N * h) + 2 * A(N * h) + 2 * A(N * F) + A(N * ad) + A(N * qkv);

  struct Expect {
    RecomputeOptions rc;
    size_t acts, workspace;
  };
  const std::vector<Expect> expect = {
      {RecomputeOptions{}, fixed + L * resid + L * layer, 0},
      {full(RecomputeMethod::kUniform, 1), fixed + L * resid, layer},
      {full(RecomputeMethod::kUniform, 2), fixed + 2 * resid, 2 * layer + resid},
      {full(RecomputeMethod::kUniform, 3), fixed + 2 * resid, 3 * layer + 2 * resid},  // groups {0,1,2} {3}
      {full(RecomputeMethod::kBlock, 1), fixed + L * resid + 3 * layer, layer},
      {full(RecomputeMethod::kBlock, 3), fixed + L * resid + 1 * layer, layer},
      {selective(), fixed + L * resid + L * (layer - attn), 0},
  };
  for (const Expect& e : expect) {
    SCOPED_TRACE(e.rc.str());
    GPTOptions opt;
    opt.micro_batch = B, opt.slots = 3, opt.recompute = e.rc;
    auto plan = GPTModel::planned_bytes(cfg, opt);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_EQ(plan->activations_per_slot, e.acts);
    EXPECT_EQ(plan->activations, 3 * e.acts);
    EXPECT_EQ(plan->recompute_workspace, e.workspace);
    const size_t sel_extra = e.rc.granularity == RecomputeGranularity::kSelective ? attn : 0;
    EXPECT_EQ(plan->scratch, scratch_none + e.workspace + sel_extra);
    // What the model allocates, and what a forward/backward actually touches.
    auto m = GPTModel::create(cfg, opt);
    ASSERT_TRUE(m.is_ok());
    EXPECT_EQ((*m)->activation_bytes_per_slot(), e.acts);
    EXPECT_EQ((*m)->activation_arena().capacity(), 3 * e.acts);
    EXPECT_EQ((*m)->activation_arena().high_water(), 3 * e.acts);
    (*m)->init_parameters(1);
    std::vector<int32_t> tok(N, 3), lab(N, 4);
    Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
    (*m)->forward(2, tt, lt, 1, true);
    (*m)->backward(2);
    EXPECT_EQ((*m)->scratch_arena().high_water(), plan->scratch);
    EXPECT_EQ((*m)->scratch_arena().capacity(), plan->scratch);
  }
}

TEST(RecomputeMemory, InferenceOnlyModelHoldsParametersOnly) {
  GPTOptions opt;
  opt.slots = 0;
  auto plan = GPTModel::planned_bytes(gpt2_style(), opt);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_GT(plan->params, 0u);
  EXPECT_EQ(plan->grads + plan->activations + plan->scratch + plan->recompute_workspace, 0u);
  auto m = GPTModel::create(gpt2_style(), opt);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ((*m)->memory_plan().total(), plan->total());
}

TEST(RecomputeGroups, UniformAndBlockFollowMegatron) {
  using G = LayerGroup;
  EXPECT_EQ(layer_groups(3, full(RecomputeMethod::kUniform, 2)), (std::vector<G>{{0, 2, true}, {2, 3, true}}));
  EXPECT_EQ(layer_groups(4, full(RecomputeMethod::kUniform, 1)),
            (std::vector<G>{{0, 1, true}, {1, 2, true}, {2, 3, true}, {3, 4, true}}));
  EXPECT_EQ(layer_groups(4, full(RecomputeMethod::kBlock, 2)),
            (std::vector<G>{{0, 1, true}, {1, 2, true}, {2, 3, false}, {3, 4, false}}));
  EXPECT_EQ(layer_groups(2, selective()), (std::vector<G>{{0, 1, false}, {1, 2, false}}));
  EXPECT_EQ(layer_groups(2, RecomputeOptions{}), (std::vector<G>{{0, 1, false}, {1, 2, false}}));
}

TEST(RecomputeFlags, MegatronRulesWithFlagNames) {
  auto ok = RecomputeOptions::from_flags(std::string("full"), std::string("block"), 3);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->str(), "full block 3");
  auto sel = RecomputeOptions::from_flags(std::nullopt, std::nullopt, std::nullopt, /*recompute_activations=*/true);
  ASSERT_TRUE(sel.is_ok());
  EXPECT_EQ(sel->granularity, RecomputeGranularity::kSelective);
  EXPECT_EQ(RecomputeOptions::from_flags(std::nullopt, std::nullopt, std::nullopt)->str(), "none");
  struct Bad {
    std::optional<std::string> g, m;
    std::optional<int64_t> n;
    const char* flag;
  };
  for (const Bad& b : std::vector<Bad>{{"full", std::nullopt, 1, "--recompute-method"},
                                       {"full", "uniform", std::nullopt, "--recompute-num-layers"},
                                       {"full", "uniform", 0, "--recompute-num-layers"},
                                       {"full", "random", 1, "--recompute-method"},
                                       {"selective", "uniform", std::nullopt, "--recompute-method"},
                                       {"selective", std::nullopt, 2, "--recompute-num-layers"},
                                       {std::nullopt, "block", 2, "--recompute-granularity"},
                                       {"partial", std::nullopt, std::nullopt, "--recompute-granularity"}}) {
    auto r = RecomputeOptions::from_flags(b.g, b.m, b.n);
    ASSERT_FALSE(r.is_ok()) << b.flag;
    EXPECT_NE(r.status().message().find(b.flag), std::string::npos) << r.status().message();
  }
  // --recompute-modules: core_attn (the default) and moe_act, with selective only.
  auto mods = RecomputeOptions::from_flags(std::string("selective"), std::nullopt, std::nullopt, false, {"moe_act"});
  ASSERT_TRUE(mods.is_ok()) << mods.status().message();
  EXPECT_FALSE(mods->core_attn);
  EXPECT_TRUE(mods->moe_act);
  EXPECT_EQ(mods->str(), "selective (moe_act)");
  EXPECT_EQ(RecomputeOptions::from_flags(std::string("selective"), std::nullopt, std::nullopt, false,
                                         {"core_attn", "moe_act"})->str(),
            "selective (core_attn, moe_act)");
  auto up = RecomputeOptions::from_flags(std::string("selective"), std::nullopt, std::nullopt, false,
                                         {"mla_up_proj", "core_attn"});
  ASSERT_TRUE(up.is_ok());
  EXPECT_TRUE(up->recomputes_mla_up() && up->recomputes_attention() && !up->recomputes_moe_act());
  EXPECT_EQ(up->str(), "selective (core_attn, mla_up_proj)");
  {  // MLA's up projections recomputed in a model without MLA: refused, as Megatron does.
    GPTOptions o;
    o.recompute = *up;
    auto no_mla = GPTModel::create(gpt2_style(), o);
    ASSERT_FALSE(no_mla.is_ok());
    EXPECT_NE(no_mla.status().message().find("mla_up_proj needs --multi-latent-attention"), std::string::npos)
        << no_mla.status().message();
  }
  for (const auto& [g, modules, want] :
       std::vector<std::tuple<std::string, std::vector<std::string>, std::string>>{
           {"full", {"core_attn"}, "--recompute-modules applies to --recompute-granularity selective"},
           {"selective", {"mlp"}, "--recompute-modules mlp: recomputing that module is not implemented here"},
           {"selective", {"attention"}, "--recompute-modules attention: not a module Megatron recomputes"}}) {
    auto r = RecomputeOptions::from_flags(g, g == "full" ? std::optional<std::string>("uniform") : std::nullopt,
                                          g == "full" ? std::optional<int64_t>(1) : std::nullopt, false, modules);
    ASSERT_FALSE(r.is_ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  GPTOptions opt;
  opt.recompute = full(RecomputeMethod::kUniform, 5);  // the model has 4 layers
  auto m = GPTModel::create(gpt2_style(), opt);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--recompute-num-layers 5 must be between 1 and"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace mt::model
