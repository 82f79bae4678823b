#include "infer/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/kv_attention.h"
#include "kernels/mla.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace mt::infer {

namespace k = kernels;
using model::ModelConfig;
using model::Normalization;
using model::PositionEmbedding;

// Parameter indices of one layer (-1: absent), as GPTModel names them.
struct Decoder::Layer {
  int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int ln2_w = -1, ln2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
  int q_ln_w = -1, q_ln_b = -1, k_ln_w = -1, k_ln_b = -1;  // --qk-layernorm
  int q_down_w = -1, q_up_w = -1, q_proj_w = -1, kv_down_w = -1, kv_up_w = -1, kv_ln_w = -1, kv_ln_b = -1;  // MLA
  int router_w = -1;                  // --num-experts
  std::vector<int> exp_fc1, exp_fc2;
  int sh_fc1 = -1, sh_fc2 = -1;       // --moe-shared-expert-intermediate-size
  int sh_gate = -1;                   // --moe-shared-expert-gate
  int layer = -1;                     // the global layer (its expert bias)
};

namespace {
// Scratch buffers, carved once: [chunk, ...] each; a call uses the first n rows.
// With --num-experts the MLP's rows are the chunk's k routed slots per token
// (kFc1, kAct, kXp, kY), and the router's buffers are [chunk, E] or [chunk, k].
enum Buf { kIds, kX, kXMid, kLn, kMean, kRstd, kQkv, kCtx, kTmp, kFc1, kAct, kQkHeads, kQkNormed, kQkMean, kQkRstd,
           kLogits, kRIdx, kRProbs, kRScores, kRLse, kPos, kSrc, kCounts, kXp, kY, kSFc1, kSAct, kSOut, kKept,
           kSGate, kSRows, kSGated, kMq, kMkv, kMpe, kMcq, kMcqn, kMckv, kMckvn, kMctx, kNumBufs };
int64_t model_limit(const model::GPTModel& m) {
  const ModelConfig& c = m.config();
  if (c.position_embedding == PositionEmbedding::kLearnedAbsolute) return c.max_position_embeddings;
  return std::max(m.options().seq_length, c.max_position_embeddings);
}
}  // namespace

Result<std::unique_ptr<Decoder>> Decoder::create(const model::GPTModel& m, const DecoderOptions& opt) {
  const ModelConfig& c = m.config();
  const int64_t limit = model_limit(m);
  const int64_t T = opt.max_tokens ? opt.max_tokens : limit;
  if (T <= 0) return Status::invalid(fmt::format("decoder: cache capacity must be positive, got {}", T));
  if (c.position_embedding == PositionEmbedding::kLearnedAbsolute && T > c.max_position_embeddings)
    return Status::invalid(fmt::format("decoder: {} positions requested, but the learned position embedding has only "
                                       "--max-position-embeddings {}", T, c.max_position_embeddings));
  const int64_t chunk = opt.max_chunk > 0 ? std::min(opt.max_chunk, T) : std::min<int64_t>(256, T);
  return std::unique_ptr<Decoder>(new Decoder(m, T, chunk));
}

