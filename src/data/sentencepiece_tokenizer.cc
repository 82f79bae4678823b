#include "data/sentencepiece_tokenizer.h"

#include <sys/stat.h>

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "data/unicode.h"

namespace mt::data {

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

Result<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::load(const std::string& model_file,
                                                                           const std::string& type) {
  struct stat st;
  if (::stat(model_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return Status::not_found(fmt::format("--tokenizer-model {}: no such file", model_file));
  auto t = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer());
  t->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto s = t->sp_->Load(model_file);
  if (!s.ok())
    return Status::corrupt(
        fmt::format("--tokenizer-model {}: not a SentencePiece model: {}", model_file, s.ToString()));
  t->type_ = type;
  t->vocab_size_ = t->sp_->GetPieceSize();
  t->eod_ = t->sp_->eos_id();
  t->pad_ = t->sp_->pad_id();
  t->bos_ = t->sp_->bos_id();
  return t;
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<int> ids;
  // Encode fails only for a model that did not load, which load() rules out.
  const auto s = sp_->Encode(text, &ids);
  if (!s.ok()) return;
  out->insert(out->end(), ids.begin(), ids.end());
}

Status SentencePieceTokenizer::encode_checked(std::string_view text, std::vector<int32_t>* out) const {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    return Status::invalid(fmt::format("text is not valid UTF-8 at byte offset {} (byte 0x{:02x})", bad,
                                       static_cast<unsigned char>(text[bad])));
  std::vector<int> ids;
  const auto s = sp_->Encode(text, &ids);
  if (!s.ok()) return Status::internal(fmt::format("{}: encode failed: {}", type_, s.ToString()));
  out->insert(out->end(), ids.begin(), ids.end());
  return Status::ok();
}

Result<std::string> SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= vocab_size_)
      return Status::invalid(fmt::format("{}: token id {} at position {} is outside the vocabulary [0, {})", type_,
                                         v[i], i, vocab_size_));
  std::string text;
  const auto s = sp_->Decode(v, &text);
  if (!s.ok()) return Status::invalid(fmt::format("{}: decode failed: {}", type_, s.ToString()));
  return text;
}

int32_t SentencePieceTokenizer::unk() const { return sp_->unk_id(); }

std::string SentencePieceTokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return {};
  return sp_->IdToPiece(id);
}

}  // namespace mt::data
