// Data-path benchmark (not a test; never asserts a time):
//  1. GPT dataset index building for a 1-billion-token dataset of 4k-token
//     documents (target: under 2 s), median of 5;
//  2. `megatron preprocess` throughput on the default corpus with the GPT-2
//     tokenizer, 1 and 2 workers (target: >= 20 MB/s per worker, near-linear;
//     Megatron's preprocess_data.py measured 1.33 MB/s per worker here).
//
// usage: data_bench [CORPUS.jsonl VOCAB.json MERGES.txt]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"

using Clock = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  // 1. Index building.
  const int64_t docs = 244141, seq = 4096;
  std::vector<int32_t> lengths(docs, 4096);
  std::vector<double> ms;
  int64_t samples = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    auto idx = mt::data::build_gpt_indices(lengths, {0, docs}, std::nullopt, seq, 1234);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!idx.is_ok()) {
      std::fprintf(stderr, "index build failed: %s\n", idx.status().message().c_str());
      return 1;
    }
    samples = idx->num_samples();
  }
  std::printf("index build: %.3g tokens in %lld documents of 4096, seq-length %lld -> %lld samples: median %.0f ms "
              "(target < 2000 ms; %.1fx under it)\n",
              static_cast<double>(docs) * 4096, static_cast<long long>(docs), static_cast<long long>(seq),
              static_cast<long long>(samples), median(ms), 2000.0 / median(ms));

  // 2. Preprocess throughput.
  if (argc < 4) {
    std::printf("preprocess: skipped (usage: data_bench CORPUS.jsonl VOCAB.json MERGES.txt)\n");
    return 0;
  }
  mt::data::TokenizerConfig tc;
  tc.type = "GPT2BPETokenizer", tc.vocab_file = argv[2], tc.merge_file = argv[3];
  auto tok = mt::data::make_tokenizer(tc);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  const std::string out = std::filesystem::temp_directory_path() / ("mt_data_bench_" + std::to_string(getpid()));
  double per_worker[3] = {0, 0, 0};
  for (int workers : {1, 2}) {
    std::vector<double> mbs;
    uint64_t bytes = 0;
    for (int r = 0; r < 3; ++r) {
      mt::data::PreprocessOptions o;
      o.inputs = {argv[1]};
      o.output_prefix = out;
      o.append_eod = true;
      o.workers = workers;
      o.log_interval = 0;
      auto st = mt::data::preprocess(**tok, o, nullptr);
      if (!st.is_ok()) {
        std::fprintf(stderr, "preprocess failed: %s\n", st.status().message().c_str());
        return 1;
      }
      bytes = st->input_bytes;
      mbs.push_back(st->input_bytes / 1e6 / st->seconds);
    }
    per_worker[workers] = median(mbs);
    std::printf("preprocess: %.1f MB with %d worker%s: median %.1f MB/s (%.1f MB/s per worker; Megatron measured 1.33 per worker here: %.0fx)\n",
                bytes / 1e6, workers, workers == 1 ? "" : "s", median(mbs), median(mbs) / workers, median(mbs) / workers / 1.33);
  }
  std::printf("preprocess scaling 1 -> 2 workers: %.2fx\n", per_worker[2] / per_worker[1]);
  std::filesystem::remove(mt::data::output_name(out, "text") + ".bin");
  std::filesystem::remove(mt::data::output_name(out, "text") + ".idx");
  return 0;
}
