#include "data/jsonl.h"

#include <glob.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <simdjson.h>

namespace mt::data {

size_t json_padding() { return simdjson::SIMDJSON_PADDING; }

namespace {

// Shared block logic: keep a carry-over of the partial last line.
class BlockReader : public LineReader {
 public:
  explicit BlockReader(std::string path, uint64_t size) : path_(std::move(path)), size_(size) {}
  Result<bool> next(size_t target, LineBatch* b) override {
    b->file = path_;
    b->lines.clear();
    b->first_line = line_no_;
    b->data.swap(carry_);
    carry_.clear();
    const size_t chunk = std::max<size_t>(target, 1 << 16);
    size_t scanned = 0, line_start = 0;
    for (;;) {
      for (size_t i = scanned; i < b->data.size(); ++i)
        if (b->data[i] == '\n') {
          push_line(b, line_start, i);
          line_start = i + 1;
        }
      scanned = b->data.size();
      if (!b->lines.empty() && line_start >= target) break;
      if (eof_) {
        if (line_start < b->data.size()) {  // a last line without '\n'
          push_line(b, line_start, b->data.size());
          line_start = b->data.size();
        }
        break;
      }
      const size_t old = b->data.size();
      b->data.resize(old + chunk);
      auto got = read_some(b->data.data() + old, chunk);
      if (!got) return got.status();
      b->data.resize(old + *got);
      if (*got == 0) eof_ = true;
    }
    carry_.assign(b->data.begin() + static_cast<std::ptrdiff_t>(line_start), b->data.end());
    b->data.resize(line_start);
    b->size = b->data.size();
    b->data.resize(b->size + simdjson::SIMDJSON_PADDING, '\0');
    return !b->lines.empty();
  }

 protected:
  virtual Result<size_t> read_some(char* dst, size_t n) = 0;
  void push_line(LineBatch* b, size_t from, size_t to) {
    b->lines.emplace_back(from, to - from);
    ++line_no_;
  }
  std::string path_;
  uint64_t size_ = 0;
  int64_t line_no_ = 1;
  bool eof_ = false;
  std::vector<char> carry_;
};

class PlainReader final : public BlockReader {
 public:
  PlainReader(std::string path, uint64_t size, FILE* f) : BlockReader(std::move(path), size), f_(f) {}
  ~PlainReader() override { std::fclose(f_); }
  uint64_t bytes_read() const override { return read_; }
  uint64_t file_size() const override { return size_; }

 private:
  Result<size_t> read_some(char* dst, size_t n) override {
    size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) return Status::io_error(fmt::format("{}: read failed: {}", path_, std::strerror(errno)));
    read_ += got;
    return got;
  }
  FILE* f_;
  uint64_t read_ = 0;
};

class GzipReader final : public BlockReader {
 public:
  GzipReader(std::string path, uint64_t size, gzFile f) : BlockReader(std::move(path), size), f_(f) {}
  ~GzipReader() override { gzclose(f_); }
  uint64_t bytes_read() const override { return static_cast<uint64_t>(gzoffset(f_)); }
  uint64_t file_size() const override { return size_; }

 private:
  Result<size_t> read_some(char* dst, size_t n) override {
    int got = gzread(f_, dst, static_cast<unsigned>(std::min<size_t>(n, 1u << 30)));
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f_, &err);
      return Status::corrupt(fmt::format("{}: gzip: {}", path_, msg ? msg : "read error"));
    }
    if (got == 0) {  // the end: zlib reports a stream cut before its trailer as Z_BUF_ERROR
      int err = 0;
      gzerror(f_, &err);
      if (err == Z_BUF_ERROR)
        return Status::corrupt(fmt::format("{}: gzip: the compressed stream ends before its end marker at byte {} "
                                           "(the file is truncated: were all its bytes copied?)",
                                           path_, size_));
    }
    return static_cast<size_t>(got);
  }
  gzFile f_;
};

}  // namespace

Result<std::unique_ptr<LineReader>> LineReader::open(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::not_found(fmt::format("--input: cannot open '{}': {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return Status::invalid(fmt::format("--input: '{}' is not a regular file", path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return Status::not_found(fmt::format("--input: cannot open '{}'", path));
    gzbuffer(f, 1 << 20);
    return std::unique_ptr<LineReader>(new GzipReader(path, size, f));
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::not_found(fmt::format("--input: cannot open '{}': {}", path, std::strerror(errno)));
  return std::unique_ptr<LineReader>(new PlainReader(path, size, f));
}

Result<std::vector<std::string>> expand_inputs(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (files.empty()) return Status::not_found(fmt::format("--input: no file matches '{}'", pattern));
  std::sort(files.begin(), files.end());
  return files;
}

struct JsonTextExtractor::Impl {
  simdjson::dom::parser parser;
};

JsonTextExtractor::JsonTextExtractor() : impl_(new Impl) {}
JsonTextExtractor::~JsonTextExtractor() = default;

namespace {

std::string describe(simdjson::error_code e) {
  switch (e) {
    case simdjson::UTF8_ERROR: return "invalid UTF-8 (Megatron's utf-8 reader stops on it too)";
    case simdjson::STRING_ERROR:
      return "bad string escape (an unpaired \\ud800-\\udfff surrogate cannot be encoded to UTF-8 for tokenizing)";
    case simdjson::UNCLOSED_STRING: return "unterminated string";
    case simdjson::EMPTY: return "empty line (not a JSON object)";
    case simdjson::TAPE_ERROR: return "not valid JSON (unexpected or trailing characters)";
    default: return std::string("not valid JSON: ") + simdjson::error_message(e);
  }
}

}  // namespace

Status JsonTextExtractor::extract(const char* line, size_t len, size_t capacity, const std::vector<std::string>& keys,
                                  std::vector<std::vector<std::string>>* texts) {
  using namespace simdjson;
  texts->assign(keys.size(), {});
  // The DOM parser validates all of it: UTF-8, escapes, trailing characters.
  // Python's json.loads accepts surrounding whitespace; so does simdjson.
  if (len + SIMDJSON_PADDING > capacity) return Status::internal("line without simdjson padding");
  dom::element doc;
  auto err = impl_->parser.parse(reinterpret_cast<const uint8_t*>(line), len, /*realloc_if_needed=*/false).get(doc);
  if (err) return Status::invalid(describe(err));
  dom::object obj;
  if (doc.get(obj)) return Status::invalid("the line is JSON but not an object");
  // Python keeps the last of duplicate keys.
  std::vector<dom::element> values(keys.size());
  std::vector<bool> found(keys.size(), false);
  for (auto field : obj) {
    const size_t k = std::find(keys.begin(), keys.end(), field.key) - keys.begin();
    if (k == keys.size()) continue;
    values[k] = field.value;
    found[k] = true;
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!found[k]) return Status::invalid(fmt::format("no key \"{}\" (give the right --json-keys)", keys[k]));
    auto& out = (*texts)[k];
    std::string_view s;
    dom::array arr;
    if (!values[k].get(s)) {
      out.emplace_back(s);
    } else if (!values[k].get(arr)) {
      for (dom::element item : arr) {
        if (item.get(s)) return Status::invalid(fmt::format("key \"{}\": a list must hold only strings", keys[k]));
        out.emplace_back(s);
      }
    } else {
      return Status::invalid(fmt::format("key \"{}\" is not a string or a list of strings", keys[k]));
    }
  }
  return Status::ok();
}

}  // namespace mt::data
