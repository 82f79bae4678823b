#pragma once
// numpy .npy (format 1.0) for the dataset index caches: 1-D or 2-D C-order
// arrays of int16/int32/int64/uint32, little-endian. Written atomically.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mt::data {

template <typename T>
Status write_npy(const std::string& path, const std::vector<T>& data, std::vector<int64_t> shape);
template <typename T>
Result<std::vector<T>> read_npy(const std::string& path, std::vector<int64_t>* shape);

}  // namespace mt::data
