#pragma once
// Reading and writing the safetensors format (huggingface/safetensors):
//   u64 little-endian N | N bytes of JSON header | raw tensor bytes
// header: {"<name>": {"dtype": "F32"|"F64"|"BF16"|"I32"|"I64", "shape": [...],
//          "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v", ...}}
// Offsets are relative to the start of the data section; data is row-major,
// little-endian. Used to move weights, inputs and results between this code
// and the PyTorch reference (tests/model/reference_gpt.py reads it with the
// json module and numpy alone), and later for HF export.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace mt {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // cpu, contiguous
};

// Writes to `path` (through a temporary file renamed on success).
// safetensors' dtype names ("F32", "F64", "BF16", "I32", "I64") and back.
const char* safetensors_dtype_name(DType t);
bool parse_safetensors_dtype(const std::string& s, DType* t);

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// A whole file in memory; tensors are views into `data`.
struct SafetensorsFile {
  std::vector<char> data;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  // The named tensor, or kNotFound naming the file.
  Result<Tensor> get(const std::string& name) const;
  std::string path;
};

Result<SafetensorsFile> read_safetensors(const std::string& path);

// A safetensors file from anywhere (a downloaded model), mapped read-only
// and checked before anything is used: the header is a JSON object of
// {dtype: string, shape: [non-negative ints, at most kMaxDims],
// data_offsets: [begin <= end]} entries whose byte ranges lie inside the file
// and match shape x dtype size (known dtypes: F64 F32 F16 BF16 F8_E4M3
// F8_E5M2 F8_E8M0 I64 I32 I16 I8 U64 U32 U16 U8 BOOL). Malformed input is a
// kCorrupt naming the file, the tensor and the offset; nothing is read out of
// bounds; a FIFO or device in place of the file is refused, not waited on.
struct MappedTensor {
  std::string dtype;  // safetensors' name, e.g. "BF16"
  Shape shape;
  const char* data = nullptr;
  uint64_t bytes = 0;
  uint64_t file_offset = 0;  // of the first byte, for error messages
};
class MappedSafetensors {
 public:
  static Result<MappedSafetensors> open(const std::string& path);
  MappedSafetensors() = default;
  MappedSafetensors(MappedSafetensors&& o) noexcept;
  MappedSafetensors& operator=(MappedSafetensors&& o) noexcept;
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;
  ~MappedSafetensors();

  const std::string& path() const { return path_; }
  const std::map<std::string, MappedTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  const char* base_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, MappedTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A JSON value from an untrusted file for an error message: short, and
// without recursion (dump() recurses: a deeply nested value would exhaust
// the stack).
std::string json_brief(const nlohmann::json& v);

// Element i of a floating tensor (F64, F32, F16, BF16) as a float.
float mapped_float(const MappedTensor& t, int64_t i);
// The whole tensor as floats into out[numel]; kInvalidArgument for a
// non-floating dtype.
Status mapped_to_floats(const MappedTensor& t, float* out);

}  // namespace mt
