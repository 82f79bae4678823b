#include "checkpoint/hf_export.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <system_error>

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
  }
  return "?";
}

Result<HfArch> hf_architecture(const model::ModelConfig& c) {
  using model::Normalization;
  using model::PositionEmbedding;
  std::vector<std::string> common;  // problems whatever the family
  if (c.apply_residual_connection_post_layernorm)
    common.push_back("--apply-residual-connection-post-layernorm (no transformers decoder takes the residual after the norm)");
  if (c.is_moe()) common.push_back("--num-experts (mixture-of-experts layers)");

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
    if (why.empty()) return c.add_bias_linear || !c.add_qkv_bias ? HfArch::kLlama : HfArch::kQwen2;
  } else if (gpt2_shape) {
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
        "{} + {} + {} position embeddings: LlamaForCausalLM/Qwen2ForCausalLM need RMSNorm + SwiGLU + rope, "
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
  const char* torch_dtype = dtype == DType::kBF16 ? "bfloat16" : "float32";
  const json eos = tok.eod >= 0 ? json(tok.eod) : json(nullptr);
  const int64_t max_pos = c.max_position_embeddings ? c.max_position_embeddings : c.seq_length;
  if (arch == HfArch::kGpt2) {
    return json{{"architectures", {hf_arch_name(arch)}},
                {"model_type", "gpt2"},
                {"vocab_size", vocab_rows},
                {"n_positions", max_pos},
                {"n_ctx", max_pos},
                {"n_embd", c.hidden_size},
                {"n_layer", c.num_layers},
                {"n_head", c.num_attention_heads},
                {"n_inner", c.ffn()},
                {"activation_function", c.gelu_tanh() ? "gelu_new" : "gelu"},
                {"layer_norm_epsilon", c.norm_epsilon},
                {"initializer_range", c.init_method_std},
                {"resid_pdrop", c.hidden_dropout},
                {"embd_pdrop", c.hidden_dropout},
                {"attn_pdrop", c.attention_dropout},
                {"scale_attn_weights", true},
                {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
                {"bos_token_id", eos},
                {"eos_token_id", eos},
                {"use_cache", true},
                {"torch_dtype", torch_dtype}};
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
         {"model_type", arch == HfArch::kLlama ? "llama" : "qwen2"},
         {"vocab_size", vocab_rows},
         {"hidden_size", c.hidden_size},
         {"intermediate_size", c.ffn()},
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
         {"attention_dropout", c.attention_dropout},
         {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
         {"bos_token_id", eos},
         {"eos_token_id", eos},
         {"use_cache", true},
         {"torch_dtype", torch_dtype}};
  if (arch == HfArch::kLlama) {
    j["attention_bias"] = c.add_bias_linear;
    j["mlp_bias"] = c.add_bias_linear;
    j["pretraining_tp"] = 1;
  } else {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  return j;
}

namespace {

// A parameter's fp32 values by name (TP = 1, so local == global).
class Params {
 public:
  explicit Params(const model::GPTModel& m) : m_(m) {}
  bool has(const std::string& name) const { return m_.find(name) >= 0; }
  const float* get(const std::string& name) const {
    const int i = m_.find(name);
    MT_CHECK(i >= 0, "hf export: no parameter " + name);
    return m_.params()[static_cast<size_t>(i)].ptr<float>();
  }
  int64_t numel(const std::string& name) const { return m_.params()[static_cast<size_t>(m_.find(name))].numel(); }

 private:
  const model::GPTModel& m_;
};

}  // namespace

Result<std::vector<HfTensor>> hf_tensors(const model::GPTModel& m, HfArch arch, int64_t vocab_rows) {
  const model::ModelConfig& c = m.config();
  if (m.options().tp != 1) return Status::invalid("hf export: the model must be loaded whole (tensor parallel size 1)");
  for (const model::ParamSpec& sp : model::gpt_param_specs(c, 1))
    if (m.find(sp.name) < 0)
      return Status::invalid(fmt::format("hf export: the model lacks {} (load every pipeline stage)", sp.name));
  if (m.options().dtype != DType::kF32) return Status::invalid("hf export: the model must hold fp32 parameters");
  if (vocab_rows < 1 || vocab_rows > m.vocab())
    return Status::invalid(fmt::format("hf export: {} vocabulary rows asked for, the model has {}", vocab_rows, m.vocab()));
  Params P(m);
  const int64_t h = c.hidden_size, a = c.num_attention_heads, g = c.query_groups(), d = c.head_dim();
  const int64_t qpg = a / g, F = c.ffn(), L = c.num_layers;
  std::vector<HfTensor> out;
  auto add = [&](std::string name, Shape shape) -> std::vector<float>& {
    out.push_back(HfTensor{std::move(name), shape, std::vector<float>(static_cast<size_t>(shape.numel()))});
    return out.back().data;
  };
  // rows [r0, r0 + n) of a row-major [*, C] parameter.
  auto rows = [&](const std::string& name, int64_t r0, int64_t n, int64_t C, float* dst) {
    const float* s = P.get(name) + r0 * C;
    std::copy(s, s + n * C, dst);
  };
  // Norm weights: 1 + gamma under --apply-layernorm-1p.
  auto norm_w = [&](const std::string& from, const std::string& to) {
    auto& v = add(to, {h});
    const float* s = P.get(from);
    for (int64_t i = 0; i < h; ++i) v[static_cast<size_t>(i)] = s[i] + (c.apply_layernorm_1p ? 1.f : 0.f);
  };
  // The linear_qkv row of head dim t of q head j, of group j's k, or its v.
  auto q_row = [&](int64_t head, int64_t t) { return (head / qpg) * (qpg + 2) * d + (head % qpg) * d + t; };
  auto k_row = [&](int64_t grp, int64_t t) { return grp * (qpg + 2) * d + qpg * d + t; };
  auto v_row = [&](int64_t grp, int64_t t) { return grp * (qpg + 2) * d + (qpg + 1) * d + t; };
  // rotate-half position t of a head holds interleaved dim src(t).
  auto rot_src = [&](int64_t t) {
    if (!c.rotary_interleaved) return t;
    return t < d / 2 ? 2 * t : 2 * (t - d / 2) + 1;
  };

  if (arch == HfArch::kGpt2) {
    rows("embedding.word_embeddings.weight", 0, vocab_rows, h, add("transformer.wte.weight", {vocab_rows, h}).data());
    const int64_t P_ = c.max_position_embeddings;
    rows("embedding.position_embeddings.weight", 0, P_, h, add("transformer.wpe.weight", {P_, h}).data());
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("decoder.layers.{}.", l), o = fmt::format("transformer.h.{}.", l);
      norm_w(p + "input_layernorm.weight", o + "ln_1.weight");
      rows(p + "input_layernorm.bias", 0, 1, h, add(o + "ln_1.bias", {h}).data());
      // c_attn: Conv1D [in = h, out = 3h], output columns [all q | all k | all v].
      {
        const float* W = P.get(p + "self_attention.linear_qkv.weight");
        auto& dst = add(o + "attn.c_attn.weight", {h, 3 * h});
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t head = 0; head < a; ++head)
            for (int64_t t = 0; t < d; ++t) {
              const int64_t col = s * h + head * d + t;
              const int64_t r = s == 0 ? q_row(head, t) : s == 1 ? k_row(head, t) : v_row(head, t);
              for (int64_t i = 0; i < h; ++i) dst[static_cast<size_t>(i * 3 * h + col)] = W[r * h + i];
            }
        auto& b = add(o + "attn.c_attn.bias", {3 * h});  // zeros without a QKV bias
        if (P.has(p + "self_attention.linear_qkv.bias")) {
          const float* B = P.get(p + "self_attention.linear_qkv.bias");
          for (int64_t s = 0; s < 3; ++s)
            for (int64_t head = 0; head < a; ++head)
              for (int64_t t = 0; t < d; ++t)
                b[static_cast<size_t>(s * h + head * d + t)] =
                    B[s == 0 ? q_row(head, t) : s == 1 ? k_row(head, t) : v_row(head, t)];
        }
      }
      auto transposed = [&](const std::string& from, int64_t R, int64_t C, const std::string& to) {
        const float* W = P.get(from);  // [R, C] -> [C, R]
        auto& dst = add(to, {C, R});
        for (int64_t r = 0; r < R; ++r)
          for (int64_t col = 0; col < C; ++col) dst[static_cast<size_t>(col * R + r)] = W[r * C + col];
      };
      auto bias_or_zero = [&](const std::string& from, int64_t n, const std::string& to) {
        auto& dst = add(to, {n});
        if (P.has(from)) rows(from, 0, 1, n, dst.data());
      };
      transposed(p + "self_attention.linear_proj.weight", h, a * d, o + "attn.c_proj.weight");
      bias_or_zero(p + "self_attention.linear_proj.bias", h, o + "attn.c_proj.bias");
      norm_w(p + "pre_mlp_layernorm.weight", o + "ln_2.weight");
      rows(p + "pre_mlp_layernorm.bias", 0, 1, h, add(o + "ln_2.bias", {h}).data());
      transposed(p + "mlp.linear_fc1.weight", F, h, o + "mlp.c_fc.weight");
      bias_or_zero(p + "mlp.linear_fc1.bias", F, o + "mlp.c_fc.bias");
      transposed(p + "mlp.linear_fc2.weight", h, F, o + "mlp.c_proj.weight");
      bias_or_zero(p + "mlp.linear_fc2.bias", h, o + "mlp.c_proj.bias");
    }
    norm_w("decoder.final_layernorm.weight", "transformer.ln_f.weight");
    rows("decoder.final_layernorm.bias", 0, 1, h, add("transformer.ln_f.bias", {h}).data());
    if (c.untie_embeddings_and_output_weights)
      rows("output_layer.weight", 0, vocab_rows, h, add("lm_head.weight", {vocab_rows, h}).data());
    return out;
  }

  // LLaMA / Qwen2.
  rows("embedding.word_embeddings.weight", 0, vocab_rows, h, add("model.embed_tokens.weight", {vocab_rows, h}).data());
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l), o = fmt::format("model.layers.{}.", l);
    norm_w(p + "input_layernorm.weight", o + "input_layernorm.weight");
    const std::string qkv = p + "self_attention.linear_qkv.";
    struct Part {
      const char* name;
      int64_t heads;
      bool rotated;
      int which;  // 0 q, 1 k, 2 v
    };
    const bool has_bias = P.has(qkv + "bias");
    for (const Part& part : {Part{"q_proj", a, true, 0}, Part{"k_proj", g, true, 1}, Part{"v_proj", g, false, 2}}) {
      auto src_row = [&](int64_t head, int64_t t) {
        const int64_t u = part.rotated ? rot_src(t) : t;
        return part.which == 0 ? q_row(head, u) : part.which == 1 ? k_row(head, u) : v_row(head, u);
      };
      const float* W = P.get(qkv + "weight");
      auto& dst = add(o + "self_attn." + part.name + ".weight", {part.heads * d, h});
      for (int64_t head = 0; head < part.heads; ++head)
        for (int64_t t = 0; t < d; ++t) {
          const float* s = W + src_row(head, t) * h;
          std::copy(s, s + h, dst.data() + (head * d + t) * h);
        }
      if (has_bias) {
        const float* B = P.get(qkv + "bias");
        auto& b = add(o + "self_attn." + part.name + ".bias", {part.heads * d});
        for (int64_t head = 0; head < part.heads; ++head)
          for (int64_t t = 0; t < d; ++t) b[static_cast<size_t>(head * d + t)] = B[src_row(head, t)];
      }
    }
    rows(p + "self_attention.linear_proj.weight", 0, h, a * d, add(o + "self_attn.o_proj.weight", {h, a * d}).data());
    if (c.add_bias_linear)
      rows(p + "self_attention.linear_proj.bias", 0, 1, h, add(o + "self_attn.o_proj.bias", {h}).data());
    norm_w(p + "pre_mlp_layernorm.weight", o + "post_attention_layernorm.weight");
    rows(p + "mlp.linear_fc1.weight", 0, F, h, add(o + "mlp.gate_proj.weight", {F, h}).data());
    rows(p + "mlp.linear_fc1.weight", F, F, h, add(o + "mlp.up_proj.weight", {F, h}).data());
    rows(p + "mlp.linear_fc2.weight", 0, h, F, add(o + "mlp.down_proj.weight", {h, F}).data());
    if (c.add_bias_linear) {
      rows(p + "mlp.linear_fc1.bias", 0, F, 1, add(o + "mlp.gate_proj.bias", {F}).data());
      rows(p + "mlp.linear_fc1.bias", F, F, 1, add(o + "mlp.up_proj.bias", {F}).data());
      rows(p + "mlp.linear_fc2.bias", 0, h, 1, add(o + "mlp.down_proj.bias", {h}).data());
    }
  }
  norm_w("decoder.final_layernorm.weight", "model.norm.weight");
  if (c.untie_embeddings_and_output_weights)
    rows("output_layer.weight", 0, vocab_rows, h, add("lm_head.weight", {vocab_rows, h}).data());
  return out;
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
  } else {
    return Status::ok();  // NullTokenizer: ids are the text; nothing to write
  }
  if (Status st = write_file_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n"); !st) return st;
  files->push_back("tokenizer_config.json");
  return Status::ok();
}

}  // namespace

