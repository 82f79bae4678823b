#include "model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "comm/communicator.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/sim_device.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
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
  int q_ln_w = -1, q_ln_b = -1, k_ln_w = -1, k_ln_b = -1;  // --qk-layernorm
  // --multi-latent-attention: the down and up projections (q_proj without
  // --q-lora-rank), and the kv norm (the q norm is q_ln_*).
  int q_down_w = -1, q_up_w = -1, q_proj_w = -1, kv_down_w = -1, kv_up_w = -1, kv_ln_w = -1, kv_ln_b = -1;
  int router_w = -1;                  // --num-experts: the router, and each expert's two linears
  std::vector<int> exp_fc1, exp_fc2;
  int sh_fc1 = -1, sh_fc2 = -1;       // --moe-shared-expert-intermediate-size: the shared expert
  int sh_gate = -1;                   // --moe-shared-expert-gate: its gate weight [1, h]
};

// What backward needs from one layer's forward (N = T*B rows, T this
// rank's positions: the sequence, or its 1/CP share under context
// parallelism; Ns = N/TP with sequence parallelism, else N; a, g, F: this TP
// rank's heads, query groups and MLP columns):
//   x_mid [Ns,h] residual stream after attention    ln1, ln2 [N,h] norm outputs (with SP:
//                                                   all-gathered, this rank's rows computed here)
//   ln*_mean (LayerNorm only), ln*_rstd [Ns]         qkv [N,(a+2g)d] after rope
//   ctx [N,a d], lse [B,a,T] attention output/log-sum-exp (not kept with
//                            selective recomputation: recomputed from qkv)
//   fc1 [N, F or 2F] pre-activation                  act [N,F]
//   --qk-layernorm: qk_raw [N,(a+g)d] the q and k heads before their norms
//   (kernels::qk_heads_gather's layout), qk_mean (LayerNorm), qk_rstd [N(a+g)]
//   --multi-latent-attention (ql, kl: --q-lora-rank, --kv-lora-rank): the
//   up projections' inputs cq [N,ql] and ckv [N,kl] (with SP all-gathered,
//   this rank's rows computed here): the down projections' outputs, or with
//   --qk-layernorm their norms' outputs, the norms' inputs then kept as
//   cq_raw [Ns,ql], ckv_raw [Ns,kl] with their statistics [Ns]. The up
//   projections' outputs and the position key live in scratch only: qkv
//   (kernels/mla.h's packing, roped) is what attention and its backward read.
//   ctx is then [N, a (dn + dr)], each head's value dims first and zeros
//   after them; linear_proj reads the value dims from it (in scratch).
//   --num-experts E (k = --moe-router-topk): the router's choice r_idx [N,k]
//   int32, its probabilities r_probs [N,k], the full softmax r_scores [N,E]
//   and log-sum-exp r_lse [N]; the dispatch map (kernels/moe.h) pos [N,k],
//   src [N k], counts [E] int32; the rows this rank's experts ran, xp [Rx,
//   h], with fc1 [Rx, Fe or 2Fe] and act [Rx, Fe] (Fe: this TP rank's expert
//   columns); and the experts' outputs for this rank's N k routed slots, y
//   [N k, h] (before the probabilities and the TP reduction; with token
//   dropping only the first `kept` rows, the slots kept). Without expert
//   parallelism the experts run this rank's kept slots (xp the permuted
//   ln2); with it, what the EP group sent (Rx bounds both, see Dims).
//   With ETP 1 under TP the routing tensors, pos, src and y cover this
//   rank's Ns rows only (N replaced by Lr = Ns; Fe the whole expert).
//   The shared expert (--moe-shared-expert-intermediate-size) keeps s_fc1
//   [N, S or 2S] and s_act [N, S], S its columns on this TP rank.
// With --moe-layer-freq a layer is dense or MoE: a position that holds
// only one kind keeps that kind's tensors; one that can hold either (other
// chunks, recomputed groups) keeps the MoE fields and fc1/act as flat
// buffers of the larger kind, viewed per layer (GPTModel::mlp_shaped).
// The layer's input is resid[l], its output resid[l+1]. An undefined tensor
// is one this configuration does not keep.
struct GPTModel::LayerActs {
  Tensor x_mid, ln1, ln1_mean, ln1_rstd, qkv, ctx, lse, ln2, ln2_mean, ln2_rstd, fc1, act, qk_raw, qk_mean, qk_rstd;
  Tensor r_idx, r_probs, r_scores, r_lse, pos, src, counts, xp, y;  // --num-experts
  Tensor s_fc1, s_act;                                             // its shared expert
  Tensor cq, cq_raw, cq_mean, cq_rstd, ckv, ckv_raw, ckv_mean, ckv_rstd;  // --multi-latent-attention
  Tensor kpe;  // its position key [N, dr], kept for --recompute-modules mla_up_proj (qkv then not)
};

namespace {

constexpr int kLayerFields = GPTModel::kLayerFields;
enum LayerField { kXMid, kLn1, kLn1Mean, kLn1Rstd, kQkv, kCtx, kLse, kLn2, kLn2Mean, kLn2Rstd, kFc1, kAct,
                  kQkRaw, kQkMean, kQkRstd, kRIdx, kRProbs, kRScores, kRLse, kPos, kSrc, kCounts, kXp, kY,
                  kSFc1, kSAct, kCq, kCqRaw, kCqMean, kCqRstd, kCkv, kCkvRaw, kCkvMean, kCkvRstd, kKpe };
const char* const kLayerFieldNames[kLayerFields] = {"x_mid", "ln1",   "ln1_mean", "ln1_rstd", "qkv",     "ctx",
                                                    "lse",   "ln2",   "ln2_mean", "ln2_rstd", "fc1",     "act",
                                                    "qk_raw", "qk_mean", "qk_rstd", "r_idx",  "r_probs", "r_scores",
                                                    "r_lse", "pos",   "src",      "counts",   "xp",      "y",
                                                    "shared.fc1", "shared.act", "mla.cq", "mla.cq_raw",
                                                    "mla.cq_mean", "mla.cq_rstd", "mla.ckv", "mla.ckv_raw",
                                                    "mla.ckv_mean", "mla.ckv_rstd", "mla.kpe"};
using FieldIdx = std::array<int, kLayerFields>;  // entry index in a SizeTable, -1: not kept

// The sizes every table and the scratch plan are built from.
struct Dims {
  int64_t N, Ns, B, T, h, a, ad, qkv, fc1, F, V;  // a..V: this TP rank's share
  DType dt;
  bool layernorm;
  // Activations that only feed bf16 GEMMs are stored in bf16 under --bf16
  // (the norm or activation kernel rounds them as it writes, as a cast would):
  // act and the final norm output (gemm_in), and ln1/ln2 (ln) unless the
  // residual is taken from them (apply_residual_connection_post_layernorm).
  // mid: what lies between two GEMMs, bf16 under --bf16: the qkv and fc1
  // GEMM outputs, the attention output ctx, and their gradients (dqkv, dfc1,
  // dctx, dact), each op computing in fp32 and rounding once as it stores.
  // rs: the residual stream (resid, x_mid) and its gradient; bf16 under
  // --bf16 as in Megatron (every add rounds its fp32 sum once), the model
  // dtype with --fp32-residual-connection. dn: the gradient of a norm's
  // output (the dx a qkv/fc1/output-layer GEMM writes, the norm backward's
  // dy): rs on one TP rank; with TP it is reduced over the ranks first, in
  // the model dtype, so the partial sums are not rounded to bf16.
  // The norms' statistics, the row-parallel outputs (before the residual
  // add) and the logits stay in the model dtype.
  DType gemm_in = DType::kF32, ln = DType::kF32, mid = DType::kF32, rs = DType::kF32, dn = DType::kF32;
  int64_t g = 0, hd = 0;  // this rank's query groups, the head dim
  bool qk = false;        // --qk-layernorm
  int64_t cp = 1, Tg = 0;  // context-parallel size, the whole sequence (T = Tg / cp)
  bool doc = false, pos_ids = false;  // --reset-attention-mask, --reset-position-ids
  // --num-experts: E experts, k chosen per token; the MLP's rows R = N k
  // (N without experts), fc1 and F then the expert's (this rank's columns).
  int64_t E = 0, topk = 0, R = 0;
  bool moe = false;
  // The dense MLP's columns and fc1 width on this TP rank: every layer's
  // without experts, --moe-layer-freq's dense layers' with them.
  int64_t Fd = 0, fc1d = 0;
  // Expert parallelism: EP ranks, E / EP experts each; Rx the rows this
  // rank's experts can receive: each of the EP ranks sends each of its N
  // tokens to at most min(k, E / EP) of them (k distinct choices), so Rx =
  // EP N min(k, E / EP), the dropless worst case (R when EP = 1).
  // --moe-expert-capacity-factor: the router's rows form `segs` segments
  // (the TP ranks' sequence shards, as each Megatron rank routes its own)
  // and each expert keeps at most `cap` slots per segment, so at most
  // `kept` = min(R, E segs cap') slots leave a rank's router (cap' =
  // min(cap, N / segs)) and Rx is at most E segs cap' as well (EP sources x
  // E/EP experts x segs x cap'; more than R when the capacity is roomy).
  int64_t ep = 1, Rx = 0;
  int64_t segs = 1, cap = 0, kept = 0;
  // --expert-tensor-parallel-size 1 under TP (GPTOptions::etp): the router
  // takes this rank's Lr = Ns rows (R = Ns k, Rx and the capacity segment
  // from them), the experts are whole (F, fc1 over no split); else Lr = N.
  bool xlocal = false;
  int64_t Lr = 0;
  bool drops = false;
  int64_t lbG = 1;  // the load-balancing loss's groups: B sequences under seq_aux_loss, else 1
  bool jitter = false;  // --moe-input-jitter-eps: the router reads a jittered copy of its input
  // The shared expert: this TP rank's columns S (0: none), its fc1 width;
  // gate: --moe-shared-expert-gate on a rank holding MoE layers.
  int64_t S = 0, sfc1 = 0;
  bool gate = false;
  int64_t qk_rows() const { return N * (a + g); }  // q and k head rows of a layer
  // --multi-latent-attention: ql (0: linear_q_proj), kl, the position dims
  // dr; this rank's q and kv up-projection widths a D and a (dn + dv), and
  // linear_proj's input a dv (ad = a D is the padded attention output).
  bool mla = false;
  int64_t ql = 0, kl = 0, dr = 0, qw = 0, kvw = 0, pw = 0;
};

// Which MLPs a layer position can hold: a dense one, an MoE one, or either
// (virtual pipeline chunks, recomputed groups with --moe-layer-freq).
enum LayerKinds { kDenseLayer = 1, kMoeLayer = 2 };

// fc1 and act of one kind of layer: [N, fc1d] and [N, Fd] dense, [Rx, fc1]
// and [Rx, F] MoE.
Shape mlp_shape(int f, const Dims& d, bool moe) {
  if (f == kFc1) return moe ? Shape{d.Rx, d.fc1} : Shape{d.N, d.fc1d};
  return moe ? Shape{d.Rx, d.F} : Shape{d.N, d.Fd};
}

Shape field_shape(int f, const Dims& d, int kinds) {
  if (f == kFc1 || f == kAct) {
    // A position either kind of layer can use holds the larger as a flat
    // buffer (GPTModel::mlp_shaped views it per layer).
    if (kinds == (kDenseLayer | kMoeLayer))
      return {std::max(mlp_shape(f, d, false).numel(), mlp_shape(f, d, true).numel())};
    return mlp_shape(f, d, kinds == kMoeLayer);
  }
  switch (f) {
    case kXMid: return {d.Ns, d.h};
    case kLn1: case kLn2: return {d.N, d.h};
    case kLn1Mean: case kLn1Rstd: case kLn2Mean: case kLn2Rstd: return {d.Ns};
    case kQkv: return {d.N, d.qkv};
    case kCtx: return {d.N, d.ad};
    case kLse: return {d.B, d.a, d.T};
    case kQkRaw: return {d.qk_rows(), d.hd};
    case kQkMean: case kQkRstd: return {d.qk_rows()};
    // The router's rows (Lr: N, or this rank's Ns with ETP 1 under TP).
    case kRIdx: case kRProbs: case kPos: return {d.Lr, d.topk};
    case kRScores: return {d.Lr, d.E};
    case kRLse: return {d.Lr};
    case kSrc: return {d.R};
    case kCounts: return {d.E};
    case kXp: return {d.Rx, d.h};
    case kY: return {d.R, d.h};
    case kSFc1: return {d.N, d.sfc1};
    case kSAct: return {d.N, d.S};
    case kCq: return {d.N, d.ql};
    case kCqRaw: return {d.Ns, d.ql};
    case kCkv: return {d.N, d.kl};
    case kCkvRaw: return {d.Ns, d.kl};
    case kCqMean: case kCqRstd: case kCkvMean: case kCkvRstd: return {d.Ns};
    case kKpe: return {d.N, d.dr};
    default: return {};
  }
}

DType field_dtype(int f, const Dims& d) {
  if (f == kXMid) return d.rs;
  if (f == kLn1 || f == kLn2) return d.ln;
  if (f == kAct || f == kSAct) return d.gemm_in;
  if (f == kQkv || f == kCtx || f == kFc1 || f == kQkRaw || f == kSFc1 || f == kCq || f == kCqRaw || f == kCkv ||
      f == kCkvRaw || f == kKpe)
    return d.mid;
  if (f == kRIdx || f == kPos || f == kSrc || f == kCounts) return DType::kI32;
  if (f == kXp) return d.ln;
  return d.dt;
}

// Adds the activations of a layer position to `t`, for the LayerKinds it
// can hold; keep_attention false drops ctx and lse, keep_moe_act false an
// MoE layer's act (a position that can also hold a dense layer keeps the
// dense act).
FieldIdx add_layer(SizeTable& t, const std::string& prefix, const Dims& d, bool keep_attention, int kinds,
                   bool keep_moe_act = true, bool keep_qkv = true) {
  FieldIdx idx;
  idx.fill(-1);
  for (int f = 0; f < kLayerFields; ++f) {
    if (f == kAct && !keep_moe_act) {
      const int act_kinds = kinds & ~kMoeLayer;
      if (act_kinds) idx[f] = t.add(prefix + kLayerFieldNames[f], field_shape(f, d, act_kinds), field_dtype(f, d));
      continue;
    }
    if ((f == kLn1Mean || f == kLn2Mean || f == kQkMean) && !d.layernorm) continue;  // RMSNorm keeps rstd only
    if (f >= kRIdx && f < kCq && !(kinds & kMoeLayer)) continue;
    if ((f == kSFc1 || f == kSAct) && d.S == 0) continue;
    if ((f == kQkRaw || f == kQkMean || f == kQkRstd) && (!d.qk || d.mla)) continue;
    if (f >= kCq && !d.mla) continue;
    if (f >= kCq && f <= kCqRstd && d.ql == 0) continue;
    if ((f == kCqRaw || f == kCqRstd || f == kCkvRaw || f == kCkvRstd) && !d.qk) continue;
    if ((f == kCqMean || f == kCkvMean) && (!d.qk || !d.layernorm)) continue;
    if ((f == kCtx || f == kLse) && !keep_attention) continue;
    if (f == kQkv && !keep_qkv) continue;
    if (f == kKpe && keep_qkv) continue;  // (MLA: only where qkv is recomputed from it)
    idx[f] = t.add(prefix + kLayerFieldNames[f], field_shape(f, d, kinds), field_dtype(f, d));
  }
  return idx;
}

// Whether a rank's gradient of this parameter is a partial sum over the TP
// group (reduce_tp_replicated_grads() sums it): every replicated parameter
// under sequence parallelism (each rank saw its sequence shard), and the
// q/k norm weights always (each rank saw its own heads; Megatron's
// finalize_model_grads all-reduces "q_layernorm"/"k_layernorm" for the same
// reason). MLA's q norm acts on the whole compressed query before the heads
// split, so like its down projections it is partial under SP only.
bool tp_partial_grad(const ParamSpec& s, bool sequence_parallel, bool mla) {
  if (s.shard != ShardKind::kReplicated) return false;
  return sequence_parallel || (is_qk_norm(s.name) && !mla);
}

// The global layers whose parameters a rank holds: its chunks' and, on the
// last stage, the MTP layers (--mtp-num-layers; one when repeated).
std::vector<int64_t> held_layers(const ModelConfig& cfg, const std::vector<LayerRange>& chunks, bool post_process) {
  std::vector<int64_t> v;
  for (const LayerRange& c : chunks)
    for (int64_t l = c.first; l < c.first + c.count; ++l) v.push_back(l);
  for (int64_t l = cfg.num_layers; post_process && l < cfg.num_layers + cfg.mtp_built_layers(); ++l) v.push_back(l);
  return v;
}

// The weight of layer l's router losses: 1/D per depth for a repeated MTP
// layer (Megatron's, so that the D calls count as one layer), else 1.
double router_loss_weight(const ModelConfig& cfg, int64_t l) {
  return cfg.mtp_use_repeated_layer && l >= cfg.num_layers ? 1.0 / static_cast<double>(cfg.mtp_layers()) : 1.0;
}

// Aligned bytes of one scratch allocation (Arena::alloc rounds each up).
size_t abytes(int64_t elements, DType dt) { return align_up(static_cast<size_t>(elements) * dtype_size(dt)); }

}  // namespace

// Entry indices of a slot's tensors in the activation table.
struct ActIndex {
  int tokens = -1, labels = -1;
  int doc_start = -1, positions = -1;  // --reset-attention-mask / --reset-position-ids (learned positions)
  std::vector<int> resid;       // L+1, -1 where not kept
  std::vector<FieldIdx> layers;  // L
  int lnf = -1, lnf_mean = -1, lnf_rstd = -1, logits = -1, mx = -1, se = -1, tl = -1, loss = -1;
  // --mtp-num-layers: each depth's (GPTModel::MtpActs).
  struct Mtp {
    int tokens = -1, labels = -1, emb = -1, e_mean = -1, e_rstd = -1, h_mean = -1, h_rstd = -1, cat = -1, x = -1,
        y = -1, lnf = -1, f_mean = -1, f_rstd = -1, logits = -1, mx = -1, se = -1, tl = -1, loss = -1;
    FieldIdx layer{};
  };
  std::vector<Mtp> mtp;
};

// What backward needs from one MTP depth k (the last stage; N, Ns, h as a
// layer's): tokens, labels [N] int32 this rank's rows of the sequence
// rolled left k times (token 0 and label -1 rolled in); emb [Ns, h] the
// embedding of those tokens after dropout (enorm's input) with enorm's
// statistics e_*; hnorm's statistics h_* of h_{k-1} (the decoder's final
// norm output for k = 1, depth k-1's lnf after); cat [N, 2h] eh_proj's
// input [enorm | hnorm] (with SP all-gathered, this rank's rows computed
// here); x [Ns, h] eh_proj's output, the layer's input; the layer's
// activations; y [Ns, h] its output; lnf [N, h], f_* its final norm; and
// the output layer's logits and loss statistics, as the decoder's.
struct GPTModel::MtpActs {
  Tensor tokens, labels, emb, e_mean, e_rstd, h_mean, h_rstd, cat, x, y, lnf, f_mean, f_rstd, logits, mx, se, tl, loss;
  LayerActs layer;
};

// Everything create() allocates, computed without allocating.
struct GPTModel::Tables {
  GPTOptions opt;
  Dims dims{};
  std::vector<ParamSpec> specs;
  std::vector<LayerRange> chunks;
  std::vector<std::vector<LayerGroup>> groups;  // per chunk
  SizeTable params, lowp, acts, workspace, rope;
  SizeTable expert_params;  // --num-experts: the routed experts' parameters, after `params` in the flat buffers
  size_t dense_flat_bytes = 0;  // params' bytes padded to the flat unit (where the experts start)
  std::vector<int> lowp_which;  // parameter index of each lowp entry
  ActIndex act;
  std::vector<FieldIdx> ws_layers;  // per position in a recomputed group
  std::vector<int> ws_resid;        // inputs of group positions 1..K-1
  GPTMemoryPlan plan;
};

struct GPTModel::Slot {
  Tensor tokens, labels;      // [T*B] int32, [s, b] order
  // --reset-attention-mask: [B, Tg] int32, each position's document start;
  // --reset-position-ids with learned positions: each row's position id
  // [T*B] int32 ([s, b] order).
  Tensor doc_start, positions;
  // By position in the chunk held (K = the largest chunk's layers): resid[i]
  // is the input of the chunk's i-th layer, resid[n] the chunk's output.
  std::vector<Tensor> resid;  // K+1 x [Ns,h]; undefined where recomputed
  std::vector<LayerActs> layers;  // K
  int chunk = 0;
  Tensor lnf, lnf_mean, lnf_rstd, logits, mx, se, tl, loss;  // lnf [N,h]; logits [N,V/TP]; mean/rstd [Ns]; rest [N]
  uint64_t dropout_step = 0;
  bool training = false, ready = false;
  double count = 0;       // labels counted in the loss
  double loss_total = 0;  // sum of their losses (last virtual stage only)
  // --num-experts, per global layer (GPTModel::moe_record_losses): the
  // micro-batch's expert counts backward's load-balancing gradient uses,
  // and the layer's unweighted load-balancing and z-losses (this rank's share).
  mutable std::vector<std::vector<double>> moe_counts;
  mutable std::vector<double> moe_aux, moe_z;
  // And the exchange of its routed slots (GPTModel::moe_forward): the slots
  // sent to each EP rank [EP] and the rows received per (source rank, local
  // expert) [EP x E/EP], source-major (without EP: {kept} and the counts).
  mutable std::vector<std::vector<int64_t>> moe_send, moe_recv;
  // --moe-router-enable-expert-bias: this rank's tokens per expert per layer.
  mutable std::vector<std::vector<double>> moe_routed;
  // --mtp-num-layers: each depth's activations, counted labels and loss sum.
  std::vector<MtpActs> mtp;
  std::vector<double> mtp_count, mtp_loss, mtp_correct;  // (correct: greedy guesses equal to the label; training)
};

// One recomputed group's activations, carved from scratch.
struct GPTModel::Workspace {
  std::vector<LayerActs> layers;  // K
  std::vector<Tensor> resid;      // K-1: inputs of the group's layers after the first
};

GPTModel::LayerActs GPTModel::bind_layer(const std::vector<Tensor>& v, const std::array<int, kLayerFields>& idx) {
  LayerActs a;
  Tensor* fields[kLayerFields] = {&a.x_mid,   &a.ln1,    &a.ln1_mean, &a.ln1_rstd, &a.qkv,     &a.ctx,
                                  &a.lse,     &a.ln2,    &a.ln2_mean, &a.ln2_rstd, &a.fc1,     &a.act,
                                  &a.qk_raw,  &a.qk_mean, &a.qk_rstd, &a.r_idx,    &a.r_probs, &a.r_scores,
                                  &a.r_lse,   &a.pos,    &a.src,      &a.counts,   &a.xp,      &a.y,
                                  &a.s_fc1,   &a.s_act,   &a.cq,       &a.cq_raw,   &a.cq_mean, &a.cq_rstd,
                                  &a.ckv,     &a.ckv_raw, &a.ckv_mean, &a.ckv_rstd, &a.kpe};
  for (int f = 0; f < kLayerFields; ++f)
    if (idx[f] >= 0) *fields[f] = v[static_cast<size_t>(idx[f])];
  return a;
}

