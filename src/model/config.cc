#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

namespace mt::model {

int64_t ModelConfig::ffn() const {
  if (ffn_hidden_size) return *ffn_hidden_size;
  if (swiglu) return (hidden_size * 8 / 3 / 64) * 64;  // int((4h * 2/3) / 64) * 64
  return 4 * hidden_size;
}

int64_t ModelConfig::moe_capacity(int64_t tokens) const {
  // Python's math.ceil((tokens k / E) * factor), the same double operations.
  const double c = std::ceil(static_cast<double>(tokens * moe_router_topk) / static_cast<double>(num_experts) *
                             moe_expert_capacity_factor.value_or(0.0));
  return c >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(c);
}

namespace {

// Megatron evaluates a --moe-layer-freq that holds '[' as Python: list
// literals of integers, list * count (either side), + to concatenate, and
// parentheses. This parser takes exactly that subset.
class PatternParser {
 public:
  explicit PatternParser(const std::string& s) : s_(s) {}
  Result<std::vector<int>> parse() {
    std::vector<int> v;
    if (!sum(v)) return Status::invalid(err_);
    skip();
    if (i_ != s_.size()) return fail("an operator or the end"), Status::invalid(err_);
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  bool fail(const std::string& expected) {
    if (err_.empty())
      err_ = fmt::format("expected {} at offset {}{}", expected, i_,
                         i_ < s_.size() ? fmt::format(" ('{}')", s_.substr(i_)) : std::string(" (the end)"));
    return false;
  }
  bool integer(int64_t& n) {
    skip();
    const size_t b = i_;
    n = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) && i_ - b < 9) n = n * 10 + (s_[i_++] - '0');
    if (i_ == b) return fail("an integer");
    if (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) return i_ = b, fail("an integer of at most 9 digits");
    if (s_[b] == '0' && i_ - b > 1) return i_ = b, fail("an integer without leading zeros (as Python)");
    return true;
  }
  bool atom(std::vector<int>& v) {
    skip();
    if (i_ < s_.size() && s_[i_] == '(') {
      if (++depth_ > 64) return fail("at most 64 nested parentheses");
      ++i_;
      if (!sum(v)) return false;
      --depth_;
      skip();
      if (i_ >= s_.size() || s_[i_] != ')') return fail("')'");
      ++i_;
      return true;
    }
    if (i_ >= s_.size() || s_[i_] != '[') return fail("'[' or '('");
    ++i_;
    skip();
    while (i_ < s_.size() && s_[i_] != ']') {
      int64_t n = 0;
      if (!integer(n)) return false;
      v.push_back(static_cast<int>(n));
      skip();
      if (i_ < s_.size() && s_[i_] == ',') ++i_, skip();
      else if (i_ >= s_.size() || s_[i_] != ']') return fail("',' or ']'");
    }
    if (i_ >= s_.size()) return fail("']'");
    ++i_;
    return true;
  }
  // A product: atom (* count)*, or count * atom.
  bool product(std::vector<int>& v) {
    skip();
    int64_t times = 1;
    if (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      if (!integer(times)) return false;
      skip();
      if (i_ >= s_.size() || s_[i_] != '*') return fail("'*' after a repeat count");
      ++i_;
    }
    std::vector<int> a;
    if (!atom(a)) return false;
    for (;;) {
      skip();
      if (i_ >= s_.size() || s_[i_] != '*') break;
      ++i_;
      int64_t n = 0;
      if (!integer(n)) return false;
      times *= n;
      if (times > kMaxTerms) return fail("a smaller repeat count");
    }
    // Bounded before anything is inserted (a pattern has one term per layer).
    if (times > kMaxTerms || (times > 0 && static_cast<int64_t>(a.size()) > (kMaxTerms - static_cast<int64_t>(v.size())) / times))
      return fail(fmt::format("a list of at most {} terms", kMaxTerms));
    for (int64_t t = 0; t < times; ++t) v.insert(v.end(), a.begin(), a.end());
    return true;
  }
  bool sum(std::vector<int>& v) {
    if (!product(v)) return false;
    for (;;) {
      skip();
      if (i_ >= s_.size() || s_[i_] != '+') return true;
      ++i_;
      if (!product(v)) return false;
    }
  }
  static constexpr int64_t kMaxTerms = 1 << 20;
  const std::string& s_;
  size_t i_ = 0;
  int depth_ = 0;
  std::string err_;
};

}  // namespace

