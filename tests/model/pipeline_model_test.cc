// GPTModel split into pipeline stages and chunks, in one process: the stage
// models pass hidden states and their gradients by hand in the order a
// pipeline would (forward through every virtual stage, backward in reverse),
// and must reproduce the whole model's loss and gradients exactly (same
// kernels, same order of accumulation), with and without recomputation,
// tied and untied embeddings, dropout on.

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/gpt.h"

namespace mt::model {
namespace {

ModelConfig cfg4(bool llama) {
  ModelConfig c;
  c.num_layers = 4, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 8;
  c.max_position_embeddings = 8, c.vocab_size = 64, c.make_vocab_size_divisible_by = 8;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1, c.init_method_std = 0.2;
  if (llama) {
    c.group_query_attention = true, c.num_query_groups = 2, c.normalization = Normalization::kRMSNorm;
    c.swiglu = true, c.ffn_hidden_size = 48, c.position_embedding = PositionEmbedding::kRope;
    c.add_bias_linear = false, c.untie_embeddings_and_output_weights = true;
  }
  return c;
}

// stages[p] = the chunks of pipeline rank p; virtual stage s = chunk * P + p.
void check_split(const ModelConfig& cfg, const std::vector<std::vector<LayerRange>>& stages, RecomputeOptions rc) {
  const int64_t P = static_cast<int64_t>(stages.size()), V = static_cast<int64_t>(stages[0].size()), B = 2;
  GPTOptions whole_opt;
  whole_opt.micro_batch = B, whole_opt.dtype = DType::kF64, whole_opt.recompute = rc;
  auto whole = GPTModel::create(cfg, whole_opt);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  (*whole)->init_parameters(9);
  std::vector<std::unique_ptr<GPTModel>> st;
  for (int64_t p = 0; p < P; ++p) {
    GPTOptions o = whole_opt;
    o.chunks = stages[static_cast<size_t>(p)];
    o.pre_process = p == 0, o.post_process = p == P - 1, o.slots = static_cast<int>(V);
    auto m = GPTModel::create(cfg, o);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    (*m)->init_parameters(9);
    st.push_back(std::move(*m));
  }
  std::mt19937 g(4);
  std::vector<int32_t> tok(B * cfg.seq_length), lab(B * cfg.seq_length);
  for (auto& t : tok) t = static_cast<int32_t>(g() % *cfg.vocab_size);
  for (auto& l : lab) l = static_cast<int32_t>(g() % *cfg.vocab_size);
  Tensor tt(tok.data(), {B, cfg.seq_length}, DType::kI32), lt(lab.data(), {B, cfg.seq_length}, DType::kI32);
  (*whole)->zero_grads();
  const double ref = (*whole)->forward(0, tt, lt, 3, true);
  (*whole)->backward(0, 0.5);
  for (auto& m : st) m->zero_grads();
  const int64_t S = P * V;
  double loss = 0;
  for (int64_t s = 0; s < S; ++s) {  // forward through the virtual stages; slot = chunk
    GPTModel& m = *st[static_cast<size_t>(s % P)];
    const int c = static_cast<int>(s / P);
    if (s > 0) {
      GPTModel& prev = *st[static_cast<size_t>((s - 1) % P)];
      Tensor out = prev.chunk_output(static_cast<int>((s - 1) / P)), in = m.chunk_input(c);
      std::memcpy(in.data(), out.data(), in.nbytes());
    }
    loss = m.forward_chunk(c, c, tt, lt, 3, true);
  }
  EXPECT_EQ(loss, ref);
  std::vector<double> dbuf(static_cast<size_t>(B * cfg.seq_length * cfg.hidden_size)), dnext = dbuf;
  for (int64_t s = S - 1; s >= 0; --s) {
    GPTModel& m = *st[static_cast<size_t>(s % P)];
    Tensor dout(dnext.data(), {B * cfg.seq_length, cfg.hidden_size}, DType::kF64);
    Tensor din(dbuf.data(), {B * cfg.seq_length, cfg.hidden_size}, DType::kF64);
    m.backward_chunk(static_cast<int>(s / P), 0.5, s == S - 1 ? Tensor() : dout, s == 0 ? Tensor() : din);
    dnext = dbuf;
  }
  // Tied embeddings: the last stage's copy of the word embedding got the
  // output-layer part of the gradient (the trainer all-reduces the two).
  for (size_t i = 0; i < (*whole)->specs().size(); ++i) {
    const std::string& name = (*whole)->specs()[i].name;
    const Tensor& want = (*whole)->grads()[i];
    std::vector<double> got(static_cast<size_t>(want.numel()), 0.0);
    int holders = 0;
    for (auto& m : st) {
      const int j = m->find(name);
      if (j < 0) continue;
      ++holders;
      for (int64_t e = 0; e < want.numel(); ++e) got[static_cast<size_t>(e)] += m->grads()[static_cast<size_t>(j)].ptr<double>()[e];
    }
    ASSERT_GE(holders, 1) << name << " is held by no stage";
    double err = 0, scale = 1e-300;
    for (int64_t e = 0; e < want.numel(); ++e) {
      err = std::max(err, std::abs(got[static_cast<size_t>(e)] - want.ptr<double>()[e]));
      scale = std::max(scale, std::abs(want.ptr<double>()[e]));
    }
    EXPECT_LT(err / scale, 1e-13) << name << " (" << holders << " holder(s))";
  }
}

TEST(PipelineModel, StagesAndChunksReproduceTheWholeModel) {
  RecomputeOptions none, full;
  full.granularity = RecomputeGranularity::kFull, full.method = RecomputeMethod::kUniform, full.num_layers = 1;
  for (bool llama : {false, true})
    for (const RecomputeOptions& rc : {none, full}) {
      SCOPED_TRACE(llama ? "llama" : "gpt");
      check_split(cfg4(llama), {{{0, 2}}, {{2, 2}}}, rc);                      // PP 2
      check_split(cfg4(llama), {{{0, 1}}, {{1, 1}}, {{2, 1}}, {{3, 1}}}, rc);  // PP 4
      check_split(cfg4(llama), {{{0, 1}, {2, 1}}, {{1, 1}, {3, 1}}}, rc);      // PP 2 x 2 virtual stages
      check_split(cfg4(llama), {{{0, 1}}, {{1, 3}}}, rc);                      // uneven
    }
}

// --moe-layer-freq: MoE layers 0 and 3, dense 1 and 2, so that with two
// virtual stages a slot position holds a dense layer in one chunk and an
// MoE layer in the other; and the sigmoid router with its bias on 1 of 2.
TEST(PipelineModel, MixedDenseAndMoeLayersReproduceTheWholeModel) {
  RecomputeOptions none, full;
  full.granularity = RecomputeGranularity::kFull, full.method = RecomputeMethod::kUniform, full.num_layers = 1;
  ModelConfig c = cfg4(true);
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24, c.moe_aux_loss_coeff = 0.1;
  c.moe_z_loss_coeff = 0.01, c.moe_layer_freq = "[1,0,0,1]";
  ModelConfig sig = c;
  sig.moe_router_score_function = "sigmoid", sig.moe_router_enable_expert_bias = true, sig.moe_layer_freq = "2";
  sig.moe_shared_expert_intermediate_size = 16;
  for (const RecomputeOptions& rc : {none, full}) {
    check_split(c, {{{0, 2}}, {{2, 2}}}, rc);
    check_split(c, {{{0, 1}, {2, 1}}, {{1, 1}, {3, 1}}}, rc);
    check_split(sig, {{{0, 1}, {2, 1}}, {{1, 1}, {3, 1}}}, rc);
    check_split(sig, {{{0, 1}}, {{1, 3}}}, rc);
  }
}

TEST(PipelineModel, StageHoldsOnlyItsParameters) {
  ModelConfig c = cfg4(false);
  GPTOptions o;
  o.chunks = {{1, 1}, {3, 1}}, o.pre_process = false, o.post_process = true;
  auto m = GPTModel::create(c, o);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_LT((*m)->find("decoder.layers.0.input_layernorm.weight"), 0);
  EXPECT_GE((*m)->find("decoder.layers.1.input_layernorm.weight"), 0);
  EXPECT_LT((*m)->find("decoder.layers.2.input_layernorm.weight"), 0);
  EXPECT_GE((*m)->find("decoder.layers.3.input_layernorm.weight"), 0);
  EXPECT_LT((*m)->find("embedding.position_embeddings.weight"), 0);
  const int w = (*m)->find("embedding.word_embeddings.weight");
  ASSERT_GE(w, 0) << "a tied last stage keeps the word embedding as its output layer";
  EXPECT_TRUE((*m)->is_shared_copy(w));
  GPTOptions bad = o;
  bad.chunks = {{1, 2}, {2, 1}};
  auto b = GPTModel::create(c, bad);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("overlaps"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace mt::model
