// GPTModel on the GPU against GPTModel on the CPU: one forward and backward of
// small GPT-2-style (LayerNorm, GELU, biases, learned positions, dropout)
// and LLaMA-style (RMSNorm, SwiGLU, rope, GQA, no biases) models through
// every CUDA twin at once (GEMM, norms, activations, rope, attention,
// cross-entropy, embedding, dropout), in fp32 and under --bf16 (bf16 GEMMs,
// the activations between two GEMMs stored in bf16, the tensor-core
// attention at head_dim 64), with and without selective recomputation.
// The kernel tests check each twin alone; this one checks that the model
// hands them the dtypes, shapes and strides each path expects.
// Runs on a GPU (model_test) and on the host CUDA emulator (emu.CudaModel.*).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../kernels/cuda_test_util.h"
#include "core/device.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

using test::to_host;

ModelConfig small_gpt() {
  ModelConfig c;
  c.num_layers = 2, c.hidden_size = 128, c.num_attention_heads = 2, c.seq_length = 24;  // head_dim 64
  c.max_position_embeddings = 32, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  c.init_method_std = 0.05;
  return c;
}

ModelConfig small_llama() {
  ModelConfig c = small_gpt();
  c.num_attention_heads = 4, c.group_query_attention = true, c.num_query_groups = 2;  // head_dim 32: SIMT
  c.normalization = Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 96;
  c.position_embedding = PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true, c.hidden_dropout = 0, c.attention_dropout = 0;
  return c;
}

struct Run {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // every parameter's gradient
  std::vector<std::string> names;
};

Run run(const ModelConfig& cfg, Device dev, bool bf16, bool selective) {
  GPTOptions opt;
  opt.micro_batch = 2, opt.half_compute = bf16, opt.device = dev;
  if (selective) opt.recompute.granularity = RecomputeGranularity::kSelective;
  auto m = GPTModel::create(cfg, opt);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  Run r;
  if (!m.is_ok()) return r;
  GPTModel& model = **m;
  model.init_parameters(7);
  if (bf16) model.sync_low_precision();
  std::vector<int32_t> tok(2 * cfg.seq_length), lab(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((i * 37 + 5) % 91);
    lab[i] = static_cast<int32_t>((i * 53 + 11) % 91);
  }
  Tensor tt(tok.data(), {2, cfg.seq_length}, DType::kI32), lt(lab.data(), {2, cfg.seq_length}, DType::kI32);
  model.zero_grads();
  r.loss = model.forward(0, tt, lt, /*dropout_step=*/3, /*training=*/true);
  model.backward(0);
  for (size_t i = 0; i < model.specs().size(); ++i) {
    const Tensor g = model.grads()[i];
    std::vector<float> h(static_cast<size_t>(g.numel()));
    copy_tensor(g, Tensor(h.data(), g.shape(), DType::kF32));
    r.grads.push_back(std::move(h));
    r.names.push_back(model.specs()[i].name);
  }
  return r;
}