Result<std::vector<int>> moe_layer_pattern(const std::string& freq, int64_t num_layers) {
  const std::string where = fmt::format("--moe-layer-freq '{}'", freq);
  if (freq.find('[') == std::string::npos) {  // an integer N: layer i is MoE iff i % N == 0
    int64_t n = 0;
    size_t i = 0;
    while (i < freq.size() && freq[i] == ' ') ++i;
    const size_t b = i;
    while (i < freq.size() && std::isdigit(static_cast<unsigned char>(freq[i])) && i - b < 9) n = n * 10 + (freq[i++] - '0');
    while (i < freq.size() && freq[i] == ' ') ++i;
    if (i == b || i != freq.size() || n < 1)
      return Status::invalid(fmt::format("{}: expected a positive integer N (every N-th layer is MoE, from layer 0) "
                                         "or a list such as ([0]*1+[1]*3)*2 with one 0 or 1 per layer",
                                         where));
    std::vector<int> v(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
    for (int64_t l = 0; l < num_layers; ++l) v[static_cast<size_t>(l)] = l % n == 0 ? 1 : 0;
    return v;
  }
  auto v = PatternParser(freq).parse();
  if (!v.is_ok()) return Status::invalid(fmt::format("{}: {}", where, v.status().message()));
  for (size_t l = 0; l < v->size(); ++l)
    if ((*v)[l] != 0 && (*v)[l] != 1)
      return Status::invalid(fmt::format("{}: term {} is {}; each layer's term is 1 (MoE) or 0 (dense)", where, l, (*v)[l]));
  if (static_cast<int64_t>(v->size()) != num_layers)
    return Status::invalid(fmt::format("{}: the list has {} terms but --num-layers is {} (one term per layer, as "
                                       "Megatron requires)",
                                       where, v->size(), num_layers));
  return v;
}

std::string ModelConfig::mtp_prefix(int64_t k) const {
  return fmt::format("mtp.layers.{}.", mtp_use_repeated_layer ? 0 : k);
}

std::string ModelConfig::layer_prefix(int64_t l) const {
  return l < num_layers ? fmt::format("decoder.layers.{}.", l) : mtp_prefix(l - num_layers) + "transformer_layer.";
}

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (l >= num_layers && l < total_layers()) l = num_layers - 1;
  if (!is_moe() || l < 0 || l >= num_layers) return false;
  if (moe_layer_freq == "1") return true;
  auto p = moe_layer_pattern(moe_layer_freq, num_layers);
  return !p.is_ok() || (*p)[static_cast<size_t>(l)] != 0;
}

int64_t ModelConfig::num_moe_layers() const {
  if (!is_moe() || num_layers <= 0) return 0;
  auto p = moe_layer_pattern(moe_layer_freq, num_layers);  // parsed once (is_moe_layer parses per call)
  if (!p.is_ok()) return num_layers;                      // as is_moe_layer: every layer
  int64_t n = 0;
  for (int v : *p) n += v;
  return n;
}

int64_t ModelConfig::head_dim() const {
  if (mla()) return qk_head_dim + qk_pos_emb_head_dim;
  if (kv_channels) return *kv_channels;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

int64_t ModelConfig::rotary_freq_dim() const {
  // MLA rotates its position dims: YaRN all of them, RotaryEmbedding
  // int(qk_pos_emb_head_dim * rotary_percent) (Megatron's MLA passes the
  // percent to the latter only).
  if (mla()) {
    const double pct = mla_yarn() ? 1.0 : rotary_percent;
    return pct < 1.0 ? static_cast<int64_t>(static_cast<double>(qk_pos_emb_head_dim) * pct) : qk_pos_emb_head_dim;
  }
  // Megatron: dim = int(kv_channels * rotary_percent) when rotary_percent < 1.
  return rotary_percent < 1.0 ? static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent) : head_dim();
}

