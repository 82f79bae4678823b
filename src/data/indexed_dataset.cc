#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace mt::data {

bool dtype_code_valid(uint8_t c) { return c >= 1 && c <= 8; }

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kUInt8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kUInt16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kUInt16: return "uint16";
  }
  return "?";
}

DType optimal_dtype(int64_t vocab_size) { return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32; }

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void put(std::vector<uint8_t>& buf, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  buf.insert(buf.end(), b, b + sizeof(T));
}

// Token conversion to and from the file's dtype. Integer dtypes only for
// writing (tokens are ids); every dtype can be read. A stored value that is
// no integer of Out (a fraction, NaN or inf in a float file, an int64 past
// int32) reads as Out's lowest value, kNotAnId: never a valid id, so the
// vocabulary check that follows (GptDataset) reports it instead of a cast
// quietly making some other id of it.
template <typename Out>
constexpr Out kNotAnId = std::numeric_limits<Out>::lowest();
template <typename Out>
Out id_of(int64_t v) {
  return v < std::numeric_limits<Out>::lowest() || v > std::numeric_limits<Out>::max() ? kNotAnId<Out>
                                                                                       : static_cast<Out>(v);
}
template <typename Out>
Out id_of(double v) {
  // 2^63 as a double; NaN fails every comparison.
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0) || v != std::floor(v)) return kNotAnId<Out>;
  return id_of<Out>(static_cast<int64_t>(v));
}
template <typename Out>
void convert_in(DType d, const uint8_t* src, int64_t n, Out* out) {
  switch (d) {
    case DType::kUInt8: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(src[i]); break;
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(load<int8_t>(src + i)); break;
    case DType::kInt16: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(load<int16_t>(src + 2 * i)); break;
    case DType::kUInt16: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(load<uint16_t>(src + 2 * i)); break;
    case DType::kInt32: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(load<int32_t>(src + 4 * i)); break;
    case DType::kInt64: for (int64_t i = 0; i < n; ++i) out[i] = id_of<Out>(load<int64_t>(src + 8 * i)); break;
    case DType::kFloat32: for (int64_t i = 0; i < n; ++i) out[i] = id_of<Out>(static_cast<double>(load<float>(src + 4 * i))); break;
    case DType::kFloat64: for (int64_t i = 0; i < n; ++i) out[i] = id_of<Out>(load<double>(src + 8 * i)); break;
  }
}

Status map_file(const std::string& path, const uint8_t** data, size_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::not_found(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::io_error(fmt::format("{}: cannot stat: {}", path, std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid(fmt::format("{}: not a regular file", path));
  }
  *size = static_cast<size_t>(st.st_size);
  *data = nullptr;
  if (*size > 0) {
    void* p = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Status::io_error(fmt::format("{}: cannot map: {}", path, std::strerror(e)));
    }
    *data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------- writer

Result<std::unique_ptr<IndexedDatasetWriter>> IndexedDatasetWriter::create(const std::string& prefix, DType dtype,
                                                                           bool legacy_unindexed_tail) {
  std::unique_ptr<IndexedDatasetWriter> w(new IndexedDatasetWriter());
  w->legacy_unindexed_tail_ = legacy_unindexed_tail;
  w->prefix_ = prefix;
  w->dtype_ = dtype;
  w->bin_tmp_ = fmt::format("{}.bin.tmp.{}", prefix, getpid());
  w->idx_tmp_ = fmt::format("{}.idx.tmp.{}", prefix, getpid());
  w->bin_ = std::fopen(w->bin_tmp_.c_str(), "wb");
  if (!w->bin_) return Status::io_error(fmt::format("{}: cannot create: {}", w->bin_tmp_, std::strerror(errno)));
  std::setvbuf(w->bin_, nullptr, _IOFBF, 1 << 22);
  return w;
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    ::unlink(bin_tmp_.c_str());
    ::unlink(idx_tmp_.c_str());
  }
}

Status IndexedDatasetWriter::write_bin(const void* data, size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, bin_) != bytes)
    return Status::io_error(fmt::format("{}: write failed: {}", bin_tmp_, std::strerror(errno)));
  return Status::ok();
}

