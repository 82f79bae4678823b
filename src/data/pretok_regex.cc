#include "data/pretok_regex.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "data/unicode.h"

namespace mt::data {

// ---------------------------------------------------------------------------
// Character sets
// ---------------------------------------------------------------------------

namespace {

constexpr char32_t kInvalidBase = 0x110000;  // invalid byte b decodes to kInvalidBase + b

struct CharSet {
  uint32_t gc_mask = 0;  // General_Category bits (1 << GeneralCategory)
  bool white_space = false;      // \s
  bool not_white_space = false;  // \S
  std::vector<std::pair<char32_t, char32_t>> ranges;  // inclusive
  bool negated = false;
  std::array<uint64_t, 2> ascii{};  // membership of U+0000..U+007F, after negation

  bool raw_contains(char32_t cp) const {
    const uint8_t props = cp >= kInvalidBase ? static_cast<uint8_t>(GeneralCategory::kCn) : unicode_props(cp);
    if ((gc_mask >> (props & 31)) & 1u) return true;
    if (white_space && (props & kWhiteSpaceBit)) return true;
    if (not_white_space && !(props & kWhiteSpaceBit)) return true;
    for (const auto& [lo, hi] : ranges)
      if (cp >= lo && cp <= hi) return true;
    return false;
  }
  void finish() {
    ascii = {0, 0};
    for (char32_t c = 0; c < 128; ++c)
      if (raw_contains(c) != negated) ascii[c >> 6] |= 1ull << (c & 63);
  }
  bool contains(char32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1u;
    return raw_contains(cp) != negated;
  }
  void add(const CharSet& o) {  // union with a non-negated set
    gc_mask |= o.gc_mask;
    white_space |= o.white_space;
    not_white_space |= o.not_white_space;
    ranges.insert(ranges.end(), o.ranges.begin(), o.ranges.end());
  }
};

constexpr uint32_t gc_bit(GeneralCategory g) { return 1u << static_cast<int>(g); }
constexpr uint32_t kAllCategories = (1u << kNumGeneralCategories) - 1;

constexpr const char* kCategoryNames[kNumGeneralCategories] = {
    "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
    "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};

// General_Category names -> masks.
bool category_mask(std::string_view name, uint32_t* mask) {
  using G = GeneralCategory;
  for (int i = 0; i < kNumGeneralCategories; ++i)
    if (name == kCategoryNames[i]) {
      *mask = 1u << i;
      return true;
    }
  const auto group = [](char c) {
    uint32_t m = 0;
    for (int i = 0; i < kNumGeneralCategories; ++i)
      if (kCategoryNames[i][0] == c) m |= 1u << i;
    return m;
  };
  struct Long {
    const char* name;
    char group;
  };
  static const Long kLong[] = {{"L", 'L'},      {"Letter", 'L'}, {"M", 'M'},      {"Mark", 'M'},
                               {"N", 'N'},      {"Number", 'N'}, {"P", 'P'},      {"Punctuation", 'P'},
                               {"S", 'S'},      {"Symbol", 'S'}, {"Z", 'Z'},      {"Separator", 'Z'},
                               {"C", 'C'},      {"Other", 'C'}};
  for (const Long& l : kLong)
    if (name == l.name) {
      *mask = group(l.group);
      return true;
    }
  if (name == "L&" || name == "LC" || name == "Cased_Letter") {
    *mask = gc_bit(G::kLu) | gc_bit(G::kLl) | gc_bit(G::kLt);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------

struct Node {
  enum Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kAtomic, kLook } kind = kEmpty;
  int set = -1;                          // kSet
  std::vector<std::unique_ptr<Node>> kids;
  int min = 0, max = 0;                  // kRepeat; max -1 = unbounded
  enum Mode { kGreedy, kLazy, kPossessive } mode = kGreedy;
  bool negate = false;                   // kLook
};

bool can_be_empty(const Node& n) {
  switch (n.kind) {
    case Node::kEmpty: return true;
    case Node::kSet: return false;
    case Node::kConcat:
      for (const auto& k : n.kids)
        if (!can_be_empty(*k)) return false;
      return true;
    case Node::kAlt:
      for (const auto& k : n.kids)
        if (can_be_empty(*k)) return true;
      return false;
    case Node::kRepeat: return n.min == 0 || can_be_empty(*n.kids[0]);
    case Node::kAtomic: return can_be_empty(*n.kids[0]);
    case Node::kLook: return true;
  }
  return true;
}

class Parser {
 public:
  Parser(std::string_view p, std::vector<CharSet>* sets) : p_(p), sets_(sets) {}

  Result<std::unique_ptr<Node>> parse() {
    auto n = alternation(false);
    if (!n) return n.status();
    if (i_ < p_.size()) return error("an unmatched ')'");
    return n;
  }

 private:
  Status error(std::string_view what) const {
    return Status::invalid(fmt::format("pre-tokenisation pattern \"{}\": at byte {}: {}", p_, i_, what));
  }
  bool eof() const { return i_ >= p_.size(); }
  char peek() const { return p_[i_]; }

  Result<std::unique_ptr<Node>> alternation(bool icase) {
    std::vector<std::unique_ptr<Node>> alts;
    for (;;) {
      auto c = concat(icase);
      if (!c) return c.status();
      alts.push_back(std::move(*c));
      if (!eof() && peek() == '|') {
        ++i_;
        continue;
      }
      break;
    }
    if (alts.size() == 1) return std::move(alts[0]);
    auto n = std::make_unique<Node>();
    n->kind = Node::kAlt;
    n->kids = std::move(alts);
    return n;
  }

  Result<std::unique_ptr<Node>> concat(bool icase) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kConcat;
    while (!eof() && peek() != '|' && peek() != ')') {
      auto a = atom(icase);
      if (!a) return a.status();
      auto q = quantified(std::move(*a));
      if (!q) return q.status();
      n->kids.push_back(std::move(*q));
    }
    if (n->kids.empty()) n->kind = Node::kEmpty;
    if (n->kids.size() == 1) return std::move(n->kids[0]);
    return n;
  }

  bool read_int(int* v) {
    size_t k = i_;
    int64_t x = 0;
    while (k < p_.size() && p_[k] >= '0' && p_[k] <= '9' && x < 100000) x = x * 10 + (p_[k++] - '0');
    if (k == i_) return false;
    *v = static_cast<int>(x);
    i_ = k;
    return true;
  }

  Result<std::unique_ptr<Node>> quantified(std::unique_ptr<Node> a) {
    while (!eof()) {
      const size_t at = i_;
      int min, max;
      const char c = peek();
      if (c == '?') min = 0, max = 1, ++i_;
      else if (c == '*') min = 0, max = -1, ++i_;
      else if (c == '+') min = 1, max = -1, ++i_;
      else if (c == '{') {
        ++i_;
        if (!read_int(&min)) return error("a number after '{' (counted repetition {n}, {n,} or {n,m})");
        max = min;
        if (!eof() && peek() == ',') {
          ++i_;
          if (!read_int(&max)) max = -1;
        }
        if (eof() || peek() != '}') return error("'}' closing the counted repetition");
        ++i_;
        if (max >= 0 && max < min) return error("a repetition {n,m} with m < n");
        if (min > 1000 || max > 1000) return error("a repetition count of at most 1000");
      } else {
        break;
      }
      if (a->kind == Node::kLook || a->kind == Node::kEmpty) {
        i_ = at;
        return error("a quantifier after something that can repeat (it follows an empty group or a lookahead)");
      }
      auto r = std::make_unique<Node>();
      r->kind = Node::kRepeat;
      r->min = min;
      r->max = max;
      if (!eof() && peek() == '?') r->mode = Node::kLazy, ++i_;
      else if (!eof() && peek() == '+') r->mode = Node::kPossessive, ++i_;
      if (max != 1 && can_be_empty(*a)) {
        i_ = at;
        return error("a repeated group that can match the empty string (not supported)");
      }
      r->kids.push_back(std::move(a));
      if (r->mode == Node::kPossessive && r->kids[0]->kind != Node::kSet) {
        // X*+ is (?>X*): the VM's possessive repeat handles single sets only.
        r->mode = Node::kGreedy;
        auto atomic = std::make_unique<Node>();
        atomic->kind = Node::kAtomic;
        atomic->kids.push_back(std::move(r));
        a = std::move(atomic);
      } else {
        a = std::move(r);
      }
    }
    return a;
  }

  int add_set(CharSet s) {
    s.finish();
    sets_->push_back(std::move(s));
    return static_cast<int>(sets_->size()) - 1;
  }
  std::unique_ptr<Node> set_node(CharSet s) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->set = add_set(std::move(s));
    return n;
  }

  // One UTF-8 character of the pattern.
  Result<char32_t> literal_char() {
    const auto* b = reinterpret_cast<const unsigned char*>(p_.data());
    const Utf8Char ch = decode_utf8(b + i_, b + p_.size());
    if (!ch.valid) return error("valid UTF-8");
    i_ += ch.len;
    return ch.cp;
  }

  // Adds a literal character to *s, with its case variants under (?i).
  Status add_literal(char32_t c, bool icase, CharSet* s) {
    s->ranges.push_back({c, c});
    if (!icase) return Status::ok();
    if (c < 128 && ((c | 32) >= 'a' && (c | 32) <= 'z')) {
      s->ranges.push_back({c ^ 32, c ^ 32});
      if ((c | 32) == 's') s->ranges.push_back({0x17F, 0x17F});
      if ((c | 32) == 'k') s->ranges.push_back({0x212A, 0x212A});
      return Status::ok();
    }
    if (c >= 128 && (general_category(c) == GeneralCategory::kLu || general_category(c) == GeneralCategory::kLl ||
                     general_category(c) == GeneralCategory::kLt))
      return error("a case-insensitive group holding only ASCII letters (non-ASCII case folding is not supported)");
    return Status::ok();
  }

  // An escape after '\': either one character (*single, *cp; not added to
  // *s) or a class, added to *s.
  Status escape(CharSet* s, bool* single, char32_t* cp) {
    *single = false;
    if (eof()) return error("a character after '\\'");
    const char c = peek();
    ++i_;
    auto one = [&](char32_t v) {
      *single = true;
      *cp = v;
      return Status::ok();
    };
    switch (c) {
      case 'r': return one('\r');
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'e': return one(0x1B);
      case 'a': return one(0x07);
      case '0': return one(0);
      case 's': s->white_space = true; return Status::ok();
      case 'S': s->not_white_space = true; return Status::ok();
      case 'd': s->gc_mask |= gc_bit(GeneralCategory::kNd); return Status::ok();
      case 'D': s->gc_mask |= kAllCategories & ~gc_bit(GeneralCategory::kNd); return Status::ok();
      case 'p':
      case 'P': {
        std::string name;
        if (!eof() && peek() == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) return error("'}' closing \\p{...}");
          name = std::string(p_.substr(i_ + 1, close - i_ - 1));
          i_ = close + 1;
        } else if (!eof()) {
          name = std::string(1, peek());
          ++i_;
        }
        uint32_t mask;
        if (!category_mask(name, &mask))
          return error(fmt::format("a General_Category name in \\{}{{{}}} (scripts and other properties are not "
                                   "supported)", c, name));
        s->gc_mask |= c == 'p' ? mask : kAllCategories & ~mask;
        return Status::ok();
      }
      default:
        --i_;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
          return error(fmt::format("a supported escape (\\{} is not supported)", c));
        {
          auto v = literal_char();
          if (!v) return v.status();
          return one(*v);
        }
    }
  }

