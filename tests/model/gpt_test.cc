// GPTModel against an independent PyTorch reference (tests/model/reference_gpt.py),
// against finite differences (fp64 model), and bf16 against fp32; the
// parameter registry against the planner's counts.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/device.h"
#include "core/safetensors.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

ModelConfig gpt2_style() {
  ModelConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 12;
  c.max_position_embeddings = 16, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;  // padded to 96
  c.hidden_dropout = 0, c.attention_dropout = 0;
  c.init_method_std = 0.2;  // larger than Megatron's 0.02 so that every path carries signal
  return c;
}

ModelConfig llama_style() {
  ModelConfig c = gpt2_style();
  c.num_layers = 2, c.hidden_size = 48, c.num_attention_heads = 6, c.group_query_attention = true;
  c.num_query_groups = 2, c.normalization = Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 80;
  c.position_embedding = PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true, c.norm_epsilon = 1e-6, c.rotary_base = 500;
  return c;
}

// LLaMA-style with Llama 3.1's RoPE frequency scaling (base 2e5 puts d=8's
// two rotated frequencies, base^(-0/3) and base^(-2/3), in the kept and the
// divided bands), --rotary-percent 0.4 (Megatron's dim = int(3.2) = 3: two
// frequencies over 3, four dims rotate), positions interpolated by 2.
ModelConfig llama31_style() {
  ModelConfig c = llama_style();
  c.rotary_base = 2e5, c.rotary_percent = 0.4, c.use_rope_scaling = true, c.rope_scaling_factor = 8;
  c.rotary_seq_len_interpolation_factor = 2;
  c.apply_layernorm_1p = true;  // and zero-centred RMSNorm weights
  return c;
}

ModelConfig qwen_style() {  // LLaMA-style with a bias on QKV only (--disable-bias-linear --add-qkv-bias),
  ModelConfig c = llama_style();  // and interleaved RoPE pairs (--rotary-interleaved)
  c.add_qkv_bias = true;
  c.rotary_interleaved = true;
  return c;
}

// Qwen3-style: LLaMA with --qk-layernorm (RMSNorm over each q and k head)
// and a head dim other than h/a (--kv-channels 16, h/a = 8).
ModelConfig qwen3_style() {
  ModelConfig c = llama_style();
  c.qk_layernorm = true, c.kv_channels = 16;
  return c;
}

// GPT with LayerNorm q/k norms (weights and biases), zero-centred
// (--apply-layernorm-1p), and rotary positions on half the head.
ModelConfig gpt_qk_style() {
  ModelConfig c = gpt2_style();
  c.qk_layernorm = true, c.apply_layernorm_1p = true;
  c.position_embedding = PositionEmbedding::kRope, c.rotary_percent = 0.5;
  return c;
}

// DeepSeek-V3-style multi-latent attention on the LLaMA base: one head
// per key/value (no GQA), low-rank queries (--q-lora-rank 24) and keys and
// values (--kv-lora-rank 16) with their RMSNorms (--qk-layernorm), heads of
// 8 + 4 position dims and values of 6 (padded to 12 for the attention
// kernel), YaRN RoPE with DeepSeek-V3's factor 40; --mscale 1 and
// --mscale-all-dim 0.707 make both the cos/sin factor and the softmax
// scale differ from 1 and 1/sqrt(12).
ModelConfig mla_style() {
  ModelConfig c = llama_style();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.q_lora_rank = 24, c.kv_lora_rank = 16, c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4, c.v_head_dim = 6, c.qk_layernorm = true;
  c.rotary_scaling_factor = 40, c.mscale = 1.0, c.mscale_all_dim = 0.707;
  return c;
}

// MLA as Megatron's functional test gpt3_mcore_te_tp2_pp2_mla runs it, on
// the GPT base (LayerNorm, learned positions, biases on linear_proj and the
// MLP): one full-rank linear_q_proj, no q/kv norms; here with --rope-type
// rope rotating half the position dims (--rotary-percent 0.5), the values
// as wide as the q/k heads.
ModelConfig mla_gpt_style() {
  ModelConfig c = gpt2_style();
  c.multi_latent_attention = true, c.kv_lora_rank = 12, c.qk_head_dim = 6, c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 10, c.rope_type = "rope", c.rotary_percent = 0.5;
  return c;
}

ModelConfig gpt_1p_style() {  // GPT with zero-centred LayerNorm weights (--apply-layernorm-1p)
  ModelConfig c = gpt2_style();  // and the exact GELU (--no-bias-gelu-fusion; gpt2 has Megatron's default tanh)
  c.apply_layernorm_1p = true;
  c.bias_gelu_fusion = false;
  return c;
}

ModelConfig squared_relu_style() {  // GPT with --squared-relu (and --no-bias-gelu-fusion, as Megatron requires)
  ModelConfig c = gpt2_style();
  c.squared_relu = true, c.bias_gelu_fusion = false;
  return c;
}