Status IndexedDatasetWriter::add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths) {
  MT_CHECK(!finalized_, "add_document after finalize");
  int64_t sum = 0;
  for (int32_t l : lengths) {
    if (l < 0) return Status::invalid("negative sequence length");
    sum += l;
  }
  if (sum != static_cast<int64_t>(tokens.size()) && !(legacy_unindexed_tail_ && sum < static_cast<int64_t>(tokens.size())))
    return Status::invalid(fmt::format("sequence lengths add up to {} but the document has {} tokens", sum, tokens.size()));
  const size_t isz = dtype_size(dtype_);
  convert_.resize(tokens.size() * isz);
  uint8_t* dst = convert_.data();
  auto out_of_range = [&](int32_t t) {
    return Status::invalid(fmt::format("token id {} does not fit the dataset's {} tokens", t, dtype_name(dtype_)));
  };
  switch (dtype_) {
    case DType::kUInt16:
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (static_cast<uint32_t>(tokens[i]) > 0xFFFF) return out_of_range(tokens[i]);
        uint16_t v = static_cast<uint16_t>(tokens[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      }
      break;
    case DType::kInt32: std::memcpy(dst, tokens.data(), tokens.size() * 4); break;
    case DType::kInt64:
      for (size_t i = 0; i < tokens.size(); ++i) {
        int64_t v = tokens[i];
        std::memcpy(dst + 8 * i, &v, 8);
      }
      break;
    case DType::kUInt8:
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (static_cast<uint32_t>(tokens[i]) > 0xFF) return out_of_range(tokens[i]);
        dst[i] = static_cast<uint8_t>(tokens[i]);
      }
      break;
    case DType::kInt16:
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < INT16_MIN || tokens[i] > INT16_MAX) return out_of_range(tokens[i]);
        int16_t v = static_cast<int16_t>(tokens[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      }
      break;
    default:
      return Status::invalid(fmt::format("cannot write token ids as {}", dtype_name(dtype_)));
  }
  MT_RETURN_IF_ERROR(write_bin(dst, convert_.size()));
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
  tokens_written_ += static_cast<int64_t>(tokens.size());
  return Status::ok();
}

Status IndexedDatasetWriter::add_index(const IndexedDataset& other) {
  if (other.dtype() != dtype_)
    return Status::invalid(fmt::format("{}: dtype {} does not match {}", other.prefix(), dtype_name(other.dtype()), dtype_name(dtype_)));
  const int64_t base = static_cast<int64_t>(lengths_.size());
  for (int64_t i = 0; i < other.num_sequences(); ++i) lengths_.push_back(other.sequence_length(i));
  for (int64_t i = 1; i <= other.num_documents(); ++i) doc_index_.push_back(base + other.document_index(i));
  tokens_written_ += other.num_tokens();
  auto bytes = other.bin_bytes();
  return write_bin(bytes.data(), bytes.size());
}

