#include "model/gpt.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace mt::model {

namespace k = kernels;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Parameter indices of one transformer layer (-1: absent).
struct GPTModel::LayerIdx {
  int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int ln2_w = -1, ln2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
};

// What backward needs from one layer's forward (N = T*B rows):
//   x_mid [N,h]  residual stream after attention     ln1, ln2 [N,h] norm outputs
//   ln*_mean, ln*_rstd [N]                           qkv [N,(a+2g)d] after rope
//   ctx [N,a d], lse [B,a,T] attention output/log-sum-exp
//   fc1 [N, F or 2F] pre-activation                  act [N,F]
// The layer's input is resid[l], its output resid[l+1].
struct LayerActs {
  Tensor x_mid, ln1, ln1_mean, ln1_rstd, qkv, ctx, lse, ln2, ln2_mean, ln2_rstd, fc1, act;
};

struct GPTModel::Slot {
  Tensor tokens, labels;      // [T*B] int32, [s, b] order
  std::vector<Tensor> resid;  // L+1 x [N,h]
  std::vector<LayerActs> layers;
  Tensor lnf, lnf_mean, lnf_rstd, logits, mx, se, tl, loss;  // logits [N,V]; rest [N]
  uint64_t dropout_step = 0;
  bool training = false, ready = false;
  double count = 0;  // labels counted in the loss
};

Result<std::unique_ptr<GPTModel>> GPTModel::create(const ModelConfig& cfg, const GPTOptions& opt) {
  std::vector<std::string> errs;
  if (!cfg.has_architecture()) errs.push_back("--num-layers, --hidden-size and --num-attention-heads are required");
  if (!cfg.vocab_size) errs.push_back("the vocabulary size is unknown: give --vocab-size or --vocab-file");
  const int64_t T = opt.seq_length ? opt.seq_length : cfg.seq_length;
  if (T <= 0) errs.push_back("--seq-length is required");
  if (cfg.has_architecture()) {
    if (cfg.num_attention_heads % cfg.query_groups() != 0)
      errs.push_back(fmt::format("--num-attention-heads {} is not a multiple of --num-query-groups {}",
                                 cfg.num_attention_heads, cfg.query_groups()));
    if (cfg.head_dim() > k::kAttnMaxHeadDim)
      errs.push_back(fmt::format("head dim {} exceeds the attention kernel's {}", cfg.head_dim(), k::kAttnMaxHeadDim));
    if (cfg.position_embedding == PositionEmbedding::kRope && cfg.head_dim() % 2)
      errs.push_back("--position-embedding-type rope needs an even head dimension");
    if (cfg.position_embedding == PositionEmbedding::kLearnedAbsolute && cfg.max_position_embeddings < T)
      errs.push_back(fmt::format("--max-position-embeddings {} is below the sequence length {}",
                                 cfg.max_position_embeddings, T));
    if (cfg.is_moe()) errs.push_back("--num-experts: mixture of experts is not implemented in the model yet");
  }
  if (opt.tp != 1) errs.push_back("tensor parallelism is not implemented in the model yet (--tensor-model-parallel-size 1)");
  if (opt.micro_batch <= 0) errs.push_back("--micro-batch-size must be positive");
  if (opt.dtype != DType::kF32 && opt.dtype != DType::kF64) errs.push_back("model dtype must be fp32 or fp64");
  if (opt.bf16_compute && opt.dtype != DType::kF32) errs.push_back("bf16 compute needs fp32 parameters");
  if (cfg.hidden_dropout >= 1 || cfg.attention_dropout >= 1) errs.push_back("dropout must be below 1");
  if (!errs.empty()) {
    std::string m = "invalid model configuration:";
    for (auto& e : errs) m += "\n  - " + e;
    return Status::invalid(m);
  }
  ModelConfig c = cfg;
  GPTOptions o = opt;
  o.seq_length = T;
  return std::unique_ptr<GPTModel>(new GPTModel(c, o));
}

