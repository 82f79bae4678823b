#pragma once
// A simulated CUDA device, for testing the device plumbing where there is no
// GPU (CI, this 2-core machine). With MT_SIMULATE_CUDA=1 in the environment:
//  - backend_info() reports one "simulated" GPU, so `megatron train` picks
//    Device::kCuda exactly as it would on a real one;
//  - a kCuda Arena is host memory mapped PROT_NONE: any read or write of
//    "device" memory from host code faults at once (SIGSEGV at the access),
//    as dereferencing a real device pointer would be a silent bug or a crash;
//  - kernels dispatched on kCuda tensors run their CPU twins inside a
//    HostScope, which makes every simulated block readable and writable for
//    the kernel's duration; copy_tensor and Tensor::zero do the same.
// So a run under simulation computes exactly the CPU backend's numbers while
// proving that model, optimizer, checkpoint and trainer code reach device
// memory only through kernels and copies. Real CUDA builds ignore it unless
// the variable is set; it is for tests.

#include <cstddef>

namespace mt::simdev {

// MT_SIMULATE_CUDA=1 (read once).
bool enabled();

// Page-aligned, zero-filled, PROT_NONE outside HostScopes.
void* alloc(size_t bytes);
void release(void* p);

// While at least one HostScope is alive (any thread), every simulated block
// is readable and writable.
class HostScope {
 public:
  HostScope();
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;
};

}  // namespace mt::simdev
