#pragma once
// UTF-8 decoding and the character classes GPT-2's pre-tokenisation pattern
// uses (\p{L}, \p{N}, \s), from tables generated out of the Unicode Character
// Database by scripts/gen_unicode_tables.py (Unicode 15.0, as Python's `regex`
// module on Debian 12).
//
// Decoding is strict, as Python's UTF-8 codec: overlong forms, surrogates
// (U+D800..U+DFFF), code points above U+10FFFF and truncated sequences are
// invalid. An invalid sequence is reported one byte at a time.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::data {

enum class CharClass : uint8_t {
  kOther = 0,   // neither letter, number nor whitespace (punctuation, symbols, marks, controls, ...)
  kLetter = 1,  // General_Category L*  (regex \p{L})
  kNumber = 2,  // General_Category N*  (regex \p{N})
  kSpace = 3,   // White_Space property (regex \s)
};

// Class of a code point; kOther for anything above U+10FFFF.
CharClass char_class(char32_t cp);

// Unicode General_Category values (scripts/gen_unicode_tables.py --gc, same
// Unicode version as char_class).
enum class GeneralCategory : uint8_t {
  kLu, kLl, kLt, kLm, kLo, kMn, kMc, kMe, kNd, kNl, kNo, kPc, kPd, kPs, kPe,
  kPi, kPf, kPo, kSm, kSc, kSk, kSo, kZs, kZl, kZp, kCc, kCf, kCs, kCo, kCn,
};
constexpr int kNumGeneralCategories = 30;

// General_Category of cp in the low 5 bits, plus kWhiteSpaceBit when cp has
// the White_Space property. Above U+10FFFF: Cn, not white space.
constexpr uint8_t kWhiteSpaceBit = 32;
uint8_t unicode_props(char32_t cp);
inline GeneralCategory general_category(char32_t cp) {
  return static_cast<GeneralCategory>(unicode_props(cp) & 31);
}

struct Utf8Char {
  char32_t cp;   // the code point, or the byte value when !valid
  uint8_t len;   // bytes consumed (1..4; 1 when !valid)
  bool valid;
};

// Decodes the character starting at p (REQUIRES: p < end).
Utf8Char decode_utf8(const unsigned char* p, const unsigned char* end);

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos if `s` is
// valid UTF-8.
size_t find_invalid_utf8(std::string_view s);

// UAX #15's NFC quick check: the byte offset of the first code point whose
// NFC_Quick_Check is No or Maybe or whose combining class is below the
// previous one's, or npos: text that passes is in Normalization Form C
// already (invalid UTF-8 bytes count as starters).
size_t find_nfc_quick_check_failure(std::string_view s);

// Unicode Normalization Form C of `s` (UAX #15: canonical decomposition,
// canonical ordering, canonical composition; Hangul algorithmically), the
// normalizer of Hugging Face tokenizers such as Qwen2's. Text that passes the
// quick check is returned as it is. Invalid UTF-8 bytes are kept, each acting
// as a starter that composes with nothing.
std::string nfc(std::string_view s);
// Canonical_Combining_Class of cp (0 above U+10FFFF).
uint8_t combining_class(char32_t cp);

// Appends the UTF-8 encoding of cp (REQUIRES: cp <= 0x10FFFF).
void append_utf8(char32_t cp, std::string* out);

}  // namespace mt::data
