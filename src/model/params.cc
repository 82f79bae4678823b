#include "model/params.h"

#include <fmt/format.h>

#include <algorithm>

namespace mt::model {

Shape ParamSpec::local_shape(int64_t tp) const {
  Shape s = global_shape;
  if (shard != ShardKind::kReplicated) {
    MT_CHECK(s[shard_dim] % (tp * shard_chunks) == 0,
             fmt::format("{}: dim {} of {} does not split over TP {}", name, shard_dim, s.str(), tp));
    s.d[shard_dim] /= tp;
  }
  return s;
}

std::string ParamSpec::te_name() const {
  auto replace = [&](const std::string& from, const std::string& to) -> std::string {
    auto p = name.find(from);
    return p == std::string::npos ? std::string() : name.substr(0, p) + to + name.substr(p + from.size());
  };
  if (auto r = replace("input_layernorm.", "self_attention.linear_qkv.layer_norm_"); !r.empty()) return r;
  if (auto r = replace("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"); !r.empty()) return r;
  return name;
}

std::vector<ShardPiece> shard_pieces(const ParamSpec& spec, int64_t tp, int64_t r) {
  const Shape local = spec.local_shape(tp);
  std::vector<int64_t> zero(static_cast<size_t>(local.ndim), 0);
  switch (spec.shard) {
    case ShardKind::kReplicated: return {ShardPiece{zero, local, 0}};
    case ShardKind::kRow: {
      auto off = zero;
      off[1] = r * local[1];
      return {ShardPiece{off, local, 0}};
    }
    case ShardKind::kVocab:
    case ShardKind::kColumn: {
      // dim 0 split per chunk: chunk j of the global tensor is rows
      // [j G/c, (j+1) G/c); this rank holds rows [r R/c, (r+1) R/c) of each.
      const int64_t c = spec.shard_chunks, G = spec.global_shape[0], R = local[0];
      std::vector<ShardPiece> v;
      for (int64_t j = 0; j < c; ++j) {
        auto off = zero;
        off[0] = j * (G / c) + r * (R / c);
        Shape sh = local;
        sh.d[0] = R / c;
        v.push_back(ShardPiece{off, sh, j * (R / c)});
      }
      return v;
    }
  }
  return {};
}

std::vector<FlatPiece> flat_range_pieces(const ParamSpec& spec, int64_t tp, int64_t r, int64_t begin, int64_t end) {
  std::vector<FlatPiece> out;
  const Shape local = spec.local_shape(tp);
  MT_CHECK(0 <= begin && begin <= end && end <= local.numel(), "flat_range_pieces: range outside the tensor");
  if (begin == end) return out;
  const int64_t C = local.ndim >= 2 ? local.numel() / local[0] : 1;  // elements per local row
  for (const ShardPiece& p : shard_pieces(spec, tp, r)) {
    // The piece covers local flat [p0, p1).
    const int64_t p0 = p.local_row * C, p1 = p0 + p.shape.numel();
    const int64_t b = std::max(begin, p0), e = std::min(end, p1);
    if (b >= e) continue;
    auto emit = [&](int64_t fb, int64_t fe) {  // local flat [fb, fe) inside one piece, rectangular
      FlatPiece f;
      f.offsets = p.offsets;
      f.local_flat = fb;
      if (local.ndim == 1) {
        f.offsets[0] += fb - p0;
        f.shape = Shape{fe - fb};
      } else {
        MT_CHECK(local.ndim == 2, "flat_range_pieces: parameters are 1-D or 2-D");
        const int64_t row = (fb - p0) / C, col = (fb - p0) % C;
        f.offsets[0] += row;
        f.offsets[1] += col;
        f.shape = (fe - fb) % C == 0 && col == 0 ? Shape{(fe - fb) / C, C} : Shape{1, fe - fb};
      }
      out.push_back(std::move(f));
    };
    if (local.ndim == 1) {
      emit(b, e);
      continue;
    }
    // Partial first row, whole rows, partial last row.
    int64_t x = b;
    const int64_t first_row_end = p0 + ((x - p0) / C + 1) * C;
    if ((x - p0) % C != 0) {
      const int64_t y = std::min(e, first_row_end);
      emit(x, y);
      x = y;
    }
    const int64_t whole_end = p0 + ((e - p0) / C) * C;
    if (x < whole_end) {
      emit(x, whole_end);
      x = whole_end;
    }
    if (x < e) emit(x, e);
  }
  return out;
}

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::kReplicated: return "replicated";
    case ShardKind::kColumn: return "column";
    case ShardKind::kRow: return "row";
    case ShardKind::kVocab: return "vocab";
  }
  return "?";
}

