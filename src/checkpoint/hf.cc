#include "checkpoint/hf.h"

#include <cinttypes>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <optional>
#include <system_error>
#include <cmath>

#include "core/dtype.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "model/gpt.h"
#include "model/params.h"

namespace mt::checkpoint {

namespace fs = std::filesystem;

const char* hf_arch_name(HfArch a) {
  switch (a) {
    case HfArch::kGpt2: return "GPT2LMHeadModel";
    case HfArch::kLlama: return "LlamaForCausalLM";
    case HfArch::kQwen2: return "Qwen2ForCausalLM";
    case HfArch::kQwen3: return "Qwen3ForCausalLM";
    case HfArch::kMixtral: return "MixtralForCausalLM";
    case HfArch::kQwen3Moe: return "Qwen3MoeForCausalLM";
    case HfArch::kQwen2Moe: return "Qwen2MoeForCausalLM";
    case HfArch::kDeepseekV3: return "DeepseekV3ForCausalLM";
  }
  return "?";
}

Result<HfArch> hf_architecture(const model::ModelConfig& c) {
  using model::Normalization;
  using model::PositionEmbedding;
  std::vector<std::string> common;  // problems whatever the family
  if (c.apply_residual_connection_post_layernorm)
    common.push_back("--apply-residual-connection-post-layernorm (no transformers decoder takes the residual after the norm)");
  if (c.mla()) {
    // DeepseekV3ForCausalLM: multi-latent attention with its q/kv RMSNorms
    // (eps 1e-6 whatever rms_norm_eps says), RoPE de-interleaved as
    // Megatron's (rope_interleave), YaRN through rope_scaling; SwiGLU MLPs,
    // the first first_k_dense_replace layers dense, the others DeepSeek's
    // MoE: sigmoid scores plus e_score_correction_bias for the choice,
    // group-limited by the sum of each group's top 2, the chosen renormalised
    // (norm_topk_prob) and scaled (routed_scaling_factor), and one shared
    // MLP of n_shared_experts x moe_intermediate_size.
    std::vector<std::string> why = common;
    if (c.normalization != Normalization::kRMSNorm || !c.swiglu)
      why.push_back("LayerNorm or GELU (DeepseekV3ForCausalLM has RMSNorm and SwiGLU)");
    if (c.add_bias_linear) why.push_back("biases on the linear layers (DeepseekV3ForCausalLM has none)");
    if (c.position_embedding == PositionEmbedding::kLearnedAbsolute)
      why.push_back("learned absolute position embeddings (DeepseekV3ForCausalLM has RoPE only; give "
                    "--position-embedding-type rope or none)");
    if (!c.qk_layernorm)
      why.push_back("no q/kv norms (DeepseekV3ForCausalLM always has q_a_layernorm and kv_a_layernorm; train with "
                    "--qk-layernorm)");
    if (!c.q_lora_rank)
      why.push_back("no --q-lora-rank (DeepseekV3ForCausalLM's q_proj comes with kv_a_layernorm, and Megatron's "
                    "kv norm, --qk-layernorm, needs --q-lora-rank)");
    if (c.qk_layernorm && c.norm_epsilon != 1e-6)
      why.push_back(fmt::format("--norm-epsilon {} (DeepseekV3ForCausalLM's q_a_layernorm and kv_a_layernorm use "
                                "1e-6 whatever rms_norm_eps says)",
                                c.norm_epsilon));
    const double f = c.rotary_scaling_factor;
    if (!c.mla_yarn()) {
      if (c.rotary_percent != 1.0)
        why.push_back(fmt::format("--rotary-percent {} (DeepseekV3ForCausalLM rotates all qk_rope_head_dim dims)",
                                  c.rotary_percent));
      if (f > 1 && c.mscale_all_dim != 0)
        why.push_back("--rope-type rope with --rotary-scaling-factor above 1 and --mscale-all-dim (Megatron then scales "
                      "the softmax, which transformers does only with rope_scaling)");
    } else if (f < 1) {
      why.push_back(fmt::format("--rotary-scaling-factor {} below 1 (transformers' YaRN takes a factor >= 1)", f));
    } else if (f > 1 && 4096 * f != std::floor(4096 * f)) {
      why.push_back(fmt::format("--rotary-scaling-factor {}: transformers takes YaRN's factor as "
                                "max_position_embeddings / 4096, which must then be a whole number",
                                f));
    } else if (f > 1 && ((c.mscale_all_dim == 0 && c.mscale != 1) || (c.mscale == 0 && c.mscale_all_dim != 0))) {
      why.push_back(fmt::format("--mscale {} with --mscale-all-dim {} (transformers' YaRN takes its attention factor "
                                "from the two only when both are non-zero, else 0.1 ln(factor) + 1)",
                                c.mscale, c.mscale_all_dim));
    }
    if (c.is_moe()) {
      if (!c.sigmoid_router())
        why.push_back("a softmax router (DeepseekV3ForCausalLM's scores are sigmoids: --moe-router-score-function sigmoid)");
      if (!c.has_shared_expert() || c.moe_shared_expert_intermediate_size % c.moe_ffn() != 0)
        why.push_back(fmt::format("--moe-shared-expert-intermediate-size {} (DeepseekV3ForCausalLM has n_shared_experts "
                                  "> 0 experts of --moe-ffn-hidden-size {} as one shared MLP)",
                                  c.moe_shared_expert_intermediate_size, c.moe_ffn()));
      if (c.moe_shared_expert_gate) why.push_back("--moe-shared-expert-gate (DeepSeek-V3's shared experts are not gated)");
      int64_t dense = 0;
      while (dense < c.num_layers && !c.is_moe_layer(dense)) ++dense;
      for (int64_t l = dense; l < c.num_layers; ++l)
        if (!c.is_moe_layer(l)) {
          why.push_back(fmt::format("--moe-layer-freq '{}' (DeepseekV3ForCausalLM's dense layers are the first "
                                    "first_k_dense_replace ones)",
                                    c.moe_layer_freq));
          break;
        }
      if (c.group_limited() && c.moe_router_topk / c.moe_router_group_topk != 2)
        why.push_back(fmt::format("--moe-router-topk {} / --moe-router-group-topk {} != 2 (DeepseekV3ForCausalLM ranks "
                                  "the groups by the sum of their top 2 scores)",
                                  c.moe_router_topk, c.moe_router_group_topk));
      if (c.drops_tokens()) why.push_back("--moe-expert-capacity-factor (DeepseekV3ForCausalLM drops no tokens)");
    }
    if (c.mtp_use_repeated_layer && c.mtp_layers() > 1)
      why.push_back(fmt::format("--mtp-use-repeated-layer (DeepSeek's files hold one multi-token prediction layer per "
                                "depth: the shared layer would be written {} times and read back as {} layers)",
                                c.mtp_layers(), c.mtp_layers()));
    if (why.empty()) return HfArch::kDeepseekV3;
    std::string msg = "no Hugging Face transformers architecture computes this model:";
    for (const auto& w : why) msg += "\n  - " + w;
    return Status::invalid(msg);
  }

  const bool llama_shape = c.normalization == Normalization::kRMSNorm && c.swiglu &&
                           c.position_embedding == PositionEmbedding::kRope;
  const bool gpt2_shape = c.normalization == Normalization::kLayerNorm && !c.swiglu &&
                          c.position_embedding == PositionEmbedding::kLearnedAbsolute;
  std::vector<std::string> why = common;
  if (llama_shape) {
    if (c.rotary_percent != 1.0)
      why.push_back(fmt::format("--rotary-percent {} (LlamaForCausalLM rotates whole heads)", c.rotary_percent));
    if (c.use_rope_scaling && c.rotary_seq_len_interpolation_factor)
      why.push_back("--use-rope-scaling together with --rotary-seq-len-interpolation-factor (rope_scaling takes one)");
    if (c.qk_layernorm && (c.add_bias_linear || c.add_qkv_bias))
      why.push_back(fmt::format("--qk-layernorm with {} (Qwen3ForCausalLM, the transformers class with q/k norms, "
                                "has biases on q/k/v/o or none, and none on the MLP)",
                                c.add_bias_linear ? "biases on every linear layer" : "--add-qkv-bias"));
    if (c.is_moe()) {
      // Three transformers MoE classes take Megatron's softmax top-k router
      // without scaling or groups: Qwen3MoeForCausalLM (Qwen3's attention
      // with q/k norms, no shared expert; dense layers through
      // mlp_only_layers; norm_topk_prob: the top-k renormalised, or with
      // --moe-router-pre-softmax not); without q/k norms,
      // Qwen2MoeForCausalLM (a shared expert with its sigmoid gate, q/k/v
      // biases, written as zeros when the model has none; mlp_only_layers
      // and norm_topk_prob as Qwen3-MoE's) and MixtralForCausalLM (no shared
      // expert, experts in every layer, renormalised, plain RoPE).
      const char* cls = c.qk_layernorm         ? "Qwen3MoeForCausalLM"
                        : c.has_shared_expert() ? "Qwen2MoeForCausalLM"
                                                : "MixtralForCausalLM";
      const bool qwen2moe = !c.qk_layernorm && c.has_shared_expert();
      if (c.add_bias_linear || (c.add_qkv_bias && !qwen2moe))
        why.push_back(fmt::format("biases ({}, the transformers MoE class, has {})", cls,
                                  qwen2moe ? "them on q/k/v only: --add-qkv-bias" : "none"));
      if (c.sigmoid_router()) why.push_back(fmt::format("--moe-router-score-function sigmoid ({}'s router is a softmax)", cls));
      if (c.has_shared_expert() && c.qk_layernorm)
        why.push_back("--moe-shared-expert-intermediate-size with --qk-layernorm (Qwen3MoeForCausalLM has no shared "
                      "expert; Qwen2MoeForCausalLM, which has one, has no q/k norms)");
      if (qwen2moe && !c.moe_shared_expert_gate)
        why.push_back("--moe-shared-expert-intermediate-size without --moe-shared-expert-gate (Qwen2MoeForCausalLM, the "
                      "transformers class with a shared expert, gates it)");
      if (c.moe_router_topk_scaling_factor && *c.moe_router_topk_scaling_factor != 1.0)
        why.push_back(fmt::format("--moe-router-topk-scaling-factor ({} does not scale the probabilities)", cls));
      if (c.group_limited())
        why.push_back(fmt::format("--moe-router-group-topk ({} chooses among all experts)", cls));
      if (!c.qk_layernorm && c.head_dim() * c.num_attention_heads != c.hidden_size)
        why.push_back(fmt::format("--kv-channels {} x {} heads != --hidden-size {} (transformers 4.45's {} splits the "
                                  "hidden size into its heads)",
                                  c.head_dim(), c.num_attention_heads, c.hidden_size, cls));
      if (c.qk_layernorm) {
        if (why.empty()) return HfArch::kQwen3Moe;
      } else if (qwen2moe) {
        if (why.empty()) return HfArch::kQwen2Moe;
      } else {
        if (c.has_dense_layers())
          why.push_back(fmt::format("--moe-layer-freq '{}' with dense layers (MixtralForCausalLM has experts in every "
                                    "layer; Qwen3MoeForCausalLM, which takes dense layers, has q/k norms: "
                                    "--qk-layernorm)",
                                    c.moe_layer_freq));
        if (c.moe_router_pre_softmax)
          why.push_back("--moe-router-pre-softmax (MixtralForCausalLM renormalises the chosen experts' probabilities; "
                        "Qwen3MoeForCausalLM's norm_topk_prob false does not, with --qk-layernorm)");
        if (c.use_rope_scaling || c.rotary_seq_len_interpolation_factor)
          why.push_back("RoPE scaling with --num-experts (this export writes MixtralForCausalLM without rope_scaling)");
        if (why.empty()) return HfArch::kMixtral;
      }
    }
    if (why.empty() && c.qk_layernorm) return HfArch::kQwen3;
    if (why.empty()) return c.add_bias_linear || !c.add_qkv_bias ? HfArch::kLlama : HfArch::kQwen2;
  } else if (gpt2_shape) {
    if (c.is_moe())
      why.push_back("--num-experts (GPT2LMHeadModel has no experts; the transformers MoE classes, MixtralForCausalLM, "
                    "Qwen2MoeForCausalLM and Qwen3MoeForCausalLM, need RMSNorm + SwiGLU + rope)");
    if (c.qk_layernorm) why.push_back("--qk-layernorm (GPT2LMHeadModel has no query/key norms)");
    if (c.query_groups() != c.num_attention_heads)
      why.push_back(fmt::format("--num-query-groups {} < --num-attention-heads {} (GPT-2 has one key/value head per "
                                "query head)",
                                c.query_groups(), c.num_attention_heads));
    if (c.head_dim() * c.num_attention_heads != c.hidden_size)
      why.push_back(fmt::format("--kv-channels {} x {} heads != --hidden-size {} (GPT-2's heads split the hidden size)",
                                c.head_dim(), c.num_attention_heads, c.hidden_size));
    if (why.empty()) return HfArch::kGpt2;
  } else {
    why.push_back(fmt::format(
        "{} + {} + {} position embeddings: LlamaForCausalLM/Qwen2ForCausalLM/Qwen3ForCausalLM need RMSNorm + SwiGLU + rope, "
        "GPT2LMHeadModel needs LayerNorm + GELU + learned_absolute",
        model::normalization_name(c.normalization), c.swiglu ? "SwiGLU" : "GELU",
        model::position_embedding_name(c.position_embedding)));
  }
  std::string msg = "no Hugging Face transformers architecture computes this model:";
  for (const auto& w : why) msg += "\n  - " + w;
  return Status::invalid(msg);
}

nlohmann::json hf_config(HfArch arch, const model::ModelConfig& c, const HfTokenizerInfo& tok, int64_t vocab_rows,
                         DType dtype) {
  using nlohmann::json;
  const char* torch_dtype = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  const json eos = tok.eod >= 0 ? json(tok.eod) : json(nullptr);
  // GPT-2's <|endoftext|> is its BOS too; SentencePiece models name theirs.
  const json bos = tok.type == "GPT2BPETokenizer" ? eos : tok.bos >= 0 ? json(tok.bos) : json(nullptr);
  const int64_t max_pos = c.max_position_embeddings ? c.max_position_embeddings : c.seq_length;
  // The keys every architecture's config.json has.
  auto with_common_keys = [&](json j) {
    j["tie_word_embeddings"] = !c.untie_embeddings_and_output_weights;
    j["bos_token_id"] = bos;
    j["eos_token_id"] = eos;
    j["use_cache"] = true;
    j["torch_dtype"] = torch_dtype;
    j["transformers_version"] = kTransformersVersion;
    return j;
  };
  if (arch == HfArch::kGpt2) {
    json j{{"architectures", {hf_arch_name(arch)}},
                {"model_type", "gpt2"},
                {"vocab_size", vocab_rows},
                {"n_positions", max_pos},
                {"n_ctx", max_pos},
                {"n_embd", c.hidden_size},
                {"n_layer", c.num_layers},
                {"n_head", c.num_attention_heads},
                {"n_inner", c.ffn()},
                {"activation_function", c.squared_relu ? "relu2" : c.gelu_tanh() ? "gelu_new" : "gelu"},
                {"layer_norm_epsilon", c.norm_epsilon},
                {"initializer_range", c.init_method_std},
                {"resid_pdrop", c.hidden_dropout},
                {"embd_pdrop", c.hidden_dropout},
                {"attn_pdrop", c.attention_dropout},
                {"scale_attn_weights", true}};
    return with_common_keys(std::move(j));
  }
  if (arch == HfArch::kDeepseekV3) {
    // transformers' YaRN: the factor from max_position_embeddings /
    // original_max_position_embeddings, which it writes as DeepSeek-V3 does
    // (4096 x factor); Megatron's MLA takes original 4096, betas 32 and 1.
    const bool yarn = c.mla_yarn() && c.rotary_scaling_factor > 1;
    json rope_scaling = nullptr;
    int64_t positions = max_pos;
    if (yarn) {
      rope_scaling = {{"rope_type", "yarn"},
                      {"factor", c.rotary_scaling_factor},
                      {"original_max_position_embeddings", 4096},
                      {"beta_fast", 32.0},
                      {"beta_slow", 1.0},
                      {"mscale", c.mscale},
                      {"mscale_all_dim", c.mscale_all_dim}};
      positions = static_cast<int64_t>(std::llround(4096 * c.rotary_scaling_factor));
    }
    int64_t dense = 0;
    while (dense < c.num_layers && !c.is_moe_layer(dense)) ++dense;
    // An all-dense decoder: its MTP layers dense too (DeepSeek's code makes
    // layer i MoE from first_k_dense_replace on, the MTP layers included).
    if (dense == c.num_layers) dense += c.mtp_layers();
    const bool moe = c.is_moe();
    json j{{"architectures", {hf_arch_name(arch)}},
           {"model_type", "deepseek_v3"},
           {"vocab_size", vocab_rows},
           {"hidden_size", c.hidden_size},
           {"intermediate_size", c.ffn()},
           {"moe_intermediate_size", moe ? c.moe_ffn() : c.ffn()},
           {"num_hidden_layers", c.num_layers},
           {"num_attention_heads", c.num_attention_heads},
           {"num_key_value_heads", c.num_attention_heads},
           {"n_shared_experts", moe ? c.moe_shared_expert_intermediate_size / c.moe_ffn() : 1},
           {"n_routed_experts", moe ? c.num_experts : 1},
           {"routed_scaling_factor", c.moe_router_topk_scaling_factor.value_or(1.0)},
           {"kv_lora_rank", c.kv_lora_rank},
           {"q_lora_rank", c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr)},
           {"qk_rope_head_dim", c.qk_pos_emb_head_dim},
           {"v_head_dim", c.v_head_dim},
           {"qk_nope_head_dim", c.qk_head_dim},
           {"head_dim", c.qk_pos_emb_head_dim},
           {"n_group", moe && c.group_limited() ? c.moe_router_num_groups : 1},
           {"topk_group", moe && c.group_limited() ? c.moe_router_group_topk : 1},
           {"num_experts_per_tok", moe ? c.moe_router_topk : 1},
           // Megatron's sigmoid router renormalises the top k when k > 1.
           {"norm_topk_prob", moe && c.moe_router_topk > 1},
           {"first_k_dense_replace", dense},
           {"hidden_act", "silu"},
           {"max_position_embeddings", positions},
           {"initializer_range", c.init_method_std},
           {"rms_norm_eps", c.norm_epsilon},
           {"rope_theta", c.rotary_base},
           {"rope_scaling", rope_scaling},
           {"rope_interleave", true},
           // --mtp-num-layers: the MTP layers after the decoder's (DeepSeek's key; transformers skips them).
           {"num_nextn_predict_layers", c.mtp_layers()},
           {"attention_bias", false},
           {"attention_dropout", c.attention_dropout},
           {"pretraining_tp", 1}};
    j = with_common_keys(std::move(j));
    j["transformers_version"] = kTransformersVersionDeepseekV3;
    return j;
  }
  json rope_scaling = nullptr;
  if (c.use_rope_scaling)
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", c.rope_scaling_factor},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 8192}};
  else if (c.rotary_seq_len_interpolation_factor)
    rope_scaling = {{"rope_type", "linear"}, {"factor", static_cast<double>(*c.rotary_seq_len_interpolation_factor)}};
  json j{{"architectures", {hf_arch_name(arch)}},
         {"model_type", arch == HfArch::kLlama     ? "llama"
                        : arch == HfArch::kQwen2   ? "qwen2"
                        : arch == HfArch::kQwen3   ? "qwen3"
                        : arch == HfArch::kQwen3Moe ? "qwen3_moe"
                        : arch == HfArch::kQwen2Moe ? "qwen2_moe"
                                                   : "mixtral"},
         {"vocab_size", vocab_rows},
         {"hidden_size", c.hidden_size},
         {"intermediate_size", arch == HfArch::kMixtral ? c.moe_ffn() : c.ffn()},
         {"num_hidden_layers", c.num_layers},
         {"num_attention_heads", c.num_attention_heads},
         {"num_key_value_heads", c.query_groups()},
         {"head_dim", c.head_dim()},
         {"hidden_act", "silu"},
         {"max_position_embeddings", max_pos},
         {"initializer_range", c.init_method_std},
         {"rms_norm_eps", c.norm_epsilon},
         {"rope_theta", c.rotary_base},
         {"rope_scaling", rope_scaling},
         {"attention_dropout", c.attention_dropout}};
  if (arch == HfArch::kMixtral) {
    j.erase("rope_scaling");
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    // Megatron adds each layer's load-balancing loss; transformers computes
    // one over all layers' routing: the coefficient is carried as given.
    j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
  } else if (arch == HfArch::kLlama) {
    j["attention_bias"] = c.add_bias_linear;
    j["mlp_bias"] = c.add_bias_linear;
    j["pretraining_tp"] = 1;
  } else {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
    if (arch == HfArch::kQwen3 || arch == HfArch::kQwen3Moe) j["attention_bias"] = false;
    if (arch == HfArch::kQwen3Moe || arch == HfArch::kQwen2Moe) {
      // Layer l is sparse iff l is not in mlp_only_layers and (l + 1) %
      // decoder_sparse_step == 0: step 1 and the dense layers listed give
      // any --moe-layer-freq pattern; intermediate_size is the dense MLP's.
      json dense = json::array();
      for (int64_t l = 0; l < c.num_layers; ++l)
        if (!c.is_moe_layer(l)) dense.push_back(l);
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.moe_router_topk;
      j["moe_intermediate_size"] = c.moe_ffn();
      j["norm_topk_prob"] = !c.moe_router_pre_softmax;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = dense;
      j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;  // as for Mixtral: carried as given
      j["output_router_logits"] = false;
      if (arch == HfArch::kQwen2Moe) {
        // Its shared expert (gated) and q/k/v biases (transformers 5's
        // qkv_bias; 4.x always has them: zeros where the model has none).
        j["shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
        j["qkv_bias"] = true;
        j.erase("attention_bias");
      }
    }
  }
  j = with_common_keys(std::move(j));
  if (arch == HfArch::kQwen3 || arch == HfArch::kQwen3Moe) j["transformers_version"] = kTransformersVersionQwen3;
  return j;
}

std::vector<HfMap> hf_maps(const model::ModelConfig& c, HfArch arch, int64_t vocab_rows) {
  const int64_t h = c.hidden_size, a = c.num_attention_heads, g = c.query_groups(), d = c.head_dim();
  const int64_t qpg = a / g, F = c.ffn(), L = c.num_layers;
  const bool bias = c.add_bias_linear, ln = c.normalization == model::Normalization::kLayerNorm;
  const float one_p = c.apply_layernorm_1p ? 1.f : 0.f;
  std::vector<HfMap> v;
  auto iota = [](int64_t first, int64_t n) {
    std::vector<int64_t> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = first + i;
    return r;
  };
  // HF rows [0, n) = Megatron rows [first, first + n) of width cols.
  auto rows = [&](std::string hf, std::string meg, int64_t first, int64_t n, int64_t cols, float add = 0.f) {
    HfMap m{std::move(hf), cols == 1 ? Shape{n} : Shape{n, cols}, std::move(meg), cols, iota(first, n), false, add};
    v.push_back(std::move(m));
  };
  // Conv1D (GPT-2): HF [cols, n], column j = Megatron row src[j].
  auto conv = [&](std::string hf, std::string meg, std::vector<int64_t> src, int64_t cols) {
    const int64_t n = static_cast<int64_t>(src.size());
    v.push_back(HfMap{std::move(hf), Shape{cols, n}, std::move(meg), cols, std::move(src), true, 0.f});
  };
  // A 1-D HF tensor gathered from a Megatron vector (or zeros when `meg` is empty).
  auto gather = [&](std::string hf, std::string meg, std::vector<int64_t> src) {
    const int64_t n = static_cast<int64_t>(src.size());
    v.push_back(HfMap{std::move(hf), Shape{n}, std::move(meg), 1, std::move(src), false, 0.f});
  };
  // A SwiGLU MLP of width W under HF prefix x: its gate, up and down
  // projections from Megatron's fc1 [gate; up] and fc2 under prefix m.
  auto glu = [&](const std::string& x, const char* gate, const char* up, const char* down, const std::string& m,
                 int64_t W) {
    rows(x + gate + ".weight", m + "linear_fc1.weight", 0, W, h);
    rows(x + up + ".weight", m + "linear_fc1.weight", W, W, h);
    rows(x + down + ".weight", m + "linear_fc2.weight", 0, h, W);
  };
  // The linear_qkv row of head dim t of q head j, of group j's k, or its v.
  auto q_row = [&](int64_t head, int64_t t) { return (head / qpg) * (qpg + 2) * d + (head % qpg) * d + t; };
  auto k_row = [&](int64_t grp, int64_t t) { return grp * (qpg + 2) * d + qpg * d + t; };
  auto v_row = [&](int64_t grp, int64_t t) { return grp * (qpg + 2) * d + (qpg + 1) * d + t; };
  // transformers' rotate-half dim t of a q/k head is interleaved dim rot_src(t).
  auto rot_src = [&](int64_t t) {
    if (!c.rotary_interleaved) return t;
    return t < d / 2 ? 2 * t : 2 * (t - d / 2) + 1;
  };

  if (arch == HfArch::kGpt2) {
    rows("transformer.wte.weight", "embedding.word_embeddings.weight", 0, vocab_rows, h);
    rows("transformer.wpe.weight", "embedding.position_embeddings.weight", 0, c.max_position_embeddings, h);
    // c_attn's output columns are [all q | all k | all v] (one k/v head per q head).
    std::vector<int64_t> qkv_src;
    for (int s = 0; s < 3; ++s)
      for (int64_t head = 0; head < a; ++head)
        for (int64_t t = 0; t < d; ++t) qkv_src.push_back(s == 0 ? q_row(head, t) : s == 1 ? k_row(head, t) : v_row(head, t));
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("decoder.layers.{}.", l), o = fmt::format("transformer.h.{}.", l);
      const std::string qkv_bias = c.qkv_bias() ? p + "self_attention.linear_qkv.bias" : "";
      rows(o + "ln_1.weight", p + "input_layernorm.weight", 0, h, 1, one_p);
      rows(o + "ln_1.bias", p + "input_layernorm.bias", 0, h, 1);
      conv(o + "attn.c_attn.weight", p + "self_attention.linear_qkv.weight", qkv_src, h);
      gather(o + "attn.c_attn.bias", qkv_bias, qkv_src);
      conv(o + "attn.c_proj.weight", p + "self_attention.linear_proj.weight", iota(0, h), a * d);
      gather(o + "attn.c_proj.bias", bias ? p + "self_attention.linear_proj.bias" : "", iota(0, h));
      rows(o + "ln_2.weight", p + "pre_mlp_layernorm.weight", 0, h, 1, one_p);
      rows(o + "ln_2.bias", p + "pre_mlp_layernorm.bias", 0, h, 1);
      conv(o + "mlp.c_fc.weight", p + "mlp.linear_fc1.weight", iota(0, F), h);
      gather(o + "mlp.c_fc.bias", bias ? p + "mlp.linear_fc1.bias" : "", iota(0, F));
      conv(o + "mlp.c_proj.weight", p + "mlp.linear_fc2.weight", iota(0, h), F);
      gather(o + "mlp.c_proj.bias", bias ? p + "mlp.linear_fc2.bias" : "", iota(0, h));
    }
    rows("transformer.ln_f.weight", "decoder.final_layernorm.weight", 0, h, 1, one_p);
    rows("transformer.ln_f.bias", "decoder.final_layernorm.bias", 0, h, 1);
    if (c.untie_embeddings_and_output_weights) rows("lm_head.weight", "output_layer.weight", 0, vocab_rows, h);
    MT_CHECK(ln, "hf_maps: GPT-2 has LayerNorm");
    return v;
  }

