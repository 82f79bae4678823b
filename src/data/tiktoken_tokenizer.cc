#include "data/tiktoken_tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/byte_bpe.h"
#include "data/unicode.h"

namespace mt::data {

// Megatron's _PATTERN_TIKTOKEN_V1 and _PATTERN_TIKTOKEN_V2.
const char* const kTiktokenPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* const kTiktokenPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

const std::vector<std::string> kDefaultSpecials = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};

// Standard base64 (RFC 4648, with padding), as Python's b64decode of
// well-formed input. False on anything else.
bool base64_decode(std::string_view s, std::string* out) {
  out->clear();
  if (s.size() % 4 != 0) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (last && s[i + k] == '=' && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad) return false;  // data after '='
      v[k] = val(s[i + k]);
      if (v[k] < 0) return false;
    }
    const uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out->push_back(static_cast<char>(w >> 16));
    if (pad < 2) out->push_back(static_cast<char>((w >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(w & 0xFF));
  }
  return true;
}

}  // namespace

struct TikTokenizer::SpecialIndex {
  std::unordered_map<std::string, int32_t> ids;
};

TikTokenizer::TikTokenizer() = default;
TikTokenizer::~TikTokenizer() = default;

Result<std::unique_ptr<TikTokenizer>> TikTokenizer::load(const std::string& path, const Options& opt) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return Status::not_found(fmt::format("--tokenizer-model {}: cannot open: {} (TikTokenizer reads a JSON list of "
                                         "{{rank, token_bytes, token_str}})",
                                         path, std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::io_error(fmt::format("--tokenizer-model {}: read failed", path));
  return from_string(ss.str(), "--tokenizer-model " + path, opt);
}

Result<std::unique_ptr<TikTokenizer>> TikTokenizer::from_string(std::string_view json, const std::string& name,
                                                                const Options& opt) {
  // Options first: they do not depend on the file.
  std::vector<std::string> problems;
  const char* pattern = nullptr;
  if (opt.pattern == "v1") pattern = kTiktokenPatternV1;
  else if (opt.pattern == "v2") pattern = kTiktokenPatternV2;
  else problems.push_back(fmt::format("--tiktoken-pattern {}: expected v1 or v2", opt.pattern));
  std::vector<std::string> specials = opt.special_tokens.empty() ? kDefaultSpecials : opt.special_tokens;
  {
    std::unordered_set<std::string> seen;
    for (const auto& s : specials) {
      if (s.empty()) problems.push_back("--tokenizer-special-tokens: an empty special token");
      if (!seen.insert(s).second)
        problems.push_back(fmt::format("--tokenizer-special-tokens: \"{}\" is given twice (they must be unique)", s));
    }
    std::string missing;
    for (const auto& s : kDefaultSpecials)
      if (!seen.count(s)) missing += (missing.empty() ? "" : " ") + s;
    if (!missing.empty())
      problems.push_back(fmt::format("--tokenizer-special-tokens: TikTokenizer's list must hold {} (missing: {})",
                                     "<unk> <s> </s> <mask> <pad> <cls> <sep>", missing));
  }
  const int64_t n_special = opt.num_special_tokens;
  if (n_special < static_cast<int64_t>(specials.size()) || n_special >= opt.vocab_size)
    problems.push_back(fmt::format("--tiktoken-num-special-tokens {}: must be at least the {} special tokens and below "
                                   "--vocab-size {}",
                                   n_special, specials.size(), opt.vocab_size));
  if (!problems.empty()) {
    std::string m = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) m += "; " + problems[i];
    return Status::invalid(m);
  }
  for (int64_t i = static_cast<int64_t>(specials.size()); i < n_special; ++i)
    specials.push_back(fmt::format("<SPECIAL_{}>", i));
  {
    std::unordered_set<std::string> seen(specials.begin(), specials.end());
    if (seen.size() != specials.size())
      return Status::invalid(fmt::format("--tokenizer-special-tokens: a given token collides with the generated "
                                         "<SPECIAL_k> names (k from {})",
                                         opt.special_tokens.size()));
  }

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Status::corrupt(fmt::format("{}: not valid JSON (byte {}): {}", name, e.byte, e.what()));
  }
  if (!j.is_array())
    return Status::corrupt(fmt::format("{}: expected a JSON list of {{\"rank\", \"token_bytes\", \"token_str\"}} "
                                       "objects (Megatron's TikTokenizer format)",
                                       name));
  const int64_t inner = opt.vocab_size - n_special;
  if (static_cast<int64_t>(j.size()) < inner)
    return Status::invalid(fmt::format(
        "{}: holds {} tokens, but --vocab-size {} with --tiktoken-num-special-tokens {} needs {} (Megatron asserts "
        "the same); fix: --vocab-size {}",
        name, j.size(), opt.vocab_size, n_special, inner, static_cast<int64_t>(j.size()) + n_special));
  std::vector<std::string> tokens(static_cast<size_t>(inner));
  for (int64_t i = 0; i < inner; ++i) {
    const auto& e = j[static_cast<size_t>(i)];
    if (!e.is_object() || e.size() != 3 || !e.contains("rank") || !e.contains("token_bytes") ||
        !e.contains("token_str"))
      return Status::corrupt(fmt::format("{}: entry {}: expected exactly the keys rank, token_bytes, token_str", name, i));
    if (!e["rank"].is_number_integer() || e["rank"].get<int64_t>() != i)
      return Status::corrupt(fmt::format("{}: entry {}: rank must be {} (its index)", name, i, i));
    if (!e["token_bytes"].is_string() || !base64_decode(e["token_bytes"].get<std::string>(), &tokens[i]) ||
        tokens[i].empty())
      return Status::corrupt(fmt::format("{}: entry {}: token_bytes is not non-empty standard base64", name, i));
    if (i < 256 && (tokens[i].size() != 1 || static_cast<unsigned char>(tokens[i][0]) != i))
      return Status::corrupt(fmt::format("{}: entry {}: the first 256 tokens must be the single bytes 0..255 in order",
                                         name, i));
  }
  auto engine = BytePairEncoder::create(std::move(tokens), name);
  if (!engine) return engine.status();
  (*engine)->set_merges_from_ranks();
  if (Status st = (*engine)->finish(BytePairEncoder::WholePiece::kAlways, name); !st) return st;
  auto re = PretokRegex::compile(pattern);
  if (!re) return re.status();

  auto t = std::unique_ptr<TikTokenizer>(new TikTokenizer());
  t->bpe_ = std::move(*engine);
  t->regex_ = std::make_unique<PretokRegex>(std::move(*re));
  t->num_special_ = static_cast<int32_t>(n_special);
  t->vocab_size_ = opt.vocab_size;
  t->index_ = std::make_unique<SpecialIndex>();
  t->special_first_.assign(256, 0);
  t->min_special_len_ = SIZE_MAX;
  for (size_t i = 0; i < specials.size(); ++i) {
    t->index_->ids.emplace(specials[i], static_cast<int32_t>(i));
    t->special_first_[static_cast<unsigned char>(specials[i][0])] = 1;
    t->min_special_len_ = std::min(t->min_special_len_, specials[i].size());
    t->max_special_len_ = std::max(t->max_special_len_, specials[i].size());
  }
  auto index_of = [&](const char* s) {
    return static_cast<int32_t>(std::find(specials.begin(), specials.end(), s) - specials.begin());
  };
  t->eod_ = index_of("</s>");
  t->pad_ = index_of("<pad>");
  t->bos_ = index_of("<s>");
  t->specials_ = std::move(specials);
  return t;
}

void TikTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>* out) const {
  const size_t first = out->size();
  regex_->split(text, [&](size_t b, size_t e, bool matched) {
    if (matched) bpe_->encode_piece(text.substr(b, e - b), out);  // tiktoken drops unmatched text
  });
  for (size_t i = first; i < out->size(); ++i) (*out)[i] += num_special_;
}

void TikTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const {
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!special_first_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const size_t longest = std::min(max_special_len_, text.size() - i);
    int32_t id = -1;
    size_t len = 0;
    for (size_t n = longest; n >= min_special_len_ && n > 0; --n) {
      const auto it = index_->ids.find(std::string(text.substr(i, n)));
      if (it != index_->ids.end()) {
        id = it->second;
        len = n;
        break;
      }
    }
    if (id < 0) {
      ++i;
      continue;
    }
    encode_ordinary(text.substr(start, i - start), out);
    out->push_back(id);
    i += len;
    start = i;
  }
  encode_ordinary(text.substr(start), out);
}

Status TikTokenizer::encode_checked(std::string_view text, std::vector<int32_t>* out) const {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    return Status::invalid(fmt::format("text is not valid UTF-8 at byte offset {} (byte 0x{:02x})", bad,
                                       static_cast<unsigned char>(text[bad])));
  encode(text, out);
  return Status::ok();
}

Result<std::string> TikTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_)
      return Status::invalid(fmt::format("TikTokenizer: token id {} at position {} is outside the vocabulary [0, {})",
                                         id, i, vocab_size_));
    if (id < num_special_) out += specials_[id];
    else out += bpe_->bytes(id - num_special_);
  }
  return out;
}

}  // namespace mt::data
