#include "core/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>

#include "core/file.h"

namespace mt {

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& s, DType* t) {
  if (s == "F32") *t = DType::kF32;
  else if (s == "F64") *t = DType::kF64;
  else if (s == "BF16") *t = DType::kBF16;
  else if (s == "F16") *t = DType::kF16;
  else if (s == "I32") *t = DType::kI32;
  else if (s == "I64") *t = DType::kI64;
  else return false;
  return true;
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  for (const auto& nt : tensors) {
    std::vector<int64_t> shape(nt.tensor.shape().d.begin(), nt.tensor.shape().d.begin() + nt.tensor.ndim());
    h[nt.name] = {{"dtype", safetensors_dtype_name(nt.tensor.dtype())}, {"shape", shape}, {"data_offsets", {off, off + nt.tensor.nbytes()}}};
    off += nt.tensor.nbytes();
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';  // align the data section
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  if (!out) return Status::io_error(fmt::format("cannot create '{}'", tmp));
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), static_cast<std::streamsize>(n));
  for (const auto& nt : tensors)
    out.write(static_cast<const char*>(nt.tensor.data()), static_cast<std::streamsize>(nt.tensor.nbytes()));
  out.close();
  if (!out) return Status::io_error(fmt::format("write to '{}' failed", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::io_error(fmt::format("cannot rename '{}' to '{}'", tmp, path));
  return Status::ok();
}

Result<Tensor> SafetensorsFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) return Status::not_found(fmt::format("'{}': no tensor named '{}'", path, name));
  return it->second;
}

Result<SafetensorsFile> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(fmt::format("cannot open '{}'", path));
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || n > (uint64_t{1} << 30))
    return Status::corrupt(fmt::format("'{}': offset 0: expected a u64 header length", path));
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) return Status::corrupt(fmt::format("'{}': header of {} bytes is truncated", path, n));
  SafetensorsFile f;
  f.path = path;
  f.data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded() || !h.is_object())
    return Status::corrupt(fmt::format("'{}': offset 8: header is not a JSON object", path));
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      for (auto& [k, val] : v.items()) f.metadata[k] = val.is_string() ? val.get<std::string>() : val.dump();
      continue;
    }
    DType dt;
    if (!v.contains("dtype") || !parse_safetensors_dtype(v["dtype"].get<std::string>(), &dt))
      return Status::corrupt(fmt::format("'{}': tensor '{}': unsupported or missing dtype", path, name));
    Shape s;
    for (auto& d : v["shape"]) s.d[s.ndim++] = d.get<int64_t>();
    uint64_t b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
    if (e < b || e > f.data.size() || e - b != static_cast<uint64_t>(s.numel()) * dtype_size(dt))
      return Status::corrupt(fmt::format("'{}': tensor '{}': data_offsets [{}, {}] do not match shape {} {} "
                                         "or the file's {} data bytes",
                                         path, name, b, e, s.str(), safetensors_dtype_name(dt), f.data.size()));
    f.tensors[name] = Tensor(nullptr, s, dt);
    f.tensors[name] = Tensor(f.data.data() + b, s, dt);
  }
  return f;
}

namespace {

int mapped_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0") return 1;
  return 0;
}


// The format's own rule (its reference implementation's validation): the
// tensors' byte ranges, sorted by (begin, end), tile the data section
// exactly -- no overlap, no gap, no trailing bytes.
struct ByteRange {
  uint64_t begin, end;
  std::string name;
};
Status check_tiling(const std::string& path, std::vector<ByteRange> ranges, uint64_t data_size) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const ByteRange& r : ranges) {
    if (r.begin != at)
      return Status::corrupt(fmt::format(
          "'{}': tensor '{}': data_offsets [{}, {}] {} the previous tensor's end at {} (safetensors tensors must tile "
          "the data section: no overlap, no gap)",
          path, r.name, r.begin, r.end, r.begin < at ? "overlap" : "leave a gap after", at));
    at = r.end;
  }
  if (at != data_size)
    return Status::corrupt(fmt::format("'{}': the tensors cover {} of the {} data bytes (safetensors files have no "
                                       "bytes after the last tensor; file damaged or appended to?)",
                                       path, at, data_size));
  return Status::ok();
}

}  // namespace

std::string json_brief(const nlohmann::json& v) {
  if (v.is_primitive()) {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 80) + "..." : s;
  }
  if (v.is_array() && v.size() == 1 && v[0].is_string()) return v.dump().substr(0, 80);
  return fmt::format("a JSON {} of {} entries", v.type_name(), v.size());
}

MappedSafetensors::MappedSafetensors(MappedSafetensors&& o) noexcept { *this = std::move(o); }

MappedSafetensors& MappedSafetensors::operator=(MappedSafetensors&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(const_cast<char*>(base_), size_);
    path_ = std::move(o.path_), base_ = o.base_, size_ = o.size_;
    tensors_ = std::move(o.tensors_), metadata_ = std::move(o.metadata_);
    o.base_ = nullptr, o.size_ = 0;
  }
  return *this;
}