// ||a - b|| / max(||b||, floor) over one tensor.
double rel_err(const std::vector<float>& a, const std::vector<float>& b, double floor = 0) {
  double num = 0, den = floor * floor;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void compare(const ModelConfig& cfg, bool bf16, bool selective, const char* what) {
  const Run cpu = run(cfg, Device::kCpu, bf16, selective), gpu = run(cfg, Device::kCuda, bf16, selective);
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  // fp32: summation orders differ (cuBLASLt, the GPU's reductions); --bf16:
  // the same roundings to bf16, but an fp32 sum a few ulps apart can round to
  // a neighbouring bf16 value, and that difference then propagates; the
  // tensor-core attention also rounds P and dS to bf16 where the CPU twin
  // keeps fp32. Measured on the emulator: fp32 gradients within 1e-6, bf16
  // within 2.3e-6 (SIMT attention) and 7.3e-3 (tensor cores).
  const double loss_tol = bf16 ? 2e-3 : 1e-5, grad_tol = bf16 ? 3e-2 : 1e-4;
  EXPECT_NEAR(gpu.loss, cpu.loss, loss_tol * std::abs(cpu.loss)) << what;
  // A LayerNorm k bias (--qk-layernorm) adds q.b to a whole row of scores,
  // which softmax ignores: its gradient is zero in exact arithmetic, and
  // rounding noise is measured against the largest gradient's norm.
  double largest = 0;
  for (const auto& g : cpu.grads) largest = std::max(largest, rel_err(g, std::vector<float>(g.size(), 0.f)));
  auto err = [&](size_t i) {
    const bool zero = cpu.names[i].find("k_layernorm.bias") != std::string::npos;
    return rel_err(gpu.grads[i], cpu.grads[i], zero ? largest : 0);
  };
  for (size_t i = 0; i < cpu.grads.size(); ++i) EXPECT_LT(err(i), grad_tol) << what << ": " << cpu.names[i];
  double worst = 0;
  for (size_t i = 0; i < cpu.grads.size(); ++i) worst = std::max(worst, err(i));
  std::printf("%s: loss %.9g (CPU %.9g), worst gradient relative error %.3g\n", what, gpu.loss, cpu.loss, worst);
}

TEST(CudaModel, GptForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  compare(small_gpt(), false, false, "GPT fp32");
  compare(small_gpt(), true, false, "GPT bf16 (tensor-core attention)");
  compare(small_gpt(), true, true, "GPT bf16, selective recomputation");
}

TEST(CudaModel, LlamaForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  compare(small_llama(), false, false, "LLaMA fp32");
  compare(small_llama(), true, false, "LLaMA bf16");
  ModelConfig d64 = small_llama();
  d64.num_attention_heads = 2, d64.num_query_groups = 1;  // head_dim 64: tensor cores, GQA 2:1
  compare(d64, true, false, "LLaMA bf16, head_dim 64");
}

// --qk-layernorm (the q/k heads gathered, normalised, scattered back on the
// device): RMSNorm on a LLaMA, LayerNorm with zero-centred weights on a GPT.
TEST(CudaModel, QkLayernormForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  ModelConfig q = small_llama();
  q.qk_layernorm = true;
  compare(q, false, false, "LLaMA --qk-layernorm fp32");
  compare(q, true, false, "LLaMA --qk-layernorm bf16");
  ModelConfig g = small_gpt();
  g.qk_layernorm = true, g.apply_layernorm_1p = true;
  compare(g, false, false, "GPT --qk-layernorm --apply-layernorm-1p fp32");
}

// --num-experts: routing, the dispatch map, permutation and combination on
// the device (kernels/cuda/moe.cu), the experts' GEMMs on slices of the
// permuted rows, and the router losses' gradients.
TEST(CudaModel, MoeForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  ModelConfig x = small_llama();
  x.num_experts = 4, x.moe_router_topk = 2, x.moe_ffn_hidden_size = 48;
  x.moe_aux_loss_coeff = 0.1, x.moe_z_loss_coeff = 0.01;
  compare(x, false, false, "Mixtral-style fp32");
  compare(x, true, false, "Mixtral-style bf16");
  ModelConfig g = small_gpt();
  g.add_bias_linear = false, g.num_experts = 3, g.moe_router_topk = 1, g.moe_router_pre_softmax = true;
  g.moe_aux_loss_coeff = 0.1, g.hidden_dropout = 0, g.attention_dropout = 0;
  compare(g, false, false, "GPT MoE top-1 fp32");
  // Token dropping: the kept choices (moe_drop) and the map with dropped slots.
  ModelConfig c = x;
  c.moe_expert_capacity_factor = 0.6;
  compare(c, false, false, "Mixtral-style capacity 0.6 fp32");
  c.moe_token_drop_policy = "position";
  compare(c, true, false, "Mixtral-style capacity 0.6 by position bf16");
  // --moe-layer-freq: MoE on layer 0 only, the dense MLP (wider than the
  // experts) on the others: fc1 and act views per layer kind.
  ModelConfig f = x;
  f.moe_layer_freq = std::to_string(x.num_layers);
  compare(f, false, false, "Mixtral-style MoE layer 0 only fp32");
  compare(f, true, false, "Mixtral-style MoE layer 0 only bf16");
  // --moe-input-jitter-eps: the router's noise drawn on the device (jitter kernel).
  ModelConfig j = x;
  j.moe_input_jitter_eps = 0.2;
  compare(j, false, false, "Mixtral-style router jitter fp32");
}

// --multi-latent-attention: the down/up projections (two row blocks of
// kv_down), the q/kv norms, the packing into the fused layout, YaRN on the
// position dims and the padded value dims on the device. Heads of 48 + 16 =
// 64 (the tensor-core attention under --bf16), values of 32.
TEST(CudaModel, MlaForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  ModelConfig m = small_llama();
  m.group_query_attention = false, m.num_query_groups.reset();
  m.multi_latent_attention = true, m.q_lora_rank = 48, m.kv_lora_rank = 32, m.qk_head_dim = 48;
  m.qk_pos_emb_head_dim = 16, m.v_head_dim = 32, m.qk_layernorm = true;
  m.rotary_scaling_factor = 40, m.mscale = 1.0, m.mscale_all_dim = 0.707;
  compare(m, false, false, "MLA fp32");
  compare(m, true, false, "MLA bf16 (tensor-core attention)");
  compare(m, true, true, "MLA bf16, selective recomputation");
  ModelConfig g = small_gpt();
  g.multi_latent_attention = true, g.kv_lora_rank = 24, g.qk_head_dim = 24, g.qk_pos_emb_head_dim = 8;
  g.v_head_dim = 32, g.rope_type = "rope";
  compare(g, false, false, "MLA on GPT, linear_q_proj, fp32");
}

// --mtp-num-layers: the rolled tokens' embedding, enorm/hnorm into eh_proj's
// [embedding | hidden] input (copy_columns: cudaMemcpy2DAsync), the MTP
// layers and their losses on the device; the LLaMA with two depths, the
// GPT (LayerNorm, tied embeddings, dropout) with one.
TEST(CudaModel, MtpForwardBackwardMatchesCpu) {
  MT_REQUIRE_GPU();
  ModelConfig l = small_llama();
  l.mtp_num_layers = 2, l.mtp_loss_scaling_factor = 0.3;
  compare(l, false, false, "LLaMA MTP 2 fp32");
  compare(l, true, false, "LLaMA MTP 2 bf16");
  ModelConfig g = small_gpt();
  g.position_embedding = PositionEmbedding::kNone, g.mtp_num_layers = 1;
  compare(g, false, false, "GPT MTP 1 fp32");
}

}  // namespace
}  // namespace mt::model
