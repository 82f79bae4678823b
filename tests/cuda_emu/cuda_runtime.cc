// The emulator's CUDA runtime (fake/cuda_runtime.h has the contract): one
// device, device memory as registered host memory, synchronous streams, a
// sticky last error, kernels' dynamic shared memory maxima.

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "emu.h"

namespace emu {
namespace {

struct Region {
  size_t bytes;   // as asked for
  size_t mapped;  // mmap'd length (cudaMalloc), 0 for a __device__ variable
};

std::mutex g_mu;
std::map<const char*, Region> g_device;  // device memory by start address
std::set<cudaStream_t> g_streams;
size_t g_allocated = 0;
cudaError_t g_last_error = cudaSuccess;
int g_current_device = 0;
// cudaFuncAttributeMaxDynamicSharedMemorySize by kernel address; a kernel
// not here has the default.
std::map<const void*, size_t> g_max_dynamic_shared;

// sm_90 (H100, H200): 48 KiB of dynamic shared memory by default, and at
// most 227 KiB (cudaDevAttrMaxSharedMemoryPerBlockOptin) when opted in.
constexpr size_t kDefaultMaxDynamicShared = size_t{48} << 10;
constexpr int kOptinMaxDynamicShared = 232448;

// The device allocation holding [p, p + bytes) (bytes == 0: p may be its end), or end().
std::map<const char*, Region>::const_iterator find_device(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto it = g_device.upper_bound(c);
  if (it == g_device.begin()) return g_device.end();
  --it;
  const size_t offset = static_cast<size_t>(c - it->first);
  return offset + bytes <= it->second.bytes ? it : g_device.end();
}

bool on_device(const void* p, size_t bytes) { return find_device(p, bytes) != g_device.end(); }

cudaError_t invalid(const char* call, const char* why, const void* p) {
  std::fprintf(stderr, "emu: %s: %s (%p)\n", call, why, p);
  return cudaErrorInvalidValue;
}

}  // namespace

void register_device_symbol(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_device.emplace(static_cast<const char*>(p), Region{bytes, 0});
}

bool is_device_memory(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return on_device(p, 0);
}

bool is_valid_stream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mu);
  return stream == nullptr || g_streams.count(stream) != 0;
}

void set_last_error(cudaError_t error) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_last_error = error;
}

size_t max_dynamic_shared_bytes(const void* func) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_max_dynamic_shared.find(func);
  return it == g_max_dynamic_shared.end() ? kDefaultMaxDynamicShared : it->second;
}