int64_t ModelConfig::rotary_dim() const {
  // inv_freq = 1 / base^(arange(0, dim, 2) / dim) has ceil(dim / 2) entries,
  // and cat(freqs, freqs) rotates twice that many dims.
  const int64_t dim = rotary_freq_dim();
  return dim + (dim % 2);
}

namespace {
// Megatron's _yarn_get_mscale.
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }
}  // namespace

double ModelConfig::softmax_scale() const {
  // MultiLatentAttention: mscale = _yarn_get_mscale(rotary_scaling_factor,
  // mscale_all_dim), whatever --rope-type; softmax_scale = mscale^2 / sqrt(q_head_dim).
  const double m = mla() ? yarn_mscale(rotary_scaling_factor, mscale_all_dim) : 1.0;
  return m * m / std::sqrt(static_cast<double>(head_dim()));
}

double ModelConfig::mla_rope_mscale() const {
  if (!mla_yarn()) return 1.0;
  return yarn_mscale(rotary_scaling_factor, mscale) / yarn_mscale(rotary_scaling_factor, mscale_all_dim);
}

int64_t ModelConfig::query_groups() const {
  if (mla()) return num_attention_heads;
  if (!group_query_attention) return num_attention_heads;
  return num_query_groups.value_or(1);
}

int64_t ModelConfig::norm_params_per_norm() const {
  return normalization == Normalization::kLayerNorm ? 2 * hidden_size : hidden_size;
}

int64_t ModelConfig::padded_vocab(int64_t tp) const {
  int64_t v = vocab_size.value_or(0);
  int64_t multiple = make_vocab_size_divisible_by * tp;
  return (v + multiple - 1) / multiple * multiple;
}

const char* normalization_name(Normalization n) {
  return n == Normalization::kLayerNorm ? "LayerNorm" : "RMSNorm";
}

const char* position_embedding_name(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kLearnedAbsolute: return "learned_absolute";
    case PositionEmbedding::kRope: return "rope";
    case PositionEmbedding::kNone: return "none";
  }
  return "?";
}

