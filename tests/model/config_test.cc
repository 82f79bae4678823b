#include "model/config.h"
#include "model/params.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <tuple>

namespace mt::model {
namespace {

TEST(ModelConfig, PaddedVocabAsMegatron) {
  ModelConfig m;
  m.vocab_size = 50257;
  EXPECT_EQ(m.padded_vocab(1), 50304);
  EXPECT_EQ(m.padded_vocab(2), 50432);
  EXPECT_EQ(m.padded_vocab(4), 50688);
  m.vocab_size = 32000;
  EXPECT_EQ(m.padded_vocab(1), 32000);
  EXPECT_EQ(m.padded_vocab(8), 32768);
  m.make_vocab_size_divisible_by = 1;
  EXPECT_EQ(m.padded_vocab(1), 32000);
}

TEST(ModelConfig, DerivedDefaults) {
  ModelConfig m;
  m.hidden_size = 4096, m.num_attention_heads = 32;
  EXPECT_EQ(m.ffn(), 16384);
  m.swiglu = true;
  EXPECT_EQ(m.ffn(), 10880);  // int((4h * 2/3) / 64) * 64, the spec's example
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.query_groups(), 32);
  m.group_query_attention = true;
  EXPECT_EQ(m.query_groups(), 1);  // --num-query-groups defaults to 1 with GQA
  m.num_query_groups = 8;
  EXPECT_EQ(m.query_groups(), 8);
  m.kv_channels = 64;
  EXPECT_EQ(m.head_dim(), 64);
}

TEST(ModelConfig, Llama2_7BParameterCount) {
  ModelConfig m;
  m.num_layers = 32, m.hidden_size = 4096, m.num_attention_heads = 32, m.ffn_hidden_size = 11008;
  m.vocab_size = 32000, m.normalization = Normalization::kRMSNorm, m.swiglu = true;
  m.position_embedding = PositionEmbedding::kRope, m.add_bias_linear = false, m.untie_embeddings_and_output_weights = true;
  // Hugging Face's Llama-2-7b has 6,738,415,616 parameters.
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).total(), 6738415616);
  EXPECT_EQ(megatron_param_count(m, m.padded_vocab(1)).total, 6738415616);
}

// DeepSeek-V3 (its config.json: 61 layers, the first 3 dense, MLA with q
// rank 1536, kv rank 512, heads of 128 + 64, values 128; 256 routed experts
// of 2048 and one shared, vocabulary 129280): 671,026,404,352 parameters,
// the sum of its Hugging Face tensors' shapes without the multi-token
// prediction layer (DeepSeek's "671B total"), written out here per tensor.
// The gate's e_score_correction_bias is a buffer there, and state here.
TEST(ModelConfig, DeepSeekV3ParameterCount) {
  ModelConfig m;
  m.num_layers = 61, m.hidden_size = 7168, m.num_attention_heads = 128, m.ffn_hidden_size = 18432;
  m.vocab_size = 129280, m.normalization = Normalization::kRMSNorm, m.swiglu = true;
  m.position_embedding = PositionEmbedding::kRope, m.add_bias_linear = false, m.untie_embeddings_and_output_weights = true;
  m.multi_latent_attention = true, m.q_lora_rank = 1536, m.kv_lora_rank = 512, m.qk_head_dim = 128;
  m.qk_pos_emb_head_dim = 64, m.v_head_dim = 128, m.qk_layernorm = true;
  m.num_experts = 256, m.moe_ffn_hidden_size = 2048, m.moe_shared_expert_intermediate_size = 2048;
  m.moe_router_topk = 8, m.moe_layer_freq = "[0]*3+[1]*58";
  const int64_t h = 7168, V = 129280, a = 128;
  const int64_t attention = 1536 * h + 1536 + a * 192 * 1536 + (512 + 64) * h + 512 + a * 256 * 512 + h * a * 128;
  const int64_t dense = 3 * h * 18432, moe = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h, norms = 2 * h;
  const int64_t want = 2 * V * h + 3 * (attention + dense + norms) + 58 * (attention + moe + norms) + h;
  EXPECT_EQ(want, int64_t{671026404352});
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).total(), want);
  // Megatron's count (theoretical_memory_usage.py's MLA term) has the same
  // tensors here: no biases, and the q/kv norms it counts exist.
  EXPECT_EQ(megatron_param_count(m, m.padded_vocab(1)).total, want);
  // With its one MTP depth (--mtp-num-layers 1): an MoE layer like the
  // last, enorm, hnorm, the final norm and eh_proj [h, 2h]; 11.61e9 more
  // (DeepSeek's 14B MTP module adds copies of the embedding and the head,
  // which Megatron shares). Megatron's count takes the layer alone.
  m.mtp_num_layers = 1;
  const int64_t mtp_layer = attention + moe + norms;
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).mtp, mtp_layer + 3 * h + 2 * h * h);
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).total(), want + int64_t{11610067968});
  EXPECT_EQ(megatron_param_count(m, m.padded_vocab(1)).total, want + mtp_layer);
  // The FLOPs formula's MLP widths: the MTP layer's top-8 and shared experts too.
  EXPECT_DOUBLE_EQ(mlp_width_over_layers(m), 3 * 18432 + 59 * (8 * 2048 + 2048));
}

