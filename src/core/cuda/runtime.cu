// The CUDA side of core/cuda/runtime.h.
#include <cuda_profiler_api.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>

#include "core/cuda/check.cuh"

namespace mt::cuda {

namespace {

constexpr int kMaxDevices = 64;
cudaStream_t g_streams[kMaxDevices] = {};
std::mutex g_mu;

}  // namespace

void cuda_failed(const char* file, int line, const char* call, cudaError_t err) {
  int dev = -1;
  (void)cudaGetDevice(&dev);
  ::mt::check_failed(file, line, call,
                     fmt::format("CUDA call failed on device {}: {} ({})", dev, cudaGetErrorName(err),
                                 cudaGetErrorString(err)));
}

void set_device(int device) { MT_CUDA_CHECK(cudaSetDevice(device)); }

int current_device() {
  int d = 0;
  MT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void* stream_handle() {
  int d = current_device();
  MT_CHECK(d >= 0 && d < kMaxDevices, "cuda::stream: device index out of range");
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_streams[d]) MT_CUDA_CHECK(cudaStreamCreateWithFlags(&g_streams[d], cudaStreamNonBlocking));
  return g_streams[d];
}

void* device_malloc(size_t bytes, const char* what) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    ::mt::check_failed(__FILE__, __LINE__, "cudaMalloc",
                       fmt::format("'{}' asked for {:.3f} GiB on device {} with {:.3f} GiB of {:.3f} GiB free ({}); "
                                   "`megatron plan` with the same flags shows the memory per rank",
                                   what, bytes / 1073741824.0, current_device(), free_b / 1073741824.0,
                                   total_b / 1073741824.0, cudaGetErrorName(e)));
  }
  return p;
}

void* op_scratch(const char* owner, size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::string, Buffer> buffers;
  std::lock_guard<std::mutex> lock(mu);
  Buffer& b = buffers[owner];
  if (bytes > b.bytes) {
    if (b.p) {
      synchronize();  // the op's earlier kernels may still use it
      device_free(b.p);
    }
    b.p = device_malloc(bytes, owner);
    b.bytes = bytes;
  }
  return b.p;
}

void* event_create() {
  cudaEvent_t e = nullptr;
  MT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void event_record(void* event) { MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream())); }

float event_elapsed_ms(void* start, void* stop) {
  MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
  return ms;
}

void profiler_capture(bool on) { MT_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

void device_free(void* p) {
  if (p) MT_CUDA_CHECK(cudaFree(p));
}

void memset_zero(void* p, size_t bytes) {
  if (bytes) MT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()));
}

void copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes) MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void copy_d2d_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes, size_t rows) {
  if (width_bytes && rows)
    MT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows, cudaMemcpyDeviceToDevice,
                                    stream()));
}

void copy_h2d(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  // Pageable source: the copy is staged before the call returns only for
  // small sizes; wait so the caller may reuse or free the host buffer.
  MT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void copy_d2h(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void synchronize() { MT_CUDA_CHECK(cudaStreamSynchronize(stream())); }

}  // namespace mt::cuda