bool trace() {
  static const bool on = [] {
    const char* v = std::getenv("MT_EMU_TRACE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

}  // namespace emu

using emu::g_mu;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulator (host)");
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(g_mu);
  emu::g_current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  std::lock_guard<std::mutex> lock(g_mu);
  *device = emu::g_current_device;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(g_mu);
  const cudaError_t e = emu::g_last_error;
  emu::g_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  // Page-aligned (cudaMalloc promises 256 bytes), in transparent huge pages
  // where the kernel allows: tests allocate arenas of hundreds of MiB, and
  // 4 KiB pages would spend more time in page faults than in the kernels.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  madvise(p, mapped, MADV_HUGEPAGE);
  std::memset(p, 0xFF, bytes);  // uninitialised device memory: NaN in every float type
  std::lock_guard<std::mutex> lock(g_mu);
  emu::g_device.emplace(static_cast<const char*>(p), emu::Region{bytes, mapped});
  emu::g_allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = emu::g_device.find(static_cast<const char*>(ptr));
  if (it == emu::g_device.end() || it->second.mapped == 0)
    return emu::invalid("cudaFree", "not a pointer returned by cudaMalloc", ptr);
  const size_t mapped = it->second.mapped;
  emu::g_allocated -= it->second.bytes;
  emu::g_device.erase(it);
  munmap(ptr, mapped);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const size_t total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::lock_guard<std::mutex> lock(g_mu);
  *total_bytes = total;
  *free_bytes = total > emu::g_allocated ? total - emu::g_allocated : 0;
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (!emu::is_valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!emu::on_device(ptr, bytes))
      return emu::invalid("cudaMemsetAsync", "the range is not inside one device allocation", ptr);
  }
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!emu::is_valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const bool dst_dev = emu::on_device(dst, bytes), src_dev = emu::on_device(src, bytes);
    switch (kind) {
      case cudaMemcpyHostToHost:
        if (dst_dev || src_dev)
          return emu::invalid("cudaMemcpyAsync", "HostToHost with device memory", dst_dev ? dst : src);
        break;
      case cudaMemcpyHostToDevice:
        if (!dst_dev)
          return emu::invalid("cudaMemcpyAsync", "HostToDevice: the destination is not inside one device allocation",
                              dst);
        if (src_dev) return emu::invalid("cudaMemcpyAsync", "HostToDevice: the source is device memory", src);
        break;
      case cudaMemcpyDeviceToHost:
        if (!src_dev)
          return emu::invalid("cudaMemcpyAsync", "DeviceToHost: the source is not inside one device allocation", src);
        if (dst_dev) return emu::invalid("cudaMemcpyAsync", "DeviceToHost: the destination is device memory", dst);
        break;
      case cudaMemcpyDeviceToDevice:
        if (!dst_dev)
          return emu::invalid("cudaMemcpyAsync", "DeviceToDevice: the destination is not inside one device allocation",
                              dst);
        if (!src_dev)
          return emu::invalid("cudaMemcpyAsync", "DeviceToDevice: the source is not inside one device allocation", src);
        break;
      case cudaMemcpyDefault: break;
      default: return emu::invalid("cudaMemcpyAsync", "unknown cudaMemcpyKind", dst);
    }
  }
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

// Device to device only (the one kind core/cuda uses): each pitch at least
// the width, and every row of both regions inside one device allocation.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (!emu::is_valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  if (kind != cudaMemcpyDeviceToDevice)
    return emu::invalid("cudaMemcpy2DAsync", "only DeviceToDevice is emulated", dst);
  if (dpitch < width || spitch < width) return emu::invalid("cudaMemcpy2DAsync", "a pitch below the width", dst);
  if (!width || !height) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!emu::on_device(dst, (height - 1) * dpitch + width))
      return emu::invalid("cudaMemcpy2DAsync", "the destination rows are not inside one device allocation", dst);
    if (!emu::on_device(src, (height - 1) * spitch + width))
      return emu::invalid("cudaMemcpy2DAsync", "the source rows are not inside one device allocation", src);
  }
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (flags & ~cudaStreamNonBlocking) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(g_mu);
  // A distinct, never dereferenced handle; streams are never destroyed here.
  *stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x57000 + 0x10 * (emu::g_streams.size() + 1)));
  emu::g_streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return emu::is_valid_stream(stream) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (!event) return cudaErrorInvalidValue;
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event || !emu::is_valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  event->at = std::chrono::steady_clock::now();
  event->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event ? cudaSuccess : cudaErrorInvalidResourceHandle; }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return cudaErrorInvalidValue;
  if (!start || !end || !start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaProfilerStart() { return cudaSuccess; }
cudaError_t cudaProfilerStop() { return cudaSuccess; }

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return emu::invalid("cudaFuncSetAttribute", "no kernel", func);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return emu::invalid("cudaFuncSetAttribute", "only cudaFuncAttributeMaxDynamicSharedMemorySize is emulated", func);
  // The GPU also counts the kernel's static shared memory against the 227
  // KiB here; the emulator only learns it when a block declares it, and
  // checks the sum then (emu::shared_block).
  if (value < 0 || value > emu::kOptinMaxDynamicShared) {
    std::fprintf(stderr, "emu: cudaFuncSetAttribute: %d bytes of dynamic shared memory, outside 0..%d (%p)\n", value,
                 emu::kOptinMaxDynamicShared, func);
    return cudaErrorInvalidValue;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  emu::g_max_dynamic_shared[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
