#pragma once
// NullTokenizer: Megatron's tokenizer for tests and benchmarks (Megatron-Core
// >= 0.18): the text already is the ids, written as integers separated by
// whitespace. vocab_size() = --vocab-size N; EOD = --null-tokenizer-eod-id,
// default N - 1; pad = --null-tokenizer-pad-id, default -1 (none).
//
// Megatron splits on single spaces and calls int() on each part, so a double
// space, an empty text or a non-integer stops it with ValueError, and an id
// outside the vocabulary passes through to fail later. Here any run of ASCII
// whitespace separates ids and an empty text has no ids; encode_checked()
// refuses a token that is not a decimal integer in [0, N), naming it and its
// byte offset; encode(), which cannot fail, skips such tokens.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

class NullTokenizer final : public Tokenizer {
 public:
  // Errors name --vocab-size / --null-tokenizer-eod-id / --null-tokenizer-pad-id.
  static Result<std::unique_ptr<NullTokenizer>> create(int64_t vocab_size, std::optional<int64_t> eod_id = {},
                                                       std::optional<int64_t> pad_id = {});

  void encode(std::string_view text, std::vector<int32_t>* out) const override;
  Status encode_checked(std::string_view text, std::vector<int32_t>* out) const override;
  // The ids as decimal integers separated by single spaces (Megatron's
  // ids_to_text); fails on an id outside [0, vocab_size).
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override { return "NullTokenizer"; }

 private:
  NullTokenizer(int64_t v, int32_t eod, int32_t pad) : vocab_size_(v), eod_(eod), pad_(pad) {}
  // Parses the tokens of `text`; on the first bad one returns its message
  // when `strict`, else skips it.
  Status parse(std::string_view text, std::vector<int32_t>* out, bool strict) const;
  int64_t vocab_size_;
  int32_t eod_, pad_;
};

}  // namespace mt::data