std::vector<ParamSpec> gpt_param_specs(const ModelConfig& c, int64_t tp) {
  MT_CHECK(c.has_architecture() && c.vocab_size, "gpt_param_specs: incomplete ModelConfig");
  const int64_t h = c.hidden_size, a = c.num_attention_heads, g = c.query_groups(), d = c.head_dim();
  const int64_t F = c.ffn(), V = c.padded_vocab(tp), gate = c.swiglu ? 2 : 1;
  const bool ln = c.normalization == Normalization::kLayerNorm, bias = c.add_bias_linear;
  std::vector<ParamSpec> v;
  auto add = [&](std::string name, Shape s, ShardKind k, int dim, InitKind init, bool wd, int layer, int chunks = 1) {
    v.push_back(ParamSpec{std::move(name), s, k, dim, chunks, init, wd, layer});
  };
  add("embedding.word_embeddings.weight", {V, h}, ShardKind::kVocab, 0, InitKind::kNormal, true, -1);
  if (c.position_embedding == PositionEmbedding::kLearnedAbsolute)
    add("embedding.position_embeddings.weight", {c.max_position_embeddings, h}, ShardKind::kReplicated, -1,
        InitKind::kNormal, true, -1);
  auto norm = [&](const std::string& prefix, int layer) {
    // --apply-layernorm-1p stores gamma - 1 (zero-centred), initialised to 0.
    add(prefix + ".weight", {h}, ShardKind::kReplicated, -1, c.apply_layernorm_1p ? InitKind::kZeros : InitKind::kOnes,
        false, layer);
    if (ln) add(prefix + ".bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, layer);
  };
  // One transformer layer (a decoder layer, or an MTP depth's) under its prefix.
  auto layer = [&](int i) {
    const std::string p = c.layer_prefix(i);
    norm(p + "input_layernorm", i);
    if (c.mla()) {
      // Megatron's MLASelfAttention: the down projections replicated over
      // TP ("duplicated"), the up projections column-parallel (whole heads),
      // the q/kv norms over the compressed vectors with --qk-layernorm.
      const std::string sa = p + "self_attention.";
      const int64_t kv = c.kv_lora_rank, dr = c.qk_pos_emb_head_dim;
      auto lora_norm = [&](const std::string& n, int64_t width) {
        add(n + ".weight", {width}, ShardKind::kReplicated, -1,
            c.apply_layernorm_1p ? InitKind::kZeros : InitKind::kOnes, false, i);
        if (ln) add(n + ".bias", {width}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
      };
      if (c.q_lora_rank) {
        add(sa + "linear_q_down_proj.weight", {*c.q_lora_rank, h}, ShardKind::kReplicated, -1, InitKind::kNormal, true,
            i);
        if (c.qk_layernorm) lora_norm(sa + "q_layernorm", *c.q_lora_rank);
        add(sa + "linear_q_up_proj.weight", {a * d, *c.q_lora_rank}, ShardKind::kColumn, 0, InitKind::kNormal, true, i);
      } else {
        add(sa + "linear_q_proj.weight", {a * d, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i);
      }
      add(sa + "linear_kv_down_proj.weight", {kv + dr, h}, ShardKind::kReplicated, -1, InitKind::kNormal, true, i);
      if (c.qk_layernorm) lora_norm(sa + "kv_layernorm", kv);
      add(sa + "linear_kv_up_proj.weight", {a * (c.qk_head_dim + c.v_head_dim), kv}, ShardKind::kColumn, 0,
          InitKind::kNormal, true, i);
    } else {
    add(p + "self_attention.linear_qkv.weight", {(a + 2 * g) * d, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i);
    if (c.qkv_bias()) add(p + "self_attention.linear_qkv.bias", {(a + 2 * g) * d}, ShardKind::kColumn, 0, InitKind::kZeros, false, i);
    if (c.qk_layernorm)  // one [d] weight (and bias) over every head: replicated, its TP gradient partial
      for (const char* which : {"q_layernorm", "k_layernorm"}) {
        const std::string n = p + "self_attention." + which;
        add(n + ".weight", {d}, ShardKind::kReplicated, -1, c.apply_layernorm_1p ? InitKind::kZeros : InitKind::kOnes,
            false, i);
        if (ln) add(n + ".bias", {d}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
      }
    }
    add(p + "self_attention.linear_proj.weight", {h, a * c.v_dim()}, ShardKind::kRow, 1, InitKind::kScaledNormal, true,
        i);
    if (bias) add(p + "self_attention.linear_proj.bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
    norm(p + "pre_mlp_layernorm", i);
    if (c.is_moe_layer(i)) {
      // Megatron's MoELayer: the router's [E, h] gate and the experts in
      // SequentialMLP's naming, each a column/row-parallel MLP (ETP = TP).
      const int64_t Fe = c.moe_ffn();
      add(p + "mlp.router.weight", {c.num_experts, h}, ShardKind::kReplicated, -1, InitKind::kNormal, true, i);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.local_experts.{}.", p, e);
        add(x + "linear_fc1.weight", {gate * Fe, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i, int(gate));
        add(x + "linear_fc2.weight", {h, Fe}, ShardKind::kRow, 1, InitKind::kScaledNormal, true, i);
        v[v.size() - 2].expert = v[v.size() - 1].expert = static_cast<int>(e);
      }
      if (c.has_shared_expert()) {  // an MLP on every token, split over TP like the dense one
        const int64_t S = c.moe_shared_expert_intermediate_size;
        add(p + "mlp.shared_experts.linear_fc1.weight", {gate * S, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i,
            int(gate));
        add(p + "mlp.shared_experts.linear_fc2.weight", {h, S}, ShardKind::kRow, 1, InitKind::kScaledNormal, true, i);
        // --moe-shared-expert-gate: Megatron's gate_weight [1, h], replicated
        // (its gradient partial over TP under SP, as the router's).
        if (c.moe_shared_expert_gate)
          add(p + "mlp.shared_experts.gate_weight", {1, h}, ShardKind::kReplicated, -1, InitKind::kNormal, true, i);
      }
      return;
    }
    add(p + "mlp.linear_fc1.weight", {gate * F, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i, int(gate));
    if (bias) add(p + "mlp.linear_fc1.bias", {gate * F}, ShardKind::kColumn, 0, InitKind::kZeros, false, i, int(gate));
    add(p + "mlp.linear_fc2.weight", {h, F}, ShardKind::kRow, 1, InitKind::kScaledNormal, true, i);
    if (bias) add(p + "mlp.linear_fc2.bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
  };
  for (int i = 0; i < static_cast<int>(c.num_layers); ++i) layer(i);
  norm("decoder.final_layernorm", -1);
  // --mtp-num-layers: Megatron's MultiTokenPredictionLayer, depth by depth
  // (registered after the decoder, before the output layer). The norms and
  // eh_proj belong to the MTP layer's global index L + k as its transformer
  // layer does. eh_proj [h, 2h] is column-parallel, its input
  // [enorm(embedding) | hnorm(hidden)].
  for (int k = 0; k < static_cast<int>(c.mtp_built_layers()); ++k) {  // (one when repeated)
    const int i = static_cast<int>(c.num_layers) + k;
    const std::string m = fmt::format("mtp.layers.{}.", k);
    norm(m + "enorm", i);
    norm(m + "hnorm", i);
    add(m + "eh_proj.weight", {h, 2 * h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i);
    layer(i);
    norm(m + "final_layernorm", i);
  }
  if (c.untie_embeddings_and_output_weights)
    add("output_layer.weight", {V, h}, ShardKind::kVocab, 0, InitKind::kNormal, true, -1);
  return v;
}

}  // namespace mt::model
