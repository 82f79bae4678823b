#pragma once
// Hugging Face export: a trained model under the transformers library's
// parameter names and layouts, with the config.json (and tokenizer files)
// that its AutoModelForCausalLM / AutoTokenizer read.
//
// Which architecture a model becomes (hf_architecture):
//   GPT2LMHeadModel   LayerNorm, GELU, learned absolute positions, one key/value
//                     head per query head, heads x kv-channels == hidden
//                     (missing biases are written as zeros)
//   LlamaForCausalLM  RMSNorm, SwiGLU, RoPE over whole heads; with
//                     --add-bias-linear: attention_bias and mlp_bias
//   Qwen2ForCausalLM  the same with a bias on q/k/v only (--add-qkv-bias,
//                     --disable-bias-linear)
//   Qwen3ForCausalLM  LLaMA's shape with --qk-layernorm (q_norm/k_norm:
//                     RMSNorm over each head before RoPE), no biases
// Anything else (post-norm residuals, partial RoPE, LayerNorm with SwiGLU,
// ...) has no transformers class computing the same function: the export is
// refused with every reason listed.
//
// The mapping is exact, not approximate:
//   - linear_qkv rows, grouped per query group [q heads | k | v], are split
//     into q_proj/k_proj/v_proj (GPT-2: concatenated [all q | all k | all v]
//     as c_attn, whose Conv1D weights are stored [in, out], transposed);
//   - SwiGLU's linear_fc1 [gate; up] becomes gate_proj and up_proj;
//   - --rotary-interleaved pairs (2i, 2i+1) become transformers' rotate-half
//     pairs (i, i + d/2) by permuting each q and k head's rows the same way
//     (q.k is unchanged; the rotation then matches);
//   - --apply-layernorm-1p weights are stored as 1 + gamma;
//   - RoPE options map to rope_theta and rope_scaling ("llama3" for
//     --use-rope-scaling, "linear" for --rotary-seq-len-interpolation-factor);
//   - GELU: "gelu_new" (tanh) or "gelu" (erf), per ModelConfig::gelu_tanh();
//     --squared-relu: "relu2";
//   - the vocabulary padding rows are dropped (the tokenizer's size is
//     vocab_size) unless keep_vocab_padding.
//
// Files: config.json, model.safetensors (or model-0000k-of-0000n.safetensors
// and model.safetensors.index.json past max_shard_bytes), the tokenizer's
// files with tokenizer_config.json. Everything is written into
// "<out>.tmp.<pid>" and renamed to <out> when complete; an existing
// non-empty <out> is refused, never overwritten.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace mt::model {
class GPTModel;
}

namespace mt::checkpoint {

// The oldest transformers release that reads every field written here
// (Llama's head_dim and mlp_bias, rope_type "llama3"); config.json says so.
inline constexpr const char* kTransformersVersion = "4.45.0";
inline constexpr const char* kTransformersVersionQwen3 = "4.51.0";  // the first with Qwen3(Moe)ForCausalLM

inline constexpr const char* kTransformersVersionDeepseekV3 = "4.51.0";  // the first with DeepseekV3ForCausalLM

enum class HfArch { kGpt2, kLlama, kQwen2, kQwen3, kMixtral, kQwen3Moe, kQwen2Moe, kDeepseekV3 };
const char* hf_arch_name(HfArch a);  // "GPT2LMHeadModel", ...

// The architecture `c` maps to, or kInvalidArgument listing why none does.
Result<HfArch> hf_architecture(const model::ModelConfig& c);

struct HfTokenizerInfo {
  std::string type;  // --tokenizer-type
  std::string vocab_file, merge_file, tokenizer_model;  // HuggingFaceTokenizer: a directory or its tokenizer.json
  int64_t vocab_size = 0;  // before padding
  int32_t eod = -1;
  int32_t bos = -1;        // SentencePiece, HuggingFaceTokenizer: the BOS id (GPT-2: eod)
  // SentencePiece: the special pieces, for tokenizer_config.json.
  std::string bos_piece, eos_piece, unk_piece;
};

struct HfExportOptions {
  DType dtype = DType::kF32;                  // kF32, kBF16 or kF16 (round to nearest even)
  int64_t max_shard_bytes = 5'000'000'000;    // transformers' default "5GB"
  bool keep_vocab_padding = false;
};

// How one transformers tensor is made of a Megatron parameter (both
// directions: export gathers, import scatters back). Megatron parameters are
// viewed as rows of `cols` elements (a vector: rows of 1).
struct HfMap {
  std::string hf;                // transformers name
  Shape hf_shape;
  std::string meg;               // Megatron name; empty: zeros (GPT-2 biases the model lacks)
  int64_t cols = 1;              // elements per Megatron row
  std::vector<int64_t> src;      // the Megatron row of each HF row (transposed: of each HF column)
  bool transposed = false;       // HF [cols, src.size()]: Conv1D's [in, out] (GPT-2)
  float add = 0;                 // HF = Megatron + add (1 for --apply-layernorm-1p weights)
  // A copy of values another map carries too (DeepSeek-V3's MTP layers'
  // embed_tokens and shared_head.head): exported, and on import read only
  // to check they equal what the other map set.
  bool copy = false;
};

// The whole mapping for `arch` with `vocab_rows` vocabulary rows.
std::vector<HfMap> hf_maps(const model::ModelConfig& c, HfArch arch, int64_t vocab_rows);

// One tensor of the export, computed into fp32.
struct HfTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
};