Decoder::Decoder(const model::GPTModel& m, int64_t max_tokens, int64_t max_chunk)
    : m_(m), T_max_(max_tokens), chunk_(max_chunk) {
  const ModelConfig& c = m.config();
  h_ = c.hidden_size, V_ = m.vocab(), a_ = c.num_attention_heads, g_ = c.query_groups(), d_ = c.head_dim();
  qkv_ = (a_ + 2 * g_) * d_, F_ = c.is_moe() ? c.moe_ffn() : c.ffn(), fc1_ = (c.swiglu ? 2 : 1) * F_;
  Fd_ = c.ffn(), fc1d_ = (c.swiglu ? 2 : 1) * Fd_;  // the dense MLP (--moe-layer-freq's dense layers)
  const int64_t topk = c.is_moe() ? c.moe_router_topk : 1, E = c.is_moe() ? c.num_experts : 0;
  dt_ = m.options().dtype;
  word_ = m.find("embedding.word_embeddings.weight");
  pos_ = m.find("embedding.position_embeddings.weight");
  final_w_ = m.find("decoder.final_layernorm.weight");
  final_b_ = m.find("decoder.final_layernorm.bias");
  out_ = c.untie_embeddings_and_output_weights ? m.find("output_layer.weight") : word_;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    Layer x;
    x.ln1_w = m.find(p + "input_layernorm.weight"), x.ln1_b = m.find(p + "input_layernorm.bias");
    x.qkv_w = m.find(p + "self_attention.linear_qkv.weight"), x.qkv_b = m.find(p + "self_attention.linear_qkv.bias");
    x.proj_w = m.find(p + "self_attention.linear_proj.weight"), x.proj_b = m.find(p + "self_attention.linear_proj.bias");
    x.ln2_w = m.find(p + "pre_mlp_layernorm.weight"), x.ln2_b = m.find(p + "pre_mlp_layernorm.bias");
    x.fc1_w = m.find(p + "mlp.linear_fc1.weight"), x.fc1_b = m.find(p + "mlp.linear_fc1.bias");
    x.fc2_w = m.find(p + "mlp.linear_fc2.weight"), x.fc2_b = m.find(p + "mlp.linear_fc2.bias");
    x.q_ln_w = m.find(p + "self_attention.q_layernorm.weight"), x.q_ln_b = m.find(p + "self_attention.q_layernorm.bias");
    x.k_ln_w = m.find(p + "self_attention.k_layernorm.weight"), x.k_ln_b = m.find(p + "self_attention.k_layernorm.bias");
    x.q_down_w = m.find(p + "self_attention.linear_q_down_proj.weight");
    x.q_up_w = m.find(p + "self_attention.linear_q_up_proj.weight");
    x.q_proj_w = m.find(p + "self_attention.linear_q_proj.weight");
    x.kv_down_w = m.find(p + "self_attention.linear_kv_down_proj.weight");
    x.kv_up_w = m.find(p + "self_attention.linear_kv_up_proj.weight");
    x.kv_ln_w = m.find(p + "self_attention.kv_layernorm.weight"), x.kv_ln_b = m.find(p + "self_attention.kv_layernorm.bias");
    x.router_w = m.find(p + "mlp.router.weight");
    for (int64_t e = 0; x.router_w >= 0 && e < E; ++e) {
      x.exp_fc1.push_back(m.find(fmt::format("{}mlp.experts.local_experts.{}.linear_fc1.weight", p, e)));
      x.exp_fc2.push_back(m.find(fmt::format("{}mlp.experts.local_experts.{}.linear_fc2.weight", p, e)));
    }
    x.layer = static_cast<int>(l);
    x.sh_fc1 = m.find(p + "mlp.shared_experts.linear_fc1.weight");
    x.sh_fc2 = m.find(p + "mlp.shared_experts.linear_fc2.weight");
    x.sh_gate = m.find(p + "mlp.shared_experts.gate_weight");
    layers_.push_back(x);
  }
  SizeTable ct;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    ct.add(fmt::format("k.{}", l), {T_max_, g_, d_}, dt_);
    ct.add(fmt::format("v.{}", l), {T_max_, g_, d_}, dt_);
  }
  if (ct.size() > 0) {
    cache_ = Arena(ct.total_bytes(), "kv-cache");
    auto v = cache_.carve(ct);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      k_cache_.push_back(v[static_cast<size_t>(2 * l)]);
      v_cache_.push_back(v[static_cast<size_t>(2 * l + 1)]);
    }
  }
  const int64_t C = chunk_;
  SizeTable st;
  st.add("ids", {C}, DType::kI32);
  st.add("x", {C, h_}, dt_);
  st.add("x_mid", {C, h_}, dt_);
  st.add("ln", {C, h_}, dt_);
  st.add("mean", {C}, dt_);
  st.add("rstd", {C}, dt_);
  st.add("qkv", {C, qkv_}, dt_);
  st.add("ctx", {C, a_ * d_}, dt_);
  st.add("tmp", {C, h_}, dt_);
  // fc1 and act of a dense layer's MLP or an MoE layer's experts (the
  // larger; Tensor::prefix views them per layer).
  const bool dense = c.has_dense_layers();
  st.add("fc1", {std::max(C * topk * fc1_, dense ? C * fc1d_ : 0)}, dt_);
  st.add("act", {std::max(C * topk * F_, dense ? C * Fd_ : 0)}, dt_);
  const int64_t qk_rows = c.qk_layernorm ? a_ + g_ : 0;  // --qk-layernorm: q and k head rows per token
  st.add("qk_heads", {C * qk_rows, d_}, dt_);
  st.add("qk_normed", {C * qk_rows, d_}, dt_);
  st.add("qk_mean", {C * qk_rows}, dt_);
  st.add("qk_rstd", {C * qk_rows}, dt_);
  st.add("router.logits", {C, E}, dt_);  // --num-experts (empty otherwise)
  st.add("router.idx", {C, E ? topk : 0}, DType::kI32);
  st.add("router.probs", {C, E ? topk : 0}, dt_);
  st.add("router.scores", {C, E}, dt_);
  st.add("router.lse", {E ? C : 0}, dt_);
  st.add("moe.pos", {C, E ? topk : 0}, DType::kI32);
  st.add("moe.src", {E ? C * topk : 0}, DType::kI32);
  st.add("moe.counts", {E}, DType::kI32);
  st.add("moe.xp", {E ? C * topk : 0, h_}, dt_);
  st.add("moe.y", {E ? C * topk : 0, h_}, dt_);
  const int64_t S = c.has_shared_expert() ? c.moe_shared_expert_intermediate_size : 0;  // the shared expert
  st.add("shared.fc1", {C, (c.swiglu ? 2 : 1) * S}, dt_);
  st.add("shared.act", {C, S}, dt_);
  st.add("shared.out", {S ? C : 0, h_}, dt_);
  st.add("moe.kept", {C, c.drops_tokens() ? topk : 0}, DType::kI32);  // --moe-expert-capacity-factor
  // --moe-shared-expert-gate: the gate per row, the rows 0..C-1 (the identity
  // map the row scaling runs through) and the gated output.
  const int64_t G = S && c.moe_shared_expert_gate ? C : 0;
  st.add("shared.gate", {G, 1}, dt_);
  st.add("shared.rows", {G, 1}, DType::kI32);
  st.add("shared.gated", {G, h_}, dt_);
  // --multi-latent-attention: q, kv, the position key, the compressed q and
  // kv (before and after their norms), the value dims of the attention output.
  const bool mla = c.mla();
  const int64_t ql = mla ? c.q_lora_rank.value_or(0) : 0, kl = mla ? c.kv_lora_rank : 0;
  st.add("mla.q", {C, mla ? a_ * d_ : 0}, dt_);
  st.add("mla.kv", {C, mla ? a_ * (c.qk_head_dim + c.v_head_dim) : 0}, dt_);
  st.add("mla.kpe", {C, mla ? c.qk_pos_emb_head_dim : 0}, dt_);
  st.add("mla.cq", {C, ql}, dt_);
  st.add("mla.cq_normed", {C, ql}, dt_);
  st.add("mla.ckv", {C, kl}, dt_);
  st.add("mla.ckv_normed", {C, kl}, dt_);
  st.add("mla.ctx_v", {C, mla ? a_ * c.v_head_dim : 0}, dt_);
  scratch_ = Arena(st.total_bytes(), "decoder-scratch");
  buf_ = scratch_.carve(st);
  if (G) {
    std::vector<int32_t> iota(static_cast<size_t>(G));
    for (int64_t i = 0; i < G; ++i) iota[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    copy_tensor(Tensor(iota.data(), {G, 1}, DType::kI32), buf_[kSRows]);
  }
  if (c.applies_rope()) {
    SizeTable t;
    t.add("rope.cos", {T_max_, c.rotary_dim() / 2}, dt_);
    t.add("rope.sin", {T_max_, c.rotary_dim() / 2}, dt_);
    tables_ = Arena(t.total_bytes(), "decoder-rope");
    auto v = tables_.carve(t);
    rope_cos_ = v[0], rope_sin_ = v[1];
    k::rope_table(model::rope_spec(c), T_max_, rope_cos_, rope_sin_);  // row t depends on t only
  }
}