Status IndexedDatasetWriter::finalize() {
  MT_CHECK(!finalized_, "finalize twice");
  if (std::fflush(bin_) != 0 || ::fsync(fileno(bin_)) != 0)
    return Status::io_error(fmt::format("{}: flush failed: {}", bin_tmp_, std::strerror(errno)));
  std::fclose(bin_);
  bin_ = nullptr;

  std::vector<uint8_t> idx;
  const size_t S = lengths_.size(), D = doc_index_.size();
  idx.reserve(kIndexHeaderBytes + 12 * S + 8 * D);
  idx.insert(idx.end(), kIndexMagic, kIndexMagic + 9);
  put<uint64_t>(idx, 1);
  idx.push_back(static_cast<uint8_t>(dtype_));
  put<uint64_t>(idx, S);
  put<uint64_t>(idx, D);
  for (int32_t l : lengths_) put<int32_t>(idx, l);
  int64_t ptr = 0;
  const int64_t isz = static_cast<int64_t>(dtype_size(dtype_));
  for (int32_t l : lengths_) {
    put<int64_t>(idx, ptr);
    ptr += l * isz;
  }
  for (int64_t d : doc_index_) put<int64_t>(idx, d);

  FILE* f = std::fopen(idx_tmp_.c_str(), "wb");
  if (!f) return Status::io_error(fmt::format("{}: cannot create: {}", idx_tmp_, std::strerror(errno)));
  bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return Status::io_error(fmt::format("{}: write failed: {}", idx_tmp_, std::strerror(errno)));

  const std::string bin = prefix_ + ".bin", idxp = prefix_ + ".idx";
  ::unlink(idxp.c_str());  // an old .idx must never describe the new .bin
  if (std::rename(bin_tmp_.c_str(), bin.c_str()) != 0 || std::rename(idx_tmp_.c_str(), idxp.c_str()) != 0)
    return Status::io_error(fmt::format("{}: cannot rename into place: {}", prefix_, std::strerror(errno)));
  finalized_ = true;
  return Status::ok();
}

// ---------------------------------------------------------------- reader

IndexedDataset::IndexedDataset(IndexedDataset&& o) noexcept { *this = std::move(o); }

IndexedDataset& IndexedDataset::operator=(IndexedDataset&& o) noexcept {
  if (this != &o) {
    release();
    prefix_ = std::move(o.prefix_);
    dtype_ = o.dtype_, S_ = o.S_, D_ = o.D_, total_tokens_ = o.total_tokens_;
    idx_ = o.idx_, idx_size_ = o.idx_size_, bin_ = o.bin_, bin_size_ = o.bin_size_;
    o.idx_ = o.bin_ = nullptr;
    o.idx_size_ = o.bin_size_ = 0;
  }
  return *this;
}

IndexedDataset::~IndexedDataset() { release(); }

void IndexedDataset::release() {
  if (idx_) ::munmap(const_cast<uint8_t*>(idx_), idx_size_);
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
  idx_ = bin_ = nullptr;
}

