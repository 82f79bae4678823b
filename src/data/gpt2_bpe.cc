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

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

namespace {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

// The first min(n, 8) bytes of p as a little-endian integer, zero-padded,
// without reading past p + n.
inline uint64_t load_head(const char* p, size_t n) {
  uint64_t w = 0;
  if (n >= 8) {
    std::memcpy(&w, p, 8);
    return w;
  }
  unsigned shift = 0;
  if (n & 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    w = v;
    p += 4;
    shift = 32;
  }
  if (n & 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    w |= static_cast<uint64_t>(v) << shift;
    p += 2;
    shift += 16;
  }
  if (n & 1) w |= static_cast<uint64_t>(static_cast<unsigned char>(*p)) << shift;
  return w;
}

// Hash of a byte string whose head (load_head) is already known.
inline uint64_t hash_bytes(const char* p, size_t n, uint64_t head) {
  uint64_t h = (head ^ (n * 0xFF51AFD7ED558CCDull)) * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 8; i < n; i += 8) {
    const uint64_t w = load_head(p + i, n - i);
    h = ((h ^ (h >> 29)) ^ w) * 0xC2B2AE3D27D4EB4Full;
  }
  return mix64(h);
}

inline uint64_t hash_bytes(const char* p, size_t n) { return hash_bytes(p, n, load_head(p, n)); }

// Token bytes -> id: open addressing. Each slot keeps the token's length and
// first 8 bytes, so most lookups (pieces average ~5 bytes) touch one slot
// and no other memory.
class BytesMap {
 public:
  void build(const std::string* arena, const std::vector<uint32_t>* off) {
    arena_ = arena;
    off_ = off;
    const size_t n = off->size() - 1;
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, 0, -1});
    for (size_t id = 0; id < n; ++id) {
      const std::string_view b = bytes(static_cast<int32_t>(id));
      const uint64_t head = load_head(b.data(), b.size());
      size_t i = hash_bytes(b.data(), b.size(), head) & mask_;
      while (slots_[i].id >= 0) i = (i + 1) & mask_;
      slots_[i] = Slot{head, static_cast<uint32_t>(b.size()), static_cast<int32_t>(id)};
    }
  }
  int32_t find(std::string_view key) const {
    const uint64_t head = load_head(key.data(), key.size());
    return find(key, head, hash_bytes(key.data(), key.size(), head));
  }
  // Starts loading the slot a key with hash h would probe first.
  void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }
  int32_t find(std::string_view key, uint64_t head, uint64_t h) const {
    const uint32_t len = static_cast<uint32_t>(key.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.head == head && s.len == len &&
          (len <= 8 || std::memcmp(arena_->data() + (*off_)[s.id] + 8, key.data() + 8, len - 8) == 0))
        return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t head;
    uint32_t len;
    int32_t id;
  };
  std::string_view bytes(int32_t id) const {
    return std::string_view(*arena_).substr((*off_)[id], (*off_)[id + 1] - (*off_)[id]);
  }
  const std::string* arena_ = nullptr;
  const std::vector<uint32_t>* off_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id).
class MergeMap {
 public:
  static constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
  }
  // Later inserts of the same pair overwrite (a repeated merge keeps its last rank).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t key = pack(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, rank, merged};
        return;
      }
    }
  }
  void prefetch(int32_t a, int32_t b) const { __builtin_prefetch(&slots_[mix64(pack(a, b)) & mask_]); }
  // Rank of merging a,b (kNone if they do not merge); *merged gets the result.
  inline int32_t find(int32_t a, int32_t b, int32_t* merged) const {
    const uint64_t key = pack(a, b);
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *merged = s.merged;
        return s.rank;
      }
      if (s.key == kEmpty) return kNone;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// GPT-2's byte <-> printable-character alphabet (bytes_to_unicode): the
// printable Latin-1 bytes stand for themselves, the other 68 bytes map to
// U+0100 onwards in byte order.
struct ByteAlphabet {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};
  ByteAlphabet() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// A token string in GPT-2's alphabet -> its bytes; false if a character is
// not in the alphabet (*bad gets it).
bool alphabet_to_bytes(std::string_view s, std::string* out, char32_t* bad) {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const Utf8Char ch = decode_utf8(p, end);
    if (!ch.valid || ch.cp >= 512 || alphabet().to_byte[ch.cp] < 0) {
      *bad = ch.cp;
      return false;
    }
    out->push_back(static_cast<char>(alphabet().to_byte[ch.cp]));
    p += ch.len;
  }
  return true;
}

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