MappedSafetensors::~MappedSafetensors() {
  if (base_) ::munmap(const_cast<char*>(base_), size_);
}

Result<MappedSafetensors> MappedSafetensors::open(const std::string& path) {
  MappedSafetensors f;
  f.path_ = path;
  auto opened = open_regular_file(path);
  if (!opened) return opened.status();
  const int fd = opened->fd;
  f.size_ = opened->size;
  if (f.size_ < 8) {
    ::close(fd);
    return Status::corrupt(fmt::format("'{}': {} bytes; a safetensors file starts with an 8-byte header length", path,
                                       f.size_));
  }
  void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::io_error(fmt::format("cannot map '{}': {}", path, std::strerror(errno)));
  f.base_ = static_cast<const char*>(m);
  uint64_t n = 0;
  std::memcpy(&n, f.base_, 8);
  if (n > (uint64_t{100} << 20) || n > f.size_ - 8)
    return Status::corrupt(fmt::format("'{}': offset 0: header length {} exceeds the file ({} bytes) or 100 MB", path,
                                       n, f.size_));
  const char* data = f.base_ + 8 + n;
  const uint64_t data_size = f.size_ - 8 - n;
  nlohmann::json h = nlohmann::json::parse(f.base_ + 8, data, nullptr, false);
  if (h.is_discarded() || !h.is_object())
    return Status::corrupt(fmt::format("'{}': offset 8: the {}-byte header is not a JSON object", path, n));
  std::vector<ByteRange> ranges;
  for (const auto& [key, v] : h.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) return Status::corrupt(fmt::format("'{}': __metadata__ is not an object", path));
      for (const auto& [k, val] : v.items()) f.metadata_[k] = val.is_string() ? val.get<std::string>() : json_brief(val);
      continue;
    }
    const std::string where = fmt::format("'{}': tensor '{}'", path, key);
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array())
      return Status::corrupt(where + ": expected an object with dtype, shape and data_offsets");
    MappedTensor t;
    t.dtype = v["dtype"].get<std::string>();
    const int es = mapped_dtype_size(t.dtype);
    if (!es) return Status::corrupt(fmt::format("{}: unknown dtype {}", where, json_brief(v["dtype"])));
    if (v["shape"].size() > static_cast<size_t>(kMaxDims))
      return Status::corrupt(fmt::format("{}: {} dimensions (at most {})", where, v["shape"].size(), kMaxDims));
    uint64_t want = static_cast<uint64_t>(es);
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return Status::corrupt(where + ": shape is not a list of non-negative integers");
      const uint64_t x = d.get<uint64_t>();
      if (x > (uint64_t{1} << 62) || __builtin_mul_overflow(want, x, &want))
        return Status::corrupt(where + ": shape is too large");
      t.shape.d[static_cast<size_t>(t.shape.ndim++)] = static_cast<int64_t>(x);
    }
    const auto& r = v["data_offsets"];
    if (r.size() != 2 || !r[0].is_number_unsigned() || !r[1].is_number_unsigned() ||
        r[1].get<uint64_t>() < r[0].get<uint64_t>())
      return Status::corrupt(where + ": data_offsets is not [begin, end] with begin <= end");
    const uint64_t b = r[0].get<uint64_t>(), e = r[1].get<uint64_t>();
    if (e - b != want || e > data_size)
      return Status::corrupt(fmt::format("{}: data_offsets [{}, {}] (file offset {}) do not hold {} {} bytes of shape {} "
                                         "within the {} data bytes (file truncated?)",
                                         where, b, e, 8 + n + b, want, t.dtype, t.shape.str(), data_size));
    t.data = data + b, t.bytes = want, t.file_offset = 8 + n + b;
    f.tensors_[key] = t;
    ranges.push_back({b, e, key});
  }
  MT_RETURN_IF_ERROR(check_tiling(path, std::move(ranges), data_size));
  return f;
}

Status mapped_to_floats(const MappedTensor& t, float* out) {
  const int64_t n = t.shape.numel();
  if (t.dtype == "F32") {
    std::memcpy(out, t.data, static_cast<size_t>(n) * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16" || t.dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) out[i] = mapped_float(t, i);
  } else {
    return Status::invalid(fmt::format("tensor of dtype {}: expected F32, BF16, F16 or F64", t.dtype));
  }
  return Status::ok();
}

float mapped_float(const MappedTensor& t, int64_t i) {
  const char* p = t.data + static_cast<size_t>(i) * static_cast<size_t>(mapped_dtype_size(t.dtype));
  if (t.dtype == "F32") {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  if (t.dtype == "BF16") {
    uint16_t u;
    std::memcpy(&u, p, 2);
    return bf16_to_float(bf16{u});
  }
  if (t.dtype == "F16") {
    uint16_t u;
    std::memcpy(&u, p, 2);
    return f16_to_float(f16{u});
  }
  if (t.dtype == "F64") {
    double x;
    std::memcpy(&x, p, 8);
    return static_cast<float>(x);
  }
  MT_CHECK(false, "mapped_float: " + t.dtype + " is not a floating dtype");
  return 0;
}

}  // namespace mt