Result<RecomputeOptions> RecomputeOptions::from_flags(const std::optional<std::string>& granularity,
                                                      const std::optional<std::string>& method,
                                                      std::optional<int64_t> num_layers,
                                                      bool recompute_activations,
                                                      const std::vector<std::string>& modules) {
  RecomputeOptions r;
  std::vector<std::string> errs;
  if (recompute_activations && granularity && *granularity != "selective")
    errs.push_back("--recompute-activations means --recompute-granularity selective, but --recompute-granularity " +
                   *granularity + " is given");
  const std::string g = granularity.value_or(recompute_activations ? "selective" : "");
  if (g == "full") {
    r.granularity = RecomputeGranularity::kFull;
    if (!method) errs.push_back("--recompute-granularity full needs --recompute-method uniform or block");
    else if (*method == "uniform") r.method = RecomputeMethod::kUniform;
    else if (*method == "block") r.method = RecomputeMethod::kBlock;
    else errs.push_back("--recompute-method must be uniform or block, not '" + *method + "'");
    if (!num_layers) errs.push_back("--recompute-granularity full needs --recompute-num-layers (at least 1)");
    else if (*num_layers < 1) errs.push_back(fmt::format("--recompute-num-layers {} must be at least 1", *num_layers));
    else r.num_layers = *num_layers;
  } else if (g == "selective") {
    r.granularity = RecomputeGranularity::kSelective;
    if (method) errs.push_back("--recompute-method is not supported with selective recomputation; drop it");
    if (num_layers) errs.push_back("--recompute-num-layers must be unset with selective recomputation; drop it");
    // --recompute-modules (Megatron's default: core_attn).
    if (!modules.empty()) r.core_attn = false;
    for (const std::string& m : modules) {
      if (std::string why = module_problem(m); !why.empty()) errs.push_back(why);
      r.core_attn = r.core_attn || m == "core_attn";
      r.moe_act = r.moe_act || m == "moe_act";
      r.mla_up = r.mla_up || m == "mla_up_proj";
    }
  } else if (g.empty()) {
    if (method || num_layers)
      errs.push_back("--recompute-method/--recompute-num-layers only apply with --recompute-granularity full");
  } else {
    errs.push_back("--recompute-granularity must be full or selective, not '" + g + "'");
  }
  if (!modules.empty() && r.granularity != RecomputeGranularity::kSelective)
    errs.push_back("--recompute-modules applies to --recompute-granularity selective (full recomputation recomputes "
                   "whole layers): give selective or drop --recompute-modules");
  if (!errs.empty()) {
    std::string m = "invalid recomputation flags:";
    for (auto& e : errs) m += "\n  - " + e;
    return Status::invalid(m);
  }
  return r;
}

std::string RecomputeOptions::module_problem(const std::string& m) {
  if (m == "core_attn" || m == "moe_act" || m == "mla_up_proj") return "";
  if (m == "layernorm" || m == "mlp" || m == "moe" || m == "shared_experts" ||
      m == "gdn_norm_out" || m == "gdp_in_proj" || m == "gdp_qkv" || m == "mhc")
    return fmt::format("--recompute-modules {}: recomputing that module is not implemented here (core_attn and "
                       "moe_act and mla_up_proj are; full recomputation, --recompute-granularity full, recomputes "
                       "whole layers)",
                       m);
  return fmt::format("--recompute-modules {}: not a module Megatron recomputes (core_attn, moe_act, layernorm, "
                     "mla_up_proj, mlp, moe, shared_experts, ...)",
                     m.substr(0, 40));
}

std::string RecomputeOptions::str() const {
  switch (granularity) {
    case RecomputeGranularity::kNone: return "none";
    case RecomputeGranularity::kSelective: {
      if (core_attn && !moe_act && !mla_up) return "selective";
      std::string list;
      for (auto [on, name] : {std::pair{core_attn, "core_attn"}, {moe_act, "moe_act"}, {mla_up, "mla_up_proj"}})
        if (on) list += (list.empty() ? "" : ", ") + std::string(name);
      return "selective (" + (list.empty() ? std::string("nothing") : list) + ")";
    }
    case RecomputeGranularity::kFull:
      return fmt::format("full {} {}", method == RecomputeMethod::kUniform ? "uniform" : "block", num_layers);
  }
  return "?";
}

std::vector<LayerGroup> layer_groups(int64_t layers, const RecomputeOptions& r) {
  std::vector<LayerGroup> g;
  if (r.granularity != RecomputeGranularity::kFull) {
    for (int64_t l = 0; l < layers; ++l) g.push_back({l, l + 1, false});
    return g;
  }
  MT_CHECK(r.num_layers >= 1, "layer_groups: recompute num_layers must be at least 1");
  if (r.method == RecomputeMethod::kUniform) {
    // Megatron's _checkpointed_forward: chunks of num_layers, the last one clipped.
    for (int64_t l = 0; l < layers; l += r.num_layers) g.push_back({l, std::min(layers, l + r.num_layers), true});
  } else {
    // Block: the first num_layers layers are checkpointed one by one.
    for (int64_t l = 0; l < layers; ++l) g.push_back({l, l + 1, l < r.num_layers});
  }
  return g;
}

