#include "data/npy.h"

#include <cctype>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/file.h"

namespace mt::data {

namespace {

template <typename T> const char* descr();
template <> const char* descr<int16_t>() { return "<i2"; }
template <> const char* descr<int32_t>() { return "<i4"; }
template <> const char* descr<int64_t>() { return "<i8"; }
template <> const char* descr<uint32_t>() { return "<u4"; }

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

template <typename T>
Status write_npy(const std::string& path, const std::vector<T>& data, std::vector<int64_t> shape) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr<T>(), shape_text(shape));
  // magic(6) + version(2) + len(2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  out.append(reinterpret_cast<const char*>(&hl), 2);
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return write_file_atomic(path, out);
}

template <typename T>
Result<std::vector<T>> read_npy(const std::string& path, std::vector<int64_t>* shape) {
  auto file = read_regular_file(path, std::numeric_limits<size_t>::max());
  if (!file) return file.status();
  const std::string& bytes = *file;
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0 || bytes[6] != 1)
    return Status::corrupt(fmt::format("{}: not a version-1 .npy file", path));
  uint16_t hl;
  std::memcpy(&hl, bytes.data() + 8, 2);
  if (10u + hl > bytes.size()) return Status::corrupt(fmt::format("{}: header runs past the end", path));
  const std::string header = bytes.substr(10, hl);
  if (header.find(std::string("'descr': '") + descr<T>() + "'") == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos)
    return Status::corrupt(fmt::format("{}: expected dtype {} in C order, header {}", path, descr<T>(), header));
  auto open = header.find("'shape': ("), close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return Status::corrupt(fmt::format("{}: no shape", path));
  shape->clear();
  int64_t count = 1;
  std::string dims = header.substr(open + 10, close - open - 10);
  size_t pos = 0;
  while (pos < dims.size()) {
    while (pos < dims.size() && (dims[pos] == ' ' || dims[pos] == ',')) ++pos;
    if (pos >= dims.size()) break;
    size_t end = pos;
    while (end < dims.size() && std::isdigit(static_cast<unsigned char>(dims[end]))) ++end;
    // At most 18 digits, and the element count and its bytes within the
    // file: a damaged header must neither overflow nor wrap around to the
    // file's size.
    if (end == pos || end - pos > 18) return Status::corrupt(fmt::format("{}: bad shape '{}'", path, dims));
    shape->push_back(std::stoll(dims.substr(pos, end - pos)));
    if (shape->back() != 0 && count > static_cast<int64_t>(bytes.size() / sizeof(T)) / shape->back())
      return Status::corrupt(fmt::format("{}: shape ({}) holds more elements than the file's {} bytes", path, dims,
                                         bytes.size()));
    count *= shape->back();
    pos = end;
  }
  const size_t body = bytes.size() - 10 - hl;
  if (body != static_cast<size_t>(count) * sizeof(T))
    return Status::corrupt(fmt::format("{}: {} data bytes, expected {}", path, body, count * sizeof(T)));
  std::vector<T> v(static_cast<size_t>(count));
  std::memcpy(v.data(), bytes.data() + 10 + hl, body);
  return v;
}

template Status write_npy<int16_t>(const std::string&, const std::vector<int16_t>&, std::vector<int64_t>);
template Status write_npy<int32_t>(const std::string&, const std::vector<int32_t>&, std::vector<int64_t>);
template Status write_npy<int64_t>(const std::string&, const std::vector<int64_t>&, std::vector<int64_t>);
template Status write_npy<uint32_t>(const std::string&, const std::vector<uint32_t>&, std::vector<int64_t>);
template Result<std::vector<int16_t>> read_npy<int16_t>(const std::string&, std::vector<int64_t>*);
template Result<std::vector<int32_t>> read_npy<int32_t>(const std::string&, std::vector<int64_t>*);
template Result<std::vector<int64_t>> read_npy<int64_t>(const std::string&, std::vector<int64_t>*);
template Result<std::vector<uint32_t>> read_npy<uint32_t>(const std::string&, std::vector<int64_t>*);

}  // namespace mt::data
