#pragma once
// MT_HOST_DEVICE marks small header functions (Philox, index math) that CUDA
// kernels call as well as the CPU code, so both backends compute the same bits.
#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif
