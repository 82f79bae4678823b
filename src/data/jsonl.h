#pragma once
// JSONL input for `megatron preprocess`: lines from plain or gzip files, in
// large batches of whole lines, and the text fields of one JSON line.
//
// What counts as bad input follows Megatron's Python path
// (open(..., encoding='utf-8') then json.loads(line) per line): bytes that
// are not UTF-8, a line that is not one JSON object (blank lines included),
// a missing key, a value that is neither a string nor a list of strings, and
// a string with an unpaired UTF-16 surrogate escape (Python decodes it, then
// the tokenizer cannot encode it to UTF-8) all stop Megatron; here each is an
// error naming the file and line, which --skip-bad-lines can turn into a
// count.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mt::data {

// A block of whole lines. `data` has simdjson's padding after `size` bytes,
// so each line can be parsed in place.
struct LineBatch {
  std::string file;          // the file these lines come from
  int64_t first_line = 1;    // 1-based line number of lines[0]
  int64_t index = 0;         // batch number across all inputs
  std::vector<char> data;
  size_t size = 0;
  std::vector<std::pair<size_t, size_t>> lines;  // (offset, length without '\n')
};

class LineReader {
 public:
  // `path` may end in .gz (gzip, as Megatron's gzip.open(..., 'rt')).
  static Result<std::unique_ptr<LineReader>> open(const std::string& path);
  virtual ~LineReader() = default;
  // Fills `batch` with whole lines totalling about `target_bytes`; returns
  // false at the end of the file. A last line without '\n' counts.
  virtual Result<bool> next(size_t target_bytes, LineBatch* batch) = 0;
  virtual uint64_t bytes_read() const = 0;  // of the file on disk (compressed for .gz)
  virtual uint64_t file_size() const = 0;
};

// Expands a path or a glob pattern (sorted; Megatron's glob order is the
// file system's, which is not reproducible) into existing files.
Result<std::vector<std::string>> expand_inputs(const std::string& pattern);

// The texts of `keys` in one JSON line: for each key, one or more sentences
// (a string, or a list of strings). Needs simdjson padding after the line.
class JsonTextExtractor {
 public:
  JsonTextExtractor();
  ~JsonTextExtractor();
  // On error returns a message without file/line (the caller adds them).
  Status extract(const char* line, size_t len, size_t capacity, const std::vector<std::string>& keys,
                 std::vector<std::vector<std::string>>* texts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Bytes of padding LineBatch keeps after the data.
size_t json_padding();

}  // namespace mt::data
