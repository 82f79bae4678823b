#pragma once
// Megatron's indexed dataset: a path prefix P with P.bin (token ids, raw,
// native little-endian, no header) and P.idx (34-byte header, then sequence
// lengths int32[S], byte pointers int64[S], document boundaries int64[D]).
// Byte layout: ../shared/spec/megatron-reference.md §1. Files written here
// are byte-identical to Megatron's IndexedDatasetBuilder; files from Megatron
// read here.
//
// The reader maps both files and validates everything before use: magic,
// version, dtype, sizes, lengths, pointers (monotonic, inside the .bin) and
// document boundaries. A truncated or hostile file gives an error naming the
// file, the byte offset and what was expected; no read ever leaves the maps.
// The .idx arrays are not aligned (they start at byte 34): accessors load
// with memcpy.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace mt::data {

enum class DType : uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7, kUInt16 = 8,
};
bool dtype_code_valid(uint8_t code);
size_t dtype_size(DType d);
const char* dtype_name(DType d);
// Megatron's DType.optimal_dtype: uint16 below 65500 entries, else int32.
DType optimal_dtype(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr size_t kIndexHeaderBytes = 34;

class IndexedDataset;

// Writes P.bin/P.idx under temporary names; finalize() renames them into
// place (.bin first, then .idx, after removing any old .idx), so an
// interrupted run never leaves an .idx that describes a partial .bin.
class IndexedDatasetWriter {
 public:
  // `legacy_unindexed_tail`: accept documents with more tokens than their
  // sequence lengths count (the extra tokens are written to .bin but not
  // indexed). Only for reproducing Megatron-LM <= 23.06's --append-eod
  // off-by-one, where the EOD was not counted in the last sequence's length.
  static Result<std::unique_ptr<IndexedDatasetWriter>> create(const std::string& prefix, DType dtype,
                                                               bool legacy_unindexed_tail = false);
  ~IndexedDatasetWriter();  // removes the temporaries unless finalized
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document: its tokens and one length per sequence (sentence), whose
  // sum must equal tokens.size(). An empty `lengths` adds a document with no
  // sequences (what Megatron does for text that tokenizes to nothing).
  Status add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  // Appends another dataset (Megatron's add_index): its sequences, its
  // document boundaries shifted, its .bin bytes. The dtypes must match.
  Status add_index(const IndexedDataset& other);
  Status finalize();

  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return tokens_written_; }

 private:
  IndexedDatasetWriter() = default;
  Status write_bin(const void* data, size_t bytes);
  std::string prefix_, bin_tmp_, idx_tmp_;
  DType dtype_ = DType::kUInt16;
  FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  int64_t tokens_written_ = 0;
  std::vector<uint8_t> convert_;  // staging buffer for the dtype conversion
  bool finalized_ = false;
  bool legacy_unindexed_tail_ = false;
};

// Sequences of tokens, as the GPT dataset reads them: a preprocessed
// .bin/.idx pair (IndexedDataset) or --mock-data's synthetic documents.
class Documents {
 public:
  virtual ~Documents() = default;
  virtual const std::string& prefix() const = 0;  // names the source in logs and errors
  virtual int64_t num_sequences() const = 0;
  virtual int64_t num_tokens() const = 0;
  virtual int32_t sequence_length(int64_t i) const = 0;
  virtual std::vector<int32_t> sequence_lengths() const = 0;
  // Copies tokens [offset, offset+count) of sequence `seq` into out.
  // REQUIRES: the range lies inside the sequence (MT_CHECK).
  virtual void read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const = 0;
  // Where token `token` of sequence `seq` lies, for error messages.
  virtual std::string token_place(int64_t seq, int64_t token) const;
};

class IndexedDataset final : public Documents {
 public:
  static Result<IndexedDataset> open(const std::string& prefix);
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  ~IndexedDataset();

  const std::string& prefix() const override { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const override { return S_; }
  int64_t num_documents() const { return D_ - 1; }  // as Megatron reports it
  int64_t num_tokens() const override { return total_tokens_; }
  int32_t sequence_length(int64_t i) const override;
  int64_t sequence_pointer(int64_t i) const;  // bytes into .bin
  int64_t document_index(int64_t i) const;    // i in [0, D]
  // All sequence lengths (copied once; the GPT dataset needs them as an array).
  std::vector<int32_t> sequence_lengths() const override;

  void read(int64_t seq, int64_t offset, int64_t count, int32_t* out) const;
  void read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const override;
  std::string token_place(int64_t seq, int64_t token) const override;  // "<prefix>.bin byte B (sequence S, token T)"
  // Raw .bin bytes (for merging).
  std::span<const uint8_t> bin_bytes() const { return {bin_, bin_size_}; }

 private:
  IndexedDataset() = default;
  void release();
  std::string prefix_;
  DType dtype_ = DType::kUInt16;
  int64_t S_ = 0, D_ = 0, total_tokens_ = 0;
  const uint8_t* idx_ = nullptr;
  size_t idx_size_ = 0;
  const uint8_t* bin_ = nullptr;
  size_t bin_size_ = 0;
};

}  // namespace mt::data