// ---------------------------------------------------------------------------
// Per-thread cache of BPE results for pieces that are not whole tokens.
// ---------------------------------------------------------------------------

constexpr size_t kCacheMaxPiece = 256;    // longer pieces are not cached
constexpr size_t kCacheSlots = 1 << 16;   // cleared when half full

std::atomic<uint64_t> g_next_instance{1};

class PieceCache {
 public:
  void reset(uint64_t owner) {
    owner_ = owner;
    clear();
  }
  uint64_t owner() const { return owner_; }
  // Appends the cached ids of `piece` to *out; false if absent.
  bool lookup(std::string_view piece, uint64_t head, uint64_t h, std::vector<int32_t>* out) const {
    if (slots_.empty()) return false;
    const uint32_t tag = static_cast<uint32_t>(h >> 32) | 1u;
    for (size_t i = h & (kCacheSlots - 1);; i = (i + 1) & (kCacheSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.tag == 0) return false;
      if (s.tag == tag && s.head == head && s.key_len == piece.size() &&
          (piece.size() <= 8 ||
           std::memcmp(keys_.data() + s.key_off + 8, piece.data() + 8, piece.size() - 8) == 0)) {
        const int32_t* ids = ids_.data() + s.ids_off;
        out->insert(out->end(), ids, ids + s.n_ids);
        return true;
      }
    }
  }
  void insert(std::string_view piece, uint64_t head, uint64_t h, const int32_t* ids, size_t n) {
    if (slots_.empty()) slots_.assign(kCacheSlots, Slot{});
    if (used_ >= kCacheSlots / 2) clear();
    const uint32_t tag = static_cast<uint32_t>(h >> 32) | 1u;
    size_t i = h & (kCacheSlots - 1);
    while (slots_[i].tag != 0) i = (i + 1) & (kCacheSlots - 1);
    slots_[i] = Slot{head, tag, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                     static_cast<uint16_t>(piece.size()), static_cast<uint16_t>(n)};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }

 private:
  struct Slot {
    uint64_t head = 0;  // first 8 bytes of the piece
    uint32_t tag = 0;   // 0 = empty
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, n_ids = 0;
  };
  void clear() {
    if (!slots_.empty()) std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  uint64_t owner_ = 0;
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
};

PieceCache& thread_cache(uint64_t owner) {
  thread_local PieceCache cache;
  if (cache.owner() != owner) cache.reset(owner);
  return cache;
}

}  // namespace

// ---------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------

struct Gpt2BpeTokenizer::Impl {
  std::string arena;              // all token bytes
  std::vector<uint32_t> off;      // token id -> offset in arena (size V + 1)
  BytesMap vocab;                 // bytes -> id
  MergeMap merges;                // (a, b) -> (rank, merged)
  std::array<int32_t, 256> byte_id{};
  std::vector<uint8_t> whole_ok;  // id -> its own bytes BPE to exactly [id]
  uint64_t instance = 0;

  std::string_view bytes(int32_t id) const {
    return std::string_view(arena).substr(off[id], off[id + 1] - off[id]);
  }
  int64_t size() const { return static_cast<int64_t>(off.size()) - 1; }

