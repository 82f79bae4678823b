#include "core/status.h"

#include <cstdlib>

namespace mt {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  std::fprintf(stderr, "[rank %s] internal error at %s:%d: check `%s` failed: %s\n",
               rank ? rank : "0", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace mt
