#pragma once
// `megatron preprocess`: JSONL text -> Megatron's {prefix}_{key}_document.bin/.idx
// (../shared/spec/megatron-reference.md §1.5), byte-identical to Megatron's
// tools/preprocess_data.py for the same tokenizer and flags.
//
// Pipeline: one reader thread cuts the inputs into batches of whole lines,
// `workers` threads parse and tokenize batches, and the calling thread writes
// the results strictly in input order, so any number of workers gives the
// same bytes as one. Outputs are written under temporary names and renamed
// only when complete.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace mt::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;          // files, in order (expand globs first)
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  // Megatron-LM up to 23.06 wrote the EOD to .bin without counting it in the
  // document's last sequence length (fixed upstream in August 2023). Files
  // made with it differ from today's; this reproduces them byte for byte.
  bool legacy_uncounted_eod = false;
  int workers = 1;
  // Megatron's --partitions N: line i goes to partition i mod N (or to
  // contiguous blocks with keep_sequential_samples) and the partitions are
  // concatenated, so N > 1 changes the document order exactly as Megatron does.
  int partitions = 1;
  bool keep_sequential_samples = false;
  bool skip_bad_lines = false;   // count and skip malformed lines instead of stopping
  int64_t log_interval = 1000;   // documents between progress lines (0: none)
  size_t batch_bytes = 1 << 20;  // bytes of input per work item
};

struct PreprocessStats {
  int64_t lines = 0;             // input lines read
  int64_t documents = 0;         // documents written (per key)
  int64_t empty_documents = 0;   // documents that tokenized to nothing (kept, with no sequences)
  int64_t skipped_lines = 0;
  std::vector<std::string> skipped_examples;  // the first few "file:line: why"
  int64_t tokens = 0;            // per key, EOD included
  uint64_t input_bytes = 0;      // line bytes processed
  double seconds = 0;
  std::vector<std::string> outputs;  // prefixes written
};

// Output prefix for one key: {output_prefix}_{key}_document.
std::string output_name(const std::string& output_prefix, const std::string& key);

Result<PreprocessStats> preprocess(const Tokenizer& tokenizer, const PreprocessOptions& opts, std::FILE* progress);

}  // namespace mt::data
