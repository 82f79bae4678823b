#include "plan/memory.h"

#include <algorithm>
#include <cmath>

#include "model/config.h"

namespace mt::plan {

BytesPerParam bytes_per_param(const PrecisionConfig& p, int optimizer_states) {
  const double st = 4.0 * optimizer_states;  // fp32 state tensors: Adam's m and v, SGD's momentum buffer
  if (p.bf16) return {2, 4, 4 + st};  // bf16 weight, fp32 main grad | fp32 master, state
  if (p.fp16) return {2, 2, 8 + st};  // fp16 weight and grad | fp32 master, fp32 grad, state
  return {4, 4, st};                  // fp32 weight and grad | state
}

MegatronMemoryEstimate megatron_theoretical_memory(const JobConfig& job, const MemoryLayout& l) {
  const auto& m = job.model;
  const auto& par = job.parallel;
  const double h = m.hidden_size, L = m.num_layers, F = m.ffn();
  const double phi = m.swiglu ? 3 : 2, V = l.padded_vocab;
  const double nu = m.normalization == model::Normalization::kLayerNorm ? 2 : 1;
  const double t = par.tp, p = par.pp, s = m.seq_length, b = job.batch.micro_batch_size;
  MegatronMemoryEstimate e;

  // Weights and optimizer (§12.3).
  const double p_att = static_cast<double>(model::megatron_attention_params(m));  // 2 h d (a + g), or MLA's
  const double p_norm = 2 * nu * h;
  // With --num-experts, Megatron's num_moe_layers (--moe-layer-freq) have
  // the shared expert, the router and the routed experts, the others the
  // dense MLP.
  const double Lm = static_cast<double>(m.num_moe_layers()), Ld = L - Lm;
  double routed = 0, router = 0;
  double mlp_tp = phi * h * F * Ld;  // over the model's layers
  if (m.is_moe()) {
    mlp_tp += phi * h * static_cast<double>(m.moe_shared_expert_intermediate_size) * Lm;  // the shared expert (0: none)
    routed = phi * h * m.moe_ffn() * m.num_experts;
    router = h * m.num_experts + (m.has_shared_expert() && m.moe_shared_expert_gate ? h : 0);  // + the shared gate
  }
  const double embedding = h * V;
  // --mtp-num-layers: Megatron's most loaded shard also holds the whole MTP
  // block, its layers dense or MoE by the last decoder layer (their norms
  // and eh_proj not counted), whatever the pipeline size.
  const double Dm = m.is_moe_layer(m.num_layers - 1) ? static_cast<double>(m.mtp_layers()) : 0.0;
  const double Dd = static_cast<double>(m.mtp_layers()) - Dm;
  const double mtp_tp = Dd * (p_att + phi * h * F) +
                        Dm * (p_att + phi * h * static_cast<double>(m.moe_shared_expert_intermediate_size));
  double x_tp = ((L * p_att + mlp_tp) / p + mtp_tp + embedding) / t;
  if (m.untie_embeddings_and_output_weights && par.pp == 1) x_tp += embedding / t;
  const double x_rep = (L * p_norm + Lm * router + nu * h) / p + Dd * p_norm + Dm * (p_norm + router);
  const double x_exp = routed * (Lm / p + Dm) / static_cast<double>(l.etp * par.ep);
  auto B = [&](double x) { return par.use_distributed_optimizer ? 6 + 12 / x : 18; };
  e.params_on_most_loaded_shard = x_tp + x_rep + x_exp;
  e.weight_and_optimizer_bytes = (x_tp + x_rep) * B(static_cast<double>(l.dp)) +
                                 x_exp * B(static_cast<double>(l.edp));

  // Activations (§12.5 / §12.6).
  const auto& r = job.recompute;
  e.sp_formula = par.sequence_parallel && r.selective();
  const double sbh = s * b * h;
  double act;
  if (e.sp_formula) act = L * sbh * (18 + 4 * F / h);  // Megatron's: the dense MLP's F on every layer
  else act = L * sbh * (10 + 24 / t);
  act += 8 * s * b * p + sbh * p;
  if (l.vpp > 1) {
    double factor = 1 + (p - 1) / (p * l.vpp);
    act *= factor;
    e.printed_in_flight = static_cast<int64_t>(std::ceil(p * factor));
  } else if (par.pp > 1) {
    act *= std::min(1.0, static_cast<double>(l.num_microbatches) / p);
  }
  if (par.pp == 1) {
    if (e.sp_formula) act += 4 * sbh * (1 + V / h);
    else act += 2 * (s * b * V / t + sbh);
  }
  if (e.sp_formula) act /= t;
  else act *= 1.05;
  e.activation_bytes = act;
  return e;
}

namespace {

struct Shapes {
  double e, mask, tok, sp, h, t, heads_rank, kv_rank, d, gate, F, V;
};

Shapes shapes(const JobConfig& job, const MemoryLayout& l) {
  const auto& m = job.model;
  const auto& par = job.parallel;
  Shapes s;
  s.e = (job.precision.bf16 || job.precision.fp16) ? 2 : 4;
  s.mask = m.hidden_dropout > 0 ? 1 : 0;
  s.tok = static_cast<double>(m.seq_length) / par.cp * job.batch.micro_batch_size;
  s.sp = par.sequence_parallel ? par.tp : 1;
  s.h = m.hidden_size;
  s.t = par.tp;
  s.heads_rank = static_cast<double>(m.num_attention_heads) / par.tp;
  const int64_t g = m.query_groups();
  s.kv_rank = g >= par.tp ? static_cast<double>(g) / par.tp : 1;  // KV heads replicated when g < TP
  s.d = m.head_dim();
  s.gate = m.swiglu ? 2 : 1;
  s.F = m.ffn();
  s.V = l.padded_vocab;
  return s;
}

}  // namespace

double layer_activation_bytes(const JobConfig& job, const MemoryLayout& l, bool moe_layer) {
  const auto& m = job.model;
  const Shapes s = shapes(job, l);
  const double hs = s.tok * s.h / s.sp;  // a hidden-sized tensor, sequence-sharded under SP
  double bytes = 0;
  bytes += 4 * s.e * hs;                                  // ln1 in/out, ln2 in/out
  // Q, K, V (MLA with --recompute-modules mla_up_proj: its position key instead)
  if (m.mla() && job.recompute.recomputes("mla_up_proj")) bytes += s.e * s.tok * static_cast<double>(m.qk_pos_emb_head_dim);
  else bytes += s.e * s.tok * (s.heads_rank + 2 * s.kv_rank) * s.d;
  if (m.qk_layernorm && !m.mla()) bytes += s.e * s.tok * (s.heads_rank + s.kv_rank) * s.d;  // Q, K before their norms
  if (m.mla()) {
    // The up projections' inputs (gathered under SP), and with --qk-layernorm
    // the norms' inputs (this rank's rows). The attention output is kept at
    // the q/k width d, its value dims first.
    const double c = static_cast<double>(m.q_lora_rank.value_or(0) + m.kv_lora_rank);
    bytes += s.e * s.tok * c + (m.qk_layernorm ? s.e * s.tok * c / s.sp : 0);
  }
  bytes += s.e * s.tok * s.heads_rank * s.d;              // attention output (proj input)
  bytes += 4 * s.tok * s.heads_rank;                      // softmax log-sum-exp (fp32)
  bytes += 2 * s.mask * hs;                               // two hidden-dropout masks
  if (!m.is_moe() || !moe_layer) {
    bytes += s.e * s.tok * (s.gate + 1) * s.F / s.t;      // fc1 output, activation output
  } else {
    // ETP 1 under TP: each rank routes only its sequence shard (one routed
    // shard); otherwise every TP rank routes the gathered sequence.
    const bool local = l.etp == 1 && job.parallel.tp > 1;
    const double shards = local ? 1.0 : s.sp;
    double routed = s.tok / (local ? s.sp : 1.0) * m.moe_router_topk;  // tokens this rank's experts see, on average
    if (m.drops_tokens())  // --moe-expert-capacity-factor: at most E x capacity per routed shard
      routed = std::min(routed, shards * static_cast<double>(m.num_experts) *
                                    static_cast<double>(m.moe_capacity(static_cast<int64_t>(s.tok / s.sp))));
    const double etp = l.etp;
    bytes += 4 * s.tok * m.num_experts;                   // router probabilities (fp32)
    bytes += s.e * routed * s.h;                          // dispatched expert input
    // fc1's output and the activation's (not kept with --recompute-modules moe_act)
    bytes += s.e * routed * (s.gate + (job.recompute.recomputes("moe_act") ? 0 : 1)) * m.moe_ffn() / etp;
    bytes += s.e * s.tok * (s.gate + 1) * static_cast<double>(m.moe_shared_expert_intermediate_size) / s.t;  // shared
  }
  return bytes;
}

StageMemory stage_memory(const JobConfig& job, const MemoryLayout& l, const StageInputs& in) {
  const auto& m = job.model;
  const auto& par = job.parallel;
  const Shapes s = shapes(job, l);
  StageMemory out;
  out.pp_rank = in.pp_rank;
  out.chunk_layers = in.chunk_layers;
  out.in_flight = in.in_flight;
  out.reserve_bytes = in.reserve_bytes;

  // Parameters on one rank of this stage.
  const double h = s.h, t = s.t, d = s.d, F = s.F, gate = s.gate;
  const bool bias = m.add_bias_linear;
  const double qkv_out = (s.heads_rank + 2 * s.kv_rank) * d;
  const double qk_norms = m.qk_layernorm ? 2.0 * (m.normalization == model::Normalization::kLayerNorm ? 2 : 1) * d : 0;
  double dense_layer = 2.0 * m.norm_params_per_norm() + qk_norms + h * qkv_out + (m.qkv_bias() ? qkv_out : 0) +
                       s.heads_rank * d * h + (bias ? h : 0);
  // A dense layer's MLP, and an MoE layer's router, shared expert (these
  // two with the dense parameters) and this rank's routed experts.
  const double mlp = h * gate * F / t + (bias ? gate * F / t : 0) + F / t * h + (bias ? h : 0);
  double moe_dense = 0, expert_layer = 0;
  if (m.is_moe()) {
    const double Fe = m.moe_ffn(), etp = l.etp, local_experts = static_cast<double>(m.num_experts) / par.ep;
    moe_dense += h * m.num_experts;  // router, replicated
    if (m.has_shared_expert() && m.moe_shared_expert_gate) moe_dense += h;  // the shared expert's gate, replicated
    const double S = static_cast<double>(m.moe_shared_expert_intermediate_size);
    moe_dense += (h * gate * S + S * h) / t;  // the shared expert, split over TP
    expert_layer = local_experts * ((h * gate * Fe + Fe * h) / etp + (bias ? gate * Fe / etp + h : 0));
  }
  // This stage's layers, and which are MoE (--moe-layer-freq).
  std::vector<std::vector<bool>> chunk_moe;
  int64_t layers = 0, moe_layers = 0;
  MT_CHECK(in.chunk_first.empty() || in.chunk_first.size() == in.chunk_layers.size(),
           "stage_memory: chunk_first must give every chunk's first layer, or none");
  for (size_t c = 0; c < in.chunk_layers.size(); ++c) {
    int64_t first = c < in.chunk_first.size() ? in.chunk_first[c] : 0;
    if (in.chunk_first.empty())
      for (size_t j = 0; j < c; ++j) first += in.chunk_layers[j];
    chunk_moe.emplace_back();
    for (int64_t i = 0; i < in.chunk_layers[c]; ++i) {
      chunk_moe.back().push_back(m.is_moe_layer(first + i));
      moe_layers += chunk_moe.back().back() ? 1 : 0;
    }
    layers += in.chunk_layers[c];
  }
  // --mtp-num-layers: the last stage also holds the MTP layers (the last
  // decoder layer's kind), each with enorm, hnorm, final norm and eh_proj
  // (2h x h over TP).
  // (--mtp-use-repeated-layer: one layer's parameters, D depths' activations.)
  const int64_t D = in.last_stage ? m.mtp_layers() : 0, Dp = in.last_stage ? m.mtp_built_layers() : 0;
  const bool mtp_moe = m.is_moe_layer(m.num_layers - 1);
  layers += Dp, moe_layers += mtp_moe ? Dp : 0;
  const int64_t dense_layers = layers - moe_layers;
  out.dense_params = layers * dense_layer + static_cast<double>(dense_layers) * mlp + static_cast<double>(moe_layers) * moe_dense;
  out.expert_params = static_cast<double>(moe_layers) * expert_layer;
  const double vocab_shard = s.V * h / t;
  const double mtp_extra = static_cast<double>(Dp) * (3.0 * m.norm_params_per_norm() + 2 * h * h / t);
  out.dense_params += mtp_extra;
  {
    out.stage_params = static_cast<double>(moe_layers) * static_cast<double>(model::layer_params(m, true).total()) +
                       static_cast<double>(dense_layers) * static_cast<double>(model::layer_params(m, false).total());
    if (in.first_stage)
      out.stage_params += s.V * h + (m.position_embedding == model::PositionEmbedding::kLearnedAbsolute
                                         ? static_cast<double>(m.max_position_embeddings) * h : 0);
    if (in.last_stage)
      out.stage_params += m.norm_params_per_norm() + (m.untie_embeddings_and_output_weights || par.pp > 1 ? s.V * h : 0) +
                          static_cast<double>(Dp) * (3.0 * m.norm_params_per_norm() + 2 * h * h) +
                          (D && m.untie_embeddings_and_output_weights && par.pp > 1 ? s.V * h : 0);
  }
  if (in.first_stage) {
    out.dense_params += vocab_shard;
    if (m.position_embedding == model::PositionEmbedding::kLearnedAbsolute)
      out.dense_params += static_cast<double>(m.max_position_embeddings) * h;
  }
  if (in.last_stage) {
    out.dense_params += m.norm_params_per_norm();
    if (m.untie_embeddings_and_output_weights || par.pp > 1) out.dense_params += vocab_shard;
    // The MTP layers embed: a copy of the word embedding beside the untied output layer.
    if (D && m.untie_embeddings_and_output_weights && par.pp > 1) out.dense_params += vocab_shard;
  }
  const BytesPerParam bpp = bytes_per_param(job.precision, job.optimizer.state_tensors());
  const double all = out.dense_params + out.expert_params;
  out.param_bytes = all * bpp.params;
  out.grad_bytes = all * bpp.grads;
  const double dense_shard = par.use_distributed_optimizer ? static_cast<double>(l.dp) * par.cp : 1;
  const double expert_shard = par.use_distributed_optimizer ? static_cast<double>(l.edp) : 1;
  out.optimizer_bytes = bpp.optimizer * (out.dense_params / dense_shard + out.expert_params / expert_shard);

  // Activations of one micro-batch through each chunk.
  const double hs = s.tok * h / s.sp;
  const double moe_layer = layer_activation_bytes(job, l, true), dense_layer_act = layer_activation_bytes(job, l, false);
  double saved_input = s.e * hs;  // what full recomputation keeps per recomputed layer/group
  if (job.recompute.distribute_saved_activations && !par.sequence_parallel) saved_input /= t;
  const auto& rc = job.recompute;
  double recompute_transient = 0;
  double worst_chunk = 0;
  for (size_t c = 0; c < in.chunk_layers.size(); ++c) {
    const int64_t lc = in.chunk_layers[c];
    // Layer i of the chunk keeps everything (an MoE or a dense layer's).
    auto full_layer = [&](int64_t i) { return chunk_moe[c][static_cast<size_t>(i)] ? moe_layer : dense_layer_act; };
    auto full_layers = [&](int64_t b, int64_t e) {
      double x = 0;
      for (int64_t i = b; i < e; ++i) x += full_layer(i);
      return x;
    };
    double a = 0;
    if (rc.full() && lc > 0) {
      const int64_t n = std::max<int64_t>(1, rc.num_layers.value_or(1));
      if (rc.method == "block") {
        const int64_t k = std::min(n, lc);
        a = k * saved_input + full_layers(k, lc);
        for (int64_t i = 0; i < k; ++i) recompute_transient = std::max(recompute_transient, full_layer(i));
      } else {  // uniform
        const int64_t groups = (lc + n - 1) / n;
        a = groups * saved_input;
        for (int64_t b = 0; b < lc; b += n)
          recompute_transient = std::max(recompute_transient, full_layers(b, std::min(lc, b + n)));
      }
    } else {
      a = full_layers(0, lc);
    }
    if (in.first_stage && c == 0) a += 8 * s.tok + s.mask * hs;  // token ids, embedding dropout mask
    if (in.last_stage && c + 1 == in.chunk_layers.size()) {
      a += 2 * s.e * hs + 4 * s.tok * s.V / t + 12 * s.tok;  // final-norm in, output in, fp32 logits, labels+mask
      // Each MTP depth keeps its layer's activations (never recomputed),
      // its embedding, eh_proj's [2h] input, its layer output and final
      // norm output, fp32 logits, and its rolled tokens and labels.
      a += static_cast<double>(D) * ((mtp_moe ? moe_layer : dense_layer_act) + 6 * s.e * hs +
                                     4 * s.tok * s.V / t + 16 * s.tok);
    }
    out.activation_per_microbatch += a;
    worst_chunk = std::max(worst_chunk, a);
  }
  out.activation_bytes = in.in_flight * worst_chunk;
  // Busiest backward step: input and output gradients of a layer, the fc1
  // output gradient, the SP-gathered input, and a recomputed group.
  out.transient_bytes = s.e * s.tok * (2 * h + gate * F / t + (s.sp > 1 ? h : 0)) + recompute_transient;
  return out;
}

}  // namespace mt::plan
