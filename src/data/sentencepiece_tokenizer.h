#pragma once
// SentencePieceTokenizer: a SentencePiece .model file through libsentencepiece,
// as Megatron-Core's tokenizer for --tokenizer-type SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer (all three build the same
// `sentencepiece` library tokenizer in Megatron-Core; its non-legacy path).
//
//   encode  = SentencePieceProcessor::Encode(text) -> ids (no BOS/EOS added)
//   decode  = SentencePieceProcessor::Decode(ids)
//   vocab_size() = the model's piece count; eod() = the model's eos id (the
//   abstract tokenizer's `eod` falls back to `eos_id`); pad() = its pad id
//   (-1 when the model has none, spm_train's default).
//
// Differences from older Megatron (megatron/training/tokenizer, before the
// core tokenizers): the legacy _SentencePieceTokenizer appended <CLS>, <SEP>,
// <EOD>, <MASK> pieces to the vocabulary and used <EOD> as EOD, and the legacy
// Llama2Tokenizer put BOS in front of every text. Those are not reproduced.
//
// libsentencepiece's Encode and Decode are const and used concurrently.
// Invalid UTF-8 is passed to the library, which does not crash on it (it
// normalises such bytes to U+FFFD); encode_checked() refuses it instead, as
// Megatron's Python path does.

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mt::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `type` is the --tokenizer-type the user gave (reported by name()).
  static Result<std::unique_ptr<SentencePieceTokenizer>> load(const std::string& model_file,
                                                             const std::string& type = "SentencePieceTokenizer");
  ~SentencePieceTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>* out) const override;
  Status encode_checked(std::string_view text, std::vector<int32_t>* out) const override;
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override { return type_; }
  int32_t bos() const { return bos_; }
  int32_t unk() const;
  // The piece of an id ("<s>", "</s>", "<unk>", ...); empty for -1 or an id
  // outside the vocabulary.
  std::string piece(int32_t id) const;

 private:
  SentencePieceTokenizer() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string type_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, pad_ = -1, bos_ = -1;
};

}  // namespace mt::data