  Result<std::unique_ptr<Node>> char_class(bool icase) {
    ++i_;  // '['
    CharSet s;
    if (!eof() && peek() == '^') {
      s.negated = true;
      ++i_;
    }
    bool first = true;
    for (;;) {
      if (eof()) return error("']' closing the character class");
      const char c = peek();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '[') return error("no nested '[' in a character class (not supported)");
      if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&') return error("no class intersection '&&' (not supported)");
      char32_t lo;
      if (c == '\\') {
        ++i_;
        bool single;
        Status st = escape(&s, &single, &lo);
        if (!st) return st;
        if (!single) continue;
      } else {
        auto cp = literal_char();
        if (!cp) return cp.status();
        lo = *cp;
      }
      char32_t hi = lo;
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (peek() == '\\') {
          ++i_;
          CharSet tmp;
          bool one;
          Status st = escape(&tmp, &one, &hi);
          if (!st) return st;
          if (!one) return error("a single character ending the range");
        } else {
          auto cp = literal_char();
          if (!cp) return cp.status();
          hi = *cp;
        }
        if (hi < lo) return error("a range a-b with a <= b");
        if (icase) return error("no ranges in a case-insensitive class (not supported)");
        s.ranges.push_back({lo, hi});
      } else {
        Status st = add_literal(lo, icase, &s);
        if (!st) return st;
      }
    }
    return set_node(std::move(s));
  }

  Result<std::unique_ptr<Node>> atom(bool icase) {
    const char c = peek();
    if (c == '(') {
      ++i_;
      Node::Kind kind = Node::kConcat;
      bool negate = false, inner_icase = icase;
      if (!eof() && peek() == '?') {
        ++i_;
        if (eof()) return error("a group kind after '(?'");
        const char k = peek();
        if (k == ':') ++i_;
        else if (k == '=' || k == '!') kind = Node::kLook, negate = k == '!', ++i_;
        else if (k == '>') kind = Node::kAtomic, ++i_;
        else if (k == 'i' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') inner_icase = true, i_ += 2;
        else return error("':', '=', '!', '>' or 'i:' after '(?' (other group kinds and flags are not supported)");
      }
      auto inner = alternation(inner_icase);
      if (!inner) return inner.status();
      if (eof() || peek() != ')') return error("')' closing the group");
      ++i_;
      if (kind == Node::kConcat) return inner;
      auto n = std::make_unique<Node>();
      n->kind = kind;
      n->negate = negate;
      n->kids.push_back(std::move(*inner));
      return n;
    }
    if (c == '[') return char_class(icase);
    if (c == '*' || c == '+' || c == '?' || c == '{') return error("something to repeat before the quantifier");
    if (c == '^' || c == '$') return error("no anchors ^ or $ (not supported)");
    CharSet s;
    if (c == '.') {
      ++i_;
      s.ranges = {{0, '\n' - 1}, {'\n' + 1, 0x10FFFF}, {kInvalidBase, kInvalidBase + 255}};
      return set_node(std::move(s));
    }
    if (c == '\\') {
      ++i_;
      bool single;
      char32_t cp;
      Status st = escape(&s, &single, &cp);
      if (!st) return st;
      if (single) st = add_literal(cp, icase, &s);
      if (!st) return st;
      return set_node(std::move(s));
    }
    auto cp = literal_char();
    if (!cp) return cp.status();
    Status st = add_literal(*cp, icase, &s);
    if (!st) return st;
    return set_node(std::move(s));
  }

  std::string_view p_;
  size_t i_ = 0;
  std::vector<CharSet>* sets_;
};

