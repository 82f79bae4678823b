#pragma once
// HuggingFaceTokenizer: Megatron's --tokenizer-type HuggingFaceTokenizer
// (transformers' AutoTokenizer) for the byte-level BPE tokenizers of today's
// causal language models (GPT-2, Llama 3, Qwen2, Mistral Nemo, DeepSeek, ...),
// read from a local directory's tokenizer.json, as the fast (Rust) tokenizer
// runs it:
//
//   added tokens     matched first, leftmost-longest, in the raw text; each
//                    is its id
//   normalizer       none, or NFC (data/unicode.h), applied to the text
//                    between added tokens
//   pre_tokenizer    ByteLevel (GPT-2's pattern when use_regex, a space
//                    before each piece when add_prefix_space), Split with a
//                    regex and behaviour Isolated (data/pretok_regex.h), or a
//                    Sequence of these
//   model            BPE over the byte-level alphabet, merges by rank;
//                    ignore_merges looks whole pieces up first
//   post_processor   TemplateProcessing (its "single" template: BOS and the
//                    like), ByteLevel (nothing to do for ids), or a Sequence
//
// encode() is Megatron's text_to_ids: tokenizer(text).input_ids, so the
// template's tokens are added (--tokenizer-hf-no-include-special-tokens:
// convert_tokens_to_ids(tokenize(text)), without them). EOD is the id of the
// eos_token of tokenizer_config.json (or special_tokens_map.json); pad that of
// its pad_token, if any. vocab_size() is len(tokenizer): the model's vocabulary
// plus the added tokens outside it. Anything else in tokenizer.json (WordPiece,
// Unigram, Metaspace, byte_fallback, dropout, other normalizers, ...) is
// refused at load with what it is; SentencePiece models load through
// SentencePieceTokenizer and their tokenizer.model instead.

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a directory holding tokenizer.json (and tokenizer_config.json),
  // or a tokenizer.json file. Errors name the flag, file and JSON path.
  static Result<std::unique_ptr<HfTokenizer>> load(const std::string& path, bool include_special_tokens = true);
  ~HfTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>* out) const override;
  // Refuses invalid UTF-8, naming the byte offset.
  Status encode_checked(std::string_view text, std::vector<int32_t>* out) const override;
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  int32_t pad() const override;
  std::string name() const override { return "HuggingFaceTokenizer"; }
  // -1 when the tokenizer has none.
  int32_t bos() const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