  if (arch == HfArch::kDeepseekV3) {
    // Megatron's MLA tensors have DeepSeek-V3's row orders already: q per
    // head [nope | rope], kv_a [compressed | rope key], kv_b per head
    // [k nope | v]; transformers' rope_interleave de-interleaves the rope
    // dims as Megatron's MLA does.
    rows("model.embed_tokens.weight", "embedding.word_embeddings.weight", 0, vocab_rows, h);
    const int64_t D = c.head_dim(), kl = c.kv_lora_rank, dr = c.qk_pos_emb_head_dim;
    auto mlp = [&](const std::string& x, const std::string& m, int64_t W) {
      glu(x, "gate_proj", "up_proj", "down_proj", m, W);
    };
    // Layer l (a decoder layer, or an MTP depth's under
    // model.layers.{L + k}) under Megatron prefix p and HF prefix o.
    auto layer = [&](int64_t l, const std::string& p, const std::string& o) {
      const std::string sa = p + "self_attention.", at = o + "self_attn.";
      rows(o + "input_layernorm.weight", p + "input_layernorm.weight", 0, h, 1, one_p);
      MT_CHECK(c.q_lora_rank.has_value(), "hf_maps: DeepseekV3 needs --q-lora-rank");
      const int64_t ql = *c.q_lora_rank;
      rows(at + "q_a_proj.weight", sa + "linear_q_down_proj.weight", 0, ql, h);
      rows(at + "q_a_layernorm.weight", sa + "q_layernorm.weight", 0, ql, 1, one_p);
      rows(at + "q_b_proj.weight", sa + "linear_q_up_proj.weight", 0, a * D, ql);
      rows(at + "kv_a_proj_with_mqa.weight", sa + "linear_kv_down_proj.weight", 0, kl + dr, h);
      rows(at + "kv_a_layernorm.weight", sa + "kv_layernorm.weight", 0, kl, 1, one_p);
      rows(at + "kv_b_proj.weight", sa + "linear_kv_up_proj.weight", 0, a * (c.qk_head_dim + c.v_head_dim), kl);
      rows(at + "o_proj.weight", sa + "linear_proj.weight", 0, h, a * c.v_head_dim);
      rows(o + "post_attention_layernorm.weight", p + "pre_mlp_layernorm.weight", 0, h, 1, one_p);
      if (!c.is_moe_layer(l)) {
        mlp(o + "mlp.", p + "mlp.", F);
        return;
      }
      rows(o + "mlp.gate.weight", p + "mlp.router.weight", 0, c.num_experts, h);
      // The aux-loss-free bias (state here, a buffer there; zeros without it).
      gather(o + "mlp.gate.e_score_correction_bias", c.has_expert_bias() ? p + "mlp.router.expert_bias" : "",
             iota(0, c.num_experts));
      for (int64_t e = 0; e < c.num_experts; ++e)
        mlp(fmt::format("{}mlp.experts.{}.", o, e), fmt::format("{}mlp.experts.local_experts.{}.", p, e), c.moe_ffn());
      mlp(o + "mlp.shared_experts.", p + "mlp.shared_experts.", c.moe_shared_expert_intermediate_size);
    };
    for (int64_t l = 0; l < L; ++l) layer(l, c.layer_prefix(l), fmt::format("model.layers.{}.", l));
    rows("model.norm.weight", "decoder.final_layernorm.weight", 0, h, 1, one_p);
    const std::string head = c.untie_embeddings_and_output_weights ? "output_layer.weight" : "embedding.word_embeddings.weight";
    if (c.untie_embeddings_and_output_weights) rows("lm_head.weight", head, 0, vocab_rows, h);
    // --mtp-num-layers: DeepSeek-V3's multi-token prediction layers after
    // the decoder's (num_nextn_predict_layers; model.layers.61 there): the
    // layer's own tensors, enorm, hnorm, eh_proj ([h, 2h], the embedding's
    // half first, as Megatron's and DeepSeek's inference), shared_head.norm
    // (Megatron's final_layernorm of the depth), and copies of the
    // embedding and the output layer as DeepSeek's files carry them.
    for (int64_t k = 0; k < c.mtp_layers(); ++k) {
      // (--mtp-use-repeated-layer: the one layer written at every depth.)
      const std::string o = fmt::format("model.layers.{}.", L + k), m = c.mtp_prefix(k);
      layer(L + k, c.layer_prefix(L + k), o);
      rows(o + "enorm.weight", m + "enorm.weight", 0, h, 1, one_p);
      rows(o + "hnorm.weight", m + "hnorm.weight", 0, h, 1, one_p);
      rows(o + "eh_proj.weight", m + "eh_proj.weight", 0, h, 2 * h);
      rows(o + "shared_head.norm.weight", m + "final_layernorm.weight", 0, h, 1, one_p);
      rows(o + "embed_tokens.weight", "embedding.word_embeddings.weight", 0, vocab_rows, h);
      v.back().copy = true;
      rows(o + "shared_head.head.weight", head, 0, vocab_rows, h);
      v.back().copy = true;
    }
    return v;
  }