// ---------------------------------------------------------------------------
// Program: a backtracking VM
// ---------------------------------------------------------------------------

struct Inst {
  enum Op : uint8_t { kSet, kRep, kSplit, kJmp, kAtomic, kLook, kMatch } op;
  uint8_t mode = 0;  // kRep: Node::Mode; kLook: negate; kSplit: 1 when `first` filters branch x
  int32_t x = 0, y = 0;    // kSet/kRep: set; kSplit: first, second; kJmp: target; kAtomic/kLook: program
  int32_t min = 0, max = 0;  // kRep (max -1: unbounded)
  // kSplit with mode 1: the ASCII characters branch x can start with; an
  // ASCII character (or the end) outside it goes straight to y.
  std::array<uint64_t, 2> first{};
};

// The ASCII characters a match of n can start with, and whether n can match
// without consuming (then nothing may be filtered: *nullable).
void first_ascii(const Node& n, const std::vector<CharSet>& sets, std::array<uint64_t, 2>* out, bool* nullable) {
  *nullable = false;
  switch (n.kind) {
    case Node::kEmpty:
    case Node::kLook: *nullable = true; return;
    case Node::kSet:
      (*out)[0] |= sets[n.set].ascii[0];
      (*out)[1] |= sets[n.set].ascii[1];
      return;
    case Node::kConcat:
      for (const auto& k : n.kids) {
        bool kn;
        first_ascii(*k, sets, out, &kn);
        if (!kn) return;
      }
      *nullable = true;
      return;
    case Node::kAlt:
      for (const auto& k : n.kids) {
        bool kn;
        first_ascii(*k, sets, out, &kn);
        *nullable |= kn;
      }
      return;
    case Node::kRepeat:
    case Node::kAtomic: {
      bool kn;
      first_ascii(*n.kids[0], sets, out, &kn);
      *nullable = kn || (n.kind == Node::kRepeat && n.min == 0);
      return;
    }
  }
}

}  // namespace

