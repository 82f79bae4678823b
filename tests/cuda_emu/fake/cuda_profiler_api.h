#pragma once
// The emulator's cuda_profiler_api.h: cudaProfilerStart/Stop are declared
// with the rest of the runtime (cuda_runtime.h).
#include "cuda_runtime.h"