  // BPE of `piece` (>= 2 bytes), appended to *out.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const {
    constexpr size_t kSmall = 96;
    const size_t n = piece.size();
    if (n > kSmall) return bpe_heap(piece, out);
    int32_t ids[kSmall], rank[kSmall], merged[kSmall];
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[static_cast<unsigned char>(piece[i])];
    size_t m = n;
    // The first lookups are independent: start all their loads at once.
    for (size_t i = 0; i + 1 < m; ++i) merges.prefetch(ids[i], ids[i + 1]);
    for (size_t i = 0; i + 1 < m; ++i) rank[i] = merges.find(ids[i], ids[i + 1], &merged[i]);
    rank[m - 1] = MergeMap::kNone;
    while (m > 1) {
      // Lowest rank, leftmost on ties (equal rank = the same pair).
      size_t best = 0;
      int32_t r = rank[0];
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < r) {
          r = rank[i];
          best = i;
        }
      if (r == MergeMap::kNone) break;
      ids[best] = merged[best];
      const size_t tail = m - best - 2;
      std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
      std::memmove(rank + best + 1, rank + best + 2, tail * sizeof(int32_t));
      std::memmove(merged + best + 1, merged + best + 2, tail * sizeof(int32_t));
      --m;
      rank[m - 1] = MergeMap::kNone;
      if (best + 1 < m) rank[best] = merges.find(ids[best], ids[best + 1], &merged[best]);
      else rank[best] = MergeMap::kNone;
      if (best > 0) rank[best - 1] = merges.find(ids[best - 1], ids[best], &merged[best - 1]);
    }
    out->insert(out->end(), ids, ids + m);
  }

  // O(n log n) BPE for long pieces: a linked list of symbols and a heap of
  // candidate merges ordered by (rank, position); stale entries are skipped.
  void bpe_heap(std::string_view piece, std::vector<int32_t>* out) const {
    const size_t n = piece.size();
    std::vector<int32_t> id(n), next(n), prev(n);
    for (size_t i = 0; i < n; ++i) {
      id[i] = byte_id[static_cast<unsigned char>(piece[i])];
      next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
      prev[i] = static_cast<int32_t>(i) - 1;
    }
    using Entry = std::pair<uint64_t, uint64_t>;  // (rank << 32 | pos, merged)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](int32_t i) {
      if (i < 0 || next[i] < 0) return;
      int32_t m;
      const int32_t r = merges.find(id[i], id[next[i]], &m);
      if (r != MergeMap::kNone)
        heap.push({(static_cast<uint64_t>(r) << 32) | static_cast<uint32_t>(i), static_cast<uint32_t>(m)});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
      const auto [key, m] = heap.top();
      heap.pop();
      const int32_t i = static_cast<int32_t>(key & 0xFFFFFFFFu);
      const int32_t r = static_cast<int32_t>(key >> 32);
      if (id[i] < 0 || next[i] < 0) continue;
      int32_t cur;
      if (merges.find(id[i], id[next[i]], &cur) != r) continue;  // the pair changed
      const int32_t j = next[i];
      id[i] = static_cast<int32_t>(m);
      id[j] = -1;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
  }
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
    if (!alphabet_to_bytes(it.key(), &bytes, &bad))
      return Status::corrupt(fmt::format(
          "{}: entry \"{}\" (id {}) has character U+{:04X}, which is not in GPT-2's byte alphabet", vocab_name,
          printable(it.key()), id, static_cast<uint32_t>(bad)));
    tok[id] = bytes;
  }
  impl->off.resize(V + 1);
  for (size_t id = 0; id < V; ++id) {
    impl->off[id] = static_cast<uint32_t>(impl->arena.size());
    impl->arena += tok[id];
  }
  impl->off[V] = static_cast<uint32_t>(impl->arena.size());
  impl->vocab.build(&impl->arena, &impl->off);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    impl->byte_id[b] = impl->vocab.find(std::string_view(&c, 1));
    if (impl->byte_id[b] < 0)
      return Status::corrupt(fmt::format("{}: no token for the single byte 0x{:02x} (character U+{:04X})",
                                         vocab_name, b, static_cast<uint32_t>(alphabet().to_cp[b])));
  }
  const int32_t eod = impl->vocab.find("<|endoftext|>");
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
    if (!alphabet_to_bytes(parts[0], &left, &bad) || !alphabet_to_bytes(parts[1], &right, &bad))
      return Status::corrupt(fmt::format("{}: line {}: character U+{:04X} is not in GPT-2's byte alphabet",
                                         merge_name, line_no, static_cast<uint32_t>(bad)));
    const int32_t a = impl->vocab.find(left), b = impl->vocab.find(right);
    const int32_t m = impl->vocab.find(left + right);
    if (a < 0 || b < 0 || m < 0) {
      const std::string missing = a < 0 ? std::string(parts[0]) : b < 0 ? std::string(parts[1])
                                                                        : std::string(parts[0]) + std::string(parts[1]);
      return Status::corrupt(fmt::format("{}: line {}: \"{}\" is not in the vocabulary ({})", merge_name, line_no,
                                         printable(missing), vocab_name));
    }
    list.push_back({a, b, m});
  }
  if (list.empty()) return Status::corrupt(fmt::format("{}: no merges", merge_name));
  impl->merges.reserve(list.size());
  for (size_t r = 0; r < list.size(); ++r)
    impl->merges.insert(list[r][0], list[r][1], static_cast<int32_t>(r), list[r][2]);

  // A whole piece equal to a token is that token only if the token's own BPE
  // gives it back (true for all of GPT-2's; not guaranteed for any files).
  impl->whole_ok.assign(V, 0);
  std::vector<int32_t> ids;
  for (size_t id = 0; id < V; ++id) {
    const std::string_view b = impl->bytes(static_cast<int32_t>(id));
    if (b.size() <= 1) {
      impl->whole_ok[id] = b.size() == 1;
      continue;
    }
    ids.clear();
    impl->bpe(b, &ids);
    impl->whole_ok[id] = ids.size() == 1 && ids[0] == static_cast<int32_t>(id);
  }
  impl->instance = g_next_instance.fetch_add(1);
  auto t = std::unique_ptr<Gpt2BpeTokenizer>(new Gpt2BpeTokenizer(std::move(impl)));
  t->eod_ = eod;
  return t;
}