Result<GPTModel::Tables> GPTModel::make_tables(const ModelConfig& cfg, const GPTOptions& opt) {
  std::vector<std::string> errs;
  if (!cfg.has_architecture()) errs.push_back("--num-layers, --hidden-size and --num-attention-heads are required");
  if (!cfg.vocab_size) errs.push_back("the vocabulary size is unknown: give --vocab-size or --vocab-file");
  const int64_t Tg = opt.seq_length ? opt.seq_length : cfg.seq_length;  // the whole sequence
  if (Tg <= 0) errs.push_back("--seq-length is required");
  if (opt.cp < 1 || opt.cp_rank < 0 || opt.cp_rank >= opt.cp)
    errs.push_back(fmt::format("context-parallel rank {} outside [0, {})", opt.cp_rank, opt.cp));
  else if (opt.cp > 1 && Tg > 0 && Tg % (2 * opt.cp))
    errs.push_back(fmt::format("--seq-length {} is not a multiple of 2 x --context-parallel-size {} (each CP rank "
                               "holds two of 2 x {} equal chunks)",
                               Tg, opt.cp, opt.cp));
  const int64_t T = opt.cp >= 1 ? Tg / opt.cp : Tg;  // this rank's positions
  if (cfg.has_architecture()) {
    if (cfg.num_attention_heads % cfg.query_groups() != 0)
      errs.push_back(fmt::format("--num-attention-heads {} is not a multiple of --num-query-groups {}",
                                 cfg.num_attention_heads, cfg.query_groups()));
    if (cfg.head_dim() > k::kAttnMaxHeadDim)
      errs.push_back(fmt::format("head dim {} exceeds the attention kernel's {}", cfg.head_dim(), k::kAttnMaxHeadDim));
    if (cfg.position_embedding == PositionEmbedding::kRope && cfg.head_dim() % 2)
      errs.push_back("--position-embedding-type rope needs an even head dimension");
    else if (cfg.position_embedding == PositionEmbedding::kRope && cfg.rotary_freq_dim() <= 0)
      errs.push_back(fmt::format("--rotary-percent {} rotates none of the head's {} dimensions (int({} x {}) = 0): give at "
                                 "least {}",
                                 cfg.rotary_percent, cfg.head_dim(), cfg.head_dim(), cfg.rotary_percent,
                                 1.0 / static_cast<double>(cfg.head_dim())));
    if (opt.recompute.recomputes_mla_up() && !cfg.mla())
      errs.push_back("--recompute-modules mla_up_proj needs --multi-latent-attention (Megatron refuses it without)");
    if (cfg.mla()) {
      if (cfg.group_query_attention)
        errs.push_back("--multi-latent-attention with --group-query-attention: MLA has one key/value head per query "
                       "head (Megatron refuses the pair); drop --group-query-attention");
      if (cfg.rotary_interleaved)
        errs.push_back("--rotary-interleaved does not work with --multi-latent-attention (Megatron refuses it; MLA "
                       "pairs its position dims itself)");
      if (cfg.qk_pos_emb_head_dim % 2)
        errs.push_back(fmt::format("--qk-pos-emb-head-dim {} must be even (RoPE rotates pairs of dims)",
                                   cfg.qk_pos_emb_head_dim));
      else if (cfg.rotary_freq_dim() <= 0)
        errs.push_back(fmt::format("--rotary-percent {} rotates none of MLA's {} position dims", cfg.rotary_percent,
                                   cfg.qk_pos_emb_head_dim));
      if (cfg.v_head_dim > cfg.head_dim())
        errs.push_back(fmt::format("--v-head-dim {} above --qk-head-dim + --qk-pos-emb-head-dim = {}: the attention "
                                   "kernel here pads the values to the query/key width and cannot take wider ones",
                                   cfg.v_head_dim, cfg.head_dim()));
      if (cfg.qk_layernorm && !cfg.q_lora_rank)
        errs.push_back("--qk-layernorm without --q-lora-rank: Megatron then normalises the hidden state before "
                       "linear_q_proj (Transformer Engine's fused norm and linear), a norm this build does not have; "
                       "give --q-lora-rank or drop --qk-layernorm");
    }
    if (cfg.mtp_layers() && opt.tp > 1 && cfg.hidden_size % opt.tp)
      errs.push_back(fmt::format("--mtp-num-layers: eh_proj's {} output features do not split over "
                                 "--tensor-model-parallel-size {}",
                                 cfg.hidden_size, opt.tp));
    if (cfg.mtp_layers() && cfg.position_embedding == PositionEmbedding::kLearnedAbsolute)
      errs.push_back("--mtp-num-layers with --position-embedding-type learned_absolute: Megatron supports multi-token "
                     "prediction with rope and none only (fix: --position-embedding-type rope)");
    if (cfg.position_embedding == PositionEmbedding::kLearnedAbsolute && cfg.max_position_embeddings < Tg)
      errs.push_back(fmt::format("--max-position-embeddings {} is below the sequence length {}",
                                 cfg.max_position_embeddings, Tg));
    if (cfg.is_moe()) {
      if (auto pat = moe_layer_pattern(cfg.moe_layer_freq, cfg.num_layers); !pat.is_ok())
        errs.push_back(pat.status().message());
      else if (cfg.num_moe_layers() == 0)
        errs.push_back(fmt::format("--moe-layer-freq '{}' makes every layer dense: give at least one 1, or drop "
                                   "--num-experts",
                                   cfg.moe_layer_freq));
      if (cfg.add_bias_linear)
        errs.push_back("--num-experts: the experts here have no biases (nor has the router); add --disable-bias-linear");
      if (cfg.apply_residual_connection_post_layernorm)
        errs.push_back("--num-experts with --apply-residual-connection-post-layernorm is not supported; drop the latter");
      if (cfg.moe_router_topk > cfg.num_experts)
        errs.push_back(fmt::format("--moe-router-topk {} exceeds --num-experts {}", cfg.moe_router_topk, cfg.num_experts));
      if (cfg.moe_router_group_topk > 0) {
        const int64_t G = cfg.moe_router_num_groups, gk = cfg.moe_router_group_topk, k = cfg.moe_router_topk;
        if (G < 1)
          errs.push_back("--moe-router-group-topk needs --moe-router-num-groups (as Megatron requires)");
        else if (cfg.num_experts % G || gk > G || gk > k || k / gk > 32 || k > gk * (cfg.num_experts / G))
          errs.push_back(fmt::format("--moe-router-num-groups {} with --moe-router-group-topk {}: need --num-experts {} "
                                     "divisible by the groups, group-topk <= groups, group-topk <= --moe-router-topk {} "
                                     "<= group-topk x experts per group, and topk / group-topk <= 32",
                                     G, gk, cfg.num_experts, k));
      }
      if (cfg.moe_router_enable_expert_bias && !cfg.sigmoid_router())
        errs.push_back("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as Megatron's "
                       "aux-loss-free routing)");
      if (cfg.moe_router_topk == 1 && !cfg.moe_router_pre_softmax && !cfg.sigmoid_router())
        errs.push_back("--moe-router-topk 1: a softmax over one chosen logit is always 1 and the router would learn "
                       "nothing from the language-model loss; add --moe-router-pre-softmax (as Megatron requires)");
      if (opt.tp > 1 && !opt.sequence_parallel)
        errs.push_back("--num-experts with --tensor-model-parallel-size > 1 needs --sequence-parallel (Megatron "
                       "warns it must be used: without it every TP rank routes the same tokens, and its load-balancing "
                       "and z-losses count them TP times)");
      if (opt.ep < 1 || opt.ep_rank < 0 || opt.ep_rank >= opt.ep)
        errs.push_back(fmt::format("expert-parallel rank {} outside [0, {})", opt.ep_rank, opt.ep));
      else if (cfg.num_experts % opt.ep)
        errs.push_back(fmt::format("--num-experts {} is not divisible by --expert-model-parallel-size {}",
                                   cfg.num_experts, opt.ep));
      if (opt.tp > 1 && cfg.moe_shared_expert_intermediate_size % opt.tp)
        errs.push_back(fmt::format("--moe-shared-expert-intermediate-size {} is not divisible by "
                                   "--tensor-model-parallel-size {}",
                                   cfg.moe_shared_expert_intermediate_size, opt.tp));
      if (opt.moe_capacity_segments < 0 ||
          (opt.moe_capacity_segments > 0 && (opt.micro_batch * T) % opt.moe_capacity_segments))
        errs.push_back(fmt::format("GPTOptions::moe_capacity_segments {} does not divide the {} rows of a micro-batch",
                                   opt.moe_capacity_segments, opt.micro_batch * T));
      const int64_t etp = opt.etp ? opt.etp : opt.tp;
      if (etp != opt.tp && etp != 1)
        errs.push_back(fmt::format("--expert-tensor-parallel-size {} with --tensor-model-parallel-size {}: the experts "
                                   "are split over TP (the default, ETP = TP) or held whole (ETP 1); other sizes are not "
                                   "implemented (fix: drop the flag, or give 1)",
                                   etp, opt.tp));
      if (etp == 1 && opt.tp > 1 && opt.moe_capacity_segments > 0)
        errs.push_back("GPTOptions::moe_capacity_segments is for a model routing every row (not ETP 1 under TP, where "
                       "each rank's rows are one segment)");
      if (opt.tp > 1 && etp == opt.tp && cfg.moe_ffn() % opt.tp)
        errs.push_back(fmt::format("--moe-ffn-hidden-size {} is not divisible by --tensor-model-parallel-size {}",
                                   cfg.moe_ffn(), opt.tp));
    }
    if (cfg.squared_relu && cfg.swiglu) errs.push_back("--squared-relu and --swiglu are two MLP activations: give one");
    if (cfg.squared_relu && cfg.bias_gelu_fusion && cfg.add_bias_linear)
      errs.push_back("--squared-relu: Megatron's fused bias-activation (on by default) takes only GELU and SwiGLU and "
                     "refuses it; add --no-bias-gelu-fusion (or --disable-bias-linear)");
  }
  if (opt.tp < 1 || opt.tp_rank < 0 || opt.tp_rank >= opt.tp)
    errs.push_back(fmt::format("tensor-parallel rank {} outside [0, {})", opt.tp_rank, opt.tp));
  if (opt.tp > 1 && cfg.has_architecture()) {
    const int64_t tp = opt.tp;
    if (cfg.num_attention_heads % tp)
      errs.push_back(fmt::format("--num-attention-heads {} is not divisible by --tensor-model-parallel-size {}",
                                 cfg.num_attention_heads, tp));
    if (cfg.query_groups() % tp)
      errs.push_back(fmt::format("--num-query-groups {} is not divisible by --tensor-model-parallel-size {}",
                                 cfg.query_groups(), tp));
    if (cfg.ffn() % tp && cfg.has_dense_layers())
      errs.push_back(fmt::format("--ffn-hidden-size {} is not divisible by --tensor-model-parallel-size {}{}", cfg.ffn(),
                                 tp, cfg.is_moe() ? " (the dense MLP of --moe-layer-freq's dense layers)" : ""));
    if (opt.sequence_parallel && T > 0 && T % tp)
      errs.push_back(opt.cp > 1 ? fmt::format("--sequence-parallel needs a CP rank's {} positions (--seq-length {} / "
                                              "--context-parallel-size {}) divisible by --tensor-model-parallel-size {}",
                                              T, Tg, opt.cp, tp)
                                : fmt::format("--sequence-parallel needs --seq-length {} divisible by "
                                              "--tensor-model-parallel-size {}",
                                              T, tp));
  }
  if (cfg.moe_shared_expert_intermediate_size > 0 && !cfg.is_moe())
    errs.push_back("--moe-shared-expert-intermediate-size needs --num-experts (the shared expert is part of an MoE layer)");
  if (cfg.moe_shared_expert_gate && !cfg.has_shared_expert())
    errs.push_back("--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size (it gates the shared expert)");
  if (opt.ep > 1 && !cfg.is_moe())
    errs.push_back(fmt::format("--expert-model-parallel-size {} needs --num-experts", opt.ep));
  if (opt.expert_flat_multiple < 1) errs.push_back("expert_flat_multiple must be at least 1");
  if (opt.micro_batch <= 0) errs.push_back("--micro-batch-size must be positive");
  if (opt.flat_multiple < 1) errs.push_back("flat_multiple must be at least 1");
  if (opt.slots < 0) errs.push_back("activation slots must be >= 0");
  if (opt.dtype != DType::kF32 && opt.dtype != DType::kF64) errs.push_back("model dtype must be fp32 or fp64");
  if (opt.half_compute && opt.dtype != DType::kF32) errs.push_back("16-bit compute needs fp32 parameters");
  if (opt.half_compute && opt.half != DType::kBF16 && opt.half != DType::kF16)
    errs.push_back(fmt::format("16-bit compute takes bf16 or fp16, not {}", dtype_name(opt.half)));
  if (opt.half_compute && opt.half == DType::kF16 && opt.device == Device::kCuda && !simdev::enabled())
    errs.push_back("--fp16: the CUDA kernels take bf16, not fp16, so far (use --bf16 on the GPU, or the CPU backend)");
  if (cfg.hidden_dropout >= 1 || cfg.attention_dropout >= 1) errs.push_back("dropout must be below 1");
  const RecomputeOptions& rc = opt.recompute;
  std::vector<LayerRange> chunks = opt.chunks;
  if (chunks.empty()) chunks.push_back({0, cfg.num_layers});
  int64_t K = 0;  // the largest chunk's layers
  for (size_t c = 0; c < chunks.size(); ++c) {
    K = std::max(K, chunks[c].count);
    if (chunks[c].first < 0 || chunks[c].count < 0 || chunks[c].first + chunks[c].count > cfg.num_layers ||
        (c > 0 && chunks[c].first < chunks[c - 1].first + chunks[c - 1].count))
      errs.push_back(fmt::format("model chunk {} (layers [{}, {})) is outside --num-layers {} or overlaps another", c,
                                 chunks[c].first, chunks[c].first + chunks[c].count, cfg.num_layers));
  }
  if (rc.granularity == RecomputeGranularity::kFull && cfg.num_layers > 0 && (rc.num_layers < 1 || rc.num_layers > K))
    errs.push_back(fmt::format("--recompute-num-layers {} must be between 1 and the layers of this stage ({})",
                               rc.num_layers, K));
  if (!errs.empty()) {
    std::string m = "invalid model configuration:";
    for (auto& e : errs) m += "\n  - " + e;
    return Status::invalid(m);
  }

  Tables t;
  t.opt = opt;
  t.opt.seq_length = Tg;
  const int64_t B = opt.micro_batch, N = B * T, h = cfg.hidden_size, a = cfg.num_attention_heads;
  const int64_t tp = opt.tp, al = a / tp, gl = cfg.query_groups() / tp, ad = al * cfg.head_dim(), F = cfg.ffn() / tp;
  const bool sp = opt.sequence_parallel && tp > 1;
  const int64_t Ns = sp ? N / tp : N;
  Dims& d = t.dims;
  d = Dims{N, Ns, B, T, h, al, ad, (al + 2 * gl) * cfg.head_dim(), (cfg.swiglu ? 2 : 1) * F, F,
           cfg.padded_vocab(tp) / tp, opt.dtype, cfg.normalization == Normalization::kLayerNorm};
  d.gemm_in = opt.half_compute ? opt.half : opt.dtype;
  d.rs = ::mt::model::residual_dtype(opt);
  d.dn = tp == 1 ? d.rs : opt.dtype;
  d.ln = cfg.apply_residual_connection_post_layernorm ? d.rs : d.gemm_in;
  d.mid = d.gemm_in;
  d.g = gl, d.hd = cfg.head_dim(), d.qk = cfg.qk_layernorm;
  d.cp = opt.cp, d.Tg = Tg;
  if (cfg.mla()) {
    d.mla = true, d.ql = cfg.q_lora_rank.value_or(0), d.kl = cfg.kv_lora_rank, d.dr = cfg.qk_pos_emb_head_dim;
    d.qw = al * cfg.head_dim(), d.kvw = al * (cfg.qk_head_dim + cfg.v_head_dim), d.pw = al * cfg.v_head_dim;
  }
  d.doc = opt.reset_attention_mask, d.pos_ids = opt.reset_position_ids;
  d.R = N;
  d.Fd = F, d.fc1d = (cfg.swiglu ? 2 : 1) * F;
  d.Lr = N;
  if (cfg.is_moe()) {
    d.xlocal = tp > 1 && opt.etp == 1;
    d.Lr = d.xlocal ? Ns : N;
    d.moe = true, d.E = cfg.num_experts, d.topk = cfg.moe_router_topk, d.R = d.Lr * d.topk;
    d.F = cfg.moe_ffn() / (d.xlocal ? 1 : tp), d.fc1 = (cfg.swiglu ? 2 : 1) * d.F;
    d.ep = opt.ep;
    d.S = cfg.moe_shared_expert_intermediate_size / tp, d.sfc1 = (cfg.swiglu ? 2 : 1) * d.S;
    d.lbG = cfg.seq_aux_loss() ? B : 1;
    d.jitter = cfg.jitters_router_input();
  }
  d.Rx = d.ep > 1 ? d.ep * d.Lr * std::min(d.topk, d.E / d.ep) : d.R;
  d.kept = d.R;
  if (cfg.drops_tokens()) {
    d.drops = true, d.segs = opt.moe_capacity_segments > 0 ? opt.moe_capacity_segments : d.Lr / Ns;
    d.cap = cfg.moe_capacity(d.Lr / d.segs);
    // An expert keeps at most a segment's tokens (one slot each); E segs that
    // bounds what one rank sends (with R) and what one rank's experts receive
    // from every EP source (with the dropless Rx, not R: a rank may receive
    // more than it sends).
    const int64_t ecap = d.E * d.segs * std::min(d.cap, d.Lr / d.segs);
    d.kept = std::min(d.R, ecap), d.Rx = std::min(d.Rx, ecap);
  }
  const DType dt = opt.dtype;
  const int64_t L = K;  // layer positions in a slot
  t.chunks = chunks;

  // Parameters (and gradients: the same table), and the bf16 GEMM weights:
  // the layers of this rank's chunks, the embedding on the first stage, the
  // final norm and output layer on the last (tied: the word embedding).
  auto holds_layer = [&](int64_t l) {
    for (const LayerRange& c : chunks)
      if (l >= c.first && l < c.first + c.count) return true;
    return false;
  };
  for (ParamSpec& s : gpt_param_specs(cfg, opt.tp)) {
    bool keep = false;
    if (s.layer >= cfg.num_layers) keep = opt.post_process;  // an MTP depth's: the last stage's
    else if (s.layer >= 0) keep = holds_layer(s.layer);
    else if (s.name == "embedding.word_embeddings.weight")  // the last stage's copy: tied, or MTP's embedding
      keep = opt.pre_process || (opt.post_process && (!cfg.untie_embeddings_and_output_weights || cfg.mtp_layers()));
    else if (s.name.rfind("embedding.", 0) == 0) keep = opt.pre_process;
    else keep = opt.post_process;  // final norm, output layer
    // Expert parallelism: this rank's experts only.
    if (s.expert >= 0 && s.expert / (cfg.num_experts / opt.ep) != opt.ep_rank) keep = false;
    if (keep) t.specs.push_back(std::move(s));
  }
  // The routed experts' parameters last (their own region of the flat buffers).
  std::stable_partition(t.specs.begin(), t.specs.end(), [](const ParamSpec& s) { return s.expert < 0; });
  // The routed experts are split over the expert TP group: TP, or none (ETP 1).
  auto local_shape = [&](const ParamSpec& s) { return s.local_shape(s.expert >= 0 && d.xlocal ? 1 : opt.tp); };
  for (const ParamSpec& s : t.specs) (s.expert < 0 ? t.params : t.expert_params).add(s.name, local_shape(s), dt);
  if (opt.half_compute)
    for (size_t i = 0; i < t.specs.size(); ++i) {
      const Shape sh = local_shape(t.specs[i]);
      if (sh.ndim == 2 && t.specs[i].name != "embedding.position_embeddings.weight") {
        t.lowp.add(t.specs[i].name, sh, opt.half);
        t.lowp_which.push_back(static_cast<int>(i));
      }
    }

  // Activations of one slot, following each chunk's recompute groups (a slot
  // keeps what any chunk it may hold keeps, position by position).
  // Each position's LayerKinds (0: not kept), in the slot and in the
  // recompute workspace, and those of every layer this rank holds.
  // Selective recomputation: attention's output (core_attn) and the experts'
  // activation output (moe_act) are not kept.
  const bool selective = rc.recomputes_attention(), moe_act = rc.recomputes_moe_act();
  std::vector<char> keep_resid(static_cast<size_t>(L + 1), 0);
  std::vector<int> keep_layer(static_cast<size_t>(L), 0), ws_kinds;
  int held_kinds = 0;
  auto kind = [&](int64_t l) { return cfg.is_moe_layer(l) ? kMoeLayer : kDenseLayer; };
  int64_t max_group = 0;
  for (const LayerRange& c : chunks) {
    t.groups.push_back(layer_groups(c.count, rc));
    keep_resid[static_cast<size_t>(c.count)] = 1;  // the chunk's output (final norm input, or sent on)
    for (const LayerGroup& g : t.groups.back()) {
      keep_resid[static_cast<size_t>(g.begin)] = 1;
      if (g.recompute) max_group = std::max(max_group, g.end - g.begin);
      if (g.recompute && ws_kinds.size() < static_cast<size_t>(g.end - g.begin))
        ws_kinds.resize(static_cast<size_t>(g.end - g.begin), 0);
      for (int64_t l = g.begin; l < g.end; ++l) {
        held_kinds |= kind(c.first + l);
        (g.recompute ? ws_kinds[static_cast<size_t>(l - g.begin)] : keep_layer[static_cast<size_t>(l)]) |= kind(c.first + l);
      }
    }
  }
  keep_resid[0] = 1;  // the chunk's input
  // --mtp-num-layers: the last stage's MTP layers keep everything (as a
  // group of one; not recomputed under full granularity).
  const int64_t D = opt.post_process ? cfg.mtp_layers() : 0;
  if (D) held_kinds |= kind(cfg.num_layers);
  SizeTable& at = t.acts;
  ActIndex& ai = t.act;
  ai.tokens = at.add("tokens", {N}, DType::kI32);
  ai.labels = at.add("labels", {N}, DType::kI32);
  if (d.doc) ai.doc_start = at.add("doc_start", {B * Tg}, DType::kI32);
  // Position ids feed the learned position embedding only: Megatron's RoPE
  // rotates by sequence index whatever the ids (GPTModel::forward_chunk).
  if (d.pos_ids && cfg.position_embedding == PositionEmbedding::kLearnedAbsolute && opt.pre_process)
    ai.positions = at.add("positions", {N}, DType::kI32);
  ai.resid.assign(static_cast<size_t>(L + 1), -1);
  for (int64_t l = 0; l <= L; ++l)
    if (keep_resid[static_cast<size_t>(l)]) ai.resid[static_cast<size_t>(l)] = at.add(fmt::format("resid.{}", l), {Ns, h}, d.rs);
  ai.layers.assign(static_cast<size_t>(L), FieldIdx{});
  for (int64_t l = 0; l < L; ++l) {
    FieldIdx& f = ai.layers[static_cast<size_t>(l)];
    f.fill(-1);
    if (keep_layer[static_cast<size_t>(l)])
      f = add_layer(at, fmt::format("layers.{}.", l), d, !selective, keep_layer[static_cast<size_t>(l)], !moe_act,
                    !rc.recomputes_mla_up());
  }
  if (opt.post_process) {
    ai.lnf = at.add("final.ln", {N, h}, d.gemm_in);
    if (d.layernorm) ai.lnf_mean = at.add("final.mean", {Ns}, dt);
    ai.lnf_rstd = at.add("final.rstd", {Ns}, dt);
    ai.logits = at.add("logits", {N, d.V}, dt);
    ai.mx = at.add("xent.max", {N}, dt);
    ai.se = at.add("xent.sumexp", {N}, dt);
    ai.tl = at.add("xent.target", {N}, dt);
    ai.loss = at.add("xent.loss", {N}, dt);
  }
  for (int64_t j = 0; j < D; ++j) {
    ActIndex::Mtp m;
    const std::string p = fmt::format("mtp.{}.", j);
    m.tokens = at.add(p + "tokens", {N}, DType::kI32);
    m.labels = at.add(p + "labels", {N}, DType::kI32);
    m.emb = at.add(p + "emb", {Ns, h}, d.rs);
    if (d.layernorm) m.e_mean = at.add(p + "enorm.mean", {Ns}, dt);
    m.e_rstd = at.add(p + "enorm.rstd", {Ns}, dt);
    if (d.layernorm) m.h_mean = at.add(p + "hnorm.mean", {Ns}, dt);
    m.h_rstd = at.add(p + "hnorm.rstd", {Ns}, dt);
    m.cat = at.add(p + "cat", {N, 2 * h}, d.gemm_in);
    m.x = at.add(p + "x", {Ns, h}, d.rs);
    m.layer = add_layer(at, p + "layer.", d, !selective, kind(cfg.num_layers + j), !moe_act, !rc.recomputes_mla_up());
    m.y = at.add(p + "y", {Ns, h}, d.rs);
    m.lnf = at.add(p + "final.ln", {N, h}, d.gemm_in);
    if (d.layernorm) m.f_mean = at.add(p + "final.mean", {Ns}, dt);
    m.f_rstd = at.add(p + "final.rstd", {Ns}, dt);
    m.logits = at.add(p + "logits", {N, d.V}, dt);
    m.mx = at.add(p + "xent.max", {N}, dt);
    m.se = at.add(p + "xent.sumexp", {N}, dt);
    m.tl = at.add(p + "xent.target", {N}, dt);
    m.loss = at.add(p + "xent.loss", {N}, dt);
    ai.mtp.push_back(m);
  }

  // The recompute workspace: the largest recomputed group, everything kept.
  for (int64_t i = 0; i < max_group; ++i) {
    t.ws_layers.push_back(add_layer(t.workspace, fmt::format("recompute.{}.", i), d, true, ws_kinds[static_cast<size_t>(i)]));
    if (i + 1 < max_group) t.ws_resid.push_back(t.workspace.add(fmt::format("recompute.resid.{}", i + 1), {Ns, h}, d.rs));
  }

  if (cfg.applies_rope()) {
    t.rope.add("rope.cos", {T, cfg.rotary_dim() / 2}, dt);  // this rank's positions
    t.rope.add("rope.sin", {T, cfg.rotary_dim() / 2}, dt);
  }
  if (cfg.apply_layernorm_1p) {  // --apply-layernorm-1p: a row of ones and the 1 + gamma each norm uses
    const int64_t widest = !cfg.qk_layernorm ? h
                           : cfg.mla()      ? std::max({h, cfg.kv_lora_rank, cfg.q_lora_rank.value_or(0)})
                                            : std::max(h, cfg.head_dim());
    t.rope.add("norm1p.ones", {widest}, dt);
    t.rope.add("norm1p.weight", {widest}, dt);
  }
  // --moe-router-enable-expert-bias: each held MoE layer's bias [E], then the
  // update's counts buffer (GPTModel::update_expert_bias).
  if (cfg.has_expert_bias()) {
    int64_t held = 0;
    for (int64_t l : held_layers(cfg, chunks, opt.post_process))
      if (cfg.is_moe_layer(l)) t.rope.add(fmt::format("expert_bias.{}", l), {d.E}, dt), ++held;
    t.rope.add("expert_bias.counts", {held, d.E}, dt);
  }
  // --moe-shared-expert-gate: the rows 0..N-1 as an [N, 1] dispatch map, the
  // identity the gate's row scaling runs through (kernels::moe_unpermute).
  d.gate = cfg.has_shared_expert() && cfg.moe_shared_expert_gate && (held_kinds & kMoeLayer);
  if (d.gate) t.rope.add("shared_gate.rows", {N, 1}, DType::kI32);

  // Scratch: the peak of the allocations forward() and backward() make, in
  // the order they make them (each rounded up by Arena::alloc).
  const bool bf = opt.half_compute;
  const DType hb = opt.half;
  const size_t ws = t.workspace.total_bytes();
  // linear_fwd casts an fp32 input (ln1/ln2 when the residual is taken from
  // them); linear_bwd casts an fp32 dy (the residual gradient into fc2 and
  // proj, fp32 with --fp32-residual-connection) and an fp32 x (ln1/ln2
  // again). ctx, act, dqkv and dfc1 are bf16.
  const size_t ln_cast = d.ln == hb ? 0 : abytes(N * h, hb);
  const size_t cast_fwd = bf ? ln_cast : 0;
  const size_t cast_bwd = bf ? std::max(d.rs == hb ? 0 : abytes(N * h, hb), ln_cast) : 0;
  const size_t attn_tmp = selective ? abytes(N * ad, d.mid) + abytes(B * d.a * T, dt) : 0;  // ctx, lse
  // With sequence parallelism: one full-sequence [N, h] buffer for the
  // all-gathered / not yet reduce-scattered side of a collective.
  const size_t full = sp ? abytes(N * h, dt) : 0;
  // --qk-layernorm: the normalised heads in forward; d(normalised) and d(raw) in backward.
  const size_t qk_heads = d.qk && !d.mla ? abytes(d.qk_rows() * d.hd, d.mid) : 0;
  // Context parallelism: core attention's all-gathered Q/K/V, in the CP
  // group's rank order and in sequence order (forward); backward adds the
  // whole sequence's dqkv (model dtype) and then, with the Q/K/V freed, the
  // same in rank order for the reduce-scatter, and the scattered rows in
  // the model dtype when dqkv is bf16 (GPTModel::attention_fwd/_bwd).
  const int64_t Ng = B * Tg;
  const size_t cp_fwd = opt.cp > 1 ? 2 * abytes(Ng * d.qkv, d.mid) : 0;
  const size_t cp_bwd = opt.cp > 1 ? abytes(Ng * d.qkv, dt) + std::max(2 * abytes(Ng * d.qkv, d.mid),
                                                                       abytes(Ng * d.qkv, dt) +
                                                                           (d.mid != dt ? abytes(N * d.qkv, dt) : 0))
                                   : 0;
  // --num-experts: the router's logits [N, E] (then [E] vectors of its
  // statistics), and the combined [N, h] before the SP reduce-scatter
  // (GPTModel::moe_forward).
  // Expert parallelism (scopes after the logits'): the counts received [E]
  // int32 and the permuted slots to send [N k, h]; then the experts'
  // outputs to send back [Rx, h].
  const size_t ep_fwd =
      d.ep > 1 ? std::max(abytes(d.E, DType::kI32) + abytes(d.R * h, d.ln), abytes(d.Rx * h, dt)) : 0;
  // The shared expert's output [N, h] beside the combined routed outputs
  // (ETP 1 under TP: beside its reduce-scattered rows [Ns, h] instead).
  // (--moe-shared-expert-gate: then its gate [N, 1] and the gated output [N, h].)
  const size_t shared_fwd = d.S ? abytes(N * h, dt) + (d.gate ? abytes(N, dt) + abytes(N * h, dt) : 0) : 0;
  const size_t combine_fwd = d.xlocal ? (d.S ? shared_fwd + abytes(Ns * h, dt) : 0) : full + shared_fwd;
  // With token dropping the kept choices [Lr, k] int32 beside the logits.
  // With --moe-input-jitter-eps the jittered router input [Lr, h] before them.
  const size_t route_fwd = (d.jitter ? abytes(d.Lr * h, d.ln) : 0) + abytes(d.Lr * d.E, dt) +
                           (d.drops ? abytes(d.Lr * d.topk, DType::kI32) : 0);
  // The router's statistics (GPTModel::moe_record_losses): the scores'
  // column sums [G E], and ETP 1 under TP their fp64 all-reduce buffer.
  const size_t record_fwd = abytes(d.lbG * d.E, dt) +
                            (d.xlocal ? abytes(2 * d.lbG * d.E + 1 + (cfg.has_expert_bias() ? d.E : 0), DType::kF64) : 0);
  // --recompute-modules moe_act: the experts' activation output [Rx, F] in
  // scratch while fc2 reads it (with EP beside the outputs to send back).
  const size_t act_fwd =
      moe_act ? abytes(mlp_shape(kAct, d, true).numel(), d.gemm_in) + (d.ep > 1 ? abytes(d.Rx * h, dt) : 0) : 0;
  const size_t moe_fwd = held_kinds & kMoeLayer ? std::max({route_fwd, ep_fwd, combine_fwd, record_fwd, act_fwd}) : 0;
  // --multi-latent-attention: GPTModel::mla_fwd/mla_bwd's buffers and
  // linear_proj's value dims of ctx, replayed in the order they take and free
  // them (each linear's bf16 casts of fp32 operands and SP's full-sequence
  // buffer free as it returns).
  size_t mla_fwd = 0, mla_bwd = 0;
  // --recompute-modules mla_up_proj: a kept layer's Q/K/V in scratch for the
  // whole of its forward and backward, and backward's recompute of the up
  // projections before anything else of the attention's.
  const bool mla_up = d.mla && rc.recomputes_mla_up();
  const size_t qkv_scratch = mla_up ? abytes(N * d.qkv, d.mid) : 0;
  size_t mla_up_bwd = 0;
  if (d.mla) {
    struct Stack {
      size_t used = 0, peak = 0;
      void take(size_t b) { used += b, peak = std::max(peak, used); }
      void brief(size_t b) { peak = std::max(peak, used + b); }  // taken and freed at once
    };
    const auto cast = [&](int64_t n, DType from) { return bf && from != hb ? abytes(n, hb) : size_t{0}; };
    const int64_t dr = d.dr;
    const size_t x_own = cast(Ns * h, d.ln);  // a down projection's input, this rank's ln1 rows
    // Column-parallel backward: SP's full-sequence dx (the model dtype), then the casts.
    const auto column_bwd = [&](int64_t width, size_t casts) { return (sp ? abytes(N * width, dt) : 0) + casts; };
    Stack f;
    if (d.ql) f.brief(x_own);                                         // q_down's input cast
    if (!mla_up) f.take(abytes(N * dr, d.mid));                       // the position key (else kept)
    f.brief(x_own);                                                   // kv_down's two products
    // The up projections (GPTModel::mla_up_fwd), in forward and in the recompute.
    Stack up;
    up.take(abytes(N * d.qw, d.mid));                                 // q
    up.brief(d.ql ? 0 : cast(N * h, d.ln));                           // linear_q_proj's input cast
    up.take(abytes(N * d.kvw, d.mid));                                // kv
    f.brief(up.peak);
    mla_up_bwd = mla_up ? up.peak : 0;
    Stack proj;
    proj.take(abytes(N * d.pw, d.mid));                               // ctx's value dims
    proj.brief(full);                                                 // row-parallel output before reduction
    mla_fwd = std::max(f.peak, proj.peak);
    Stack b;
    b.take(2 * abytes(N * d.pw, d.mid));                              // ctx's value dims and their gradient
    b.brief((sp ? abytes(N * h, d.rs) : 0) + cast(N * h, d.rs));      // the gathered dy and its cast
    Stack m;
    m.take(abytes(N * d.qw, d.mid) + abytes(N * d.kvw, d.mid) + abytes(N * dr, dt));  // dq, dkv, d(position key)
    if (sp) m.take(abytes(Ns * dr, dt));                                              // its reduce-scattered rows
    if (d.ql) {
      m.take(abytes(Ns * d.ql, d.dn));                                // d(cq)
      m.brief(column_bwd(d.ql, 0));
      if (d.qk) m.take(abytes(Ns * d.ql, d.mid));                     // d(cq before its norm)
      m.brief((d.qk ? 0 : cast(Ns * d.ql, d.dn)) + x_own);            // q_down's backward casts
    } else {
      m.brief(column_bwd(h, cast(N * h, d.ln)));                      // linear_q_proj's backward
    }
    m.take(abytes(Ns * d.kl, d.dn));                                  // d(ckv)
    m.brief(column_bwd(d.kl, 0));
    if (d.qk) m.take(abytes(Ns * d.kl, d.mid));                       // d(ckv before its norm)
    m.brief((d.qk ? 0 : cast(Ns * d.kl, d.dn)) + x_own);              // kv_down's rows [0, kl)
    m.brief(cast(Ns * dr, dt) + x_own);                               // and [kl, kl + dr)
    mla_bwd = std::max(b.peak, m.peak);
  }
  const size_t layer_fwd_kept = abytes(Ns * h, dt) + attn_tmp + qkv_scratch + qk_heads + std::max({full + cast_fwd, cp_fwd, moe_fwd, mla_fwd});  // tmp (+ ctx, lse, MLA's qkv) + full + cast
  const size_t layer_fwd_ws = abytes(Ns * h, dt) + qk_heads + std::max({full + cast_fwd, cp_fwd, moe_fwd, mla_fwd});
  // Backward's transients after the layer's own buffers: each linear's
  // full-sequence buffer (SP) and bf16 casts, freed as it returns; the q/k
  // norm's two buffers are taken after linear_proj's backward, so only
  // linear_qkv's backward (its ln1 cast) comes on top of them.
  // --num-experts: GPTModel::moe_backward's buffers, none freed before the
  // router's: the gathered dy (SP), d(experts' outputs) and d(probs), d(xp),
  // the combined d(ln2) before the SP reduce-scatter, the load-balancing
  // weights, d(logits) of this rank's rows, the router's dx, its bf16 cast
  // of d(logits) under --bf16, and with the sigmoid router its logits of
  // this rank's rows again.
  // Expert parallelism adds the received d(outputs) [Rx, h] and the d(xp)
  // sent back [N k, h].
  // ETP 1 under TP: dy gathered, and the shared expert's d(ln2) scattered
  // ([Ns, h]), only with a shared expert; no combined d(ln2).
  const bool gathers_dy = sp && (!d.xlocal || d.S);
  const size_t combine_bwd = d.xlocal ? (d.S ? abytes(Ns * h, dt) : 0) : sp ? abytes(N * h, dt) : 0;
  const size_t moe_bwd = held_kinds & kMoeLayer ? (gathers_dy ? abytes(N * h, d.rs) : 0) + abytes(d.R * h, d.mid) + abytes(d.Rx * h, d.mid) +
                                     (d.ep > 1 ? abytes(d.Rx * h, d.mid) + abytes(d.R * h, d.mid) : 0) +
                                     abytes(d.Lr * d.topk, dt) +
                                     (cfg.sigmoid_router() ? abytes(Ns * d.E, dt) : 0) +  // the router's logits again
                                     // the shared expert: d(act), d(fc1), its d(ln2)
                                     (d.S ? abytes(N * d.S, d.mid) + abytes(N * d.sfc1, d.mid) +
                                                abytes(N * h, sp ? dt : d.dn)
                                          : 0) +
                                     // its gate: g, the ungated output, d(g), the gated d(output) and d(ln2)
                                     // of this rank's rows (its GEMM's bf16 cast of d(logit) [Ns, 1] is
                                     // freed at once, below the router's later [Ns, E] cast)
                                     (d.gate ? 2 * abytes(N, dt) + abytes(N * h, dt) + abytes(N * h, d.rs) +
                                                   abytes(Ns * h, d.dn)
                                             : 0) +
                                     combine_bwd + abytes(d.lbG * d.E, dt) + abytes(Ns * d.E, dt) +
                                     // (--recompute-modules moe_act: the recomputed activation output)
                                     (moe_act ? abytes(mlp_shape(kAct, d, true).numel(), d.gemm_in) : 0) +
                                     abytes(Ns * h, d.dn) + (bf ? abytes(Ns * d.E, hb) : 0) +
                                     (d.jitter ? abytes(Ns * h, d.ln) : 0)  // the jittered router input again
                               : 0;
  // d(act) and d(fc1) of the layer's kind; an MoE layer's buffers after them.
  size_t layer_bwd = 0;
  for (const bool moe : {false, true})
    if (held_kinds & (moe ? kMoeLayer : kDenseLayer))
      layer_bwd = std::max(
          layer_bwd,
          abytes(Ns * h, d.rs) + abytes(Ns * h, d.dn) + abytes(mlp_shape(kAct, d, moe).numel(), d.mid) +
              abytes(mlp_shape(kFc1, d, moe).numel(), d.mid) + abytes(N * ad, d.mid) + abytes(N * d.qkv, d.mid) +
              qkv_scratch +
              std::max(mla_up_bwd,
                       attn_tmp + std::max({full + std::max(cast_bwd, d.qk ? (bf ? ln_cast : 0) + 2 * qk_heads : 0),
                                            cp_bwd, moe ? moe_bwd : 0, mla_bwd})));
  bool any_kept = false;
  for (int k : keep_layer) any_kept = any_kept || k;
  const size_t fwd_layers = L == 0 ? 0 : ws + std::max(max_group ? layer_fwd_ws : 0, any_kept ? layer_fwd_kept : 0);
  const size_t fwd_out = std::max(full, tp > 1 ? abytes(N, dt) : 0);  // the final norm output is bf16 already
  const size_t bwd_base = abytes(Ns * h, d.dn) + abytes(Ns * h, d.rs);  // dlnf, dresid
  const size_t bwd_out = abytes(N, dt) + full + (bf ? abytes(N * d.V, hb) : 0);  // dloss, SP's dx, bf16 dlogits
  const size_t bwd_layers = L == 0 ? 0 : ws + std::max(max_group ? layer_fwd_ws : 0, layer_bwd);
  // --reset-position-ids with learned positions: the first stage gathers
  // each own row's position embedding ([Ns, h]) before adding it.
  const size_t emb_fwd =
      d.pos_ids && opt.pre_process && cfg.position_embedding == PositionEmbedding::kLearnedAbsolute ? abytes(Ns * h, dt) : 0;
  // --mtp-num-layers (GPTModel::mtp_forward/_backward), per depth. Forward:
  // the embedding before its SP reduce-scatter; a norm output before it is
  // copied into eh_proj's input; with TP eh_proj's own columns and the
  // all-gathered ones; the layer; the loss's global max. Backward, beside
  // d(h_k) from the next depth: d(lnf_k) and d(y), then the loss's
  // backward, the layer's, or d(cat) with eh_proj's backward (with TP this
  // rank's columns of d(x), SP gathering them first; SP's full dx; the bf16
  // cast of d(x)) and then d(norm input) with the embedding's gathered d (SP).
  size_t mtp_fwd = 0, mtp_bwd = 0;
  if (D) {
    const int64_t w = h / tp;
    const size_t rs_cast = bf && d.rs != hb ? 1 : 0;
    mtp_fwd = std::max({sp ? abytes(N * h, d.rs) : 0, abytes(Ns * h, d.gemm_in),
                        tp > 1 ? abytes(N * w, d.rs) + abytes(N * h, d.rs) : 0, layer_fwd_kept,
                        tp > 1 ? abytes(N, dt) : 0});
    const size_t eh_bwd = tp > 1 ? abytes(N * w, d.rs) + std::max(sp ? abytes(N * h, d.rs) : 0,
                                                                  (sp ? abytes(N * 2 * h, d.dn) : 0) +
                                                                      rs_cast * abytes(N * w, hb))
                                 : rs_cast * abytes(N * h, hb);
    const size_t after_layer = abytes(Ns * 2 * h, d.dn) +
                               std::max(eh_bwd, abytes(Ns * h, d.dn) + (sp ? abytes(N * h, d.rs) : 0));
    mtp_bwd = abytes(Ns * h, d.gemm_in) + abytes(Ns * h, d.dn) + abytes(Ns * h, d.rs) +
              std::max({bwd_out, layer_bwd, after_layer});
  }
  const size_t forward_peak = std::max({fwd_layers, fwd_out, emb_fwd, mtp_fwd});
  const size_t backward_peak = bwd_base + std::max({bwd_out, bwd_layers, full, mtp_bwd});

  GPTMemoryPlan& p = t.plan;
  // A whole number of elements per DP rank and of arena alignment units (the
  // arena rounds its capacity up to kArenaAlign).
  const size_t flat_unit = std::lcm(static_cast<size_t>(std::max<int64_t>(1, opt.flat_multiple)) * dtype_size(dt),
                                    kArenaAlign);
  const size_t expert_unit = std::lcm(
      static_cast<size_t>(std::max<int64_t>(1, opt.expert_flat_multiple)) * dtype_size(dt), kArenaAlign);
  t.dense_flat_bytes = (t.params.total_bytes() + flat_unit - 1) / flat_unit * flat_unit;
  const size_t flat_bytes =
      t.dense_flat_bytes + (t.expert_params.total_bytes() + expert_unit - 1) / expert_unit * expert_unit;
  p.params = flat_bytes;
  p.expert_params = flat_bytes - t.dense_flat_bytes;
  p.grads = opt.slots > 0 ? flat_bytes : 0;
  p.lowp = t.lowp.total_bytes();
  p.activations_per_slot = opt.slots > 0 ? t.acts.total_bytes() : 0;
  p.activations = p.activations_per_slot * static_cast<size_t>(opt.slots);
  p.recompute_workspace = opt.slots > 0 ? ws : 0;
  p.scratch = opt.slots > 0 ? std::max(forward_peak, backward_peak) : 0;
  p.tables = t.rope.total_bytes();
  return t;
}

Result<GPTMemoryPlan> GPTModel::planned_bytes(const ModelConfig& cfg, const GPTOptions& opt) {
  auto t = make_tables(cfg, opt);
  if (!t.is_ok()) return t.status();
  return t->plan;
}

