#include "data/gpt2_bpe.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <atomic>
#include <cstring>
#include <fstream>
#include <limits>
#include <queue>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/byte_bpe.h"
#include "data/unicode.h"

namespace mt::data {

// ---------------------------------------------------------------------------
// Pre-tokenisation
// ---------------------------------------------------------------------------

namespace {

constexpr uint8_t kO = static_cast<uint8_t>(CharClass::kOther);
constexpr uint8_t kL = static_cast<uint8_t>(CharClass::kLetter);
constexpr uint8_t kN = static_cast<uint8_t>(CharClass::kNumber);
constexpr uint8_t kS = static_cast<uint8_t>(CharClass::kSpace);

// Classes of the ASCII characters. \s is White_Space: TAB LF VT FF CR SPACE
// (not U+001C..U+001F, which Python's str.isspace() would include).
constexpr auto kAsciiClass = [] {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    uint8_t v = kO;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) v = kL;
    if (c >= '0' && c <= '9') v = kN;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) v = kS;
    t[c] = v;
  }
  return t;
}();

// Class and length of the character at p; an invalid UTF-8 byte is one
// character of class "other".
inline uint8_t class_at(const unsigned char* p, const unsigned char* end, unsigned* len) {
  if (*p < 0x80) {
    *len = 1;
    return kAsciiClass[*p];
  }
  const Utf8Char ch = decode_utf8(p, end);
  *len = ch.len;
  return ch.valid ? static_cast<uint8_t>(char_class(ch.cp)) : kO;
}

// End of the run of characters of class `cls` starting at p.
inline const unsigned char* scan_run(const unsigned char* p, const unsigned char* end, uint8_t cls) {
  while (p < end) {
    if (*p < 0x80) {
      if (kAsciiClass[*p] != cls) break;
      ++p;
      continue;
    }
    unsigned len;
    if (class_at(p, end, &len) != cls) break;
    p += len;
  }
  return p;
}

}  // namespace

