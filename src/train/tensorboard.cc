#include "train/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace mt::train {

namespace {

// The reflected CRC-32C table (polynomial 0x82f63b78).
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// Protocol-buffer wire format: varints, then (field << 3 | wire type) keys.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little endian (this program runs on x86-64 and aarch64 hosts)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1 (double), step = 2 (int64) } plus `rest` (already encoded fields).
std::string event(int64_t step, const std::string& rest) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed<double>(e, wall_seconds());
  if (step != 0) {  // proto3: a zero step is the default and not written
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e + rest;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

Status TensorBoardWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::invalid(fmt::format("--tensorboard-dir {}: cannot create it: {}", dir, ec.message()));
  char host[256] = "localhost";
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = '\0';
  const auto secs = static_cast<long long>(wall_seconds());
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.0", secs, host, ::getpid())).string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_)
    return Status::invalid(fmt::format("--tensorboard-dir {}: cannot create {}: {}", dir, path_, std::strerror(errno)));
  std::string version;
  put_bytes(version, 3, "brain.Event:2");
  write_event(event(0, version));
  return Status::ok();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (!f_) return;
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_key(v, 2, 5);
  put_fixed<float>(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string rest;
  put_bytes(rest, 5, summary);
  write_event(event(step, rest));
}

void TensorBoardWriter::write_event(const std::string& e) {
  std::string rec;
  const uint64_t len = e.size();
  put_fixed<uint64_t>(rec, len);
  put_fixed<uint32_t>(rec, masked_crc32c(&len, sizeof(len)));
  rec += e;
  put_fixed<uint32_t>(rec, masked_crc32c(e.data(), e.size()));
  // A failed write (disk full) loses log records, never training: it is
  // reported once and the writer closes.
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0) {
    std::fprintf(stderr, "warning: --tensorboard-dir: writing %s failed (%s); no more TensorBoard records\n",
                 path_.c_str(), std::strerror(errno));
    std::fclose(f_);
    f_ = nullptr;
  }
}

}  // namespace mt::train