Result<GPTCommPlan> GPTModel::planned_comm(const ModelConfig& cfg, const GPTOptions& opt) {
  auto t = make_tables(cfg, opt);
  if (!t.is_ok()) return t.status();
  GPTCommPlan c;
  const Dims& d = t->dims;
  // The MoE layers of group g of chunk k (--moe-layer-freq: not every layer).
  auto moe_layers = [&](size_t k, const LayerGroup& g) {
    double n = 0;
    for (int64_t l = g.begin; l < g.end; ++l) n += cfg.is_moe_layer(t->chunks[k].first + l) ? 1 : 0;
    return n;
  };
  if (opt.cp > 1) {
    // Per layer: the all-gathered Q/K/V (the output, in their stored dtype)
    // in forward and again in backward, then the reduce-scattered gradient
    // (the input, model dtype); recomputation gathers once more per layer
    // whose attention it re-runs (selective: every layer; full: the layers
    // of recomputed groups).
    const double gather = static_cast<double>(d.B * d.Tg * d.qkv) * static_cast<double>(dtype_size(d.mid));
    const double scatter = static_cast<double>(d.B * d.Tg * d.qkv) * static_cast<double>(dtype_size(d.dt));
    const bool selective = opt.recompute.recomputes_attention();
    for (size_t k = 0; k < t->groups.size(); ++k)
      for (const LayerGroup& g : t->groups[k]) {
        const double n = static_cast<double>(g.end - g.begin);
        c.cp_forward_bytes += n * gather;
        c.cp_backward_bytes += n * (gather + scatter) + (selective || g.recompute ? n * gather : 0.0);
        // --num-experts: each MoE layer's forward sums its expert counts over
        // CP (the load-balancing loss needs the micro-batch's; per sequence
        // under seq_aux_loss: [B, E]), recomputed too.
        const double counts =
            moe_layers(k, g) * static_cast<double>(d.lbG * d.E * static_cast<int64_t>(dtype_size(d.dt)));
        c.cp_forward_bytes += counts;
        c.cp_backward_bytes += g.recompute ? counts : 0.0;
      }
    // The MTP layers (last stage; never recomputed, selective aside).
    for (int64_t l = cfg.num_layers; opt.post_process && l < cfg.total_layers(); ++l) {
      const double counts = cfg.is_moe_layer(l) ? static_cast<double>(d.lbG * d.E * static_cast<int64_t>(dtype_size(d.dt))) : 0.0;
      c.cp_forward_bytes += gather + counts;
      c.cp_backward_bytes += gather + scatter + (selective ? gather : 0.0);
    }
  }
  if (d.moe && d.ep > 1) {
    const double slots = static_cast<double>(d.kept * d.h);  // every slot the router keeps (all: dropless)
    const double fwd = static_cast<double>(4 * d.E) + slots * static_cast<double>(dtype_size(d.ln) + dtype_size(d.dt));
    const double bwd = 2 * slots * static_cast<double>(dtype_size(d.mid));
    for (size_t k = 0; k < t->groups.size(); ++k)
      for (const LayerGroup& g : t->groups[k]) {
        const double n = moe_layers(k, g);
        c.ep_forward_bytes += n * fwd;
        c.ep_backward_bytes += n * bwd + (g.recompute ? n * fwd : 0.0);
      }
    for (int64_t l = cfg.num_layers; opt.post_process && l < cfg.total_layers(); ++l)
      if (cfg.is_moe_layer(l)) c.ep_forward_bytes += fwd, c.ep_backward_bytes += bwd;
  }
  if (opt.tp <= 1) return c;
  const double act = static_cast<double>(d.N * d.h) * static_cast<double>(dtype_size(d.dt));  // one [N, h]
  const double row = static_cast<double>(d.N) * static_cast<double>(dtype_size(d.dt));        // one [N]
  // The norm outputs a column-parallel layer all-gathers (bf16 under --bf16).
  const double act_ln = static_cast<double>(d.N * d.h) * static_cast<double>(dtype_size(d.ln));
  const double act_lnf = static_cast<double>(d.N * d.h) * static_cast<double>(dtype_size(d.gemm_in));
  // The residual stream and its gradient (bf16 under --bf16 without
  // --fp32-residual-connection): the embedding output, and with SP the
  // all-gathered dy of the row-parallel layers and of the embedding.
  const double act_rs = static_cast<double>(d.N * d.h) * static_cast<double>(dtype_size(d.rs));
  // Per layer forward: two row-parallel outputs (all-reduce, or SP reduce-
  // scatter; in the model dtype, before the residual add) and, with SP, two
  // all-gathered norm outputs. Backward: the column-parallel dx (all-reduce,
  // or SP reduce-scatter, in the model dtype: d.dn with TP) and, with SP,
  // the row-parallel layers' all-gathered dy.
  const bool sp = opt.sequence_parallel;
  // An MoE layer's the same, its experts' outputs combined before the
  // reduction; its backward also all-reduces d(probabilities) [N, k].
  const double dprobs = d.moe ? static_cast<double>(d.N * d.topk) * static_cast<double>(dtype_size(d.dt)) : 0.0;
  // --multi-latent-attention replaces ln1's gather (SP) and linear_qkv's dx
  // reduction: the up projections' inputs are gathered (cq, or ln1 for
  // linear_q_proj; ckv; the position key) and their dx reduced, with the
  // position key's gradient summed over the heads.
  double mla_fwd = 0, mla_bwd = 0;
  if (d.mla) {
    const double N = static_cast<double>(d.N), mid = static_cast<double>(dtype_size(d.mid)),
                 dtb = static_cast<double>(dtype_size(d.dt));
    const double q_in = d.ql ? N * static_cast<double>(d.ql) * mid : act_ln;
    if (sp) mla_fwd = q_in + N * static_cast<double>(d.kl + d.dr) * mid - act_ln;
    mla_bwd = (d.ql ? N * static_cast<double>(d.ql) * dtb : act) + N * static_cast<double>(d.kl + d.dr) * dtb - act;
  }
  const double layer_fwd = 2 * act + (sp ? 2 * act_ln : 0) + mla_fwd,
               layer_bwd = 2 * act + (sp ? 2 * act_rs : 0) + mla_bwd;
  // ETP 1 under TP (SP): an MoE layer's routed experts stay on this rank's
  // rows, so only the attention's collectives remain, plus one fp64
  // all-reduce of the router's statistics (GPTModel::moe_record_losses) and,
  // with a shared expert, its gathered ln2 and dy and its reduce-scattered
  // output and d(ln2).
  const double shared = d.S ? 1 : 0;
  const double stats = static_cast<double>(2 * d.lbG * d.E + 1 + (cfg.has_expert_bias() ? d.E : 0)) * 8.0;
  const double local_fwd = act + act_ln + shared * (act_ln + act) + stats + mla_fwd;
  const double local_bwd = act + act_rs + shared * (act_rs + act) + mla_bwd;
  struct LayerBytes {
    double fwd, bwd, tail;  // tail: the last collective, which a recomputed group's last layer skips
  };
  // --moe-shared-expert-gate: backward all-reduces d(gate) [N].
  const double gate = d.gate ? row : 0.0;
  auto layer_bytes = [&](int64_t l) -> LayerBytes {
    if (!cfg.is_moe_layer(l)) return {layer_fwd, layer_bwd, act};
    if (d.xlocal) return {local_fwd, local_bwd + gate, shared * act};
    return {layer_fwd, layer_bwd + dprobs + gate, act};
  };
  // A recomputed group re-runs its layers' forward in backward, the last
  // layer stopping before linear_fc2 (one row-parallel collective fewer).
  // Per micro-batch of every chunk this rank holds.
  double recompute = 0, fwd = 0, bwd = 0;
  for (size_t k = 0; k < t->groups.size(); ++k)
    for (const LayerGroup& g : t->groups[k])
      for (int64_t l = g.begin; l < g.end; ++l) {
        const LayerBytes b = layer_bytes(t->chunks[k].first + l);
        fwd += b.fwd, bwd += b.bwd;
        if (g.recompute) recompute += b.fwd - (l + 1 == g.end ? b.tail : 0.0);
      }
  // Embedding: all-reduce (SP: reduce-scatter); output layer input: SP
  // all-gather; cross-entropy: max, sum of exp, target logit over [N].
  const double pre = opt.pre_process ? 1 : 0, post = opt.post_process ? 1 : 0;
  c.tp_forward_bytes = fwd + pre * act_rs + post * ((sp ? act_lnf : 0) + 3 * row);
  // Output layer dx: all-reduce (SP: reduce-scatter); embedding dy: SP all-gather.
  c.tp_backward_bytes = bwd + post * act + pre * (sp ? act_rs : 0) + recompute;
  // --mtp-num-layers (last stage), per depth: forward, the embedding's
  // all-reduce (SP: reduce-scatter), eh_proj's input gathered (SP: [N, 2h])
  // and its output gathered along the features, the layer, the final
  // norm's gather (SP) and the loss's three [N] reductions; backward, the
  // output layer's dx, the layer, eh_proj's gathered dy (SP) and its [N, 2h]
  // dx reduction, and the embedding's gathered dy (SP).
  const double act_cat = 2 * static_cast<double>(d.N * d.h) * static_cast<double>(dtype_size(d.gemm_in));
  for (int64_t l = cfg.num_layers; opt.post_process && l < cfg.total_layers(); ++l) {
    const LayerBytes b = layer_bytes(l);
    c.tp_forward_bytes += act_rs + (sp ? act_cat : 0) + act_rs + b.fwd + (sp ? act_lnf : 0) + 3 * row;
    c.tp_backward_bytes += act + b.bwd + (sp ? act_rs : 0) + 2 * act + (sp ? act_rs : 0);
  }
  for (size_t i = 0; i < t->specs.size(); ++i)
    if (tp_partial_grad(t->specs[i], sp, cfg.mla()))
      c.tp_step_bytes += static_cast<double>(t->specs[i].global_shape.numel()) * static_cast<double>(dtype_size(d.dt));
  return c;
}

Result<std::unique_ptr<GPTModel>> GPTModel::create(const ModelConfig& cfg, const GPTOptions& opt) {
  if (opt.tp > 1 && !opt.tp_comm && opt.slots > 0)
    return Status::invalid("tensor parallelism needs the tensor-parallel communicator (GPTOptions::tp_comm)");
  if (opt.tp_comm && opt.tp_comm->size() != opt.tp)
    return Status::invalid(fmt::format("the tensor-parallel communicator has {} ranks, GPTOptions::tp is {}",
                                       opt.tp_comm->size(), opt.tp));
  if (opt.ep > 1 && opt.slots > 0 && (!opt.ep_comm || opt.ep_comm->size() != opt.ep))
    return Status::invalid(fmt::format("expert parallelism needs the expert-parallel communicator of {} ranks "
                                       "(GPTOptions::ep_comm)",
                                       opt.ep));
  if (opt.cp > 1 && opt.slots > 0 && (!opt.cp_comm || opt.cp_comm->size() != opt.cp))
    return Status::invalid(fmt::format("context parallelism needs the context-parallel communicator of {} ranks "
                                       "(GPTOptions::cp_comm)",
                                       opt.cp));
  auto t = make_tables(cfg, opt);
  if (!t.is_ok()) return t.status();
  return std::unique_ptr<GPTModel>(new GPTModel(cfg, t->opt, std::move(*t)));
}

GPTModel::GPTModel(const ModelConfig& cfg, const GPTOptions& opt, Tables&& t) : cfg_(cfg), opt_(opt) {
  const Dims& d = t.dims;
  B_ = d.B, T_ = d.T, N_ = d.N, h_ = d.h, V_ = d.V, qkv_ = d.qkv, F_ = d.F, fc1_ = d.fc1, R_ = d.R, Rx_ = d.Rx;
  Fd_ = d.Fd, fc1d_ = d.fc1d;
  drops_ = d.drops, segs_ = d.segs, cap_ = d.cap;
  xlocal_ = d.xlocal, Lr_ = d.Lr;
  Ns_ = d.Ns, Vg_ = d.V * opt.tp, a_ = d.a, g_ = cfg.query_groups() / opt.tp;
  Tg_ = d.Tg;
  {
    // This rank's rows: local positions [t0, t0 + Ns / B) (its SP shard),
    // cut where the CP chunks meet.
    // And all N rows of this rank's positions (what every TP rank's MoE
    // router sees), likewise.
    const k::QueryChunks qc = k::query_chunks(Tg_, opt.cp, opt.cp_rank);
    auto cut = [&](int64_t t0, int64_t t1, std::vector<RowRun>& out) {
      for (int64_t t = t0; t < t1;) {
        const int64_t end = std::min(t1, (t / qc.len + 1) * qc.len);
        out.push_back({(t - t0) * B_, (end - t) * B_, qc.position(t)});
        t = end;
      }
    };
    const int64_t t0 = sp() ? opt.tp_rank * (T_ / opt.tp) : 0;
    cut(t0, t0 + Ns_ / B_, runs_);
    cut(0, T_, all_runs_);
  }
  mid_ = d.mid;
  gemm_in_ = d.gemm_in;
  rs_ = d.rs;
  dn_ = d.dn;
  specs_ = std::move(t.specs);
  chunks_ = std::move(t.chunks);
  chunk_groups_ = std::move(t.groups);
  plan_ = t.plan;
  param_table_ = std::move(t.params);
  expert_table_ = std::move(t.expert_params);
  expert_flat_begin_ = static_cast<int64_t>(t.dense_flat_bytes / dtype_size(opt.dtype));
  act_table_ = std::move(t.acts);
  workspace_table_ = std::move(t.workspace);
  for (size_t i = 0; i < specs_.size(); ++i) index_[specs_[i].name] = static_cast<int>(i);
  params_arena_ = Arena(plan_.params, "params", opt.device);
  params_ = carve_params(params_arena_);
  if (plan_.grads) {
    grads_arena_ = Arena(plan_.grads, "grads", opt.device);
    grads_ = carve_params(grads_arena_);
  } else {
    grads_.assign(params_.size(), Tensor());
  }
  word_ = find("embedding.word_embeddings.weight");
  pos_ = find("embedding.position_embeddings.weight");
  final_w_ = find("decoder.final_layernorm.weight");
  final_b_ = find("decoder.final_layernorm.bias");
  out_ = cfg.untie_embeddings_and_output_weights ? find("output_layer.weight") : word_;
  for (int l = 0; l < cfg.total_layers(); ++l) {  // indexed by global layer; -1 where another stage holds it
    const std::string p = cfg.layer_prefix(l);
    LayerIdx x;
    x.ln1_w = find(p + "input_layernorm.weight"), x.ln1_b = find(p + "input_layernorm.bias");
    x.qkv_w = find(p + "self_attention.linear_qkv.weight"), x.qkv_b = find(p + "self_attention.linear_qkv.bias");
    x.proj_w = find(p + "self_attention.linear_proj.weight"), x.proj_b = find(p + "self_attention.linear_proj.bias");
    x.ln2_w = find(p + "pre_mlp_layernorm.weight"), x.ln2_b = find(p + "pre_mlp_layernorm.bias");
    x.fc1_w = find(p + "mlp.linear_fc1.weight"), x.fc1_b = find(p + "mlp.linear_fc1.bias");
    x.fc2_w = find(p + "mlp.linear_fc2.weight"), x.fc2_b = find(p + "mlp.linear_fc2.bias");
    x.q_ln_w = find(p + "self_attention.q_layernorm.weight"), x.q_ln_b = find(p + "self_attention.q_layernorm.bias");
    x.k_ln_w = find(p + "self_attention.k_layernorm.weight"), x.k_ln_b = find(p + "self_attention.k_layernorm.bias");
    x.q_down_w = find(p + "self_attention.linear_q_down_proj.weight");
    x.q_up_w = find(p + "self_attention.linear_q_up_proj.weight");
    x.q_proj_w = find(p + "self_attention.linear_q_proj.weight");
    x.kv_down_w = find(p + "self_attention.linear_kv_down_proj.weight");
    x.kv_up_w = find(p + "self_attention.linear_kv_up_proj.weight");
    x.kv_ln_w = find(p + "self_attention.kv_layernorm.weight"), x.kv_ln_b = find(p + "self_attention.kv_layernorm.bias");
    x.router_w = find(p + "mlp.router.weight");
    const int64_t El = cfg.is_moe() ? cfg.num_experts / opt.ep : 0;  // this rank's experts, local index e
    for (int64_t e = opt.ep_rank * El; x.router_w >= 0 && e < (opt.ep_rank + 1) * El; ++e) {
      x.exp_fc1.push_back(find(fmt::format("{}mlp.experts.local_experts.{}.linear_fc1.weight", p, e)));
      x.exp_fc2.push_back(find(fmt::format("{}mlp.experts.local_experts.{}.linear_fc2.weight", p, e)));
    }
    x.sh_fc1 = find(p + "mlp.shared_experts.linear_fc1.weight");
    x.sh_fc2 = find(p + "mlp.shared_experts.linear_fc2.weight");
    x.sh_gate = find(p + "mlp.shared_experts.gate_weight");
    layers_.push_back(x);
  }
  for (int64_t k = 0; k < cfg.mtp_layers() && opt.post_process; ++k) {
    const std::string p = cfg.mtp_prefix(k);  // (depth 0's when repeated)
    MtpIdx m;
    m.enorm_w = find(p + "enorm.weight"), m.enorm_b = find(p + "enorm.bias");
    m.hnorm_w = find(p + "hnorm.weight"), m.hnorm_b = find(p + "hnorm.bias");
    m.eh_w = find(p + "eh_proj.weight");
    m.final_w = find(p + "final_layernorm.weight"), m.final_b = find(p + "final_layernorm.bias");
    mtp_.push_back(m);
  }
  // bf16 copies of every matrix a GEMM reads.
  lowp_.assign(params_.size(), Tensor());
  if (plan_.lowp) {
    lowp_arena_ = Arena(plan_.lowp, "16-bit-weights", opt.device);
    auto v = lowp_arena_.carve(t.lowp);
    for (size_t j = 0; j < t.lowp_which.size(); ++j) lowp_[static_cast<size_t>(t.lowp_which[j])] = v[j];
  }
  if (plan_.activations) {
    acts_ = Arena(plan_.activations, "activations", opt.device);
    const ActIndex& ai = t.act;
    for (int s = 0; s < opt.slots; ++s) {
      std::vector<Tensor> v = acts_.carve(act_table_);
      auto at = [&](int i) { return i >= 0 ? v[static_cast<size_t>(i)] : Tensor(); };
      Slot sl;
      sl.tokens = at(ai.tokens), sl.labels = at(ai.labels);
      sl.doc_start = at(ai.doc_start), sl.positions = at(ai.positions);
      for (int i : ai.resid) sl.resid.push_back(at(i));
      for (const FieldIdx& f : ai.layers) sl.layers.push_back(bind_layer(v, f));
      sl.lnf = at(ai.lnf), sl.lnf_mean = at(ai.lnf_mean), sl.lnf_rstd = at(ai.lnf_rstd), sl.logits = at(ai.logits);
      sl.mx = at(ai.mx), sl.se = at(ai.se), sl.tl = at(ai.tl), sl.loss = at(ai.loss);
      for (const ActIndex::Mtp& m : ai.mtp) {
        MtpActs x;
        x.tokens = at(m.tokens), x.labels = at(m.labels), x.emb = at(m.emb), x.e_mean = at(m.e_mean);
        x.e_rstd = at(m.e_rstd), x.h_mean = at(m.h_mean), x.h_rstd = at(m.h_rstd), x.cat = at(m.cat), x.x = at(m.x);
        x.layer = bind_layer(v, m.layer);
        x.y = at(m.y), x.lnf = at(m.lnf), x.f_mean = at(m.f_mean), x.f_rstd = at(m.f_rstd), x.logits = at(m.logits);
        x.mx = at(m.mx), x.se = at(m.se), x.tl = at(m.tl), x.loss = at(m.loss);
        sl.mtp.push_back(x);
      }
      sl.mtp_count.assign(ai.mtp.size(), 0.0), sl.mtp_loss.assign(ai.mtp.size(), 0.0);
      sl.mtp_correct.assign(ai.mtp.size(), 0.0);
      if (cfg.is_moe()) {
        const size_t L = static_cast<size_t>(cfg.total_layers());
        sl.moe_counts.assign(L, {}), sl.moe_aux.assign(L, 0.0), sl.moe_z.assign(L, 0.0);
        sl.moe_send.assign(L, {}), sl.moe_recv.assign(L, {}), sl.moe_routed.assign(L, {});
      }
      slots_.push_back(std::move(sl));
    }
  }
  ws_layers_ = std::move(t.ws_layers);
  ws_resid_ = std::move(t.ws_resid);
  if (plan_.scratch) scratch_ = Arena(plan_.scratch, "scratch", opt.device);
  if (plan_.tables) {
    tables_ = Arena(plan_.tables, "tables", opt.device);
    auto v = tables_.carve(t.rope);
    size_t next = 0;
    if (cfg.applies_rope()) {
      rope_cos_ = v[next++], rope_sin_ = v[next++];
      if (opt.cp == 1) {
        k::rope_table(rope_spec(cfg), T_, rope_cos_, rope_sin_);
      } else {
        // The whole sequence's table on the host (both rope_table twins
        // compute it there, to the same bits), then this rank's two chunks of rows.
        const int64_t w = rope_cos_.dim(1), C = Tg_ / (2 * opt.cp);
        const size_t bytes = static_cast<size_t>(Tg_ * w) * dtype_size(rope_cos_.dtype());
        std::vector<char> host(2 * bytes);
        const Tensor fc(host.data(), {Tg_, w}, rope_cos_.dtype()), fs(host.data() + bytes, {Tg_, w}, rope_sin_.dtype());
        k::rope_table(rope_spec(cfg), Tg_, fc, fs);
        const k::QueryChunks qc = k::query_chunks(Tg_, opt.cp, opt.cp_rank);
        for (int64_t c = 0; c < 2; ++c) {
          copy_tensor(fc.slice(qc.start[c], qc.start[c] + C), rope_cos_.slice(c * C, (c + 1) * C));
          copy_tensor(fs.slice(qc.start[c], qc.start[c] + C), rope_sin_.slice(c * C, (c + 1) * C));
        }
      }
    }
    if (cfg.apply_layernorm_1p) {
      norm_ones_ = v[next++], norm_w1_ = v[next++];
      const int64_t n = norm_ones_.numel();
      std::vector<double> one(static_cast<size_t>(n), 1.0);
      std::vector<float> onef(one.begin(), one.end());
      copy_tensor(opt.dtype == DType::kF64 ? Tensor(one.data(), {n}, DType::kF64) : Tensor(onef.data(), {n}, DType::kF32),
                  norm_ones_);
    }
    expert_bias_.assign(static_cast<size_t>(cfg.total_layers()), Tensor());
    bias_counts_.assign(static_cast<size_t>(cfg.total_layers()), {});
    if (cfg.has_expert_bias()) {  // zeros (the arena is zero-filled)
      for (int64_t l : held_layers(cfg, chunks_, opt.post_process))
        if (cfg.is_moe_layer(l)) expert_bias_[static_cast<size_t>(l)] = v[next++];
      // A repeated MTP layer's depths route with its one bias.
      for (int64_t l = cfg.num_layers + 1; opt.post_process && l < cfg.total_layers(); ++l)
        expert_bias_[static_cast<size_t>(l)] = expert_bias_[static_cast<size_t>(cfg.param_layer(l))];
      expert_bias_counts_ = v[next++];
    }
    if (t.dims.gate) {
      gate_rows_ = v[next++];
      std::vector<int32_t> iota(static_cast<size_t>(N_));
      for (int64_t i = 0; i < N_; ++i) iota[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      copy_tensor(Tensor(iota.data(), {N_, 1}, DType::kI32), gate_rows_);
    }
  } else {
    expert_bias_.assign(static_cast<size_t>(cfg.total_layers()), Tensor());
    bias_counts_.assign(static_cast<size_t>(cfg.total_layers()), {});
  }
}

GPTModel::~GPTModel() = default;

GPTModel::Workspace GPTModel::carve_workspace() {
  Workspace w;
  if (workspace_table_.size() == 0) return w;
  std::vector<Tensor> v = scratch_.carve(workspace_table_);
  for (const auto& f : ws_layers_) w.layers.push_back(bind_layer(v, f));
  for (int i : ws_resid_) w.resid.push_back(v[static_cast<size_t>(i)]);
  return w;
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
Tensor GPTModel::logits(int slot) const { return slots_.at(static_cast<size_t>(slot)).logits; }
Tensor GPTModel::scratch(Shape shape, DType dt) { return scratch_.alloc(shape, dt); }

void GPTModel::init_parameters(uint64_t seed) {
  const double std0 = cfg_.init_method_std, std_out = std0 / std::sqrt(2.0 * static_cast<double>(cfg_.num_layers));
  std::vector<char> staging;  // host copy of a device parameter, filled then copied back
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    Tensor p = params_[i];
    if (p.device() != Device::kCpu) {
      staging.resize(p.nbytes());
      Tensor host(staging.data(), p.shape(), p.dtype());
      copy_tensor(p, host);  // elements no shard piece covers keep their values
      p = host;
    }
    const uint64_t stream = fnv1a(s.name);
    // Each element draws from its GLOBAL flat index, so every TP layout holds
    // slices of the same full tensor.
    const int64_t gcols = s.global_shape.ndim >= 2 ? s.global_shape.numel() / s.global_shape[0] : 1;
    const int64_t lcols = p.ndim() >= 2 ? p.numel() / p.dim(0) : 1;
    const SplitGroup sg = split_group(s);
    // --init-method-xavier-uniform: torch's fans of the whole [out, in]
    // tensor (fan_in = in, fan_out = out; a vector counts as both).
    const double fan_out = static_cast<double>(s.global_shape.ndim >= 2 ? s.global_shape[0] : s.global_shape.numel());
    const double fan_in = static_cast<double>(s.global_shape.ndim >= 2 ? gcols : s.global_shape.numel());
    const double xavier = std::sqrt(6.0 / std::max(1.0, fan_in + fan_out));
    // --embedding-init-method-std other than --init-method-std: the
    // embeddings' own normal, whatever the weights' method.
    const bool own_std = s.name.rfind("embedding.", 0) == 0 && cfg_.embedding_init_method_std &&
                         *cfg_.embedding_init_method_std != std0;
    const bool uniform = cfg_.init_method_xavier_uniform && !own_std;
    const double std_normal = own_std ? *cfg_.embedding_init_method_std : std0;
    for (const ShardPiece& piece : shard_pieces(s, sg.size, sg.rank)) {
      const int64_t rows = piece.shape.ndim >= 2 ? piece.shape[0] : 1;
      const int64_t cols = piece.shape.ndim >= 2 ? piece.shape.numel() / piece.shape[0] : piece.shape[0];
      const int64_t grow0 = piece.shape.ndim >= 2 ? piece.offsets[0] : 0;
      const int64_t gcol0 = piece.shape.ndim >= 2 ? piece.offsets[1] : piece.offsets[0];
      // Every element is a function of its global index alone, so the
      // threads (OMP_NUM_THREADS) split the piece without changing a bit: a
      // 1B model's 852M draws take ~40 s on one thread.
      const int64_t count = rows * cols;
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < count; ++k) {
        const int64_t r = k / cols, c = k % cols;
        const int64_t e = (piece.local_row + r) * lcols + c;
        const uint64_t ge = static_cast<uint64_t>((grow0 + r) * gcols + gcol0 + c);
        double v = 0;
        switch (s.init) {
          case InitKind::kNormal:
          case InitKind::kScaledNormal:
            v = uniform ? xavier * (2.0 * static_cast<double>(philox_uniform(seed, stream, ge)) - 1.0)
                        : (s.init == InitKind::kNormal ? std_normal : std_out) * philox_normal(seed, stream, ge);
            break;
          case InitKind::kOnes: v = 1; break;
          case InitKind::kZeros: v = 0; break;
        }
        if (p.dtype() == DType::kF32) p.ptr<float>()[e] = static_cast<float>(v);
        else p.ptr<double>()[e] = v;
      }
    }
    if (p.data() != params_[i].data()) copy_tensor(p, params_[i]);
  }
  sync_low_precision();
}

