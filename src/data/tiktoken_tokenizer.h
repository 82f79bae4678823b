#pragma once
// TikTokenizer: Megatron's --tokenizer-type TikTokenizer
// (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py), a tiktoken
// byte-level BPE over a ranked vocabulary file, with special tokens first:
//
//   --tokenizer-model FILE.json   a JSON list of {"rank": i, "token_bytes":
//                                 base64, "token_str": ...}, rank == index,
//                                 and token i < 256 == the byte i
//   --tiktoken-pattern v1|v2      Megatron's two pre-tokenisation patterns
//                                 (default v2)
//   --tiktoken-num-special-tokens N   ids 0..N-1 are special (default 1000)
//   --tokenizer-special-tokens ...    their names (default <unk> <s> </s>
//                                 <mask> <pad> <cls> <sep>, which any list must
//                                 hold); the rest are <SPECIAL_k>
//   --vocab-size V                the whole vocabulary, specials included
//                                 (default 131072): the file's first V - N
//                                 tokens get ids N..V-1; the file must hold at
//                                 least that many
//
// EOD = eos = the index of </s>; pad = the index of <pad>. Text is split at
// special-token strings first (Megatron encodes with allowed_special="all":
// "</s>" in text becomes the EOD id; where two specials start at one place the
// longer wins), then each stretch by the pattern, then each piece is looked up
// whole or BPE-merged by rank (tiktoken's algorithm, data/byte_bpe.h).
// decode() writes specials as their names. Invalid UTF-8: as GPT2BPETokenizer
// (encode accepts it byte by byte; encode_checked refuses it with its offset).

#include <memory>
#include <string>
#include <vector>

#include "data/pretok_regex.h"
#include "data/tokenizer.h"

namespace mt::data {

class BytePairEncoder;

// Megatron's pattern strings for --tiktoken-pattern v1 and v2.
extern const char* const kTiktokenPatternV1;
extern const char* const kTiktokenPatternV2;

class TikTokenizer final : public Tokenizer {
 public:
  struct Options {
    std::string pattern = "v2";            // --tiktoken-pattern
    int64_t num_special_tokens = 1000;     // --tiktoken-num-special-tokens
    std::vector<std::string> special_tokens;  // --tokenizer-special-tokens (empty: Megatron's 7)
    int64_t vocab_size = 131072;           // --vocab-size
  };
  // Errors name the flag, the file and the entry at fault.
  static Result<std::unique_ptr<TikTokenizer>> load(const std::string& path, const Options& opt);
  static Result<std::unique_ptr<TikTokenizer>> from_string(std::string_view json, const std::string& name,
                                                           const Options& opt);
  ~TikTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>* out) const override;
  Status encode_checked(std::string_view text, std::vector<int32_t>* out) const override;
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override { return "TikTokenizer"; }
  int32_t bos() const { return bos_; }

 private:
  TikTokenizer();
  // Encodes a stretch without special tokens.
  void encode_ordinary(std::string_view text, std::vector<int32_t>* out) const;
  std::unique_ptr<BytePairEncoder> bpe_;
  std::unique_ptr<PretokRegex> regex_;
  std::vector<std::string> specials_;  // id -> name
  int32_t num_special_ = 0;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, pad_ = -1, bos_ = -1;
  size_t min_special_len_ = 0, max_special_len_ = 0;
  std::vector<uint8_t> special_first_;  // bytes that start some special token
  struct SpecialIndex;
  std::unique_ptr<SpecialIndex> index_;
};

}  // namespace mt::data