void register_model_flags(FlagSet& f, ModelConfig& c) {
  constexpr int64_t kMaxDim = int64_t{1} << 24;  // 16M: beyond any real model, keeps products in int64
  f.section("model");
  f.add_int("num-layers", &c.num_layers, "transformer layers (L)", 1, 1 << 16);
  f.add_int("hidden-size", &c.hidden_size, "hidden size (h)", 1, kMaxDim);
  f.add_int("ffn-hidden-size", &c.ffn_hidden_size, "MLP hidden size (F); default 4h, or 8h/3 rounded down to 64 with --swiglu", 1, kMaxDim);
  f.add_int("num-attention-heads", &c.num_attention_heads, "attention heads (a)", 1, 1 << 16);
  f.add_int("kv-channels", &c.kv_channels, "per-head size (d); default h/a", 1, 1 << 16);
  f.add_switch("group-query-attention", &c.group_query_attention, "use grouped-query attention");
  f.add_int("num-query-groups", &c.num_query_groups, "key/value groups (g) with --group-query-attention", 1, 1 << 16);
  f.add_int("seq-length", &c.seq_length, "sequence length (s)", 1, int64_t{1} << 26);
  f.add_int("max-position-embeddings", &c.max_position_embeddings, "maximum sequence length the position embedding supports", 1, int64_t{1} << 26);
  f.add_int("vocab-size", &c.vocab_size, "vocabulary size (NullTokenizer), before padding", 1, int64_t{1} << 32);
  f.add_string("vocab-file", &c.vocab_file, "GPT-2 vocab.json; its entry count is the vocabulary size");
  f.add_int("make-vocab-size-divisible-by", &c.make_vocab_size_divisible_by, "pad the vocabulary to a multiple of this times TP", 1, 1 << 20);
  f.add_choice("normalization", "normalisation layer", {"LayerNorm", "RMSNorm"}, "LayerNorm",
               [&c](const std::string& v) {
                 c.normalization = v == "RMSNorm" ? Normalization::kRMSNorm : Normalization::kLayerNorm;
               });
  f.add_choice("position-embedding-type", "position embedding", {"learned_absolute", "rope", "none"},
               "learned_absolute", [&c](const std::string& v) {
                 c.position_embedding = v == "rope"   ? PositionEmbedding::kRope
                                        : v == "none" ? PositionEmbedding::kNone
                                                      : PositionEmbedding::kLearnedAbsolute;
               });
  f.add_switch("swiglu", &c.swiglu, "SwiGLU MLP (gated, fc1 2F wide)");
  f.add_switch("disable-bias-linear", &c.add_bias_linear, "no biases in linear layers", false);
  f.add_switch("add-qkv-bias", &c.add_qkv_bias, "a bias on the QKV projection, also with --disable-bias-linear");
  f.add_switch("untie-embeddings-and-output-weights", &c.untie_embeddings_and_output_weights, "separate output layer weights");
  f.add_double("hidden-dropout", &c.hidden_dropout, "dropout after attention and MLP", 0, 1);
  f.add_double("attention-dropout", &c.attention_dropout, "dropout on attention probabilities", 0, 1);
  f.add_double("norm-epsilon", &c.norm_epsilon, "epsilon of LayerNorm/RMSNorm", 0, 1);
  f.add_switch("apply-layernorm-1p", &c.apply_layernorm_1p,
               "zero-centred norm weights: every LayerNorm/RMSNorm multiplies by 1 + gamma, gamma initialised to 0");
  f.add_double("rotary-base", &c.rotary_base, "base of the rotary position embedding", 1, 1e12);
  f.add_double("rotary-percent", &c.rotary_percent, "fraction of each head's dimensions that RoPE rotates (the rest pass through)",
               0, 1);
  f.add_int("rotary-seq-len-interpolation-factor", &c.rotary_seq_len_interpolation_factor,
            "RoPE position interpolation: positions are divided by this factor", 1, 1 << 20);
  f.add_switch("rotary-interleaved", &c.rotary_interleaved,
               "RoPE rotates the pairs of adjacent dims (2i, 2i+1) (GPT-J style) instead of (i, i + d/2)");
  f.add_switch("use-rope-scaling", &c.use_rope_scaling,
               "Llama 3.1 RoPE frequency scaling (low/high frequency factors 1 and 4, original context 8192)");
  f.add_double("rope-scaling-factor", &c.rope_scaling_factor, "the factor of --use-rope-scaling", 1e-6, 1e6);
  f.add_double("init-method-std", &c.init_method_std, "standard deviation of the normal initialisation", 0, 10);
  f.add_double("embedding-init-method-std", &c.embedding_init_method_std,
               "standard deviation of the embeddings' normal initialisation; default --init-method-std", 0, 10);
  f.add_switch("init-method-xavier-uniform", &c.init_method_xavier_uniform,
               "Xavier-uniform initialisation of the weights and embeddings instead of normal(0, --init-method-std): "
               "uniform(-a, a), a = sqrt(6 / (fan_in + fan_out)) of each whole tensor");
  f.add_switch("openai-gelu", &c.openai_gelu, "tanh approximation of GELU (OpenAI's)");
  f.add_switch("squared-relu", &c.squared_relu,
               "squared ReLU, relu(x)^2, as the MLP activation (Megatron's; needs --no-bias-gelu-fusion or "
               "--disable-bias-linear, as there)");
  f.add_switch("no-bias-gelu-fusion", &c.bias_gelu_fusion,
               "exact (erf) GELU: Megatron's default fused bias-GELU computes the tanh approximation, as here "
               "without this flag (with biases)",
               false);
  f.add_switch("apply-residual-connection-post-layernorm", &c.apply_residual_connection_post_layernorm,
               "take the residual from the norm's output (original BERT/GPT-2 ordering)");
  f.add_switch("qk-layernorm", &c.qk_layernorm,
               "normalise each query and key head (--normalization's kind, over its kv-channels values) before "
               "RoPE, with a weight for the queries and one for the keys (Qwen3, OLMo-style)");
  f.add_switch("multi-latent-attention", &c.multi_latent_attention,
               "multi-latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank projections, "
               "RoPE on qk-pos-emb-head-dim extra dims per head (--q-lora-rank, --kv-lora-rank, --qk-head-dim, "
               "--qk-pos-emb-head-dim, --v-head-dim, --rope-type)");
  f.add_int("q-lora-rank", &c.q_lora_rank,
            "MLA: rank of the query's low-rank projection (unset: one full-rank linear_q_proj)", 1, kMaxDim);
  f.add_int("kv-lora-rank", &c.kv_lora_rank, "MLA: rank of the keys' and values' low-rank projection", 1, kMaxDim);
  f.add_int("qk-head-dim", &c.qk_head_dim, "MLA: each head's query/key dims without position", 1, 1 << 16);
  f.add_int("qk-pos-emb-head-dim", &c.qk_pos_emb_head_dim,
            "MLA: each head's rotated query/key dims (the key's shared by all heads)", 1, 1 << 16);
  f.add_int("v-head-dim", &c.v_head_dim, "MLA: each head's value dims", 1, 1 << 16);
  f.add_string("rope-type", &c.rope_type,
               "MLA's rotary embedding: rope (RotaryEmbedding) or yarn (YaRN, MLA's default)", {"rope", "yarn"});
  f.add_double("rotary-scaling-factor", &c.rotary_scaling_factor,
               "YaRN's scaling factor (MLA with --rope-type yarn; also scales MLA's softmax through --mscale-all-dim)",
               1e-6, 1e6);
  f.add_double("mscale", &c.mscale, "YaRN's mscale: MLA's cos/sin factor is yarn_mscale(factor, mscale) / "
               "yarn_mscale(factor, mscale-all-dim)", 0, 1e6);
  f.add_double("mscale-all-dim", &c.mscale_all_dim,
               "YaRN's mscale_all_dim (MLA: also the softmax scale's yarn_mscale(factor, this)^2)", 0, 1e6);
  f.add_int("mtp-num-layers", &c.mtp_num_layers,
            "multi-token prediction (DeepSeek-V3): this many sequential MTP layers on the last stage, depth k "
            "predicting the token k + 1 ahead from depth k - 1's hidden state and the embedding of the token k ahead",
            0, 64);
  f.add_double("mtp-loss-scaling-factor", &c.mtp_loss_scaling_factor,
               "weight of the MTP loss: this times the mean over the depths of their losses joins the language-model "
               "loss's gradient",
               0, 1e6);
  f.add_switch("mtp-use-repeated-layer", &c.mtp_use_repeated_layer,
               "one MTP layer (norms, eh_proj, transformer layer) applied at every depth of --mtp-num-layers");
  f.add_int("num-experts", &c.num_experts, "MoE experts per layer (0: dense)", 0, 1 << 20);
  f.add_int("moe-router-topk", &c.moe_router_topk, "experts each token is routed to", 1, 1 << 20);
  f.add_int("moe-ffn-hidden-size", &c.moe_ffn_hidden_size, "expert MLP hidden size; default --ffn-hidden-size", 1, kMaxDim);
  f.add_double("moe-aux-loss-coeff", &c.moe_aux_loss_coeff,
               "weight of the load-balancing loss E/(k T^2) sum_e (sum of the router's softmax for e) x (tokens "
               "routed to e), T the micro-batch's tokens (Megatron's aux_loss; 0: none)",
               0, 1e6);
  f.add_double("moe-z-loss-coeff", &c.moe_z_loss_coeff,
               "weight of the router z-loss, the mean over tokens of logsumexp(router logits)^2", 0, 1e6);
  f.add_switch("moe-router-pre-softmax", &c.moe_router_pre_softmax,
               "routing probabilities are the full softmax's values at the top-k experts (default: a softmax over "
               "the k chosen logits)");
  f.add_double("moe-router-topk-scaling-factor", &c.moe_router_topk_scaling_factor,
               "multiplies the routing probabilities", 1e-6, 1e6);
  f.add_int("moe-shared-expert-intermediate-size", &c.moe_shared_expert_intermediate_size,
            "width of the shared expert, an MLP every token goes through beside its routed experts (DeepSeek's "
            "shared experts together as one; 0: none)",
            0, kMaxDim);
  f.add_switch("moe-shared-expert-gate", &c.moe_shared_expert_gate,
               "multiply the shared expert's output by sigmoid(x . g), g a learned [1, h] weight per layer "
               "(Qwen2-MoE's shared_expert_gate; needs --moe-shared-expert-intermediate-size)");
  f.add_string("moe-router-score-function", &c.moe_router_score_function,
               "the router's scores: softmax, or sigmoid (DeepSeek-V3: the chosen sigmoids normalised over the top k)",
               {"softmax", "sigmoid"});
  f.add_switch("moe-router-enable-expert-bias", &c.moe_router_enable_expert_bias,
               "aux-loss-free load balancing (DeepSeek-V3; sigmoid router): a per-layer expert bias added to the scores "
               "when choosing the experts, moved after each step towards the under-used experts");
  f.add_double("moe-router-bias-update-rate", &c.moe_router_bias_update_rate,
               "the step of --moe-router-enable-expert-bias's update: bias += rate x sign(mean count - count)", 0, 1e6);
  f.add_int("moe-router-num-groups", &c.moe_router_num_groups,
            "group-limited routing: the experts in this many equal groups (with --moe-router-group-topk)", 0, 1 << 20);
  f.add_int("moe-router-group-topk", &c.moe_router_group_topk,
            "group-limited routing: each token chooses its experts among this many groups, those whose top "
            "(topk / group-topk) scores sum highest",
            0, 32);
  f.add_double("moe-expert-capacity-factor", &c.moe_expert_capacity_factor,
               "token dropping: each expert takes at most ceil(tokens x topk / experts x factor) of the tokens "
               "one rank routes per micro-batch, the rest of its slots dropped by --moe-token-drop-policy "
               "(negative or unset: dropless)",
               -1e6, 1e6);
  f.add_string("moe-token-drop-policy", &c.moe_token_drop_policy,
               "with --moe-expert-capacity-factor: probs drops an expert's lowest routing probabilities, position "
               "its latest tokens",
               {"probs", "position"});
  f.add_double("moe-input-jitter-eps", &c.moe_input_jitter_eps,
               "multiply the MoE router's input by uniform noise in [1 - eps, 1 + eps] (Switch Transformer's jitter, "
               "Megatron's; the experts see the input unchanged)",
               0, 0.999);
  f.add_string("moe-layer-freq", &c.moe_layer_freq,
               "which layers are MoE: an integer N (layer i is MoE iff i mod N == 0) or a Python list expression "
               "with one 0 (dense MLP of --ffn-hidden-size) or 1 (MoE) per layer, such as ([0]*1+[1]*3)*2");
  f.add_string("moe-router-load-balancing-type", &c.moe_router_load_balancing_type,
               "aux_loss: the switch load-balancing loss of --moe-aux-loss-coeff over the micro-batch; seq_aux_loss: "
               "the same per sequence, averaged over the sequences (DeepSeek-V2/V3); none: no load-balancing loss",
               {"aux_loss", "seq_aux_loss", "none"});
}

