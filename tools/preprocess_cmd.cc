// megatron preprocess: JSONL -> Megatron .bin/.idx, as tools/preprocess_data.py.

#include <fmt/format.h>

#include <cstdio>
#include <thread>

#include "commands.h"
#include "core/flags.h"
#include "data/jsonl.h"
#include "data/preprocess.h"
#include "data/tokenizer_flags.h"

namespace mt::tools {

int preprocess_main(const std::vector<std::string>& args) {
  data::TokenizerConfig tok_cfg;
  data::PreprocessOptions o;
  std::string input, dataset_impl = "mmap";
  std::vector<std::string> json_keys;
  bool split_sentences = false, keep_newlines = false, help = false, quiet = false;
  std::optional<int64_t> workers;
  int64_t partitions = 1;
  FlagSet f("megatron preprocess",
            "Turns JSONL text into Megatron's {output-prefix}_{key}_document.bin/.idx, byte-identical to\n"
            "Megatron-LM's tools/preprocess_data.py. Exit code 0: done; 2: bad flags or input; 1: I/O failure.");
  f.section("input data");
  f.add_string("input", &input, "JSONL file, .jsonl.gz, or a glob of them (processed in sorted order)");
  f.add_list("json-keys", &json_keys, "keys to extract from each JSON line (default: text)");
  f.add_switch("split-sentences", &split_sentences, "split documents into sentences (needs NLTK punkt; not supported)");
  f.add_switch("keep-newlines", &keep_newlines, "keep newlines between split sentences (only with --split-sentences)");
  f.add_switch("skip-bad-lines", &o.skip_bad_lines, "skip malformed JSON lines, missing keys and bad UTF-8, and report how many (Megatron stops)");
  data::register_tokenizer_flags(f, tok_cfg);
  f.section("tokenization process");
  f.add_switch("append-eod", &o.append_eod, "append the end-of-document token to every non-empty document");
  f.add_switch("legacy-uncounted-eod", &o.legacy_uncounted_eod,
               "with --append-eod, reproduce Megatron-LM <= 23.06 byte for byte: the EOD is written but not counted in "
               "the sequence length (fixed upstream in August 2023)");
  f.section("output data");
  f.add_string("output-prefix", &o.output_prefix, "path prefix of the output files, without suffix");
  f.add_string("dataset-impl", &dataset_impl, "index format (older Megatron releases): only mmap exists", {"mmap"});
  f.section("runtime");
  f.add_int("workers", &workers, "tokenizing threads (default: all cores)", 1, 4096);
  f.add_int("partitions", &partitions, "Megatron's input partitions: line i goes to partition i mod N, then partitions are concatenated", 1, 4096);
  f.add_switch("keep-sequential-samples", &o.keep_sequential_samples, "with --partitions > 1, partition in contiguous blocks (keeps the input order)");
  f.add_int("log-interval", &o.log_interval, "documents between progress lines on stderr (0: none)", 0, INT64_MAX);
  f.add_switch("quiet", &quiet, "no progress lines");
  f.add_switch("help", &help, "show this help");

  if (Status st = f.parse(args); !st) {
    std::fprintf(stderr, "megatron preprocess: error: %s\n", st.message().c_str());
    return 2;
  }
  if (help) {
    std::fputs(f.help().c_str(), stdout);
    return 0;
  }
  auto fail = [](const std::string& m, int code = 2) {
    std::fprintf(stderr, "megatron preprocess: error: %s\n", m.c_str());
    return code;
  };
  if (input.empty()) return fail("--input is required (a JSONL file, .jsonl.gz, or a glob)");
  if (o.output_prefix.empty()) return fail("--output-prefix is required");
  if (tok_cfg.type.empty()) return fail("--tokenizer-type is required (e.g. GPT2BPETokenizer)");
  if (split_sentences)
    return fail("--split-sentences needs NLTK's punkt sentence splitter, which megatron-cpp does not have; "
                "split the text into a list of sentences in the JSON instead (a list value is one sequence per sentence)");
  if (keep_newlines) return fail("--keep-newlines only applies with --split-sentences");
  if (!json_keys.empty()) o.json_keys = json_keys;
  o.workers = static_cast<int>(workers.value_or(std::max(1u, std::thread::hardware_concurrency())));
  o.partitions = static_cast<int>(partitions);
  if (quiet) o.log_interval = 0;

  auto files = data::expand_inputs(input);
  if (!files) return fail(files.status().message());
  o.inputs = *files;
  auto tok = data::make_tokenizer(tok_cfg);
  if (!tok) return fail(tok.status().message());

  auto stats = data::preprocess(**tok, o, quiet ? nullptr : stderr);
  if (!stats) return fail(stats.status().message(), stats.status().code() == StatusCode::kIoError ? 1 : 2);
  const auto& s = *stats;
  if (s.skipped_lines > 0) {
    std::fprintf(stderr, "skipped %lld bad line(s), for example:\n", static_cast<long long>(s.skipped_lines));
    for (const auto& e : s.skipped_examples) std::fprintf(stderr, "  %s\n", e.c_str());
  }
  if (!quiet) std::fprintf(stderr, "Done: %lld documents (%lld empty), %lld tokens per key, %.2f MB in %.2f s (%.2f MB/s, %d worker%s)\n",
               static_cast<long long>(s.documents), static_cast<long long>(s.empty_documents),
               static_cast<long long>(s.tokens), s.input_bytes / 1e6, s.seconds, s.input_bytes / 1e6 / std::max(s.seconds, 1e-9),
               o.workers, o.workers == 1 ? "" : "s");
  for (const auto& p : s.outputs) std::printf("%s.bin\n%s.idx\n", p.c_str(), p.c_str());
  return 0;
}

}  // namespace mt::tools