  // LLaMA / Qwen2 / Qwen3 / Mixtral / Qwen3-MoE.
  rows("model.embed_tokens.weight", "embedding.word_embeddings.weight", 0, vocab_rows, h);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l), o = fmt::format("model.layers.{}.", l);
    rows(o + "input_layernorm.weight", p + "input_layernorm.weight", 0, h, 1, one_p);
    const std::string qkv = p + "self_attention.linear_qkv.";
    std::vector<int64_t> q, k, val;
    for (int64_t head = 0; head < a; ++head)
      for (int64_t t = 0; t < d; ++t) q.push_back(q_row(head, rot_src(t)));
    for (int64_t grp = 0; grp < g; ++grp)
      for (int64_t t = 0; t < d; ++t) k.push_back(k_row(grp, rot_src(t))), val.push_back(v_row(grp, t));
    for (auto [name, src] : {std::pair{"q_proj", &q}, std::pair{"k_proj", &k}, std::pair{"v_proj", &val}}) {
      const int64_t n = static_cast<int64_t>(src->size());
      v.push_back(HfMap{o + "self_attn." + name + ".weight", Shape{n, h}, qkv + "weight", h, *src, false, 0.f});
      // (Qwen2-MoE always has q/k/v biases: zeros for a model without.)
      if (c.qkv_bias() || arch == HfArch::kQwen2Moe)
        gather(o + "self_attn." + name + ".bias", c.qkv_bias() ? qkv + "bias" : "", *src);
    }
    if (c.qk_layernorm)  // one [d] weight per head kind, its dims in transformers' rotate-half order like q/k's rows
      for (auto [name, meg] : {std::pair{"q_norm", "q_layernorm"}, std::pair{"k_norm", "k_layernorm"}}) {
        std::vector<int64_t> src;
        for (int64_t t = 0; t < d; ++t) src.push_back(rot_src(t));
        v.push_back(HfMap{o + "self_attn." + name + ".weight", Shape{d}, p + "self_attention." + meg + ".weight", 1,
                          std::move(src), false, one_p});
      }
    rows(o + "self_attn.o_proj.weight", p + "self_attention.linear_proj.weight", 0, h, a * d);
    if (bias) rows(o + "self_attn.o_proj.bias", p + "self_attention.linear_proj.bias", 0, h, 1);
    rows(o + "post_attention_layernorm.weight", p + "pre_mlp_layernorm.weight", 0, h, 1, one_p);
    // The router as `gate` and expert e's MLP under `experts` + "e.".
    auto routed = [&](const std::string& gate, const std::string& experts, const char* g, const char* u,
                      const char* dn) {
      rows(gate, p + "mlp.router.weight", 0, c.num_experts, h);
      for (int64_t e = 0; e < c.num_experts; ++e)
        glu(fmt::format("{}{}.", experts, e), g, u, dn, fmt::format("{}mlp.experts.local_experts.{}.", p, e),
            c.moe_ffn());
    };
    if (arch == HfArch::kMixtral) {  // block_sparse_moe: each expert's w1 (gate), w3 (up), w2 (down)
      routed(o + "block_sparse_moe.gate.weight", o + "block_sparse_moe.experts.", "w1", "w3", "w2");
      continue;
    }
    if ((arch == HfArch::kQwen3Moe || arch == HfArch::kQwen2Moe) && c.is_moe_layer(l)) {
      // Qwen{2,3}MoeSparseMoeBlock: the router (gate) and each expert's
      // gate_proj, up_proj, down_proj; Qwen2-MoE's shared expert the same
      // way, and its gate.
      if (arch == HfArch::kQwen2Moe) {
        glu(o + "mlp.shared_expert.", "gate_proj", "up_proj", "down_proj", p + "mlp.shared_experts.",
            c.moe_shared_expert_intermediate_size);
        rows(o + "mlp.shared_expert_gate.weight", p + "mlp.shared_experts.gate_weight", 0, 1, h);
      }
      routed(o + "mlp.gate.weight", o + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
      continue;
    }
    glu(o + "mlp.", "gate_proj", "up_proj", "down_proj", p + "mlp.", F);
    if (bias) {
      rows(o + "mlp.gate_proj.bias", p + "mlp.linear_fc1.bias", 0, F, 1);
      rows(o + "mlp.up_proj.bias", p + "mlp.linear_fc1.bias", F, F, 1);
      rows(o + "mlp.down_proj.bias", p + "mlp.linear_fc2.bias", 0, h, 1);
    }
  }
  rows("model.norm.weight", "decoder.final_layernorm.weight", 0, h, 1, one_p);
  if (c.untie_embeddings_and_output_weights) rows("lm_head.weight", "output_layer.weight", 0, vocab_rows, h);
  return v;
}

