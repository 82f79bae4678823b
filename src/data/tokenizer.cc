#include "data/tokenizer.h"

#include <fmt/format.h>

#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/null_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

namespace mt::data {

namespace {

constexpr const char* kSupported =
    "GPT2BPETokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, "
    "HuggingFaceTokenizer (byte-level BPE tokenizer.json), NullTokenizer";

// Megatron --tokenizer-type values this implementation does not provide.
bool known_but_unsupported(const std::string& t) {
  return t == "BertWordPieceLowerCase" || t == "BertWordPieceCase" ||
         t == "MultimodalTokenizer" || t == "NullMultimodalTokenizer" ||
         t == "SFTTokenizer";
}

template <typename T>
Result<std::unique_ptr<Tokenizer>> upcast(Result<std::unique_ptr<T>> r) {
  if (!r) return r.status();
  return std::unique_ptr<Tokenizer>(std::move(r).value());
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_tokenizer(const TokenizerConfig& cfg) {
  const std::string& t = cfg.type;
  if (t == "GPT2BPETokenizer") {
    if (cfg.vocab_file.empty())
      return Status::invalid("--vocab-file is required with --tokenizer-type GPT2BPETokenizer (GPT-2's vocab.json / encoder.json)");
    if (cfg.merge_file.empty())
      return Status::invalid("--merge-file is required with --tokenizer-type GPT2BPETokenizer (GPT-2's merges.txt / vocab.bpe)");
    return upcast(Gpt2BpeTokenizer::load(cfg.vocab_file, cfg.merge_file));
  }
  if (t == "SentencePieceTokenizer" || t == "GPTSentencePieceTokenizer" || t == "Llama2Tokenizer") {
    if (cfg.tokenizer_model.empty())
      return Status::invalid(fmt::format("--tokenizer-model is required with --tokenizer-type {} (a SentencePiece .model file)", t));
    return upcast(SentencePieceTokenizer::load(cfg.tokenizer_model, t));
  }
  if (t == "TikTokenizer") {
    if (cfg.tokenizer_model.empty())
      return Status::invalid("--tokenizer-model is required with --tokenizer-type TikTokenizer (a JSON list of "
                             "{rank, token_bytes, token_str})");
    TikTokenizer::Options o;
    if (!cfg.tiktoken_pattern.empty()) o.pattern = cfg.tiktoken_pattern;
    o.num_special_tokens = cfg.tiktoken_num_special_tokens;
    o.special_tokens = cfg.special_tokens;
    if (cfg.vocab_size) o.vocab_size = *cfg.vocab_size;
    return upcast(TikTokenizer::load(cfg.tokenizer_model, o));
  }
  if (t == "HuggingFaceTokenizer") {
    if (cfg.tokenizer_model.empty())
      return Status::invalid("--tokenizer-model is required with --tokenizer-type HuggingFaceTokenizer (a local "
                             "directory with tokenizer.json; hub names are not downloaded)");
    return upcast(HfTokenizer::load(cfg.tokenizer_model, cfg.hf_include_special_tokens));
  }
  if (t == "NullTokenizer") {
    if (!cfg.vocab_size)
      return Status::invalid("--vocab-size is required with --tokenizer-type NullTokenizer");
    return upcast(NullTokenizer::create(*cfg.vocab_size, cfg.null_eod_id, cfg.null_pad_id));
  }
  if (t.empty()) return Status::invalid(fmt::format("--tokenizer-type is required; one of: {}", kSupported));
  if (known_but_unsupported(t))
    return Status::invalid(fmt::format("--tokenizer-type {} is a Megatron tokenizer megatron-cpp does not provide; "
                                       "supported: {}", t, kSupported));
  return Status::invalid(fmt::format("--tokenizer-type {}: unknown; supported: {}", t, kSupported));
}

}  // namespace mt::data
