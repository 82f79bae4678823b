#include "core/sim_device.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/status.h"

namespace mt::simdev {

namespace {

std::mutex g_mu;
std::map<void*, size_t> g_blocks;  // start -> mapped bytes
int g_depth = 0;

void protect_all(int prot) {
  for (const auto& [p, n] : g_blocks)
    MT_CHECK(mprotect(p, n, prot) == 0, "simulated device: mprotect failed");
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MT_SIMULATE_CUDA");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void* alloc(size_t bytes) {
  size_t n = bytes == 0 ? 1 : bytes;
  void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // zero-filled
  MT_CHECK(p != MAP_FAILED, "simulated device: cannot map " + std::to_string(n) + " bytes");
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_depth > 0) MT_CHECK(mprotect(p, n, PROT_READ | PROT_WRITE) == 0, "simulated device: mprotect failed");
  g_blocks[p] = n;
  return p;
}

void release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_blocks.find(p);
  MT_CHECK(it != g_blocks.end(), "simulated device: freeing an unknown block");
  munmap(it->first, it->second);
  g_blocks.erase(it);
}

HostScope::HostScope() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

HostScope::~HostScope() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_depth == 0) protect_all(PROT_NONE);
}

}  // namespace mt::simdev