void GPTModel::sync_low_precision() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (lowp_[i].defined()) k::cast(params_[i], lowp_[i]);
}

void GPTModel::sync_low_precision(int stage) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (lowp_[i].defined() && param_stage(specs_[i], cfg_.num_layers) == stage) k::cast(params_[i], lowp_[i]);
}

int param_stage(const ParamSpec& spec, int64_t num_layers) {
  // An MTP layer's parameters finalise before the final norm's (backward
  // runs the MTP depths first) and are first read after it: stage L.
  if (spec.layer >= 0) return static_cast<int>(std::min<int64_t>(spec.layer, num_layers));
  if (spec.name.rfind("embedding.", 0) == 0) return -1;
  return static_cast<int>(num_layers);  // final norm, output layer
}

Tensor GPTModel::flat_params() const {
  return Tensor(params_arena_.base(), {static_cast<int64_t>(params_arena_.capacity() / dtype_size(opt_.dtype))},
                opt_.dtype, opt_.device);
}
Tensor GPTModel::flat_grads() const {
  if (!grads_arena_.base()) return Tensor();
  return Tensor(grads_arena_.base(), {static_cast<int64_t>(grads_arena_.capacity() / dtype_size(opt_.dtype))},
                opt_.dtype, opt_.device);
}
// The parameter table, then (--num-experts) the experts' table from
// expert_flat_begin_: params_/grads_ in specs_ order (experts last).
std::vector<Tensor> GPTModel::carve_params(Arena& arena) const {
  std::vector<Tensor> v = arena.carve(param_table_);
  if (expert_table_.size() == 0) return v;
  const size_t at = arena.used(), start = static_cast<size_t>(expert_flat_begin_) * dtype_size(opt_.dtype);
  MT_CHECK(at <= start && (start - at) % dtype_size(opt_.dtype) == 0, "GPTModel: the expert region's start is misplaced");
  if (start > at) arena.alloc({static_cast<int64_t>((start - at) / dtype_size(opt_.dtype))}, opt_.dtype);  // padding
  for (Tensor& t : arena.carve(expert_table_)) v.push_back(t);
  return v;
}

int64_t GPTModel::flat_offset(int i) const {
  return static_cast<int64_t>((static_cast<const char*>(params_[static_cast<size_t>(i)].data()) -
                               static_cast<const char*>(params_arena_.base())) /
                              static_cast<std::ptrdiff_t>(dtype_size(opt_.dtype)));
}

void GPTModel::zero_grads() {
  if (grads_arena_.base()) flat_grads().zero();  // the whole arena: capacity is a multiple of the dtype size
}

// x itself when it is bf16, else a bf16 copy in scratch (the caller holds an ArenaScope).
Tensor GPTModel::as_half(const Tensor& x) {
  if (x.dtype() == opt_.half) return x;
  Tensor xh = scratch(x.shape(), opt_.half);
  k::cast(x, xh);
  return xh;
}

// y [N,out] = x [N,in] W^T + b on this rank's shard, no communication (the
// tensor-parallel wrappers below add it). W: rows [r0, r1) of parameter w
// (all of them for r1 < 0).
void GPTModel::linear_fwd(const Tensor& x, int w, int b, const Tensor& y, int64_t r0, int64_t r1) {
  const Tensor W = r1 < 0 ? params_[w] : params_[w].slice(r0, r1);
  const int64_t out = W.dim(0), in = W.dim(1), n = x.numel() / in;
  if (opt_.half_compute) {
    ArenaScope scope(scratch_);
    const Tensor xh = as_half(x);
    k::gemm(false, true, n, out, in, 1.0f, xh, r1 < 0 ? lowp_[w] : lowp_[w].slice(r0, r1), 0.0f, y);
  } else {
    k::gemm(false, true, n, out, in, 1.0f, x, W, 0.0f, y);
  }
  if (b >= 0) k::bias_add(y, params_[b]);
}

// dx = dy W (written, or added with `accumulate`; skipped when dx is
// undefined), dW += dy^T x, db += sum dy; W and dW rows [r0, r1) as above.
void GPTModel::linear_bwd(const Tensor& x, int w, int b, const Tensor& dy, const Tensor& dx, int64_t r0, int64_t r1,
                          bool accumulate) {
  const auto rows = [&](const Tensor& t) { return r1 < 0 ? t : t.slice(r0, r1); };
  const Tensor W = rows(params_[w]), dW = rows(grads_[w]);
  const int64_t out = W.dim(0), in = W.dim(1), n = x.numel() / in;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (opt_.half_compute) {
    ArenaScope scope(scratch_);
    const Tensor dyh = as_half(dy), xh = as_half(x);
    if (dx.defined()) k::gemm(false, false, n, in, out, 1.0f, dyh, rows(lowp_[w]), beta, dx);
    k::gemm(true, false, out, in, n, 1.0f, dyh, xh, 1.0f, dW);
  } else {
    if (dx.defined()) k::gemm(false, false, n, in, out, 1.0f, dy, W, beta, dx);
    k::gemm(true, false, out, in, n, 1.0f, dy, x, 1.0f, dW);
  }
  if (b >= 0) k::bias_grad(dy, grads_[b]);
}

Tensor GPTModel::own_rows(const Tensor& full) const {
  return sp() ? full.slice(opt_.tp_rank * Ns_, (opt_.tp_rank + 1) * Ns_) : full;
}

// Column-parallel input: with SP, all-gather this rank's rows (already
// written into x_full's own block) into the full sequence. Otherwise identity.
void GPTModel::column_fwd_input(const Tensor& x_own, const Tensor& x_full) {
  if (sp()) opt_.tp_comm->all_gather(x_own, x_full);
}

// Row-parallel linear: y_own [Ns, out] = reduce over TP of x W^T (partial sums
// of this rank's input columns), then + bias (replicated, added once after
// the reduction as Megatron's RowParallelLinear does).
// fwd: all-reduce (SP: reduce-scatter) | bwd: identity (SP: all-gather dy).
void GPTModel::row_linear_fwd(const Tensor& x, int w, int b, const Tensor& y_own) {
  if (opt_.tp == 1) return linear_fwd(x, w, b, y_own);
  ArenaScope scope(scratch_);
  if (sp()) {
    Tensor full = scratch({N_, y_own.dim(1)}, y_own.dtype());
    linear_fwd(x, w, -1, full);
    opt_.tp_comm->reduce_scatter(full, y_own);
  } else {
    linear_fwd(x, w, -1, y_own);
    opt_.tp_comm->all_reduce(y_own);
  }
  if (b >= 0) k::bias_add(y_own, params_[b]);
}

// dy_own: d(y_own). The bias gradient comes from this rank's rows (partial
// with SP: reduce_tp_replicated_grads() completes it); dW and dx from the
// full-sequence dy.
void GPTModel::row_linear_bwd(const Tensor& x, int w, int b, const Tensor& dy_own, const Tensor& dx) {
  if (!sp()) return linear_bwd(x, w, b, dy_own, dx);
  ArenaScope scope(scratch_);
  Tensor full = scratch({N_, dy_own.dim(1)}, dy_own.dtype());
  opt_.tp_comm->all_gather(dy_own, full);
  linear_bwd(x, w, -1, full, dx);
  if (b >= 0) k::bias_grad(dy_own, grads_[b]);
}

// Column-parallel backward: dx_own = reduce over TP of dy W (each rank's
// output columns contribute a partial dx). bwd: all-reduce (SP: reduce-scatter).
void GPTModel::column_linear_bwd(const Tensor& x_full, int w, int b, const Tensor& dy, const Tensor& dx_own) {
  if (opt_.tp == 1) return linear_bwd(x_full, w, b, dy, dx_own);
  if (!sp()) {
    linear_bwd(x_full, w, b, dy, dx_own);
    opt_.tp_comm->all_reduce(dx_own);
    return;
  }
  ArenaScope scope(scratch_);
  Tensor full = scratch({N_, dx_own.dim(1)}, dx_own.dtype());
  linear_bwd(x_full, w, b, dy, full);
  opt_.tp_comm->reduce_scatter(full, dx_own);
}

void GPTModel::reduce_tp_replicated_grads() {
  if (opt_.tp <= 1) return;
  for (size_t i = 0; i < specs_.size(); ++i)
    if (tp_partial_grad(specs_[i], sp(), cfg_.mla())) opt_.tp_comm->all_reduce(grads_[i]);
}

Tensor GPTModel::norm_weight(int w) const {
  if (!cfg_.apply_layernorm_1p) return params_[w];
  // Zero-centred gamma: the norm multiplies by 1 + gamma (computed in the
  // parameters' dtype, as Megatron's weight + 1), and gamma's gradient is
  // the gradient with respect to 1 + gamma.
  const Tensor& g = params_[w];
  const Tensor out = norm_w1_.slice(0, g.numel());
  k::add(g, norm_ones_.slice(0, g.numel()), out);
  return out;
}

void GPTModel::norm_fwd(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const Tensor weight = norm_weight(w);
  if (cfg_.normalization == Normalization::kLayerNorm)
    k::layernorm_forward(x, weight, b >= 0 ? params_[b] : Tensor(), cfg_.norm_epsilon, y, mean, rstd);
  else
    k::rmsnorm_forward(x, weight, cfg_.norm_epsilon, y, rstd);
}

void GPTModel::norm_bwd(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx) {
  const Tensor weight = norm_weight(w);
  if (cfg_.normalization == Normalization::kLayerNorm)
    k::layernorm_backward(dy, x, weight, mean, rstd, dx, grads_[w], b >= 0 ? grads_[b] : Tensor());
  else
    k::rmsnorm_backward(dy, x, weight, rstd, dx, grads_[w]);
}

namespace {
uint64_t dropout_stream(uint64_t step, int64_t layer, int site) {
  return (step * 4096 + static_cast<uint64_t>(layer)) * 4 + static_cast<uint64_t>(site);
}
constexpr uint64_t kDropoutSeedSalt = 0x6d742d64726f70ull;  // "mt-drop"
constexpr uint64_t kJitterSeedSalt = 0x6d742d6a6974ull;     // "mt-jit": --moe-input-jitter-eps
}  // namespace

// out = res + dropout(row_linear(x)) (x W^T + b, reduced over TP), through
// tmp; or in one GEMM with the residual in its epilogue (k::gemm_add: the
// same rounding, no temporary, no add kernel) when nothing comes between
// the product and the sum: one TP rank, no bias, no dropout.
void GPTModel::residual_linear_fwd(const Tensor& x, int w, int b, double dropout, uint64_t dropout_stream_id,
                                   const Tensor& res, const Tensor& tmp, const Tensor& out) {
  if (opt_.tp == 1 && b < 0 && dropout == 0 && res.dtype() == out.dtype()) {
    const Tensor& W = params_[w];
    const int64_t n_out = W.dim(0), in = W.dim(1), n = x.numel() / in;
    ArenaScope scope(scratch_);
    if (opt_.half_compute) k::gemm_add(false, true, n, n_out, in, as_half(x), lowp_[w], res, out);
    else k::gemm_add(false, true, n, n_out, in, x, W, res, out);
    return;
  }
  row_linear_fwd(x, w, b, tmp);
  if (dropout > 0) hidden_dropout(tmp, tmp, dropout, dropout_stream_id);
  k::add(res, tmp, out);
}

void GPTModel::rope(const Tensor& qkv, bool backward) const {
  const k::QkvLayout L{T_, B_, a_, g_, cfg_.head_dim()};
  if (backward) k::rope_backward(qkv, L, rope_cos_, rope_sin_, cfg_.rotary_dim(), cfg_.rope_pairs_adjacent());
  else k::rope_forward(qkv, L, rope_cos_, rope_sin_, cfg_.rotary_dim(), cfg_.rope_pairs_adjacent());
}

void GPTModel::hidden_dropout(const Tensor& x, const Tensor& y, double p, uint64_t stream) const {
  for (const RowRun& r : runs_)
    k::dropout_forward(x.slice(r.row, r.row + r.rows), y.slice(r.row, r.row + r.rows), p, kDropoutSeedSalt, stream,
                       static_cast<uint64_t>(r.pos * B_ * h_));
}

k::AttentionOptions GPTModel::attention_options(const Slot& s, int l) const {
  k::AttentionOptions ao{cfg_.softmax_scale(),
                         s.training ? cfg_.attention_dropout : 0.0, kDropoutSeedSalt, dropout_stream(s.dropout_step, l, 0),
                         opt_.tp_rank * a_};
  ao.bf16_matmul = opt_.half_compute;  // tensor cores where the backend has them
  ao.cp_size = opt_.cp, ao.cp_rank = opt_.cp_rank;
  if (opt_.reset_attention_mask) ao.doc_start = s.doc_start;
  return ao;
}

void GPTModel::cp_reorder(const Tensor& src, const Tensor& dst, bool to_sequence_order) const {
  const int64_t cp = opt_.cp, rows = B_ * (Tg_ / (2 * cp));  // rows of one chunk
  for (int64_t r = 0; r < cp; ++r)
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? r : 2 * cp - 1 - r, ro = (2 * r + half) * rows, so = chunk * rows;
      const Tensor a = src.slice(to_sequence_order ? ro : so, (to_sequence_order ? ro : so) + rows);
      const Tensor b = dst.slice(to_sequence_order ? so : ro, (to_sequence_order ? so : ro) + rows);
      copy_tensor(a, b);
    }
}

void GPTModel::attention_fwd(const Tensor& qkv, const k::AttentionOptions& o, const Tensor& ctx, const Tensor& lse) {
  const k::QkvLayout L{Tg_, B_, a_, g_, cfg_.head_dim()};
  if (opt_.cp == 1) return k::attention_forward(qkv, L, o, ctx, lse);
  ArenaScope scope(scratch_);
  const Tensor ranks = scratch({B_ * Tg_, qkv_}, qkv.dtype()), seq = scratch({B_ * Tg_, qkv_}, qkv.dtype());
  opt_.cp_comm->all_gather(qkv, ranks);
  cp_reorder(ranks, seq, true);
  k::attention_forward(seq, L, o, ctx, lse);
}

void GPTModel::attention_bwd(const Tensor& qkv, const Tensor& ctx, const Tensor& dctx, const Tensor& lse,
                             const k::AttentionOptions& o, const Tensor& dqkv) {
  const k::QkvLayout L{Tg_, B_, a_, g_, cfg_.head_dim()};
  if (opt_.cp == 1) return k::attention_backward(qkv, ctx, dctx, lse, L, o, dqkv);
  // dQ of this rank's queries and its share of every position's dK/dV, for
  // the whole sequence in the model dtype; summed over CP by the reduce-
  // scatter, which leaves each rank its own rows.
  ArenaScope scope(scratch_);
  const Tensor dseq = scratch({B_ * Tg_, qkv_}, opt_.dtype);
  {
    ArenaScope gathered(scratch_);
    const Tensor ranks = scratch({B_ * Tg_, qkv_}, qkv.dtype()), seq = scratch({B_ * Tg_, qkv_}, qkv.dtype());
    opt_.cp_comm->all_gather(qkv, ranks);
    cp_reorder(ranks, seq, true);
    k::attention_backward(seq, ctx, dctx, lse, L, o, dseq);
  }
  const Tensor dranks = scratch({B_ * Tg_, qkv_}, opt_.dtype);
  cp_reorder(dseq, dranks, false);
  if (dqkv.dtype() == opt_.dtype) {
    opt_.cp_comm->reduce_scatter(dranks, dqkv);
  } else {
    const Tensor mine = scratch({N_, qkv_}, opt_.dtype);
    opt_.cp_comm->reduce_scatter(dranks, mine);
    k::cast(mine, dqkv);
  }
}

// --multi-latent-attention, forward: queries through q_down, the q norm and
// q_up (or linear_q_proj), keys and values through kv_down (c and the
// position key, as two products of its row blocks), the kv norm and kv_up;
// packed into the fused layout and roped (kernels/mla.h). The down
// projections are replicated over TP and read this rank's rows (its SP
// shard); their outputs are all-gathered for the column-parallel up
// projections, as Megatron's MLASelfAttention does with duplicated linears.
k::MlaDims GPTModel::mla_dims() const {
  return k::MlaDims{N_, a_, cfg_.qk_head_dim, cfg_.qk_pos_emb_head_dim, cfg_.v_head_dim};
}

void GPTModel::mla_fwd(const LayerIdx& p, const LayerActs& a, const Tensor& ln1_own, const Tensor& qkv) {
  ArenaScope scope(scratch_);
  const int64_t kl = cfg_.kv_lora_rank, dr = cfg_.qk_pos_emb_head_dim;
  const bool qn = cfg_.qk_layernorm;
  if (p.q_down_w >= 0) {
    const Tensor cq_own = own_rows(a.cq);
    linear_fwd(ln1_own, p.q_down_w, -1, qn ? a.cq_raw : cq_own);
    if (qn) norm_fwd(a.cq_raw, p.q_ln_w, p.q_ln_b, cq_own, a.cq_mean, a.cq_rstd);
    column_fwd_input(cq_own, a.cq);
  } else {
    column_fwd_input(ln1_own, a.ln1);
  }
  // The position key: kept with --recompute-modules mla_up_proj, else scratch.
  const Tensor kpe = a.kpe.defined() ? a.kpe : scratch({N_, dr}, mid_), ckv_own = own_rows(a.ckv),
               kpe_own = own_rows(kpe);
  linear_fwd(ln1_own, p.kv_down_w, -1, qn ? a.ckv_raw : ckv_own, 0, kl);
  linear_fwd(ln1_own, p.kv_down_w, -1, kpe_own, kl, kl + dr);
  if (qn) norm_fwd(a.ckv_raw, p.kv_ln_w, p.kv_ln_b, ckv_own, a.ckv_mean, a.ckv_rstd);
  column_fwd_input(ckv_own, a.ckv);
  column_fwd_input(kpe_own, kpe);
  mla_up_fwd(p, a, kpe, qkv);
}

void GPTModel::mla_up_fwd(const LayerIdx& p, const LayerActs& a, const Tensor& kpe, const Tensor& qkv) {
  ArenaScope scope(scratch_);
  const Tensor q = scratch({N_, a_ * cfg_.head_dim()}, mid_);
  if (p.q_down_w >= 0) linear_fwd(a.cq, p.q_up_w, -1, q);
  else linear_fwd(a.ln1, p.q_proj_w, -1, q);
  const Tensor kv = scratch({N_, a_ * (cfg_.qk_head_dim + cfg_.v_head_dim)}, mid_);
  linear_fwd(a.ckv, p.kv_up_w, -1, kv);
  k::mla_pack(q, kv, kpe, mla_dims(), qkv);
  rope(qkv, false);
}

// Backward from d(qkv) (RoPE already undone): the up projections' backward
// reduces d(cq), d(ckv) over TP as any column-parallel input; the position
// key's gradient is summed over this rank's heads and then over TP (reduce-
// scattered to the SP shards, as Megatron's gather_from_sequence_parallel
// region); the down projections' gradients come from this rank's rows
// (partial under SP: reduce_tp_replicated_grads() sums them) and their dx,
// complete, is this rank's d(ln1) rows.
void GPTModel::mla_bwd(const LayerIdx& p, const LayerActs& a, const Tensor& dqkv, const Tensor& ln1_own,
                       const Tensor& dln_own) {
  ArenaScope scope(scratch_);
  const int64_t kl = cfg_.kv_lora_rank, dr = cfg_.qk_pos_emb_head_dim;
  const bool qn = cfg_.qk_layernorm;
  const Tensor dq = scratch({N_, a_ * cfg_.head_dim()}, mid_);
  const Tensor dkv = scratch({N_, a_ * (cfg_.qk_head_dim + cfg_.v_head_dim)}, mid_);
  const Tensor dkpe = scratch({N_, dr}, opt_.dtype);
  k::mla_unpack(dqkv, mla_dims(), dq, dkv, dkpe);
  Tensor dkpe_own = dkpe;
  if (opt_.tp > 1) {
    if (sp()) {
      dkpe_own = scratch({Ns_, dr}, opt_.dtype);
      opt_.tp_comm->reduce_scatter(dkpe, dkpe_own);
    } else {
      opt_.tp_comm->all_reduce(dkpe);
    }
  }
  // Queries: d(ln1) written.
  if (p.q_down_w >= 0) {
    const int64_t ql = *cfg_.q_lora_rank;
    const Tensor dcq = scratch({Ns_, ql}, dn_);
    column_linear_bwd(a.cq, p.q_up_w, -1, dq, dcq);
    if (qn) {
      const Tensor draw = scratch({Ns_, ql}, mid_);
      draw.zero();
      norm_bwd(dcq, a.cq_raw, p.q_ln_w, p.q_ln_b, a.cq_mean, a.cq_rstd, draw);
      linear_bwd(ln1_own, p.q_down_w, -1, draw, dln_own);
    } else {
      linear_bwd(ln1_own, p.q_down_w, -1, dcq, dln_own);
    }
  } else {
    column_linear_bwd(a.ln1, p.q_proj_w, -1, dq, dln_own);
  }
  // Keys and values: d(ln1) added.
  const Tensor dckv = scratch({Ns_, kl}, dn_);
  column_linear_bwd(a.ckv, p.kv_up_w, -1, dkv, dckv);
  Tensor dc = dckv;
  if (qn) {
    dc = scratch({Ns_, kl}, mid_);
    dc.zero();
    norm_bwd(dckv, a.ckv_raw, p.kv_ln_w, p.kv_ln_b, a.ckv_mean, a.ckv_rstd, dc);
  }
  linear_bwd(ln1_own, p.kv_down_w, -1, dc, dln_own, 0, kl, true);
  linear_bwd(ln1_own, p.kv_down_w, -1, dkpe_own, dln_own, kl, kl + dr, true);
}