Decoder::~Decoder() = default;

void Decoder::truncate(int64_t n) {
  MT_CHECK(n >= 0 && n <= length_, fmt::format("Decoder::truncate({}) beyond the cached length {}", n, length_));
  length_ = n;
}

// y [n,out] = x W^T + b, fp32/fp64 parameters (W: rows [r0, r1), all for r1 < 0).
void Decoder::linear(const Tensor& x, int w, int b, const Tensor& y, int64_t r0, int64_t r1) const {
  const Tensor& Wall = m_.params()[static_cast<size_t>(w)];
  const Tensor W = r1 < 0 ? Wall : Wall.slice(r0, r1);
  const int64_t out = W.dim(0), in = W.dim(1), n = x.numel() / in;
  k::gemm(false, true, n, out, in, 1.0f, x, W, 0.0f, y);
  if (b >= 0) k::bias_add(y, m_.params()[static_cast<size_t>(b)]);
}

void Decoder::norm(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd) const {
  const auto& P = m_.params();
  const Tensor weight = m_.norm_weight(w);
  if (m_.config().normalization == Normalization::kLayerNorm)
    k::layernorm_forward(x, weight, b >= 0 ? P[static_cast<size_t>(b)] : Tensor(), m_.config().norm_epsilon, y, mean, rstd);
  else
    k::rmsnorm_forward(x, weight, m_.config().norm_epsilon, y, rstd);
}