namespace {

// Whole-model checks shared by export and import.
Status check_whole_fp32(const model::GPTModel& m, const char* what) {
  if (m.options().tp != 1)
    return Status::invalid(fmt::format("hf {}: the model must be loaded whole (tensor parallel size 1)", what));
  if (m.options().dtype != DType::kF32 || m.options().device != Device::kCpu)
    return Status::invalid(fmt::format("hf {}: the model must hold fp32 parameters in host memory", what));
  for (const model::ParamSpec& sp : model::gpt_param_specs(m.config(), 1))
    if (m.find(sp.name) < 0)
      return Status::invalid(fmt::format("hf {}: the model lacks {} (load every pipeline stage)", what, sp.name));
  return Status::ok();
}

// A parameter's values, or an MoE layer's expert bias
// ("decoder.layers.{l}.mlp.router.expert_bias", --moe-router-enable-expert-bias:
// state beside the parameters, DeepSeek-V3's e_score_correction_bias).
float* param_data(const model::GPTModel& m, const std::string& name) {
  static constexpr std::string_view kBias = ".mlp.router.expert_bias", kLayers = "decoder.layers.", kMtp = "mtp.layers.";
  if (name.size() > kBias.size() && name.compare(name.size() - kBias.size(), kBias.size(), kBias) == 0) {
    // decoder.layers.{l}.mlp..., or an MTP depth's mtp.layers.{k}.transformer_layer.mlp... (global layer L + k).
    const bool mtp = name.compare(0, kMtp.size(), kMtp) == 0;
    MT_CHECK(mtp || name.compare(0, kLayers.size(), kLayers) == 0, "hf: no expert bias " + name);
    const int l = std::stoi(name.substr(mtp ? kMtp.size() : kLayers.size())) +
                  (mtp ? static_cast<int>(m.config().num_layers) : 0);
    const Tensor& b = m.expert_bias(l);
    MT_CHECK(b.defined(), "hf: no expert bias " + name);
    return b.ptr<float>();
  }
  const int i = m.find(name);
  MT_CHECK(i >= 0, "hf: no parameter " + name);
  return m.params()[static_cast<size_t>(i)].ptr<float>();
}

}  // namespace

namespace {

// One exported tensor's fp32 values.
std::vector<float> gather(const model::GPTModel& m, const HfMap& map) {
  std::vector<float> out(static_cast<size_t>(map.hf_shape.numel()), 0.f);
  if (map.meg.empty()) return out;
  const float* s = param_data(m, map.meg);
  const int64_t n = static_cast<int64_t>(map.src.size()), C = map.cols;
  for (int64_t j = 0; j < n; ++j) {
    const float* row = s + map.src[static_cast<size_t>(j)] * C;
    for (int64_t i = 0; i < C; ++i) out[static_cast<size_t>(map.transposed ? i * n + j : j * C + i)] = row[i] + map.add;
  }
  return out;
}

}  // namespace

Result<std::vector<HfTensor>> hf_tensors(const model::GPTModel& m, HfArch arch, int64_t vocab_rows) {
  MT_RETURN_IF_ERROR(check_whole_fp32(m, "export"));
  if (vocab_rows < 1 || vocab_rows > m.vocab())
    return Status::invalid(fmt::format("hf export: {} vocabulary rows asked for, the model has {}", vocab_rows, m.vocab()));
  std::vector<HfTensor> out;
  for (const HfMap& map : hf_maps(m.config(), arch, vocab_rows)) out.push_back(HfTensor{map.hf, map.hf_shape, gather(m, map)});
  return out;
}

Result<std::string> hf_output_path(const std::string& out_dir) {
  if (out_dir.empty()) return Status::invalid("--output: empty path");
  fs::path out = fs::absolute(fs::path(out_dir)).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "hf/" names hf
  std::error_code ec;
  const auto st = fs::symlink_status(out, ec);
  if (fs::exists(st) && !(fs::is_directory(st) && fs::is_empty(out, ec)))
    return Status::invalid(fmt::format("--output '{}' exists and is not an empty directory: choose a new directory "
                                       "(nothing there is overwritten)",
                                       out_dir));
  if (out.filename().empty() || out == out.root_path())
    return Status::invalid(fmt::format("--output '{}': name a directory to create", out_dir));
  return out.string();
}

