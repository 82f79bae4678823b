// Hugging Face export and import (checkpoint/hf.h): the exported directory, run
// by an independent PyTorch implementation of transformers' GPT-2 / LLaMA /
// Qwen2 / Qwen3 / Mixtral / Qwen3-MoE models (tests/checkpoint/hf_reference.py, from config.json and the
// safetensors files only), gives our model's logits; the files are what
// transformers reads; unexportable models are refused with every reason.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/hf.h"
#include "core/flags.h"
#include <fmt/format.h>
#include <cstring>
#include <map>
#include "core/safetensors.h"
#include "model/gpt.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;

ModelConfig gpt2_cfg() {
  ModelConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 10;
  c.max_position_embeddings = 16, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;  // padded to 96
  c.hidden_dropout = 0, c.attention_dropout = 0, c.init_method_std = 0.2;
  return c;
}

ModelConfig llama_cfg() {
  ModelConfig c = gpt2_cfg();
  c.hidden_size = 48, c.num_attention_heads = 6, c.group_query_attention = true, c.num_query_groups = 2;
  c.normalization = model::Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 80;
  c.position_embedding = model::PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true, c.norm_epsilon = 1e-6, c.rotary_base = 500;
  return c;
}

struct Case {
  const char* name;
  ModelConfig cfg;
  const char* arch;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"gpt2", gpt2_cfg(), "GPT2LMHeadModel"});  // tied, biases, tanh GELU
  {
    ModelConfig c = gpt2_cfg();  // untied, exact GELU, no biases, zero-centred norms
    c.untie_embeddings_and_output_weights = true, c.bias_gelu_fusion = false, c.add_bias_linear = false;
    c.apply_layernorm_1p = true;
    v.push_back({"gpt2_untied_erf_nobias_1p", c, "GPT2LMHeadModel"});
  }
  {
    ModelConfig c = gpt2_cfg();  // squared ReLU: transformers' "relu2"
    c.squared_relu = true, c.bias_gelu_fusion = false;
    v.push_back({"gpt2_relu2", c, "GPT2LMHeadModel"});
  }
  v.push_back({"llama_gqa", llama_cfg(), "LlamaForCausalLM"});
  {
    ModelConfig c = llama_cfg();  // interleaved RoPE pairs, Llama 3.1 scaling (d 16, base 2e5: wavelengths in
    // all three bands, one of 2810 in the smoothed one), zero-centred, tied, d != h/a
    c.rotary_interleaved = true, c.use_rope_scaling = true, c.rope_scaling_factor = 8, c.rotary_base = 2e5;
    c.apply_layernorm_1p = true, c.untie_embeddings_and_output_weights = false, c.kv_channels = 16;
    v.push_back({"llama_interleaved_llama3_1p_tied", c, "LlamaForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // every linear bias: attention_bias and mlp_bias
    c.add_bias_linear = true;
    v.push_back({"llama_bias", c, "LlamaForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // QKV bias only, positions interpolated
    c.add_qkv_bias = true, c.rotary_seq_len_interpolation_factor = 3;
    v.push_back({"qwen2_linear_rope", c, "Qwen2ForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // --qk-layernorm: q_norm/k_norm, head dim 16 != h/a, tied
    c.qk_layernorm = true, c.kv_channels = 16, c.untie_embeddings_and_output_weights = false;
    v.push_back({"qwen3", c, "Qwen3ForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // q/k norm weights permuted with interleaved RoPE pairs, stored as 1 + gamma
    c.qk_layernorm = true, c.rotary_interleaved = true, c.apply_layernorm_1p = true;
    v.push_back({"qwen3_interleaved_1p", c, "Qwen3ForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // 4 experts of width 24, top-2 renormalised, untied
    c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24;
    v.push_back({"mixtral", c, "MixtralForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // q/k norms + experts: a dense layer 0 (mlp_only_layers), head dim 16, tied
    c.qk_layernorm = true, c.kv_channels = 16, c.untie_embeddings_and_output_weights = false;
    c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24, c.moe_layer_freq = "[0,1]";
    v.push_back({"qwen3_moe_dense0", c, "Qwen3MoeForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // top-1 of the full softmax (norm_topk_prob false), Llama 3.1 RoPE scaling
    c.qk_layernorm = true, c.num_experts = 3, c.moe_router_topk = 1, c.moe_router_pre_softmax = true;
    c.moe_ffn_hidden_size = 16, c.use_rope_scaling = true, c.rope_scaling_factor = 8, c.rotary_base = 2e5;
    v.push_back({"qwen3_moe_top1_presoftmax", c, "Qwen3MoeForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // a gated shared SwiGLU expert of width 20, q/k/v biases, a dense layer 1, tied
    c.add_qkv_bias = true, c.untie_embeddings_and_output_weights = false;
    c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24, c.moe_layer_freq = "[1,0]";
    c.moe_shared_expert_intermediate_size = 20, c.moe_shared_expert_gate = true;
    v.push_back({"qwen2_moe_dense1", c, "Qwen2MoeForCausalLM"});
  }
  {
    ModelConfig c = llama_cfg();  // no q/k/v biases (written as zeros), the full softmax's top-2, linear RoPE
    c.num_experts = 3, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 16, c.moe_router_pre_softmax = true;
    c.moe_shared_expert_intermediate_size = 12, c.moe_shared_expert_gate = true, c.rotary_seq_len_interpolation_factor = 2;
    v.push_back({"qwen2_moe_nobias_presoftmax", c, "Qwen2MoeForCausalLM"});
  }
  {
    // Multi-latent attention with DeepSeek-V3's MoE: low-rank q, q/kv norms,
    // YaRN (factor 40, mscale 1, mscale_all_dim 0.707: the cos/sin factor and
    // the softmax scale both differ from 1), values narrower than the heads;
    // layer 0 dense, layer 1 with 4 sigmoid-scored experts in 2 groups (one
    // kept), top 2 renormalised and scaled by 2.5, the expert bias (random
    // here) choosing, and a shared expert of two experts' width.
    ModelConfig c = llama_cfg();
    c.group_query_attention = false, c.num_query_groups.reset();
    c.multi_latent_attention = true, c.q_lora_rank = 24, c.kv_lora_rank = 16, c.qk_head_dim = 8;
    c.qk_pos_emb_head_dim = 4, c.v_head_dim = 6, c.qk_layernorm = true;
    c.rotary_scaling_factor = 40, c.mscale = 1.0, c.mscale_all_dim = 0.707;
    c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 12, c.moe_layer_freq = "[0,1]";
    c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
    c.moe_router_num_groups = 2, c.moe_router_group_topk = 1, c.moe_router_topk_scaling_factor = 2.5;
    c.moe_shared_expert_intermediate_size = 24;
    v.push_back({"deepseek_v3_moe", c, "DeepseekV3ForCausalLM"});
  }
  {
    // MLA with RoPE without YaRN, dense, tied, zero-centred norms (exported
    // as 1 + gamma), values as wide as the heads.
    ModelConfig c = llama_cfg();
    c.group_query_attention = false, c.num_query_groups.reset();
    c.multi_latent_attention = true, c.q_lora_rank = 16, c.kv_lora_rank = 12, c.qk_head_dim = 6;
    c.qk_pos_emb_head_dim = 4, c.v_head_dim = 10, c.qk_layernorm = true, c.rope_type = "rope";
    c.untie_embeddings_and_output_weights = false, c.apply_layernorm_1p = true;
    v.push_back({"deepseek_v3_dense_rope_tied_1p", c, "DeepseekV3ForCausalLM"});
  }
  {
    // DeepSeek-V3's multi-token prediction layer (--mtp-num-layers 1): an
    // MoE layer like the last, as model.layers.2 with enorm, hnorm, eh_proj,
    // shared_head and copies of the embedding and the head; its logits too.
    ModelConfig c = v[14].cfg;
    c.mtp_num_layers = 1;
    v.push_back({"deepseek_v3_mtp", c, "DeepseekV3ForCausalLM"});
  }
  {
    // Two dense depths on the tied, all-dense MLA model.
    ModelConfig c = v[15].cfg;
    c.mtp_num_layers = 2;
    v.push_back({"deepseek_v3_dense_mtp2", c, "DeepseekV3ForCausalLM"});
  }
  return v;
}

std::string artifacts() {
  const std::string dir = std::string(MT_BINARY_DIR) + "/test-artifacts/hf_export";
  fs::create_directories(dir);
  return dir;
}

// Random parameters everywhere, including the norms and biases that start at
// 0 or 1, so that a wrong mapping of any tensor shows in the logits.
std::unique_ptr<model::GPTModel> random_model(const ModelConfig& cfg, int64_t B) {
  model::GPTOptions opt;
  opt.micro_batch = B;
  auto m = model::GPTModel::create(cfg, opt);
  MT_CHECK(m.is_ok(), m.status().message());
  (*m)->init_parameters(7);
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (size_t i = 0; i < (*m)->specs().size(); ++i) {
    const auto& sp = (*m)->specs()[i];
    if (sp.global_shape.ndim != 1) continue;
    float* p = (*m)->params()[i].ptr<float>();
    const bool gamma = sp.name.find("norm.weight") != std::string::npos && !cfg.apply_layernorm_1p;
    for (int64_t j = 0; j < (*m)->params()[i].numel(); ++j) p[j] = (gamma ? 1.f : 0.f) + nd(gen);
  }
  // --moe-router-enable-expert-bias: a bias that changes the choice
  // (e_score_correction_bias), positive so that the biased scores are:
  // transformers masks the groups it drops with 0, Megatron with -inf, which
  // differ only for negative scores (the export notes it; with biases in
  // [-0.5, 0.5) the deepseek_v3_moe logits differ by 0.34).
  std::uniform_real_distribution<float> bias(0.f, 0.5f);
  for (const auto& [name, b] : (*m)->expert_bias_tensors())
    for (int64_t j = 0; j < b.numel(); ++j) b.ptr<float>()[j] = bias(gen);
  return std::move(*m);
}

// The test models' tokenizer: NullTokenizer over 91 ids, EOD 90.
HfTokenizerInfo null_tokenizer() {
  HfTokenizerInfo info;
  info.type = "NullTokenizer", info.vocab_size = 91, info.eod = 90;
  return info;
}

int run_reference(const std::string& args) {
  const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/checkpoint/hf_reference.py " + args;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// Our logits [T*B, Vpad] against the reference's [T*B, vocab_rows]: the
// largest difference over the largest magnitude.
double logits_error(const std::vector<float>& ours, int64_t Vpad, const Tensor& ref) {
  const int64_t rows = ref.dim(0), V = ref.dim(1);
  double diff = 0, mag = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v) {
      const double a = ours[static_cast<size_t>(r * Vpad + v)], b = ref.ptr<float>()[r * V + v];
      diff = std::max(diff, std::abs(a - b)), mag = std::max(mag, std::abs(b));
    }
  return diff / mag;
}

class HfExport : public ::testing::TestWithParam<int> {};

TEST_P(HfExport, TransformersSemanticsGiveOurLogits) {
  const Case c = cases()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(c.name);
  const int64_t B = 2, T = c.cfg.seq_length;
  auto m = random_model(c.cfg, B);
  auto arch = hf_architecture(c.cfg);
  ASSERT_TRUE(arch.is_ok()) << arch.status().message();
  EXPECT_STREQ(hf_arch_name(*arch), c.arch);

  std::vector<int32_t> tok(static_cast<size_t>(B * T)), lab(tok.size(), 0);
  std::mt19937 g(3);
  for (auto& t : tok) t = static_cast<int32_t>(g() % 91);
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
  m->forward(0, tt, lt, 0, false);
  const Tensor lg = m->logits(0);
  std::vector<float> ours(lg.ptr<float>(), lg.ptr<float>() + lg.numel());

  const std::string dir = artifacts() + "/" + c.name;
  fs::remove_all(dir);
  const HfTokenizerInfo info = null_tokenizer();
  HfExportOptions eo;
  auto sum = export_hf(*m, info, eo, dir);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_EQ(sum->vocab_rows, 91) << "padding rows dropped";
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  const auto cfg = read_json(dir + "/config.json");
  EXPECT_EQ(cfg["architectures"][0], c.arch);
  EXPECT_EQ(cfg["vocab_size"], 91);
  EXPECT_EQ(cfg["eos_token_id"], 90);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  // Every element of the model is exported exactly once (GPT-2 adds zero
  // biases the model lacks; tied output layers are not written twice).
  int64_t model_elems = 0;
  for (size_t i = 0; i < m->specs().size(); ++i) {
    const auto& sp = m->specs()[i];
    const bool vocab = sp.name == "embedding.word_embeddings.weight" || sp.name == "output_layer.weight";
    model_elems += vocab ? 91 * sp.global_shape[1] : sp.global_shape.numel();
  }
  if (std::string(c.arch) == "GPT2LMHeadModel" && !c.cfg.add_bias_linear) {
    const int64_t h = c.cfg.hidden_size;
    model_elems += c.cfg.num_layers * (3 * h + h + c.cfg.ffn() + h);  // c_attn, attn.c_proj, c_fc, mlp.c_proj biases
  }
  if (std::string(c.arch) == "DeepseekV3ForCausalLM" && c.cfg.is_moe())  // e_score_correction_bias
    model_elems += (c.cfg.num_moe_layers() + (c.cfg.is_moe_layer(c.cfg.num_layers) ? c.cfg.mtp_layers() : 0)) *
                   c.cfg.num_experts;
  // Each MTP layer's copies of the embedding and the head.
  model_elems += c.cfg.mtp_layers() * 2 * 91 * c.cfg.hidden_size;
  if (std::string(c.arch) == "Qwen2MoeForCausalLM" && !c.cfg.add_qkv_bias)  // zero q/k/v biases
    model_elems += c.cfg.num_layers * (c.cfg.num_attention_heads + 2 * c.cfg.query_groups()) * c.cfg.head_dim();
  EXPECT_EQ(sum->parameters, model_elems);

  const std::string in = dir + "_tokens.safetensors", out = dir + "_logits.safetensors";
  ASSERT_TRUE(write_safetensors(in, {{"tokens", tt}}).is_ok());
  const int rc = run_reference(dir + " logits " + in + " " + out);
  if (rc == 77) GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3 (apt install python3-torch)";
  ASSERT_EQ(rc, 0);
  auto ref = read_safetensors(out);
  ASSERT_TRUE(ref.is_ok()) << ref.status().message();
  const Tensor rl = *ref->get("logits");
  ASSERT_EQ(rl.dim(0), B * T);
  ASSERT_EQ(rl.dim(1), 91);
  EXPECT_LT(logits_error(ours, m->vocab(), rl), 2e-5);
  if (std::string(c.arch) == "DeepseekV3ForCausalLM") {
    EXPECT_EQ(cfg["num_nextn_predict_layers"], c.cfg.mtp_layers());
  }
  for (int64_t k = 0; k < c.cfg.mtp_layers(); ++k) {
    const Tensor ml = m->mtp_logits(0, static_cast<int>(k));
    const std::vector<float> mine(ml.ptr<float>(), ml.ptr<float>() + ml.numel());
    auto theirs = ref->get(fmt::format("mtp_logits.{}", k));
    ASSERT_TRUE(theirs.is_ok()) << theirs.status().message();
    EXPECT_LT(logits_error(mine, m->vocab(), *theirs), 2e-5) << "MTP depth " << k + 1;
    EXPECT_GT(logits_error(mine, m->vocab(), rl), 1e-2) << "MTP depth " << k + 1 << "'s logits are its own";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfExport, ::testing::Range(0, 18), [](const auto& p) {
  return std::string(cases()[static_cast<size_t>(p.param)].name);
});

// bf16 (fp16) weights, several shards with their index, and the padded
// vocabulary kept.
TEST(HfExportFiles, HalfShardsAndPaddedVocabulary) {
  for (const DType half : {DType::kBF16, DType::kF16}) {
  SCOPED_TRACE(dtype_name(half));
  auto m = random_model(llama_cfg(), 1);
  const std::string dir = artifacts() + "/" + dtype_name(half) + "_shards";
  fs::remove_all(dir);
  const HfTokenizerInfo info = null_tokenizer();
  HfExportOptions eo;
  eo.dtype = half, eo.max_shard_bytes = 40000, eo.keep_vocab_padding = true;
  auto sum = export_hf(*m, info, eo, dir);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_EQ(sum->vocab_rows, 96);
  const auto index = read_json(dir + "/model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], sum->bytes);
  std::set<std::string> files;
  int64_t bytes = 0, tensors = 0;
  for (auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GT(files.size(), 2u);
  for (const auto& f : files) {
    auto st = read_safetensors(dir + "/" + f);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    EXPECT_EQ(st->metadata.at("format"), "pt");
    for (auto& [name, t] : st->tensors) {
      EXPECT_EQ(t.dtype(), half) << name;
      EXPECT_EQ(index["weight_map"][name], f) << name;
      bytes += static_cast<int64_t>(t.nbytes()), ++tensors;
    }
  }
  EXPECT_EQ(bytes, sum->bytes);
  EXPECT_EQ(tensors, sum->tensors);
  EXPECT_EQ(files.size() + 2, sum->files.size()) << "shards + index + config.json";
  const auto cfg = read_json(dir + "/config.json");
  EXPECT_EQ(cfg["torch_dtype"], half == DType::kBF16 ? "bfloat16" : "float16");
  EXPECT_EQ(cfg["vocab_size"], 96);
  // The 16-bit values are the fp32 parameters rounded to nearest even.
  auto st = read_safetensors(dir + "/" + index["weight_map"]["model.embed_tokens.weight"].get<std::string>());
  const Tensor e = *st->get("model.embed_tokens.weight");
  const float* w = m->param("embedding.word_embeddings.weight").ptr<float>();
  for (int64_t i = 0; i < e.numel(); ++i)
    ASSERT_EQ(static_cast<const uint16_t*>(e.data())[i],
              half == DType::kBF16 ? float_to_bf16(w[i]).bits : float_to_f16(w[i]).bits)
        << i;

  // The reference reads the shards back: logits within 16-bit rounding
  // (fp16's is 8x finer than bf16's).
  const int64_t T = llama_cfg().seq_length;
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(tok.size(), 0);
  for (int64_t i = 0; i < T; ++i) tok[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % 91);
  Tensor tt(tok.data(), {1, T}, DType::kI32), lt(lab.data(), {1, T}, DType::kI32);
  m->forward(0, tt, lt, 0, false);
  std::vector<float> ours(m->logits(0).ptr<float>(), m->logits(0).ptr<float>() + m->logits(0).numel());
  const std::string in = dir + "_tokens.safetensors", out = dir + "_logits.safetensors";
  ASSERT_TRUE(write_safetensors(in, {{"tokens", tt}}).is_ok());
  const int rc = run_reference(dir + " logits " + in + " " + out);
  if (rc == 77) GTEST_SKIP() << "PyTorch is not installed";
  ASSERT_EQ(rc, 0);
  auto ref = read_safetensors(out);
  ASSERT_TRUE(ref.is_ok());
  const double err = logits_error(ours, m->vocab(), *ref->get("logits"));
  EXPECT_LT(err, half == DType::kBF16 ? 3e-2 : 4e-3);
  EXPECT_GT(err, 1e-6) << "16-bit weights should not reproduce fp32 logits exactly";
  }
}

TEST(HfExportFiles, RefusesAnExistingDirectoryAndLeavesItAlone) {
  auto m = random_model(gpt2_cfg(), 1);
  const std::string dir = artifacts() + "/occupied";
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir + "/keep.txt") << "mine"; }
  const HfTokenizerInfo info = null_tokenizer();
  auto sum = export_hf(*m, info, {}, dir);
  ASSERT_FALSE(sum.is_ok());
  EXPECT_NE(sum.status().message().find("--output"), std::string::npos) << sum.status().message();
  EXPECT_TRUE(fs::exists(dir + "/keep.txt"));
  EXPECT_FALSE(fs::exists(dir + "/config.json"));
  for (const auto& e : fs::directory_iterator(artifacts()))
    EXPECT_EQ(e.path().filename().string().find("occupied.tmp"), std::string::npos) << "no temporary left";
  // An empty directory is taken, also named with a trailing slash.
  fs::remove(dir + "/keep.txt");
  auto again = export_hf(*m, info, {}, dir + "/");
  EXPECT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(HfExportFiles, CopiesTheTokenizerFiles) {
  auto m = random_model(gpt2_cfg(), 1);
  const std::string dir = artifacts() + "/with_tokenizer", src = artifacts() + "/tok_src";
  fs::remove_all(dir);
  fs::create_directories(src);
  { std::ofstream(src + "/v.json") << "{\"a\": 0}"; }
  { std::ofstream(src + "/m.txt") << "#version: 0.2\n"; }
  HfTokenizerInfo info;
  info.type = "GPT2BPETokenizer", info.vocab_size = 91, info.eod = 90;
  info.vocab_file = src + "/v.json", info.merge_file = src + "/missing.txt";
  auto bad = export_hf(*m, info, {}, dir);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--merge-file"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(fs::exists(dir)) << "nothing left behind on failure";
  info.merge_file = src + "/m.txt";
  auto ok = export_hf(*m, info, {}, dir);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  std::ifstream v(dir + "/vocab.json"), mg(dir + "/merges.txt");
  std::string vs((std::istreambuf_iterator<char>(v)), {}), ms((std::istreambuf_iterator<char>(mg)), {});
  EXPECT_EQ(vs, "{\"a\": 0}");
  EXPECT_EQ(ms, "#version: 0.2\n");
  const auto tc = read_json(dir + "/tokenizer_config.json");
  EXPECT_EQ(tc["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_EQ(tc["eos_token"], "<|endoftext|>");
}

TEST(HfExportArch, RefusesModelsNoTransformersClassComputes) {
  auto why = [](ModelConfig c) {
    auto a = hf_architecture(c);
    EXPECT_FALSE(a.is_ok());
    return a.is_ok() ? std::string() : a.status().message();
  };
  ModelConfig c = gpt2_cfg();
  c.apply_residual_connection_post_layernorm = true;
  c.group_query_attention = true, c.num_query_groups = 2;
  const std::string m1 = why(c);
  EXPECT_NE(m1.find("--apply-residual-connection-post-layernorm"), std::string::npos) << m1;
  EXPECT_NE(m1.find("--num-query-groups 2"), std::string::npos) << m1 << " (every reason listed)";
  c = llama_cfg();
  c.rotary_percent = 0.5;
  EXPECT_NE(why(c).find("--rotary-percent 0.5"), std::string::npos);
  c = llama_cfg();
  c.normalization = model::Normalization::kLayerNorm;
  EXPECT_NE(why(c).find("LayerNorm + SwiGLU + rope"), std::string::npos) << why(c);
  c = gpt2_cfg();
  c.position_embedding = model::PositionEmbedding::kRope;
  EXPECT_NE(why(c).find("GPT2LMHeadModel needs"), std::string::npos);
  // --qk-layernorm: Qwen3's q/k norms come without the MLP biases or a q/k/v-only bias.
  c = llama_cfg();
  c.qk_layernorm = true, c.add_qkv_bias = true;
  EXPECT_NE(why(c).find("--qk-layernorm with --add-qkv-bias"), std::string::npos) << why(c);
  c.add_qkv_bias = false, c.add_bias_linear = true;
  EXPECT_NE(why(c).find("--qk-layernorm with biases on every linear layer"), std::string::npos) << why(c);
  c = gpt2_cfg();
  c.qk_layernorm = true;
  EXPECT_NE(why(c).find("GPT2LMHeadModel has no query/key norms"), std::string::npos) << why(c);
  // Experts: dense layers need Qwen3-MoE's q/k norms; group-limited routing and sigmoid scores neither class has.
  c = llama_cfg();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_layer_freq = "[0,1]";
  EXPECT_NE(why(c).find("Qwen3MoeForCausalLM, which takes dense layers, has q/k norms"), std::string::npos) << why(c);
  c.qk_layernorm = true, c.moe_router_num_groups = 2, c.moe_router_group_topk = 1;
  c.moe_router_score_function = "sigmoid";
  EXPECT_NE(why(c).find("--moe-router-group-topk (Qwen3MoeForCausalLM chooses among all experts)"), std::string::npos)
      << why(c);
  EXPECT_NE(why(c).find("--moe-router-score-function sigmoid (Qwen3MoeForCausalLM's router"), std::string::npos)
      << why(c);
  // A shared expert: Qwen2-MoE's, gated, without q/k norms.
  c = llama_cfg();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_shared_expert_intermediate_size = 16;
  EXPECT_NE(why(c).find("without --moe-shared-expert-gate (Qwen2MoeForCausalLM"), std::string::npos) << why(c);
  c.moe_shared_expert_gate = true, c.qk_layernorm = true;
  EXPECT_NE(why(c).find("Qwen3MoeForCausalLM has no shared expert"), std::string::npos) << why(c);
  // Multi-latent attention: DeepseekV3ForCausalLM, with every reason it cannot take a model listed.
  c = gpt2_cfg();  // LayerNorm, GELU, biases, learned positions, no q/kv norms
  c.multi_latent_attention = true, c.kv_lora_rank = 8, c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4, c.v_head_dim = 8;
  const std::string mla = why(c);
  for (const char* want : {"LayerNorm or GELU", "biases on the linear layers", "learned absolute position embeddings",
                           "always has q_a_layernorm and kv_a_layernorm"})
    EXPECT_NE(mla.find(want), std::string::npos) << want << " in " << mla;
  c = llama_cfg();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.qk_layernorm = true, c.norm_epsilon = 1e-5;
  c.rotary_scaling_factor = 40, c.mscale = 0.5, c.mscale_all_dim = 0;
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_layer_freq = "[1,0]", c.moe_shared_expert_intermediate_size = 20;
  c.moe_ffn_hidden_size = 8, c.moe_router_num_groups = 2, c.moe_router_group_topk = 2;
  const std::string ds = why(c);
  for (const char* want : {"--norm-epsilon 1e-05", "--mscale 0.5 with --mscale-all-dim 0", "a softmax router",
                           "--moe-shared-expert-intermediate-size 20", "first first_k_dense_replace",
                           "--moe-router-topk 2 / --moe-router-group-topk 2 != 2"})
    EXPECT_NE(ds.find(want), std::string::npos) << want << " in " << ds;
  c = llama_cfg();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.qk_layernorm = true, c.rope_type = "rope", c.rotary_percent = 0.5;
  c.rotary_scaling_factor = 4, c.mscale_all_dim = 1;
  const std::string rope = why(c);
  EXPECT_NE(rope.find("--rotary-percent 0.5"), std::string::npos) << rope;
  EXPECT_NE(rope.find("Megatron then scales the softmax"), std::string::npos) << rope;
  EXPECT_NE(rope.find("no --q-lora-rank"), std::string::npos) << rope;
  c.rope_type = "", c.rotary_percent = 1, c.q_lora_rank = 8, c.rotary_scaling_factor = 1.00001;
  EXPECT_NE(why(c).find("must then be a whole number"), std::string::npos) << why(c);
}

// DeepSeek-V3's own routing (group-limited, with the expert bias) exports
// with a note: transformers masks the dropped groups with 0, Megatron with
// -inf, which differ where the kept groups' biased scores are negative.
TEST(HfExportArch, DeepseekV3GroupMaskNote) {
  Case c = cases()[14];
  ASSERT_STREQ(c.name, "deepseek_v3_moe");
  auto m = random_model(c.cfg, 1);
  const std::string dir = artifacts() + "/deepseek_v3_note";
  fs::remove_all(dir);
  auto sum = export_hf(*m, null_tokenizer(), HfExportOptions{}, dir);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  ASSERT_EQ(sum->notes.size(), 1u);
  EXPECT_NE(sum->notes[0].find("score of 0 (Megatron: -inf)"), std::string::npos) << sum->notes[0];
  const auto cfg = read_json(dir + "/config.json");
  // --dtype bf16: every tensor bf16 but the expert bias, kept fp32.
  fs::remove_all(dir + "_bf16");
  HfExportOptions bf;
  bf.dtype = DType::kBF16;
  ASSERT_TRUE(export_hf(*m, null_tokenizer(), bf, dir + "_bf16").is_ok());
  auto mapped = MappedSafetensors::open(dir + "_bf16/model.safetensors");
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().message();
  int fp32 = 0;
  for (const auto& [name, t] : mapped->tensors()) {
    const bool bias = name.find("e_score_correction_bias") != std::string::npos;
    EXPECT_EQ(t.dtype, bias ? "F32" : "BF16") << name;
    fp32 += bias;
  }
  EXPECT_EQ(fp32, 1);
  EXPECT_EQ(cfg["n_group"], 2);
  EXPECT_EQ(cfg["topk_group"], 1);
  EXPECT_EQ(cfg["first_k_dense_replace"], 1);
  EXPECT_EQ(cfg["n_shared_experts"], 2);
  EXPECT_EQ(cfg["max_position_embeddings"], 4096 * 40);
  EXPECT_EQ(cfg["rope_scaling"]["original_max_position_embeddings"], 4096);
  c.cfg.moe_router_enable_expert_bias = false;
  auto plain = random_model(c.cfg, 1);
  fs::remove_all(dir);
  sum = export_hf(*plain, null_tokenizer(), HfExportOptions{}, dir);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_TRUE(sum->notes.empty()) << "sigmoid scores alone are positive";
}

}  // namespace
}  // namespace mt::checkpoint

namespace mt::checkpoint {
namespace {

// Import is the export's inverse: export a model, import the directory
// (config.json -> Megatron flags, files -> parameters), and get the same
// function (logits); and where the transformers form has the same
// parametrisation (not --apply-layernorm-1p, --rotary-interleaved, or a
// GPT-2 without biases), the same parameters bit for bit (Megatron's padding
// rows: copies of the last row).
// The ModelConfig that `megatron import`'s printed flags describe (`ok`:
// whether they parse).
ModelConfig model_from_flags(const std::vector<std::string>& flags, bool* ok) {
  ModelConfig mc;
  FlagSet fs_("import");
  model::register_model_flags(fs_, mc);
  *ok = fs_.parse(flags).is_ok();
  return mc;
}

class HfRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(HfRoundTrip, ImportGivesBackTheExportedModel) {
  const Case c = cases()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(c.name);
  auto m = random_model(c.cfg, 1);
  const std::string dir = artifacts() + "/roundtrip_" + c.name;
  fs::remove_all(dir);
  const HfTokenizerInfo info = null_tokenizer();
  HfExportOptions eo;
  eo.max_shard_bytes = 30000;  // several shards: the index is read back too
  ASSERT_TRUE(export_hf(*m, info, eo, dir).is_ok());

  auto flags = hf_import_flags(read_json(dir + "/config.json"), dir + "/config.json");
  ASSERT_TRUE(flags.is_ok()) << flags.status().message();
  EXPECT_STREQ(hf_arch_name(flags->arch), c.arch);
  EXPECT_EQ(flags->vocab_size, 91);
  bool parsed = false;
  ModelConfig mc = model_from_flags(flags->flags, &parsed);
  std::string joined;
  for (const auto& t : flags->flags) joined += t + " ";
  ASSERT_TRUE(parsed) << joined;
  mc.seq_length = c.cfg.seq_length, mc.vocab_size = 91, mc.make_vocab_size_divisible_by = 16;
  model::GPTOptions opt;
  auto m2 = model::GPTModel::create(mc, opt);
  ASSERT_TRUE(m2.is_ok()) << m2.status().message() << " from " << joined;
  std::vector<std::string> notes;
  Status st = hf_import_weights(dir, flags->arch, **m2, &notes);
  ASSERT_TRUE(st.is_ok()) << st.message();
  const bool same_form = !c.cfg.apply_layernorm_1p && !c.cfg.rotary_interleaved &&
                         !(flags->arch == HfArch::kGpt2 && !c.cfg.add_bias_linear) &&
                         !(flags->arch == HfArch::kQwen2Moe && !c.cfg.add_qkv_bias);  // zero q/k/v biases come back
  if (same_form) {
    ASSERT_EQ((*m2)->specs().size(), m->specs().size()) << joined;
  }
  for (size_t i = 0; same_form && i < m->specs().size(); ++i) {
    const std::string& name = m->specs()[i].name;
    ASSERT_EQ((*m2)->specs()[i].name, name);
    const Tensor a = m->params()[i], b = (*m2)->params()[i];
    ASSERT_EQ(a.numel(), b.numel()) << name;
    const bool vocab = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    const int64_t h = c.cfg.hidden_size;
    for (int64_t k = 0; k < a.numel(); ++k) {
      const int64_t row = vocab ? k / h : 0;
      const float want = vocab && row >= 91 ? a.ptr<float>()[90 * h + k % h] : a.ptr<float>()[k];
      if (b.ptr<float>()[k] != want) {
        ADD_FAILURE() << name << " element " << k << ": " << b.ptr<float>()[k] << " != " << want;
        break;
      }
    }
  }
  // DeepSeek-V3's e_score_correction_bias comes back as the expert bias.
  const auto b1 = m->expert_bias_tensors(), b2 = (*m2)->expert_bias_tensors();
  ASSERT_EQ(b1.size(), b2.size());
  for (size_t i = 0; i < b1.size(); ++i)
    EXPECT_EQ(std::memcmp(b1[i].second.data(), b2[i].second.data(), b1[i].second.nbytes()), 0) << b1[i].first;
  // The same function: logits over the real vocabulary agree exactly.
  const int64_t T = c.cfg.seq_length;
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(tok.size(), 0);
  for (int64_t i = 0; i < T; ++i) tok[static_cast<size_t>(i)] = static_cast<int32_t>((i * 29 + 3) % 91);
  Tensor tt(tok.data(), {1, T}, DType::kI32), lt(lab.data(), {1, T}, DType::kI32);
  m->forward(0, tt, lt, 0, false);
  (*m2)->forward(0, tt, lt, 0, false);
  const Tensor l1 = m->logits(0), l2 = (*m2)->logits(0);
  double diff = 0, mag = 0;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t v = 0; v < 91; ++v) {
      const double x = l1.ptr<float>()[r * l1.dim(1) + v], y = l2.ptr<float>()[r * l2.dim(1) + v];
      diff = std::max(diff, std::abs(x - y)), mag = std::max(mag, std::abs(x));
    }
  if (same_form) {
    EXPECT_EQ(diff, 0) << "same parameters, same logits";
  }
  EXPECT_LT(diff / mag, 1e-5);
  // The MTP layers come back (--mtp-num-layers from num_nextn_predict_layers), with no note.
  EXPECT_EQ(mc.mtp_layers(), c.cfg.mtp_layers()) << joined;
  EXPECT_TRUE(notes.empty()) << notes[0];
  for (int64_t k = 0; k < c.cfg.mtp_layers(); ++k) {
    const Tensor a = m->mtp_logits(0, static_cast<int>(k)), b = (*m2)->mtp_logits(0, static_cast<int>(k));
    double d = 0;
    for (int64_t r = 0; r < T; ++r)
      for (int64_t v = 0; v < 91; ++v)
        d = std::max(d, static_cast<double>(std::abs(a.ptr<float>()[r * a.dim(1) + v] - b.ptr<float>()[r * b.dim(1) + v])));
    EXPECT_LT(d / mag, same_form ? 0.0 + 1e-30 : 1e-5) << "MTP depth " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfRoundTrip, ::testing::Range(0, 18), [](const auto& p) {
  return std::string(cases()[static_cast<size_t>(p.param)].name);
});

TEST(HfImport, RefusesWhatNoMegatronFlagExpresses) {
  auto why = [](const char* text) {
    auto r = hf_import_flags(nlohmann::json::parse(text), "config.json");
    EXPECT_FALSE(r.is_ok()) << text;
    return r.is_ok() ? std::string() : r.status().message();
  };
  const std::string a = why(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "hidden_act": "gelu",
      "attention_bias": true, "mlp_bias": false, "rope_scaling": {"rope_type": "yarn", "factor": 4}})");
  EXPECT_NE(a.find("hidden_act \"gelu\""), std::string::npos) << a;
  EXPECT_NE(a.find("attention_bias and mlp_bias differ"), std::string::npos) << a;
  EXPECT_NE(a.find("yarn"), std::string::npos) << a;
  EXPECT_NE(why(R"({"architectures": ["PhiForCausalLM"]})").find("PhiForCausalLM"), std::string::npos);
  const std::string q3 = why(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "attention_bias": true,
      "use_sliding_window": true})");
  EXPECT_NE(q3.find("attention_bias true on Qwen3"), std::string::npos) << q3;
  EXPECT_NE(q3.find("use_sliding_window"), std::string::npos) << q3;
  EXPECT_NE(why(R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
      "n_positions": 32, "vocab_size": 100, "activation_function": "relu"})").find("relu"), std::string::npos);
  EXPECT_NE(why(R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2})").find("\"n_embd\" is missing"),
            std::string::npos);
  // Qwen3-MoE: layer lists that are not lists of layers, no sparse layer, a top-1 renormalised.
  const std::string qm = why(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "mlp_only_layers": [0, 7], "num_experts_per_tok": 1,
      "norm_topk_prob": true})");
  EXPECT_NE(qm.find("mlp_only_layers is a JSON array of 2 entries, expected a list of layer indices in [0, 2)"), std::string::npos) << qm;
  EXPECT_NE(qm.find("norm_topk_prob with num_experts_per_tok 1"), std::string::npos) << qm;
  const std::string qd = why(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "decoder_sparse_step": 3})");
  EXPECT_NE(qd.find("no sparse layer"), std::string::npos) << qd;
}

// Files from elsewhere: GPT-2's Hub naming (no "transformer." prefix, the
// attention-mask buffers), F16 weights; tensors that do not fit are named.
TEST(HfImport, ReadsHubGpt2NamingAndF16AndNamesWhatDoesNotFit) {
  auto m = random_model(gpt2_cfg(), 1);
  const std::string dir = artifacts() + "/hub_gpt2";
  fs::remove_all(dir);
  const HfTokenizerInfo info = null_tokenizer();
  ASSERT_TRUE(export_hf(*m, info, {}, dir).is_ok());
  // Rewrite model.safetensors as the Hub stores GPT-2: names without the
  // prefix, F16 values, plus the causal-mask buffers.
  auto orig = read_safetensors(dir + "/model.safetensors");
  ASSERT_TRUE(orig.is_ok());
  auto to_half = [](float f) -> uint16_t {  // round to nearest (values here are normal and small)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int ex = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (ex <= 0) return static_cast<uint16_t>(sign);  // flush tiny values
    uint32_t h = sign | (static_cast<uint32_t>(ex) << 10) | (man >> 13);
    if ((man & 0x1fffu) > 0x1000u || ((man & 0x1fffu) == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(h);
  };
  std::string header = "{";
  std::string blob;
  bool first = true;
  auto put = [&](const std::string& name, const std::string& dtype, const Shape& s, const std::string& bytes) {
    std::string shape;
    for (int k = 0; k < s.ndim; ++k) shape += (k ? "," : "") + std::to_string(s[k]);
    header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", first ? "" : ",", name,
                          dtype, shape, blob.size(), blob.size() + bytes.size());
    blob += bytes;
    first = false;
  };
  std::map<std::string, std::vector<float>> halves;  // what the F16 values are, as floats
  for (const auto& [name, t] : orig->tensors) {
    std::string bytes(static_cast<size_t>(t.numel()) * 2, '\0');
    for (int64_t k = 0; k < t.numel(); ++k) {
      const uint16_t hv = to_half(t.ptr<float>()[k]);
      std::memcpy(bytes.data() + 2 * k, &hv, 2);
    }
    put(name.substr(std::string("transformer.").size()), "F16", t.shape(), bytes);
  }
  put("h.0.attn.bias", "F32", Shape{1, 1, 4, 4}, std::string(64, '\0'));
  put("h.1.attn.masked_bias", "F32", Shape{1}, std::string(4, '\0'));
  header += "}";
  {
    std::ofstream f(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << blob;
  }
  auto flags = hf_import_flags(read_json(dir + "/config.json"), "config.json");
  ASSERT_TRUE(flags.is_ok());
  ModelConfig mc;
  FlagSet fl("import");
  model::register_model_flags(fl, mc);
  ASSERT_TRUE(fl.parse(flags->flags).is_ok());
  mc.seq_length = 10, mc.vocab_size = 91, mc.make_vocab_size_divisible_by = 16;
  auto m2 = model::GPTModel::create(mc, {});
  ASSERT_TRUE(m2.is_ok());
  Status st = hf_import_weights(dir, flags->arch, **m2, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  // Parameters equal the original rounded to fp16 (ln weights: 1 + noise).
  const float* w = (*m2)->param("decoder.layers.1.mlp.linear_fc2.weight").ptr<float>();
  const float* w0 = m->param("decoder.layers.1.mlp.linear_fc2.weight").ptr<float>();
  double worst = 0;  // the error over fp16's: half an ulp relative, values below 2^-14 flushed to 0
  for (int64_t k = 0; k < (*m2)->param("decoder.layers.1.mlp.linear_fc2.weight").numel(); ++k)
    worst = std::max(worst, std::abs(double(w[k]) - w0[k]) / (std::abs(double(w0[k])) * 0.000489 + 6.2e-5));
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(worst, 0) << "the F16 file was read";

  // A tensor the model has no place for is named.
  ModelConfig small = mc;
  small.num_layers = 1;
  auto m3 = model::GPTModel::create(small, {});
  ASSERT_TRUE(m3.is_ok());
  st = hf_import_weights(dir, flags->arch, **m3, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("h.1.ln_1.weight"), std::string::npos) << st.message();
  // A truncated file is a clear error, not a crash.
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 100);
  st = hf_import_weights(dir, flags->arch, **m2, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
}


// config.json files as the Hub has them (defaults left out) give exactly
// the Megatron flags of the same model.
// deepseek-ai/DeepSeek-V3's config.json (a dequantized copy: the Hub's
// holds fp8 blocks, refused with their quantization_config): MLA with YaRN,
// 3 dense layers, 256 sigmoid-scored experts in 8 groups (4 kept) with the
// expert bias, top 8 scaled by 2.5, one shared expert. The flags describe
// the 671B model (ModelConfig.DeepSeekV3ParameterCount).
TEST(HfImport, DeepSeekV3ConfigGivesItsMegatronFlags) {
  const std::string v3 = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
      "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
      "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
      "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
      "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
      "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
      "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
      "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
      "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
      "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
      "use_cache": true, "v_head_dim": 128, "vocab_size": 129280)";
  auto r = hf_import_flags(nlohmann::json::parse(v3 + "}"), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->arch, HfArch::kDeepseekV3);
  std::string joined;
  for (const auto& t : r->flags) joined += (joined.empty() ? "" : " ") + t;
  EXPECT_EQ(joined,
            "--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 "
            "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
            "--v-head-dim 128 --qk-layernorm --normalization RMSNorm --swiglu --position-embedding-type rope "
            "--norm-epsilon 1e-06 --max-position-embeddings 163840 --hidden-dropout 0 --attention-dropout 0 "
            "--disable-bias-linear --untie-embeddings-and-output-weights --mtp-num-layers 1 --rotary-base 10000 "
            "--rotary-scaling-factor 40 --mscale 1 --mscale-all-dim 1 --num-experts 256 --moe-router-topk 8 "
            "--moe-ffn-hidden-size 2048 "
            "--moe-shared-expert-intermediate-size 2048 --moe-router-score-function sigmoid "
            "--moe-router-enable-expert-bias --moe-layer-freq [0]*3+[1]*58 --moe-router-num-groups 8 "
            "--moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5");
  bool parsed = false;
  ModelConfig mc = model_from_flags(r->flags, &parsed);
  ASSERT_TRUE(parsed);
  mc.vocab_size = r->vocab_size;
  // 671,026,404,352 in the decoder and its embeddings, and 11,610,067,968
  // in the MTP layer (num_nextn_predict_layers 1: --mtp-num-layers 1).
  EXPECT_EQ(model::model_params(mc, mc.padded_vocab(1)).total(), int64_t{671026404352} + int64_t{11610067968});
  // The Hub's own file: fp8 weights with scales.
  auto q = hf_import_flags(nlohmann::json::parse(v3 + R"(, "quantization_config": {"activation_scheme": "dynamic",
      "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}})"), "config.json");
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("quantization_config (\"fp8\")"), std::string::npos) << q.status().message();
  // What Megatron's MLA cannot express.
  auto bad = hf_import_flags(nlohmann::json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "rms_norm_eps": 1e-5,
      "rope_interleave": false, "num_key_value_heads": 64, "n_group": 8, "topk_group": 2, "norm_topk_prob": false,
      "q_lora_rank": null,
      "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 8192}})"), "config.json");
  ASSERT_FALSE(bad.is_ok());
  // YaRN's original context defaults to max_position_embeddings in
  // transformers; Megatron's MLA has 4096 only; truncate false is not Megatron's rounding.
  auto yarn = hf_import_flags(nlohmann::json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"],
      "max_position_embeddings": 8192, "rope_scaling": {"type": "yarn", "factor": 2.0, "truncate": false}})"),
                              "config.json");
  ASSERT_FALSE(yarn.is_ok());
  EXPECT_NE(yarn.status().message().find("original_max_position_embeddings 8192"), std::string::npos)
      << yarn.status().message();
  EXPECT_NE(yarn.status().message().find("truncate false"), std::string::npos) << yarn.status().message();
  for (const char* want : {"rms_norm_eps 1e-05", "rope_interleave false", "num_key_value_heads 64", "q_lora_rank null",
                           "num_experts_per_tok 8 / topk_group 2 != 2", "norm_topk_prob false",
                           "original_max_position_embeddings 8192"})
    EXPECT_NE(bad.status().message().find(want), std::string::npos) << want << " in " << bad.status().message();
}

// DeepSeek-V3's files carry its multi-token prediction layer after the
// decoder's (model.layers.61.* there): skipped with a note, as transformers
// skips it; any other tensor without a place is still refused.
TEST(HfImport, DeepSeekV3SkipsTheMtpLayers) {
  Case c = cases()[14];
  ASSERT_STREQ(c.name, "deepseek_v3_moe");
  auto m = random_model(c.cfg, 1);
  const std::string dir = artifacts() + "/deepseek_v3_mtp";
  fs::remove_all(dir);
  ASSERT_TRUE(export_hf(*m, null_tokenizer(), HfExportOptions{}, dir).is_ok());
  auto file = read_safetensors(dir + "/model.safetensors");
  ASSERT_TRUE(file.is_ok());
  std::vector<NamedTensor> all;
  for (const auto& [name, t] : file->tensors) all.push_back({name, t});
  std::vector<float> extra(48 * 96, 0.5f);
  all.push_back({"model.layers.2.eh_proj.weight", Tensor(extra.data(), {48, 96}, DType::kF32)});
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", all).is_ok());
  auto flags = hf_import_flags(read_json(dir + "/config.json"), "config.json");
  ASSERT_TRUE(flags.is_ok()) << flags.status().message();
  bool parsed = false;
  ModelConfig mc = model_from_flags(flags->flags, &parsed);
  ASSERT_TRUE(parsed);
  mc.seq_length = c.cfg.seq_length, mc.vocab_size = 91, mc.make_vocab_size_divisible_by = 16;
  auto m2 = model::GPTModel::create(mc, model::GPTOptions{});
  ASSERT_TRUE(m2.is_ok()) << m2.status().message();
  std::vector<std::string> notes;
  Status st = hf_import_weights(dir, flags->arch, **m2, &notes);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("multi-token prediction layer 2 (model.layers.2...) is not imported"), std::string::npos)
      << notes[0];
  all.push_back({"model.layers.1.mlp.extra.weight", Tensor(extra.data(), {48, 96}, DType::kF32)});
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", all).is_ok());
  st = hf_import_weights(dir, flags->arch, **m2, &notes);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("model.layers.1.mlp.extra.weight"), std::string::npos) << st.message();
}

// --mtp-use-repeated-layer has no DeepSeek form (one MTP layer per depth there).
TEST(HfExport, RefusesARepeatedMtpLayer) {
  ModelConfig c = cases()[16].cfg;
  ASSERT_EQ(c.mtp_layers(), 1);
  c.mtp_num_layers = 2, c.mtp_use_repeated_layer = true;
  auto arch = hf_architecture(c);
  ASSERT_FALSE(arch.is_ok());
  EXPECT_NE(arch.status().message().find("--mtp-use-repeated-layer"), std::string::npos) << arch.status().message();
}

TEST(HfImport, HubConfigsGiveTheirMegatronFlags) {
  auto flags = [](const char* text) {
    auto r = hf_import_flags(nlohmann::json::parse(text), "config.json");
    EXPECT_TRUE(r.is_ok()) << (r.is_ok() ? "" : r.status().message());
    std::string out;
    if (r.is_ok())
      for (const auto& t : r->flags) out += (out.empty() ? "" : " ") + t;
    return out;
  };
  // openai-community/gpt2
  EXPECT_EQ(flags(R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
      "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
      "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
      "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257})"),
            "--num-layers 12 --hidden-size 768 --ffn-hidden-size 3072 --num-attention-heads 12 "
            "--max-position-embeddings 1024 --norm-epsilon 1e-05 --hidden-dropout 0.1 --attention-dropout 0.1");
  // meta-llama/Llama-2-7b-hf (no num_key_value_heads default needed; tie false by default)
  EXPECT_EQ(flags(R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
      "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
      "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "vocab_size": 32000, "torch_dtype": "float16"})"),
            "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 "
            "--normalization RMSNorm --swiglu --position-embedding-type rope --norm-epsilon 1e-05 "
            "--max-position-embeddings 4096 --hidden-dropout 0 --attention-dropout 0 --disable-bias-linear "
            "--untie-embeddings-and-output-weights --rotary-base 10000");
  // Qwen/Qwen2-0.5B (defaults: max_position_embeddings 32768 when absent)
  EXPECT_EQ(flags(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
      "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
      "use_sliding_window": false, "vocab_size": 151936})"),
            "--num-layers 24 --hidden-size 896 --ffn-hidden-size 4864 --num-attention-heads 14 "
            "--group-query-attention --num-query-groups 2 --normalization RMSNorm --swiglu --position-embedding-type rope "
            "--norm-epsilon 1e-06 --max-position-embeddings 32768 --hidden-dropout 0 "
            "--attention-dropout 0 --disable-bias-linear --add-qkv-bias --rotary-base 1000000");
  // Qwen/Qwen3-0.6B: q/k norms, head_dim 128 (hidden / heads = 64), tied.
  EXPECT_EQ(flags(R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
      "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
      "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
      "vocab_size": 151936})"),
            "--num-layers 28 --hidden-size 1024 --ffn-hidden-size 3072 --num-attention-heads 16 "
            "--group-query-attention --num-query-groups 8 --kv-channels 128 --normalization RMSNorm --swiglu "
            "--position-embedding-type rope --norm-epsilon 1e-06 --max-position-embeddings 40960 --hidden-dropout 0 "
            "--attention-dropout 0 --disable-bias-linear --qk-layernorm --rotary-base 1000000");
  // Qwen/Qwen3-30B-A3B: 128 experts of width 768, top-8 renormalised, every layer sparse.
  EXPECT_EQ(flags(R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
      "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
      "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
      "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
      "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
      "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
      "use_sliding_window": false, "vocab_size": 151936})"),
            "--num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 4 --kv-channels 128 --normalization RMSNorm --swiglu "
            "--position-embedding-type rope --norm-epsilon 1e-06 --max-position-embeddings 40960 --hidden-dropout 0 "
            "--attention-dropout 0 --disable-bias-linear --qk-layernorm --num-experts 128 --moe-router-topk 8 "
            "--moe-ffn-hidden-size 768 --untie-embeddings-and-output-weights --rotary-base 1000000");
  // Qwen/Qwen1.5-MoE-A2.7B: 60 experts of width 1408, top-4 of the full softmax, a gated shared expert of 5632.
  EXPECT_EQ(flags(R"({"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
      "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
      "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.39.0.dev0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936,
      "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
      "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false,
      "router_aux_loss_coef": 0.001})"),
            "--num-layers 24 --hidden-size 2048 --ffn-hidden-size 5632 --num-attention-heads 16 --normalization RMSNorm "
            "--swiglu --position-embedding-type rope --norm-epsilon 1e-06 --max-position-embeddings 8192 "
            "--hidden-dropout 0 --attention-dropout 0 --disable-bias-linear --add-qkv-bias --num-experts 60 "
            "--moe-router-topk 4 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 5632 "
            "--moe-shared-expert-gate --moe-router-pre-softmax --untie-embeddings-and-output-weights "
            "--rotary-base 1000000");
  // Dense layers by mlp_only_layers and decoder_sparse_step, and the full softmax (norm_topk_prob's default).
  EXPECT_EQ(flags(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 6, "vocab_size": 100, "mlp_only_layers": [1], "decoder_sparse_step": 2})"),
            "--num-layers 6 --hidden-size 64 --ffn-hidden-size 6144 --num-attention-heads 4 --normalization RMSNorm --swiglu "
            "--position-embedding-type rope --norm-epsilon 1e-06 --max-position-embeddings 32768 --hidden-dropout 0 "
            "--attention-dropout 0 --disable-bias-linear --qk-layernorm --num-experts 128 --moe-router-topk 8 "
            "--moe-ffn-hidden-size 768 --moe-layer-freq [0,0,0,1,0,1] --moe-router-pre-softmax "
            "--untie-embeddings-and-output-weights --rotary-base 10000");
  // Llama 3.1 in transformers 4.x, and the same in 5.x's rope_parameters.
  const std::string l31 =
      "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention "
      "--num-query-groups 8 --normalization RMSNorm --swiglu --position-embedding-type rope --norm-epsilon 1e-05 "
      "--max-position-embeddings 131072 --hidden-dropout 0 --attention-dropout 0 "
      "--disable-bias-linear --untie-embeddings-and-output-weights --rotary-base 500000 --use-rope-scaling "
      "--rope-scaling-factor 8";
  EXPECT_EQ(flags(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
      "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 128256, "rope_scaling": {"factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}})"),
            l31);
  EXPECT_EQ(flags(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
      "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-05, "vocab_size": 128256, "rope_parameters": {"rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}})"),
            l31);
  // Mistral: Llama's model; full attention equals its sliding window only up
  // to the window (v0.1: 4096 of 32768 positions; v0.3: no window).
  auto mistral = [](const char* window) {
    return hf_import_flags(nlohmann::json::parse(std::string(R"({"architectures": ["MistralForCausalLM"],
        "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "vocab_size": 32768)") + window + "}"),
                           "config.json");
  };
  auto v3 = mistral(R"(, "sliding_window": null)"), v1 = mistral(R"(, "sliding_window": 4096)");
  ASSERT_TRUE(v3.is_ok() && v1.is_ok());
  EXPECT_EQ(v3->arch, HfArch::kLlama);
  EXPECT_FALSE(v3->max_seq_length.has_value());
  EXPECT_EQ(v1->max_seq_length, 4096);
  EXPECT_EQ(v1->flags, v3->flags);
  EXPECT_EQ(mistral("")->max_seq_length, 4096) << "MistralConfig's default window";
  // rope_type "default" is plain RoPE in either form.
  const std::string plain = flags(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "rope_scaling": {"rope_type": "default"}})");
  EXPECT_NE(plain.find("--rotary-base 10000"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("scaling"), std::string::npos) << plain;
}