Status resolve_vocab(ModelConfig& c) {
  if (c.vocab_file.empty()) return Status::ok();
  std::ifstream in(c.vocab_file, std::ios::binary);
  if (!in)
    return Status::not_found(fmt::format("--vocab-file: cannot open '{}'", c.vocab_file));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::invalid(fmt::format(
        "--vocab-file: '{}' is not a JSON object of token -> id (expected GPT-2's vocab.json / "
        "encoder.json)", c.vocab_file));
  int64_t n = static_cast<int64_t>(j.size());
  if (c.vocab_size && *c.vocab_size != n)
    return Status::invalid(fmt::format(
        "--vocab-size {} disagrees with --vocab-file '{}' ({} entries); give only one", *c.vocab_size,
        c.vocab_file, n));
  c.vocab_size = n;
  return Status::ok();
}

LayerParams layer_params(const ModelConfig& c, bool moe_layer) {
  LayerParams p;
  const int64_t h = c.hidden_size, d = c.head_dim(), a = c.num_attention_heads, g = c.query_groups();
  const int64_t F = c.ffn(), gate = c.swiglu ? 2 : 1;
  const bool bias = c.add_bias_linear;
  const int64_t nu = c.normalization == Normalization::kLayerNorm ? 2 : 1;
  p.norms = 2 * c.norm_params_per_norm();
  if (c.mla()) {
    // q_down + q_up (or linear_q_proj), kv_down, kv_up; the q/kv norms with --qk-layernorm.
    const int64_t kv = c.kv_lora_rank;
    p.qkv_weight = (c.q_lora_rank ? *c.q_lora_rank * (h + a * d) : h * a * d) + h * (kv + c.qk_pos_emb_head_dim) +
                   kv * a * (c.qk_head_dim + c.v_head_dim);
    if (c.qk_layernorm) p.norms += nu * ((c.q_lora_rank ? *c.q_lora_rank : 0) + kv);
  } else {
    if (c.qk_layernorm) p.norms += 2 * nu * d;
    p.qkv_weight = h * (a + 2 * g) * d;
    p.qkv_bias = c.qkv_bias() ? (a + 2 * g) * d : 0;
  }
  p.proj_weight = a * c.v_dim() * h;
  p.proj_bias = bias ? h : 0;
  if (!c.is_moe() || !moe_layer) {
    p.fc1_weight = h * gate * F;
    p.fc1_bias = bias ? gate * F : 0;
    p.fc2_weight = F * h;
    p.fc2_bias = bias ? h : 0;
  } else {
    const int64_t Fe = c.moe_ffn();
    p.router = h * c.num_experts + (c.has_shared_expert() && c.moe_shared_expert_gate ? h : 0);
    p.experts = c.num_experts * (h * gate * Fe + Fe * h + (bias ? gate * Fe + h : 0));
    if (c.has_shared_expert()) {
      p.fc1_weight = h * gate * c.moe_shared_expert_intermediate_size;
      p.fc2_weight = c.moe_shared_expert_intermediate_size * h;
    }
  }
  return p;
}