struct PretokRegex::Program {
  std::string pattern;
  bool empty_ok = false;
  std::vector<CharSet> sets;
  std::vector<std::vector<Inst>> progs;  // 0: the pattern; others: atomic groups and lookaheads

  int compile_sub(const Node& n) {
    progs.emplace_back();
    const int id = static_cast<int>(progs.size()) - 1;
    std::vector<Inst> code;
    emit(n, &code);
    code.push_back(Inst{Inst::kMatch});
    progs[id] = std::move(code);
    return id;
  }

  void emit(const Node& n, std::vector<Inst>* code) {
    auto at = [&] { return static_cast<int32_t>(code->size()); };
    switch (n.kind) {
      case Node::kEmpty: return;
      case Node::kSet: code->push_back(Inst{Inst::kSet, 0, n.set}); return;
      case Node::kConcat:
        for (const auto& k : n.kids) emit(*k, code);
        return;
      case Node::kAlt: {
        // split L1, next; L1: a; jmp end; next: split L2, next2; ...
        std::vector<int32_t> jumps;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i + 1 < n.kids.size()) {
            const int32_t split = at();
            Inst in{Inst::kSplit, 0, split + 1, 0};
            bool nullable;
            first_ascii(*n.kids[i], sets, &in.first, &nullable);
            in.mode = nullable ? 0 : 1;
            code->push_back(in);
            emit(*n.kids[i], code);
            jumps.push_back(at());
            code->push_back(Inst{Inst::kJmp});
            (*code)[split].y = at();
          } else {
            emit(*n.kids[i], code);
          }
        }
        for (int32_t j : jumps) (*code)[j].x = at();
        return;
      }
      case Node::kAtomic: {
        const int sub = compile_sub(*n.kids[0]);
        code->push_back(Inst{Inst::kAtomic, 0, sub});
        return;
      }
      case Node::kLook: {
        const int sub = compile_sub(*n.kids[0]);
        code->push_back(Inst{Inst::kLook, static_cast<uint8_t>(n.negate), sub});
        return;
      }
      case Node::kRepeat: {
        const Node& k = *n.kids[0];
        if (k.kind == Node::kSet) {
          code->push_back(Inst{Inst::kRep, static_cast<uint8_t>(n.mode), k.set, 0, n.min, n.max});
          return;
        }
        const bool lazy = n.mode == Node::kLazy;
        for (int i = 0; i < n.min; ++i) emit(k, code);
        if (n.max < 0) {
          // L0: split L1, L3; L1: k; jmp L0; L3:
          const int32_t l0 = at();
          code->push_back(Inst{Inst::kSplit});
          emit(k, code);
          code->push_back(Inst{Inst::kJmp, 0, l0});
          const int32_t l1 = l0 + 1, l3 = at();
          (*code)[l0].x = lazy ? l3 : l1;
          (*code)[l0].y = lazy ? l1 : l3;
          return;
        }
        std::vector<int32_t> splits;
        for (int i = n.min; i < n.max; ++i) {
          splits.push_back(at());
          code->push_back(Inst{Inst::kSplit});
          emit(k, code);
        }
        const int32_t end = at();
        for (int32_t s : splits) {
          (*code)[s].x = lazy ? end : s + 1;
          (*code)[s].y = lazy ? s + 1 : end;
        }
        return;
      }
    }
  }

  // Backtracking: entries are (pc, pos) to resume, or a greedy/lazy
  // repetition's remaining choices.
  struct Frame {
    int32_t pc;
    int32_t kind;  // 0 resume; 1 greedy: pos down to lo; 2 lazy: from pos up (lo = start)
    int64_t pos, lo;
  };

  int64_t run(int prog_id, const char32_t* cps, int64_t n, int64_t start, std::vector<Frame>* stack) const {
    const std::vector<Inst>& code = progs[prog_id];
    const size_t base = stack->size();
    int32_t pc = 0;
    int64_t pos = start;
    for (;;) {
      const Inst& in = code[pc];
      bool fail = false;
      switch (in.op) {
        case Inst::kSet:
          if (pos < n && sets[in.x].contains(cps[pos])) ++pos, ++pc;
          else fail = true;
          break;
        case Inst::kRep: {
          const CharSet& s = sets[in.x];
          if (in.mode == Node::kLazy) {
            int64_t k = 0;
            while (k < in.min && pos + k < n && s.contains(cps[pos + k])) ++k;
            if (k < in.min) {
              fail = true;
              break;
            }
            const int64_t begin = pos;
            pos += k;
            if (in.max < 0 || k < in.max) stack->push_back(Frame{pc, 2, pos, begin});
            ++pc;
            break;
          }
          int64_t k = 0;
          const int64_t limit = in.max < 0 ? n - pos : std::min<int64_t>(in.max, n - pos);
          while (k < limit && s.contains(cps[pos + k])) ++k;
          if (k < in.min) {
            fail = true;
            break;
          }
          if (in.mode == Node::kGreedy && k > in.min) stack->push_back(Frame{pc + 1, 1, pos + k - 1, pos + in.min});
          pos += k;
          ++pc;
          break;
        }
        case Inst::kSplit:
          if (in.mode == 1) {  // skip a branch that cannot start here
            const char32_t c = pos < n ? cps[pos] : 0;
            if (pos >= n || (c < 128 && !((in.first[c >> 6] >> (c & 63)) & 1u))) {
              pc = in.y;
              break;
            }
          }
          stack->push_back(Frame{in.y, 0, pos, 0});
          pc = in.x;
          break;
        case Inst::kJmp: pc = in.x; break;
        case Inst::kAtomic: {
          const int64_t e = run(in.x, cps, n, pos, stack);
          if (e < 0) fail = true;
          else pos = e, ++pc;
          break;
        }
        case Inst::kLook: {
          const bool m = run(in.x, cps, n, pos, stack) >= 0;
          if (m == static_cast<bool>(in.mode)) fail = true;
          else ++pc;
          break;
        }
        case Inst::kMatch: stack->resize(base); return pos;
      }
      if (!fail) continue;
      // Backtrack.
      for (;;) {
        if (stack->size() == base) return -1;
        Frame& f = stack->back();
        if (f.kind == 0) {
          pc = f.pc;
          pos = f.pos;
          stack->pop_back();
          break;
        }
        if (f.kind == 1) {  // greedy: try one character fewer
          pc = f.pc;
          pos = f.pos;
          if (f.pos > f.lo) --f.pos;
          else stack->pop_back();
          break;
        }
        // lazy: try one character more
        const Inst& rep = code[f.pc];
        const int64_t k = f.pos - f.lo;
        if ((rep.max >= 0 && k >= rep.max) || f.pos >= n || !sets[rep.x].contains(cps[f.pos])) {
          stack->pop_back();
          continue;
        }
        ++f.pos;
        pc = f.pc + 1;
        pos = f.pos;
        break;
      }
    }
  }
};