// --qk-layernorm: the q heads and k heads of qkv, gathered into a.qk_raw
// (kept for backward), normalised with their own weights, written back. The
// normalised heads live in scratch until the caller's scope ends.
namespace {
struct QkViews {
  Tensor q, k, q_mean, k_mean, q_rstd, k_rstd;  // [N a, d] / [N g, d] rows, and their [N a] / [N g] statistics
};
QkViews qk_views(const Tensor& heads, const Tensor& mean, const Tensor& rstd, const k::QkvLayout& L) {
  const int64_t nq = L.tokens() * L.heads, nk = L.tokens() * L.groups, d = L.head_dim;
  const Tensor flat = heads.view({(nq + nk) * d});
  QkViews v;
  v.q = flat.slice(0, nq * d).view({nq, d});
  v.k = flat.slice(nq * d, (nq + nk) * d).view({nk, d});
  if (mean.defined()) v.q_mean = mean.slice(0, nq), v.k_mean = mean.slice(nq, nq + nk);
  if (rstd.defined()) v.q_rstd = rstd.slice(0, nq), v.k_rstd = rstd.slice(nq, nq + nk);
  return v;
}
}  // namespace

void GPTModel::qk_norm_fwd(const LayerIdx& p, const k::QkvLayout& L, const LayerActs& a) {
  k::qk_heads_gather(a.qkv, L, a.qk_raw);
  const Tensor y = scratch(a.qk_raw.shape(), a.qk_raw.dtype());
  const QkViews x = qk_views(a.qk_raw, a.qk_mean, a.qk_rstd, L), o = qk_views(y, Tensor(), Tensor(), L);
  norm_fwd(x.q, p.q_ln_w, p.q_ln_b, o.q, x.q_mean, x.q_rstd);
  norm_fwd(x.k, p.k_ln_w, p.k_ln_b, o.k, x.k_mean, x.k_rstd);
  k::qk_heads_scatter(y, L, a.qkv);
}

// dqkv's q and k columns: d(normalised heads) on entry, d(raw heads) on exit.
void GPTModel::qk_norm_bwd(const LayerIdx& p, const k::QkvLayout& L, const LayerActs& a, const Tensor& dqkv) {
  const Tensor dy = scratch(a.qk_raw.shape(), dqkv.dtype()), dx = scratch(a.qk_raw.shape(), dqkv.dtype());
  k::qk_heads_gather(dqkv, L, dy);
  dx.zero();  // the norm backward accumulates into dx
  const QkViews x = qk_views(a.qk_raw, a.qk_mean, a.qk_rstd, L), g = qk_views(dy, Tensor(), Tensor(), L),
                o = qk_views(dx, Tensor(), Tensor(), L);
  norm_bwd(g.q, x.q, p.q_ln_w, p.q_ln_b, x.q_mean, x.q_rstd, o.q);
  norm_bwd(g.k, x.k, p.k_ln_w, p.k_ln_b, x.k_mean, x.k_rstd, o.k);
  k::qk_heads_scatter(dx, L, dqkv);
}

// The slots of each expert, from the dispatch map's counts (host copy).
std::vector<int64_t> GPTModel::expert_offsets(const LayerActs& a) const {
  std::vector<int32_t> c(static_cast<size_t>(cfg_.num_experts));
  copy_tensor(a.counts, Tensor(c.data(), {cfg_.num_experts}, DType::kI32));
  std::vector<int64_t> off(c.size() + 1, 0);
  for (size_t e = 0; e < c.size(); ++e) off[e + 1] = off[e] + c[e];
  return off;
}

namespace {
// The received expert rows in their order (source rank major, then local
// expert): fn(local expert, first row, end row) for each non-empty chunk;
// recv holds the rows per (source rank, local expert) (Slot::moe_recv).
template <typename F>
void each_expert_chunk(const std::vector<int64_t>& recv, int64_t ep, F&& fn) {
  const int64_t El = static_cast<int64_t>(recv.size()) / ep;
  int64_t at = 0;
  for (int64_t src = 0; src < ep; ++src)
    for (int64_t e = 0; e < El; ++e) {
      const int64_t n = recv[static_cast<size_t>(src * El + e)];
      if (n > 0) fn(e, at, at + n);
      at += n;
    }
}
}  // namespace

// The MoE MLP (Megatron's MoELayer, ETP = TP): every TP rank routes all N
// rows of the gathered ln2 (the same choices on every rank: the router is
// replicated) and permutes them by expert. Without expert parallelism it
// runs its columns of every expert's MLP on them; with it, the slots go to
// the EP ranks holding their experts (all_to_all_v over ep_comm, the
// counts exchanged first), the local experts run on what arrives, and the
// outputs return the same way. The outputs are combined weighted by the
// routing probabilities, the shared expert's output (if any) added, and the
// partial sums over the TP ranks' columns reduce-scattered (SP) into y_own
// [Ns, h], as a row-parallel linear's. y_own undefined: stop after the
// experts' outputs (a recomputed group's last layer: backward needs nothing
// after them). Records the layer's load-balancing and z-loss values and the
// exchange's counts in the slot.
// With ETP 1 under TP (xlocal_) a rank routes only its own Ns rows of ln2
// (ln2 gathered only for a shared expert), the whole experts run on what
// the EP group sends, and the combined outputs are this rank's rows: no TP
// collective around the routed experts (Megatron's alltoall dispatcher with
// an expert TP group of one).
void GPTModel::moe_forward(int l, const LayerIdx& p, const LayerActs& a, const Tensor& y_own, const Slot& s) {
  const int64_t E = cfg_.num_experts, ep = opt_.ep, El = E / ep;
  const DType dt = opt_.dtype;
  const Tensor xin = routed(a.ln2);  // the rows this rank routes [Lr, h]
  {
    ArenaScope scope(scratch_);
    // --moe-input-jitter-eps: the router (only) reads ln2 times noise.
    const Tensor rin = cfg_.jitters_router_input() ? scratch({Lr_, h_}, a.ln2.dtype()) : xin;
    if (rin.data() != xin.data()) router_jitter(xin, rin, xlocal_, l, s);
    const Tensor logits = scratch({Lr_, E}, dt);
    linear_fwd(rin, p.router_w, -1, logits);
    k::moe_route(logits, moe_router(cfg_), expert_bias_[static_cast<size_t>(l)], routed(a.r_idx), routed(a.r_probs),
                 routed(a.r_scores), routed(a.r_lse));
    // Token dropping: each TP rank's sequence shard is one segment (the
    // tokens a Megatron rank routes), each expert keeping cap_ slots of it.
    const Tensor kept = drops_ ? scratch({Lr_, cfg_.moe_router_topk}, DType::kI32) : Tensor();
    k::moe_dispatch_kept(routed(a.r_idx), routed(a.r_probs), segs_, cap_, cfg_.moe_token_drop_policy == "position",
                         kept, a.counts, a.src, routed(a.pos));
  }
  const std::vector<int64_t> off = expert_offsets(a);
  const int64_t kept = off[static_cast<size_t>(E)];  // slots leaving the router (Lr k without dropping)
  std::vector<int64_t>& send = s.moe_send[static_cast<size_t>(l)];
  std::vector<int64_t>& recv = s.moe_recv[static_cast<size_t>(l)];
  send.assign(static_cast<size_t>(ep), 0);
  for (int64_t r = 0; r < ep; ++r) send[static_cast<size_t>(r)] = off[(r + 1) * El] - off[r * El];
  if (ep == 1) {
    recv.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) recv[static_cast<size_t>(e)] = off[e + 1] - off[e];
    k::moe_permute(xin, a.src.slice(0, kept), a.xp.slice(0, kept));
  } else {
    // Every EP rank learns how many of its experts' rows come from each
    // rank (block r of the counts holds rank r's experts), then the slots
    // travel, in expert order, to the ranks holding their experts.
    ArenaScope scope(scratch_);
    const Tensor got = scratch({E}, DType::kI32);
    opt_.ep_comm->all_to_all(a.counts, got);
    std::vector<int32_t> c(static_cast<size_t>(E));
    copy_tensor(got, Tensor(c.data(), {E}, DType::kI32));
    recv.assign(c.begin(), c.end());
    const int64_t incoming = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    MT_CHECK(incoming <= Rx_, fmt::format("GPTModel: layer {}'s experts would receive {} rows, more than the {} planned",
                                          l, incoming, Rx_));
    const Tensor xs = scratch({kept, h_}, a.xp.dtype());
    k::moe_permute(xin, a.src.slice(0, kept), xs);
    opt_.ep_comm->all_to_all_v(xs, rows_to_elements(send), a.xp, rows_to_elements(source_rows(recv)));
  }
  const int64_t rows = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  MT_CHECK(rows <= Rx_, fmt::format("GPTModel: layer {}'s experts received {} rows, more than the {} planned", l, rows, Rx_));
  // The local experts, each on its rows from every source rank.
  auto each_chunk = [&](auto&& fn) { each_expert_chunk(recv, ep, fn); };
  each_chunk([&](int64_t e, int64_t r0, int64_t r1) { linear_fwd(a.xp.slice(r0, r1), p.exp_fc1[e], -1, a.fc1.slice(r0, r1)); });
  {
    // --recompute-modules moe_act: the activation output lives in scratch
    // until fc2 has read it (backward recomputes it from fc1).
    ArenaScope act_scope(scratch_);
    const Tensor act = a.act.defined() ? a.act : scratch({Rx_, F_}, gemm_in_);
    if (cfg_.swiglu) k::swiglu_forward(a.fc1.slice(0, rows), act.slice(0, rows));
    else k::gelu_forward(mlp_activation(cfg_), a.fc1.slice(0, rows), act.slice(0, rows));
    ArenaScope scope(scratch_);
    const Tensor y = ep == 1 ? a.y : scratch({Rx_, h_}, a.y.dtype());
    each_chunk([&](int64_t e, int64_t r0, int64_t r1) { linear_fwd(act.slice(r0, r1), p.exp_fc2[e], -1, y.slice(r0, r1)); });
    if (ep > 1) opt_.ep_comm->all_to_all_v(y, rows_to_elements(source_rows(recv)), a.y, rows_to_elements(send));
  }
  if (s.training) moe_record_losses(l, a, off, s);
  // The shared expert: this rank's columns of an MLP on every row, added to
  // the routed experts' combined output before the TP reduction.
  const bool shared = p.sh_fc1 >= 0;
  if (shared) {
    linear_fwd(a.ln2, p.sh_fc1, -1, a.s_fc1);
    if (cfg_.swiglu) k::swiglu_forward(a.s_fc1, a.s_act);
    else k::gelu_forward(mlp_activation(cfg_), a.s_fc1, a.s_act);
  }
  if (!y_own.defined()) return;
  ArenaScope scope(scratch_);
  if (xlocal_) {
    // This rank's rows: the routed experts' outputs are whole; the shared
    // expert's (TP columns over all N rows) reduce-scattered and added.
    k::moe_unpermute(a.y, routed(a.pos), routed(a.r_probs), y_own);
    if (shared) {
      const Tensor t = shared_expert_out(p, a), t_own = scratch({Ns_, h_}, dt);
      opt_.tp_comm->reduce_scatter(t, t_own);
      k::add_inplace(y_own, t_own);
    }
    return;
  }
  const Tensor out = sp() ? scratch({N_, h_}, dt) : y_own;
  k::moe_unpermute(a.y, a.pos, a.r_probs, out);
  if (shared) k::add_inplace(out, shared_expert_out(p, a));
  if (sp()) opt_.tp_comm->reduce_scatter(out, y_own);
}

void GPTModel::shared_gate_scores(const LayerIdx& p, const LayerActs& a, const Tensor& g) {
  linear_fwd(a.ln2, p.sh_gate, -1, g);
  k::moe_sigmoid(g, g);
}

Tensor GPTModel::shared_expert_out(const LayerIdx& p, const LayerActs& a) {
  const Tensor t = scratch({N_, h_}, opt_.dtype);
  linear_fwd(a.s_act, p.sh_fc2, -1, t);
  if (p.sh_gate < 0) return t;
  const Tensor g = scratch({N_, 1}, opt_.dtype), gated = scratch({N_, h_}, opt_.dtype);
  shared_gate_scores(p, a, g);
  k::moe_unpermute(t, gate_rows_, g, gated);  // gated[t] = g[t] t[t]
  return gated;
}

// Rows received per source rank, from rows per (source rank, local expert).
std::vector<int64_t> GPTModel::source_rows(const std::vector<int64_t>& recv) const {
  const int64_t ep = opt_.ep, El = static_cast<int64_t>(recv.size()) / ep;
  std::vector<int64_t> v(static_cast<size_t>(ep), 0);
  for (int64_t r = 0; r < ep; ++r)
    for (int64_t e = 0; e < El; ++e) v[static_cast<size_t>(r)] += recv[static_cast<size_t>(r * El + e)];
  return v;
}
// Counts of [*, h] rows as element counts (all_to_all_v's unit).
std::vector<int64_t> GPTModel::rows_to_elements(std::vector<int64_t> rows) const {
  for (int64_t& r : rows) r *= h_;
  return rows;
}

namespace {
// A host vector to a device vector of dtype dt (fp32 or fp64), and back.
void host_to_tensor(const std::vector<double>& v, const Tensor& t) {
  const int64_t n = static_cast<int64_t>(v.size());
  if (t.dtype() == DType::kF64) return copy_tensor(Tensor(const_cast<double*>(v.data()), {n}, DType::kF64), t);
  std::vector<float> f(v.begin(), v.end());
  copy_tensor(Tensor(f.data(), {n}, DType::kF32), t);
}
std::vector<double> tensor_to_host(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF64) {
    copy_tensor(t, Tensor(v.data(), {t.numel()}, DType::kF64));
  } else {
    std::vector<float> f(v.size());
    copy_tensor(t, Tensor(f.data(), {t.numel()}, DType::kF32));
    v.assign(f.begin(), f.end());
  }
  return v;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> GPTModel::expert_bias_tensors() const {
  std::vector<std::pair<std::string, Tensor>> v;
  for (size_t l = 0; l < expert_bias_.size(); ++l)
    if (expert_bias_[l].defined() && cfg_.param_layer(static_cast<int64_t>(l)) == static_cast<int64_t>(l))
      v.emplace_back(cfg_.layer_prefix(static_cast<int64_t>(l)) + "mlp.router.expert_bias", expert_bias_[l]);
  return v;
}

void GPTModel::update_expert_bias(comm::Communicator* group) {
  if (!cfg_.has_expert_bias() || !expert_bias_counts_.defined()) return;
  const int64_t E = cfg_.num_experts;
  std::vector<size_t> held;  // (a repeated MTP layer's depths share layer L's bias and counts)
  for (size_t l = 0; l < expert_bias_.size(); ++l)
    if (expert_bias_[l].defined() && cfg_.param_layer(static_cast<int64_t>(l)) == static_cast<int64_t>(l))
      held.push_back(l);
  std::vector<double> counts(held.size() * static_cast<size_t>(E), 0.0);
  for (size_t i = 0; i < held.size(); ++i) {
    const std::vector<double>& c = bias_counts_[held[i]];
    for (size_t e = 0; e < c.size(); ++e) counts[i * static_cast<size_t>(E) + e] = c[e];
    bias_counts_[held[i]].clear();
  }
  if (group && group->size() > 1) {  // exact: whole numbers in fp32 below 2^24, in fp64 below 2^53
    host_to_tensor(counts, expert_bias_counts_);
    group->all_reduce(expert_bias_counts_);
    counts = tensor_to_host(expert_bias_counts_);
  }
  // Megatron's get_updated_expert_bias: bias + sign(mean - count) x rate, in the bias's dtype.
  for (size_t i = 0; i < held.size(); ++i) {
    const double* c = counts.data() + i * static_cast<size_t>(E);
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += c[e];
    mean /= static_cast<double>(E);
    std::vector<double> b = tensor_to_host(expert_bias_[held[i]]);
    for (int64_t e = 0; e < E; ++e) {
      const double off = mean - c[e], sign = off > 0 ? 1.0 : off < 0 ? -1.0 : 0.0;
      if (opt_.dtype == DType::kF32)
        b[static_cast<size_t>(e)] = static_cast<double>(static_cast<float>(b[static_cast<size_t>(e)]) +
                                                        static_cast<float>(sign) *
                                                            static_cast<float>(cfg_.moe_router_bias_update_rate));
      else
        b[static_cast<size_t>(e)] += sign * cfg_.moe_router_bias_update_rate;
    }
    host_to_tensor(b, expert_bias_[held[i]]);
  }
}

// The load-balancing loss (Megatron's switch loss) and the z-loss of layer
// l, unweighted, as this rank sees them: the switch loss over its N rows
// with the tokens routed to each expert over the whole micro-batch (this
// rank's counts summed over CP: every TP rank routes the same N rows), so
// that the CP ranks' values sum to the micro-batch's; the z-loss as its
// share of the micro-batch mean. Keeps the counts for backward, and the
// kept slots per expert for the expert-bias update. off: the expert offsets
// of the dispatch map (expert_offsets). With ETP 1 under TP (xlocal_) each
// TP rank routed its own rows: their statistics (counts, the scores' column
// sums, the z sum, the kept slots) are summed over TP first, so every TP
// rank holds what the pooled routing would.
void GPTModel::moe_record_losses(int l, const LayerActs& a, const std::vector<int64_t>& off, const Slot& s) {
  const int64_t E = cfg_.num_experts, k = cfg_.moe_router_topk;
  // --moe-router-load-balancing-type seq_aux_loss: the loss of each of the
  // B sequences (rows t with t mod B = b, [s, b] order), averaged; else one
  // group, the micro-batch. A rank's own rows start at a multiple of B.
  const int64_t G = cfg_.seq_aux_loss() ? B_ : 1, GE = G * E, Lr = Lr_;
  const double total = static_cast<double>(N_ / G * opt_.cp);  // a group's tokens (all CP ranks)
  std::vector<double> counts(static_cast<size_t>(GE)), colsum;  // this rank's, per group and expert
  for (int64_t e = 0; G == 1 && e < E; ++e) counts[static_cast<size_t>(e)] = static_cast<double>(off[e + 1] - off[e]);
  const bool lb = cfg_.moe_aux_loss_active();
  if ((cfg_.has_expert_bias() || cfg_.group_limited()) && lb) {
    // Megatron counts the load-balancing loss's tokens by the scores' own top
    // k, without the bias or the groups that chose the experts (a host pass
    // over [Lr, E]; without the loss the counts only feed a value nobody logs).
    const std::vector<double> sc = tensor_to_host(routed(a.r_scores));
    std::fill(counts.begin(), counts.end(), 0.0);
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = 0; t < Lr; ++t) {
      std::fill(taken.begin(), taken.end(), 0);
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)
          if (!taken[static_cast<size_t>(e)] &&
              (best < 0 || sc[static_cast<size_t>(t * E + e)] > sc[static_cast<size_t>(t * E + best)]))
            best = e;
        taken[static_cast<size_t>(best)] = 1, counts[static_cast<size_t>((t % G) * E + best)] += 1;
      }
    }
  } else if ((drops_ || G > 1) && lb) {
    // The router's own choices (without bias or groups, the plain top k),
    // counted per group, dropped or not (token dropping keeps fewer slots).
    const Tensor ri = routed(a.r_idx);
    std::vector<int32_t> idx(static_cast<size_t>(ri.numel()));
    copy_tensor(ri, Tensor(idx.data(), {ri.numel()}, DType::kI32));
    std::fill(counts.begin(), counts.end(), 0.0);
    for (size_t i = 0; i < idx.size(); ++i)
      counts[static_cast<size_t>((static_cast<int64_t>(i) / k % G) * E + idx[i])] += 1;
  }
  double z = 0;
  if (cfg_.moe_z_loss_coeff)
    for (double v : tensor_to_host(routed(a.r_lse))) z += v * v;
  std::vector<double> routed_kept;  // kept slots per expert (--moe-router-enable-expert-bias)
  if (cfg_.has_expert_bias())
    for (int64_t e = 0; e < E; ++e) routed_kept.push_back(static_cast<double>(off[e + 1] - off[e]));
  {
    ArenaScope scope(scratch_);
    const Tensor t = scratch({GE}, opt_.dtype);
    t.zero();
    // Sum over the rows of the scores per (group, expert): [Lr, E] as [Lr / G, G E].
    k::bias_grad(routed(a.r_scores).view({Lr / G, GE}), t);
    colsum = tensor_to_host(t);
    if (xlocal_) {
      // [counts | column sums | z | kept]: one fp64 all-reduce over TP.
      std::vector<double> v = counts;
      v.insert(v.end(), colsum.begin(), colsum.end());
      v.push_back(z);
      v.insert(v.end(), routed_kept.begin(), routed_kept.end());
      const Tensor u = scratch({static_cast<int64_t>(v.size())}, DType::kF64);
      host_to_tensor(v, u);
      opt_.tp_comm->all_reduce(u);
      v = tensor_to_host(u);
      std::copy(v.begin(), v.begin() + GE, counts.begin());
      std::copy(v.begin() + GE, v.begin() + 2 * GE, colsum.begin());
      z = v[static_cast<size_t>(2 * GE)];
      std::copy(v.begin() + 2 * GE + 1, v.end(), routed_kept.begin());
    }
    if (opt_.cp > 1) {
      host_to_tensor(counts, t);
      opt_.cp_comm->all_reduce(t);
      counts = tensor_to_host(t);
    }
  }
  double aux = 0;
  for (int64_t i = 0; i < GE; ++i) aux += colsum[static_cast<size_t>(i)] * counts[static_cast<size_t>(i)];
  const double lw = router_loss_weight(cfg_, l);
  s.moe_aux[static_cast<size_t>(l)] =
      lw * aux * static_cast<double>(E) / (static_cast<double>(k) * total * total) / static_cast<double>(G);
  if (cfg_.moe_z_loss_coeff) s.moe_z[static_cast<size_t>(l)] = lw * z / static_cast<double>(N_ * opt_.cp);
  s.moe_counts[static_cast<size_t>(l)] = std::move(counts);
  if (cfg_.has_expert_bias()) s.moe_routed[static_cast<size_t>(l)] = std::move(routed_kept);
}

