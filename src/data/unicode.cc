#include "data/unicode.h"

#include <algorithm>
#include <iterator>
#include <unordered_map>

namespace mt::data {

namespace {
#include "data/unicode_classes.inc"
#include "data/unicode_gc.inc"
}  // namespace

uint8_t unicode_props(char32_t cp) {
  if (cp >= 0x110000) return static_cast<uint8_t>(GeneralCategory::kCn);
  return kGcStage2[kGcStage1[cp >> 8] * 256 + (cp & 0xFF)];
}

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

size_t find_nfc_quick_check_failure(std::string_view s) {
  // UAX #15's quick check: a code point whose NFC_QC is not Yes, or combining
  // marks out of canonical order, fail it.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  const auto* q = p;
  uint8_t last_cc = 0;
  while (q < end) {
    if (*q < 0xCC) {  // below U+0300 every code point is a starter with NFC_QC=Yes
      ++q;
      last_cc = 0;
      continue;
    }
    const Utf8Char ch = decode_utf8(q, end);
    uint8_t cc = 0;
    if (ch.valid && ch.cp >= 0x300) {
      const auto* r = std::upper_bound(std::begin(kNfcQcNotYes), std::end(kNfcQcNotYes), ch.cp,
                                       [](char32_t c, const char32_t (&range)[2]) { return c < range[0]; });
      if (r != std::begin(kNfcQcNotYes) && ch.cp <= (*(r - 1))[1]) return static_cast<size_t>(q - p);
      cc = combining_class(ch.cp);
      if (cc != 0 && last_cc > cc) return static_cast<size_t>(q - p);
    }
    last_cc = cc;
    q += ch.len;
  }
  return std::string_view::npos;
}

namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
constexpr char32_t kNone = 0xFFFFFFFF;
constexpr char32_t kInvalidByte = 0x80000000;  // kInvalidByte | b stands for an invalid byte b

struct NfcTables {
  std::unordered_map<uint64_t, char32_t> compose;  // (first << 32 | second) -> primary composite
  NfcTables() {
    for (const auto& d : kDecomp) {
      if (d[2] == 0) continue;  // singletons never compose
      const auto* r = std::upper_bound(std::begin(kCompositionExclusions), std::end(kCompositionExclusions),
                                       static_cast<char32_t>(d[0]),
                                       [](char32_t c, const char32_t (&range)[2]) { return c < range[0]; });
      if (r != std::begin(kCompositionExclusions) && d[0] <= (*(r - 1))[1]) continue;
      compose.emplace((static_cast<uint64_t>(d[1]) << 32) | d[2], static_cast<char32_t>(d[0]));
    }
  }
};

const NfcTables& nfc_tables() {
  static const NfcTables t;
  return t;
}

void decompose(char32_t cp, std::u32string* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* d = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                                   [](const uint32_t (&e)[3], char32_t c) { return e[0] < c; });
  if (d == std::end(kDecomp) || (*d)[0] != cp) {
    out->push_back(cp);
    return;
  }
  decompose((*d)[1], out);
  if ((*d)[2]) decompose((*d)[2], out);
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& m = nfc_tables().compose;
  const auto it = m.find((static_cast<uint64_t>(a) << 32) | b);
  return it == m.end() ? kNone : it->second;
}

}  // namespace

uint8_t combining_class(char32_t cp) {
  const auto* c = std::lower_bound(std::begin(kCcc), std::end(kCcc), cp,
                                   [](const uint32_t (&e)[2], char32_t x) { return e[0] < x; });
  return c != std::end(kCcc) && (*c)[0] == cp ? static_cast<uint8_t>((*c)[1]) : 0;
}

std::string nfc(std::string_view s) {
  if (find_nfc_quick_check_failure(s) == std::string_view::npos) return std::string(s);
  // 1. Full canonical decomposition.
  std::u32string d;
  d.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const Utf8Char ch = decode_utf8(p, end);
    if (ch.valid) decompose(ch.cp, &d);
    else d.push_back(kInvalidByte | ch.cp);
    p += ch.len;
  }
  auto cc = [](char32_t c) -> int { return c & kInvalidByte ? 0 : combining_class(c); };
  // 2. Canonical ordering: each run of non-starters, stably by class.
  for (size_t i = 0; i < d.size();) {
    if (cc(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && cc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [&](char32_t a, char32_t b) { return cc(a) < cc(b); });
    i = j;
  }
  // 3. Canonical composition (the UAX #15 sample algorithm).
  if (!d.empty()) {
    size_t starter = 0, out = 1;
    int last = cc(d[0]) ? 256 : 0;
    for (size_t i = 1; i < d.size(); ++i) {
      const char32_t c = d[i];
      const int k = cc(c);
      const char32_t comp = (d[starter] & kInvalidByte) || (c & kInvalidByte) ? kNone : compose_pair(d[starter], c);
      if (comp != kNone && (last < k || last == 0)) {
        d[starter] = comp;
        continue;
      }
      if (k == 0) starter = out;
      last = k;
      d[out++] = c;
    }
    d.resize(out);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : d) {
    if (c & kInvalidByte) r.push_back(static_cast<char>(c & 0xFF));
    else append_utf8(c, &r);
  }
  return r;
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
