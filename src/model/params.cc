#include "model/params.h"

#include <fmt/format.h>

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
    add(prefix + ".weight", {h}, ShardKind::kReplicated, -1, InitKind::kOnes, false, layer);
    if (ln) add(prefix + ".bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, layer);
  };
  for (int i = 0; i < static_cast<int>(c.num_layers); ++i) {
    const std::string p = fmt::format("decoder.layers.{}.", i);
    norm(p + "input_layernorm", i);
    add(p + "self_attention.linear_qkv.weight", {(a + 2 * g) * d, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i);
    if (bias) add(p + "self_attention.linear_qkv.bias", {(a + 2 * g) * d}, ShardKind::kColumn, 0, InitKind::kZeros, false, i);
    add(p + "self_attention.linear_proj.weight", {h, a * d}, ShardKind::kRow, 1, InitKind::kScaledNormal, true, i);
    if (bias) add(p + "self_attention.linear_proj.bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
    norm(p + "pre_mlp_layernorm", i);
    add(p + "mlp.linear_fc1.weight", {gate * F, h}, ShardKind::kColumn, 0, InitKind::kNormal, true, i, int(gate));
    if (bias) add(p + "mlp.linear_fc1.bias", {gate * F}, ShardKind::kColumn, 0, InitKind::kZeros, false, i, int(gate));
    add(p + "mlp.linear_fc2.weight", {h, F}, ShardKind::kRow, 1, InitKind::kScaledNormal, true, i);
    if (bias) add(p + "mlp.linear_fc2.bias", {h}, ShardKind::kReplicated, -1, InitKind::kZeros, false, i);
  }
  norm("decoder.final_layernorm", -1);
  if (c.untie_embeddings_and_output_weights)
    add("output_layer.weight", {V, h}, ShardKind::kVocab, 0, InitKind::kNormal, true, -1);
  return v;
}

}  // namespace mt::model
