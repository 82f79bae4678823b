#pragma once
// Pre-tokenisation patterns: the regular expressions byte-level BPE
// tokenizers split text with before BPE (tiktoken's pat_str, Megatron's
// TikTokenizer v1/v2 patterns, Hugging Face tokenizer.json's Split
// pre-tokenizers), matched with the semantics of the engines those use
// (Rust's fancy-regex, Oniguruma): backtracking, leftmost-first alternation,
// over Unicode code points.
//
// Supported syntax (anything else is refused at compile() with its offset):
//   alternation a|b; groups (...), (?:...), (?i:...) (ASCII letters fold, plus
//   s/U+017F and k/U+212A as Unicode's simple folding does), atomic (?>...),
//   lookahead (?=...) and (?!...);
//   quantifiers ? * + {n} {n,} {n,m}, each greedy, lazy (suffix ?) or
//   possessive (suffix +);
//   literals (UTF-8), escapes \r \n \t \f \v \e \a \0 and escaped punctuation;
//   . (any character but \n); \s \S (White_Space); \d \D (\p{Nd});
//   \p{..} \P{..} and \pX with General_Category names (L Lu Ll Lt Lm Lo M Mn Mc
//   Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Cs Co
//   Cn, long forms Letter, Mark, Number, Punctuation, Symbol, Separator, Other,
//   and L& / LC for cased letters); character classes [...] and [^...] holding
//   any of those, and ranges a-z.
// Not supported: \w \b ^ $, backreferences, script properties (\p{Han}),
// nested classes and class set operations, inline flags without a group.
//
// Text that is not valid UTF-8 is matched one invalid byte at a time, each as
// a character of category Cn that is not white space (what GPT2BPETokenizer
// does too), so splitting never fails and the pieces concatenate to the input.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mt::data {

class PretokRegex {
 public:
  // Errors name the byte offset in `pattern` and what was expected there.
  static Result<PretokRegex> compile(std::string_view pattern);

  PretokRegex(PretokRegex&&) noexcept;
  PretokRegex& operator=(PretokRegex&&) noexcept;
  ~PretokRegex();

  const std::string& pattern() const;
  // Whether some text makes the pattern match the empty string somewhere.
  bool can_match_empty() const;

  // Splits `text` as find_iter does: from each position, the pattern's
  // leftmost-first match there; where no non-empty match starts, the
  // characters up to the next match form a gap. Calls fn(begin, end, matched)
  // for every match and gap in order, byte offsets into `text`; together they
  // cover `text` exactly.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const;

  // End (byte offset) of the match starting exactly at byte `pos`, or npos
  // when no non-empty match starts there. Slow path for tests; split() decodes
  // the text once.
  size_t match_at(std::string_view text, size_t pos) const;

  struct Program;

 private:
  explicit PretokRegex(std::unique_ptr<Program> p);
  // Decodes text into code points (invalid bytes as 0x110000 + byte) and
  // character start offsets (size n + 1).
  static void decode(std::string_view text, std::vector<char32_t>* cps, std::vector<uint32_t>* offs);
  // End index (in code points) of the match at cps[pos], or -1.
  int64_t match_cps(const char32_t* cps, int64_t n, int64_t pos) const;
  std::unique_ptr<Program> prog_;
};

template <typename Fn>
void PretokRegex::split(std::string_view text, Fn&& fn) const {
  thread_local std::vector<char32_t> cps;
  thread_local std::vector<uint32_t> offs;
  decode(text, &cps, &offs);
  const int64_t n = static_cast<int64_t>(cps.size());
  int64_t pos = 0, gap = -1;
  while (pos < n) {
    const int64_t end = match_cps(cps.data(), n, pos);
    if (end > pos) {
      if (gap >= 0) fn(static_cast<size_t>(offs[gap]), static_cast<size_t>(offs[pos]), false);
      gap = -1;
      fn(static_cast<size_t>(offs[pos]), static_cast<size_t>(offs[end]), true);
      pos = end;
    } else {
      if (gap < 0) gap = pos;
      ++pos;
    }
  }
  if (gap >= 0) fn(static_cast<size_t>(offs[gap]), static_cast<size_t>(offs[n]), false);
}

}  // namespace mt::data
