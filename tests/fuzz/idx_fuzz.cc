// libFuzzer target: the .idx/.bin reader. The input is split into an .idx
// and a .bin (the first byte chooses the cut), both are written to files and
// opened; whatever open() accepts must then read every sequence in bounds.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

static std::string g_prefix;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_prefix.empty()) g_prefix = "/tmp/mt_idx_fuzz_" + std::to_string(getpid());
  size_t cut = size ? (static_cast<size_t>(data[0]) * size) / 256 : 0;
  if (cut < 1) cut = size ? 1 : 0;
  FILE* f = std::fopen((g_prefix + ".idx").c_str(), "wb");
  if (size > 1) std::fwrite(data + 1, 1, cut - 1, f);
  std::fclose(f);
  f = std::fopen((g_prefix + ".bin").c_str(), "wb");
  if (size > cut) std::fwrite(data + cut, 1, size - cut, f);
  std::fclose(f);
  auto ds = mt::data::IndexedDataset::open(g_prefix);
  if (!ds.is_ok()) return 0;
  std::vector<int64_t> buf;
  for (int64_t s = 0; s < ds->num_sequences(); ++s) {
    buf.resize(static_cast<size_t>(ds->sequence_length(s)));
    ds->read(s, 0, ds->sequence_length(s), buf.data());
  }
  for (int64_t d = 0; d <= ds->num_documents(); ++d) (void)ds->document_index(d);
  return 0;
}
