// libFuzzer target: the JSONL reader (line cutting over a file) and the JSON
// text extractor on every line, with the keys preprocess uses.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/jsonl.h"

static std::string g_path;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_path.empty()) g_path = "/tmp/mt_jsonl_fuzz_" + std::to_string(getpid()) + ".jsonl";
  FILE* f = std::fopen(g_path.c_str(), "wb");
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto reader = mt::data::LineReader::open(g_path);
  if (!reader.is_ok()) return 0;
  mt::data::JsonTextExtractor json;
  const std::vector<std::string> keys = {"text", "title"};
  std::vector<std::vector<std::string>> texts;
  mt::data::LineBatch b;
  for (int guard = 0; guard < 1000; ++guard) {
    auto more = (*reader)->next(64, &b);  // tiny batches: many cuts
    if (!more.is_ok() || !*more) break;
    for (auto [off, len] : b.lines) {
      if (off + len > b.size) __builtin_trap();
      (void)json.extract(b.data.data() + off, len, b.data.size() - off, keys, &texts);
    }
  }
  return 0;
}