GPTModel::GPTModel(const ModelConfig& cfg, const GPTOptions& opt) : cfg_(cfg), opt_(opt) {
  B_ = opt.micro_batch, T_ = opt.seq_length, N_ = B_ * T_, h_ = cfg.hidden_size, V_ = cfg.padded_vocab(opt.tp);
  qkv_ = (cfg.num_attention_heads + 2 * cfg.query_groups()) * cfg.head_dim();
  F_ = cfg.ffn();
  fc1_ = (cfg.swiglu ? 2 : 1) * F_;
  specs_ = gpt_param_specs(cfg, opt.tp);
  for (size_t i = 0; i < specs_.size(); ++i) {
    index_[specs_[i].name] = static_cast<int>(i);
    param_table_.add(specs_[i].name, specs_[i].local_shape(opt.tp), opt.dtype);
  }
  params_arena_ = Arena(param_table_.total_bytes(), "params");
  grads_arena_ = Arena(param_table_.total_bytes(), "grads");
  params_ = params_arena_.carve(param_table_);
  grads_ = grads_arena_.carve(param_table_);
  word_ = find("embedding.word_embeddings.weight");
  pos_ = find("embedding.position_embeddings.weight");
  final_w_ = find("decoder.final_layernorm.weight");
  final_b_ = find("decoder.final_layernorm.bias");
  out_ = cfg.untie_embeddings_and_output_weights ? find("output_layer.weight") : word_;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    LayerIdx x;
    x.ln1_w = find(p + "input_layernorm.weight"), x.ln1_b = find(p + "input_layernorm.bias");
    x.qkv_w = find(p + "self_attention.linear_qkv.weight"), x.qkv_b = find(p + "self_attention.linear_qkv.bias");
    x.proj_w = find(p + "self_attention.linear_proj.weight"), x.proj_b = find(p + "self_attention.linear_proj.bias");
    x.ln2_w = find(p + "pre_mlp_layernorm.weight"), x.ln2_b = find(p + "pre_mlp_layernorm.bias");
    x.fc1_w = find(p + "mlp.linear_fc1.weight"), x.fc1_b = find(p + "mlp.linear_fc1.bias");
    x.fc2_w = find(p + "mlp.linear_fc2.weight"), x.fc2_b = find(p + "mlp.linear_fc2.bias");
    layers_.push_back(x);
  }
  // bf16 copies of every matrix a GEMM reads.
  lowp_.assign(params_.size(), Tensor());
  if (opt.bf16_compute) {
    SizeTable t;
    std::vector<int> which;
    for (size_t i = 0; i < specs_.size(); ++i)
      if (params_[i].ndim() == 2 && static_cast<int>(i) != pos_) {
        t.add(specs_[i].name, params_[i].shape(), DType::kBF16);
        which.push_back(static_cast<int>(i));
      }
    lowp_arena_ = Arena(t.total_bytes(), "bf16-weights");
    auto v = lowp_arena_.carve(t);
    for (size_t j = 0; j < which.size(); ++j) lowp_[which[j]] = v[j];
  }
  build_activation_table();
  acts_ = Arena(act_table_.total_bytes() * static_cast<size_t>(opt.slots), "activations");
  for (int s = 0; s < opt.slots; ++s) {
    std::vector<Tensor> v = acts_.carve(act_table_);
    Slot sl;
    size_t i = 0;
    sl.tokens = v[i++], sl.labels = v[i++];
    for (int l = 0; l <= cfg.num_layers; ++l) sl.resid.push_back(v[i++]);
    for (int l = 0; l < cfg.num_layers; ++l) {
      LayerActs a;
      for (Tensor* t : {&a.x_mid, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.ctx, &a.lse, &a.ln2, &a.ln2_mean,
                        &a.ln2_rstd, &a.fc1, &a.act})
        *t = v[i++];
      sl.layers.push_back(a);
    }
    for (Tensor* t : {&sl.lnf, &sl.lnf_mean, &sl.lnf_rstd, &sl.logits, &sl.mx, &sl.se, &sl.tl, &sl.loss}) *t = v[i++];
    slots_.push_back(sl);
  }
  // Scratch: the largest simultaneous set of temporaries (backward of a layer
  // or of the output layer), plus bf16 casts of a GEMM's two inputs.
  const int64_t ad = cfg.num_attention_heads * cfg.head_dim();
  const size_t es = dtype_size(opt.dtype);
  // backward(): dloss [N], dlnf, dresid [N,h]; layer_backward(): dtmp, dln [N,h],
  // dact [N,F], dfc1 [N,fc1], dctx [N,ad], dqkv [N,qkv]; each aligned.
  size_t layer_tmp = es * static_cast<size_t>(N_) * (4 * h_ + qkv_ + ad + fc1_ + F_ + 1) + 16 * kArenaAlign;
  size_t casts = opt.bf16_compute ? 2 * static_cast<size_t>(N_) * std::max<int64_t>({V_, fc1_, F_, h_, ad, qkv_}) +
                                        2 * static_cast<size_t>(N_) * std::max<int64_t>({h_, F_, ad})
                                  : 0;
  scratch_ = Arena(layer_tmp + casts + (size_t{1} << 16), "scratch");
  if (cfg.position_embedding == PositionEmbedding::kRope) {
    const int64_t half = cfg.head_dim() / 2;
    SizeTable t;
    t.add("rope.cos", {T_, half}, opt.dtype);
    t.add("rope.sin", {T_, half}, opt.dtype);
    tables_ = Arena(t.total_bytes(), "rope-tables");
    auto v = tables_.carve(t);
    rope_cos_ = v[0], rope_sin_ = v[1];
    k::rope_table(cfg.rotary_base, T_, cfg.head_dim(), rope_cos_, rope_sin_);
  }
}

