#pragma once
// Byte-level BPE: the engine GPT2BPETokenizer and TikTokenizer share.
//
// A vocabulary of byte strings (id = index) and a table of merges
// (left id, right id) -> (rank, merged id). A piece of text is split into its
// bytes' tokens, then the adjacent pair of lowest rank (leftmost on ties) is
// merged until no pair merges: the algorithm of tiktoken's byte_pair_merge and
// of Hugging Face tokenizers' BPE (which order candidates by (rank, position)).
// Merges come either from a merges list (GPT-2's merges.txt: rank = line) or
// from a ranked vocabulary (tiktoken: every token of two or more bytes is the
// merge of each of its splits into two tokens, with the token's rank).
//
// A piece equal to a token is looked up whole: always (tiktoken, and Hugging
// Face's ignore_merges), or only where the token's own BPE gives the token
// back (GPT-2, whose tokenizers have no such shortcut; checked at finish()).
// Other pieces go through a per-thread cache of BPE results; BPE itself is an
// O(n^2) scan for short pieces and a heap for long ones. All const methods
// are safe to call from many threads.

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mt::data {

namespace bpe_detail {

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

}  // namespace bpe_detail

// GPT-2's byte-level alphabet (bytes_to_unicode), in which vocab.json,
// merges.txt and Hugging Face tokenizer.json files write byte-level tokens:
// the printable Latin-1 bytes stand for themselves, the other 68 bytes map to
// U+0100 onwards in byte order.
char32_t byte_level_char(uint8_t b);
// A token string in that alphabet -> its bytes; false if a character is not
// in the alphabet (*bad gets it).
bool byte_level_to_bytes(std::string_view s, std::string* out, char32_t* bad);

class BytePairEncoder {
 public:
  enum class WholePiece { kIfBpeAgrees, kAlways };

  // A piece's first 8 bytes and hash, computed once per piece.
  struct Key {
    uint64_t head = 0, hash = 0;
  };
  static Key key(std::string_view piece) {
    Key k;
    k.head = bpe_detail::load_head(piece.data(), piece.size());
    k.hash = bpe_detail::hash_bytes(piece.data(), piece.size(), k.head);
    return k;
  }

  // tokens[id] = the bytes of token id, all distinct and non-empty (the
  // error names `what` and the two ids).
  static Result<std::unique_ptr<BytePairEncoder>> create(std::vector<std::string> tokens, const std::string& what);
  ~BytePairEncoder();

  int64_t size() const;
  std::string_view bytes(int32_t id) const;
  // Id of the token with these bytes, or -1.
  int32_t find(std::string_view b) const;

  // Merges (left, right, merged) in rank order; a repeated pair keeps its last rank.
  void set_merges(const std::vector<std::array<int32_t, 3>>& merges);
  // tiktoken's rule: the ranks are the ids.
  void set_merges_from_ranks();
  // Checks that every byte has a token (the error names `what` and the byte)
  // and sets how a piece equal to a token is encoded. Call once, after the merges.
  Status finish(WholePiece whole, const std::string& what);

  // Token `id` is never a whole piece's lookup result (a vocabulary entry
  // that stands for text BPE cannot produce). Call after finish().
  void never_whole(int32_t id);
  int32_t byte_id(uint8_t b) const;
  // Starts loading the vocabulary slot of a piece (to hide the cache miss
  // while the previous piece is encoded).
  void prefetch(const Key& k) const;
  // Appends the ids of one piece (the fast path: whole lookup, cache, BPE).
  void encode_piece(std::string_view piece, const Key& k, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
    if (!piece.empty()) encode_piece(piece, key(piece), out);
  }
  // BPE of one non-empty piece without the whole lookup or the cache.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  // The textbook loop (Megatron's GPT-2 BPE): find the lowest-ranked adjacent
  // pair, merge all its occurrences left to right, repeat. The reference the
  // fast path is tested against.
  std::vector<int32_t> bpe_reference(std::string_view piece) const;

  struct Impl;

 private:
  explicit BytePairEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
