#pragma once
// Stand-in for CUDA's <cuda_runtime.h> in the host emulator (tests/cuda_emu,
// overview in ../emu.h): the runtime types and the subset of the runtime API
// that src/core/cuda/*.cu and src/kernels/cuda/*.cu call, with CUDA's names,
// signatures and enum values, implemented on the host in ../cuda_runtime.cc.
//
//   devices   one device, 0 ("CUDA emulator (host)"); cudaSetDevice(n != 0)
//             fails with cudaErrorInvalidDevice.
//   memory    cudaMalloc is page-aligned host memory (mmap) filled with 0xFF
//             (NaN in every float type), so a read of memory nobody wrote
//             shows; every allocation (and every __device__ variable passed
//             through cudaGetSymbolAddress) is registered as device memory.
//             cudaMemcpy*/cudaMemset* check each pointer against that
//             registry for the copy kind (a host pointer where a device one
//             is due is cudaErrorInvalidValue, with the reason on stderr).
//   events    cudaEventCreate/Record/Synchronize/ElapsedTime/Destroy on the
//             host clock (an event never recorded is cudaErrorInvalidResourceHandle
//             in ElapsedTime, as CUDA's cudaErrorInvalidResourceHandle for it).
//   streams   handles from cudaStreamCreateWithFlags, or 0; every operation
//             completes before the call returns (streams are synchronous).
//   kernels   cudaFuncSetAttribute with cudaFuncAttributeMaxDynamicSharedMemorySize
//             only: a kernel's dynamic shared memory may go up to the value
//             set (at most 232448 bytes, sm_90's 227 KiB) instead of 48 KiB;
//             a launch above its maximum sets cudaErrorInvalidValue (../emu.h).
//   errors    one sticky "last error" per process (launch configuration
//             errors land there, as on a GPU); names and strings are CUDA's.
// Anything else is missing on purpose: a .cu that calls it does not compile
// under the emulator until it is added here.

#include <cstddef>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

typedef struct CUstream_st* cudaStream_t;

// CUDA's values (driver_types.h).
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

constexpr unsigned cudaStreamNonBlocking = 0x01;

// CUDA's value (driver_types.h); the other attributes are left out, as
// cudaFuncSetAttribute does not implement them.
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct cudaDeviceProp {
  char name[256];
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);

cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

// Events: a recorded event holds the host clock at its record (streams are
// synchronous, so that is when the work before it finished).
typedef struct CUevent_st* cudaEvent_t;
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// The profiler's capture range (cuda_profiler_api.h): nothing to capture here.
cudaError_t cudaProfilerStart();
cudaError_t cudaProfilerStop();

// `func` is a kernel's address; any other attribute, a value out of range or
// a null func is cudaErrorInvalidValue (with the reason on stderr).
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
// The kernel itself (as CUDA's runtime offers it for C++): its address.
template <class T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// Emulator extensions (not CUDA API).
namespace emu {
// Registers [p, p + bytes) as device memory (a __device__ variable); idempotent.
void register_device_symbol(const void* p, size_t bytes);
// Inside device memory, or one past the end of a device allocation.
bool is_device_memory(const void* p);
// MT_EMU_TRACE=1 in the environment: every launch and cuBLASLt call on stderr.
bool trace();
}  // namespace emu

// The address of a __device__ variable (the emulator's variable is a host
// global, registered as device memory).
template <typename T>
cudaError_t cudaGetSymbolAddress(void** ptr, const T& symbol) {
  emu::register_device_symbol(&symbol, sizeof(T));
  *ptr = const_cast<T*>(&symbol);
  return cudaSuccess;
}