namespace {

Status write_tokenizer_files(const HfTokenizerInfo& tok, const model::ModelConfig& c, const fs::path& dir,
                             std::vector<std::string>* files) {
  using nlohmann::json;
  auto copy = [&](const std::string& from, const std::string& flag, const char* to) -> Status {
    std::error_code ec;
    fs::copy_file(from, dir / to, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return Status::io_error(fmt::format("cannot copy the tokenizer's {} '{}' to '{}': {} (pass --{} with its new "
                                          "place)",
                                          flag, from, (dir / to).string(), ec.message(), flag));
    files->push_back(to);
    return Status::ok();
  };
  const int64_t max_len = c.max_position_embeddings ? c.max_position_embeddings : c.seq_length;
  json cfg;
  if (tok.type == "GPT2BPETokenizer") {
    if (Status st = copy(tok.vocab_file, "vocab-file", "vocab.json"); !st) return st;
    if (Status st = copy(tok.merge_file, "merge-file", "merges.txt"); !st) return st;
    cfg = {{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", max_len},   {"add_prefix_space", false},
           {"bos_token", "<|endoftext|>"},       {"eos_token", "<|endoftext|>"}, {"unk_token", "<|endoftext|>"}};
  } else if (tok.type == "SentencePieceTokenizer") {
    if (Status st = copy(tok.tokenizer_model, "tokenizer-model", "tokenizer.model"); !st) return st;
    // Megatron's SentencePiece tokenizer adds no BOS/EOS when it encodes.
    cfg = {{"tokenizer_class", "LlamaTokenizer"}, {"model_max_length", max_len}, {"add_bos_token", false},
           {"add_eos_token", false}};
    if (!tok.bos_piece.empty()) cfg["bos_token"] = tok.bos_piece;
    if (!tok.eos_piece.empty()) cfg["eos_token"] = tok.eos_piece;
    if (!tok.unk_piece.empty()) cfg["unk_token"] = tok.unk_piece;
  } else if (tok.type == "HuggingFaceTokenizer") {
    // The files themselves: transformers reads tokenizer.json as Megatron did.
    std::error_code ec;
    const bool is_dir = fs::is_directory(tok.tokenizer_model, ec);
    const fs::path src = is_dir ? fs::path(tok.tokenizer_model) : fs::path(tok.tokenizer_model).parent_path();
    const fs::path json_file = is_dir ? src / "tokenizer.json" : fs::path(tok.tokenizer_model);
    if (Status st = copy(json_file.string(), "tokenizer-model", "tokenizer.json"); !st) return st;
    for (const char* f : {"tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(src / f, ec))
        if (Status st = copy((src / f).string(), "tokenizer-model", f); !st) return st;
    return Status::ok();
  } else {
    return Status::ok();  // NullTokenizer: ids are the text; TikTokenizer: no transformers format; nothing to write
  }
  if (Status st = write_file_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n"); !st) return st;
  files->push_back("tokenizer_config.json");
  return Status::ok();
}

}  // namespace

Result<HfExportSummary> export_hf(const model::GPTModel& m, const HfTokenizerInfo& tok, const HfExportOptions& opt,
                                  const std::string& out_dir) {
  if (opt.dtype != DType::kF32 && opt.dtype != DType::kBF16 && opt.dtype != DType::kF16)
    return Status::invalid("hf export: the dtype must be fp32, bf16 or fp16");
  if (opt.max_shard_bytes < 1) return Status::invalid("hf export: the shard size must be positive");
  MT_RETURN_IF_ERROR(check_whole_fp32(m, "export"));
  auto arch = hf_architecture(m.config());
  if (!arch) return arch.status();
  auto out_str = hf_output_path(out_dir);
  if (!out_str) return out_str.status();
  const auto out = std::optional<fs::path>(fs::path(*out_str));
  int64_t vocab_rows = m.vocab();
  if (!opt.keep_vocab_padding && tok.vocab_size > 0 && tok.vocab_size <= m.vocab()) vocab_rows = tok.vocab_size;
  const std::vector<HfMap> maps = hf_maps(m.config(), *arch, vocab_rows);

  // A new temporary directory beside the output.
  std::error_code ec;
  fs::path tmp;
  for (int k = 0;; ++k) {
    tmp = out->parent_path() / fmt::format("{}.tmp.{}.{}", out->filename().string(), static_cast<long>(::getpid()), k);
    if (fs::create_directories(tmp, ec)) break;
    if (ec || k > 1000) return Status::io_error(fmt::format("cannot create a directory beside '{}': {}", out_dir,
                                                            ec ? ec.message() : "every name is taken"));
  }
  auto fail = [&](Status st) -> Status {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    return st;
  };

  HfExportSummary sum;
  sum.arch = *arch;
  const model::ModelConfig& mc = m.config();
  if (*arch == HfArch::kDeepseekV3 && mc.group_limited() && mc.has_expert_bias())
    sum.notes.push_back(
        "transformers' DeepseekV3ForCausalLM (its sources from 4.51 on) masks the experts of the groups it does not "
        "keep with a score of 0 (Megatron: -inf), so "
        "where a token's biased scores (sigmoid + e_score_correction_bias) in the kept groups fall below 0 it may choose "
        "an expert of another group, and the logits then differ from this model's; where those scores are positive "
        "they are the same");
  if (mc.mtp_layers() && *arch == HfArch::kDeepseekV3)
    sum.notes.push_back(fmt::format(
        "the {} multi-token prediction layer{} follow{} the decoder's as model.layers.{}... (num_nextn_predict_layers, "
        "DeepSeek's layout, each with copies of the embedding and the head); transformers' DeepseekV3ForCausalLM "
        "skips them, inference engines with MTP speculative decoding read them",
        mc.mtp_layers(), mc.mtp_layers() > 1 ? "s" : "", mc.mtp_layers() > 1 ? "" : "s", mc.num_layers));
  else if (mc.mtp_layers())
    sum.notes.push_back(fmt::format("the {} multi-token prediction layer{} {} not exported: {} has no place for them "
                                    "(the model without them predicts the next token as trained)",
                                    mc.mtp_layers(), mc.mtp_layers() > 1 ? "s" : "", mc.mtp_layers() > 1 ? "are" : "is",
                                    hf_arch_name(*arch)));
  sum.vocab_rows = vocab_rows;
  // Shards in order, each closed before it passes max_shard_bytes (a single
  // tensor larger than that gets a shard of its own); each shard's tensors
  // are computed only while it is written.
  // DeepSeek-V3's e_score_correction_bias stays fp32 whatever --dtype says
  // (as DeepSeek ships it and transformers keeps it): bf16's spacing near 0.5
  // exceeds the bias's update rate, and rounding could change the choice.
  auto dtype_of_map = [&](const HfMap& map) {
    const std::string tail = "e_score_correction_bias";
    const bool fp32 = map.hf.size() >= tail.size() && map.hf.compare(map.hf.size() - tail.size(), tail.size(), tail) == 0;
    return fp32 ? DType::kF32 : opt.dtype;
  };
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < maps.size(); ++i) {
    const int64_t b = maps[i].hf_shape.numel() * static_cast<int64_t>(dtype_size(dtype_of_map(maps[i])));
    if (in_shard > 0 && in_shard + b > opt.max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += b;
    sum.bytes += b;
    sum.parameters += maps[i].hf_shape.numel();
  }
  sum.tensors = static_cast<int64_t>(maps.size());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<std::vector<float>> f32;
    std::vector<std::vector<uint16_t>> lowp;  // bf16 or fp16 payloads
    std::vector<NamedTensor> named;
    f32.reserve(shards[s].size()), lowp.reserve(shards[s].size());
    for (size_t i : shards[s]) {
      const HfMap& map = maps[i];
      f32.push_back(gather(m, map));
      if (dtype_of_map(map) != DType::kF32) {
        // Rounded once to nearest even; fp16 turns values beyond 65504 into inf.
        lowp.emplace_back(f32.back().size());
        for (size_t j = 0; j < f32.back().size(); ++j) {
          const float v = f32.back()[j];
          lowp.back()[j] = opt.dtype == DType::kBF16 ? float_to_bf16(v).bits : float_to_f16(v).bits;
          if (opt.dtype == DType::kF16 && std::isfinite(v) && (lowp.back()[j] & 0x7c00) == 0x7c00)
            return fail(Status::invalid(fmt::format(
                "hf export: {} holds {} at element {}, beyond fp16's range (65504); export with --dtype bf16 or fp32",
                map.hf, v, j)));
        }
        std::vector<float>().swap(f32.back());
        named.push_back({map.hf, Tensor(lowp.back().data(), map.hf_shape, opt.dtype)});
      } else {
        named.push_back({map.hf, Tensor(f32.back().data(), map.hf_shape, DType::kF32)});
      }
      weight_map[map.hf] = file;
    }
    if (Status st = write_safetensors((tmp / file).string(), named, {{"format", "pt"}}); !st) return fail(st);
    sum.files.push_back(file);
  }
  if (shards.size() > 1) {
    nlohmann::json index{{"metadata", {{"total_size", sum.bytes}}}, {"weight_map", weight_map}};
    if (Status st = write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n"); !st)
      return fail(st);
    sum.files.push_back("model.safetensors.index.json");
  }
  const nlohmann::json config = hf_config(*arch, m.config(), tok, vocab_rows, opt.dtype);
  if (Status st = write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n"); !st) return fail(st);
  sum.files.push_back("config.json");
  if (Status st = write_tokenizer_files(tok, m.config(), tmp, &sum.files); !st) return fail(st);

  // The output may be an empty directory (checked by hf_output_path): it is
  // replaced; anything else there is never touched.
  if (fs::is_directory(fs::symlink_status(*out, ec))) fs::remove(*out, ec);
  fs::rename(tmp, *out, ec);
  if (ec)
    return fail(Status::io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), out_dir, ec.message())));
  return sum;
}

// ---- Import ----------------------------------------------------------------


Result<nlohmann::json> hf_read_json(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return Status::not_found(fmt::format("'{}' does not exist", path));
  if (!fs::is_regular_file(st)) return Status::invalid(fmt::format("'{}' is not a regular file", path));
  const auto size = fs::file_size(path, ec);
  if (ec || static_cast<int64_t>(size) > max_bytes)
    return Status::invalid(fmt::format("'{}' is {} bytes; a JSON file here is at most {}", path, size, max_bytes));
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size)))
    return Status::io_error(fmt::format("cannot read '{}'", path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::corrupt(fmt::format("'{}' is not valid JSON", path));
  return j;
}

Result<HfImportFlags> hf_import_flags(const nlohmann::json& j, const std::string& where) {
  using nlohmann::json;
  std::vector<std::string> why;
  if (!j.is_object()) return Status::corrupt(fmt::format("{}: not a JSON object", where));
  auto num = [&](const char* key, std::optional<double> def) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) {
      if (!def) why.push_back(fmt::format("\"{}\" is missing", key));
      return def;
    }
    if (!j[key].is_number()) {
      why.push_back(fmt::format("\"{}\" is {}, expected a number", key, json_brief(j[key])));
      return def;
    }
    return j[key].get<double>();
  };
  auto integer = [&](const char* key, std::optional<int64_t> def) -> int64_t {
    auto v = num(key, def ? std::optional<double>(static_cast<double>(*def)) : std::nullopt);
    if (!v) return 0;
    if (*v != std::floor(*v) || *v < 1 || *v > 1e12) {
      why.push_back(fmt::format("\"{}\" is {}, expected a positive integer", key, *v));
      return 0;
    }
    return static_cast<int64_t>(*v);
  };
  auto flag_b = [&](const char* key, bool def) {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_boolean()) {
      why.push_back(fmt::format("\"{}\" is {}, expected true or false", key, json_brief(j[key])));
      return def;
    }
    return j[key].get<bool>();
  };
  auto str = [&](const char* key, const std::string& def) {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_string()) {
      why.push_back(fmt::format("\"{}\" is {}, expected a string", key, json_brief(j[key])));
      return def;
    }
    return j[key].get<std::string>().substr(0, 60);
  };
  auto fmt_num = [](double v) { return fmt::format("{}", v); };
  // RoPE: rope_theta and rope_scaling (transformers 4.x), or one
  // rope_parameters object (transformers 5), which wins; rope_type
  // "default" (or none) is plain RoPE. rope_base() adds --rotary-base.
  const json* rp = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : nullptr;
  const json* rs = rp ? rp : j.contains("rope_scaling") && !j["rope_scaling"].is_null() ? &j["rope_scaling"] : nullptr;
  auto rope_base = [&] {
    double theta = num("rope_theta", 10000.0).value_or(10000.0);
    if (rp && rp->contains("rope_theta")) {
      if ((*rp)["rope_theta"].is_number())
        theta = (*rp)["rope_theta"].get<double>();
      else
        why.push_back(fmt::format("rope_parameters.rope_theta is {}, expected a number", json_brief((*rp)["rope_theta"])));
    }
    return theta;
  };
  auto rstr = [&](const char* k) {
    return rs && rs->is_object() && rs->contains(k) && (*rs)[k].is_string() ? (*rs)[k].get<std::string>()
                                                                             : std::string();
  };
  auto rnum = [&](const char* k) -> std::optional<double> {
    if (!rs || !rs->is_object() || !rs->contains(k) || !(*rs)[k].is_number()) return std::nullopt;
    return (*rs)[k].get<double>();
  };
  const std::string rope_kind = !rstr("rope_type").empty() ? rstr("rope_type") : !rstr("type").empty() ? rstr("type")
                                                                                                        : "default";
  std::string arch_name;
  if (j.contains("architectures") && j["architectures"].is_array() && j["architectures"].size() == 1 &&
      j["architectures"][0].is_string())
    arch_name = j["architectures"][0].get<std::string>();
  HfImportFlags out;
  std::vector<std::string>& f = out.flags;
  auto add = [&](std::string flag, std::string value = {}) {
    f.push_back(std::move(flag));
    if (!value.empty()) f.push_back(std::move(value));
  };
  if (arch_name == "GPT2LMHeadModel") {
    out.arch = HfArch::kGpt2;
    const int64_t h = integer("n_embd", std::nullopt), L = integer("n_layer", std::nullopt);
    const int64_t a = integer("n_head", std::nullopt), P = integer("n_positions", std::nullopt);
    const int64_t F = j.contains("n_inner") && !j["n_inner"].is_null() ? integer("n_inner", std::nullopt) : 4 * h;
    out.vocab_size = integer("vocab_size", std::nullopt);
    const std::string act = str("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu" && act != "relu2")
      why.push_back(fmt::format("activation_function \"{}\" (Megatron's GPT has GELU, gelu_new or gelu, or squared "
                                "ReLU, relu2)",
                                act));
    if (flag_b("scale_attn_by_inverse_layer_idx", false))
      why.push_back("scale_attn_by_inverse_layer_idx (Megatron scales attention by 1/sqrt(d) only)");
    if (!flag_b("scale_attn_weights", true)) why.push_back("scale_attn_weights false (Megatron scales by 1/sqrt(d))");
    add("--num-layers", std::to_string(L)), add("--hidden-size", std::to_string(h));
    add("--ffn-hidden-size", std::to_string(F)), add("--num-attention-heads", std::to_string(a));
    add("--max-position-embeddings", std::to_string(P));
    add("--norm-epsilon", fmt_num(num("layer_norm_epsilon", 1e-5).value_or(1e-5)));
    add("--hidden-dropout", fmt_num(num("resid_pdrop", 0.1).value_or(0.1)));
    add("--attention-dropout", fmt_num(num("attn_pdrop", 0.1).value_or(0.1)));
    if (act == "gelu") add("--no-bias-gelu-fusion");
    if (act == "relu2") add("--squared-relu"), add("--no-bias-gelu-fusion");
    if (!flag_b("tie_word_embeddings", true)) add("--untie-embeddings-and-output-weights");
  } else if (arch_name == "LlamaForCausalLM" || arch_name == "Qwen2ForCausalLM" || arch_name == "MistralForCausalLM" ||
             arch_name == "Qwen3ForCausalLM" || arch_name == "MixtralForCausalLM" || arch_name == "Qwen3MoeForCausalLM" ||
             arch_name == "Qwen2MoeForCausalLM") {
    const bool qwen2moe = arch_name == "Qwen2MoeForCausalLM";  // Qwen2's attention, experts and a gated shared expert
    const bool qwen = arch_name == "Qwen2ForCausalLM" || qwen2moe, mixtral = arch_name == "MixtralForCausalLM";
    const bool mistral = arch_name == "MistralForCausalLM" || mixtral;  // Mixtral: Mistral's attention, experts
    const bool qwen3moe = arch_name == "Qwen3MoeForCausalLM";
    const bool qwen3 = arch_name == "Qwen3ForCausalLM" || qwen3moe;  // Qwen3-MoE: Qwen3's attention, experts
    out.arch = qwen2moe ? HfArch::kQwen2Moe : qwen ? HfArch::kQwen2 : qwen3moe ? HfArch::kQwen3Moe : qwen3 ? HfArch::kQwen3 : mixtral ? HfArch::kMixtral
                                                                                              : HfArch::kLlama;  // Mistral: Llama's tensors and names
    const int64_t h = integer("hidden_size", std::nullopt), L = integer("num_hidden_layers", std::nullopt);
    // Qwen3MoeConfig's dense width defaults to 6144, Qwen2MoeConfig's to 5632
    // (used by mlp_only_layers only).
    const int64_t a = integer("num_attention_heads", std::nullopt),
                  F = integer("intermediate_size", qwen3moe   ? std::optional<int64_t>(6144)
                                                   : qwen2moe ? std::optional<int64_t>(5632)
                                                              : std::nullopt);
    // (Qwen3MoeConfig's key/value heads default to 4, Qwen2MoeConfig's to 16.)
    const int64_t g = integer("num_key_value_heads", qwen3moe ? 4 : qwen2moe ? 16 : a);
    // Qwen3Config's head_dim defaults to 128, the others' (Qwen3MoeConfig's
    // included) to hidden_size / heads.
    const int64_t d = integer("head_dim", qwen3 && !qwen3moe ? std::optional<int64_t>(128)
                                          : a > 0 ? std::optional<int64_t>(h / a) : std::nullopt);
    out.vocab_size = integer("vocab_size", std::nullopt);
    const int64_t P = integer("max_position_embeddings", qwen || qwen3 ? 32768 : mistral ? 131072 : 2048);  // the configs' defaults
    if (mistral) {
      // Sliding-window attention (MistralConfig's default window is 4096)
      // equals full causal attention on sequences no longer than the window.
      if (!j.contains("sliding_window")) {
        if (!mixtral) out.max_seq_length = 4096;  // MixtralConfig's default window is None
      } else if (!j["sliding_window"].is_null()) {
        out.max_seq_length = integer("sliding_window", std::nullopt);
      }
      if (out.max_seq_length && *out.max_seq_length >= P) out.max_seq_length.reset();
    }
    if (str("hidden_act", "silu") != "silu")
      why.push_back(fmt::format("hidden_act \"{}\" (Megatron's SwiGLU gates with silu)", str("hidden_act", "")));
    if (a > 0 && g > 0 && a % g) why.push_back(fmt::format("{} heads do not split into {} key/value groups", a, g));
    if ((qwen || qwen3) && flag_b("use_sliding_window", false))
      why.push_back("use_sliding_window (no sliding-window attention here)");
    if (qwen3 && flag_b("attention_bias", false))
      why.push_back("attention_bias true on Qwen3 or Qwen3-MoE (biases on q/k/v/o without the MLP's: Megatron's --add-bias-linear "
                    "puts them on every linear layer)");
    const bool attn_bias = !qwen && !qwen3 && !mistral && flag_b("attention_bias", false);
    const bool mlp_bias = !qwen && !qwen3 && !mistral && flag_b("mlp_bias", false);
    if (attn_bias != mlp_bias)
      why.push_back("attention_bias and mlp_bias differ (Megatron's --add-bias-linear puts biases on both or neither)");
    add("--num-layers", std::to_string(L)), add("--hidden-size", std::to_string(h));
    add("--ffn-hidden-size", std::to_string(F)), add("--num-attention-heads", std::to_string(a));
    if (g != a) add("--group-query-attention"), add("--num-query-groups", std::to_string(g));
    if (a > 0 && d != h / a) add("--kv-channels", std::to_string(d));
    add("--normalization", "RMSNorm"), add("--swiglu"), add("--position-embedding-type", "rope");
    add("--norm-epsilon", fmt_num(num("rms_norm_eps", 1e-6).value_or(1e-6)));
    add("--max-position-embeddings", std::to_string(P));
    add("--hidden-dropout", "0");
    add("--attention-dropout", fmt_num(num("attention_dropout", 0.0).value_or(0.0)));
    // (Qwen2MoeConfig's qkv_bias, transformers 5; always on in 4.x.)
    if (qwen) {
      add("--disable-bias-linear");
      if (!qwen2moe || flag_b("qkv_bias", true)) add("--add-qkv-bias");
    } else if (!attn_bias) {
      add("--disable-bias-linear");
    }
    if (qwen3) add("--qk-layernorm");
    if (mixtral) {
      // The experts (intermediate_size is each expert's width). Megatron's
      // load-balancing coefficient weighs each layer's loss, transformers'
      // one loss over all layers: not carried over (give --moe-aux-loss-coeff).
      add("--num-experts", std::to_string(integer("num_local_experts", 8)));
      add("--moe-router-topk", std::to_string(integer("num_experts_per_tok", 2)));
      add("--moe-ffn-hidden-size", std::to_string(F));
      if (num("router_jitter_noise", 0.0).value_or(0.0) != 0.0)
        why.push_back("router_jitter_noise (transformers' Mixtral jitters the experts' input as well as the "
                      "router's; Megatron's --moe-input-jitter-eps only the router's)");
    }
    if (qwen3moe || qwen2moe) {
      // Layer l is sparse iff l is not in mlp_only_layers and (l + 1) %
      // decoder_sparse_step == 0; the others are dense MLPs of
      // intermediate_size (--moe-layer-freq's list).
      // (transformers 5 may save num_experts under its attribute_map name, num_local_experts.)
      const char* experts_key = !j.contains("num_experts") && j.contains("num_local_experts") ? "num_local_experts"
                                                                                              : "num_experts";
      const int64_t E = integer(experts_key, qwen2moe ? 60 : 128),
                    k = integer("num_experts_per_tok", qwen2moe ? 4 : 8);
      const int64_t step = integer("decoder_sparse_step", 1);
      std::vector<char> dense(static_cast<size_t>(std::max<int64_t>(L, 0)), 0);
      if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
        const json& m = j["mlp_only_layers"];
        bool ok = m.is_array();
        for (size_t i = 0; ok && i < m.size(); ++i) {
          ok = m[i].is_number_integer() && m[i].get<int64_t>() >= 0 && m[i].get<int64_t>() < L;
          if (ok) dense[static_cast<size_t>(m[i].get<int64_t>())] = 1;
        }
        if (!ok)
          why.push_back(fmt::format("mlp_only_layers is {}, expected a list of layer indices in [0, {})", json_brief(m),
                                    L));
      }
      std::string pattern = "[";
      int64_t sparse = 0;
      for (int64_t l = 0; l < L; ++l) {
        const bool moe = !dense[static_cast<size_t>(l)] && step > 0 && (l + 1) % step == 0;
        sparse += moe;
        pattern += std::string(l ? "," : "") + (moe ? "1" : "0");
      }
      pattern += "]";
      if (L > 0 && step > 0 && sparse == 0)
        why.push_back("no sparse layer (mlp_only_layers and decoder_sparse_step leave every MLP dense): a dense model, "
                      "which Qwen3ForCausalLM describes");
      add("--num-experts", std::to_string(E));
      add("--moe-router-topk", std::to_string(k));
      add("--moe-ffn-hidden-size", std::to_string(integer("moe_intermediate_size", qwen2moe ? 1408 : 768)));
      if (qwen2moe) {  // the shared expert, gated
        const double S = num("shared_expert_intermediate_size", 5632.0).value_or(0);
        if (S != std::floor(S) || S < 0 || S > 1e12)
          why.push_back(fmt::format("\"shared_expert_intermediate_size\" is {}, expected a whole number", S));
        else if (S > 0)
          add("--moe-shared-expert-intermediate-size", std::to_string(static_cast<int64_t>(S))),
              add("--moe-shared-expert-gate");
      }
      if (sparse < L) add("--moe-layer-freq", pattern);
      // norm_topk_prob (default false): the chosen experts' softmax values
      // renormalised (Megatron's default) or not (--moe-router-pre-softmax).
      if (!flag_b("norm_topk_prob", false)) add("--moe-router-pre-softmax");
      else if (k == 1)
        why.push_back("norm_topk_prob with num_experts_per_tok 1 (every token's one weight is 1; Megatron refuses a "
                      "top-1 softmax over the chosen logit)");
    }
    if (!flag_b("tie_word_embeddings", false)) add("--untie-embeddings-and-output-weights");
    add("--rotary-base", fmt_num(rope_base()));
    if (rs && !rs->is_object()) {
      why.push_back(fmt::format("rope_scaling is {}, expected an object or null", json_brief(*rs)));
    } else if (rs) {
      const std::string& kind = rope_kind;
      const auto fac = rnum("factor");
      if (kind == "default") {
      } else if (kind == "llama3") {
        if (rnum("low_freq_factor") != 1.0 || rnum("high_freq_factor") != 4.0 ||
            rnum("original_max_position_embeddings") != 8192.0 || !fac)
          why.push_back(fmt::format("rope_type llama3 with factor {}, low_freq_factor {}, high_freq_factor {}, "
                                    "original_max_position_embeddings {} (Megatron's --use-rope-scaling has 1, 4 and 8192)",
                                    fac.value_or(0), rnum("low_freq_factor").value_or(0),
                                    rnum("high_freq_factor").value_or(0), rnum("original_max_position_embeddings").value_or(0)));
        else
          add("--use-rope-scaling"), add("--rope-scaling-factor", fmt_num(*fac));
      } else if (kind == "linear") {
        if (!fac || *fac != std::floor(*fac) || *fac < 1 || *fac > 1e6)
          why.push_back(fmt::format("rope_type linear with factor {} (--rotary-seq-len-interpolation-factor takes an "
                                    "integer)",
                                    fac.value_or(0)));
        else
          add("--rotary-seq-len-interpolation-factor", std::to_string(static_cast<int64_t>(*fac)));
      } else {
        why.push_back(fmt::format("rope_type \"{}\" (only \"default\", \"llama3\" and \"linear\" have Megatron "
                                  "flags)",
                                  kind.substr(0, 40)));
      }
    }
    if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"].is_number() &&
        j["partial_rotary_factor"].get<double>() != 1.0)
      why.push_back("partial_rotary_factor (LlamaForCausalLM rotates whole heads)");
  } else if (arch_name == "DeepseekV3ForCausalLM") {
    // The inverse of hf_config's DeepSeek-V3 form (DeepseekV3Config's
    // defaults where a key is missing).
    out.arch = HfArch::kDeepseekV3;
    const int64_t h = integer("hidden_size", 7168), L = integer("num_hidden_layers", 61);
    int64_t mtp_layers = 0;  // num_nextn_predict_layers (0 or absent: none)
    if (j.contains("num_nextn_predict_layers")) {
      const auto& n = j["num_nextn_predict_layers"];
      if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > 64)
        why.push_back(fmt::format("\"num_nextn_predict_layers\" is {}, expected an integer in [0, 64]", json_brief(n)));
      else
        mtp_layers = n.get<int64_t>();
    }
    const int64_t a = integer("num_attention_heads", 128), g = integer("num_key_value_heads", a);
    const int64_t F = integer("intermediate_size", 18432), P = integer("max_position_embeddings", 4096);
    out.vocab_size = integer("vocab_size", 129280);
    if (str("hidden_act", "silu") != "silu")
      why.push_back(fmt::format("hidden_act \"{}\" (Megatron's SwiGLU gates with silu)", str("hidden_act", "")));
    if (g != a)
      why.push_back(fmt::format("num_key_value_heads {} != num_attention_heads {} (multi-latent attention has one key/value "
                                "head per query head)",
                                g, a));
    if (flag_b("attention_bias", false)) why.push_back("attention_bias (Megatron's MLA projections have no biases)");
    if (!flag_b("rope_interleave", true))
      why.push_back("rope_interleave false (Megatron's MLA pairs the rope dims as rope_interleave does)");
    const double eps = num("rms_norm_eps", 1e-6).value_or(1e-6);
    if (eps != 1e-6)
      why.push_back(fmt::format("rms_norm_eps {} (the q/kv norms use 1e-6 there; Megatron has one --norm-epsilon)", eps));
    add("--num-layers", std::to_string(L)), add("--hidden-size", std::to_string(h));
    add("--ffn-hidden-size", std::to_string(F)), add("--num-attention-heads", std::to_string(a));
    add("--multi-latent-attention");
    if (j.contains("q_lora_rank") && j["q_lora_rank"].is_null())
      why.push_back("q_lora_rank null (q_proj beside kv_a_layernorm: Megatron's kv norm, --qk-layernorm, needs "
                    "--q-lora-rank; without one it normalises the hidden state before linear_q_proj instead)");
    else
      add("--q-lora-rank", std::to_string(integer("q_lora_rank", 1536)));  // DeepseekV3Config's default
    add("--kv-lora-rank", std::to_string(integer("kv_lora_rank", 512)));
    add("--qk-head-dim", std::to_string(integer("qk_nope_head_dim", 128)));
    add("--qk-pos-emb-head-dim", std::to_string(integer("qk_rope_head_dim", 64)));
    add("--v-head-dim", std::to_string(integer("v_head_dim", 128)));
    add("--qk-layernorm"), add("--normalization", "RMSNorm"), add("--swiglu"), add("--position-embedding-type", "rope");
    add("--norm-epsilon", fmt_num(eps)), add("--max-position-embeddings", std::to_string(P));
    add("--hidden-dropout", "0"), add("--attention-dropout", fmt_num(num("attention_dropout", 0.0).value_or(0.0)));
    add("--disable-bias-linear");
    if (!flag_b("tie_word_embeddings", false)) add("--untie-embeddings-and-output-weights");
    // DeepSeek's multi-token prediction layers (model.layers.{L}...): Megatron's --mtp-num-layers.
    if (mtp_layers > 0) add("--mtp-num-layers", std::to_string(mtp_layers));
    // RoPE: plain, or YaRN with Megatron's MLA constants (original 4096,
    // betas 32 and 1); transformers' factor is max_position_embeddings /
    // original_max_position_embeddings when the latter is given.
    add("--rotary-base", fmt_num(rope_base()));
    const std::string& kind = rope_kind;
    if (rs && !rs->is_object()) {
      why.push_back(fmt::format("rope_scaling is {}, expected an object or null", json_brief(*rs)));
    } else if (kind == "default") {
      // Plain RoPE: MLA's default YaRN with --rotary-scaling-factor 1 (the
      // default) computes it (no --rope-type rope, which Megatron wants
      // with --no-rope-fusion).
    } else if (kind != "yarn") {
      why.push_back(fmt::format("rope_type \"{}\" (Megatron's MLA takes plain RoPE or YaRN)", kind.substr(0, 40)));
    } else {
      // (transformers: the original context is max_position_embeddings when
      // not given, and the factor their ratio when only the original is.)
      const double orig = rnum("original_max_position_embeddings").value_or(static_cast<double>(P));
      const double f = rnum("factor").value_or(rs->contains("original_max_position_embeddings") ? P / orig : 0);
      const double m = rnum("mscale").value_or(0), mad = rnum("mscale_all_dim").value_or(0);
      if (f < 1) why.push_back(fmt::format("rope_scaling factor {} (YaRN takes a factor >= 1)", f));
      if (orig != 4096 || rnum("beta_fast").value_or(32) != 32 || rnum("beta_slow").value_or(1) != 1)
        why.push_back(fmt::format("YaRN with original_max_position_embeddings {}, beta_fast {}, beta_slow {} (Megatron's "
                                  "MLA has 4096, 32 and 1)",
                                  orig, rnum("beta_fast").value_or(32), rnum("beta_slow").value_or(1)));
      if (rs->contains("original_max_position_embeddings") && std::abs(static_cast<double>(P) / orig - f) > 1e-9 * f)
        why.push_back(fmt::format("max_position_embeddings {} / original_max_position_embeddings {} != factor {} "
                                  "(transformers takes the ratio for the frequencies, the factor for the softmax scale)",
                                  P, orig, f));
      if (rs->contains("attention_factor")) why.push_back("rope_scaling attention_factor (Megatron has no such flag)");
      if (rs->contains("truncate") && (*rs)["truncate"].is_boolean() && !(*rs)["truncate"].get<bool>())
        why.push_back("rope_scaling truncate false (Megatron's YaRN rounds its correction range to whole dims)");
      if (m == 0 && mad != 0) {
        why.push_back("rope_scaling mscale 0 with mscale_all_dim (transformers' attention factor 0.1 ln(factor) + 1 has "
                      "no Megatron --mscale)");
      }
      add("--rotary-scaling-factor", fmt_num(f));
      // Transformers' attention factor: mscale / mscale_all_dim's ratio when
      // both are non-zero, else 0.1 ln(factor) + 1 (Megatron's with mscale 1).
      const bool both = m != 0 && mad != 0;
      add("--mscale", fmt_num(both ? m : 1.0)), add("--mscale-all-dim", fmt_num(mad));
    }
    // Experts: layers first_k_dense_replace.. are DeepseekV3MoE.
    const int64_t k_dense = j.contains("first_k_dense_replace") ? static_cast<int64_t>(num("first_k_dense_replace", 3.0).value_or(3))
                                                                 : 3;
    if (k_dense < 0) why.push_back(fmt::format("first_k_dense_replace {} is negative", k_dense));
    if (mtp_layers > 0 && k_dense >= L && k_dense < L + mtp_layers)
      why.push_back(fmt::format("first_k_dense_replace {} with {} layers and num_nextn_predict_layers {}: a dense decoder "
                                "with MoE multi-token prediction layers (Megatron builds them like the last decoder "
                                "layer)",
                                k_dense, L, mtp_layers));
    if (k_dense < L) {
      const int64_t E = integer("n_routed_experts", 256), k = integer("num_experts_per_tok", 8);
      const int64_t Fe = integer("moe_intermediate_size", 2048), S = integer("n_shared_experts", 1);
      const int64_t G = integer("n_group", 8), gk = integer("topk_group", 4);
      add("--num-experts", std::to_string(E)), add("--moe-router-topk", std::to_string(k));
      add("--moe-ffn-hidden-size", std::to_string(Fe));
      add("--moe-shared-expert-intermediate-size", std::to_string(S * Fe));
      add("--moe-router-score-function", "sigmoid"), add("--moe-router-enable-expert-bias");
      if (k_dense > 0) add("--moe-layer-freq", fmt::format("[0]*{}+[1]*{}", k_dense, L - k_dense));
      if (G > 1) {
        add("--moe-router-num-groups", std::to_string(G)), add("--moe-router-group-topk", std::to_string(gk));
        if (k / gk != 2)
          why.push_back(fmt::format("num_experts_per_tok {} / topk_group {} != 2 (transformers ranks the groups by their "
                                    "top 2 scores, Megatron by their top num_experts_per_tok / topk_group)",
                                    k, gk));
      }
      const bool norm = flag_b("norm_topk_prob", true);
      if (norm != (k > 1))
        why.push_back(fmt::format("norm_topk_prob {} with num_experts_per_tok {} (Megatron's sigmoid router "
                                  "renormalises the chosen experts exactly when there are several)",
                                  norm, k));
      const double rsf = num("routed_scaling_factor", 2.5).value_or(2.5);
      if (rsf != 1.0) add("--moe-router-topk-scaling-factor", fmt_num(rsf));
    }
  } else {
    why.push_back(fmt::format("architectures {} (this build imports GPT2LMHeadModel, LlamaForCausalLM, "
                              "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, "
                              "Qwen3ForCausalLM, Qwen3MoeForCausalLM and DeepseekV3ForCausalLM)",
                              j.contains("architectures") ? json_brief(j["architectures"]) : "missing"));
  }
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    why.push_back(fmt::format("quantization_config ({}): the weights are stored quantized (with their scales as extra "
                              "tensors); import a dequantized bf16 or fp32 copy",
                              q.is_object() && q.contains("quant_method") ? json_brief(q["quant_method"]) : json_brief(q)));
  }
  if (!why.empty()) {
    std::string msg = fmt::format("{}: cannot be imported:", where);
    for (const auto& w : why) msg += "\n  - " + w;
    return Status::invalid(msg);
  }
  return out;
}