int64_t Gpt2BpeTokenizer::vocab_size() const { return impl_->size(); }

std::string_view Gpt2BpeTokenizer::token_bytes(int32_t id) const { return impl_->bytes(id); }

void Gpt2BpeTokenizer::bpe_fast(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out->push_back(impl_->byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  impl_->bpe(piece, out);
}

std::vector<int32_t> Gpt2BpeTokenizer::bpe_reference(std::string_view piece) const {
  // Megatron's loop, on symbol ids: find the lowest-ranked adjacent pair,
  // merge all its occurrences left to right, repeat until nothing merges.
  std::vector<int32_t> word;
  for (unsigned char c : piece) word.push_back(impl_->byte_id[c]);
  while (word.size() > 1) {
    int32_t best = MergeMap::kNone, a = -1, b = -1, m = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      int32_t merged;
      const int32_t r = impl_->merges.find(word[i], word[i + 1], &merged);
      if (r < best) {
        best = r;
        a = word[i];
        b = word[i + 1];
        m = merged;
      }
    }
    if (best == MergeMap::kNone) break;
    std::vector<int32_t> next;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
        next.push_back(m);
        i += 2;
      } else {
        next.push_back(word[i++]);
      }
    }
    word.swap(next);
  }
  return word;
}

void Gpt2BpeTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const {
  const Impl& im = *impl_;
  PieceCache* cache = nullptr;
  // Software-pipelined by one piece: the next piece is found and its
  // vocabulary slot prefetched before the current one is looked up, which
  // hides most of the cache miss on the (2 MB) table.
  struct Piece {
    size_t begin = 0, end = 0;
    uint64_t head = 0, hash = 0;
  };
  auto scan = [&](size_t begin, Piece* p) {
    p->begin = begin;
    p->end = gpt2_piece_end(text, begin);
    const size_t n = p->end - begin;
    if (n > 1) {
      p->head = load_head(text.data() + begin, n);
      p->hash = hash_bytes(text.data() + begin, n, p->head);
      im.vocab.prefetch(p->hash);
    }
  };
  if (text.empty()) return;
  Piece cur, next;
  scan(0, &cur);
  while (cur.begin < text.size()) {
    if (cur.end < text.size()) scan(cur.end, &next);
    else next.begin = text.size();
    const std::string_view piece = text.substr(cur.begin, cur.end - cur.begin);
    if (piece.size() == 1) {
      out->push_back(im.byte_id[static_cast<unsigned char>(piece[0])]);
    } else if (const int32_t id = im.vocab.find(piece, cur.head, cur.hash); id >= 0 && im.whole_ok[id]) {
      out->push_back(id);
    } else if (piece.size() > kCacheMaxPiece) {
      im.bpe(piece, out);
    } else {
      if (cache == nullptr) cache = &thread_cache(im.instance);
      if (!cache->lookup(piece, cur.head, cur.hash, out)) {
        const size_t before = out->size();
        im.bpe(piece, out);
        cache->insert(piece, cur.head, cur.hash, out->data() + before, out->size() - before);
      }
    }
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
  const int64_t V = impl_->size();
  size_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      return Status::invalid(fmt::format("GPT2BPETokenizer: token id {} at position {} is outside the vocabulary [0, {})",
                                         ids[i], i, V));
    total += impl_->off[ids[i] + 1] - impl_->off[ids[i]];
  }
  std::string out;
  out.reserve(total);
  for (int32_t id : ids) out += impl_->bytes(id);
  return out;
}

}  // namespace mt::data
