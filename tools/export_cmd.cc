// megatron export: a checkpoint that `megatron train` wrote (any TP/PP/DP
// layout) as a Hugging Face transformers model directory
// (checkpoint/hf.h says which architecture and how).

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/hf.h"
#include "commands.h"
#include "core/flags.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "infer/load.h"

namespace mt::tools {

namespace {

// "5GB", "500MB", "2GiB", "123" (bytes): transformers' --max-shard-size spelling.
std::optional<int64_t> parse_size(const std::string& s) {
  size_t i = 0, dots = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) dots += s[i++] == '.';
  if (i == 0 || dots > 1) return std::nullopt;
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::vector<std::pair<std::string, double>> units = {
      {"", 1},       {"B", 1},         {"KB", 1e3},      {"MB", 1e6},         {"GB", 1e9},
      {"KIB", 1024}, {"MIB", 1048576}, {"GIB", 1073741824.0}};
  for (const auto& [name, mult] : units)
    if (unit == name) {
      const double b = v * mult;
      if (b < 1 || b > 9e18) return std::nullopt;
      return static_cast<int64_t>(b);
    }
  return std::nullopt;
}

}  // namespace

int export_main(const std::vector<std::string>& args) {
  std::string load, output, dtype = "auto", shard = "5GB";
  std::optional<int64_t> ckpt_step;
  bool keep_padding = false, help = false;
  infer::LoadOptions lo;
  FlagSet flags("megatron export",
                "Writes a checkpoint of `megatron train` (any parallel layout) as a Hugging Face transformers model:\n"
                "config.json, model*.safetensors and the tokenizer's files. GPT-2-style models become\n"
                "GPT2LMHeadModel, LLaMA-style ones LlamaForCausalLM (Qwen2ForCausalLM with --add-qkv-bias only).\n"
                "Exit code 0: written; 2: bad flags, checkpoint or a model no transformers class computes; 1: I/O.");
  flags.section("export");
  flags.add_string("load", &load, "checkpoint directory written by megatron train --save (required)");
  flags.add_int("ckpt-step", &ckpt_step, "iteration to export (default: the latest)", 0, INT64_MAX);
  flags.add_string("output", &output, "new directory for the Hugging Face model (required; must not exist or be empty)");
  flags.add_string("dtype", &dtype, "weights as fp32, bf16 or fp16; auto: bf16 (fp16) when trained with --bf16 (--fp16), else fp32");
  flags.add_string("max-shard-size", &shard, "largest safetensors file before the weights are split (5GB, 500MB, 2GiB)");
  flags.add_switch("keep-vocab-padding", &keep_padding,
                   "keep Megatron's padded vocabulary rows (default: the tokenizer's vocabulary size)");
  flags.section("tokenizer files (when they moved since training)");
  flags.add_string("vocab-file", &lo.vocab_file, "GPT-2 vocab.json instead of the training run's");
  flags.add_string("merge-file", &lo.merge_file, "GPT-2 merges.txt instead of the training run's");
  flags.add_string("tokenizer-model", &lo.tokenizer_model, "SentencePiece .model instead of the training run's");
  flags.add_switch("help", &help, "show this help");
  auto error = [](const std::string& m) {
    std::fprintf(stderr, "megatron export: error: %s\n", m.c_str());
    return 2;
  };
  if (Status st = flags.parse(args); !st) return error(st.message());
  if (help) {
    std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  std::vector<std::string> problems;
  if (load.empty()) problems.push_back("missing --load DIR");
  if (output.empty()) problems.push_back("missing --output DIR");
  if (dtype != "auto" && dtype != "fp32" && dtype != "bf16" && dtype != "fp16")
    problems.push_back(fmt::format("--dtype {}: expected fp32, bf16, fp16 or auto", dtype));
  const auto shard_bytes = parse_size(shard);
  if (!shard_bytes)
    problems.push_back(fmt::format("--max-shard-size {}: expected a size such as 5GB, 500MB, 2GiB or a byte count", shard));
  if (!problems.empty()) {
    std::string m = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) m += "; " + problems[i];
    return error(m);
  }
  // Refuse an occupied --output before the checkpoint is read.
  if (auto o = checkpoint::hf_output_path(output); !o) return error(o.status().message());
  lo.iteration = ckpt_step;
  auto loaded = infer::load_for_generation(load, lo);
  if (!loaded) return error(loaded.status().message());
  // Refuse an unexportable model before anything is written.
  if (auto arch = checkpoint::hf_architecture(loaded->model->config()); !arch) return error(arch.status().message());

  checkpoint::HfTokenizerInfo tok;
  const data::TokenizerConfig& tc = loaded->tokenizer_config;
  tok.type = tc.type, tok.vocab_file = tc.vocab_file, tok.merge_file = tc.merge_file;
  tok.tokenizer_model = tc.tokenizer_model;
  tok.vocab_size = loaded->tokenizer->vocab_size();
  tok.eod = loaded->tokenizer->eod();
  if (const auto* hft = dynamic_cast<const data::HfTokenizer*>(loaded->tokenizer.get())) tok.bos = hft->bos();
  if (tc.type == "TikTokenizer")
    std::printf("note: TikTokenizer's vocabulary has no transformers format; the export holds no tokenizer files\n");
  if (const auto* sp = dynamic_cast<const data::SentencePieceTokenizer*>(loaded->tokenizer.get())) {
    tok.bos = sp->bos();
    tok.bos_piece = sp->piece(sp->bos()), tok.eos_piece = sp->piece(sp->eod()), tok.unk_piece = sp->piece(sp->unk());
  }
  checkpoint::HfExportOptions eo;
  eo.dtype = dtype == "bf16" || (dtype == "auto" && loaded->bf16)   ? DType::kBF16
             : dtype == "fp16" || (dtype == "auto" && loaded->fp16) ? DType::kF16
                                                                    : DType::kF32;
  eo.max_shard_bytes = *shard_bytes;
  eo.keep_vocab_padding = keep_padding;
  auto sum = checkpoint::export_hf(*loaded->model, tok, eo, output);
  if (!sum) {
    std::fprintf(stderr, "megatron export: error: %s\n", sum.status().message().c_str());
    return sum.status().code() == StatusCode::kIoError ? 1 : 2;
  }
  std::printf("exported iteration %lld of %s as %s: %lld tensors, %lld parameters, %.1f MB %s, vocabulary %lld rows%s\n",
              static_cast<long long>(loaded->iteration), loaded->directory.c_str(), checkpoint::hf_arch_name(sum->arch),
              static_cast<long long>(sum->tensors), static_cast<long long>(sum->parameters),
              static_cast<double>(sum->bytes) / 1e6, dtype_name(eo.dtype),
              static_cast<long long>(sum->vocab_rows),
              sum->vocab_rows < loaded->model->vocab() ? fmt::format(" (of {} padded)", loaded->model->vocab()).c_str() : "");
  std::printf("%s:", output.c_str());
  for (const auto& f : sum->files) std::printf(" %s", f.c_str());
  std::printf("\n");
  for (const auto& n : sum->notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace mt::tools