ModelParams model_params(const ModelConfig& c, int64_t V) {
  ModelParams m;
  m.per_layer = layer_params(c, c.is_moe()).total();
  m.dense_per_layer = layer_params(c, false).total();
  const int64_t moe_layers = c.num_moe_layers();
  m.layers = moe_layers * m.per_layer + (c.num_layers - moe_layers) * m.dense_per_layer;
  m.word_embedding = V * c.hidden_size;
  m.position_embedding = c.position_embedding == PositionEmbedding::kLearnedAbsolute
                             ? c.max_position_embeddings * c.hidden_size
                             : 0;
  m.final_norm = c.norm_params_per_norm();
  m.output_layer = c.untie_embeddings_and_output_weights ? V * c.hidden_size : 0;
  const int64_t last = c.is_moe_layer(c.num_layers - 1) ? m.per_layer : m.dense_per_layer;
  m.mtp = c.mtp_built_layers() * (last + 3 * c.norm_params_per_norm() + 2 * c.hidden_size * c.hidden_size);
  return m;
}

double mlp_width_over_layers(const ModelConfig& c) {
  // The MTP layers count as the last decoder layer's kind (Megatron adds
  // them to its MoE or its dense layers by last_layer_is_moe).
  const double mtp_moe = c.is_moe_layer(c.num_layers - 1) ? static_cast<double>(c.mtp_layers()) : 0.0;
  const double moe = static_cast<double>(c.num_moe_layers()) + mtp_moe;
  double w = static_cast<double>(c.ffn()) * (static_cast<double>(c.total_layers()) - moe);
  if (c.is_moe())
    w += static_cast<double>(c.moe_ffn() * c.moe_router_topk + c.moe_shared_expert_intermediate_size) * moe;
  return w;
}