PretokRegex::PretokRegex(std::unique_ptr<Program> p) : prog_(std::move(p)) {}
PretokRegex::PretokRegex(PretokRegex&&) noexcept = default;
PretokRegex& PretokRegex::operator=(PretokRegex&&) noexcept = default;
PretokRegex::~PretokRegex() = default;

const std::string& PretokRegex::pattern() const { return prog_->pattern; }
bool PretokRegex::can_match_empty() const { return prog_->empty_ok; }

Result<PretokRegex> PretokRegex::compile(std::string_view pattern) {
  auto prog = std::make_unique<Program>();
  prog->pattern = std::string(pattern);
  Parser parser(pattern, &prog->sets);
  auto root = parser.parse();
  if (!root) return root.status();
  prog->empty_ok = can_be_empty(**root);
  prog->compile_sub(**root);
  return PretokRegex(std::move(prog));
}

void PretokRegex::decode(std::string_view text, std::vector<char32_t>* cps, std::vector<uint32_t>* offs) {
  cps->clear();
  offs->clear();
  cps->reserve(text.size());
  offs->reserve(text.size() + 1);
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const auto* e = b + text.size();
  const auto* p = b;
  while (p < e) {
    offs->push_back(static_cast<uint32_t>(p - b));
    if (*p < 0x80) {
      cps->push_back(*p++);
      continue;
    }
    const Utf8Char ch = decode_utf8(p, e);
    cps->push_back(ch.valid ? ch.cp : kInvalidBase + ch.cp);
    p += ch.len;
  }
  offs->push_back(static_cast<uint32_t>(text.size()));
}

int64_t PretokRegex::match_cps(const char32_t* cps, int64_t n, int64_t pos) const {
  thread_local std::vector<Program::Frame> stack;
  stack.clear();
  return prog_->run(0, cps, n, pos, &stack);
}

size_t PretokRegex::match_at(std::string_view text, size_t pos) const {
  std::vector<char32_t> cps;
  std::vector<uint32_t> offs;
  decode(text, &cps, &offs);
  const auto it = std::lower_bound(offs.begin(), offs.end(), static_cast<uint32_t>(pos));
  if (it == offs.end() || *it != pos || pos >= text.size()) return std::string_view::npos;
  const int64_t start = it - offs.begin();
  const int64_t end = match_cps(cps.data(), static_cast<int64_t>(cps.size()), start);
  if (end <= start) return std::string_view::npos;
  return offs[end];
}

}  // namespace mt::data
