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

}  // namespace mt
