#include "model/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

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

TEST(ModelConfig, Gpt2SmallParameterCount) {
  ModelConfig m;
  m.num_layers = 12, m.hidden_size = 768, m.num_attention_heads = 12, m.max_position_embeddings = 1024;
  m.vocab_size = 50257, m.make_vocab_size_divisible_by = 1;
  // GPT-2 124M: 124,439,808 parameters with the unpadded vocabulary.
  EXPECT_EQ(model_params(m, m.padded_vocab(1)).total(), 124439808);
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