Result<HfExportSummary> export_hf(const model::GPTModel& m, const HfTokenizerInfo& tok, const HfExportOptions& opt,
                                  const std::string& out_dir) {
  if (opt.dtype != DType::kF32 && opt.dtype != DType::kBF16)
    return Status::invalid("hf export: the dtype must be fp32 or bf16");
  if (opt.max_shard_bytes < 1) return Status::invalid("hf export: the shard size must be positive");
  auto arch = hf_architecture(m.config());
  if (!arch) return arch.status();
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    return Status::invalid(fmt::format("--output '{}' exists and is not an empty directory: choose a new directory "
                                       "(nothing there is overwritten)",
                                       out_dir));
  int64_t vocab_rows = m.vocab();
  if (!opt.keep_vocab_padding && tok.vocab_size > 0 && tok.vocab_size <= m.vocab()) vocab_rows = tok.vocab_size;
  auto tensors = hf_tensors(m, *arch, vocab_rows);
  if (!tensors) return tensors.status();

  const fs::path tmp = out.string() + fmt::format(".tmp.{}", static_cast<long>(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::io_error(fmt::format("cannot create '{}': {}", tmp.string(), ec.message()));
  auto fail = [&](Status st) -> Status {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    return st;
  };

  HfExportSummary sum;
  sum.arch = *arch;
  sum.vocab_rows = vocab_rows;
  // Shards in order, each closed before it passes max_shard_bytes (a single
  // tensor larger than that gets a shard of its own).
  const size_t esize = dtype_size(opt.dtype);
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const int64_t b = (*tensors)[i].shape.numel() * static_cast<int64_t>(esize);
    if (in_shard > 0 && in_shard + b > opt.max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += b;
    sum.bytes += b;
    sum.parameters += (*tensors)[i].shape.numel();
  }
  sum.tensors = static_cast<int64_t>(tensors->size());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<std::vector<bf16>> lowp;
    std::vector<NamedTensor> named;
    for (size_t i : shards[s]) {
      HfTensor& t = (*tensors)[i];
      if (opt.dtype == DType::kBF16) {
        lowp.emplace_back(t.data.size());
        for (size_t j = 0; j < t.data.size(); ++j) lowp.back()[j] = float_to_bf16(t.data[j]);
        named.push_back({t.name, Tensor(lowp.back().data(), t.shape, DType::kBF16)});
      } else {
        named.push_back({t.name, Tensor(t.data.data(), t.shape, DType::kF32)});
      }
      weight_map[t.name] = file;
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

  if (fs::exists(out, ec)) fs::remove(out, ec);  // an empty directory (checked above)
  fs::rename(tmp, out, ec);
  if (ec)
    return fail(Status::io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), out_dir, ec.message())));
  return sum;
}

}  // namespace mt::checkpoint
