#pragma once
// Tokenizers with Megatron's --tokenizer-type names:
//   GPT2BPETokenizer        byte-level BPE from vocab.json + merges.txt, GPT-2's
//                           pre-tokenisation pattern; EOD <|endoftext|>
//   SentencePieceTokenizer  a .model file through libsentencepiece (LLaMA-2 style)
//   TikTokenizer            Megatron's tiktoken format (a JSON list of ranked
//                           base64 tokens) with special tokens first and its
//                           v1/v2 patterns (data/tiktoken_tokenizer.h)
//   HuggingFaceTokenizer    a byte-level BPE tokenizer.json (and its
//                           tokenizer_config.json) from --tokenizer-model DIR
//                           (data/hf_tokenizer.h)
//   NullTokenizer           --vocab-size N; text is whitespace-separated ids;
//                           EOD = N - 1 (Megatron-Core >= 0.18)
// encode() and decode() are const and safe to call from several threads at
// once (megatron preprocess runs one tokenizer over many workers).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mt::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to *out. Text is UTF-8 (any byte sequence must
  // be accepted without crashing; see each implementation for what it does
  // with invalid UTF-8).
  virtual void encode(std::string_view text, std::vector<int32_t>* out) const = 0;
  // encode(), but refusing input that Megatron's Python path refuses, with a
  // message naming the byte offset (GPT2BPETokenizer and SentencePiece:
  // invalid UTF-8; NullTokenizer: a token that is not an integer id in
  // [0, vocab_size)). On error *out is unchanged.
  virtual Status encode_checked(std::string_view text, std::vector<int32_t>* out) const {
    encode(text, out);
    return Status::ok();
  }
  // Ids back to text; fails on an id outside the vocabulary.
  virtual Result<std::string> decode(std::span<const int32_t> ids) const = 0;
  // Entries in the vocabulary, before Megatron's padding.
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;
  // -1 when the tokenizer has no pad id.
  virtual int32_t pad() const { return -1; }
  virtual std::string name() const = 0;
};

struct TokenizerConfig {
  std::string type;              // --tokenizer-type
  std::string vocab_file;        // --vocab-file (GPT2BPETokenizer: vocab.json / encoder.json)
  std::string merge_file;        // --merge-file (merges.txt / vocab.bpe)
  std::string tokenizer_model;   // --tokenizer-model (SentencePiece .model, TikTokenizer .json)
  std::optional<int64_t> vocab_size;  // --vocab-size (NullTokenizer; TikTokenizer, default 131072)
  std::string tiktoken_pattern;  // --tiktoken-pattern v1|v2 (empty: v2)
  int64_t tiktoken_num_special_tokens = 1000;  // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;     // --tokenizer-special-tokens
  bool hf_include_special_tokens = true;       // off: --tokenizer-hf-no-include-special-tokens
  std::optional<int64_t> null_eod_id;  // --null-tokenizer-eod-id (default vocab_size - 1)
  std::optional<int64_t> null_pad_id;  // --null-tokenizer-pad-id (default -1: none)
};

// Builds the tokenizer; errors name the flag and file at fault.
Result<std::unique_ptr<Tokenizer>> make_tokenizer(const TokenizerConfig& cfg);

}  // namespace mt::data
