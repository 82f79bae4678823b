#include "data/byte_bpe.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "data/unicode.h"

namespace mt::data {

using bpe_detail::hash_bytes;
using bpe_detail::load_head;
using bpe_detail::mix64;

namespace {

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

struct BytePairEncoder::Impl {
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
      // Lowest rank, leftmost on ties.
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

namespace {

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

}  // namespace

char32_t byte_level_char(uint8_t b) { return alphabet().to_cp[b]; }

bool byte_level_to_bytes(std::string_view s, std::string* out, char32_t* bad) {
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

BytePairEncoder::BytePairEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BytePairEncoder::~BytePairEncoder() = default;

Result<std::unique_ptr<BytePairEncoder>> BytePairEncoder::create(std::vector<std::string> tokens,
                                                                 const std::string& what) {
  auto impl = std::make_unique<Impl>();
  const size_t V = tokens.size();
  size_t total = 0;
  for (const std::string& t : tokens) total += t.size();
  if (V >= static_cast<size_t>(std::numeric_limits<int32_t>::max()) || total >= (1ull << 32))
    return Status::invalid(fmt::format("{}: {} tokens of {} bytes in all is too large", what, V, total));
  impl->arena.reserve(total);
  impl->off.resize(V + 1);
  for (size_t id = 0; id < V; ++id) {
    if (tokens[id].empty()) return Status::corrupt(fmt::format("{}: token {} is empty", what, id));
    impl->off[id] = static_cast<uint32_t>(impl->arena.size());
    impl->arena += tokens[id];
  }
  impl->off[V] = static_cast<uint32_t>(impl->arena.size());
  impl->vocab.build(&impl->arena, &impl->off);
  for (size_t id = 0; id < V; ++id) {
    const int32_t first = impl->vocab.find(impl->bytes(static_cast<int32_t>(id)));
    if (first != static_cast<int32_t>(id))
      return Status::corrupt(fmt::format("{}: tokens {} and {} have the same bytes", what, first, id));
  }
  impl->byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    impl->byte_id[b] = impl->vocab.find(std::string_view(&c, 1));
  }
  return std::unique_ptr<BytePairEncoder>(new BytePairEncoder(std::move(impl)));
}

int64_t BytePairEncoder::size() const { return impl_->size(); }
std::string_view BytePairEncoder::bytes(int32_t id) const { return impl_->bytes(id); }
int32_t BytePairEncoder::find(std::string_view b) const { return impl_->vocab.find(b); }
int32_t BytePairEncoder::byte_id(uint8_t b) const { return impl_->byte_id[b]; }
void BytePairEncoder::never_whole(int32_t id) { impl_->whole_ok[static_cast<size_t>(id)] = 0; }
void BytePairEncoder::prefetch(const Key& k) const { impl_->vocab.prefetch(k.hash); }

void BytePairEncoder::set_merges(const std::vector<std::array<int32_t, 3>>& merges) {
  impl_->merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)
    impl_->merges.insert(merges[r][0], merges[r][1], static_cast<int32_t>(r), merges[r][2]);
}

void BytePairEncoder::set_merges_from_ranks() {
  const Impl& im = *impl_;
  std::vector<std::array<int32_t, 3>> list;  // (a, b, merged); rank = merged
  for (int32_t id = 0; id < im.size(); ++id) {
    const std::string_view t = im.bytes(id);
    for (size_t k = 1; k < t.size(); ++k) {
      const int32_t a = im.vocab.find(t.substr(0, k));
      if (a < 0) continue;
      const int32_t b = im.vocab.find(t.substr(k));
      if (b >= 0) list.push_back({a, b, id});
    }
  }
  impl_->merges.reserve(list.size());
  for (const auto& m : list) impl_->merges.insert(m[0], m[1], m[2], m[2]);
}

Status BytePairEncoder::finish(WholePiece whole, const std::string& what) {
  Impl& im = *impl_;
  for (int b = 0; b < 256; ++b)
    if (im.byte_id[b] < 0) return Status::corrupt(fmt::format("{}: no token for the single byte 0x{:02x}", what, b));
  const size_t V = static_cast<size_t>(im.size());
  im.whole_ok.assign(V, 0);
  std::vector<int32_t> ids;
  for (size_t id = 0; id < V; ++id) {
    const std::string_view b = im.bytes(static_cast<int32_t>(id));
    if (whole == WholePiece::kAlways || b.size() == 1) {
      // A single byte is its own token whichever id that byte has first.
      im.whole_ok[id] = b.size() > 1 || im.byte_id[static_cast<unsigned char>(b[0])] == static_cast<int32_t>(id);
      continue;
    }
    ids.clear();
    im.bpe(b, &ids);
    im.whole_ok[id] = ids.size() == 1 && ids[0] == static_cast<int32_t>(id);
  }
  im.instance = g_next_instance.fetch_add(1);
  return Status::ok();
}

void BytePairEncoder::encode_piece(std::string_view piece, const Key& k, std::vector<int32_t>* out) const {
  const Impl& im = *impl_;
  if (piece.size() == 1) {
    out->push_back(im.byte_id[static_cast<unsigned char>(piece[0])]);
  } else if (const int32_t id = im.vocab.find(piece, k.head, k.hash); id >= 0 && im.whole_ok[id]) {
    out->push_back(id);
  } else if (piece.size() > kCacheMaxPiece) {
    im.bpe(piece, out);
  } else {
    PieceCache& cache = thread_cache(im.instance);
    if (!cache.lookup(piece, k.head, k.hash, out)) {
      const size_t before = out->size();
      im.bpe(piece, out);
      cache.insert(piece, k.head, k.hash, out->data() + before, out->size() - before);
    }
  }
}

void BytePairEncoder::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out->push_back(impl_->byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  impl_->bpe(piece, out);
}

std::vector<int32_t> BytePairEncoder::bpe_reference(std::string_view piece) const {
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

}  // namespace mt::data
