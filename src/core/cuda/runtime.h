#pragma once
// The CUDA runtime as the rest of megatron-cpp sees it: device memory, copies
// and the one stream every kernel of a rank runs on. Declared for every build
// (plain C++, no CUDA headers), defined in core/cuda/runtime.cu only when the
// CUDA backend is compiled (MT_HAVE_CUDA); callers test backend_info() or
// MT_HAVE_CUDA before calling.
//
// Errors: any failing runtime call aborts through mt::check_failed with the
// call's text, the CUDA error name and string, the device and the MPI rank
// (see MT_CUDA_CHECK in core/cuda/check.cuh). A device that runs out of memory
// says how much was asked, by whom, and how much is free.
//
// Streams: every rank drives one GPU (local rank -> device) and queues all of
// its kernels, copies and NCCL calls on one non-blocking stream, in program
// order, so no event bookkeeping is needed. Copies to the host synchronize it.

#include <cstddef>

namespace mt::cuda {

// Selects the device this thread (and the rank's stream) uses.
void set_device(int device);
int current_device();

void* device_malloc(size_t bytes, const char* what);
void device_free(void* p);
// Asynchronous on the rank's stream.
void memset_zero(void* p, size_t bytes);
void copy_d2d(void* dst, const void* src, size_t bytes);
// rows x width_bytes from src (row pitch src_pitch) to dst (dst_pitch), device to device.
void copy_d2d_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes, size_t rows);
// Host memory to device (pageable host memory: returns once the source may be reused).
void copy_h2d(void* dst, const void* src, size_t bytes);
// Device to host; waits for every earlier operation on the stream.
void copy_d2h(void* dst, const void* src, size_t bytes);
// Waits for the rank's stream.
void synchronize();
// The rank's stream as an opaque handle (a cudaStream_t).
void* stream_handle();
// A device buffer of at least `bytes` for an op's temporaries between its
// own kernels (owner: a name for the op, used in the out-of-memory message),
// one per owner, grown on demand and kept for the process. The op's calls
// run in order on the rank's stream, so each call may reuse it.
void* op_scratch(const char* owner, size_t bytes);
// Timing events (core/op_profile.h): created once and reused, recorded on the
// rank's stream; the milliseconds between two recorded events wait for the
// second one.
void* event_create();
void event_record(void* event);
float event_elapsed_ms(void* start, void* stop);
// cudaProfilerStart (on) / cudaProfilerStop (off): the capture range of a
// profiler started with nsys --capture-range=cudaProfilerApi.
void profiler_capture(bool on);

}  // namespace mt::cuda