GPTModel::~GPTModel() = default;

void GPTModel::build_activation_table() {
  const ModelConfig& c = cfg_;
  const DType dt = opt_.dtype;
  const int64_t ad = c.num_attention_heads * c.head_dim();
  SizeTable& t = act_table_;
  t.add("tokens", {N_}, DType::kI32);
  t.add("labels", {N_}, DType::kI32);
  for (int l = 0; l <= c.num_layers; ++l) t.add(fmt::format("resid.{}", l), {N_, h_}, dt);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    t.add(p + "x_mid", {N_, h_}, dt);
    t.add(p + "ln1", {N_, h_}, dt);
    t.add(p + "ln1_mean", {N_}, dt);
    t.add(p + "ln1_rstd", {N_}, dt);
    t.add(p + "qkv", {N_, qkv_}, dt);
    t.add(p + "ctx", {N_, ad}, dt);
    t.add(p + "lse", {B_, c.num_attention_heads, T_}, dt);
    t.add(p + "ln2", {N_, h_}, dt);
    t.add(p + "ln2_mean", {N_}, dt);
    t.add(p + "ln2_rstd", {N_}, dt);
    t.add(p + "fc1", {N_, fc1_}, dt);
    t.add(p + "act", {N_, F_}, dt);
  }
  t.add("final.ln", {N_, h_}, dt);
  t.add("final.mean", {N_}, dt);
  t.add("final.rstd", {N_}, dt);
  t.add("logits", {N_, V_}, dt);
  for (const char* n : {"xent.max", "xent.sumexp", "xent.target", "xent.loss"}) t.add(n, {N_}, dt);
}

int GPTModel::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}
Tensor GPTModel::param(const std::string& name) const {
  int i = find(name);
  MT_CHECK(i >= 0, "no parameter " + name);
  return params_[i];
}
Tensor GPTModel::grad(const std::string& name) const {
  int i = find(name);
  MT_CHECK(i >= 0, "no parameter " + name);
  return grads_[i];
}
Tensor GPTModel::logits(int slot) const { return slots_.at(slot).logits; }
Tensor GPTModel::scratch(Shape shape, DType dt) { return scratch_.alloc(shape, dt); }

