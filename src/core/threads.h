#pragma once
// Compute threads: kernels parallelise with OpenMP, the runtime oneDNN (Debian's
// build) also uses, so both share one pool. MPI ranks set 1 thread each.

namespace mt {

void set_num_threads(int n);  // n >= 1
int num_threads();

}  // namespace mt