namespace {

// A model directory's weight files: the index's shards, or model.safetensors.
Result<std::vector<std::string>> weight_files(const fs::path& root) {
  const std::string dir = root.string();
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::exists(root / "model.safetensors.index.json", ec)) {
    auto read = hf_read_json((root / "model.safetensors.index.json").string(), int64_t{64} << 20);
    if (!read) return read.status();
    const nlohmann::json& idx = *read;
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      return Status::corrupt(fmt::format("'{}': expected a JSON object with a \"weight_map\" object",
                                         (root / "model.safetensors.index.json").string()));
    std::set<std::string> seen;
    for (const auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        return Status::corrupt(fmt::format("'{}': weight_map[\"{}\"] is {}, expected a file name in the directory",
                                           (root / "model.safetensors.index.json").string(), name.substr(0, 200),
                                           json_brief(file)));
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else if (fs::exists(root / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    return Status::not_found(fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json (only "
                                         "safetensors weights are read; a pytorch_model.bin is a pickle)",
                                         dir));
  }
  return files;
}

}  // namespace

Result<std::set<std::string>> hf_tensor_names(const std::string& dir) {
  auto files = weight_files(fs::path(dir));
  if (!files) return files.status();
  std::set<std::string> names;
  for (const auto& fn : *files) {
    auto f = MappedSafetensors::open((fs::path(dir) / fn).string());
    if (!f) return f.status();
    for (const auto& [key, t] : f->tensors()) names.insert(key);
  }
  return names;
}

Status hf_import_weights(const std::string& dir, HfArch arch, model::GPTModel& m, std::vector<std::string>* notes) {
  MT_RETURN_IF_ERROR(check_whole_fp32(m, "import"));
  const fs::path root(dir);
  auto listed = weight_files(root);
  if (!listed) return listed.status();
  const std::vector<std::string>& files = *listed;
  std::vector<MappedSafetensors> mapped;
  std::map<std::string, std::pair<size_t, std::string>> where;  // hf name -> (file index, key in the file)
  for (const auto& fn : files) {
    auto f = MappedSafetensors::open((root / fn).string());
    if (!f) return f.status();
    for (const auto& [key, t] : f->tensors()) {
      (void)t;
      std::string name = key;
      // GPT-2 files from the Hub name tensors without the "transformer." prefix.
      if (arch == HfArch::kGpt2 && key.rfind("transformer.", 0) != 0 && key != "lm_head.weight") name = "transformer." + key;
      if (!where.emplace(name, std::make_pair(mapped.size(), key)).second)
        return Status::corrupt(fmt::format("'{}': tensor '{}' is stored twice", f->path(), key));
    }
    mapped.push_back(std::move(*f));
  }

  const model::ModelConfig& c = m.config();
  const int64_t V = m.vocab(), h = c.hidden_size;
  // Vocabulary rows in the files (the embedding's).
  const std::string embed = arch == HfArch::kGpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  auto ew = where.find(embed);
  if (ew == where.end()) return Status::not_found(fmt::format("'{}': no tensor {}", dir, embed));
  const MappedTensor& et = mapped[ew->second.first].tensors().at(ew->second.second);
  if (et.shape.ndim != 2 || et.shape[1] != h)
    return Status::invalid(fmt::format("'{}': {} has shape {}, expected [vocab, {}]", dir, embed, et.shape.str(), h));
  const int64_t file_rows = et.shape[0], rows = std::min(file_rows, V);
  if (file_rows < 1) return Status::invalid(fmt::format("'{}': {} has no rows", dir, embed));
  if (c.vocab_size && file_rows < *c.vocab_size)
    return Status::invalid(fmt::format("'{}': {} has {} rows but the tokenizer has {} tokens: use the model's own "
                                       "tokenizer",
                                       dir, embed, file_rows, *c.vocab_size));
  if (file_rows > V && notes)
    notes->push_back(fmt::format("the files hold {} vocabulary rows and the model {} (the tokenizer's {} padded): rows "
                                 "{}..{} are dropped",
                                 file_rows, V, c.vocab_size.value_or(0), V, file_rows - 1));

  // Elements written per parameter: each map covers distinct elements (the
  // round-trip tests check the table), so every element is set exactly once
  // when the counts reach the sizes.
  std::map<std::string, int64_t> written;
  std::set<std::string> used;
  std::vector<float> vals;
  std::vector<const HfMap*> copies;
  const std::vector<HfMap> maps = hf_maps(c, arch, rows);
  for (const HfMap& map : maps) {
    if (map.meg.empty()) continue;
    auto it = where.find(map.hf);
    if (it == where.end())
      return Status::not_found(fmt::format("'{}': no tensor {} (needed for {})", dir, map.hf, map.meg));
    used.insert(map.hf);
    if (map.copy) {  // checked once every map has been read (below)
      copies.push_back(&map);
      continue;
    }
    const MappedSafetensors& file = mapped[it->second.first];
    const MappedTensor& t = file.tensors().at(it->second.second);
    const bool vocab = map.meg == "embedding.word_embeddings.weight" || map.meg == "output_layer.weight";
    Shape want = map.hf_shape;
    if (vocab) want.d[0] = file_rows;
    if (!(t.shape == want))
      return Status::invalid(fmt::format("'{}': tensor '{}' has shape {}, expected {} for this config.json",
                                         file.path(), it->second.second, t.shape.str(), want.str()));
    vals.resize(static_cast<size_t>(t.shape.numel()));
    if (Status st = mapped_to_floats(t, vals.data()); !st)
      return Status::invalid(fmt::format("'{}': tensor '{}': {}", file.path(), it->second.second, st.message()));
    float* dst = param_data(m, map.meg);
    const int64_t n = static_cast<int64_t>(map.src.size()), C = map.cols;
    for (int64_t jj = 0; jj < n; ++jj)
      for (int64_t k = 0; k < C; ++k) {
        const float v = vals[static_cast<size_t>(map.transposed ? k * n + jj : jj * C + k)];
        if (!std::isfinite(v))
          return Status::invalid(fmt::format("'{}': tensor '{}' holds a non-finite value ({}) at element {}", file.path(),
                                             it->second.second, v, map.transposed ? k * n + jj : jj * C + k));
        dst[map.src[static_cast<size_t>(jj)] * C + k] = v - map.add;
      }
    written[map.meg] += n * C;
  }
  // The copies (DeepSeek-V3's MTP embed_tokens and shared_head.head): the
  // model shares the main embedding and output layer, as Megatron does; a
  // copy that differs is named (largest difference), the shared one kept.
  for (const HfMap* map : copies) {
    const auto it = where.find(map->hf);
    const MappedSafetensors& file = mapped[it->second.first];
    const MappedTensor& t = file.tensors().at(it->second.second);
    Shape want = map->hf_shape;
    want.d[0] = file_rows;
    if (!(t.shape == want))
      return Status::invalid(fmt::format("'{}': tensor '{}' has shape {}, expected {} (a copy of {})", file.path(),
                                         it->second.second, t.shape.str(), want.str(), map->meg));
    vals.resize(static_cast<size_t>(t.shape.numel()));
    if (Status st = mapped_to_floats(t, vals.data()); !st)
      return Status::invalid(fmt::format("'{}': tensor '{}': {}", file.path(), it->second.second, st.message()));
    const float* kept = param_data(m, map->meg);
    double worst = 0;
    for (int64_t jj = 0; jj < static_cast<int64_t>(map->src.size()); ++jj)
      for (int64_t k = 0; k < map->cols; ++k)
        worst = std::max(worst, std::abs(static_cast<double>(vals[static_cast<size_t>(jj * map->cols + k)]) -
                                         kept[map->src[static_cast<size_t>(jj)] * map->cols + k]));
    if (worst > 0 && notes)
      notes->push_back(fmt::format("{} differs from the model's {} by up to {:.3g}: the model shares one (as Megatron's "
                                   "MTP layers do), the decoder's is kept",
                                   map->hf, map->meg, worst));
  }
  // Megatron's padding rows: copies of the last row (Megatron's converter's choice).
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const int i = m.find(name);
    if (i < 0) continue;
    float* w = m.params()[static_cast<size_t>(i)].ptr<float>();
    for (int64_t r = rows; r < V; ++r) std::copy(w + (rows - 1) * h, w + rows * h, w + r * h);
    written[name] += (V - rows) * h;
  }
  for (size_t i = 0; i < m.specs().size(); ++i)
    if (written[m.specs()[i].name] != m.params()[i].numel())
      return Status::internal(fmt::format("hf import: {} of {} elements of {} were set", written[m.specs()[i].name],
                                          m.params()[i].numel(), m.specs()[i].name));
  // Tensors left over: transformers' buffers are expected; anything else
  // would be a part of the model this build does not compute.
  std::vector<std::string> unknown;
  std::set<int64_t> mtp;
  for (const auto& [name, loc] : where) {
    if (used.count(name)) continue;
    auto ends_with = [&](std::string_view tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool buffer = ends_with("rotary_emb.inv_freq") ||
                        (arch == HfArch::kGpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias")));
    const bool tied_head = name == "lm_head.weight" && !c.untie_embeddings_and_output_weights;
    // DeepSeek-V3's multi-token prediction layers follow the decoder's
    // (model.layers.{L}..., num_nextn_predict_layers): transformers skips them too.
    int64_t layer = -1;
    if (arch == HfArch::kDeepseekV3 && std::sscanf(name.c_str(), "model.layers.%" SCNd64 ".", &layer) == 1 &&
        layer >= c.total_layers()) {
      mtp.insert(layer);
      continue;
    }
    if (!buffer && !tied_head) unknown.push_back(loc.second);
  }
  if (!unknown.empty()) {
    std::string list;
    for (size_t k = 0; k < unknown.size() && k < 8; ++k) list += (k ? ", " : "") + unknown[k];
    if (unknown.size() > 8) list += fmt::format(", ... ({} in all)", unknown.size());
    return Status::invalid(fmt::format("'{}': tensors this model has no place for: {} (a config.json setting this "
                                       "build does not model?)",
                                       dir, list));
  }
  if (!mtp.empty() && notes)
    notes->push_back(fmt::format("the multi-token prediction layer{} {} (model.layers.{}...) {} not imported: the model "
                                 "has {} MTP layer{} (--mtp-num-layers)",
                                 mtp.size() > 1 ? "s" : "", fmt::join(mtp, ", "), *mtp.begin(),
                                 mtp.size() > 1 ? "are" : "is", c.mtp_layers(), c.mtp_layers() == 1 ? "" : "s"));
  return Status::ok();
}

}  // namespace mt::checkpoint