// --qk-layernorm on the n rows of qkv: q heads and k heads normalised with
// their own weights (GPTModel::qk_norm_fwd, without keeping anything).
void Decoder::qk_norm(const Layer& p, const k::QkvLayout& L, int64_t n) {
  const int64_t nq = n * a_, nk = n * g_;
  const bool ln = m_.config().normalization == Normalization::kLayerNorm;
  const Tensor qkv = buf_[kQkv].slice(0, n), heads = buf_[kQkHeads].slice(0, nq + nk),
               normed = buf_[kQkNormed].slice(0, nq + nk), mean = buf_[kQkMean], rstd = buf_[kQkRstd];
  k::qk_heads_gather(qkv, L, heads);
  norm(heads.slice(0, nq), p.q_ln_w, p.q_ln_b, normed.slice(0, nq), ln ? mean.slice(0, nq) : Tensor(), rstd.slice(0, nq));
  norm(heads.slice(nq, nq + nk), p.k_ln_w, p.k_ln_b, normed.slice(nq, nq + nk), ln ? mean.slice(0, nk) : Tensor(),
       rstd.slice(0, nk));
  k::qk_heads_scatter(normed, L, qkv);
}

// GPTModel::mla_fwd on n rows (one TP rank, no SP), without the RoPE.
void Decoder::mla_qkv(const Layer& p, const Tensor& ln, int64_t n) {
  const ModelConfig& c = m_.config();
  const int64_t kl = c.kv_lora_rank, dr = c.qk_pos_emb_head_dim;
  const bool qn = c.qk_layernorm, layernorm = c.normalization == Normalization::kLayerNorm;
  auto rows = [&](Buf b) { return buf_[b].slice(0, n); };
  const Tensor q = rows(kMq), kv = rows(kMkv), kpe = rows(kMpe), mean = layernorm ? rows(kMean) : Tensor(),
               rstd = rows(kRstd);
  if (p.q_down_w >= 0) {
    const Tensor cq = rows(kMcq), cqn = rows(kMcqn);
    linear(ln, p.q_down_w, -1, cq);
    if (qn) norm(cq, p.q_ln_w, p.q_ln_b, cqn, mean, rstd);
    linear(qn ? cqn : cq, p.q_up_w, -1, q);
  } else {
    linear(ln, p.q_proj_w, -1, q);
  }
  const Tensor ckv = rows(kMckv), ckvn = rows(kMckvn);
  linear(ln, p.kv_down_w, -1, ckv, 0, kl);
  linear(ln, p.kv_down_w, -1, kpe, kl, kl + dr);
  if (qn) norm(ckv, p.kv_ln_w, p.kv_ln_b, ckvn, mean, rstd);
  linear(qn ? ckvn : ckv, p.kv_up_w, -1, kv);
  k::mla_pack(q, kv, kpe, k::MlaDims{n, a_, c.qk_head_dim, dr, c.v_head_dim}, rows(kQkv));
}