// The vocabulary: more rows in the files than the model has are dropped
// (with a note), fewer rows than the tokenizer's tokens are refused; BF16
// files are read exactly.
TEST(HfImport, VocabularyRowsAndBf16Files) {
  auto m = random_model(llama_cfg(), 1);
  const std::string dir = artifacts() + "/vocab_bf16";
  fs::remove_all(dir);
  const HfTokenizerInfo info = null_tokenizer();
  HfExportOptions eo;
  eo.dtype = DType::kBF16, eo.keep_vocab_padding = true;  // 96 rows in the files
  ASSERT_TRUE(export_hf(*m, info, eo, dir).is_ok());
  auto flags = hf_import_flags(read_json(dir + "/config.json"), "config.json");
  ASSERT_TRUE(flags.is_ok());
  EXPECT_EQ(flags->vocab_size, 96);
  auto model_for = [&](int64_t vocab, int64_t divisible) {
    ModelConfig mc;
    FlagSet fl("import");
    model::register_model_flags(fl, mc);
    EXPECT_TRUE(fl.parse(flags->flags).is_ok());
    mc.seq_length = 10, mc.vocab_size = vocab, mc.make_vocab_size_divisible_by = divisible;
    auto r = model::GPTModel::create(mc, {});
    MT_CHECK(r.is_ok(), r.status().message());
    return std::move(*r);
  };
  auto small = model_for(91, 1);  // 91 rows: 5 of the file's dropped
  std::vector<std::string> notes;
  Status st = hf_import_weights(dir, flags->arch, *small, &notes);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("96 vocabulary rows"), std::string::npos) << notes[0];
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight", "decoder.layers.0.mlp.linear_fc1.weight"}) {
    const Tensor a = m->param(name), b = small->param(name);
    for (int64_t k = 0; k < b.numel(); ++k)
      ASSERT_EQ(b.ptr<float>()[k], bf16_to_float(float_to_bf16(a.ptr<float>()[k]))) << name << " " << k;
  }
  auto big = model_for(100, 1);  // the tokenizer has more ids than the files have rows
  st = hf_import_weights(dir, flags->arch, *big, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("the tokenizer has 100 tokens"), std::string::npos) << st.message();
}