double flops_per_token(const ModelConfig& c, int64_t padded_vocab) {
  const double h = static_cast<double>(c.hidden_size), phi = c.swiglu ? 3 : 2, D = static_cast<double>(c.mtp_layers());
  // --mtp-num-layers: Megatron adds each MTP layer's norms (3h) and eh_proj
  // (2h^2), and one more logit computation per depth.
  return 6 * h * phi * mlp_width_over_layers(c) + static_cast<double>(c.total_layers()) * attention_linear_flops(c) +
         6 * D * (3 * h + 2 * h * h) + 6 * h * static_cast<double>(padded_vocab) * (1 + D);
}

double flops_per_token_pair(const ModelConfig& c) {
  return static_cast<double>(c.total_layers()) * attention_core_flops(c);
}

double attention_linear_flops(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size), a = static_cast<double>(c.num_attention_heads),
               d = static_cast<double>(c.head_dim());
  if (!c.mla()) {
    const double q = a * d, k = static_cast<double>(c.query_groups()) * d;
    return 6 * (h * (q + 2 * k) + q * h);
  }
  const double dv = static_cast<double>(c.v_head_dim), kl = static_cast<double>(c.kv_lora_rank);
  const double qt = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) * (h + a * d + 1) : h * a * d;
  return 6 * (qt + kl * (h + a * (static_cast<double>(c.qk_head_dim) + dv) + 1) +
              h * static_cast<double>(c.qk_pos_emb_head_dim) + a * dv * h);
}