// config.json for `arch`.
nlohmann::json hf_config(HfArch arch, const model::ModelConfig& c, const HfTokenizerInfo& tok, int64_t vocab_rows,
                         DType dtype);

// Every exported tensor in transformers' names and layouts, from a TP = 1
// model's fp32 parameters (the order is the one the files use).
Result<std::vector<HfTensor>> hf_tensors(const model::GPTModel& m, HfArch arch, int64_t vocab_rows);

struct HfExportSummary {
  HfArch arch = HfArch::kGpt2;
  int64_t tensors = 0, parameters = 0, bytes = 0, vocab_rows = 0;
  std::vector<std::string> files;  // written, relative to the output directory
  // Where the transformers class computes the model differently in cases
  // the export cannot rule out (printed by `megatron export`).
  std::vector<std::string> notes;
};

// The absolute, normalised directory an export into `out_dir` creates
// ("hf/" names hf), or kInvalidArgument when it exists and is not an empty
// directory (a symbolic link counts as existing).
Result<std::string> hf_output_path(const std::string& out_dir);

// Writes the whole export of a TP = 1, single-stage model `m`.
Result<HfExportSummary> export_hf(const model::GPTModel& m, const HfTokenizerInfo& tok, const HfExportOptions& opt,
                                  const std::string& out_dir);

// ---- Import: a transformers model directory as a Megatron model ----------
//
// The inverse of the export, from the same mapping table (MistralForCausalLM
// reads as LlamaForCausalLM, its tensors and names being Llama's, up to its
// sliding window): config.json gives
// the Megatron model flags (hf_import_flags) and the safetensors files
// (model.safetensors, or the shards model.safetensors.index.json lists; F32,
// BF16, F16 or F64) give every parameter (hf_import_weights). Megatron's
// padded vocabulary rows past the file's take the last row, as Megatron's
// checkpoint converter does; rows the model has no room for are dropped with
// a note. Settings no Megatron flag expresses are refused with every reason.

// A JSON file from a model directory: a regular file of at most max_bytes,
// parsed without exceptions (kCorrupt naming the file when it is not JSON).
Result<nlohmann::json> hf_read_json(const std::string& path, int64_t max_bytes = int64_t{16} << 20);

struct HfImportFlags {
  HfArch arch = HfArch::kGpt2;
  std::vector<std::string> flags;  // megatron train's model flags (no tokenizer, no --seq-length)
  int64_t vocab_size = 0;          // config.json's vocab_size: rows in the files
  // Mistral's sliding window when shorter than its positions: the model is
  // the same as Megatron's full causal attention only up to this length.
  std::optional<int64_t> max_seq_length;
};
Result<HfImportFlags> hf_import_flags(const nlohmann::json& config, const std::string& where);

// Reads every parameter of `m` (TP = 1, fp32, host memory, built from
// hf_import_flags' flags) from the model directory `dir`. Errors name the
// file and tensor: a missing tensor, a shape that differs, a tensor the
// model has no place for (other than transformers' non-parameter buffers).
Status hf_import_weights(const std::string& dir, HfArch arch, model::GPTModel& m, std::vector<std::string>* notes);

// The tensor names (keys) of a model directory's safetensors files.
Result<std::set<std::string>> hf_tensor_names(const std::string& dir);

}  // namespace mt::checkpoint

