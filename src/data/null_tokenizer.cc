#include "data/null_tokenizer.h"

#include <fmt/format.h>

namespace mt::data {

namespace {
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
}  // namespace

Result<std::unique_ptr<NullTokenizer>> NullTokenizer::create(int64_t vocab_size, std::optional<int64_t> eod_id,
                                                             std::optional<int64_t> pad_id) {
  if (vocab_size < 1 || vocab_size > INT32_MAX)
    return Status::invalid(fmt::format("--vocab-size {}: NullTokenizer needs a vocabulary size in [1, {}]",
                                       vocab_size, INT32_MAX));
  const int64_t eod = eod_id.value_or(vocab_size - 1);
  if (eod < 0 || eod >= vocab_size)
    return Status::invalid(
        fmt::format("--null-tokenizer-eod-id {}: must be an id in [0, {}) (--vocab-size)", eod, vocab_size));
  const int64_t pad = pad_id.value_or(-1);
  if (pad < -1 || pad >= vocab_size)
    return Status::invalid(fmt::format(
        "--null-tokenizer-pad-id {}: must be -1 (no pad) or an id in [0, {}) (--vocab-size)", pad, vocab_size));
  return std::unique_ptr<NullTokenizer>(
      new NullTokenizer(vocab_size, static_cast<int32_t>(eod), static_cast<int32_t>(pad)));
}

Status NullTokenizer::parse(std::string_view text, std::vector<int32_t>* out, bool strict) const {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) break;
    const size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    const std::string_view tok = text.substr(start, i - start);
    // [+-]?[0-9]+, value in [0, vocab_size)
    size_t k = 0;
    bool neg = false;
    if (tok[0] == '+' || tok[0] == '-') {
      neg = tok[0] == '-';
      k = 1;
    }
    bool ok = k < tok.size();
    int64_t v = 0;
    for (; ok && k < tok.size(); ++k) {
      if (tok[k] < '0' || tok[k] > '9') {
        ok = false;
        break;
      }
      if (v <= vocab_size_) v = v * 10 + (tok[k] - '0');  // stops growing once out of range
    }
    if (ok && (!neg || v == 0) && v < vocab_size_) {
      out->push_back(static_cast<int32_t>(v));
      continue;
    }
    if (!strict) continue;
    const std::string shown = tok.size() > 40 ? std::string(tok.substr(0, 40)) + "..." : std::string(tok);
    if (!ok)
      return Status::invalid(fmt::format("NullTokenizer: \"{}\" at byte offset {} is not an integer id", shown, start));
    return Status::invalid(fmt::format("NullTokenizer: id {} at byte offset {} is outside the vocabulary [0, {})",
                                       shown, start, vocab_size_));
  }
  return Status::ok();
}

void NullTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const { (void)parse(text, out, false); }

Status NullTokenizer::encode_checked(std::string_view text, std::vector<int32_t>* out) const {
  const size_t before = out->size();
  Status st = parse(text, out, true);
  if (!st.is_ok()) out->resize(before);
  return st;
}

Result<std::string> NullTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_)
      return Status::invalid(fmt::format("NullTokenizer: token id {} at position {} is outside the vocabulary [0, {})",
                                         ids[i], i, vocab_size_));
    if (i) s.push_back(' ');
    s += std::to_string(ids[i]);
  }
  return s;
}

}  // namespace mt::data
