#pragma once
// Tensor: a non-owning, contiguous, row-major view of memory with a shape, a
// dtype and a device. Memory is owned by an Arena (core/arena.h) or by the
// caller; a Tensor never frees. Views are cheap to copy and to slice along
// the first dimension, which is how per-rank shards and micro-batches are cut.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace mt {

inline constexpr int kMaxDims = 5;

struct Shape {
  std::array<int64_t, kMaxDims> d{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    MT_CHECK(dims.size() <= kMaxDims, "Shape: too many dimensions");
    for (int64_t v : dims) d[ndim++] = v;
  }
  int64_t operator[](int i) const { return d[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= d[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  std::string str() const;  // "[2, 3, 4]"
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Device device = Device::kCpu)
      : data_(data), shape_(shape), dtype_(dtype), device_(device) {}

  void* data() const { return data_; }
  template <typename T>
  T* ptr() const {
    MT_CHECK(dtype_of<T>() == dtype_, "Tensor::ptr: dtype mismatch");
    return static_cast<T*>(data_);
  }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int ndim() const { return shape_.ndim; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr; }

  // Same memory, new shape with the same element count.
  Tensor view(Shape s) const {
    MT_CHECK(s.numel() == numel(), "Tensor::view: element count differs");
    return Tensor(data_, s, dtype_, device_);
  }
  // The first s.numel() elements with shape s (a buffer sized for the
  // largest of several uses, viewed for one of them).
  Tensor prefix(Shape s) const {
    MT_CHECK(s.numel() <= numel(), "Tensor::prefix: more elements than the buffer holds");
    return Tensor(data_, s, dtype_, device_);
  }
  // Rows [begin, end) of the first dimension (contiguous).
  Tensor slice(int64_t begin, int64_t end) const {
    MT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "Tensor::slice: out of range");
    Shape s = shape_;
    s.d[0] = end - begin;
    int64_t row = numel() / (dim(0) ? dim(0) : 1);
    return Tensor(static_cast<char*>(data_) + begin * row * static_cast<int64_t>(dtype_size(dtype_)), s,
                  dtype_, device_);
  }
  void zero() const;  // all bytes 0 (on a CUDA tensor: asynchronous, on the rank's stream)

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

}  // namespace mt