void GPTModel::init_parameters(uint64_t seed) {
  const double std0 = cfg_.init_method_std, std_out = std0 / std::sqrt(2.0 * static_cast<double>(cfg_.num_layers));
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    const Tensor& p = params_[i];
    const uint64_t stream = fnv1a(s.name);
    const int64_t n = p.numel();  // TP = 1: local == global, so the flat index is the global one
    for (int64_t e = 0; e < n; ++e) {
      double v = 0;
      switch (s.init) {
        case InitKind::kNormal: v = std0 * philox_normal(seed, stream, static_cast<uint64_t>(e)); break;
        case InitKind::kScaledNormal: v = std_out * philox_normal(seed, stream, static_cast<uint64_t>(e)); break;
        case InitKind::kOnes: v = 1; break;
        case InitKind::kZeros: v = 0; break;
      }
      if (p.dtype() == DType::kF32) p.ptr<float>()[e] = static_cast<float>(v);
      else p.ptr<double>()[e] = v;
    }
  }
  sync_low_precision();
}

void GPTModel::sync_low_precision() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (lowp_[i].defined()) k::cast(params_[i], lowp_[i]);
}

void GPTModel::zero_grads() {
  std::memset(grads_arena_.base(), 0, grads_arena_.used());
}

// y [N,out] = x [N,in] W^T + b. Column-parallel (qkv, fc1): fwd identity, bwd
// all-reduce dx; row-parallel (proj, fc2): fwd all-reduce y, bwd identity.
void GPTModel::linear_fwd(const Tensor& x, int w, int b, const Tensor& y) {
  const Tensor& W = params_[w];
  const int64_t out = W.dim(0), in = W.dim(1), n = x.numel() / in;
  if (opt_.bf16_compute) {
    ArenaScope scope(scratch_);
    Tensor xh = scratch(x.shape(), DType::kBF16);
    k::cast(x, xh);
    k::gemm(false, true, n, out, in, 1.0f, xh, lowp_[w], 0.0f, y);
  } else {
    k::gemm(false, true, n, out, in, 1.0f, x, W, 0.0f, y);
  }
  if (b >= 0) k::bias_add(y, params_[b]);
}

// dx = dy W (written; skipped when dx is undefined), dW += dy^T x, db += sum dy.
void GPTModel::linear_bwd(const Tensor& x, int w, int b, const Tensor& dy, const Tensor& dx) {
  const Tensor& W = params_[w];
  const int64_t out = W.dim(0), in = W.dim(1), n = x.numel() / in;
  if (opt_.bf16_compute) {
    ArenaScope scope(scratch_);
    Tensor dyh = scratch(dy.shape(), DType::kBF16), xh = scratch(x.shape(), DType::kBF16);
    k::cast(dy, dyh);
    k::cast(x, xh);
    if (dx.defined()) k::gemm(false, false, n, in, out, 1.0f, dyh, lowp_[w], 0.0f, dx);
    k::gemm(true, false, out, in, n, 1.0f, dyh, xh, 1.0f, grads_[w]);
  } else {
    if (dx.defined()) k::gemm(false, false, n, in, out, 1.0f, dy, W, 0.0f, dx);
    k::gemm(true, false, out, in, n, 1.0f, dy, x, 1.0f, grads_[w]);
  }
  if (b >= 0) k::bias_grad(dy, grads_[b]);
}

void GPTModel::norm_fwd(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (cfg_.normalization == Normalization::kLayerNorm)
    k::layernorm_forward(x, params_[w], b >= 0 ? params_[b] : Tensor(), cfg_.norm_epsilon, y, mean, rstd);
  else
    k::rmsnorm_forward(x, params_[w], cfg_.norm_epsilon, y, rstd);
}

void GPTModel::norm_bwd(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx) {
  if (cfg_.normalization == Normalization::kLayerNorm)
    k::layernorm_backward(dy, x, params_[w], mean, rstd, dx, grads_[w], b >= 0 ? grads_[b] : Tensor());
  else
    k::rmsnorm_backward(dy, x, params_[w], rstd, dx, grads_[w]);
}

namespace {
uint64_t dropout_stream(uint64_t step, int64_t layer, int site) {
  return (step * 4096 + static_cast<uint64_t>(layer)) * 4 + static_cast<uint64_t>(site);
}
constexpr uint64_t kDropoutSeedSalt = 0x6d742d64726f70ull;  // "mt-drop"
}  // namespace

