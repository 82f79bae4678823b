#pragma once
// ModelConfig: the transformer's shape, from Megatron's flags, and the
// parameter registry's sizes derived from it. GPT-2/3-style and LLaMA-style
// models are the same GPTModel with different flags (--normalization RMSNorm
// --swiglu --position-embedding-type rope --disable-bias-linear
// --untie-embeddings-and-output-weights --group-query-attention).
//
// Symbols as in ../shared/spec/megatron-reference.md §5/§12: h hidden,
// L layers, a heads, d kv channels, g query groups, F ffn hidden, V padded
// vocabulary, E experts.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/flags.h"
#include "core/status.h"

namespace mt::model {

enum class Normalization { kLayerNorm, kRMSNorm };
enum class PositionEmbedding { kLearnedAbsolute, kRope, kNone };

struct ModelConfig {
  // Required by Megatron (0 = not given).
  int64_t num_layers = 0;               // --num-layers
  int64_t hidden_size = 0;              // --hidden-size
  int64_t num_attention_heads = 0;      // --num-attention-heads
  int64_t seq_length = 0;               // --seq-length
  int64_t max_position_embeddings = 0;  // --max-position-embeddings
  // Optional, with Megatron's derived defaults.
  std::optional<int64_t> ffn_hidden_size;  // 4h, or int(8h/3/64)*64 with --swiglu
  std::optional<int64_t> kv_channels;      // h / a
  bool group_query_attention = false;
  std::optional<int64_t> num_query_groups;  // 1 with GQA when unset; a without GQA
  std::optional<int64_t> vocab_size;        // --vocab-size, or counted from --vocab-file
  std::string vocab_file;                   // --vocab-file (GPT-2 vocab.json)
  int64_t make_vocab_size_divisible_by = 128;
  Normalization normalization = Normalization::kLayerNorm;
  PositionEmbedding position_embedding = PositionEmbedding::kLearnedAbsolute;
  bool swiglu = false;
  bool add_bias_linear = true;  // --disable-bias-linear turns it off
  bool add_qkv_bias = false;    // --add-qkv-bias: a bias on the QKV projection even without the others (Qwen-style)
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool untie_embeddings_and_output_weights = false;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double norm_epsilon = 1e-5;           // --norm-epsilon
  bool apply_layernorm_1p = false;      // --apply-layernorm-1p: norms multiply by 1 + gamma (gamma zero-centred)
  double rotary_base = 10000;           // --rotary-base
  double rotary_percent = 1.0;          // --rotary-percent: fraction of the head dimension rotated
  std::optional<int64_t> rotary_seq_len_interpolation_factor;  // positions divided by it
  bool use_rope_scaling = false;        // --use-rope-scaling: Llama 3.1 frequency scaling
  bool rotary_interleaved = false;      // --rotary-interleaved: RoPE pairs dims (2i, 2i+1), not (i, i+r/2)
  double rope_scaling_factor = 8.0;     // --rope-scaling-factor
  double init_method_std = 0.02;        // --init-method-std
  // --embedding-init-method-std: the word and position embeddings drawn from
  // normal(0, this) when it differs from --init-method-std (then even under
  // --init-method-xavier-uniform); else they follow the weights' method, as
  // Megatron's TransformerConfig sets embedding_init_method.
  std::optional<double> embedding_init_method_std;
  // --init-method-xavier-uniform: every weight and embedding that would be
  // normal(0, std) (or the scaled std) is uniform(-a, a), a = sqrt(6 /
  // (fan_in + fan_out)) of the whole tensor (torch's xavier_uniform_ on the
  // global shape, as Megatron's --use-cpu-initialization path computes it).
  bool init_method_xavier_uniform = false;
  bool openai_gelu = false;             // --openai-gelu: tanh approximation of GELU
  bool bias_gelu_fusion = true;         // --no-bias-gelu-fusion turns it off (see gelu_tanh())
  bool squared_relu = false;            // --squared-relu: the MLP computes relu(x)^2 instead of GELU
  // Megatron's GELU is the tanh approximation with --openai-gelu, and also by
  // default: its fused bias-GELU kernel (--bias-gelu-fusion, on unless
  // --no-bias-gelu-fusion or --disable-bias-linear) computes the tanh form.
  // Only without that fusion does the MLP call the exact (erf) F.gelu.
  bool gelu_tanh() const { return openai_gelu || (bias_gelu_fusion && add_bias_linear && !swiglu); }
  bool apply_residual_connection_post_layernorm = false;  // residual taken after the norm
  // --qk-layernorm: a norm (--normalization's kind, --norm-epsilon) over each
  // query and key head's d values after linear_qkv, before RoPE, with its
  // own weight [d] (and bias for LayerNorm) for the queries and the keys
  // (Megatron's self_attention.q_layernorm / k_layernorm; Qwen3's q_norm/k_norm).
  bool qk_layernorm = false;
  // Mixture of experts (0 experts = dense): the MLP of every layer that
  // --moe-layer-freq names (all by default) becomes a top-k router over
  // num_experts expert MLPs (Megatron's MoELayer; dropless unless
  // --moe-expert-capacity-factor), plus with
  // moe_shared_expert_intermediate_size a shared expert: an MLP of that
  // width every token goes through, added to the routed experts' output
  // (Megatron's SharedExpertMLP; DeepSeek's shared experts together as one
  // MLP), with moe_shared_expert_gate its output times sigmoid(x . g), g a
  // [1, h] weight (Qwen2-MoE's shared_expert_gate).
  int64_t num_experts = 0;
  int64_t moe_router_topk = 2;
  std::optional<int64_t> moe_ffn_hidden_size;
  double moe_aux_loss_coeff = 0;               // --moe-aux-loss-coeff (the switch load-balancing loss)
  std::optional<double> moe_z_loss_coeff;      // --moe-z-loss-coeff (ST-MoE's router z-loss)
  bool moe_router_pre_softmax = false;         // --moe-router-pre-softmax: top-k of the full softmax
  std::optional<double> moe_router_topk_scaling_factor;  // multiplies the routing probabilities
  // aux_loss (the micro-batch's switch loss), seq_aux_loss (DeepSeek's: the
  // same per sequence, averaged over the micro-batch's sequences) or none.
  std::string moe_router_load_balancing_type = "aux_loss";
  int64_t moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size (0: none)
  bool moe_shared_expert_gate = false;              // --moe-shared-expert-gate
  // --moe-router-score-function sigmoid (DeepSeek-V3's router; see
  // kernels/moe.h), and its aux-loss-free balancing: a per-layer expert bias
  // added to the sigmoids for choosing (not weighting) the experts, moved
  // after every step by --moe-router-bias-update-rate towards the experts
  // that got fewer tokens than the mean (the sign of mean - count).
  std::string moe_router_score_function = "softmax";
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-router-num-groups / --moe-router-group-topk: group-limited routing
  // (DeepSeek's device- or node-limited routing; 0: none; the groups alone
  // change nothing, as in Megatron).
  int64_t moe_router_num_groups = 0, moe_router_group_topk = 0;
  // --moe-expert-capacity-factor (token dropping; unset or negative:
  // dropless, as Megatron): of the T tokens one rank routes (its sequence-
  // parallel shard of a micro-batch), each expert takes at most
  // moe_capacity(T) = ceil(T k / E x factor); the slots beyond are dropped
  // (the token goes on without that expert) by --moe-token-drop-policy:
  // probs drops the lowest routing probabilities, position the latest
  // tokens. The load-balancing loss still counts every top-k choice.
  std::optional<double> moe_expert_capacity_factor;
  std::string moe_token_drop_policy = "probs";
  // --moe-layer-freq (with --num-experts): which layers are MoE, as in
  // Megatron: an integer N (layer i is MoE iff i mod N == 0) or a Python list
  // expression of 0/1 terms, one per layer ("[0]*2+[1]*6", "([1]*3+[0])*2").
  // The other layers keep the dense MLP of --ffn-hidden-size (DeepSeek's
  // first dense layers, interleaved MoE).
  std::string moe_layer_freq = "1";
  // --moe-input-jitter-eps: the router's input (not the experts') is
  // multiplied element-wise by uniform noise in [1 - eps, 1 + eps] in every
  // forward of the model, as Megatron's TopKRouter.apply_input_jitter (the
  // Switch Transformer's jitter); its gradient flows through the noise.
  std::optional<double> moe_input_jitter_eps;

