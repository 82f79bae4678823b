#pragma once
// Arena and SizeTable: every large buffer of a run (parameters, gradients,
// optimizer state, saved activations, scratch) is one allocation carved by a
// table of sizes, as llm.c does. Zeroing, reducing or saving a whole class of
// tensors is then one call on one span, and the planner's memory model and the
// allocator can share one set of size functions.
//
// SizeTable: an ordered list of (name, shape, dtype); offsets are assigned in
// order, each aligned to kArenaAlign bytes. Arena: one aligned block with a
// bump pointer. carve() places a whole table; alloc() takes one tensor; mark()/
// reset() give stack discipline for scratch. high_water() is the largest
// number of bytes ever in use, which tests use to prove that a kernel did not
// allocate more than planned (for example attention never holding T x T).
//
// Thread safety: none; one Arena per thread of control.

#include <cstddef>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

inline constexpr size_t kArenaAlign = 64;

inline size_t align_up(size_t n, size_t a = kArenaAlign) { return (n + a - 1) / a * a; }

struct SizeEntry {
  std::string name;
  Shape shape;
  DType dtype;
  size_t offset = 0;  // from the start of the table's span
  size_t bytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
};

class SizeTable {
 public:
  // Appends an entry; returns its index.
  int add(std::string name, Shape shape, DType dtype);
  const std::vector<SizeEntry>& entries() const { return entries_; }
  const SizeEntry& operator[](int i) const { return entries_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(entries_.size()); }
  size_t total_bytes() const { return total_; }
  int64_t total_elements() const;

 private:
  std::vector<SizeEntry> entries_;
  size_t total_ = 0;
};

class Arena {
 public:
  Arena() = default;
  // REQUIRES: capacity > 0. Memory is zero-filled. A kCuda arena is one
  // cudaMalloc on the current device (core/cuda/runtime.h), zeroed on the
  // rank's stream; its tensors carry Device::kCuda.
  explicit Arena(size_t capacity_bytes, std::string name = "arena", Device device = Device::kCpu);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept;
  Arena& operator=(Arena&& o) noexcept;

  // One tensor from the bump pointer; aborts (MT_CHECK) when the arena is full,
  // naming the arena and the request: running out is a planning bug.
  Tensor alloc(Shape shape, DType dtype);
  // Every entry of `table`, contiguous and in order; returns one view per entry.
  std::vector<Tensor> carve(const SizeTable& table);

  size_t mark() const { return used_; }
  void reset(size_t mark);  // REQUIRES: mark <= used()
  void reset_high_water() { high_water_ = used_; }

  char* base() const { return base_; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }
  const std::string& name() const { return name_; }
  Device device() const { return device_; }

 private:
  void release();

  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
  std::string name_;
  Device device_ = Device::kCpu;
};

// RAII scratch scope: restores the arena's bump pointer on exit.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : a_(a), mark_(a.mark()) {}
  ~ArenaScope() { a_.reset(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& a_;
  size_t mark_;
};

}  // namespace mt
