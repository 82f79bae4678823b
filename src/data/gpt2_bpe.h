#pragma once
// GPT2BPETokenizer: GPT-2's byte-level BPE, as Megatron-LM's
// --tokenizer-type GPT2BPETokenizer and tiktoken's `gpt2` encoding.
//
//   text --pre-tokenise--> pieces --bytes--> BPE merges by rank --> ids
//
// Pre-tokenisation is GPT-2's pattern, written out by hand (no regex engine):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \p{L}, \p{N} and \s from the Unicode 15.0 tables in data/unicode.h.
// `<|endoftext|>` (id 50256 in GPT-2's vocabulary) is the EOD; inside text it
// is ordinary text (7 tokens), as Megatron-LM 23.06's own GPT-2 tokenizer does
// (../shared/testdata/megatron-preprocess is its output) and as tiktoken does
// when special tokens are not allowed. [changed] Megatron-Core's newer
// tokenizer path wraps Hugging Face's GPT2TokenizerFast, which turns the
// literal string into 50256; that is not reproduced.
//
// Files: vocab.json (GPT-2's encoder.json) maps token strings, written with
// GPT-2's byte-to-unicode alphabet, to ids; merges.txt (vocab.bpe) lists the
// merges by rank, after a `#version` line. As Hugging Face's tokenizers (what
// Megatron-Core's GPT2BPETokenizer wraps): every other non-blank line is one
// merge `a b`, a merge whose result is not in the vocabulary is an error, and
// a repeated merge keeps its last rank. (Megatron 23.06 read the file with
// split('\n')[1:-1]: the same merges for any file that starts with the
// `#version` line and ends with a newline, as GPT-2's does.)
// vocab.json's ids must be 0..size-1, each once; vocab_size() is its size.
//
// Invalid UTF-8: encode() accepts any bytes. A byte that does not start a valid
// UTF-8 sequence (strict, as Python's codec) counts as one character of class
// "other" for the pattern and keeps its own byte in BPE, so
// decode(encode(x)) == x for every byte string x. Megatron never gets that far:
// preprocess_data.py opens the input with encoding='utf-8' and stops with
// UnicodeDecodeError, and a JSON escape of an unpaired surrogate (\ud800) stops
// it with UnicodeEncodeError in the tokenizer; `megatron preprocess` rejects
// both while reading JSONL (data/jsonl.h). encode_checked() gives the same
// verdict for direct callers.
//
// Speed: a piece that is a vocabulary entry whose own BPE is that entry (all
// of GPT-2's but <|endoftext|>; checked at load) is looked up whole, with the
// next piece's slot prefetched; other pieces go through a per-thread cache of
// BPE results; BPE itself is an O(n^2) scan for short pieces and a heap for
// long ones. encode() is const and safe to call from many threads.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

// Calls fn(piece) for each piece of GPT-2's pre-tokenisation of `text`, in
// order; the pieces concatenate to `text`.
template <typename Fn>
void gpt2_pretokenize(std::string_view text, Fn&& fn);

// Byte offset where the piece starting at `pos` ends (REQUIRES: pos < text.size()).
size_t gpt2_piece_end(std::string_view text, size_t pos);

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  // Errors name the flag (--vocab-file / --merge-file), the file and the entry
  // or line at fault.
  static Result<std::unique_ptr<Gpt2BpeTokenizer>> load(const std::string& vocab_file,
                                                        const std::string& merge_file);
  // From the files' contents; `vocab_name`/`merge_name` are used in messages.
  static Result<std::unique_ptr<Gpt2BpeTokenizer>> from_strings(std::string_view vocab_json,
                                                                std::string_view merges_txt,
                                                                const std::string& vocab_name,
                                                                const std::string& merge_name);
  ~Gpt2BpeTokenizer() override;

  void encode(std::string_view text, std::vector<int32_t>* out) const override;
  // Fails on invalid UTF-8 (naming the byte offset), as Megatron's Python path.
  Status encode_checked(std::string_view text, std::vector<int32_t>* out) const override;
  // Token bytes concatenated; the result may end inside a UTF-8 character when
  // `ids` is a prefix of an encoding (Megatron's decode replaces such bytes
  // with U+FFFD; use replace_invalid_utf8() for that).
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  // BPE of one piece's bytes by the plain textbook algorithm (Megatron's
  // loop: merge every occurrence of the lowest-ranked pair, repeat), without
  // the whole-piece lookup or the cache: the reference the fast path is
  // tested against.
  std::vector<int32_t> bpe_reference(std::string_view piece) const;
  // BPE of one piece by the fast path encode() uses (no cache).
  void bpe_fast(std::string_view piece, std::vector<int32_t>* out) const;
  // The bytes of token `id` (REQUIRES: 0 <= id < vocab_size()).
  std::string_view token_bytes(int32_t id) const;

  struct Impl;

 private:
  explicit Gpt2BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int32_t eod_ = -1;
};

// Python's bytes.decode('utf-8', errors='replace'): each maximal invalid
// subsequence becomes U+FFFD.
std::string replace_invalid_utf8(std::string_view s);

template <typename Fn>
void gpt2_pretokenize(std::string_view text, Fn&& fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = gpt2_piece_end(text, pos);
    fn(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace mt::data
