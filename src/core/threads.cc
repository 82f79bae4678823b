#include "core/threads.h"

#include <omp.h>

#include "core/status.h"

namespace mt {

void set_num_threads(int n) {
  MT_CHECK(n >= 1, "set_num_threads: n must be >= 1");
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace mt