size_t gpt2_piece_end(std::string_view text, size_t pos) {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = base + text.size();
  const auto* p = base + pos;
  // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, as the pattern)
  if (*p == '\'' && p + 1 < end) {
    const unsigned char a = p[1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (p + 2 < end) {
      const unsigned char b = p[2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
  }
  unsigned len0;
  const uint8_t c0 = class_at(p, end, &len0);
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+  with the optional U+0020
  if (*p == ' ' && p + 1 < end) {
    unsigned len1;
    const uint8_t c1 = class_at(p + 1, end, &len1);
    if (c1 != kS) return static_cast<size_t>(scan_run(p + 1 + len1, end, c1) - base);
  }
  if (c0 != kS) return static_cast<size_t>(scan_run(p + len0, end, c0) - base);
  // \s+(?!\S) | \s+ : a whitespace run that reaches the end of the text is
  // taken whole; one followed by a non-space gives back its last character
  // (which then starts the next piece, e.g. " word"), unless it is a single
  // character, which \s+ then takes alone.
  const unsigned char* last = p;
  const unsigned char* q = p + len0;
  while (q < end) {
    unsigned len;
    if (class_at(q, end, &len) != kS) break;
    last = q;
    q += len;
  }
  if (q == end || last == p) return static_cast<size_t>(q - base);
  return static_cast<size_t>(last - base);
}

std::string replace_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const Utf8Char ch = decode_utf8(p, end);
    if (ch.valid) {
      out.append(reinterpret_cast<const char*>(p), ch.len);
      p += ch.len;
      continue;
    }
    // Maximal subpart: a valid lead byte followed by as many bytes as are
    // still a valid prefix of some sequence (Unicode §3.9, what Python does).
    const unsigned c = *p;
    size_t need = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    size_t n = 1;
    for (size_t k = 0; k < need && p + n < end; ++k) {
      const unsigned b = p[n];
      if (k == 0 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
      ++n;
    }
    out.append("\xEF\xBF\xBD");
    p += n;
  }
  return out;
}

namespace {

Result<std::string> read_whole_file(const std::string& path, const std::string& flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::not_found(fmt::format("{} {}: cannot open: {}", flag, path, std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::io_error(fmt::format("{} {}: read failed", flag, path));
  return ss.str();
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------

struct Gpt2BpeTokenizer::Impl {
  std::unique_ptr<BytePairEncoder> bpe;
};

Gpt2BpeTokenizer::Gpt2BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

Result<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::load(const std::string& vocab_file,
                                                                 const std::string& merge_file) {
  auto vocab = read_whole_file(vocab_file, "--vocab-file");
  if (!vocab) return vocab.status();
  auto merges = read_whole_file(merge_file, "--merge-file");
  if (!merges) return merges.status();
  return from_strings(*vocab, *merges, "--vocab-file " + vocab_file, "--merge-file " + merge_file);
}

Result<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::from_strings(std::string_view vocab_json,
                                                                         std::string_view merges_txt,
                                                                         const std::string& vocab_name,
                                                                         const std::string& merge_name) {
  auto impl = std::make_unique<Impl>();
  // vocab.json: {"token": id, ...}, ids 0..V-1 each used once.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json.begin(), vocab_json.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Status::corrupt(fmt::format("{}: not valid JSON (byte {}): {}", vocab_name, e.byte, e.what()));
  }
  if (!j.is_object() || j.empty())
    return Status::corrupt(fmt::format("{}: expected a JSON object mapping token strings to ids", vocab_name));
  const size_t V = j.size();
  std::vector<std::string> tok(V);
  std::vector<uint8_t> seen(V, 0);
  std::string bytes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer())
      return Status::corrupt(fmt::format("{}: entry \"{}\" has a non-integer id", vocab_name, printable(it.key())));
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || static_cast<size_t>(id) >= V)
      return Status::corrupt(fmt::format("{}: entry \"{}\" has id {}, outside [0, {}) (ids must be 0..size-1)",
                                         vocab_name, printable(it.key()), id, V));
    if (seen[id]) return Status::corrupt(fmt::format("{}: id {} is used twice", vocab_name, id));
    seen[id] = 1;
    char32_t bad;
    if (!byte_level_to_bytes(it.key(), &bytes, &bad))
      return Status::corrupt(fmt::format(
          "{}: entry \"{}\" (id {}) has character U+{:04X}, which is not in GPT-2's byte alphabet", vocab_name,
          printable(it.key()), id, static_cast<uint32_t>(bad)));
    tok[id] = bytes;
  }
  for (size_t id = 0; id < V; ++id)
    if (tok[id].empty()) return Status::corrupt(fmt::format("{}: id {} is the empty string", vocab_name, id));
  auto engine = BytePairEncoder::create(std::move(tok), vocab_name);
  if (!engine) return engine.status();
  impl->bpe = std::move(*engine);
  BytePairEncoder& bpe = *impl->bpe;
  for (int b = 0; b < 256; ++b) {
    if (bpe.byte_id(static_cast<uint8_t>(b)) < 0)
      return Status::corrupt(fmt::format("{}: no token for the single byte 0x{:02x} (character U+{:04X})",
                                         vocab_name, b, static_cast<uint32_t>(byte_level_char(static_cast<uint8_t>(b)))));
  }
  const int32_t eod = bpe.find("<|endoftext|>");
  if (eod < 0) return Status::corrupt(fmt::format("{}: no \"<|endoftext|>\" entry (GPT-2's EOD)", vocab_name));

  // merges.txt: optional "#version" first line, then "a b" per line by rank.
  size_t line_no = 0, pos = 0;
  std::vector<std::array<int32_t, 3>> list;
  std::string left, right;
  while (pos < merges_txt.size()) {
    size_t eol = merges_txt.find('\n', pos);
    if (eol == std::string_view::npos) eol = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.substr(0, 8) == "#version") continue;
    const auto is_ws = [](char c) { return c == ' ' || c == '\t'; };
    std::vector<std::string_view> parts;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && is_ws(line[i])) ++i;
      size_t k = i;
      while (k < line.size() && !is_ws(line[k])) ++k;
      if (k > i) parts.push_back(line.substr(i, k - i));
      i = k;
    }
    if (parts.empty()) continue;
    if (parts.size() != 2)
      return Status::corrupt(fmt::format("{}: line {}: expected two tokens separated by a space, got \"{}\"",
                                         merge_name, line_no, printable(line)));
    char32_t bad;
    if (!byte_level_to_bytes(parts[0], &left, &bad) || !byte_level_to_bytes(parts[1], &right, &bad))
      return Status::corrupt(fmt::format("{}: line {}: character U+{:04X} is not in GPT-2's byte alphabet",
                                         merge_name, line_no, static_cast<uint32_t>(bad)));
    const int32_t a = bpe.find(left), b = bpe.find(right);
    const int32_t m = bpe.find(left + right);
    if (a < 0 || b < 0 || m < 0) {
      const std::string missing = a < 0 ? std::string(parts[0]) : b < 0 ? std::string(parts[1])
                                                                        : std::string(parts[0]) + std::string(parts[1]);
      return Status::corrupt(fmt::format("{}: line {}: \"{}\" is not in the vocabulary ({})", merge_name, line_no,
                                         printable(missing), vocab_name));
    }
    list.push_back({a, b, m});
  }
  if (list.empty()) return Status::corrupt(fmt::format("{}: no merges", merge_name));
  bpe.set_merges(list);
  // A whole piece equal to a token is that token only if the token's own BPE
  // gives it back (true for all of GPT-2's; not guaranteed for any files).
  Status st = bpe.finish(BytePairEncoder::WholePiece::kIfBpeAgrees, vocab_name);
  if (!st) return st;
  auto t = std::unique_ptr<Gpt2BpeTokenizer>(new Gpt2BpeTokenizer(std::move(impl)));
  t->eod_ = eod;
  return t;
}