// --mtp-num-layers: the registry's parameters (what the model allocates)
// add up to model_params' count, the MTP layers' names under mtp.layers.{k}.
TEST(ModelConfig, MtpParametersInTheRegistry) {
  ModelConfig c;
  c.num_layers = 3, c.hidden_size = 32, c.num_attention_heads = 4, c.vocab_size = 100;
  c.position_embedding = PositionEmbedding::kRope, c.mtp_num_layers = 2;
  const int64_t V = c.padded_vocab(2);
  int64_t n = 0, mtp = 0;
  for (const ParamSpec& s : gpt_param_specs(c, 2)) {
    n += s.global_shape.numel();
    if (s.name.rfind("mtp.layers.", 0) == 0) {
      mtp += s.global_shape.numel();
      EXPECT_EQ(s.layer, 3 + (s.name[11] - '0')) << s.name;
    }
  }
  const ModelParams mp = model_params(c, V);
  EXPECT_EQ(n, mp.total());
  EXPECT_EQ(mtp, mp.mtp);
  EXPECT_EQ(mp.mtp, 2 * (layer_params(c, false).total() + 3 * 2 * 32 + 2 * 32 * 32));
  bool eh = false;
  for (const ParamSpec& s : gpt_param_specs(c, 2))
    if (s.name == "mtp.layers.1.eh_proj.weight")
      eh = s.global_shape == Shape{32, 64} && s.shard == ShardKind::kColumn && s.local_shape(2) == Shape{16, 64};
  EXPECT_TRUE(eh) << "eh_proj [h, 2h], column-parallel";
  EXPECT_EQ(c.layer_prefix(4), "mtp.layers.1.transformer_layer.");
  // --mtp-use-repeated-layer: one MTP layer's parameters serve both depths.
  c.mtp_use_repeated_layer = true;
  EXPECT_EQ(c.layer_prefix(4), "mtp.layers.0.transformer_layer.");
  EXPECT_EQ(c.param_layer(4), 3);
  int64_t rep = 0;
  for (const ParamSpec& s : gpt_param_specs(c, 2))
    if (s.name.rfind("mtp.layers.", 0) == 0) {
      rep += s.global_shape.numel();
      EXPECT_EQ(s.name.rfind("mtp.layers.0.", 0), 0u) << s.name;
    }
  EXPECT_EQ(rep, model_params(c, V).mtp);
  EXPECT_EQ(2 * rep, mtp) << "half the parameters of two layers";
}

TEST(ModelConfig, Gpt2SmallParameterCount) {
  ModelConfig m;
  m.num_layers = 12, m.hidden_size = 768, m.num_attention_heads = 12, m.max_position_embeddings = 1024;
  m.vocab_size = 50257, m.make_vocab_size_divisible_by = 1;
  // GPT-2 124M: 124,439,808 parameters with the unpadded vocabulary.
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).total(), 124439808);
}

