// The KV-cache decoder against GPTModel::forward (an independent path: the
// flash-attention kernel over the whole sequence, the training layer code):
// the logits of every position agree to 1e-5 relative in fp32 (1e-12 in fp64),
// for prefill + one-token steps and for chunked prefills, on GPT-2 style
// (learned positions, LayerNorm, GELU, biases, tied output), LLaMA style
// (RoPE, GQA, RMSNorm, SwiGLU, no biases, untied), post-norm residuals and
// multi-query attention; sequences longer than the attention tiles.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "infer/decoder.h"
#include "kernels/kv_attention.h"

namespace mt::infer {
namespace {

using model::ModelConfig;

ModelConfig gpt2_style() {
  ModelConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 80;  // > one 64-row tile
  c.max_position_embeddings = 96, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1;  // off in inference; must not matter
  c.init_method_std = 0.2;
  return c;
}
ModelConfig llama_style() {
  ModelConfig c = gpt2_style();
  c.hidden_size = 48, c.num_attention_heads = 6, c.group_query_attention = true, c.num_query_groups = 2;
  c.normalization = model::Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 80;
  c.position_embedding = model::PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true, c.norm_epsilon = 1e-6, c.rotary_base = 500;
  return c;
}
ModelConfig post_ln_style() {
  ModelConfig c = gpt2_style();
  c.apply_residual_connection_post_layernorm = true, c.openai_gelu = true, c.untie_embeddings_and_output_weights = true;
  return c;
}
ModelConfig llama31_style() {  // Llama 3.1 RoPE scaling, half of each head rotated, interpolation 2
  ModelConfig c = llama_style();
  c.rotary_base = 2e5, c.rotary_percent = 0.4, c.use_rope_scaling = true, c.rope_scaling_factor = 8;
  c.rotary_seq_len_interpolation_factor = 2;
  c.apply_layernorm_1p = true;
  return c;
}
ModelConfig qwen_style() {  // a bias on QKV only, interleaved RoPE pairs
  ModelConfig c = llama_style();
  c.add_qkv_bias = true;
  c.rotary_interleaved = true;
  return c;
}
ModelConfig mqa_style() {  // one key/value head, RoPE, LayerNorm
  ModelConfig c = llama_style();
  c.num_query_groups = 1, c.normalization = model::Normalization::kLayerNorm, c.swiglu = false;
  return c;
}

ModelConfig qwen3_style() {  // --qk-layernorm (RMSNorm over each q/k head), head dim 16 != h/a
  ModelConfig c = llama_style();
  c.qk_layernorm = true, c.kv_channels = 16;
  return c;
}
ModelConfig qk_ln_style() {  // LayerNorm q/k norms with zero-centred weights, one key/value head
  ModelConfig c = mqa_style();
  c.qk_layernorm = true, c.apply_layernorm_1p = true;
  return c;
}

ModelConfig mixtral_style() {  // MoE: 4 experts, top-2
  ModelConfig c = llama_style();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24;
  return c;
}

ModelConfig moe_gpt_style() {  // MoE GPT: 3 experts, top-1 with the pre-softmax router, no biases
  ModelConfig c = gpt2_style();
  c.add_bias_linear = false, c.num_experts = 3, c.moe_router_topk = 1, c.moe_router_pre_softmax = true;
  return c;
}

ModelConfig sigmoid_style() {  // DeepSeek-V3's sigmoid router (its expert bias at zero)
  ModelConfig c = mixtral_style();
  c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
  return c;
}

ModelConfig shared_style() {  // MoE GPT with a shared expert beside its routed ones
  ModelConfig c = moe_gpt_style();
  c.moe_shared_expert_intermediate_size = 24;
  return c;
}

// --moe-layer-freq: MoE on every other layer from layer 0 (the others a
// dense MLP 80 wide beside experts 24 wide); the GPT with a shared expert
// dense in its first layer only.
ModelConfig moe_freq_style() {
  ModelConfig c = mixtral_style();
  c.moe_layer_freq = "2";
  return c;
}
ModelConfig moe_freq_shared_style() {
  ModelConfig c = shared_style();
  c.moe_layer_freq = "[0]+[1]*" + std::to_string(c.num_layers - 1);
  return c;
}

// --multi-latent-attention: DeepSeek-style (low-rank queries, q/kv
// RMSNorms, YaRN with both mscales, values narrower than the heads), and the
// GPT functional test's (linear_q_proj, LayerNorm, learned positions,
// --rope-type rope on half the position dims).
ModelConfig mla_style() {
  ModelConfig c = llama_style();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.q_lora_rank = 24, c.kv_lora_rank = 16, c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4, c.v_head_dim = 6, c.qk_layernorm = true;
  c.rotary_scaling_factor = 40, c.mscale = 1.0, c.mscale_all_dim = 0.707;
  return c;
}
ModelConfig mla_gpt_style() {
  ModelConfig c = gpt2_style();
  c.multi_latent_attention = true, c.kv_lora_rank = 12, c.qk_head_dim = 6, c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 10, c.rope_type = "rope", c.rotary_percent = 0.5;
  return c;
}

template <typename T>
double row_rel_err(const T* a, const T* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    num += (x - y) * (x - y), den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Forward of a B = 2 micro-batch; returns sequence `b`'s logits [T, V].
template <typename T>
std::vector<T> full_forward_logits(model::GPTModel& m, const std::vector<int32_t>& tok2, int64_t b) {
  const int64_t B = 2, Tn = m.options().seq_length, V = m.vocab();
  std::vector<int32_t> lab(tok2.size(), 0);
  Tensor tt(const_cast<int32_t*>(tok2.data()), {B, Tn}, DType::kI32), lt(lab.data(), {B, Tn}, DType::kI32);
  m.forward(0, tt, lt, 0, /*training=*/false);
  const T* lg = m.logits(0).ptr<T>();  // [s, b] rows
  std::vector<T> out(static_cast<size_t>(Tn * V));
  for (int64_t t = 0; t < Tn; ++t)
    std::copy(lg + (t * B + b) * V, lg + (t * B + b + 1) * V, out.begin() + t * V);
  return out;
}

struct Case {
  const char* name;
  ModelConfig (*cfg)();
};
class DecoderVsForward : public ::testing::TestWithParam<Case> {};

template <typename T>
void check_config(const ModelConfig& cfg, DType dt, double tol) {
  model::GPTOptions opt;
  opt.micro_batch = 2, opt.dtype = dt;
  auto created = model::GPTModel::create(cfg, opt);
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  model::GPTModel& m = **created;
  m.init_parameters(42);
  {  // biases and zero-centred gammas start at 0: move them so that their paths carry signal
    std::mt19937 gen(5);
    std::normal_distribution<double> nd(0.0, 0.2);
    for (size_t i = 0; i < m.specs().size(); ++i) {
      const std::string& name = m.specs()[i].name;
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      const bool gamma = cfg.apply_layernorm_1p && name.find("layernorm.weight") != std::string::npos;
      const bool qk = name.find("self_attention.q_layernorm") != std::string::npos ||
                      name.find("self_attention.k_layernorm") != std::string::npos;
      if (!bias && !gamma && !qk) continue;
      for (int64_t j = 0; j < m.params()[i].numel(); ++j) m.params()[i].ptr<T>()[j] = static_cast<T>(nd(gen));
    }
  }
  const int64_t Tn = cfg.seq_length, V = m.vocab();
  std::mt19937 g(3);
  std::vector<int32_t> tok2(static_cast<size_t>(2 * Tn));
  for (auto& t : tok2) t = static_cast<int32_t>(g() % *cfg.vocab_size);
  const std::vector<T> ref = full_forward_logits<T>(m, tok2, 1);
  const std::vector<int32_t> seq(tok2.begin() + Tn, tok2.end());  // sequence b = 1 ([b, s] input order)

  // Prefill 13 tokens (all logits), then one token at a time (last logits).
  auto dec = Decoder::create(m);
  ASSERT_TRUE(dec.is_ok()) << dec.status().message();
  const int64_t P = 13;
  std::vector<T> pre(static_cast<size_t>(P * V)), one(static_cast<size_t>(V));
  ASSERT_TRUE((*dec)->append(std::span(seq.data(), P), Tensor(pre.data(), {P, V}, dt)).is_ok());
  double worst = 0;
  for (int64_t t = 0; t < P; ++t) worst = std::max(worst, row_rel_err(pre.data() + t * V, ref.data() + t * V, V));
  for (int64_t t = P; t < Tn; ++t) {
    ASSERT_TRUE((*dec)->append(std::span(seq.data() + t, 1), Tensor(one.data(), {V}, dt)).is_ok());
    worst = std::max(worst, row_rel_err(one.data(), ref.data() + t * V, V));
  }
  EXPECT_LT(worst, tol) << "prefill + steps";
  EXPECT_EQ((*dec)->length(), Tn);

  // One prefill of everything in chunks of 7 rows, on a decoder of exactly Tn positions.
  auto chunked = Decoder::create(m, DecoderOptions{Tn, 7});
  ASSERT_TRUE(chunked.is_ok());
  std::vector<T> all(static_cast<size_t>(Tn * V));
  ASSERT_TRUE((*chunked)->append(seq, Tensor(all.data(), {Tn, V}, dt)).is_ok());
  worst = 0;
  for (int64_t t = 0; t < Tn; ++t) worst = std::max(worst, row_rel_err(all.data() + t * V, ref.data() + t * V, V));
  EXPECT_LT(worst, tol) << "chunked prefill";

  // Truncate and replay: the cache is rewritten, the logits repeat exactly.
  (*dec)->truncate(20);
  ASSERT_TRUE((*dec)->append(std::span(seq.data() + 20, 1), Tensor(one.data(), {V}, dt)).is_ok());
  std::vector<T> again(one);
  (*dec)->reset();
  ASSERT_TRUE((*dec)->append(std::span(seq.data(), 21), Tensor(one.data(), {V}, dt)).is_ok());
  EXPECT_LT(row_rel_err(one.data(), again.data(), V), tol);
  EXPECT_LT(row_rel_err(one.data(), ref.data() + 20 * V, V), tol);
}

TEST_P(DecoderVsForward, EveryPositionMatchesFp32) {
  check_config<float>(GetParam().cfg(), DType::kF32, 1e-5);
}
TEST_P(DecoderVsForward, EveryPositionMatchesFp64) {
  check_config<double>(GetParam().cfg(), DType::kF64, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Configs, DecoderVsForward,
                         ::testing::Values(Case{"gpt2", gpt2_style}, Case{"llama", llama_style},
                                           Case{"postln", post_ln_style}, Case{"mqa", mqa_style},
                                           Case{"llama31", llama31_style}, Case{"qwen", qwen_style},
                                           Case{"qwen3", qwen3_style}, Case{"qk_ln", qk_ln_style},
                                           Case{"mixtral", mixtral_style}, Case{"moe_gpt", moe_gpt_style},
                                           Case{"shared_expert", shared_style}, Case{"sigmoid", sigmoid_style},
                                           Case{"moe_freq", moe_freq_style},
                                           Case{"moe_freq_shared", moe_freq_shared_style},
                                           Case{"mla", mla_style}, Case{"mla_gpt", mla_gpt_style}),
                         [](const auto& info) { return std::string(info.param.name); });

// Token dropping (--moe-expert-capacity-factor) counts the tokens of each
// call, as Megatron's inference router does: a prefill of a whole sequence
// drops as the model's forward of that one sequence (B = 1), and differs
// from the dropless model's.
TEST(Decoder, TokenDroppingOverTheCallsTokens) {
  for (const char* policy : {"probs", "position"}) {
    ModelConfig cfg = mixtral_style();
    cfg.moe_expert_capacity_factor = 0.5, cfg.moe_token_drop_policy = policy;
    model::GPTOptions opt;
    opt.micro_batch = 1;
    auto m = model::GPTModel::create(cfg, opt);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    (*m)->init_parameters(42);
    const int64_t Tn = cfg.seq_length, V = (*m)->vocab();
    std::mt19937 g(3);
    std::vector<int32_t> seq(static_cast<size_t>(Tn)), lab(seq.size(), 0);
    for (auto& t : seq) t = static_cast<int32_t>(g() % *cfg.vocab_size);
    (*m)->forward(0, Tensor(seq.data(), {1, Tn}, DType::kI32), Tensor(lab.data(), {1, Tn}, DType::kI32), 0, false);
    const float* ref = (*m)->logits(0).ptr<float>();
    auto dec = Decoder::create(**m);
    ASSERT_TRUE(dec.is_ok());
    std::vector<float> all(static_cast<size_t>(Tn * V));
    ASSERT_TRUE((*dec)->append(seq, Tensor(all.data(), {Tn, V}, DType::kF32)).is_ok());
    EXPECT_LT(row_rel_err(all.data(), ref, Tn * V), 1e-5) << policy;
    ModelConfig dropless = cfg;
    dropless.moe_expert_capacity_factor.reset();
    auto d = model::GPTModel::create(dropless, opt);
    ASSERT_TRUE(d.is_ok());
    (*d)->init_parameters(42);
    auto ddec = Decoder::create(**d);
    ASSERT_TRUE(ddec.is_ok());
    std::vector<float> free(all.size());
    ASSERT_TRUE((*ddec)->append(seq, Tensor(free.data(), {Tn, V}, DType::kF32)).is_ok());
    EXPECT_GT(row_rel_err(free.data(), all.data(), Tn * V), 1e-3) << policy << ": nothing was dropped";
  }
}

TEST(Decoder, ParametersOnlyModelAndErrors) {
  ModelConfig cfg = gpt2_style();
  model::GPTOptions opt;
  opt.slots = 0;  // what megatron generate creates
  auto m = model::GPTModel::create(cfg, opt);
  ASSERT_TRUE(m.is_ok());
  (*m)->init_parameters(1);
  auto too_long = Decoder::create(**m, DecoderOptions{97, 0});
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_NE(too_long.status().message().find("--max-position-embeddings 96"), std::string::npos);
  auto dec = Decoder::create(**m, DecoderOptions{8, 0});
  ASSERT_TRUE(dec.is_ok());
  EXPECT_EQ((*dec)->capacity(), 8);
  EXPECT_EQ((*dec)->cache_bytes(), 2u * 2 * 8 * 4 * 8 * 4);  // L * {K,V} * [8, g=4, d=8] fp32
  std::vector<int32_t> t(9, 1);
  std::vector<float> lg(static_cast<size_t>((*dec)->vocab()));
  Status st = (*dec)->append(t, Tensor(lg.data(), {(*dec)->vocab()}, DType::kF32));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("capacity of 8 positions"), std::string::npos) << st.message();
  EXPECT_EQ((*dec)->length(), 0);
  t.assign(2, 96);  // V = 96 after padding
  st = (*dec)->append(t, Tensor());
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  t.assign(2, 5);
  st = (*dec)->append(t, Tensor(lg.data(), {7}, DType::kF32));
  EXPECT_NE(st.message().find("logits must have"), std::string::npos) << st.message();
  EXPECT_TRUE((*dec)->append(t, Tensor()).is_ok());
  EXPECT_EQ((*dec)->length(), 2);
}

// The kernel alone against a plain softmax written out in double.
TEST(KvAttention, MatchesNaiveSoftmaxAttention) {
  const int64_t a = 4, g = 2, d = 8, Tmax = 10, pos = 5, n = 3;
  kernels::QkvLayout L{n, 1, a, g, d};
  std::mt19937 gen(9);
  std::normal_distribution<float> nd;
  std::vector<float> qkv(static_cast<size_t>(n * L.row())), kc(static_cast<size_t>(Tmax * g * d)), vc(kc.size()),
      out(static_cast<size_t>(n * a * d));
  for (auto& x : qkv) x = nd(gen);
  for (auto& x : kc) x = nd(gen);
  for (auto& x : vc) x = nd(gen);
  Tensor tq(qkv.data(), {n, L.row()}, DType::kF32), tk(kc.data(), {Tmax, g, d}, DType::kF32),
      tv(vc.data(), {Tmax, g, d}, DType::kF32), to(out.data(), {n, a * d}, DType::kF32);
  kernels::kv_cache_append(tq, L, pos, tk, tv);
  const double scale = 0.3;
  kernels::kv_attention(tq, L, tk, tv, pos, scale, to);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < a; ++h) {
      const int64_t grp = h / (a / g);
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j = 0; j <= pos + i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          // Keys of the new tokens come from qkv itself (appended above).
          const double kv = j >= pos ? qkv[static_cast<size_t>((j - pos) * L.row() + L.k_col(grp) + c)]
                                     : kc[static_cast<size_t>((j * g + grp) * d + c)];
          dot += qkv[static_cast<size_t>(i * L.row() + L.q_col(h) + c)] * kv;
        }
        s.push_back(dot * scale);
        mx = std::max(mx, dot * scale);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = 0; j <= pos + i; ++j) {
          const double v = j >= pos ? qkv[static_cast<size_t>((j - pos) * L.row() + L.v_col(grp) + c)]
                                    : vc[static_cast<size_t>((j * g + grp) * d + c)];
          o += s[static_cast<size_t>(j)] / sum * v;
        }
        EXPECT_NEAR(out[static_cast<size_t>(i * a * d + h * d + c)], o, 1e-5) << i << " " << h << " " << c;
      }
    }
}

}  // namespace
}  // namespace mt::infer