Result<IndexedDataset> IndexedDataset::open(const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  const std::string ip = prefix + ".idx", bp = prefix + ".bin";
  MT_RETURN_IF_ERROR(map_file(ip, &ds.idx_, &ds.idx_size_));
  MT_RETURN_IF_ERROR(map_file(bp, &ds.bin_, &ds.bin_size_));
  const uint8_t* p = ds.idx_;
  const size_t n = ds.idx_size_;
  auto corrupt = [&](size_t offset, const std::string& what) {
    return Status::corrupt(fmt::format("{}: offset {}: {}", ip, offset, what));
  };
  if (n < kIndexHeaderBytes)
    return corrupt(0, fmt::format("file is {} bytes, shorter than the {}-byte header (truncated?)", n, kIndexHeaderBytes));
  if (std::memcmp(p, kIndexMagic, 9) != 0)
    return corrupt(0, "bad magic: expected \"MMIDIDX\\0\\0\" (is this a Megatron .idx file?)");
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1) return corrupt(9, fmt::format("version {}: expected 1", version));
  const uint8_t code = p[17];
  if (!dtype_code_valid(code)) return corrupt(17, fmt::format("dtype code {}: expected 1..8", code));
  ds.dtype_ = static_cast<DType>(code);
  const uint64_t S = load<uint64_t>(p + 18), D = load<uint64_t>(p + 26);
  // 34 + 12 S + 8 D must equal the file size; check without overflow.
  const uint64_t body = n - kIndexHeaderBytes;
  if (S > body / 12 || D > body / 8 || 12 * S + 8 * D != body) {
    std::string extra = (S <= body / 13 && D <= body / 8 && 13 * S + 8 * D == body)
                            ? " (the extra S bytes look like a multimodal index; text datasets have none)"
                            : "";
    return corrupt(18, fmt::format("header says {} sequences and {} document entries, which need {} bytes, but the file has {}{}",
                                   S, D, S <= UINT64_MAX / 12 && D <= UINT64_MAX / 8 ? std::to_string(34 + 12 * S + 8 * D) : "too many",
                                   n, extra));
  }
  if (D < 1) return corrupt(26, "document-index count 0: expected at least 1 (the leading 0)");
  ds.S_ = static_cast<int64_t>(S);
  ds.D_ = static_cast<int64_t>(D);
  const size_t len_off = kIndexHeaderBytes, ptr_off = len_off + 4 * S, doc_off = ptr_off + 8 * S;
  const uint64_t isz = dtype_size(ds.dtype_);
  int64_t prev_end = 0, total = 0;
  for (uint64_t i = 0; i < S; ++i) {
    const int32_t len = load<int32_t>(p + len_off + 4 * i);
    if (len < 0) return corrupt(len_off + 4 * i, fmt::format("sequence {} has negative length {}", i, len));
    const int64_t ptr = load<int64_t>(p + ptr_off + 8 * i);
    if (ptr < prev_end)
      return corrupt(ptr_off + 8 * i, fmt::format("sequence {} starts at byte {}, before the end of sequence {} (byte {}): pointers must not go back",
                                                  i, ptr, i - 1, prev_end));
    const uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * isz;
    if (end > ds.bin_size_)
      return Status::corrupt(fmt::format("{}: sequence {} ends at byte {}, but the file has {} bytes (truncated .bin, or pointers past the end; index {} offset {})",
                                         bp, i, end, ds.bin_size_, ip, ptr_off + 8 * i));
    prev_end = static_cast<int64_t>(end);
    total += len;
  }
  int64_t prev = -1;
  for (uint64_t i = 0; i < D; ++i) {
    const int64_t d = load<int64_t>(p + doc_off + 8 * i);
    if (i == 0 && d != 0) return corrupt(doc_off, fmt::format("first document boundary is {}: expected 0", d));
    if (d < prev || d > ds.S_)
      return corrupt(doc_off + 8 * i, fmt::format("document boundary {} is {}: expected a non-decreasing value in [{}, {}]", i, d, std::max<int64_t>(prev, 0), ds.S_));
    prev = d;
  }
  if (prev != ds.S_)
    return corrupt(doc_off + 8 * (D - 1), fmt::format("last document boundary is {}: expected the sequence count {}", prev, ds.S_));
  ds.total_tokens_ = total;
  return ds;
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  MT_CHECK(i >= 0 && i < S_, "sequence index out of range");
  return load<int32_t>(idx_ + kIndexHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  MT_CHECK(i >= 0 && i < S_, "sequence index out of range");
  return load<int64_t>(idx_ + kIndexHeaderBytes + 4 * S_ + 8 * i);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  MT_CHECK(i >= 0 && i < D_, "document index out of range");
  return load<int64_t>(idx_ + kIndexHeaderBytes + 12 * S_ + 8 * i);
}

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> v(static_cast<size_t>(S_));
  if (S_) std::memcpy(v.data(), idx_ + kIndexHeaderBytes, 4 * S_);
  return v;
}

std::string Documents::token_place(int64_t seq, int64_t token) const {
  return fmt::format("{}: sequence {}, token {}", prefix(), seq, token);
}

std::string IndexedDataset::token_place(int64_t seq, int64_t token) const {
  return fmt::format("{}.bin byte {} (sequence {}, token {})", prefix_,
                     sequence_pointer(seq) + token * dtype_size(dtype_), seq, token);
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int32_t* out) const {
  MT_CHECK(offset >= 0 && count >= 0 && offset + count <= sequence_length(seq), "read outside the sequence");
  convert_in(dtype_, bin_ + sequence_pointer(seq) + offset * dtype_size(dtype_), count, out);
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  MT_CHECK(offset >= 0 && count >= 0 && offset + count <= sequence_length(seq), "read outside the sequence");
  convert_in(dtype_, bin_ + sequence_pointer(seq) + offset * dtype_size(dtype_), count, out);
}

}  // namespace mt::data
