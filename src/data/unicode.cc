#include "data/unicode.h"

namespace mt::data {

namespace {
#include "data/unicode_classes.inc"
}  // namespace

CharClass char_class(char32_t cp) {
  if (cp >= 0x110000) return CharClass::kOther;
  return static_cast<CharClass>(kStage2[kStage1[cp >> 8] * 256 + (cp & 0xFF)]);
}

Utf8Char decode_utf8(const unsigned char* p, const unsigned char* end) {
  const unsigned c = p[0];
  if (c < 0x80) return {c, 1, true};
  const Utf8Char bad{c, 1, false};
  const ptrdiff_t left = end - p;
  auto cont = [&](ptrdiff_t i) { return i < left && (p[i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) {
    if (!cont(1)) return bad;
    return {static_cast<char32_t>(((c & 0x1F) << 6) | (p[1] & 0x3F)), 2, true};
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return bad;
    const char32_t cp = ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;  // overlong or surrogate
    return {cp, 3, true};
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return bad;
    const char32_t cp = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    if (cp < 0x10000 || cp > 0x10FFFF) return bad;  // overlong or out of range
    return {cp, 4, true};
  }
  return bad;  // 0x80..0xC1 (continuation or overlong lead) and 0xF5..0xFF
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  const auto* q = p;
  while (q < end) {
    if (*q < 0x80) {
      ++q;
      continue;
    }
    Utf8Char ch = decode_utf8(q, end);
    if (!ch.valid) return static_cast<size_t>(q - p);
    q += ch.len;
  }
  return std::string_view::npos;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace mt::data