double attention_core_flops(const ModelConfig& c) {
  const double a = static_cast<double>(c.num_attention_heads), d = static_cast<double>(c.head_dim());
  if (!c.mla()) return 6 * a * d;
  return 6 * (a * d / 2 + a * static_cast<double>(c.v_head_dim) / 2);
}

int64_t megatron_attention_params(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim(), a = c.num_attention_heads, g = c.query_groups();
  if (!c.mla()) return 2 * h * d * (a + g);
  // theoretical_memory_usage.py's MLA term: q (lora + norm, or one
  // projection), kv lora + norm, the rope key, the output projection; the
  // norms counted whether or not --qk-layernorm builds them.
  const int64_t nu = c.normalization == Normalization::kLayerNorm ? 2 : 1;
  const int64_t q = c.q_lora_rank ? *c.q_lora_rank * (h + a * d + nu) : h * a * d;
  return q + c.kv_lora_rank * (h + a * (c.qk_head_dim + c.v_head_dim) + nu) + h * c.qk_pos_emb_head_dim +
         a * c.v_head_dim * h;
}

MegatronParamCount megatron_param_count(const ModelConfig& c, int64_t V) {
  const int64_t h = c.hidden_size;
  const int64_t phi = c.swiglu ? 3 : 2;
  MegatronParamCount m;
  const int64_t att = megatron_attention_params(c);
  const int64_t dense_mlp = phi * h * c.ffn();
  const int64_t mlp = c.is_moe() ? phi * h * c.moe_ffn() * c.num_experts + h * c.num_experts +
                                       (c.has_shared_expert() ? phi * h * c.moe_shared_expert_intermediate_size +
                                                                    (c.moe_shared_expert_gate ? h : 0)
                                                              : 0)
                                 : dense_mlp;
  m.per_layer = att + mlp + 2 * c.norm_params_per_norm();
  m.embedding = h * V;
  const int64_t moe_layers = c.num_moe_layers();  // --moe-layer-freq: the others are dense
  // --mtp-num-layers: Megatron's num_parameters_in_mtp_block, the MTP
  // layers as dense or MoE layers by the last decoder layer (their norms
  // and eh_proj not counted).
  const int64_t mtp_moe = c.is_moe_layer(c.num_layers - 1) ? c.mtp_layers() : 0;
  m.total = (moe_layers + mtp_moe) * m.per_layer +
            (c.total_layers() - moe_layers - mtp_moe) * (att + dense_mlp + 2 * c.norm_params_per_norm()) +
            c.norm_params_per_norm() + m.embedding * (c.untie_embeddings_and_output_weights ? 2 : 1);
  return m;
}

}  // namespace mt::model