void GPTModel::layer_forward(int l, Slot& s) {
  const LayerIdx& p = layers_[l];
  LayerActs& a = s.layers[l];
  const Tensor& x = s.resid[l];
  const Tensor& out = s.resid[l + 1];
  const bool post = cfg_.apply_residual_connection_post_layernorm;
  const double hd = s.training ? cfg_.hidden_dropout : 0.0, ad = s.training ? cfg_.attention_dropout : 0.0;
  ArenaScope scope(scratch_);
  Tensor tmp = scratch({N_, h_}, opt_.dtype);
  // Attention block.
  norm_fwd(x, p.ln1_w, p.ln1_b, a.ln1, a.ln1_mean, a.ln1_rstd);
  linear_fwd(a.ln1, p.qkv_w, p.qkv_b, a.qkv);
  k::QkvLayout L{T_, B_, cfg_.num_attention_heads, cfg_.query_groups(), cfg_.head_dim()};
  if (cfg_.position_embedding == PositionEmbedding::kRope) k::rope_forward(a.qkv, L, rope_cos_, rope_sin_);
  k::AttentionOptions ao{1.0 / std::sqrt(static_cast<double>(cfg_.head_dim())), ad, kDropoutSeedSalt,
                         dropout_stream(s.dropout_step, l, 0), 0};
  k::attention_forward(a.qkv, L, ao, a.ctx, a.lse);
  linear_fwd(a.ctx, p.proj_w, p.proj_b, tmp);
  if (hd > 0) k::dropout_forward(tmp, tmp, hd, kDropoutSeedSalt, dropout_stream(s.dropout_step, l, 1));
  k::add(post ? a.ln1 : x, tmp, a.x_mid);
  // MLP block.
  norm_fwd(a.x_mid, p.ln2_w, p.ln2_b, a.ln2, a.ln2_mean, a.ln2_rstd);
  linear_fwd(a.ln2, p.fc1_w, p.fc1_b, a.fc1);
  if (cfg_.swiglu) k::swiglu_forward(a.fc1, a.act);
  else k::gelu_forward(cfg_.openai_gelu ? k::GeluKind::kTanh : k::GeluKind::kExact, a.fc1, a.act);
  linear_fwd(a.act, p.fc2_w, p.fc2_b, tmp);
  if (hd > 0) k::dropout_forward(tmp, tmp, hd, kDropoutSeedSalt, dropout_stream(s.dropout_step, l, 2));
  k::add(post ? a.ln2 : a.x_mid, tmp, out);
}