// Backward of moe_forward. dy_own: d(y_own) [Ns, h]; dact, dfc1 [Rx, ...]
// scratch; dln_own receives d(ln2) of this rank's rows (the experts' part
// reduce-scattered over TP, then the router's, from this rank's rows: its
// weight gradient is partial over TP under SP, as Megatron's router marked
// sequence_parallel). The load-balancing and z-loss gradients are scaled by
// moe_loss_scale (GPTModel::set_moe_loss_scale). With ETP 1 under TP
// (xlocal_) the routed experts' side stays on this rank's rows: dy_own is
// gathered only for a shared expert, whose d(ln2) is reduce-scattered.
void GPTModel::moe_backward(int l, const LayerIdx& p, const LayerActs& a, const Slot& s, const Tensor& dy_own,
                            const Tensor& dact, const Tensor& dfc1, const Tensor& dln_own) {
  const int64_t E = cfg_.num_experts, k = cfg_.moe_router_topk;
  const DType dt = opt_.dtype;
  const bool shared = p.sh_fc1 >= 0;
  ArenaScope scope(scratch_);
  Tensor dout = dy_own;
  if (sp() && (!xlocal_ || shared)) {
    dout = scratch({N_, h_}, dy_own.dtype());
    opt_.tp_comm->all_gather(dy_own, dout);
  }
  const Tensor dy = scratch({R_, h_}, mid_), dprobs = scratch({Lr_, k}, dt);
  k::moe_unpermute_backward(xlocal_ ? dy_own : dout, a.y, routed(a.pos), routed(a.r_probs), dy, routed(dprobs));
  if (opt_.tp > 1 && !xlocal_) opt_.tp_comm->all_reduce(dprobs);  // each rank's columns gave part of y
  // The shared expert's backward, its d(ln2) added below. With its gate
  // (--moe-shared-expert-gate): d(output) times the gate on the way in, the
  // gate's d(logit) from dout . (ungated output) (this rank's columns' part,
  // summed over TP), its weight gradient and d(ln2) from this rank's rows
  // (partial over TP under SP, as the router's).
  Tensor sdx, gdx;
  if (shared) {
    Tensor dshared = dout;
    if (p.sh_gate >= 0) {
      const Tensor g = scratch({N_, 1}, dt), raw = scratch({N_, h_}, dt), dg = scratch({N_, 1}, dt);
      shared_gate_scores(p, a, g);
      linear_fwd(a.s_act, p.sh_fc2, -1, raw);
      dshared = scratch({N_, h_}, dout.dtype());
      k::moe_unpermute_backward(dout, raw, gate_rows_, g, dshared, dg);
      if (opt_.tp > 1) opt_.tp_comm->all_reduce(dg);
      k::moe_sigmoid_backward(g, dg, dg);
      gdx = scratch({Ns_, h_}, dn_);
      linear_bwd(own_rows(a.ln2), p.sh_gate, -1, own_rows(dg), gdx);
    }
    const Tensor ds_act = scratch(a.s_act.shape(), mid_), ds_fc1 = scratch(a.s_fc1.shape(), mid_);
    sdx = scratch({N_, h_}, sp() ? dt : dln_own.dtype());
    linear_bwd(a.s_act, p.sh_fc2, -1, dshared, ds_act);
    if (cfg_.swiglu) k::swiglu_backward(a.s_fc1, ds_act, ds_fc1);
    else k::gelu_backward(mlp_activation(cfg_), a.s_fc1, ds_act, ds_fc1);
    linear_bwd(a.ln2, p.sh_fc1, -1, ds_fc1, sdx);
  }
  // The experts' backward on the rows forward ran (moe_forward's exchange
  // in reverse: d(outputs) travel to the experts, d(inputs) back).
  const int64_t ep = opt_.ep;
  const std::vector<int64_t>& send = s.moe_send.at(static_cast<size_t>(l));
  const std::vector<int64_t>& recv = s.moe_recv.at(static_cast<size_t>(l));
  MT_CHECK(send.size() == static_cast<size_t>(ep) && recv.size() == static_cast<size_t>(E),
           "GPTModel::backward: an MoE layer's forward did not run for this slot");
  const int64_t nrecv = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  auto each_chunk = [&](auto&& fn) { each_expert_chunk(recv, ep, fn); };
  Tensor dyx = dy;
  if (ep > 1) {
    dyx = scratch({Rx_, h_}, mid_);
    opt_.ep_comm->all_to_all_v(dy, rows_to_elements(send), dyx, rows_to_elements(source_rows(recv)));
  }
  Tensor act = a.act;
  if (!act.defined()) {  // --recompute-modules moe_act: the forward's activation output again
    act = scratch({Rx_, F_}, gemm_in_);
    if (cfg_.swiglu) k::swiglu_forward(a.fc1.slice(0, nrecv), act.slice(0, nrecv));
    else k::gelu_forward(mlp_activation(cfg_), a.fc1.slice(0, nrecv), act.slice(0, nrecv));
  }
  each_chunk([&](int64_t e, int64_t r0, int64_t r1) {
    linear_bwd(act.slice(r0, r1), p.exp_fc2[e], -1, dyx.slice(r0, r1), dact.slice(r0, r1));
  });
  if (cfg_.swiglu) k::swiglu_backward(a.fc1.slice(0, nrecv), dact.slice(0, nrecv), dfc1.slice(0, nrecv));
  else k::gelu_backward(mlp_activation(cfg_), a.fc1.slice(0, nrecv), dact.slice(0, nrecv), dfc1.slice(0, nrecv));
  const Tensor dxp = scratch({Rx_, h_}, mid_);
  each_chunk([&](int64_t e, int64_t r0, int64_t r1) {
    linear_bwd(a.xp.slice(r0, r1), p.exp_fc1[e], -1, dfc1.slice(r0, r1), dxp.slice(r0, r1));
  });
  Tensor dx = dxp;
  if (ep > 1) {
    dx = scratch({R_, h_}, mid_);
    opt_.ep_comm->all_to_all_v(dxp, rows_to_elements(source_rows(recv)), dx, rows_to_elements(send));
  }
  if (xlocal_) {
    k::moe_unpermute(dx, routed(a.pos), Tensor(), dln_own);
    if (shared) {
      const Tensor sdx_own = scratch({Ns_, h_}, dt);
      opt_.tp_comm->reduce_scatter(sdx, sdx_own);
      k::add_inplace(dln_own, sdx_own);
    }
  } else if (sp()) {
    const Tensor full = scratch({N_, h_}, dt);
    k::moe_unpermute(dx, a.pos, Tensor(), full);
    if (sdx.defined()) k::add_inplace(full, sdx);
    opt_.tp_comm->reduce_scatter(full, dln_own);
  } else {
    k::moe_unpermute(dx, a.pos, Tensor(), dln_own);
    if (sdx.defined()) k::add_inplace(dln_own, sdx);
  }
  // The router, on this rank's rows.
  const int64_t r0 = sp() ? opt_.tp_rank * Ns_ : 0;
  const double total = static_cast<double>(N_ * opt_.cp);
  const bool lb = cfg_.moe_aux_loss_active();
  const int64_t G = cfg_.seq_aux_loss() ? B_ : 1, GE = G * E;  // moe_record_losses' groups
  const Tensor aux = scratch({GE}, dt), dlogits = scratch({Ns_, E}, dt), rdx = scratch({Ns_, h_}, dn_);
  // --moe-input-jitter-eps: the router's input, this rank's rows, jittered
  // again with the forward's noise.
  Tensor rin = own_rows(a.ln2);
  if (cfg_.jitters_router_input()) {
    const Tensor j = scratch({Ns_, h_}, rin.dtype());
    router_jitter(rin, j, true, l, s);
    rin = j;
  }
  // The sigmoid router's backward reads the logits: this rank's rows again.
  Tensor own_logits;
  if (cfg_.sigmoid_router()) {
    own_logits = scratch({Ns_, E}, dt);
    linear_fwd(rin, p.router_w, -1, own_logits);
  }
  {
    const std::vector<double>& counts = s.moe_counts.at(static_cast<size_t>(l));
    MT_CHECK(counts.size() == static_cast<size_t>(GE), "GPTModel::backward: an MoE layer's forward did not train");
    const double gt = total / static_cast<double>(G);  // a group's tokens
    const double w = lb ? cfg_.moe_aux_loss_coeff * static_cast<double>(E) /
                              (static_cast<double>(k) * gt * gt * static_cast<double>(G)) * moe_loss_scale_ *
                              router_loss_weight(cfg_, l)
                        : 0.0;
    std::vector<double> av(static_cast<size_t>(GE));
    for (int64_t i = 0; i < GE; ++i) av[static_cast<size_t>(i)] = w * counts[static_cast<size_t>(i)];
    host_to_tensor(av, aux);
  }
  const double z = cfg_.moe_z_loss_coeff.value_or(0.0) / total * moe_loss_scale_ * router_loss_weight(cfg_, l);
  // This rank's rows of the routing tensors (already all they hold with ETP 1).
  auto rows = [&](const Tensor& t) { return t.dim(0) == Ns_ ? t : t.slice(r0, r0 + Ns_); };
  k::moe_route_backward(rows(dprobs), rows(a.r_idx), rows(a.r_probs), rows(a.r_scores), rows(a.r_lse), aux, z,
                        moe_router(cfg_), own_logits, dlogits);
  linear_bwd(rin, p.router_w, -1, dlogits, rdx);
  if (cfg_.jitters_router_input()) router_jitter(rdx, rdx, true, l, s);  // d(x J)/dx = J
  k::add_inplace(dln_own, rdx);
  if (gdx.defined()) k::add_inplace(dln_own, gdx);
}

void GPTModel::router_jitter(const Tensor& x, const Tensor& y, bool own, int l, const Slot& s) const {
  for (const RowRun& r : own ? runs_ : all_runs_)
    k::jitter(x.slice(r.row, r.row + r.rows), y.slice(r.row, r.row + r.rows), *cfg_.moe_input_jitter_eps,
              kJitterSeedSalt, dropout_stream(s.dropout_step, l, 0), static_cast<uint64_t>(r.pos * B_ * h_));
}

std::vector<double> GPTModel::router_jitter_factors(int slot, int layer) const {
  MT_CHECK(cfg_.jitters_router_input() && opt_.device == Device::kCpu,
           "GPTModel::router_jitter_factors: needs --moe-input-jitter-eps and a CPU model");
  std::vector<double> out(static_cast<size_t>(N_ * h_));
  std::vector<float> ones32(out.size(), 1.0f);
  std::vector<double> ones64(out.size(), 1.0);
  const bool f64 = opt_.dtype == DType::kF64;
  const Tensor t = f64 ? Tensor(ones64.data(), {N_, h_}, DType::kF64) : Tensor(ones32.data(), {N_, h_}, DType::kF32);
  router_jitter(t, t, false, layer, slots_.at(static_cast<size_t>(slot)));
  for (size_t i = 0; i < out.size(); ++i) out[i] = f64 ? ones64[i] : static_cast<double>(ones32[i]);
  return out;
}

GPTModel::LayerActs GPTModel::mlp_shaped(const LayerActs& a, bool moe) const {
  LayerActs v = a;
  const int64_t rows = moe ? Rx_ : N_;
  if (v.fc1.defined()) v.fc1 = a.fc1.prefix({rows, moe ? fc1_ : fc1d_});
  if (moe && opt_.recompute.recomputes_moe_act()) v.act = Tensor();  // not kept: scratch (moe_forward/_backward)
  else if (v.act.defined()) v.act = a.act.prefix({rows, moe ? F_ : Fd_});
  return v;
}

void GPTModel::layer_forward(int l, const Tensor& x, LayerActs& held, const Tensor& out, const Slot& s) {
  const LayerIdx& p = layers_[l];
  const LayerActs a = mlp_shaped(held, p.router_w >= 0);
  const bool post = cfg_.apply_residual_connection_post_layernorm;
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  ArenaScope scope(scratch_);
  Tensor tmp = scratch({Ns_, h_}, opt_.dtype);
  // Selective recomputation: the attention output and lse live only in
  // scratch; MLA's Q/K/V too with mla_up_proj.
  Tensor ctx = a.ctx, lse = a.lse, qkv = a.qkv;
  if (!ctx.defined()) {
    ctx = scratch({N_, a_ * cfg_.head_dim()}, mid_);
    lse = scratch({B_, a_, T_}, opt_.dtype);
  }
  if (!qkv.defined()) qkv = scratch({N_, qkv_}, mid_);
  // Attention block.
  const Tensor ln1 = own_rows(a.ln1), ln2 = own_rows(a.ln2);
  norm_fwd(x, p.ln1_w, p.ln1_b, ln1, a.ln1_mean, a.ln1_rstd);
  if (cfg_.mla()) {
    mla_fwd(p, a, ln1, qkv);
  } else {
    column_fwd_input(ln1, a.ln1);
    linear_fwd(a.ln1, p.qkv_w, p.qkv_b, a.qkv);
    k::QkvLayout L{T_, B_, a_, g_, cfg_.head_dim()};
    if (cfg_.qk_layernorm) qk_norm_fwd(p, L, a);
    if (cfg_.applies_rope()) rope(a.qkv, false);
  }
  attention_fwd(qkv, attention_options(s, l), ctx, lse);
  if (cfg_.mla()) {  // linear_proj reads each head's value dims of the padded output
    ArenaScope proj(scratch_);
    const Tensor ctx_v = scratch({N_, a_ * cfg_.v_head_dim}, mid_);
    k::mla_ctx(ctx, ctx_v, mla_dims(), false);
    residual_linear_fwd(ctx_v, p.proj_w, p.proj_b, hd, dropout_stream(s.dropout_step, l, 1), post ? ln1 : x, tmp,
                        a.x_mid);
  } else {
    residual_linear_fwd(ctx, p.proj_w, p.proj_b, hd, dropout_stream(s.dropout_step, l, 1), post ? ln1 : x, tmp,
                        a.x_mid);
  }
  // MLP block.
  norm_fwd(a.x_mid, p.ln2_w, p.ln2_b, ln2, a.ln2_mean, a.ln2_rstd);
  // An MoE layer routing its own rows (ETP 1) gathers ln2 only for a shared expert.
  if (p.router_w < 0 || !xlocal_ || p.sh_fc1 >= 0) column_fwd_input(ln2, a.ln2);
  if (p.router_w >= 0) {
    moe_forward(l, p, a, out.defined() ? tmp : Tensor(), s);
    if (!out.defined()) return;
    if (hd > 0) hidden_dropout(tmp, tmp, hd, dropout_stream(s.dropout_step, l, 2));
    k::add(a.x_mid, tmp, out);
    return;
  }
  linear_fwd(a.ln2, p.fc1_w, p.fc1_b, a.fc1);
  if (cfg_.swiglu) k::swiglu_forward(a.fc1, a.act);
  else k::gelu_forward(mlp_activation(cfg_), a.fc1, a.act);
  if (!out.defined()) return;  // recomputing a group's last layer: backward needs nothing after act
  residual_linear_fwd(a.act, p.fc2_w, p.fc2_b, hd, dropout_stream(s.dropout_step, l, 2), post ? ln2 : a.x_mid, tmp,
                      out);
}

void GPTModel::layer_backward(int l, const Tensor& x, LayerActs& held, const Slot& s, const Tensor& dresid) {
  const LayerIdx& p = layers_[l];
  const LayerActs a = mlp_shaped(held, p.router_w >= 0);
  const bool post = cfg_.apply_residual_connection_post_layernorm;
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  const int64_t adim = a_ * cfg_.head_dim();
  ArenaScope scope(scratch_);
  const DType dt = opt_.dtype;
  // (An MoE layer's act may be recomputed, --recompute-modules moe_act: not kept.)
  const Shape act_shape = a.act.defined() ? a.act.shape() : Shape{Rx_, F_};
  Tensor dtmp = scratch({Ns_, h_}, rs_), dln = scratch({Ns_, h_}, dn_), dact = scratch(act_shape, mid_),
         dfc1 = scratch(a.fc1.shape(), mid_), dctx = scratch({N_, adim}, mid_), dqkv = scratch({N_, qkv_}, mid_);
  k::QkvLayout L{T_, B_, a_, g_, cfg_.head_dim()};
  const k::AttentionOptions ao = attention_options(s, l);
  Tensor ctx = a.ctx, lse = a.lse, qkv = a.qkv;
  if (!qkv.defined()) {
    // --recompute-modules mla_up_proj: MLA's Q/K/V again from the kept up
    // projections' inputs and position key, bitwise the forward's.
    qkv = scratch({N_, qkv_}, mid_);
    mla_up_fwd(p, a, a.kpe, qkv);
  }
  if (!ctx.defined()) {
    // Selective recomputation: core attention again from the saved (roped)
    // Q/K/V, same dropout stream, so ctx and lse are bitwise the forward's.
    ctx = scratch({N_, adim}, mid_);
    lse = scratch({B_, a_, T_}, dt);
    attention_fwd(qkv, ao, ctx, lse);
  }
  // out = res2 + dropout(fc2(act)), res2 = post ? ln2 : x_mid
  if (hd > 0) hidden_dropout(dresid, dtmp, hd, dropout_stream(s.dropout_step, l, 2));
  const Tensor& dfc2 = hd > 0 ? dtmp : dresid;
  if (p.router_w >= 0) {
    moe_backward(l, p, a, s, dfc2, dact, dfc1, dln);
  } else {
    row_linear_bwd(a.act, p.fc2_w, p.fc2_b, dfc2, dact);
    if (cfg_.swiglu) k::swiglu_backward(a.fc1, dact, dfc1);
    else k::gelu_backward(mlp_activation(cfg_), a.fc1, dact, dfc1);
    column_linear_bwd(a.ln2, p.fc1_w, p.fc1_b, dfc1, dln);
  }
  if (post) {
    k::add_inplace(dln, dresid);  // residual taken from ln2
    dresid.zero();
  }
  norm_bwd(dln, a.x_mid, p.ln2_w, p.ln2_b, a.ln2_mean, a.ln2_rstd, dresid);  // dresid = d x_mid
  // x_mid = res1 + dropout(proj(ctx)), res1 = post ? ln1 : x
  if (hd > 0) hidden_dropout(dresid, dtmp, hd, dropout_stream(s.dropout_step, l, 1));
  const Tensor& dproj = hd > 0 ? dtmp : dresid;
  if (cfg_.mla()) {
    // linear_proj read the value dims of ctx; its dx is zero-padded back.
    ArenaScope proj(scratch_);
    const Tensor ctx_v = scratch({N_, a_ * cfg_.v_head_dim}, mid_), dctx_v = scratch({N_, a_ * cfg_.v_head_dim}, mid_);
    k::mla_ctx(ctx, ctx_v, mla_dims(), false);
    row_linear_bwd(ctx_v, p.proj_w, p.proj_b, dproj, dctx_v);
    k::mla_ctx(dctx, dctx_v, mla_dims(), true);
  } else {
    row_linear_bwd(ctx, p.proj_w, p.proj_b, dproj, dctx);
  }
  attention_bwd(qkv, ctx, dctx, lse, ao, dqkv);
  if (cfg_.applies_rope()) rope(dqkv, true);
  if (cfg_.mla()) {
    mla_bwd(p, a, dqkv, own_rows(a.ln1), dln);
  } else {
    if (cfg_.qk_layernorm) qk_norm_bwd(p, L, a, dqkv);
    column_linear_bwd(a.ln1, p.qkv_w, p.qkv_b, dqkv, dln);
  }
  if (post) {
    k::add_inplace(dln, dresid);
    dresid.zero();
  }
  norm_bwd(dln, x, p.ln1_w, p.ln1_b, a.ln1_mean, a.ln1_rstd, dresid);  // dresid = d x
}

// Runs the layers of group g from its input x, keeping their activations in
// the workspace; the last layer writes `out`, or stops early when out is
// undefined (the recompute in backward).
void GPTModel::group_forward(const LayerGroup& g, const Tensor& x, Workspace& ws, const Tensor& out, const Slot& s) {
  const int64_t n = g.end - g.begin;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& in = i == 0 ? x : ws.resid[static_cast<size_t>(i - 1)];
    const Tensor& o = i + 1 < n ? ws.resid[static_cast<size_t>(i)] : out;
    layer_forward(static_cast<int>(g.begin + i), in, ws.layers[static_cast<size_t>(i)], o, s);
  }
}

double GPTModel::forward(int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step,
                         bool training, const Tensor& position_ids, const Tensor& segment_ids) {
  MT_CHECK(num_chunks() == 1 && opt_.pre_process && opt_.post_process,
           "GPTModel::forward: a pipeline stage runs forward_chunk()");
  return forward_chunk(0, slot, tokens, labels, dropout_step, training, position_ids, segment_ids);
}

void GPTModel::backward(int slot, double loss_scale) {
  MT_CHECK(num_chunks() == 1 && opt_.pre_process && opt_.post_process,
           "GPTModel::backward: a pipeline stage runs backward_chunk()");
  backward_chunk(slot, loss_scale, Tensor(), Tensor());
}

double GPTModel::label_count(int slot) const { return slots_.at(static_cast<size_t>(slot)).count; }
double GPTModel::loss_total(int slot) const { return slots_.at(static_cast<size_t>(slot)).loss_total; }
double GPTModel::mtp_label_count(int slot, int k) const {
  return slots_.at(static_cast<size_t>(slot)).mtp_count.at(static_cast<size_t>(k));
}
Tensor GPTModel::mtp_logits(int slot, int k) const {
  return slots_.at(static_cast<size_t>(slot)).mtp.at(static_cast<size_t>(k)).logits;
}
double GPTModel::mtp_loss_total(int slot, int k) const {
  return slots_.at(static_cast<size_t>(slot)).mtp_loss.at(static_cast<size_t>(k));
}

Tensor GPTModel::chunk_input(int slot) const { return slots_.at(static_cast<size_t>(slot)).resid[0]; }
Tensor GPTModel::chunk_output(int slot) const {
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  return s.resid[static_cast<size_t>(chunks_[static_cast<size_t>(s.chunk)].count)];
}

double GPTModel::forward_chunk(int chunk, int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step,
                               bool training, const Tensor& position_ids, const Tensor& segment_ids) {
  MT_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()),
           fmt::format("GPTModel::forward: slot {} outside [0, {}) (GPTOptions::slots)", slot, slots_.size()));
  MT_CHECK(chunk >= 0 && chunk < num_chunks(), fmt::format("GPTModel::forward: chunk {} outside [0, {})", chunk, num_chunks()));
  Slot& s = slots_[static_cast<size_t>(slot)];
  const LayerRange R = chunks_[static_cast<size_t>(chunk)];
  s.chunk = chunk;
  MT_CHECK(tokens.numel() == B_ * Tg_ && labels.numel() == B_ * Tg_ && tokens.dtype() == DType::kI32 &&
               labels.dtype() == DType::kI32,
           fmt::format("GPTModel::forward: tokens and labels must be int32 [{}, {}]", B_, Tg_));
  s.dropout_step = dropout_step;
  s.training = training;
  std::fill(s.moe_aux.begin(), s.moe_aux.end(), 0.0);
  std::fill(s.moe_z.begin(), s.moe_z.end(), 0.0);
  // [b, s] -> [s, b], on the host (tokens and labels are host tensors), then to the model's device.
  MT_CHECK(tokens.device() == Device::kCpu && labels.device() == Device::kCpu,
           "GPTModel::forward: tokens and labels are host tensors");
  const int32_t* tk = tokens.ptr<int32_t>();
  const int32_t* lb = labels.ptr<int32_t>();
  std::vector<int32_t> sb_tokens(static_cast<size_t>(N_)), sb_labels(static_cast<size_t>(N_));
  s.count = 0, s.loss_total = 0;
  // This rank's positions (all of them without CP).
  const k::QueryChunks qc = k::query_chunks(Tg_, opt_.cp, opt_.cp_rank);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t e = b * Tg_ + qc.position(t);
      int32_t id = tk[e];
      MT_CHECK(id >= 0 && id < Vg_, fmt::format("token id {} outside the vocabulary [0, {})", id, Vg_));
      sb_tokens[static_cast<size_t>(t * B_ + b)] = id;
      sb_labels[static_cast<size_t>(t * B_ + b)] = lb[e];
      MT_CHECK(lb[e] < Vg_, "label outside the vocabulary");
      if (lb[e] >= 0) s.count += 1;
    }
  copy_tensor(Tensor(sb_tokens.data(), s.tokens.shape(), DType::kI32), s.tokens);
  copy_tensor(Tensor(sb_labels.data(), s.labels.shape(), DType::kI32), s.labels);
  auto check_ids = [&](const Tensor& t, const char* what, const char* flag) {
    MT_CHECK(t.defined() && t.numel() == B_ * Tg_ && t.dtype() == DType::kI32 && t.device() == Device::kCpu,
             fmt::format("GPTModel::forward: {} wants the micro-batch's {} as an int32 [{}, {}] host tensor", flag,
                         what, B_, Tg_));
  };
  if (opt_.reset_attention_mask) {
    // Each position's document start (segments are nondecreasing: a new one begins after an EOD).
    check_ids(segment_ids, "segment ids", "--reset-attention-mask");
    const int32_t* sg = segment_ids.ptr<int32_t>();
    std::vector<int32_t> ds(static_cast<size_t>(B_ * Tg_));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t t = 0; t < Tg_; ++t) {
        const int64_t e = b * Tg_ + t;
        MT_CHECK(t == 0 || sg[e] >= sg[e - 1], "GPTModel::forward: segment ids must not decrease along a sequence");
        ds[static_cast<size_t>(e)] = t == 0 || sg[e] != sg[e - 1] ? static_cast<int32_t>(t) : ds[static_cast<size_t>(e - 1)];
      }
    copy_tensor(Tensor(ds.data(), s.doc_start.shape(), DType::kI32), s.doc_start);
  }
  if (s.positions.defined()) {  // --reset-position-ids with learned position embeddings
    check_ids(position_ids, "position ids", "--reset-position-ids");
    const int32_t* pi = position_ids.ptr<int32_t>();
    std::vector<int32_t> sb_pos(static_cast<size_t>(N_));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t t = 0; t < T_; ++t) {
        const int32_t p = pi[b * Tg_ + qc.position(t)];
        MT_CHECK(p >= 0 && p < Tg_, fmt::format("position id {} outside [0, {})", p, Tg_));
        sb_pos[static_cast<size_t>(t * B_ + b)] = p;
      }
    copy_tensor(Tensor(sb_pos.data(), s.positions.shape(), DType::kI32), s.positions);
  }
  // Embedding (vocab-parallel: a token outside this rank's rows gives zeros;
  // fwd all-reduce over TP, with SP reduce-scatter to this rank's sequence
  // shard) + learned positions of the shard, then dropout.
  if (first_stage(chunk)) {
  if (forward_hook_) forward_hook_(-1);
  {
    ArenaScope scope(scratch_);
    if (sp()) {
      Tensor full = scratch({N_, h_}, rs_);
      k::embedding_forward(s.tokens, params_[word_], vocab_start(), full);
      opt_.tp_comm->reduce_scatter(full, s.resid[0]);
    } else {
      k::embedding_forward(s.tokens, params_[word_], vocab_start(), s.resid[0]);
      if (opt_.tp > 1) opt_.tp_comm->all_reduce(s.resid[0]);
    }
  }
  if (pos_ >= 0 && s.positions.defined()) {
    // Each own row's position embedding, gathered by its position id, then
    // added as one position per row (the same rounding as below).
    ArenaScope scope(scratch_);
    const Tensor rows = scratch({Ns_, h_}, opt_.dtype);
    k::embedding_forward(own_rows(s.positions), params_[pos_], 0, rows);
    k::position_add_forward(rows, 1, s.resid[0]);
  } else if (pos_ >= 0) {
    for (const RowRun& r : runs_)
      k::position_add_forward(params_[pos_].slice(r.pos, r.pos + r.rows / B_), B_,
                              s.resid[0].slice(r.row, r.row + r.rows));
  }
  const double hd = training ? cfg_.hidden_dropout : 0.0;
  if (hd > 0) hidden_dropout(s.resid[0], s.resid[0], hd, dropout_stream(dropout_step, 4095, 3));
  }  // else: the previous stage's output was received into s.resid[0]
  {
    ArenaScope scope(scratch_);
    Workspace ws = carve_workspace();
    // Positions i in the chunk are global layers R.first + i.
    for (const LayerGroup& g : chunk_groups_[static_cast<size_t>(chunk)]) {
      if (forward_hook_)
        for (int64_t i = g.begin; i < g.end; ++i) forward_hook_(static_cast<int>(R.first + i));
      if (g.recompute) {
        group_forward({R.first + g.begin, R.first + g.end, true}, s.resid[static_cast<size_t>(g.begin)], ws,
                      s.resid[static_cast<size_t>(g.end)], s);
      } else {
        for (int64_t i = g.begin; i < g.end; ++i)
          layer_forward(static_cast<int>(R.first + i), s.resid[static_cast<size_t>(i)], s.layers[static_cast<size_t>(i)],
                        s.resid[static_cast<size_t>(i + 1)], s);
      }
    }
  }
  s.ready = true;
  std::vector<int64_t> ran;  // the layers this forward ran (the MTP layers' added below)
  for (int64_t l = R.first; l < R.first + R.count; ++l) ran.push_back(l);
  if (!last_stage(chunk)) {
    record_moe_stats(s, ran);
    return 0.0;
  }

  // Final norm (on the shard with SP, then all-gathered), output layer (tied:
  // the word embedding; vocab-parallel), loss (vocab-parallel cross-entropy).
  if (forward_hook_) {
    forward_hook_(static_cast<int>(cfg_.num_layers));
    // The tied output weight is the embedding's; the MTP layers embed too.
    if ((out_ == word_ || !mtp_.empty()) && !opt_.pre_process) forward_hook_(-1);
  }
  norm_fwd(s.resid[static_cast<size_t>(R.count)], final_w_, final_b_, own_rows(s.lnf), s.lnf_mean, s.lnf_rstd);
  column_fwd_input(own_rows(s.lnf), s.lnf);
  s.loss_total = output_loss_fwd(s.lnf, s.labels, s.logits, s.mx, s.se, s.tl, s.loss);
  if (!mtp_.empty()) mtp_forward(s, tk, lb);
  for (int64_t l = cfg_.num_layers; l < cfg_.total_layers() && !mtp_.empty(); ++l) ran.push_back(l);
  record_moe_stats(s, ran);
  return s.count > 0 ? s.loss_total / s.count : 0.0;
}