ModelConfig post_ln_style() {  // GPT with the residual after the norm and OpenAI's GELU, untied
  ModelConfig c = gpt2_style();
  c.apply_residual_connection_post_layernorm = true, c.openai_gelu = true;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

// Mixtral-style: LLaMA with 4 experts of width 24, two per token, the
// load-balancing loss and the z-loss.
ModelConfig mixtral_style() {
  ModelConfig c = llama_style();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24;
  c.moe_aux_loss_coeff = 0.3, c.moe_z_loss_coeff = 0.05;
  return c;
}

// GPT (LayerNorm, GELU) with 3 experts, one per token: the pre-softmax
// router (Megatron requires it with top-1), probabilities scaled by 1.5.
ModelConfig moe_gpt_style() {
  ModelConfig c = gpt2_style();
  c.add_bias_linear = false;
  c.num_experts = 3, c.moe_router_topk = 1, c.moe_router_pre_softmax = true, c.moe_router_topk_scaling_factor = 1.5;
  c.moe_aux_loss_coeff = 0.2;
  return c;
}

// DeepSeek-V3's router on the mixtral: sigmoid scores, the expert bias
// (set to random values below) choosing the experts, both router losses.
ModelConfig sigmoid_style() {
  ModelConfig c = mixtral_style();
  c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
  c.moe_router_topk_scaling_factor = 2.0;
  return c;
}

// Group-limited routing: 8 experts in 4 groups; the softmax router choosing
// its top 2 from one group, and the sigmoid router with its bias its top 4
// from two.
ModelConfig grouped_style() {
  ModelConfig c = mixtral_style();
  c.num_experts = 8, c.moe_router_num_groups = 4, c.moe_router_group_topk = 1;
  return c;
}
ModelConfig grouped_sigmoid_style() {
  ModelConfig c = sigmoid_style();
  c.num_experts = 8, c.moe_router_topk = 4, c.moe_router_num_groups = 4, c.moe_router_group_topk = 2;
  return c;
}

// Token dropping (--moe-expert-capacity-factor): the mixtral's experts each
// taking ceil(tokens x 2 / 4 x 0.6) of the micro-batch's tokens, the lowest
// probabilities dropped; the top-1 GPT MoE dropping its latest tokens in two
// segments (as each rank of a TP2+SP layout routes its own shard); the
// sigmoid router with its bias dropping (the loss still counts every choice).
ModelConfig capacity_style() {
  ModelConfig c = mixtral_style();
  c.moe_expert_capacity_factor = 0.6;
  return c;
}
ModelConfig capacity_position_style() {
  ModelConfig c = moe_gpt_style();
  c.moe_expert_capacity_factor = 0.8, c.moe_token_drop_policy = "position";
  return c;
}
ModelConfig capacity_sigmoid_style() {
  ModelConfig c = sigmoid_style();
  c.moe_expert_capacity_factor = 0.7;
  return c;
}

// DeepSeek's sequence-level load-balancing loss (--moe-router-load-balancing-type
// seq_aux_loss): the switch loss of each of the 3 sequences, averaged; on
// the mixtral, and on the sigmoid router with its bias and group limits.
ModelConfig seq_aux_style() {
  ModelConfig c = mixtral_style();
  c.moe_router_load_balancing_type = "seq_aux_loss";
  return c;
}
ModelConfig seq_aux_sigmoid_style() {
  ModelConfig c = grouped_sigmoid_style();
  c.moe_router_load_balancing_type = "seq_aux_loss";
  return c;
}

// --mtp-num-layers: two multi-token prediction depths on the LLaMA (untied
// output layer, RMSNorm, RoPE: the MTP layers rotate as the decoder's) with
// a loss weight of 0.3; one on a GPT with LayerNorm (biases on the MTP
// norms), tied embeddings and no position embedding; and DeepSeek-V3's
// shape: MLA, the sigmoid router with its expert bias and a shared expert,
// the first layer dense and the MTP layer an MoE layer like the last.
ModelConfig mtp_llama_style() {
  ModelConfig c = llama_style();
  c.mtp_num_layers = 2, c.mtp_loss_scaling_factor = 0.3;
  return c;
}
ModelConfig mtp_gpt_style() {
  ModelConfig c = gpt2_style();
  c.position_embedding = PositionEmbedding::kNone, c.mtp_num_layers = 1;
  return c;
}
ModelConfig mtp_deepseek_style() {
  ModelConfig c = mla_style();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24, c.moe_aux_loss_coeff = 0.3;
  c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
  c.moe_shared_expert_intermediate_size = 16, c.moe_layer_freq = "[0]+[1]";
  c.moe_router_load_balancing_type = "seq_aux_loss";
  c.mtp_num_layers = 1;
  return c;
}

// --mtp-use-repeated-layer: the DeepSeek shape's MoE MTP layer applied at
// two depths (one set of parameters and one expert bias; its router losses
// 1/2 per depth).
ModelConfig mtp_repeated_style() {
  ModelConfig c = mtp_deepseek_style();
  c.mtp_num_layers = 2, c.mtp_use_repeated_layer = true;
  return c;
}

// --moe-layer-freq: the mixtral with 3 layers, the first dense (its MLP
// 80 wide, the experts 24: DeepSeek's first dense layers); and the sigmoid
// router with its bias and a shared expert on layers 0 and 2 (freq 2), layer
// 1 dense.
ModelConfig moe_freq_style() {
  ModelConfig c = mixtral_style();
  c.num_layers = 3, c.moe_layer_freq = "[0]+[1]*2";
  return c;
}
// --moe-input-jitter-eps: the router's input times uniform noise (the
// model's factors handed to PyTorch), on the mixtral and on the sigmoid
// router, whose backward recomputes its logits from the jittered input.
ModelConfig jitter_style() {
  ModelConfig c = mixtral_style();
  c.moe_input_jitter_eps = 0.1;
  return c;
}
ModelConfig jitter_sigmoid_style() {
  ModelConfig c = sigmoid_style();
  c.moe_input_jitter_eps = 0.3;
  return c;
}
ModelConfig moe_freq_sigmoid_style() {
  ModelConfig c = sigmoid_style();
  c.num_layers = 3, c.moe_layer_freq = "2", c.moe_shared_expert_intermediate_size = 16;
  return c;
}

// moegpt with a shared expert of width 20 beside its routed ones (GELU).
ModelConfig moe_shared_style() {
  ModelConfig c = moe_gpt_style();
  c.moe_shared_expert_intermediate_size = 20;
  return c;
}
// --moe-shared-expert-gate: the mixtral's with a shared SwiGLU expert of
// width 16 times sigmoid(x . g) (Qwen2-MoE's shared expert), the first layer dense.
ModelConfig moe_shared_gate_style() {
  ModelConfig c = moe_freq_style();
  c.moe_shared_expert_intermediate_size = 16, c.moe_shared_expert_gate = true;
  return c;
}

nlohmann::json config_json(const ModelConfig& c, int64_t capacity_segments = 1) {
  return {{"moe_expert_capacity_factor", c.drops_tokens() ? nlohmann::json(*c.moe_expert_capacity_factor) : nlohmann::json()},
          {"moe_token_drop_policy", c.moe_token_drop_policy}, {"moe_capacity_segments", capacity_segments},
          {"moe_router_load_balancing_type", c.moe_router_load_balancing_type},
          {"num_layers", c.num_layers}, {"hidden_size", c.hidden_size}, {"num_attention_heads", c.num_attention_heads},
          {"num_query_groups", c.query_groups()}, {"kv_channels", c.head_dim()},
          {"normalization", normalization_name(c.normalization)}, {"norm_epsilon", c.norm_epsilon},
          {"position_embedding_type", position_embedding_name(c.position_embedding)}, {"rotary_base", c.rotary_base},
          {"rotary_percent", c.rotary_percent}, {"use_rope_scaling", c.use_rope_scaling},
          {"rope_scaling_factor", c.rope_scaling_factor}, {"apply_layernorm_1p", c.apply_layernorm_1p},
          {"rotary_interleaved", c.rotary_interleaved},
          {"rotary_interpolation", static_cast<double>(c.rotary_seq_len_interpolation_factor.value_or(1))},
          {"swiglu", c.swiglu}, {"gelu_tanh", c.gelu_tanh()}, {"squared_relu", c.squared_relu},
          {"qk_layernorm", c.qk_layernorm},
          {"apply_residual_connection_post_layernorm", c.apply_residual_connection_post_layernorm},
          {"num_experts", c.num_experts}, {"moe_router_topk", c.moe_router_topk}, {"moe_layer_freq", c.moe_layer_freq},
          {"moe_router_pre_softmax", c.moe_router_pre_softmax},
          {"moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor.value_or(1.0)},
          {"moe_aux_loss_coeff", c.moe_aux_loss_coeff}, {"moe_z_loss_coeff", c.moe_z_loss_coeff.value_or(0.0)},
          {"moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size},
          {"moe_shared_expert_gate", c.moe_shared_expert_gate},
          {"moe_router_score_function", c.moe_router_score_function},
          {"moe_router_num_groups", c.moe_router_num_groups}, {"moe_router_group_topk", c.moe_router_group_topk},
          {"multi_latent_attention", c.multi_latent_attention}, {"q_lora_rank", c.q_lora_rank.value_or(0)},
          {"kv_lora_rank", c.kv_lora_rank}, {"qk_head_dim", c.qk_head_dim},
          {"qk_pos_emb_head_dim", c.qk_pos_emb_head_dim}, {"v_head_dim", c.v_head_dim}, {"rope_type", c.rope_type},
          {"rotary_scaling_factor", c.rotary_scaling_factor}, {"mscale", c.mscale}, {"mscale_all_dim", c.mscale_all_dim},
          {"mtp_num_layers", c.mtp_layers()}, {"mtp_loss_scaling_factor", c.mtp_loss_scaling_factor},
          {"mtp_use_repeated_layer", c.mtp_use_repeated_layer}};
}

void random_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed, std::vector<int32_t>& tok, std::vector<int32_t>& lab) {
  std::mt19937 g(static_cast<uint32_t>(seed));
  tok.resize(B * T), lab.resize(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(g() % vocab);
  for (auto& l : lab) l = static_cast<int32_t>(g() % vocab);
  lab[3] = -1;  // one ignored label
}

// Norm-wise relative error ||a - b|| / ||b||.
template <typename A>
double rel_err(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    double x = a.ptr<A>()[i], y = b.ptr<float>()[i];
    num += (x - y) * (x - y), den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class VsPyTorch : public ::testing::TestWithParam<const char*> {};

TEST_P(VsPyTorch, LogitsLossAndEveryGradientMatch) {
  const std::string which = GetParam();
  ModelConfig cfg = which == "gpt2" ? gpt2_style() : which == "llama" ? llama_style() : which == "llama31" ? llama31_style()
                    : which == "gpt1p"   ? gpt_1p_style()
                    : which == "qwen"    ? qwen_style()
                    : which == "sqrelu"  ? squared_relu_style()
                    : which == "qwen3"   ? qwen3_style()
                    : which == "gptqk"   ? gpt_qk_style()
                    : which == "mixtral" ? mixtral_style()
                    : which == "moegpt"  ? moe_gpt_style()
                    : which == "moeshared" ? moe_shared_style()
                    : which == "moesharedgate" ? moe_shared_gate_style()
                    : which == "sigmoid" ? sigmoid_style()
                    : which == "grouped" ? grouped_style()
                    : which == "grouped_sigmoid" ? grouped_sigmoid_style()
                    : which == "capacity" ? capacity_style()
                    : which == "capacity_position" ? capacity_position_style()
                    : which == "capacity_sigmoid" ? capacity_sigmoid_style()
                    : which == "seq_aux" ? seq_aux_style()
                    : which == "seq_aux_sigmoid" ? seq_aux_sigmoid_style()
                    : which == "moefreq" ? moe_freq_style()
                    : which == "moefreq_sigmoid" ? moe_freq_sigmoid_style()
                    : which == "jitter" ? jitter_style()
                    : which == "jitter_sigmoid" ? jitter_sigmoid_style()
                    : which == "mla" ? mla_style()
                    : which == "mla_gpt" ? mla_gpt_style()
                    : which == "mtp_llama" ? mtp_llama_style()
                    : which == "mtp_gpt" ? mtp_gpt_style()
                    : which == "mtp_deepseek" ? mtp_deepseek_style()
                    : which == "mtp_repeated" ? mtp_repeated_style()
                                         : post_ln_style();
  GPTOptions opt;
  opt.micro_batch = 3;
  if (which == "capacity_position") opt.moe_capacity_segments = 2;
  auto created = GPTModel::create(cfg, opt);
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  GPTModel& m = **created;
  m.init_parameters(1234);
  // Zero-centred gammas (--apply-layernorm-1p) and the QKV bias
  // (--add-qkv-bias) start at 0: move them so that every path carries signal.
  std::mt19937 gen(99);
  std::normal_distribution<float> nd(0.f, 0.3f);
  int moved = 0;
  for (size_t i = 0; i < m.specs().size(); ++i) {
    const std::string& name = m.specs()[i].name;
    const bool gamma = cfg.apply_layernorm_1p && name.find("layernorm.weight") != std::string::npos;
    const bool qkv_bias = cfg.add_qkv_bias && name.find("linear_qkv.bias") != std::string::npos;
    // q/k norm parameters start at 1 (weights) or 0 (biases, zero-centred weights).
    const bool qk = name.find("_layernorm.") != std::string::npos && name.find("self_attention.") != std::string::npos;
    if (!gamma && !qkv_bias && !qk) continue;
    const bool one = qk && !cfg.apply_layernorm_1p && name.find(".weight") != std::string::npos;
    EXPECT_EQ(m.params()[i].ptr<float>()[0], one ? 1.f : 0.f) << name << " starts at " << (one ? 1 : 0);
    for (int64_t j = 0; j < m.params()[i].numel(); ++j) m.params()[i].ptr<float>()[j] = nd(gen);
    ++moved;
  }
  if (cfg.qk_layernorm && !cfg.mla()) {  // q and k weights per layer, and their biases under LayerNorm
    int qk = 0;
    for (const auto& sp : m.specs())
      if (sp.name.find("self_attention.q_layernorm") != std::string::npos ||
          sp.name.find("self_attention.k_layernorm") != std::string::npos) {
        EXPECT_EQ(sp.global_shape, Shape{cfg.head_dim()}) << sp.name;
        ++qk;
      }
    EXPECT_EQ(qk, cfg.num_layers * (cfg.normalization == Normalization::kLayerNorm ? 4 : 2));
  }
  if (cfg.add_qkv_bias) {
    EXPECT_EQ(moved, cfg.num_layers) << "one QKV bias per layer, and no other bias";
    for (const auto& sp : m.specs()) EXPECT_EQ(sp.name.find("linear_fc1.bias"), std::string::npos) << sp.name;
  }
  // The expert bias starts at zero; random values make it choose experts.
  int biased = 0;
  for (const auto& [name, b] : m.expert_bias_tensors()) {
    for (int64_t j = 0; j < b.numel(); ++j) b.ptr<float>()[j] = nd(gen);
    ++biased;
  }
  EXPECT_EQ(biased, cfg.has_expert_bias()
                        ? cfg.num_moe_layers() + (cfg.is_moe_layer(cfg.num_layers) ? cfg.mtp_built_layers() : 0)
                        : 0);
  std::vector<int32_t> tok, lab;
  random_batch(opt.micro_batch, cfg.seq_length, *cfg.vocab_size, 7, tok, lab);
  Tensor tt(tok.data(), {opt.micro_batch, cfg.seq_length}, DType::kI32), lt(lab.data(), {opt.micro_batch, cfg.seq_length}, DType::kI32);
  m.zero_grads();
  // Training mode for MoE (its load-balancing and z-losses are training's); no dropout here.
  const double loss = m.forward(0, tt, lt, 0, cfg.is_moe());
  std::vector<float> logits(m.logits(0).ptr<float>(), m.logits(0).ptr<float>() + m.logits(0).numel());
  std::vector<double> mtp_loss;
  for (int k = 0; k < cfg.mtp_layers(); ++k) {
    // Depth k counts the labels k + 1 positions ahead: the last k + 1 of each sequence drop out.
    int64_t counted = 0;
    for (int64_t b = 0; b < opt.micro_batch; ++b)
      for (int64_t t = k + 1; t < cfg.seq_length; ++t) counted += lab[static_cast<size_t>(b * cfg.seq_length + t)] >= 0;
    EXPECT_EQ(m.mtp_label_count(0, k), static_cast<double>(counted)) << "MTP depth " << k + 1;
    mtp_loss.push_back(m.mtp_loss_total(0, k) / m.mtp_label_count(0, k));
  }
  m.backward(0);

  const std::string dir = std::string(MT_BINARY_DIR) + "/test-artifacts";
  std::filesystem::create_directories(dir);
  const std::string in = dir + "/gpt_ref_" + which + "_in.safetensors", out = dir + "/gpt_ref_" + which + "_out.safetensors";
  std::vector<NamedTensor> ts;
  for (size_t i = 0; i < m.specs().size(); ++i) ts.push_back({m.specs()[i].name, m.params()[i]});
  for (const auto& [name, b] : m.expert_bias_tensors()) ts.push_back({name, b});
  // --moe-input-jitter-eps: each MoE layer's noise, for the reference to apply.
  std::vector<std::vector<float>> jitter;
  for (int64_t l = 0; l < cfg.num_layers && cfg.jitters_router_input(); ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    const std::vector<double> f = m.router_jitter_factors(0, static_cast<int>(l));
    jitter.emplace_back(f.begin(), f.end());
    double lo = 2, hi = 0;
    for (double v : f) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_GE(lo, 1 - *cfg.moe_input_jitter_eps - 1e-6);
    EXPECT_LT(hi, 1 + *cfg.moe_input_jitter_eps + 1e-6);
    EXPECT_GT(hi - lo, *cfg.moe_input_jitter_eps) << "noise spread over its range";
    ts.push_back({fmt::format("decoder.layers.{}.mlp.router.jitter", l),
                  Tensor(jitter.back().data(), {opt.micro_batch * cfg.seq_length, cfg.hidden_size}, DType::kF32)});
  }
  ts.push_back({"tokens", tt});
  ts.push_back({"labels", lt});
  ASSERT_TRUE(write_safetensors(in, ts, {{"config", config_json(cfg, std::max<int64_t>(1, opt.moe_capacity_segments)).dump()}}).is_ok());
  const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/model/reference_gpt.py " + in + " " + out;
  int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3 (apt install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  auto ref = read_safetensors(out);
  ASSERT_TRUE(ref.is_ok()) << ref.status().message();

  Tensor ours(logits.data(), m.logits(0).shape(), DType::kF32);
  EXPECT_LT(rel_err<float>(ours, *ref->get("logits")), 1e-5) << "logits";
  const double ref_loss = ref->get("loss")->ptr<float>()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "loss";
  if (cfg.mtp_layers()) {
    // Megatron's acceptance counts from a training forward (no dropout in
    // these models): the greedy guesses equal to the labels, as PyTorch's
    // argmax finds them, out of the counted labels.
    m.take_mtp_stats();
    m.forward(0, tt, lt, 0, true);
    const GPTModel::MtpStats st = m.take_mtp_stats();
    ASSERT_EQ(st.correct.size(), static_cast<size_t>(cfg.mtp_layers()));
    EXPECT_EQ(st.micro_batches, 1);
    for (int k = 0; k < cfg.mtp_layers(); ++k) {
      EXPECT_EQ(st.correct[static_cast<size_t>(k)], ref->get("mtp_correct")->ptr<float>()[k]) << "MTP depth " << k + 1;
      EXPECT_EQ(st.total[static_cast<size_t>(k)], m.mtp_label_count(0, k));
    }
    // Labels made guessable: depth 1's argmax as the label one ahead at
    // every other position (the logits depend on the tokens only), then
    // the counts against the argmax of our own logits, row by row.
    std::vector<int32_t> lab2 = lab;
    const int64_t B = opt.micro_batch, T = cfg.seq_length, Vl = m.local_vocab();
    {
      const Tensor lg = m.mtp_logits(0, 0);
      for (int64_t t = 0; t + 1 < T; t += 2)
        for (int64_t b = 0; b < B; ++b) {
          const float* row = lg.ptr<float>() + (t * B + b) * Vl;
          lab2[static_cast<size_t>(b * T + t + 1)] = static_cast<int32_t>(std::max_element(row, row + Vl) - row);
        }
    }
    Tensor lt2(lab2.data(), {B, T}, DType::kI32);
    m.forward(0, tt, lt2, 0, true);
    const GPTModel::MtpStats st2 = m.take_mtp_stats();
    for (int k = 0; k < cfg.mtp_layers(); ++k) {
      const Tensor lg = m.mtp_logits(0, k);
      double want = 0;
      for (int64_t t = 0; t + k + 1 < T; ++t)
        for (int64_t b = 0; b < B; ++b) {
          const int32_t label = lab2[static_cast<size_t>(b * T + t + k + 1)];
          const float* row = lg.ptr<float>() + (t * B + b) * Vl;
          want += label >= 0 && std::max_element(row, row + Vl) - row == label ? 1 : 0;
        }
      EXPECT_EQ(st2.correct[static_cast<size_t>(k)], want) << "MTP depth " << k + 1;
      if (k == 0) {
        EXPECT_GE(want, static_cast<double>(B * (T / 2))) << "the guessable labels";
      }
    }
  }
  for (int k = 0; k < cfg.mtp_layers(); ++k) {
    const double r = ref->get("mtp_loss")->ptr<float>()[k];
    EXPECT_NEAR(mtp_loss[static_cast<size_t>(k)], r, 1e-5 * r) << "MTP depth " << k + 1 << "'s loss";
    EXPECT_GT(std::abs(mtp_loss[static_cast<size_t>(k)] - loss), 1e-3) << "a loss of its own";
  }
  if (cfg.is_moe()) {
    const double aux = ref->get("moe_aux")->ptr<float>()[0], z = ref->get("moe_z")->ptr<float>()[0];
    EXPECT_NEAR(m.moe_load_balancing_loss(0), aux, 1e-5 * aux) << "load-balancing loss";
    EXPECT_NEAR(m.moe_z_loss(0), cfg.moe_z_loss_coeff ? z : 0.0, 1e-5 * z) << "z-loss";
    EXPECT_GT(aux, 0.5 * static_cast<double>(cfg.num_moe_layers())) << "E sum f_i P_i is about 1 per MoE layer";
  }
  for (size_t i = 0; i < m.specs().size(); ++i) {
    auto g = ref->get("grad." + m.specs()[i].name);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_LT(rel_err<float>(m.grads()[i], *g), 1e-5) << m.specs()[i].name;
  }
  if (cfg.drops_tokens()) {  // the same model without dropping gives other logits: tokens were dropped
    ModelConfig dropless = cfg;
    dropless.moe_expert_capacity_factor.reset();
    auto d = GPTModel::create(dropless, opt);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    for (size_t i = 0; i < m.specs().size(); ++i) copy_tensor(m.params()[i], (*d)->params()[i]);
    const auto bias = m.expert_bias_tensors(), dbias = (*d)->expert_bias_tensors();
    for (size_t i = 0; i < bias.size(); ++i) copy_tensor(bias[i].second, dbias[i].second);
    (*d)->forward(0, tt, lt, 0, true);
    EXPECT_GT(rel_err<float>((*d)->logits(0), Tensor(logits.data(), m.logits(0).shape(), DType::kF32)), 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, VsPyTorch,
                         ::testing::Values("gpt2", "llama", "postln", "llama31", "gpt1p", "qwen", "sqrelu", "qwen3",
                                           "gptqk", "mixtral", "moegpt", "moeshared", "moesharedgate", "sigmoid", "grouped",
                                           "grouped_sigmoid", "capacity", "capacity_position", "capacity_sigmoid",
                                           "seq_aux", "seq_aux_sigmoid", "moefreq", "moefreq_sigmoid", "jitter",
                                           "jitter_sigmoid", "mla", "mla_gpt", "mtp_llama", "mtp_gpt", "mtp_deepseek",
                                           "mtp_repeated"));

// --squared-relu is refused where Megatron refuses it: with its default fused
// bias-activation (GELU/SwiGLU only), and beside --swiglu.
TEST(GPTModel, SquaredReluNeedsNoBiasGeluFusion) {
  ModelConfig c = gpt2_style();
  c.squared_relu = true;
  auto m = GPTModel::create(c, {});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--no-bias-gelu-fusion"), std::string::npos) << m.status().message();
  c.add_bias_linear = false;  // no bias: Megatron turns the fusion off
  EXPECT_TRUE(GPTModel::create(c, {}).is_ok());
  c = llama_style();
  c.squared_relu = true;
  m = GPTModel::create(c, {});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--squared-relu and --swiglu"), std::string::npos) << m.status().message();
}

// Central differences (h = 1e-5) of `loss` for three elements of every
// parameter of an fp64 model, against the gradients its backward left:
// within 1e-6 of the parameter's largest gradient. pick(i, rep) names the
// element of parameter i to check, or -1 for a random one.
void expect_gradients_match_fd(GPTModel& m, const std::function<double()>& loss,
                               const std::function<int64_t(size_t, int)>& pick, uint32_t seed) {
  std::mt19937 g(seed);
  for (size_t i = 0; i < m.specs().size(); ++i) {
    Tensor p = m.params()[i], gr = m.grads()[i];
    double scale = 1e-12;
    for (int64_t e = 0; e < gr.numel(); ++e) scale = std::max(scale, std::abs(gr.ptr<double>()[e]));
    for (int rep = 0; rep < 3; ++rep) {
      int64_t e = static_cast<int64_t>(g() % p.numel());
      if (const int64_t chosen = pick(i, rep); chosen >= 0) e = chosen;
      const double old = p.ptr<double>()[e], hh = 1e-5;
      p.ptr<double>()[e] = old + hh;
      const double lp = loss();
      p.ptr<double>()[e] = old - hh;
      const double lm = loss();
      p.ptr<double>()[e] = old;
      EXPECT_NEAR((lp - lm) / (2 * hh), gr.ptr<double>()[e], 1e-6 * scale) << m.specs()[i].name << " [" << e << "]";
    }
  }
}

// --init-method-xavier-uniform: every weight and embedding uniform in
// (-a, a), a = sqrt(6 / (fan_in + fan_out)) of its whole [out, in] tensor
// (torch's xavier_uniform_): bounds, variance a^2 / 3, mean 0; norms and
// biases keep their ones and zeros.
TEST(GPTModel, XavierUniformInitialisation) {
  ModelConfig cfg = llama_style();
  cfg.init_method_xavier_uniform = true;
  GPTOptions opt;
  opt.micro_batch = 1;
  auto m = GPTModel::create(cfg, opt);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  (*m)->init_parameters(3);
  int checked = 0;
  for (size_t i = 0; i < (*m)->specs().size(); ++i) {
    const ParamSpec& sp = (*m)->specs()[i];
    const Tensor& p = (*m)->params()[i];
    const float* v = p.ptr<float>();
    if (sp.init != InitKind::kNormal && sp.init != InitKind::kScaledNormal) continue;
    ASSERT_EQ(sp.global_shape.ndim, 2) << sp.name;
    const double a = std::sqrt(6.0 / static_cast<double>(sp.global_shape[0] + sp.global_shape[1]));
    double sum = 0, sq = 0, top = 0;
    for (int64_t j = 0; j < p.numel(); ++j) sum += v[j], sq += double(v[j]) * v[j], top = std::max(top, std::fabs(double(v[j])));
    const double n = static_cast<double>(p.numel()), mean = sum / n, var = sq / n - mean * mean;
    EXPECT_LT(top, a) << sp.name;
    EXPECT_GT(top, 0.95 * a) << sp.name;
    EXPECT_NEAR(var, a * a / 3, 0.1 * a * a / 3 + 4 * a * a / std::sqrt(n)) << sp.name;
    EXPECT_NEAR(mean, 0, 4 * a / std::sqrt(3 * n)) << sp.name;
    ++checked;
  }
  EXPECT_GE(checked, 2 + 4 * cfg.num_layers);  // embedding, output layer, and qkv, proj, fc1, fc2 per layer
}

// --embedding-init-method-std: the word and position embeddings are
// normal(0, that std), drawn from the same streams (so exactly the default's
// values scaled), under --init-method-xavier-uniform too; every other tensor
// is untouched; equal to --init-method-std it changes nothing.
TEST(GPTModel, EmbeddingInitMethodStd) {
  for (bool xavier : {false, true}) {
    ModelConfig cfg = gpt2_style();
    cfg.init_method_xavier_uniform = xavier;
    GPTOptions opt;
    opt.micro_batch = 1;
    auto make = [&](std::optional<double> emb) {
      ModelConfig c = cfg;
      c.embedding_init_method_std = emb;
      auto m = GPTModel::create(c, opt);
      MT_CHECK(m.is_ok(), m.status().message());
      (*m)->init_parameters(3);
      return std::move(*m);
    };
    auto base = make(std::nullopt), same = make(cfg.init_method_std), big = make(1.0);
    int embeddings = 0;
    for (size_t i = 0; i < base->specs().size(); ++i) {
      const std::string& name = base->specs()[i].name;
      const Tensor &b = base->params()[i], &s = same->params()[i], &g = big->params()[i];
      EXPECT_EQ(0, std::memcmp(b.data(), s.data(), b.nbytes())) << name << ": equal stds change nothing";
      if (name.rfind("embedding.", 0) != 0) {
        EXPECT_EQ(0, std::memcmp(b.data(), g.data(), b.nbytes())) << name;
        continue;
      }
      ++embeddings;
      double sq = 0;
      for (int64_t j = 0; j < g.numel(); ++j) sq += double(g.ptr<float>()[j]) * g.ptr<float>()[j];
      const double n = static_cast<double>(g.numel());
      EXPECT_NEAR(std::sqrt(sq / n), 1.0, 4.0 / std::sqrt(n) + 0.01) << name;
      if (!xavier)  // the same normal draws, scaled from 0.02 to 1
        for (int64_t j = 0; j < g.numel(); j += 97)
          EXPECT_NEAR(g.ptr<float>()[j], b.ptr<float>()[j] / cfg.init_method_std, 1e-5 * (1 + std::fabs(g.ptr<float>()[j])))
              << name << " [" << j << "]";
    }
    EXPECT_EQ(embeddings, 2) << "word and position embeddings";
  }
}

// The whole model in fp64 against central differences, with dropout on
// (masks are regenerated from the seed, so the loss is a fixed function).
TEST(GPTModel, Fp64GradientsMatchFiniteDifferences_WithDropout) {
  for (ModelConfig cfg : {gpt2_style(), llama_style(), qwen3_style(), gpt_qk_style()}) {
    cfg.num_layers = 1, cfg.seq_length = 5;
    cfg.hidden_dropout = 0.2, cfg.attention_dropout = 0.2;
    GPTOptions opt;
    opt.micro_batch = 2, opt.dtype = DType::kF64;
    auto m = GPTModel::create(cfg, opt);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    (*m)->init_parameters(5);
    std::vector<int32_t> tok, lab;
    random_batch(2, 5, *cfg.vocab_size, 9, tok, lab);
    Tensor tt(tok.data(), {2, 5}, DType::kI32), lt(lab.data(), {2, 5}, DType::kI32);
    (*m)->zero_grads();
    (*m)->forward(0, tt, lt, 3, true);
    (*m)->backward(0);
    expect_gradients_match_fd(
        **m, [&] { return (*m)->forward(0, tt, lt, 3, true); },
        [&](size_t i, int rep) { return i == 0 ? tok[rep] * cfg.hidden_size + rep : -1; }, 1);  // a used embedding row
  }
}

// --reset-position-ids and --reset-attention-mask: position and segment ids
// as the data loader makes them (a new document after each EOD: positions
// restart at 0, segment + 1).
void document_ids(const std::vector<int32_t>& tok, int64_t B, int64_t T, int32_t eod, std::vector<int32_t>& pos,
                  std::vector<int32_t>& seg) {
  pos.assign(B * T, 0), seg.assign(B * T, 0);
  for (int64_t b = 0; b < B; ++b) {
    int32_t p = 0, sg = 0;
    for (int64_t t = 0; t < T; ++t) {
      pos[b * T + t] = p++, seg[b * T + t] = sg;
      if (tok[b * T + t] == eod) p = 0, ++sg;
    }
  }
}

// With both flags a document inside a sequence is computed as if it began
// the sequence: sequence 0 holds document A (4 tokens, the last an EOD),
// then document B; its logits at B's positions equal a plain model's on B
// placed at position 0, and at A's positions the plain model's on the
// original tokens; sequence 1 (no EOD) equals the plain model throughout.
// Learned positions (GPT: the embeddings follow the restarted ids) and RoPE
// (LLaMA: rotated by sequence index, as in Megatron; inside a document only
// relative positions matter, so B still equals B at position 0, to
// rounding); then finite differences of the
// whole model in fp64 with both flags and dropout (a one-token document in
// sequence 1 as well).
TEST(GPTModel, ResetFlagsMakeDocumentsIndependent) {
  for (ModelConfig cfg : {gpt2_style(), llama_style()}) {
    const int64_t B = 2, T = cfg.seq_length, V = *cfg.vocab_size;
    const int32_t eod = 7;
    GPTOptions plain;
    plain.micro_batch = B, plain.dtype = DType::kF64;
    GPTOptions docs = plain;
    docs.reset_position_ids = docs.reset_attention_mask = true;
    auto P = GPTModel::create(cfg, plain);
    auto M = GPTModel::create(cfg, docs);
    ASSERT_TRUE(P.is_ok() && M.is_ok()) << (P.is_ok() ? M.status().message() : P.status().message());
    (*P)->init_parameters(8), (*M)->init_parameters(8);
    std::vector<int32_t> tok, lab;
    random_batch(B, T, V, 21, tok, lab);
    for (auto& t : tok) t = t == eod ? eod + 1 : t;  // only the EOD placed below
    tok[3] = eod;  // document A = positions 0..3 of sequence 0
    std::vector<int32_t> pos, seg;
    document_ids(tok, B, T, eod, pos, seg);
    const Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
    const Tensor pt(pos.data(), {B, T}, DType::kI32), st(seg.data(), {B, T}, DType::kI32);
    (*M)->forward(0, tt, lt, 0, false, pt, st);
    std::vector<double> got((*M)->logits(0).ptr<double>(), (*M)->logits(0).ptr<double>() + (*M)->logits(0).numel());
    const int64_t Vp = (*M)->local_vocab();
    auto row = [&](const std::vector<double>& l, int64_t t, int64_t b) { return &l[static_cast<size_t>((t * B + b) * Vp)]; };
    auto max_diff = [&](const double* a, const double* b) {
      double m = 0;
      for (int64_t v = 0; v < Vp; ++v) m = std::max(m, std::abs(a[v] - b[v]));
      return m;
    };
    (*P)->forward(0, tt, lt, 0, false);
    const Tensor pl = (*P)->logits(0);
    std::vector<double> whole(pl.ptr<double>(), pl.ptr<double>() + pl.numel());
    std::vector<int32_t> shifted = tok;  // document B moved to position 0 of sequence 0
    for (int64_t t = 0; t < T; ++t) shifted[t] = t + 4 < T ? tok[t + 4] : 1;
    (*P)->forward(0, Tensor(shifted.data(), {B, T}, DType::kI32), lt, 0, false);
    std::vector<double> moved(pl.ptr<double>(), pl.ptr<double>() + pl.numel());
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      worst = std::max(worst, max_diff(row(got, t, 0), t < 4 ? row(whole, t, 0) : row(moved, t - 4, 0)));
      worst = std::max(worst, max_diff(row(got, t, 1), row(whole, t, 1)));
    }
    EXPECT_LT(worst, 1e-12) << position_embedding_name(cfg.position_embedding);
    // The flags change the result (document B does see document A without them).
    EXPECT_GT(max_diff(row(got, 6, 0), row(whole, 6, 0)), 1e-3);

    // Finite differences with both flags and dropout.
    ModelConfig small = cfg;
    small.num_layers = 1, small.seq_length = 6, small.hidden_dropout = 0.2, small.attention_dropout = 0.2;
    auto F = GPTModel::create(small, docs);
    ASSERT_TRUE(F.is_ok()) << F.status().message();
    (*F)->init_parameters(5);
    std::vector<int32_t> ftok, flab, fpos, fseg;
    random_batch(B, 6, V, 9, ftok, flab);
    for (auto& t : ftok) t = t == eod ? eod + 1 : t;
    ftok[2] = eod, ftok[6 + 0] = eod, ftok[6 + 1] = eod;  // documents 0-2 | 3-5; 0 | 1 | 2-5
    document_ids(ftok, B, 6, eod, fpos, fseg);
    const Tensor ft(ftok.data(), {B, 6}, DType::kI32), fl(flab.data(), {B, 6}, DType::kI32);
    const Tensor fp(fpos.data(), {B, 6}, DType::kI32), fs(fseg.data(), {B, 6}, DType::kI32);
    (*F)->zero_grads();
    (*F)->forward(0, ft, fl, 3, true, fp, fs);
    (*F)->backward(0);
    expect_gradients_match_fd(
        **F, [&] { return (*F)->forward(0, ft, fl, 3, true, fp, fs); },
        [&](size_t i, int rep) {  // a used position row
          return (*F)->specs()[i].name == "embedding.position_embeddings.weight"
                     ? fpos[static_cast<size_t>(rep + 3)] * small.hidden_size + rep
                     : -1;
        },
        2);
  }
}

// --bf16 (Megatron's: the residual stream and its gradient in bf16 too) and
// --bf16 --fp32-residual-connection against fp32: losses and gradients
// within bf16 tolerance; the two bf16 modes differ (the flag is not a no-op),
// hold the residual stream in the dtype they promise, and the bf16 stream
// plans fewer activation bytes.
TEST(GPTModel, Bf16ComputeMatchesFp32WithinBf16Tolerance) {
  for (const ModelConfig& cfg : {llama_style(), gpt2_style()}) {
    std::vector<int32_t> tok, lab;
    random_batch(2, cfg.seq_length, *cfg.vocab_size, 11, tok, lab);
    Tensor tt(tok.data(), {2, cfg.seq_length}, DType::kI32), lt(lab.data(), {2, cfg.seq_length}, DType::kI32);
    double loss[3];
    size_t acts[3];
    std::vector<std::vector<float>> grads(3);
    // mode 0: fp32; 1: bf16 with an fp32 residual stream; 2: bf16 (bf16 residual stream).
    for (int mode = 0; mode < 3; ++mode) {
      GPTOptions opt;
      opt.micro_batch = 2, opt.half_compute = mode > 0, opt.fp32_residual = mode == 1;
      auto m = GPTModel::create(cfg, opt);
      ASSERT_TRUE(m.is_ok());
      EXPECT_EQ((*m)->residual_dtype(), mode == 2 ? DType::kBF16 : DType::kF32) << mode;
      EXPECT_EQ((*m)->chunk_input(0).dtype(), (*m)->residual_dtype()) << mode;
      acts[mode] = (*m)->memory_plan().activations_per_slot;
      (*m)->init_parameters(3);
      (*m)->zero_grads();
      loss[mode] = (*m)->forward(0, tt, lt, 0, false);
      (*m)->backward(0);
      Tensor g = (*m)->grad("decoder.layers.0.mlp.linear_fc1.weight");
      grads[mode].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
    }
    for (int mode = 1; mode < 3; ++mode) {
      EXPECT_NEAR(loss[mode], loss[0], 1e-2 * loss[0]) << mode;
      Tensor a(grads[mode].data(), {static_cast<int64_t>(grads[mode].size())}, DType::kF32);
      Tensor b(grads[0].data(), {static_cast<int64_t>(grads[0].size())}, DType::kF32);
      EXPECT_LT(rel_err<float>(a, b), 3e-2) << mode;
    }
    EXPECT_NE(loss[2], loss[1]);
    EXPECT_NE(grads[2], grads[1]);
    EXPECT_LT(acts[2], acts[1]);
  }
}

// --fp16: the same 16-bit paths with IEEE half (11-bit significand, 8x
// finer than bf16's, range +-65504). Loss and gradients within fp16
// tolerance of fp32 (an order tighter than bf16's), the fp16 residual stream
// stored as fp16 and smaller than the fp32 one; a backward seeded with the
// loss scale 2^12 gives 2^12 x the gradients up to fp16 rounding (the
// activation gradients underflow less), and an overflowing scale (2^32) puts
// inf or NaN in the gradients, which is how the trainer's scaler finds it.
TEST(GPTModel, Fp16ComputeMatchesFp32WithinFp16Tolerance) {
  for (const ModelConfig& cfg : {llama_style(), gpt2_style()}) {
    std::vector<int32_t> tok, lab;
    random_batch(2, cfg.seq_length, *cfg.vocab_size, 11, tok, lab);
    Tensor tt(tok.data(), {2, cfg.seq_length}, DType::kI32), lt(lab.data(), {2, cfg.seq_length}, DType::kI32);
    auto run = [&](int mode, double scale, double* loss, std::vector<float>* grad, size_t* acts) {
      GPTOptions opt;
      opt.micro_batch = 2, opt.half_compute = mode > 0, opt.fp32_residual = mode == 1, opt.half = DType::kF16;
      auto m = GPTModel::create(cfg, opt);
      ASSERT_TRUE(m.is_ok()) << m.status().message();
      EXPECT_EQ((*m)->residual_dtype(), mode == 2 ? DType::kF16 : DType::kF32) << mode;
      *acts = (*m)->memory_plan().activations_per_slot;
      (*m)->init_parameters(3);
      (*m)->zero_grads();
      *loss = (*m)->forward(0, tt, lt, 0, false);
      (*m)->backward(0, scale);
      Tensor g = (*m)->grad("decoder.layers.0.mlp.linear_fc1.weight");
      grad->assign(g.ptr<float>(), g.ptr<float>() + g.numel());
    };
    double loss[3];
    size_t acts[3];
    std::vector<std::vector<float>> grads(3);
    for (int mode = 0; mode < 3; ++mode) run(mode, 1.0, &loss[mode], &grads[mode], &acts[mode]);
    auto as_t = [](std::vector<float>& v) { return Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::kF32); };
    for (int mode = 1; mode < 3; ++mode) {
      EXPECT_NEAR(loss[mode], loss[0], 2e-3 * loss[0]) << mode;
      EXPECT_LT(rel_err<float>(as_t(grads[mode]), as_t(grads[0])), 5e-3) << mode;
    }
    EXPECT_LT(acts[2], acts[1]);
    // Scaled by 2^12: the same loss, 2^12 x the gradient within fp16 rounding.
    double ls;
    size_t a;
    std::vector<float> gs;
    run(2, 4096.0, &ls, &gs, &a);
    EXPECT_EQ(ls, loss[2]);
    for (float& v : gs) v /= 4096.0f;
    EXPECT_LT(rel_err<float>(as_t(gs), as_t(grads[0])), 5e-3);
    // 2^32 overflows fp16's activation gradients.
    run(2, 4294967296.0, &ls, &gs, &a);
    bool finite = true;
    for (float v : gs) finite = finite && std::isfinite(v);
    EXPECT_FALSE(finite);
  }
}

TEST(ParamRegistry, MegatronNamesShardsAndPlannerCounts) {
  ModelConfig cfg = llama_style();
  auto specs = gpt_param_specs(cfg, 1);
  int64_t total = 0;
  for (auto& s : specs) total += s.global_shape.numel();
  EXPECT_EQ(total, model_params(cfg, cfg.padded_vocab(1)).total());
  EXPECT_EQ(specs.front().name, "embedding.word_embeddings.weight");
  EXPECT_EQ(specs.back().name, "output_layer.weight");
  const ParamSpec* qkv = nullptr;
  for (auto& s : specs)
    if (s.name == "decoder.layers.1.self_attention.linear_qkv.weight") qkv = &s;
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->global_shape, (Shape{(6 + 2 * 2) * 8, 48}));
  EXPECT_EQ(qkv->shard, ShardKind::kColumn);
  EXPECT_EQ(qkv->local_shape(2), (Shape{40, 48}));  // one query group of [3 q | k | v] heads per rank
  EXPECT_EQ(specs[1].te_name(), "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight");
  ModelConfig gpt = gpt2_style();
  auto g = gpt_param_specs(gpt, 1);
  EXPECT_EQ(g[0].global_shape, (Shape{96, 32}));  // 91 padded to a multiple of 16
  EXPECT_EQ(int64_t(g.size()), 2 + 12 * 2 + 2);
}

TEST(GPTModel, ConfigErrorsAreListed) {
  ModelConfig cfg = llama_style();
  cfg.num_query_groups = 4;  // 6 heads do not split into 4 groups
  cfg.num_experts = 2, cfg.moe_router_topk = 3;
  auto m = GPTModel::create(cfg, GPTOptions{});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--num-query-groups"), std::string::npos);
  EXPECT_NE(m.status().message().find("--moe-router-topk 3 exceeds --num-experts 2"), std::string::npos);
}

// What the MoE layer does not take is refused, each with its fix: expert
// biases, top-1 without the pre-softmax router (Megatron's rule), TP
// without SP, an expert width TP does not divide.
TEST(GPTModel, MoeConfigErrorsNameTheirFix) {
  ModelConfig cfg = gpt2_style();  // with biases
  cfg.num_experts = 4, cfg.moe_router_topk = 1, cfg.moe_ffn_hidden_size = 30;
  GPTOptions opt;
  opt.tp = 4;
  auto m = GPTModel::planned_bytes(cfg, opt);
  ASSERT_FALSE(m.is_ok());
  const std::string msg = m.status().message();
  for (const char* want : {"add --disable-bias-linear", "add --moe-router-pre-softmax", "needs --sequence-parallel",
                           "--moe-ffn-hidden-size 30 is not divisible by --tensor-model-parallel-size 4"})
    EXPECT_NE(msg.find(want), std::string::npos) << want << " in:\n" << msg;
  cfg.add_bias_linear = false, cfg.moe_router_pre_softmax = true, cfg.moe_ffn_hidden_size = 32;
  opt.sequence_parallel = true;
  EXPECT_TRUE(GPTModel::planned_bytes(cfg, opt).is_ok());
}

}  // namespace
}  // namespace mt::model