// dresid holds d(resid[l+1]) on entry and d(resid[l]) on exit.
void GPTModel::layer_backward(int l, Slot& s, const Tensor& dresid) {
  const LayerIdx& p = layers_[l];
  LayerActs& a = s.layers[l];
  const bool post = cfg_.apply_residual_connection_post_layernorm;
  const double hd = s.training ? cfg_.hidden_dropout : 0.0, ad = s.training ? cfg_.attention_dropout : 0.0;
  const int64_t adim = cfg_.num_attention_heads * cfg_.head_dim();
  ArenaScope scope(scratch_);
  const DType dt = opt_.dtype;
  Tensor dtmp = scratch({N_, h_}, dt), dln = scratch({N_, h_}, dt), dact = scratch({N_, F_}, dt),
         dfc1 = scratch({N_, fc1_}, dt), dctx = scratch({N_, adim}, dt), dqkv = scratch({N_, qkv_}, dt);
  // out = res2 + dropout(fc2(act)), res2 = post ? ln2 : x_mid
  if (hd > 0) k::dropout_backward(dresid, dtmp, hd, kDropoutSeedSalt, dropout_stream(s.dropout_step, l, 2));
  const Tensor& dfc2 = hd > 0 ? dtmp : dresid;
  linear_bwd(a.act, p.fc2_w, p.fc2_b, dfc2, dact);
  if (cfg_.swiglu) k::swiglu_backward(a.fc1, dact, dfc1);
  else k::gelu_backward(cfg_.openai_gelu ? k::GeluKind::kTanh : k::GeluKind::kExact, a.fc1, dact, dfc1);
  linear_bwd(a.ln2, p.fc1_w, p.fc1_b, dfc1, dln);
  if (post) {
    k::add_inplace(dln, dresid);  // residual taken from ln2
    dresid.zero();
  }
  norm_bwd(dln, a.x_mid, p.ln2_w, p.ln2_b, a.ln2_mean, a.ln2_rstd, dresid);  // dresid = d x_mid
  // x_mid = res1 + dropout(proj(ctx)), res1 = post ? ln1 : x
  if (hd > 0) k::dropout_backward(dresid, dtmp, hd, kDropoutSeedSalt, dropout_stream(s.dropout_step, l, 1));
  const Tensor& dproj = hd > 0 ? dtmp : dresid;
  linear_bwd(a.ctx, p.proj_w, p.proj_b, dproj, dctx);
  k::QkvLayout L{T_, B_, cfg_.num_attention_heads, cfg_.query_groups(), cfg_.head_dim()};
  k::AttentionOptions ao{1.0 / std::sqrt(static_cast<double>(cfg_.head_dim())), ad, kDropoutSeedSalt,
                         dropout_stream(s.dropout_step, l, 0), 0};
  k::attention_backward(a.qkv, a.ctx, dctx, a.lse, L, ao, dqkv);
  if (cfg_.position_embedding == PositionEmbedding::kRope) k::rope_backward(dqkv, L, rope_cos_, rope_sin_);
  linear_bwd(a.ln1, p.qkv_w, p.qkv_b, dqkv, dln);
  if (post) {
    k::add_inplace(dln, dresid);
    dresid.zero();
  }
  norm_bwd(dln, s.resid[l], p.ln1_w, p.ln1_b, a.ln1_mean, a.ln1_rstd, dresid);  // dresid = d x
}

double GPTModel::forward(int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step,
                         bool training) {
  Slot& s = slots_.at(slot);
  MT_CHECK(tokens.numel() == N_ && labels.numel() == N_ && tokens.dtype() == DType::kI32 &&
               labels.dtype() == DType::kI32,
           fmt::format("GPTModel::forward: tokens and labels must be int32 [{}, {}]", B_, T_));
  s.dropout_step = dropout_step;
  s.training = training;
  // [b, s] -> [s, b].
  const int32_t* tk = tokens.ptr<int32_t>();
  const int32_t* lb = labels.ptr<int32_t>();
  s.count = 0;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      int32_t id = tk[b * T_ + t];
      MT_CHECK(id >= 0 && id < V_, fmt::format("token id {} outside the vocabulary [0, {})", id, V_));
      s.tokens.ptr<int32_t>()[t * B_ + b] = id;
      s.labels.ptr<int32_t>()[t * B_ + b] = lb[b * T_ + t];
      MT_CHECK(lb[b * T_ + t] < V_, "label outside the vocabulary");
      if (lb[b * T_ + t] >= 0) s.count += 1;
    }
  // Embedding (vocab-parallel: fwd all-reduce over TP) + learned positions, then dropout.
  k::embedding_forward(s.tokens, params_[word_], 0, s.resid[0]);
  if (pos_ >= 0) k::position_add_forward(params_[pos_], B_, s.resid[0]);
  const double hd = training ? cfg_.hidden_dropout : 0.0;
  if (hd > 0) k::dropout_forward(s.resid[0], s.resid[0], hd, kDropoutSeedSalt, dropout_stream(dropout_step, 4095, 3));
  for (int l = 0; l < cfg_.num_layers; ++l) layer_forward(l, s);
  // Final norm, output layer (tied: the word embedding), loss.
  norm_fwd(s.resid[cfg_.num_layers], final_w_, final_b_, s.lnf, s.lnf_mean, s.lnf_rstd);
  if (opt_.bf16_compute) {
    ArenaScope scope(scratch_);
    Tensor xh = scratch(s.lnf.shape(), DType::kBF16);
    k::cast(s.lnf, xh);
    k::gemm(false, true, N_, V_, h_, 1.0f, xh, lowp_[out_], 0.0f, s.logits);
  } else {
    k::gemm(false, true, N_, V_, h_, 1.0f, s.lnf, params_[out_], 0.0f, s.logits);
  }
  k::xent_partials(s.logits, s.labels, 0, s.mx, s.se, s.tl);
  k::xent_loss(s.mx, s.se, s.tl, s.labels, s.loss);
  double total = 0;
  for (int64_t i = 0; i < N_; ++i)
    total += opt_.dtype == DType::kF32 ? static_cast<double>(s.loss.ptr<float>()[i]) : s.loss.ptr<double>()[i];
  s.ready = true;
  return s.count > 0 ? total / s.count : 0.0;
}

