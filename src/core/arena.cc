#include "core/arena.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/cuda/runtime.h"
#include "core/sim_device.h"

namespace mt {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

void Tensor::zero() const {
  if (!data_) return;
  if (device_ == Device::kCuda) {
    if (simdev::enabled()) {
      simdev::HostScope open;
      std::memset(data_, 0, nbytes());
      return;
    }
#ifdef MT_HAVE_CUDA
    cuda::memset_zero(data_, nbytes());
    return;
#else
    MT_CHECK(false, "Tensor::zero: a CUDA tensor in a build without the CUDA backend");
#endif
  }
  std::memset(data_, 0, nbytes());
}

int SizeTable::add(std::string name, Shape shape, DType dtype) {
  SizeEntry e{std::move(name), shape, dtype, total_};
  total_ = align_up(total_ + e.bytes());
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

int64_t SizeTable::total_elements() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.shape.numel();
  return n;
}

Arena::Arena(size_t capacity_bytes, std::string name, Device device) : name_(std::move(name)), device_(device) {
  MT_CHECK(capacity_bytes > 0, "Arena: zero capacity");
  capacity_ = align_up(capacity_bytes);
  if (device_ == Device::kCuda) {
    if (simdev::enabled()) {
      base_ = static_cast<char*>(simdev::alloc(capacity_));  // zero-filled
      return;
    }
#ifdef MT_HAVE_CUDA
    base_ = static_cast<char*>(cuda::device_malloc(capacity_, name_.c_str()));
    cuda::memset_zero(base_, capacity_);
    return;
#else
    MT_CHECK(false, fmt::format("Arena '{}': CUDA memory in a build without the CUDA backend", name_));
#endif
  }
  base_ = static_cast<char*>(std::aligned_alloc(kArenaAlign, capacity_));
  MT_CHECK(base_ != nullptr, fmt::format("Arena '{}': cannot allocate {} bytes", name_, capacity_));
  std::memset(base_, 0, capacity_);
}

void Arena::release() {
  if (!base_) return;
  if (device_ == Device::kCuda && simdev::enabled()) {
    simdev::release(base_);
    base_ = nullptr;
    return;
  }
#ifdef MT_HAVE_CUDA
  if (device_ == Device::kCuda) {
    cuda::device_free(base_);
    base_ = nullptr;
    return;
  }
#endif
  std::free(base_);
  base_ = nullptr;
}

Arena::~Arena() { release(); }

Arena::Arena(Arena&& o) noexcept { *this = std::move(o); }

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    release();
    base_ = std::exchange(o.base_, nullptr);
    device_ = o.device_;
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    high_water_ = std::exchange(o.high_water_, 0);
    name_ = std::move(o.name_);
  }
  return *this;
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  size_t bytes = align_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  MT_CHECK(used_ + bytes <= capacity_,
           fmt::format("Arena '{}' is full: {} bytes used of {}, {} more requested for {} {}", name_,
                       used_, capacity_, bytes, dtype_name(dtype), shape.str()));
  Tensor t(base_ + used_, shape, dtype, device_);
  used_ += bytes;
  if (used_ > high_water_) high_water_ = used_;
  return t;
}

std::vector<Tensor> Arena::carve(const SizeTable& table) {
  MT_CHECK(used_ + table.total_bytes() <= capacity_,
           fmt::format("Arena '{}' is full: table of {} bytes does not fit ({} of {} used)", name_,
                       table.total_bytes(), used_, capacity_));
  char* start = base_ + used_;
  std::vector<Tensor> out;
  out.reserve(table.entries().size());
  for (const auto& e : table.entries()) out.emplace_back(start + e.offset, e.shape, e.dtype, device_);
  used_ += table.total_bytes();
  if (used_ > high_water_) high_water_ = used_;
  return out;
}

void Arena::reset(size_t mark) {
  MT_CHECK(mark <= used_, "Arena::reset: mark beyond the bump pointer");
  used_ = mark;
}

}  // namespace mt