// The MoE MLP of GPTModel::moe_forward on the n rows of ln, into out [n, h].
// With --moe-expert-capacity-factor the capacity counts these n rows (as
// Megatron's inference router, which drops among the tokens of its step): a
// prompt longer than the decoder's chunk drops per chunk, so its logits
// depend on the chunk size. --moe-input-jitter-eps is not applied here: a
// generation is reproducible (Megatron's router would jitter at inference
// too, as it does in every forward).
void Decoder::moe(const Layer& p, const Tensor& ln, int64_t n, const Tensor& out) {
  const ModelConfig& c = m_.config();
  const int64_t E = c.num_experts, K = c.moe_router_topk;
  auto rows = [&](Buf b, int64_t r) { return buf_[b].slice(0, r); };
  const Tensor logits = rows(kLogits, n), idx = rows(kRIdx, n), probs = rows(kRProbs, n), pos = rows(kPos, n),
               src = rows(kSrc, n * K), xp = rows(kXp, n * K), fc1 = buf_[kFc1].prefix({n * K, fc1_}),
               act = buf_[kAct].prefix({n * K, F_}), y = rows(kY, n * K);
  linear(ln, p.router_w, -1, logits);
  k::moe_route(logits, model::moe_router(c), m_.expert_bias(p.layer), idx, probs,
               rows(kRScores, n), rows(kRLse, n));
  // Token dropping as Megatron's inference: over the tokens of this call.
  k::moe_dispatch_kept(idx, probs, 1, c.drops_tokens() ? c.moe_capacity(n) : 0,
                       c.moe_token_drop_policy == "position", c.drops_tokens() ? rows(kKept, n) : Tensor(), buf_[kCounts],
                       src, pos);
  std::vector<int32_t> cnt(static_cast<size_t>(E));
  copy_tensor(buf_[kCounts], Tensor(cnt.data(), {E}, DType::kI32));
  std::vector<int64_t> off(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[static_cast<size_t>(e)];
  const int64_t M = off[static_cast<size_t>(E)];  // the kept slots (n K without dropping)
  k::moe_permute(ln, src.slice(0, M), xp.slice(0, M));
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) linear(xp.slice(off[e], off[e + 1]), p.exp_fc1[e], -1, fc1.slice(off[e], off[e + 1]));
  if (c.swiglu) k::swiglu_forward(fc1.slice(0, M), act.slice(0, M));
  else k::gelu_forward(model::mlp_activation(c), fc1.slice(0, M), act.slice(0, M));
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) linear(act.slice(off[e], off[e + 1]), p.exp_fc2[e], -1, y.slice(off[e], off[e + 1]));
  k::moe_unpermute(y, pos, probs, out);
  if (p.sh_fc1 >= 0) {  // the shared expert, on every row
    const Tensor sf = rows(kSFc1, n), sa = rows(kSAct, n), so = rows(kSOut, n);
    linear(ln, p.sh_fc1, -1, sf);
    if (c.swiglu) k::swiglu_forward(sf, sa);
    else k::gelu_forward(model::mlp_activation(c), sf, sa);
    linear(sa, p.sh_fc2, -1, so);
    if (p.sh_gate >= 0) {  // times sigmoid(ln . g) per row
      const Tensor g = rows(kSGate, n), sg = rows(kSGated, n);
      linear(ln, p.sh_gate, -1, g);
      k::moe_sigmoid(g, g);
      k::moe_unpermute(so, rows(kSRows, n), g, sg);
      k::add_inplace(out, sg);
    } else {
      k::add_inplace(out, so);
    }
  }
}