void GPTModel::backward(int slot, double loss_scale) {
  Slot& s = slots_.at(slot);
  MT_CHECK(s.ready, "GPTModel::backward: slot has no forward");
  s.ready = false;
  ArenaScope scope(scratch_);
  const DType dt = opt_.dtype;
  Tensor dloss = scratch({N_}, dt);
  const double g = s.count > 0 ? loss_scale / s.count : 0.0;
  for (int64_t i = 0; i < N_; ++i) {
    if (dt == DType::kF32) dloss.ptr<float>()[i] = static_cast<float>(g);
    else dloss.ptr<double>()[i] = g;
  }
  // dlogits overwrite the logits.
  k::xent_backward(s.logits, s.labels, 0, s.mx, s.se, dloss, s.logits);
  Tensor dlnf = scratch({N_, h_}, dt), dresid = scratch({N_, h_}, dt);
  {
    ArenaScope casts(scratch_);
    if (opt_.bf16_compute) {
      Tensor dh = scratch(s.logits.shape(), DType::kBF16), xh = scratch(s.lnf.shape(), DType::kBF16);
      k::cast(s.logits, dh);
      k::cast(s.lnf, xh);
      k::gemm(false, false, N_, h_, V_, 1.0f, dh, lowp_[out_], 0.0f, dlnf);
      k::gemm(true, false, V_, h_, N_, 1.0f, dh, xh, 1.0f, grads_[out_]);
    } else {
      k::gemm(false, false, N_, h_, V_, 1.0f, s.logits, params_[out_], 0.0f, dlnf);
      k::gemm(true, false, V_, h_, N_, 1.0f, s.logits, s.lnf, 1.0f, grads_[out_]);
    }
  }
  dresid.zero();
  norm_bwd(dlnf, s.resid[cfg_.num_layers], final_w_, final_b_, s.lnf_mean, s.lnf_rstd, dresid);
  for (int l = static_cast<int>(cfg_.num_layers) - 1; l >= 0; --l) layer_backward(l, s, dresid);
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  if (hd > 0) k::dropout_backward(dresid, dresid, hd, kDropoutSeedSalt, dropout_stream(s.dropout_step, 4095, 3));
  if (pos_ >= 0) k::position_add_backward(dresid, B_, grads_[pos_]);
  k::embedding_backward(s.tokens, dresid, 0, grads_[word_]);
}

double GPTModel::flops_per_micro_batch() const {
  const double h = static_cast<double>(h_), a = static_cast<double>(cfg_.num_attention_heads),
               g = static_cast<double>(cfg_.query_groups()), d = static_cast<double>(cfg_.head_dim());
  const double q = a * d, kv = g * d, phi = cfg_.swiglu ? 3 : 2, Lr = static_cast<double>(cfg_.num_layers);
  const double T = static_cast<double>(N_), Q = static_cast<double>(B_) * static_cast<double>(T_) * static_cast<double>(T_);
  return T * (6 * h * phi * static_cast<double>(F_) * Lr + Lr * 6 * (h * (q + 2 * kv) + q * h) + 6 * h * static_cast<double>(V_)) +
         Q * Lr * 6 * q;
}

}  // namespace mt::model