// Malformed safetensors files: each a clear kCorrupt (or a refusal), never a
// crash, an out-of-bounds read or a hang.
TEST(HfImport, MalformedSafetensorsAreRefusedClearly) {
  const std::string dir = artifacts() + "/bad_files";
  fs::create_directories(dir);
  auto file = [&](const std::string& name, const std::string& header, size_t data_bytes, int64_t claimed = -1) {
    const std::string path = dir + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = claimed >= 0 ? static_cast<uint64_t>(claimed) : header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(data_bytes, '\0');
    return path;
  };
  struct Bad {
    const char* name;
    std::string header;
    size_t data;
    int64_t claimed;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {"len.safetensors", "{}", 0, 1 << 20, "exceeds the file"},
      {"array.safetensors", "[1, 2]", 0, -1, "not a JSON object"},
      {"json.safetensors", "{\"a\": ", 0, -1, "not a JSON object"},
      {"size.safetensors", R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 16, -1, "do not hold"},
      {"past.safetensors", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16, -1, "truncated"},
      {"order.safetensors", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 16, -1, "begin <= end"},
      {"neg.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 16, -1, "non-negative"},
      {"dtype.safetensors", R"({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", 16, -1, "unknown dtype"},
      {"huge.safetensors", R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 4]}})", 16, -1,
       "too large"},
      {"type.safetensors", R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", 16, -1, "expected an object"},
      // The format's tiling rule (its reference implementation refuses these too).
      {"overlap.safetensors",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, -1, "tensor 'b': data_offsets [4, 12] overlap the previous tensor's end at 8"},
      {"gap.safetensors",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
       12, -1, "leave a gap after the previous tensor's end at 4"},
      {"trailing.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 16, -1,
       "the tensors cover 4 of the 16 data bytes"},
  };
  for (const Bad& b : bad) {
    auto r = MappedSafetensors::open(file(b.name, b.header, b.data, b.claimed));
    ASSERT_FALSE(r.is_ok()) << b.name;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << b.name << ": " << r.status().message();
  }
  // A FIFO where a file should be is refused at once (no blocking open).
  const std::string fifo = dir + "/fifo.safetensors";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = MappedSafetensors::open(fifo);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
  // A deeply nested config value is reported, not recursed into.
  std::string deep = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ";
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  deep += "}";
  auto parsed = nlohmann::json::parse(deep, nullptr, false);
  if (!parsed.is_discarded()) {
    auto f = hf_import_flags(parsed, "config.json");
    ASSERT_FALSE(f.is_ok());
    EXPECT_NE(f.status().message().find("\"hidden_size\" is a JSON array"), std::string::npos) << f.status().message();
  }
}

}  // namespace
}  // namespace mt::checkpoint