// The layer math of GPTModel::layer_forward with training = false, on n rows
// of one sequence at positions [length_, length_ + n), attention against the
// cache. logits_rows: [n, V] (all), [1, V] (last_only) or undefined.
void Decoder::run_chunk(const int32_t* tokens, int64_t n, const Tensor& logits_rows, bool last_only) {
  const ModelConfig& c = m_.config();
  const auto& P = m_.params();
  const int64_t p0 = length_;
  const bool post = c.apply_residual_connection_post_layernorm;
  auto rows = [&](Buf b) { return buf_[b].slice(0, n); };
  Tensor ids = rows(kIds), x = rows(kX), xm = rows(kXMid), ln = rows(kLn), mean = rows(kMean), rstd = rows(kRstd),
         qkv = rows(kQkv), ctx = rows(kCtx), tmp = rows(kTmp);
  if (c.normalization != Normalization::kLayerNorm) mean = Tensor();
  std::memcpy(ids.data(), tokens, static_cast<size_t>(n) * sizeof(int32_t));
  k::embedding_forward(ids, P[static_cast<size_t>(word_)], 0, x);
  if (pos_ >= 0) k::position_add_forward(P[static_cast<size_t>(pos_)].slice(p0, p0 + n), 1, x);
  const k::QkvLayout L{n, 1, a_, g_, d_};
  const double scale = c.softmax_scale();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& p = layers_[l];
    norm(x, p.ln1_w, p.ln1_b, ln, mean, rstd);
    if (c.mla()) {
      mla_qkv(p, ln, n);
    } else {
      linear(ln, p.qkv_w, p.qkv_b, qkv);
      if (c.qk_layernorm) qk_norm(p, L, n);
    }
    if (c.applies_rope())
      k::rope_forward(qkv, L, rope_cos_.slice(p0, p0 + n), rope_sin_.slice(p0, p0 + n), c.rotary_dim(),
                      c.rope_pairs_adjacent());
    k::kv_cache_append(qkv, L, p0, k_cache_[l], v_cache_[l]);
    k::kv_attention(qkv, L, k_cache_[l], v_cache_[l], p0, scale, ctx);
    if (c.mla()) {  // linear_proj reads each head's value dims
      const Tensor ctx_v = rows(kMctx);
      k::mla_ctx(ctx, ctx_v, k::MlaDims{n, a_, c.qk_head_dim, c.qk_pos_emb_head_dim, c.v_head_dim}, false);
      linear(ctx_v, p.proj_w, p.proj_b, tmp);
    } else {
      linear(ctx, p.proj_w, p.proj_b, tmp);
    }
    k::add(post ? ln : x, tmp, xm);
    norm(xm, p.ln2_w, p.ln2_b, ln, mean, rstd);
    if (p.router_w >= 0) {
      moe(p, ln, n, tmp);
    } else {
      const Tensor fc1 = buf_[kFc1].prefix({n, fc1d_}), act = buf_[kAct].prefix({n, Fd_});
      linear(ln, p.fc1_w, p.fc1_b, fc1);
      if (c.swiglu) k::swiglu_forward(fc1, act);
      else k::gelu_forward(model::mlp_activation(c), fc1, act);
      linear(act, p.fc2_w, p.fc2_b, tmp);
    }
    k::add(post ? ln : xm, tmp, x);
  }
  length_ += n;
  if (!logits_rows.defined()) return;
  const int64_t r0 = last_only ? n - 1 : 0, r = n - r0;
  Tensor xr = x.slice(r0, n), lr = ln.slice(0, r), mr = mean.defined() ? mean.slice(0, r) : Tensor(),
         sr = rstd.slice(0, r);
  norm(xr, final_w_, final_b_, lr, mr, sr);
  k::gemm(false, true, r, V_, h_, 1.0f, lr, P[static_cast<size_t>(out_)], 0.0f, logits_rows);
}

Status Decoder::append(std::span<const int32_t> tokens, const Tensor& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return logits.defined() ? Status::invalid("decoder: no tokens to append, so no logits") : Status::ok();
  if (length_ + n > T_max_)
    return Status::invalid(fmt::format("decoder: {} cached + {} new tokens exceed the cache capacity of {} positions",
                                       length_, n, T_max_));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= V_)
      return Status::invalid(fmt::format("decoder: token id {} at index {} is outside the vocabulary [0, {})",
                                         tokens[static_cast<size_t>(i)], i, V_));
  bool last_only = false;
  if (logits.defined()) {
    if (logits.dtype() != dt_)
      return Status::invalid(fmt::format("decoder: logits must be {}", dtype_name(dt_)));
    if (logits.numel() == V_) last_only = true;
    else if (logits.numel() != n * V_)
      return Status::invalid(fmt::format("decoder: logits must have {} ([V]) or {} ([n, V]) elements, not {}", V_,
                                         n * V_, logits.numel()));
  }
  Tensor all = logits.defined() ? logits.view({last_only ? 1 : n, V_}) : Tensor();
  for (int64_t c0 = 0; c0 < n; c0 += chunk_) {
    const int64_t cn = std::min(chunk_, n - c0);
    const bool last_chunk = c0 + cn == n;
    Tensor rows;
    if (all.defined()) {
      if (!last_only) rows = all.slice(c0, c0 + cn);
      else if (last_chunk) rows = all;
    }
    run_chunk(tokens.data() + c0, cn, rows, last_only);
  }
  return Status::ok();
}

}  // namespace mt::infer