int64_t Gpt2BpeTokenizer::vocab_size() const { return impl_->bpe->size(); }

std::string_view Gpt2BpeTokenizer::token_bytes(int32_t id) const { return impl_->bpe->bytes(id); }

void Gpt2BpeTokenizer::bpe_fast(std::string_view piece, std::vector<int32_t>* out) const {
  impl_->bpe->bpe(piece, out);
}

std::vector<int32_t> Gpt2BpeTokenizer::bpe_reference(std::string_view piece) const {
  return impl_->bpe->bpe_reference(piece);
}

void Gpt2BpeTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const {
  const BytePairEncoder& bpe = *impl_->bpe;
  // Software-pipelined by one piece: the next piece is found and its
  // vocabulary slot prefetched before the current one is looked up, which
  // hides most of the cache miss on the (2 MB) table.
  struct Piece {
    size_t begin = 0, end = 0;
    BytePairEncoder::Key key;
  };
  auto scan = [&](size_t begin, Piece* p) {
    p->begin = begin;
    p->end = gpt2_piece_end(text, begin);
    if (p->end - begin > 1) {
      p->key = BytePairEncoder::key(text.substr(begin, p->end - begin));
      bpe.prefetch(p->key);
    }
  };
  if (text.empty()) return;
  Piece cur, next;
  scan(0, &cur);
  while (cur.begin < text.size()) {
    if (cur.end < text.size()) scan(cur.end, &next);
    else next.begin = text.size();
    bpe.encode_piece(text.substr(cur.begin, cur.end - cur.begin), cur.key, out);
    cur = next;
  }
}

Status Gpt2BpeTokenizer::encode_checked(std::string_view text, std::vector<int32_t>* out) const {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    return Status::invalid(fmt::format("text is not valid UTF-8 at byte offset {} (byte 0x{:02x})", bad,
                                       static_cast<unsigned char>(text[bad])));
  encode(text, out);
  return Status::ok();
}

Result<std::string> Gpt2BpeTokenizer::decode(std::span<const int32_t> ids) const {
  const BytePairEncoder& bpe = *impl_->bpe;
  const int64_t V = bpe.size();
  size_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      return Status::invalid(fmt::format("GPT2BPETokenizer: token id {} at position {} is outside the vocabulary [0, {})",
                                         ids[i], i, V));
    total += bpe.bytes(ids[i]).size();
  }
  std::string out;
  out.reserve(total);
  for (int32_t id : ids) out += bpe.bytes(id);
  return out;
}

}  // namespace mt::data