  // --multi-latent-attention: DeepSeek-V2/V3's multi-latent attention as
  // Megatron's MLASelfAttention computes it. Per layer, from the input
  // norm's output x:
  //   q  = q_up(q_layernorm(q_down(x)))  with --q-lora-rank (else linear_q_proj(x)),
  //        a heads of qk_head_dim + qk_pos_emb_head_dim: [nope | pe]
  //   [c, k_pe] = kv_down(x), c kv_lora_rank wide, k_pe qk_pos_emb_head_dim (one for all heads)
  //   [k_nope | v] = kv_up(kv_layernorm(c)), per head qk_head_dim + v_head_dim
  //   k = [k_nope | k_pe], RoPE (--rope-type, yarn by default) on q's and k's pe dims only,
  //   softmax scale m^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim), m = yarn_mscale(
  //   --rotary-scaling-factor, --mscale-all-dim); the attention output a x v_head_dim.
  // q_down and kv_down are replicated over TP (Megatron's "duplicated"
  // linears), q_up, kv_up and linear_q_proj column-parallel, linear_proj
  // row-parallel. The q/kv norms exist only with --qk-layernorm (Megatron
  // builds identities otherwise). No grouped-query attention.
  bool multi_latent_attention = false;
  std::optional<int64_t> q_lora_rank;  // --q-lora-rank (unset: one linear_q_proj)
  int64_t kv_lora_rank = 32;           // --kv-lora-rank
  int64_t qk_head_dim = 128;           // --qk-head-dim: each head's q/k dims without position
  int64_t qk_pos_emb_head_dim = 64;    // --qk-pos-emb-head-dim: the rotated q/k dims
  int64_t v_head_dim = 128;            // --v-head-dim
  // --rope-type: MLA's rotary embedding, "rope" or "yarn" ("": Megatron's
  // default, yarn with MLA). YaRN (Megatron's YarnRotaryEmbedding with
  // MLATransformerConfig's original context 4096, beta_fast 32, beta_slow 1):
  // inverse frequencies blended between base^(-2i/r) and that over
  // --rotary-scaling-factor, cos and sin times yarn_mscale(factor, --mscale) /
  // yarn_mscale(factor, --mscale-all-dim), yarn_mscale(s, m) = 0.1 m ln s + 1 for s > 1.
  std::string rope_type;
  double rotary_scaling_factor = 1.0;  // --rotary-scaling-factor
  double mscale = 1.0;                 // --mscale
  double mscale_all_dim = 0.0;         // --mscale-all-dim
  bool mla() const { return multi_latent_attention; }
  bool mla_yarn() const { return mla() && rope_type != "rope"; }
  // Each head's value (and attention output) width: v_head_dim with MLA, else d.
  int64_t v_dim() const { return mla() ? v_head_dim : head_dim(); }
  // The attention rotates positions: --position-embedding-type rope, or MLA
  // (whose attention has its own RoPE whatever the position embedding).
  bool applies_rope() const { return mla() || position_embedding == PositionEmbedding::kRope; }
  // RoPE pairs dims (2i, 2i+1): --rotary-interleaved, and MLA's position
  // dims as kernels/mla.h packs them.
  bool rope_pairs_adjacent() const { return rotary_interleaved || mla(); }
  // The attention's softmax scale: 1/sqrt(d); with MLA
  // yarn_mscale(--rotary-scaling-factor, --mscale-all-dim)^2 / sqrt(d).
  double softmax_scale() const;
  // MLA's cos/sin factor (1 without yarn).
  double mla_rope_mscale() const;