// --moe-layer-freq as Megatron reads it: an integer N (layer i MoE iff
// i % N == 0) or a Python list expression (the values Python's eval gives).
TEST(ModelConfig, MoeLayerFreqPatterns) {
  auto pat = [](const std::string& f, int64_t L) {
    auto p = moe_layer_pattern(f, L);
    EXPECT_TRUE(p.is_ok()) << f << ": " << p.status().message();
    return p.is_ok() ? *p : std::vector<int>{};
  };
  EXPECT_EQ(pat("1", 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(pat("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(pat(" 3 ", 4), (std::vector<int>{1, 0, 0, 1}));
  EXPECT_EQ(pat("([1]*3+[0]*1)*3", 12), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}));  // Megatron's help
  EXPECT_EQ(pat("[0, 1,1]", 3), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(pat("[1,0,]", 2), (std::vector<int>{1, 0}));
  EXPECT_EQ(pat("2*[1,0]", 4), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(pat("[0]*1+[1]*2*2", 5), (std::vector<int>{0, 1, 1, 1, 1}));
  const std::vector<int> v3 = pat("[0]*3+[1]*58", 61);  // DeepSeek-V3: three dense layers first
  ASSERT_EQ(v3.size(), 61u);
  EXPECT_EQ(v3[0] + v3[1] + v3[2], 0);
  EXPECT_EQ(std::accumulate(v3.begin(), v3.end(), 0), 58);
  // Errors name the flag and what was expected.
  for (const auto& [f, L, want] : std::vector<std::tuple<std::string, int64_t, std::string>>{
           {"[1]*3", 4, "the list has 3 terms but --num-layers is 4"},
           {"[2]*4", 4, "term 0 is 2"},
           {"0", 4, "a positive integer"},
           {"1.5", 4, "a positive integer"},
           {"[1,0", 2, "expected ',' or ']' at offset 4"},
           {"[1]+", 1, "expected '[' or '(' at offset 4"},
           {"[1]*", 1, "expected an integer at offset 4"},
           {"([1]", 1, "expected ')'"},
           {"[1] [0]", 2, "expected an operator or the end at offset 4"},
           {"[01]", 1, "without leading zeros"},
           {"[1]*02", 2, "without leading zeros"},
           {"[1]*1234567890", 1, "at most 9 digits"},
           // Bounded before anything is allocated: a pattern has one term per layer.
           {"999999999*[1]", 1, "a list of at most 1048576 terms"},
           {"([1]*1000000)*1000", 1, "a list of at most 1048576 terms"},
           {std::string(70, '(') + "[1]" + std::string(70, ')'), 1, "at most 64 nested parentheses"}}) {
    auto p = moe_layer_pattern(f, L);
    ASSERT_FALSE(p.is_ok()) << f;
    EXPECT_NE(p.status().message().find("--moe-layer-freq '" + f + "'"), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status().message();
  }
  ModelConfig c;
  c.num_layers = 6;
  EXPECT_FALSE(c.is_moe_layer(0)) << "a dense model has no MoE layer";
  c.num_experts = 8, c.moe_layer_freq = "[0]*2+[1]*4";
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_EQ(c.num_moe_layers(), 4);
  EXPECT_TRUE(c.has_dense_layers());
  c.moe_layer_freq = "1";
  EXPECT_EQ(c.num_moe_layers(), 6);
  EXPECT_FALSE(c.has_dense_layers());
}

// Parameter counts with dense and MoE layers: 2 dense + 4 MoE layers, each
// kind's count written out.
TEST(ModelConfig, MoeLayerFreqParameterCounts) {
  ModelConfig c;
  c.num_layers = 6, c.hidden_size = 64, c.num_attention_heads = 4, c.swiglu = true, c.ffn_hidden_size = 256;
  c.normalization = Normalization::kRMSNorm, c.add_bias_linear = false, c.vocab_size = 1000;
  c.position_embedding = PositionEmbedding::kRope, c.untie_embeddings_and_output_weights = true;
  c.num_experts = 8, c.moe_ffn_hidden_size = 32, c.moe_shared_expert_intermediate_size = 64;
  c.moe_layer_freq = "[0]*2+[1]*4";
  const int64_t h = 64, attn = h * 3 * h + h * h, norms = 2 * h;
  const int64_t dense = attn + norms + 3 * h * 256;
  const int64_t moe = attn + norms + 8 * h + 8 * 3 * h * 32 + 3 * h * 64;
  EXPECT_EQ(layer_params(c, false).total(), dense);
  EXPECT_EQ(layer_params(c, true).total(), moe);
  const int64_t V = c.padded_vocab(1);
  const ModelParams mp = model_params(c, V);
  EXPECT_EQ(mp.layers, 2 * dense + 4 * moe);
  EXPECT_EQ(mp.total(), 2 * dense + 4 * moe + 2 * V * h + h);
  // Megatron's count (no biases to drop here): the same total.
  EXPECT_EQ(megatron_param_count(c, V).total, mp.total());
  // The FLOPs formula's MLP widths: dense 256 on 2 layers, top-2 experts
  // of 32 and the shared 64 on 4.
  EXPECT_DOUBLE_EQ(mlp_width_over_layers(c), 2 * 256 + 4 * (2 * 32 + 64));
}

TEST(ModelConfig, VocabFileIsCounted) {
  std::string path = ::testing::TempDir() + "/vocab.json";
  {
    std::ofstream out(path);
    out << R"({"a": 0, "b": 1, "<|endoftext|>": 2})";
  }
  ModelConfig m;
  m.vocab_file = path;
  ASSERT_TRUE(resolve_vocab(m));
  EXPECT_EQ(m.vocab_size, 3);
  m.vocab_size = 5;
  Status st = resolve_vocab(m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("disagrees"), std::string::npos);
  {
    std::ofstream out(path);
    out << "not json";
  }
  m.vocab_size.reset();
  st = resolve_vocab(m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("--vocab-file"), std::string::npos);
  m.vocab_file = path + ".missing";
  EXPECT_FALSE(resolve_vocab(m));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mt::model