// The training forward's router statistics of the layers it ran (this
// chunk's, and the MTP layers' on the last stage), into moe_stats_ and
// the expert-bias counts.
void GPTModel::record_moe_stats(const Slot& s, const std::vector<int64_t>& ran) {
  if (!s.training || !cfg_.is_moe()) return;
  moe_stats_.load_balancing += std::accumulate(s.moe_aux.begin(), s.moe_aux.end(), 0.0);
  moe_stats_.z += std::accumulate(s.moe_z.begin(), s.moe_z.end(), 0.0);
  MoeStats& st = moe_stats_;
  const size_t L = static_cast<size_t>(cfg_.total_layers());
  if (st.layer_micro_batches.size() != L)
    st.layer_load_balancing.assign(L, 0.0), st.layer_z.assign(L, 0.0), st.layer_micro_batches.assign(L, 0.0);
  for (int64_t l : ran) {  // the MoE layers (--moe-layer-freq: not all)
    if (layers_[static_cast<size_t>(l)].router_w < 0) continue;
    // A repeated MTP layer's D depths log as one layer, each 1/D of a forward.
    const size_t i = static_cast<size_t>(cfg_.param_layer(l));
    const double w = router_loss_weight(cfg_, l);
    st.layer_forwards += w, st.layer_micro_batches[i] += w;
    st.layer_load_balancing[i] += s.moe_aux[static_cast<size_t>(l)], st.layer_z[i] += s.moe_z[static_cast<size_t>(l)];
  }
  for (int64_t l : ran) {
    if (!cfg_.has_expert_bias()) break;
    const std::vector<double>& c = s.moe_routed[static_cast<size_t>(l)];
    std::vector<double>& acc = bias_counts_[static_cast<size_t>(cfg_.param_layer(l))];
    acc.resize(c.size(), 0.0);
    for (size_t e = 0; e < c.size(); ++e) acc[e] += c[e];
  }
}

double GPTModel::output_loss_fwd(const Tensor& lnf, const Tensor& labels, const Tensor& logits, const Tensor& mx,
                                 const Tensor& se, const Tensor& tl, const Tensor& loss) {
  if (opt_.half_compute) {
    ArenaScope scope(scratch_);
    k::gemm(false, true, N_, V_, h_, 1.0f, as_half(lnf), lowp_[out_], 0.0f, logits);
  } else {
    k::gemm(false, true, N_, V_, h_, 1.0f, lnf, params_[out_], 0.0f, logits);
  }
  k::xent_partials(logits, labels, vocab_start(), mx, se, tl);
  if (opt_.tp > 1) {
    // Global max, sums of exp rescaled to it, the target logit from its owner.
    ArenaScope scope(scratch_);
    Tensor gmax = scratch({N_}, opt_.dtype);
    copy_tensor(mx, gmax);
    opt_.tp_comm->all_reduce(gmax, comm::ReduceOp::kMax);
    k::xent_rescale(se, mx, gmax);
    copy_tensor(gmax, mx);
    opt_.tp_comm->all_reduce(se);
    opt_.tp_comm->all_reduce(tl);
  }
  k::xent_loss(mx, se, tl, labels, loss);
  // Per-token losses to the host, summed in token order on every backend.
  std::vector<char> host_loss(loss.nbytes());
  Tensor hl(host_loss.data(), loss.shape(), loss.dtype());
  copy_tensor(loss, hl);
  double total = 0;
  for (int64_t i = 0; i < N_; ++i)
    total += opt_.dtype == DType::kF32 ? static_cast<double>(hl.ptr<float>()[i]) : hl.ptr<double>()[i];
  return total;
}

void GPTModel::output_loss_bwd(const Tensor& lnf, const Tensor& labels, const Tensor& logits, const Tensor& mx,
                               const Tensor& se, double g, const Tensor& dlnf_own) {
  ArenaScope scope(scratch_);
  const DType dt = opt_.dtype;
  Tensor dloss = scratch({N_}, dt);
  {
    std::vector<char> host(dloss.nbytes());
    Tensor hd(host.data(), dloss.shape(), dt);
    for (int64_t i = 0; i < N_; ++i) {
      if (dt == DType::kF32) hd.ptr<float>()[i] = static_cast<float>(g);
      else hd.ptr<double>()[i] = g;
    }
    copy_tensor(hd, dloss);
  }
  // dlogits overwrite the logits (fp32); bf16 compute writes them below.
  if (!opt_.half_compute) k::xent_backward(logits, labels, vocab_start(), mx, se, dloss, logits);
  // Output layer: dx is partial over the vocabulary shards: all-reduce
  // (SP: reduce-scatter to this rank's rows).
  Tensor dx = sp() ? scratch({N_, h_}, dn_) : dlnf_own;
  if (opt_.half_compute) {
    // dlogits in bf16 straight from the softmax (no fp32 [N, V] pass).
    Tensor dh = scratch({N_, V_}, opt_.half);
    k::xent_backward_half(logits, labels, vocab_start(), mx, se, dloss, dh);
    const Tensor xh = as_half(lnf);
    k::gemm(false, false, N_, h_, V_, 1.0f, dh, lowp_[out_], 0.0f, dx);
    k::gemm(true, false, V_, h_, N_, 1.0f, dh, xh, 1.0f, grads_[out_]);
  } else {
    k::gemm(false, false, N_, h_, V_, 1.0f, logits, params_[out_], 0.0f, dx);
    k::gemm(true, false, V_, h_, N_, 1.0f, logits, lnf, 1.0f, grads_[out_]);
  }
  if (sp()) opt_.tp_comm->reduce_scatter(dx, dlnf_own);
  else if (opt_.tp > 1) opt_.tp_comm->all_reduce(dlnf_own);
}

// --mtp-num-layers, forward of depth k = 1..D (Megatron's
// MultiTokenPredictionLayer; see ModelConfig::mtp_num_layers). The tokens
// and labels rolled left k times come from the host micro-batch (the whole
// sequence is on every rank, so with CP this is Megatron's roll with the
// neighbours' exchange, and rolling each depth once more is rolling the
// first k times).
void GPTModel::mtp_forward(Slot& s, const int32_t* tk, const int32_t* lb) {
  const k::QueryChunks qc = k::query_chunks(Tg_, opt_.cp, opt_.cp_rank);
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  for (size_t j = 0; j < mtp_.size(); ++j) {
    const MtpIdx& m = mtp_[j];
    MtpActs& a = s.mtp[j];
    const int l = static_cast<int>(cfg_.num_layers) + static_cast<int>(j);
    const int64_t shift = static_cast<int64_t>(j) + 1;
    std::vector<int32_t> rt(static_cast<size_t>(N_)), rl(static_cast<size_t>(N_));
    double count = 0;
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t p = qc.position(t) + shift, r = t * B_ + b;
        const bool in = p < Tg_;
        rt[static_cast<size_t>(r)] = in ? tk[b * Tg_ + p] : 0;
        rl[static_cast<size_t>(r)] = in ? lb[b * Tg_ + p] : -1;
        if (rl[static_cast<size_t>(r)] >= 0) count += 1;
      }
    copy_tensor(Tensor(rt.data(), a.tokens.shape(), DType::kI32), a.tokens);
    copy_tensor(Tensor(rl.data(), a.labels.shape(), DType::kI32), a.labels);
    s.mtp_count[j] = count;
    // The shared word embedding of the rolled tokens (vocab-parallel, as
    // the decoder's), then the embedding dropout.
    {
      ArenaScope scope(scratch_);
      if (sp()) {
        Tensor full = scratch({N_, h_}, rs_);
        k::embedding_forward(a.tokens, params_[word_], vocab_start(), full);
        opt_.tp_comm->reduce_scatter(full, a.emb);
      } else {
        k::embedding_forward(a.tokens, params_[word_], vocab_start(), a.emb);
        if (opt_.tp > 1) opt_.tp_comm->all_reduce(a.emb);
      }
    }
    if (hd > 0) hidden_dropout(a.emb, a.emb, hd, dropout_stream(s.dropout_step, l, 3));
    // eh_proj's input [enorm(emb) | hnorm(h_{k-1})], this rank's rows, then
    // (SP) all-gathered; its output gathered along the features.
    const Tensor cat_own = own_rows(a.cat);
    const Tensor prev = own_rows(j == 0 ? s.lnf : s.mtp[j - 1].lnf);
    {
      ArenaScope scope(scratch_);
      const Tensor tmp = scratch({Ns_, h_}, gemm_in_);
      norm_fwd(a.emb, m.enorm_w, m.enorm_b, tmp, a.e_mean, a.e_rstd);
      copy_columns(tmp, 0, cat_own, 0, h_);
      norm_fwd(prev, m.hnorm_w, m.hnorm_b, tmp, a.h_mean, a.h_rstd);
      copy_columns(tmp, 0, cat_own, h_, h_);
    }
    column_fwd_input(cat_own, a.cat);
    if (opt_.tp == 1) {
      linear_fwd(a.cat, m.eh_w, -1, a.x);
    } else {
      ArenaScope scope(scratch_);
      const int64_t w = h_ / opt_.tp;
      const Tensor y = scratch({N_, w}, rs_), all = scratch({opt_.tp * N_, w}, rs_);
      linear_fwd(a.cat, m.eh_w, -1, y);
      opt_.tp_comm->all_gather(y, all);
      const int64_t r0 = sp() ? opt_.tp_rank * Ns_ : 0;  // this rank's rows of each rank's block
      for (int64_t r = 0; r < opt_.tp; ++r) copy_columns(all.slice(r * N_ + r0, r * N_ + r0 + Ns_), 0, a.x, r * w, w);
    }
    {
      ArenaScope scope(scratch_);
      layer_forward(l, a.x, a.layer, a.y, s);
    }
    norm_fwd(a.y, m.final_w, m.final_b, own_rows(a.lnf), a.f_mean, a.f_rstd);
    column_fwd_input(own_rows(a.lnf), a.lnf);
    s.mtp_loss[j] = output_loss_fwd(a.lnf, a.labels, a.logits, a.mx, a.se, a.tl, a.loss);
    if (!s.training) continue;
    // Megatron's acceptance counts: counted labels whose logit is the row's
    // largest (the vocabulary-parallel max and target logit above are the
    // whole vocabulary's), i.e. the depth's greedy guess is the label.
    std::vector<char> host(2 * a.mx.nbytes());
    const Tensor hm(host.data(), a.mx.shape(), a.mx.dtype()), ht(host.data() + a.mx.nbytes(), a.tl.shape(), a.tl.dtype());
    copy_tensor(a.mx, hm);
    copy_tensor(a.tl, ht);
    double correct = 0;
    for (int64_t i = 0; i < N_; ++i) {
      const bool top = opt_.dtype == DType::kF32 ? ht.ptr<float>()[i] >= hm.ptr<float>()[i]
                                                 : ht.ptr<double>()[i] >= hm.ptr<double>()[i];
      correct += rl[static_cast<size_t>(i)] >= 0 && top ? 1 : 0;
    }
    s.mtp_correct[j] = correct;
  }
  if (s.training) {
    mtp_stats_.loss.resize(mtp_.size(), 0.0);
    mtp_stats_.correct.resize(mtp_.size(), 0.0), mtp_stats_.total.resize(mtp_.size(), 0.0);
    for (size_t j = 0; j < mtp_.size(); ++j) {
      mtp_stats_.loss[j] += s.mtp_count[j] > 0 ? s.mtp_loss[j] / s.mtp_count[j] : 0.0;
      mtp_stats_.correct[j] += s.mtp_correct[j], mtp_stats_.total[j] += s.mtp_count[j];
    }
    mtp_stats_.micro_batches += 1;
  }
}

// Backward of the MTP depths, last first: depth k's loss (weight
// --mtp-loss-scaling-factor / D over its counted labels, times loss_scale
// as the decoder's loss) and the gradient of h_k from depth k+1's hnorm
// meet at its final norm; its layer, eh_proj, enorm into the word
// embedding, and hnorm into h_{k-1}. d(h_0) is added into dlnf.
void GPTModel::mtp_backward(Slot& s, double loss_scale, const Tensor& dlnf) {
  ArenaScope scope(scratch_);
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  const double weight = cfg_.mtp_loss_scaling_factor / static_cast<double>(cfg_.mtp_layers());
  // d(h_k) from depth k+1, this rank's rows, in h_k's dtype (the norm
  // kernels' dx shares x's): bf16 under --bf16, added into the fp32 d(lnf).
  const Tensor dh = scratch({Ns_, h_}, gemm_in_);
  for (size_t jj = mtp_.size(); jj-- > 0;) {
    const MtpIdx& m = mtp_[jj];
    MtpActs& a = s.mtp[jj];
    const int l = static_cast<int>(cfg_.num_layers) + static_cast<int>(jj);
    ArenaScope depth(scratch_);
    const Tensor dlnf_k = scratch({Ns_, h_}, dn_), dy = scratch({Ns_, h_}, rs_);
    const double g = s.mtp_count[jj] > 0 ? loss_scale * weight / s.mtp_count[jj] : 0.0;
    output_loss_bwd(a.lnf, a.labels, a.logits, a.mx, a.se, g, dlnf_k);
    if (jj + 1 < mtp_.size()) k::add_inplace(dlnf_k, dh);
    dy.zero();
    norm_bwd(dlnf_k, a.y, m.final_w, m.final_b, a.f_mean, a.f_rstd, dy);
    layer_backward(l, a.x, a.layer, s, dy);  // dy: d(x)
    // eh_proj: this rank's output columns of d(x) (SP: gathered first).
    const Tensor dcat = scratch({Ns_, 2 * h_}, dn_);
    if (opt_.tp == 1) {
      column_linear_bwd(a.cat, m.eh_w, -1, dy, dcat);
    } else {
      ArenaScope cols(scratch_);
      const int64_t w = h_ / opt_.tp;
      const Tensor dyl = scratch({N_, w}, rs_);
      if (sp()) {
        ArenaScope full(scratch_);
        const Tensor all = scratch({N_, h_}, rs_);
        opt_.tp_comm->all_gather(dy, all);
        copy_columns(all, opt_.tp_rank * w, dyl, 0, w);
      } else {
        copy_columns(dy, opt_.tp_rank * w, dyl, 0, w);
      }
      column_linear_bwd(a.cat, m.eh_w, -1, dyl, dcat);
    }
    const Tensor dnorm = scratch({Ns_, h_}, dn_);
    // enorm, the embedding dropout, the word embedding's rows (SP: all-gathered d).
    copy_columns(dcat, 0, dnorm, 0, h_);
    dy.zero();
    norm_bwd(dnorm, a.emb, m.enorm_w, m.enorm_b, a.e_mean, a.e_rstd, dy);
    if (hd > 0) hidden_dropout(dy, dy, hd, dropout_stream(s.dropout_step, l, 3));
    if (sp()) {
      ArenaScope full(scratch_);
      const Tensor all = scratch({N_, h_}, rs_);
      opt_.tp_comm->all_gather(dy, all);
      k::embedding_backward(a.tokens, all, vocab_start(), grads_[word_]);
    } else {
      k::embedding_backward(a.tokens, dy, vocab_start(), grads_[word_]);
    }
    // hnorm: d(h_{k-1}).
    copy_columns(dcat, h_, dnorm, 0, h_);
    const Tensor prev = own_rows(jj == 0 ? s.lnf : s.mtp[jj - 1].lnf);
    dh.zero();
    norm_bwd(dnorm, prev, m.hnorm_w, m.hnorm_b, a.h_mean, a.h_rstd, dh);
  }
  k::add_inplace(dlnf, dh);
}

void GPTModel::backward_chunk(int slot, double loss_scale, const Tensor& doutput, const Tensor& dinput) {
  MT_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()),
           fmt::format("GPTModel::backward: slot {} outside [0, {}) (GPTOptions::slots)", slot, slots_.size()));
  Slot& s = slots_[static_cast<size_t>(slot)];
  MT_CHECK(s.ready, "GPTModel::backward: slot has no forward");
  moe_loss_scale_ = moe_loss_scale_override_.value_or(loss_scale * static_cast<double>(opt_.cp));
  s.ready = false;
  const int chunk = s.chunk;
  const LayerRange R = chunks_[static_cast<size_t>(chunk)];
  ArenaScope scope(scratch_);
  Tensor dlnf = scratch({Ns_, h_}, dn_), dresid = scratch({Ns_, h_}, rs_);
  if (!last_stage(chunk)) {
    MT_CHECK(doutput.defined() && doutput.numel() == Ns_ * h_ && doutput.dtype() == rs_,
             fmt::format("GPTModel::backward_chunk: d(output) must be [{}, {}] {}", Ns_, h_, dtype_name(rs_)));
    copy_tensor(doutput, dresid);
  } else {
  output_loss_bwd(s.lnf, s.labels, s.logits, s.mx, s.se, s.count > 0 ? loss_scale / s.count : 0.0, dlnf);
  if (!mtp_.empty()) mtp_backward(s, loss_scale, dlnf);
  dresid.zero();
  norm_bwd(dlnf, s.resid[static_cast<size_t>(R.count)], final_w_, final_b_, s.lnf_mean, s.lnf_rstd, dresid);
  if (backward_hook_) backward_hook_(static_cast<int>(cfg_.num_layers));
  }
  {
    ArenaScope ws_scope(scratch_);
    Workspace ws = carve_workspace();
    const auto& groups = chunk_groups_[static_cast<size_t>(chunk)];
    for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
      const LayerGroup& grp = *it;  // positions in the chunk; global layer = R.first + position
      if (grp.recompute) {
        // Re-run the group's forward from its kept input (same dropout step),
        // then its backward, last layer first.
        const Tensor& x0 = s.resid[static_cast<size_t>(grp.begin)];
        group_forward({R.first + grp.begin, R.first + grp.end, true}, x0, ws, Tensor(), s);
        for (int64_t i = grp.end - grp.begin - 1; i >= 0; --i) {
          const Tensor& in = i == 0 ? x0 : ws.resid[static_cast<size_t>(i - 1)];
          layer_backward(static_cast<int>(R.first + grp.begin + i), in, ws.layers[static_cast<size_t>(i)], s, dresid);
          if (backward_hook_) backward_hook_(static_cast<int>(R.first + grp.begin + i));
        }
      } else {
        for (int64_t i = grp.end - 1; i >= grp.begin; --i) {
          layer_backward(static_cast<int>(R.first + i), s.resid[static_cast<size_t>(i)], s.layers[static_cast<size_t>(i)],
                         s, dresid);
          if (backward_hook_) backward_hook_(static_cast<int>(R.first + i));
        }
      }
    }
  }
  if (!first_stage(chunk)) {
    if (dinput.defined()) {
      MT_CHECK(dinput.numel() == Ns_ * h_ && dinput.dtype() == rs_,
               fmt::format("GPTModel::backward_chunk: d(input) must be [{}, {}] {}", Ns_, h_, dtype_name(rs_)));
      copy_tensor(dresid, dinput);
    }
    return;
  }
  const double hd = s.training ? cfg_.hidden_dropout : 0.0;
  if (hd > 0) hidden_dropout(dresid, dresid, hd, dropout_stream(s.dropout_step, 4095, 3));
  if (pos_ >= 0 && s.positions.defined()) {
    k::embedding_backward(own_rows(s.positions), dresid, 0, grads_[pos_]);
  } else if (pos_ >= 0) {
    for (const RowRun& r : runs_)
      k::position_add_backward(dresid.slice(r.row, r.row + r.rows), B_,
                               grads_[pos_].slice(r.pos, r.pos + r.rows / B_));
  }
  // Embedding: SP all-gathers d(output) back to the full sequence; each rank
  // accumulates the rows of its vocabulary shard.
  if (sp()) {
    Tensor full = scratch({N_, h_}, rs_);
    opt_.tp_comm->all_gather(dresid, full);
    k::embedding_backward(s.tokens, full, vocab_start(), grads_[word_]);
  } else {
    k::embedding_backward(s.tokens, dresid, vocab_start(), grads_[word_]);
  }
  if (backward_hook_) backward_hook_(-1);
}

double GPTModel::moe_load_balancing_loss(int slot) const {
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  return std::accumulate(s.moe_aux.begin(), s.moe_aux.end(), 0.0);
}

double GPTModel::moe_z_loss(int slot) const {
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  return std::accumulate(s.moe_z.begin(), s.moe_z.end(), 0.0);
}

double GPTModel::flops_per_micro_batch() const {
  // With CP a rank's T / cp queries see 1/cp of the causal pairs (Megatron
  // counts the whole s^2 term per sequence; here per rank: its share).
  const double T = static_cast<double>(N_),
               Q = static_cast<double>(B_) * static_cast<double>(Tg_) * static_cast<double>(Tg_) / static_cast<double>(opt_.cp);
  return T * flops_per_token(cfg_, Vg_) + Q * flops_per_token_pair(cfg_);
}

}  // namespace mt::model