  // Derived values (valid once the required fields are set).
  // --mtp-num-layers D: multi-token prediction (DeepSeek-V3, Megatron's
  // MultiTokenPredictionBlock) on the last pipeline stage. Depth k = 1..D
  // takes h_{k-1} (h_0: the final norm's output of the decoder, h_k: depth
  // k's own final norm output) and the embedding of the tokens k positions
  // ahead (the sequence rolled left k times, zeros rolled in):
  //   x_k = eh_proj([enorm(embed(tokens << k)) | hnorm(h_{k-1})])   (2h -> h, column-parallel, gathered)
  //   h_k = final_layernorm_k(transformer_layer_k(x_k))            (a layer like the decoder's last)
  // and predicts the labels k positions ahead through the shared output
  // layer. Its loss, --mtp-loss-scaling-factor / D times the sum over the
  // depths of each depth's mean over its counted labels, is added to the
  // language-model loss for the gradients only; the log reports each
  // depth's ("mtp_k loss"). The layers count as global layers L .. L+D-1
  // (Megatron's MoE tracker numbers them so too).
  std::optional<int64_t> mtp_num_layers;
  double mtp_loss_scaling_factor = 0.1;  // --mtp-loss-scaling-factor
  // --mtp-use-repeated-layer: one MTP layer (its norms, eh_proj and
  // transformer layer) applied at every depth; its router losses count 1/D
  // per depth, as Megatron's.
  bool mtp_use_repeated_layer = false;
  int64_t mtp_layers() const { return mtp_num_layers.value_or(0); }
  // The MTP layers with parameters of their own: D, or 1 when repeated.
  int64_t mtp_built_layers() const { return mtp_use_repeated_layer && mtp_layers() ? 1 : mtp_layers(); }
  // The global layer whose parameters (and expert bias) layer l uses:
  // itself, or for a repeated MTP layer the first one (L).
  int64_t param_layer(int64_t l) const { return mtp_use_repeated_layer && l > num_layers ? num_layers : l; }
  // "mtp.layers.{k}." of depth k's own parameters (k = 0 when repeated).
  std::string mtp_prefix(int64_t k) const;
  int64_t total_layers() const { return num_layers + mtp_layers(); }  // decoder + MTP layers
  // The parameter-name prefix of global layer l: "decoder.layers.{l}.", or
  // for an MTP depth's transformer layer "mtp.layers.{l-L}.transformer_layer."
  // (Megatron's checkpoint name; its module is mtp_model_layer, saved under
  // the older name).
  std::string layer_prefix(int64_t l) const;
  int64_t ffn() const;
  int64_t head_dim() const;            // d (MLA: qk_head_dim + qk_pos_emb_head_dim, the q/k head width)
  int64_t rotary_dim() const;          // the leading dims RoPE rotates: rotary_freq_dim() rounded up to even
  int64_t rotary_freq_dim() const;     // Megatron's dim = int(d * rotary_percent): its frequencies' denominator
  int64_t query_groups() const;        // g (a with MLA)
  int64_t norm_params_per_norm() const;  // h (RMSNorm) or 2h (LayerNorm): ν·h
  int64_t moe_ffn() const { return moe_ffn_hidden_size.value_or(ffn()); }
  bool is_moe() const { return num_experts > 0; }
  // Layer l's MLP is MoE (--num-experts and --moe-layer-freq; false for
  // every layer of a dense model, and where the pattern does not parse:
  // moe_layer_pattern() reports that). An MTP layer (l >= num_layers) is
  // like the decoder's last layer (Megatron builds it from that spec).
  bool is_moe_layer(int64_t l) const;
  int64_t num_moe_layers() const;
  // Some layer keeps the dense MLP (a dense model, or --moe-layer-freq).
  bool has_dense_layers() const { return num_moe_layers() < num_layers; }
  bool has_shared_expert() const { return is_moe() && moe_shared_expert_intermediate_size > 0; }
  bool sigmoid_router() const { return moe_router_score_function == "sigmoid"; }
  bool has_expert_bias() const { return is_moe() && moe_router_enable_expert_bias; }
  bool group_limited() const { return is_moe() && moe_router_group_topk > 0; }
  bool seq_aux_loss() const { return moe_router_load_balancing_type == "seq_aux_loss"; }
  // A load-balancing loss is computed (and its gradient applied).
  bool moe_aux_loss_active() const {
    return is_moe() && moe_router_load_balancing_type != "none" && moe_aux_loss_coeff > 0;
  }
  bool jitters_router_input() const { return is_moe() && moe_input_jitter_eps && *moe_input_jitter_eps > 0; }
  bool drops_tokens() const { return is_moe() && moe_expert_capacity_factor && *moe_expert_capacity_factor >= 0; }
  // Megatron's get_capacity(tokens x k, E, factor): ceil(tokens k / E x factor).
  int64_t moe_capacity(int64_t tokens) const;
  // Megatron's padded vocabulary: ceil(V / (m*tp)) * (m*tp).
  int64_t padded_vocab(int64_t tp) const;
  bool has_architecture() const { return num_layers && hidden_size && num_attention_heads; }
};

// --moe-layer-freq's pattern over num_layers layers (1: MoE), or an error
// naming the flag: a malformed expression, a term other than 0 or 1, a list
// whose length is not num_layers, or an integer below 1.
Result<std::vector<int>> moe_layer_pattern(const std::string& freq, int64_t num_layers);

// Registers the model flags on `flags`, bound to `cfg`.
void register_model_flags(FlagSet& flags, ModelConfig& cfg);
// Resolves --vocab-file into vocab_size (counts vocab.json entries).
Status resolve_vocab(ModelConfig& cfg);

// Element counts of one transformer layer's tensors, before any split.
struct LayerParams {
  int64_t norms = 0;      // both norms (weights + LayerNorm biases), and the q/k norms (--qk-layernorm)
  int64_t qkv_weight = 0, qkv_bias = 0;
  int64_t proj_weight = 0, proj_bias = 0;
  int64_t fc1_weight = 0, fc1_bias = 0;  // fc1 is 2F wide with --swiglu
  int64_t fc2_weight = 0, fc2_bias = 0;
  int64_t router = 0;     // MoE router h x E (and the shared expert's gate, h)
  int64_t experts = 0;    // all routed experts' fc1 + fc2 (+ biases)
  int64_t total() const {
    return norms + qkv_weight + qkv_bias + proj_weight + proj_bias + fc1_weight + fc1_bias +
           fc2_weight + fc2_bias + router + experts;
  }
};
// moe_layer: the counts of an MoE layer (with --num-experts), else a dense one.
LayerParams layer_params(const ModelConfig& cfg, bool moe_layer);

// Whole-model element counts with padded vocabulary V (real tensors).
struct ModelParams {
  int64_t per_layer = 0;           // an MoE layer's with --num-experts (a dense layer's: dense_per_layer)
  int64_t dense_per_layer = 0;
  int64_t layers = 0;              // every layer's (L * per_layer when all alike)
  int64_t word_embedding = 0;      // V x h
  int64_t position_embedding = 0;  // max_pos x h (learned absolute only)
  int64_t final_norm = 0;
  int64_t output_layer = 0;        // V x h when untied, else 0 (shared)
  // --mtp-num-layers: every depth's layer (the last decoder layer's kind),
  // enorm, hnorm, eh_proj (2h x h) and final norm.
  int64_t mtp = 0;
  int64_t total() const {
    return layers + word_embedding + position_embedding + final_norm + output_layer + mtp;
  }
};
ModelParams model_params(const ModelConfig& cfg, int64_t padded_vocab);

// The MLP columns one token passes through, summed over the layers, as
// Megatron's FLOPs formula counts them: --ffn-hidden-size per dense layer,
// the top k experts' and the shared expert's per MoE layer (the router not
// counted).
double mlp_width_over_layers(const ModelConfig& cfg);

// Megatron's FLOPs formula (training.py's num_floating_point_operations),
// one layer's attention, forward and backward (x 6 per multiply-add): the
// token-linear part per token (the projections; MLA's low-rank branch with
// its norms counted as a column each) and the core part per token per
// position of the sequence (QK^T and PV, halved for the causal mask).
double attention_linear_flops(const ModelConfig& cfg);
double attention_core_flops(const ModelConfig& cfg);
// The whole formula: FLOPs = tokens x flops_per_token + (batch x s^2) x
// flops_per_token_pair, forward and backward, every layer (the MTP layers
// included) and the logits.
double flops_per_token(const ModelConfig& cfg, int64_t padded_vocab);
double flops_per_token_pair(const ModelConfig& cfg);

// Megatron's own count (theoretical_memory_usage.py, §12.3): no biases, no
// position embedding, the embedding counted twice when untied.
struct MegatronParamCount {
  int64_t per_layer = 0;   // P_att + P_mlp + P_norm (an MoE layer's with --num-experts; total counts
                           // --moe-layer-freq's dense layers as dense)
  int64_t embedding = 0;   // h * V
  int64_t total = 0;
};
MegatronParamCount megatron_param_count(const ModelConfig& cfg, int64_t padded_vocab);
// Its attention term per layer: 2 h d (a + g), or MLA's projections.
int64_t megatron_attention_params(const ModelConfig& cfg);

const char* normalization_name(Normalization n);
const char* position_embedding_name(PositionEmbedding p);

}  // namespace mt::model
