// GPTModel with tensor (and sequence) parallelism under mpirun, against the
// serial model on the same rank: every rank builds the serial model and its
// TP shard from the same seed (parallel-invariant initialisation), runs one
// micro-batch forward and backward -- with dropout ON, since masks are keyed
// by global element indices -- and checks, in fp64 (tight) and fp32:
//   - the loss equals the serial loss;
//   - every local gradient equals the matching global slice (shard_pieces)
//     of the serial gradient (after reduce_tp_replicated_grads with SP);
//   - initial parameters are exactly the serial slices.
// Run with 1, 2 and 4 ranks (one TP group of all ranks).

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "../support/mpi_test.h"

namespace mt::model {
namespace {

ModelConfig gpt_cfg() {
  ModelConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 8;
  c.max_position_embeddings = 8, c.vocab_size = 100, c.make_vocab_size_divisible_by = 8;  // padded: 104 (TP1), 112 (TP2), 128 (TP4)
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1, c.init_method_std = 0.2;
  return c;
}

ModelConfig llama_cfg() {
  ModelConfig c = gpt_cfg();
  c.hidden_size = 32, c.num_attention_heads = 8, c.group_query_attention = true, c.num_query_groups = 4;
  c.normalization = Normalization::kRMSNorm, c.swiglu = true, c.ffn_hidden_size = 48;
  c.position_embedding = PositionEmbedding::kRope, c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

ModelConfig postln_cfg() {
  ModelConfig c = gpt_cfg();
  c.apply_residual_connection_post_layernorm = true, c.openai_gelu = true;
  return c;
}

ModelConfig qwen3_cfg() {  // --qk-layernorm: q/k RMSNorm weights replicated, their TP gradients partial
  ModelConfig c = llama_cfg();
  c.qk_layernorm = true, c.kv_channels = 8;
  return c;
}

ModelConfig gpt_qk_cfg() {  // LayerNorm q/k norms (weights and biases)
  ModelConfig c = gpt_cfg();
  c.qk_layernorm = true;
  return c;
}

// --multi-latent-attention: DeepSeek-style (low-rank queries, q/kv RMSNorms,
// YaRN, values narrower than the q/k heads) and the GPT functional test's
// (one linear_q_proj, LayerNorm, learned positions, no q/kv norms). The down
// projections and q/kv norms are replicated: partial gradients under SP only.
ModelConfig mla_cfg() {
  ModelConfig c = llama_cfg();
  c.group_query_attention = false, c.num_query_groups.reset();
  c.multi_latent_attention = true, c.q_lora_rank = 12, c.kv_lora_rank = 10, c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4, c.v_head_dim = 4, c.qk_layernorm = true;
  c.rotary_scaling_factor = 40, c.mscale = 1.0, c.mscale_all_dim = 0.707;
  return c;
}
ModelConfig mla_gpt_cfg() {
  ModelConfig c = gpt_cfg();
  c.multi_latent_attention = true, c.kv_lora_rank = 8, c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 8;
  return c;
}

// --mtp-num-layers: two MTP depths on the LLaMA (untied output layer), one
// on the GPT without position embeddings (tied: the output layer and the
// MTP embedding are the word embedding; dropout on the MTP embedding and
// layer), and one on the DeepSeek-V3-like sigmoid-routed MoE (the MTP layer
// an MoE layer like the last).
ModelConfig llama_mtp_cfg() {
  ModelConfig c = llama_cfg();
  c.mtp_num_layers = 2, c.mtp_loss_scaling_factor = 0.3;
  return c;
}
ModelConfig gpt_mtp_cfg() {
  ModelConfig c = gpt_cfg();
  c.position_embedding = PositionEmbedding::kNone, c.mtp_num_layers = 1;
  return c;
}

ModelConfig mixtral_cfg() {  // MoE (TP needs SP): 4 experts of width 24, top-2, both router losses
  ModelConfig c = llama_cfg();
  c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24;
  c.moe_aux_loss_coeff = 0.3, c.moe_z_loss_coeff = 0.05;
  return c;
}

ModelConfig shared_cfg() {  // mixtral with a shared expert of width 32 (SwiGLU, split over TP)
  ModelConfig c = mixtral_cfg();
  c.moe_shared_expert_intermediate_size = 32;
  return c;
}

ModelConfig shared_gate_cfg() {  // the shared expert times sigmoid(x . g) (--moe-shared-expert-gate)
  ModelConfig c = shared_cfg();
  c.moe_shared_expert_gate = true;
  return c;
}

ModelConfig sigmoid_cfg() {  // DeepSeek-V3's sigmoid router with its expert bias (zeros here), and a shared expert
  ModelConfig c = shared_cfg();
  c.moe_router_score_function = "sigmoid", c.moe_router_enable_expert_bias = true;
  return c;
}

// --moe-layer-freq: layer 0 dense (its MLP 48 wide, split over TP like any
// dense MLP), layer 1 MoE; and the sigmoid router with its bias and a shared
// expert on layer 0 only.
ModelConfig freq_cfg() {
  ModelConfig c = mixtral_cfg();
  c.moe_layer_freq = "[0,1]";
  return c;
}
ModelConfig freq_sigmoid_cfg() {
  ModelConfig c = sigmoid_cfg();
  c.moe_layer_freq = "([1]+[0])";
  return c;
}

ModelConfig moe_gpt_cfg() {  // MoE GPT: top-1, pre-softmax router scaled by 2, no biases
  ModelConfig c = gpt_cfg();
  c.add_bias_linear = false, c.num_experts = 3, c.moe_router_topk = 1, c.moe_router_pre_softmax = true;
  c.moe_router_topk_scaling_factor = 2.0, c.moe_aux_loss_coeff = 0.2, c.moe_ffn_hidden_size = 16;
  return c;
}

template <typename T>
double value(const Tensor& t, int64_t i) {
  return static_cast<double>(t.ptr<T>()[i]);
}

// Max over elements of |local - serial slice| / max(max |serial|, floor).
// The floor is for a gradient that is zero in exact arithmetic and rounding
// noise in practice: a LayerNorm k bias (--qk-layernorm) adds q.b to every
// score of a query's row, which softmax ignores.
template <typename T>
double slice_err(const ParamSpec& s, int64_t tp, int64_t r, const Tensor& local, const Tensor& serial,
                 double floor = 1e-30) {
  const int64_t gcols = s.global_shape.ndim >= 2 ? s.global_shape.numel() / s.global_shape[0] : 1;
  const int64_t lcols = local.ndim() >= 2 ? local.numel() / local.dim(0) : 1;
  double scale = floor, err = 0;
  for (int64_t i = 0; i < serial.numel(); ++i) scale = std::max(scale, std::abs(value<T>(serial, i)));
  for (const ShardPiece& p : shard_pieces(s, tp, r)) {
    const int64_t rows = p.shape.ndim >= 2 ? p.shape[0] : 1;
    const int64_t cols = p.shape.ndim >= 2 ? p.shape.numel() / p.shape[0] : p.shape[0];
    const int64_t grow = p.shape.ndim >= 2 ? p.offsets[0] : 0, gcol = p.shape.ndim >= 2 ? p.offsets[1] : p.offsets[0];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        // The serial model may have a smaller padded vocabulary: compare the rows it has.
        if (grow + i >= serial.dim(0) && s.shard == ShardKind::kVocab) continue;
        const double a = value<T>(local, (p.local_row + i) * lcols + j);
        const double b = value<T>(serial, (grow + i) * gcols + gcol + j);
        err = std::max(err, std::abs(a - b));
      }
  }
  return err / scale;
}

struct Case {
  const char* name;
  ModelConfig cfg;
  bool sp;
  DType dt;
  double tol;
};

void run_case(const Case& c) {
  auto world = comm::world_communicator();
  const int64_t tp = world->size(), r = world->rank();
  ModelConfig cfg = c.cfg;
  // The same padded vocabulary in both models (Megatron pads to 8 x TP here).
  cfg.vocab_size = cfg.padded_vocab(tp);
  const int64_t B = 2, T = cfg.seq_length, V = *cfg.vocab_size;
  GPTOptions so;
  so.micro_batch = B, so.dtype = c.dt;
  GPTOptions po = so;
  po.tp = tp, po.tp_rank = r, po.sequence_parallel = c.sp, po.tp_comm = world.get();
  // Token dropping: each TP rank routes its sequence shard with its own
  // capacity (as Megatron's ranks); the serial model drops in as many segments.
  if (c.sp) so.moe_capacity_segments = tp;
  auto serial = GPTModel::create(cfg, so);
  ASSERT_TRUE(serial.is_ok()) << serial.status().message();
  auto par = GPTModel::create(cfg, po);
  ASSERT_TRUE(par.is_ok()) << par.status().message();
  GPTModel &S = **serial, &P = **par;
  S.init_parameters(77);
  P.init_parameters(77);
  for (size_t i = 0; i < S.specs().size(); ++i) {
    const double e = c.dt == DType::kF64 ? slice_err<double>(P.specs()[i], tp, r, P.params()[i], S.params()[i])
                                         : slice_err<float>(P.specs()[i], tp, r, P.params()[i], S.params()[i]);
    ASSERT_EQ(e, 0.0) << c.name << ": initial " << S.specs()[i].name << " is not the serial slice";
  }
  std::mt19937 g(3);
  std::vector<int32_t> tok(B * T), lab(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(g() % V);
  for (auto& l : lab) l = static_cast<int32_t>(g() % V);
  lab[5] = -1;
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
  for (int pass = 0; pass < 2; ++pass) {  // two micro-batches accumulate
    if (pass == 0) S.zero_grads(), P.zero_grads();
    const double ls = S.forward(0, tt, lt, 5 + pass, true);
    const double lp = P.forward(0, tt, lt, 5 + pass, true);
    EXPECT_NEAR(lp, ls, c.tol * std::abs(ls)) << c.name << ": loss";
    for (int k = 0; k < cfg.mtp_layers(); ++k)
      EXPECT_NEAR(P.mtp_loss_total(0, k), S.mtp_loss_total(0, k), c.tol * S.mtp_loss_total(0, k))
          << c.name << ": MTP depth " << k + 1 << "'s loss";
    S.backward(0, 0.5);
    P.backward(0, 0.5);
  }
  P.reduce_tp_replicated_grads();
  EXPECT_EQ(P.scratch_arena().high_water(), P.memory_plan().scratch) << c.name << ": scratch plan";
  if (cfg.mtp_layers()) {  // the acceptance counts from the vocabulary-parallel max and target logit
    const GPTModel::MtpStats a = S.take_mtp_stats(), b = P.take_mtp_stats();
    EXPECT_EQ(a.correct, b.correct) << c.name << ": MTP acceptance";
    EXPECT_EQ(a.total, b.total) << c.name;
  }
  double largest = 0;  // the largest serial gradient element
  for (const Tensor& gr : S.grads())
    for (int64_t i = 0; i < gr.numel(); ++i)
      largest = std::max(largest, std::abs(c.dt == DType::kF64 ? value<double>(gr, i) : value<float>(gr, i)));
  for (size_t i = 0; i < S.specs().size(); ++i) {
    // Zero in exact arithmetic (see slice_err): measured against the largest gradient.
    const double floor = S.specs()[i].name.find("k_layernorm.bias") != std::string::npos ? largest : 1e-30;
    const double e = c.dt == DType::kF64 ? slice_err<double>(P.specs()[i], tp, r, P.grads()[i], S.grads()[i], floor)
                                         : slice_err<float>(P.specs()[i], tp, r, P.grads()[i], S.grads()[i], floor);
    EXPECT_LT(e, c.tol) << c.name << ": gradient of " << S.specs()[i].name << " on TP rank " << r;
  }
}

TEST(TensorParallelModel, EqualsSerialModel) {
  for (bool sp : {false, true})
    for (DType dt : {DType::kF64, DType::kF32}) {
      const double tol = dt == DType::kF64 ? 1e-11 : 2e-5;
      run_case({"gpt", gpt_cfg(), sp, dt, tol});
      run_case({"llama", llama_cfg(), sp, dt, tol});
      run_case({"postln", postln_cfg(), sp, dt, tol});
      run_case({"qwen3", qwen3_cfg(), sp, dt, tol});
      run_case({"gpt_qk", gpt_qk_cfg(), sp, dt, tol});
      run_case({"mla", mla_cfg(), sp, dt, tol});
      run_case({"mla_gpt", mla_gpt_cfg(), sp, dt, tol});
      run_case({"llama mtp", llama_mtp_cfg(), sp, dt, tol});
      run_case({"gpt mtp", gpt_mtp_cfg(), sp, dt, tol});
      if (sp || comm::world_communicator()->size() == 1) {  // MoE with TP needs SP
        ModelConfig sig_mtp = sigmoid_cfg();
        sig_mtp.mtp_num_layers = 1;
        run_case({"sigmoid router mtp", sig_mtp, sp, dt, tol});
        sig_mtp.mtp_num_layers = 2, sig_mtp.mtp_use_repeated_layer = true;  // one MTP layer at both depths
        run_case({"sigmoid router mtp repeated", sig_mtp, sp, dt, tol});
        run_case({"mixtral", mixtral_cfg(), sp, dt, tol});
        run_case({"moe_gpt", moe_gpt_cfg(), sp, dt, tol});
        run_case({"shared expert", shared_cfg(), sp, dt, tol});
        run_case({"gated shared expert", shared_gate_cfg(), sp, dt, tol});
        run_case({"sigmoid router", sigmoid_cfg(), sp, dt, tol});
        ModelConfig cap = mixtral_cfg(), cap_pos = moe_gpt_cfg();
        cap.moe_expert_capacity_factor = 0.6;
        cap_pos.moe_expert_capacity_factor = 0.8, cap_pos.moe_token_drop_policy = "position";
        run_case({"mixtral capacity 0.6", cap, sp, dt, tol});
        run_case({"moe_gpt capacity 0.8 by position", cap_pos, sp, dt, tol});
        ModelConfig seq = mixtral_cfg();
        seq.moe_router_load_balancing_type = "seq_aux_loss";
        run_case({"mixtral seq_aux_loss", seq, sp, dt, tol});
        run_case({"dense layer 0, MoE layer 1", freq_cfg(), sp, dt, tol});
        run_case({"sigmoid MoE layer 0, dense layer 1", freq_sigmoid_cfg(), sp, dt, tol});
        ModelConfig jit = mixtral_cfg(), jit_sig = sigmoid_cfg();  // --moe-input-jitter-eps: the serial noise
        jit.moe_input_jitter_eps = 0.2, jit_sig.moe_input_jitter_eps = 0.2;
        run_case({"mixtral router jitter", jit, sp, dt, tol});
        run_case({"sigmoid router jitter", jit_sig, sp, dt, tol});
      }
    }
}

// Context parallelism (with TP and SP where the world allows): the world
// as a CP x TP grid (TP fastest, as Megatron orders tp-cp). Each CP rank
// holds two of 2 CP chunks of the sequence; it takes the full token and label
// batch and picks its positions. Its loss is the mean over its own counted
// labels, so the test backpropagates count_rank / count_serial x 0.5 (what
// the serial mean weighs the rank's tokens by); summed over CP (the trainer's
// DP x CP reduction), the gradients equal the serial model's, dropout
// included (masks keyed by global positions), and the CP ranks' loss sums
// add up to the serial one. The scratch arena peaks exactly at the plan.
struct CpCase {
  const char* name;
  ModelConfig cfg;
  int64_t tp;
  bool sp;
  DType dt;
  bool bf16;
  RecomputeGranularity recompute;
  double tol;
  bool docs = false;  // --reset-position-ids --reset-attention-mask (documents across the CP chunks)
};

void run_cp_case(const CpCase& c) {
  auto world = comm::world_communicator();
  const int64_t W = world->size(), wr = world->rank(), tp = c.tp, cp = W / tp;
  const int64_t tr = wr % tp, cr = wr / tp;
  std::vector<int> tp_members, cp_members;
  for (int64_t i = 0; i < tp; ++i) tp_members.push_back(static_cast<int>(cr * tp + i));
  for (int64_t j = 0; j < cp; ++j) cp_members.push_back(static_cast<int>(j * tp + tr));
  auto tp_comm = comm::make_group(tp_members, "tp");
  auto cp_comm = comm::make_group(cp_members, "cp");
  ModelConfig cfg = c.cfg;
  cfg.seq_length = cfg.max_position_embeddings = 16;
  cfg.vocab_size = cfg.padded_vocab(tp);
  const int64_t B = 2, T = cfg.seq_length, V = *cfg.vocab_size;
  GPTOptions so;
  so.micro_batch = B, so.dtype = c.dt, so.half_compute = c.bf16;
  so.recompute.granularity = c.recompute;
  so.reset_position_ids = so.reset_attention_mask = c.docs;
  if (c.recompute == RecomputeGranularity::kFull) so.recompute.num_layers = 2;
  GPTOptions po = so;
  po.tp = tp, po.tp_rank = tr, po.sequence_parallel = c.sp, po.tp_comm = tp_comm.get();
  po.cp = cp, po.cp_rank = cr, po.cp_comm = cp_comm.get();
  auto serial = GPTModel::create(cfg, so);
  ASSERT_TRUE(serial.is_ok()) << serial.status().message();
  auto par = GPTModel::create(cfg, po);
  ASSERT_TRUE(par.is_ok()) << c.name << ": " << par.status().message();
  GPTModel &S = **serial, &P = **par;
  S.init_parameters(78);
  P.init_parameters(78);
  std::mt19937 g(4);
  std::vector<int32_t> tok(B * T), lab(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(g() % V);
  for (auto& l : lab) l = static_cast<int32_t>(g() % V);
  lab[3] = lab[20] = lab[21] = -1;  // uneven counts over the CP ranks
  if (cfg.mtp_layers()) {
    // Each CP rank's losses are means over its own labels (Megatron's), an
    // MTP depth's over its own count: their gradients sum over CP to the
    // serial model's only where every rank counts the same share at every
    // depth. CP rank 0 holds the sequence's end, where each depth loses a
    // label; masking labels 6, 7 of sequence 0 and 12, 13 of sequence 1
    // evens the counts out at CP 2 (depths 0 to 2).
    for (auto& l : lab) l = l < 0 ? 1 : l;
    lab[6] = lab[7] = lab[T + 12] = lab[T + 13] = -1;
  }
  // Documents: EOD (token 5) at positions 2, 6, 7 of sequence 0 and 12 of sequence 1.
  std::vector<int32_t> pos(B * T), seg(B * T);
  for (auto& t : tok) t = t == 5 ? 6 : t;
  tok[2] = tok[6] = tok[7] = tok[T + 12] = 5;
  for (int64_t b = 0; b < B; ++b) {
    int32_t p = 0, sg = 0;
    for (int64_t t = 0; t < T; ++t) {
      pos[b * T + t] = p++, seg[b * T + t] = sg;
      if (tok[b * T + t] == 5) p = 0, ++sg;
    }
  }
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
  Tensor pt(pos.data(), {B, T}, DType::kI32), st(seg.data(), {B, T}, DType::kI32);
  S.zero_grads(), P.zero_grads();
  for (int pass = 0; pass < 2; ++pass) {  // two micro-batches accumulate
    S.forward(0, tt, lt, 9 + pass, true, pt, st);
    P.forward(0, tt, lt, 9 + pass, true, pt, st);
    const double total = cp_comm->all_reduce_scalar(P.loss_total(0));
    EXPECT_NEAR(total, S.loss_total(0), c.tol * std::abs(S.loss_total(0))) << c.name << ": loss sum";
    EXPECT_EQ(cp_comm->all_reduce_scalar(P.label_count(0)), S.label_count(0)) << c.name;
    for (int k = 0; k < cfg.mtp_layers(); ++k) {
      const double sum = cp_comm->all_reduce_scalar(P.mtp_loss_total(0, k));
      EXPECT_NEAR(sum, S.mtp_loss_total(0, k), c.tol * S.mtp_loss_total(0, k)) << c.name << ": MTP loss sum";
      EXPECT_EQ(P.mtp_label_count(0, k) * static_cast<double>(cp), S.mtp_label_count(0, k))
          << c.name << ": MTP depth " << k + 1 << " counts evenly";
    }
    S.backward(0, 0.5);
    P.set_moe_loss_scale(0.5);  // the router losses: each CP rank holds its share of the serial ones
    P.backward(0, 0.5 * P.label_count(0) / S.label_count(0));
  }
  P.reduce_tp_replicated_grads();
  for (const Tensor& gr : P.grads()) cp_comm->all_reduce(gr);
  EXPECT_EQ(P.scratch_arena().high_water(), P.memory_plan().scratch) << c.name << ": scratch plan";
  for (size_t i = 0; i < S.specs().size(); ++i) {
    const double e = c.dt == DType::kF64 ? slice_err<double>(P.specs()[i], tp, tr, P.grads()[i], S.grads()[i])
                                         : slice_err<float>(P.specs()[i], tp, tr, P.grads()[i], S.grads()[i]);
    EXPECT_LT(e, c.tol) << c.name << ": gradient of " << S.specs()[i].name << " on CP rank " << cr << ", TP rank " << tr;
  }
}

TEST(ContextParallelModel, EqualsSerialModel) {
  auto world = comm::world_communicator();
  if (world->size() < 2) GTEST_SKIP() << "needs CP > 1";
  const auto none = RecomputeGranularity::kNone, sel = RecomputeGranularity::kSelective,
             full = RecomputeGranularity::kFull;
  for (int64_t tp : {int64_t{1}, int64_t{2}}) {
    if (world->size() / tp < 2) continue;
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      run_cp_case({"gpt", gpt_cfg(), tp, sp, DType::kF64, false, none, 1e-11});
      run_cp_case({"llama", llama_cfg(), tp, sp, DType::kF64, false, none, 1e-11});
      run_cp_case({"qwen3 selective", qwen3_cfg(), tp, sp, DType::kF64, false, sel, 1e-11});
      run_cp_case({"gpt full recompute", gpt_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
      run_cp_case({"llama fp32", llama_cfg(), tp, sp, DType::kF32, false, none, 2e-5});
      run_cp_case({"llama bf16", llama_cfg(), tp, sp, DType::kF32, true, none, 3e-2});
      run_cp_case({"gpt documents", gpt_cfg(), tp, sp, DType::kF64, false, none, 1e-11, true});
      run_cp_case({"llama documents selective", llama_cfg(), tp, sp, DType::kF64, false, sel, 1e-11, true});
      run_cp_case({"mla", mla_cfg(), tp, sp, DType::kF64, false, none, 1e-11});
      run_cp_case({"mla_gpt full recompute", mla_gpt_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
      run_cp_case({"mla bf16 selective", mla_cfg(), tp, sp, DType::kF32, true, sel, 3e-2});
      if (world->size() / tp == 2) {  // the balanced label counts above are CP 2's
        run_cp_case({"llama mtp", llama_mtp_cfg(), tp, sp, DType::kF64, false, none, 1e-11});
        run_cp_case({"gpt mtp selective", gpt_mtp_cfg(), tp, sp, DType::kF64, false, sel, 1e-11});
        run_cp_case({"llama mtp bf16", llama_mtp_cfg(), tp, sp, DType::kF32, true, none, 3e-2});
      }
      if (sp || tp == 1) {  // MoE with TP needs SP
        run_cp_case({"mixtral", mixtral_cfg(), tp, sp, DType::kF64, false, none, 1e-11});
        run_cp_case({"mixtral full recompute", mixtral_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
        ModelConfig seq = mixtral_cfg();  // the per-sequence counts summed over CP
        seq.moe_router_load_balancing_type = "seq_aux_loss";
        run_cp_case({"mixtral seq_aux_loss", seq, tp, sp, DType::kF64, false, none, 1e-11});
        run_cp_case({"shared expert full recompute", shared_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
        run_cp_case({"shared expert bf16", shared_cfg(), tp, sp, DType::kF32, true, none, 3e-2});
        run_cp_case({"gated shared expert full recompute", shared_gate_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
        run_cp_case({"gated shared expert bf16", shared_gate_cfg(), tp, sp, DType::kF32, true, none, 3e-2});
        run_cp_case({"sigmoid router full recompute", sigmoid_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
        run_cp_case({"moe_gpt fp32", moe_gpt_cfg(), tp, sp, DType::kF32, false, none, 2e-5});
        run_cp_case({"mixtral bf16", mixtral_cfg(), tp, sp, DType::kF32, true, none, 3e-2});
        run_cp_case({"dense layer 0, MoE layer 1, full recompute", freq_cfg(), tp, sp, DType::kF64, false, full, 1e-11});
        ModelConfig jit = sigmoid_cfg();
        jit.moe_input_jitter_eps = 0.2;
        run_cp_case({"sigmoid router jitter, full recompute", jit, tp, sp, DType::kF64, false, full, 1e-11});
      }
    }
  }
}

// Expert parallelism (with TP and SP where the world allows): the world as
// an EP x TP grid (TP fastest, as Megatron orders tp-ep). The EP ranks hold
// different data, as the DP ranks they are, and E / EP experts each; every
// rank also builds the serial model on its own data. Forward is the serial
// model's token for token, so the losses and every non-expert gradient
// equal the serial ones on the rank's data; an expert's gradient sums the
// tokens every EP rank routed to it, so it equals the serial gradients
// summed over the EP group. The scratch arena peaks exactly at the plan, and
// the all-to-all bytes the EP group sent add up to EP times the planned
// per-rank figure (exact for the group whatever the routing).
// ETP 1 (--expert-tensor-parallel-size 1, etp1_ep > 0): each rank holds
// whole experts and routes only its sequence shard; the EP group is etp1_ep
// consecutive ranks of the expert grid (whole TP groups: the world, or the
// TP group itself), which holds each TP group's data tp times over, so an
// expert's gradient is the serial gradients summed over it divided by tp.
struct EpCase {
  const char* name;
  ModelConfig cfg;
  int64_t tp;
  DType dt;
  bool bf16;
  RecomputeGranularity recompute;
  double tol;
  bool skew = false;  // the expert bias (sigmoid router) sends every token to experts 0 and 1
  int64_t etp1_ep = 0;  // ETP 1 with this EP size (0: ETP = TP, EP = world / TP)
  bool moe_act = false;  // with selective recomputation: --recompute-modules core_attn moe_act
};

void run_ep_case(const EpCase& c) {
  auto world = comm::world_communicator();
  const int64_t W = world->size(), wr = world->rank(), tp = c.tp;
  const bool etp1 = c.etp1_ep > 0;
  const int64_t ep = etp1 ? c.etp1_ep : W / tp;
  const int64_t tr = wr % tp, dr = wr / tp;  // TP rank, the data's (dense DP) index
  const int64_t er = etp1 ? wr % ep : dr;     // EP rank
  std::vector<int> tp_members, ep_members;
  for (int64_t i = 0; i < tp; ++i) tp_members.push_back(static_cast<int>(dr * tp + i));
  for (int64_t j = 0; j < ep; ++j)
    ep_members.push_back(static_cast<int>(etp1 ? wr / ep * ep + j : j * tp + tr));
  auto tp_comm = comm::make_group(tp_members, "tp");
  auto ep_comm = comm::make_group(ep_members, "ep");
  ModelConfig cfg = c.cfg;
  cfg.vocab_size = cfg.padded_vocab(tp);
  const int64_t B = 2, T = cfg.seq_length, V = *cfg.vocab_size;
  GPTOptions so;
  so.micro_batch = B, so.dtype = c.dt, so.half_compute = c.bf16;
  so.recompute.granularity = c.recompute;
  if (c.recompute == RecomputeGranularity::kFull) so.recompute.num_layers = 2;
  so.recompute.moe_act = c.moe_act;
  GPTOptions po = so;
  po.tp = tp, po.tp_rank = tr, po.sequence_parallel = tp > 1, po.tp_comm = tp_comm.get();
  po.ep = ep, po.ep_rank = er, po.ep_comm = ep_comm.get();
  if (etp1) po.etp = 1;
  so.moe_capacity_segments = tp;  // token dropping: the TP ranks' sequence shards
  auto serial = GPTModel::create(cfg, so);
  ASSERT_TRUE(serial.is_ok()) << serial.status().message();
  auto par = GPTModel::create(cfg, po);
  ASSERT_TRUE(par.is_ok()) << c.name << ": " << par.status().message();
  GPTModel &S = **serial, &P = **par;
  S.init_parameters(79);
  P.init_parameters(79);
  if (c.skew)
    for (GPTModel* m : {&S, &P})
      for (const auto& [name, b] : m->expert_bias_tensors())
        for (int64_t e = 0; e < 2; ++e) {
          if (c.dt == DType::kF64) b.ptr<double>()[e] = 10;
          else b.ptr<float>()[e] = 10;
        }
  const int64_t El = cfg.num_experts / ep;
  for (size_t i = 0; i < P.specs().size(); ++i) {
    const ParamSpec& ps = P.specs()[i];
    ASSERT_TRUE(ps.expert < 0 || ps.expert / El == er) << c.name << ": " << ps.name << " on EP rank " << er;
    const int j = S.find(ps.name);
    ASSERT_GE(j, 0) << ps.name;
    const GPTModel::SplitGroup sg = P.split_group(ps);
    ASSERT_EQ(sg.size, etp1 && ps.expert >= 0 ? 1 : tp) << ps.name;
    const double e = c.dt == DType::kF64 ? slice_err<double>(ps, sg.size, sg.rank, P.params()[i], S.params()[j])
                                         : slice_err<float>(ps, sg.size, sg.rank, P.params()[i], S.params()[j]);
    ASSERT_EQ(e, 0.0) << c.name << ": initial " << ps.name << " is not the serial slice";
  }
  // Every parameter is held by one EP rank at least: the experts split E / EP ways.
  int64_t experts_here = 0;
  for (const ParamSpec& ps : P.specs()) experts_here += ps.expert >= 0;
  EXPECT_EQ(experts_here, 2 * El * cfg.num_moe_layers()) << c.name;
  std::mt19937 g(static_cast<uint32_t>(11 + dr));  // this TP group's data
  std::vector<int32_t> tok(B * T), lab(B * T);
  for (auto& t : tok) t = static_cast<int32_t>(g() % V);
  for (auto& l : lab) l = static_cast<int32_t>(g() % V);
  lab[3] = -1;
  Tensor tt(tok.data(), {B, T}, DType::kI32), lt(lab.data(), {B, T}, DType::kI32);
  S.zero_grads(), P.zero_grads();
  ep_comm->reset_stats();
  for (int pass = 0; pass < 2; ++pass) {  // two micro-batches accumulate
    const double ls = S.forward(0, tt, lt, 9 + pass, true);
    const double lp = P.forward(0, tt, lt, 9 + pass, true);
    EXPECT_NEAR(lp, ls, c.tol * std::abs(ls)) << c.name << ": loss on EP rank " << er;
    // The router losses as the serial model on this TP group's data (ETP 1:
    // the TP ranks' statistics summed).
    EXPECT_NEAR(P.moe_load_balancing_loss(0), S.moe_load_balancing_loss(0), c.tol * S.moe_load_balancing_loss(0))
        << c.name << ": load-balancing loss";
    EXPECT_NEAR(P.moe_z_loss(0), S.moe_z_loss(0), c.tol * S.moe_z_loss(0)) << c.name << ": z-loss";
    S.backward(0, 0.5);
    P.backward(0, 0.5);
  }
  if (cfg.has_expert_bias()) {  // the bias update from the tokens each expert kept: the serial model's
    S.update_expert_bias(nullptr), P.update_expert_bias(nullptr);
    const auto sb = S.expert_bias_tensors(), pb = P.expert_bias_tensors();
    ASSERT_EQ(sb.size(), pb.size());
    for (size_t i = 0; i < sb.size(); ++i)
      for (int64_t e = 0; e < cfg.num_experts; ++e)
        EXPECT_EQ(c.dt == DType::kF64 ? value<double>(pb[i].second, e) : value<float>(pb[i].second, e),
                  c.dt == DType::kF64 ? value<double>(sb[i].second, e) : value<float>(sb[i].second, e))
            << c.name << ": " << sb[i].first << "[" << e << "]";
  }
  const double sent = static_cast<double>(ep_comm->stats().all_to_all_bytes);
  auto plan = GPTModel::planned_comm(cfg, po);
  ASSERT_TRUE(plan.is_ok());
  const double group_sent = ep_comm->all_reduce_scalar(sent),
               planned = 2.0 * static_cast<double>(ep) * (plan->ep_forward_bytes + plan->ep_backward_bytes);
  P.reduce_tp_replicated_grads();
  if (!cfg.drops_tokens()) {
    EXPECT_EQ(group_sent, planned) << c.name << ": all-to-all bytes over the EP group";
    EXPECT_EQ(P.scratch_arena().high_water(), P.memory_plan().scratch) << c.name << ": scratch plan";
  } else {  // the plan bounds what the kept slots take
    EXPECT_LE(group_sent, planned) << c.name << ": all-to-all bytes over the EP group";
    ModelConfig dropless = cfg;
    dropless.moe_expert_capacity_factor.reset();
    auto all = GPTModel::planned_comm(dropless, po);
    ASSERT_TRUE(all.is_ok());
    if (!c.skew) {  // (the skewed case drops nothing)
      EXPECT_LT(group_sent, 2.0 * static_cast<double>(ep) * (all->ep_forward_bytes + all->ep_backward_bytes))
          << c.name << ": some slots were dropped";
    }
    EXPECT_LE(P.scratch_arena().high_water(), P.memory_plan().scratch) << c.name << ": scratch plan";
  }
  // The serial expert gradients summed over the EP group (every rank, every
  // expert, in order); with ETP 1 each TP group's data counted once.
  for (size_t j = 0; j < S.specs().size(); ++j)
    if (S.specs()[j].expert >= 0) {
      ep_comm->all_reduce(S.grads()[j]);
      if (etp1) kernels::scale_inplace(S.grads()[j], 1.0 / static_cast<double>(tp));
    }
  for (size_t i = 0; i < P.specs().size(); ++i) {
    const ParamSpec& ps = P.specs()[i];
    const int j = S.find(ps.name);
    const GPTModel::SplitGroup sg = P.split_group(ps);
    const double e = c.dt == DType::kF64 ? slice_err<double>(ps, sg.size, sg.rank, P.grads()[i], S.grads()[j])
                                         : slice_err<float>(ps, sg.size, sg.rank, P.grads()[i], S.grads()[j]);
    EXPECT_LT(e, c.tol) << c.name << ": gradient of " << ps.name << " on EP rank " << er << ", TP rank " << tr;
  }
}

TEST(ExpertParallelModel, EqualsSerialModel) {
  auto world = comm::world_communicator();
  if (world->size() < 2) GTEST_SKIP() << "needs EP > 1";
  const auto none = RecomputeGranularity::kNone, full = RecomputeGranularity::kFull;
  ModelConfig moe4 = moe_gpt_cfg();
  moe4.num_experts = 4;
  ModelConfig wide = mixtral_cfg();  // more experts than the top-k on each rank, and fewer
  wide.num_experts = 8, wide.moe_router_topk = 3;
  for (int64_t tp : {int64_t{1}, int64_t{2}}) {
    if (world->size() / tp < 2) continue;
    run_ep_case({"mixtral", mixtral_cfg(), tp, DType::kF64, false, none, 1e-11});
    run_ep_case({"mixtral full recompute", mixtral_cfg(), tp, DType::kF64, false, full, 1e-11});
    run_ep_case({"8 experts top-3", wide, tp, DType::kF64, false, none, 1e-11});
    run_ep_case({"moe_gpt top-1 fp32", moe4, tp, DType::kF32, false, none, 2e-5});
    run_ep_case({"mixtral bf16", mixtral_cfg(), tp, DType::kF32, true, none, 3e-2});
    run_ep_case({"shared expert", shared_cfg(), tp, DType::kF64, false, none, 1e-11});
    run_ep_case({"gated shared expert bf16", shared_gate_cfg(), tp, DType::kF32, true, none, 3e-2});
    run_ep_case({"sigmoid router bf16", sigmoid_cfg(), tp, DType::kF32, true, none, 3e-2});
    // Token dropping (each EP x TP rank routing its own shard with its capacity).
    ModelConfig cap = mixtral_cfg(), cap_pos = wide;
    cap.moe_expert_capacity_factor = 0.6;
    cap_pos.moe_expert_capacity_factor = 0.5, cap_pos.moe_token_drop_policy = "position";
    run_ep_case({"mixtral capacity 0.6", cap, tp, DType::kF64, false, full, 1e-11});
    run_ep_case({"8 experts top-3 capacity 0.5 by position", cap_pos, tp, DType::kF64, false, none, 1e-11});
    // More capacity than the average (factor 2, nothing dropped): a rank's
    // experts may receive more rows than the rank sends; the skewed expert
    // bias sends every token to experts 0 and 1 (EP rank 0's).
    ModelConfig roomy = sigmoid_cfg();
    roomy.moe_expert_capacity_factor = 2.0;
    run_ep_case({"sigmoid router skewed, capacity 2", roomy, tp, DType::kF64, false, none, 1e-11, true});
    // --moe-layer-freq: the dense layer's gradients reduced with the other
    // non-expert ones, the MoE layer's experts over the expert DP group.
    run_ep_case({"dense layer 0, MoE layer 1", freq_cfg(), tp, DType::kF64, false, full, 1e-11});
    run_ep_case({"sigmoid MoE layer 0, dense layer 1 bf16", freq_sigmoid_cfg(), tp, DType::kF32, true, none, 3e-2});
    ModelConfig jit = mixtral_cfg();
    jit.moe_input_jitter_eps = 0.2;
    run_ep_case({"mixtral router jitter", jit, tp, DType::kF64, false, none, 1e-11});
    run_ep_case({"mixtral selective moe_act bf16", mixtral_cfg(), tp, DType::kF32, true,
                 RecomputeGranularity::kSelective, 3e-2, false, 0, true});
  }
}

// --expert-tensor-parallel-size 1 under TP 2 (SP): whole experts, each rank
// routing its own sequence shard, over an EP group of the whole world or of
// the TP group itself.
TEST(ExpertParallelModel, WholeExpertsUnderTensorParallelism) {
  auto world = comm::world_communicator();
  const int64_t W = world->size(), tp = 2;
  if (W < 2) GTEST_SKIP() << "needs TP 2";
  const auto none = RecomputeGranularity::kNone, full = RecomputeGranularity::kFull;
  ModelConfig seq = mixtral_cfg();
  seq.moe_router_load_balancing_type = "seq_aux_loss";
  ModelConfig grouped = sigmoid_cfg();
  grouped.moe_router_num_groups = 2, grouped.moe_router_group_topk = 1;
  ModelConfig jit = sigmoid_cfg();
  jit.moe_input_jitter_eps = 0.2;
  ModelConfig cap = mixtral_cfg();
  cap.moe_expert_capacity_factor = 0.6;
  ModelConfig capp = mixtral_cfg();
  capp.moe_expert_capacity_factor = 0.5, capp.moe_token_drop_policy = "position";
  ModelConfig moe4 = moe_gpt_cfg();
  moe4.num_experts = 4;
  for (int64_t ep : {W, tp}) {
    run_ep_case({"ETP 1 mixtral", mixtral_cfg(), tp, DType::kF64, false, none, 1e-11, false, ep});
    run_ep_case({"ETP 1 mixtral full recompute", mixtral_cfg(), tp, DType::kF64, false, full, 1e-11, false, ep});
    run_ep_case({"ETP 1 shared expert", shared_cfg(), tp, DType::kF64, false, full, 1e-11, false, ep});
    run_ep_case({"ETP 1 gated shared expert", shared_gate_cfg(), tp, DType::kF64, false, none, 1e-11, false, ep});
    run_ep_case({"ETP 1 selective moe_act", mixtral_cfg(), tp, DType::kF64, false, RecomputeGranularity::kSelective,
                 1e-11, false, ep, true});
    run_ep_case({"ETP 1 seq_aux_loss", seq, tp, DType::kF64, false, none, 1e-11, false, ep});
    run_ep_case({"ETP 1 sigmoid groups", grouped, tp, DType::kF64, false, none, 1e-11, false, ep});
    run_ep_case({"ETP 1 sigmoid jitter bf16", jit, tp, DType::kF32, true, none, 3e-2, false, ep});
    run_ep_case({"ETP 1 moe_gpt top-1 fp32", moe4, tp, DType::kF32, false, none, 2e-5, false, ep});
    run_ep_case({"ETP 1 capacity 0.6", cap, tp, DType::kF64, false, full, 1e-11, false, ep});
    run_ep_case({"ETP 1 capacity 0.5 by position", capp, tp, DType::kF64, false, none, 1e-11, false, ep});
    run_ep_case({"ETP 1 dense layer 0, MoE layer 1", freq_cfg(), tp, DType::kF64, false, full, 1e-11, false, ep});
    if (W == tp) break;  // EP = TP is EP = world
  }
}

TEST(ContextParallelModel, RejectsASequenceNotSplitIntoEqualChunks) {
  ModelConfig cfg = gpt_cfg();
  cfg.seq_length = cfg.max_position_embeddings = 12;
  GPTOptions o;
  o.cp = 4, o.cp_rank = 1;  // 12 is not a multiple of 2 x 4
  auto m = GPTModel::planned_bytes(cfg, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--seq-length 12 is not a multiple of 2 x --context-parallel-size 4"),
            std::string::npos)
      << m.status().message();
}

TEST(TensorParallelModel, RejectsIndivisibleSizes) {
  auto world = comm::world_communicator();
  if (world->size() < 2) GTEST_SKIP() << "needs TP > 1";
  ModelConfig cfg = gpt_cfg();
  cfg.num_attention_heads = 2 * world->size() + 1;
  cfg.hidden_size = 8 * cfg.num_attention_heads;
  GPTOptions o;
  o.tp = world->size(), o.tp_rank = world->rank(), o.tp_comm = world.get(), o.sequence_parallel = true;
  cfg.seq_length = cfg.max_position_embeddings = 2 * world->size() + 1;
  auto m = GPTModel::create(cfg, o);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("--num-attention-heads"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("--sequence-parallel"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace mt::model

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return mt::test::run_all_tests_with_mpi("tp_model_test");
}
