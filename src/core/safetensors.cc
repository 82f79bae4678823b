#include "core/safetensors.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace mt {

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& s, DType* t) {
  if (s == "F32") *t = DType::kF32;
  else if (s == "F64") *t = DType::kF64;
  else if (s == "BF16") *t = DType::kBF16;
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

}  // namespace mt
