// megatron tokenize: text -> token ids (and back) with any --tokenizer-type,
// for looking at what a tokenizer does and for comparing it with other
// implementations (tests/data/tiktoken_compare.mjs).
//
//   megatron tokenize --tokenizer-type GPT2BPETokenizer --vocab-file V --merge-file M --text "Hello world"
//   megatron tokenize ... --input docs.jsonl [--json-keys text] [--output ids.txt] [--append-eod]
//   megatron tokenize ... --decode --input ids.txt          (one line of ids -> one {"text": ...} line)
//
// Output: one line per document, its ids separated by spaces (all keys and
// list items of a JSON line, in order). Input JSONL is read as
// `megatron preprocess` reads it (plain, .gz or a glob; bad lines are errors
// that name the file and line).

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/flags.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "data/tokenizer_flags.h"

namespace mt::tools {

namespace {

class Output {
 public:
  Status open(const std::string& path) {
    if (path.empty() || path == "-") {
      f_ = stdout;
      return Status::ok();
    }
    path_ = path;
    f_ = std::fopen(path.c_str(), "wb");
    if (f_ == nullptr) return Status::io_error(fmt::format("--output {}: cannot open for writing", path));
    return Status::ok();
  }
  void ids(const std::vector<int32_t>& v) {
    char num[16];
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) buf_.push_back(' ');
      buf_.append(num, std::to_chars(num, num + sizeof num, v[i]).ptr);
    }
    buf_.push_back('\n');
    if (buf_.size() > (1 << 20)) flush();
  }
  void text(std::string_view s) {
    buf_.append(s);
    if (buf_.size() > (1 << 20)) flush();
  }
  Status close() {
    flush();
    const bool bad = std::ferror(f_) != 0;
    if (f_ != stdout) {
      if (std::fclose(f_) != 0 || bad) return Status::io_error(fmt::format("--output {}: write failed", path_));
    } else if (std::fflush(f_) != 0 || bad) {
      return Status::io_error("writing to stdout failed");
    }
    return Status::ok();
  }

 private:
  void flush() {
    if (!buf_.empty()) std::fwrite(buf_.data(), 1, buf_.size(), f_);
    buf_.clear();
  }
  FILE* f_ = nullptr;
  std::string path_;
  std::string buf_;
};

// Parses one line of whitespace-separated ids.
Status parse_ids(std::string_view line, std::vector<int32_t>* ids) {
  ids->clear();
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == line.size()) break;
    const size_t s = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    int64_t v = 0;
    Status st = parse_int("id", std::string(line.substr(s, i - s)), INT32_MIN, INT32_MAX, &v);
    if (!st) return Status::invalid(fmt::format("byte {}: \"{}\" is not an integer id", s, line.substr(s, i - s)));
    ids->push_back(static_cast<int32_t>(v));
  }
  return Status::ok();
}

}  // namespace

int tokenize_main(const std::vector<std::string>& args) {
  data::TokenizerConfig tok_cfg;
  std::string input, output, text;
  std::vector<std::string> json_keys;
  bool append_eod = false, decode = false, help = false, quiet = false;
  FlagSet f("megatron tokenize",
            "Prints the token ids of a text (--text) or of each JSON line of --input, one line of\n"
            "space-separated ids per document; --decode turns such lines back into {\"text\": ...} lines.\n"
            "Exit code 0: done; 2: bad flags or input; 1: I/O failure.");
  f.section("input");
  f.add_string("text", &text, "tokenize this text and print its ids");
  f.add_string("input", &input, "JSONL file, .jsonl.gz or a glob (with --decode: a file of id lines; - for stdin)");
  f.add_list("json-keys", &json_keys, "keys of each JSON line to tokenize, in order (default: text)");
  f.add_switch("decode", &decode, "read lines of ids and print each decoded text as a JSON line");
  data::register_tokenizer_flags(f, tok_cfg);
  f.section("output");
  f.add_switch("append-eod", &append_eod, "end each non-empty document with the EOD id, as preprocess --append-eod");
  f.add_string("output", &output, "write here instead of stdout");
  f.add_switch("quiet", &quiet, "no summary on stderr");
  f.add_switch("help", &help, "show this help");

  if (Status st = f.parse(args); !st) {
    std::fprintf(stderr, "megatron tokenize: error: %s\n", st.message().c_str());
    return 2;
  }
  if (help) {
    std::fputs(f.help().c_str(), stdout);
    return 0;
  }
  auto fail = [](const std::string& m, int code = 2) {
    std::fprintf(stderr, "megatron tokenize: error: %s\n", m.c_str());
    return code;
  };
  if (f.given("text") == !input.empty())
    return fail("give exactly one of --text and --input");
  if (json_keys.empty()) json_keys = {"text"};
  auto made = data::make_tokenizer(tok_cfg);
  if (!made) return fail(made.status().message());
  const data::Tokenizer& tok = **made;

  Output out;
  if (Status st = out.open(output); !st) return fail(st.message(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t docs = 0, tokens = 0, bytes = 0;
  std::vector<int32_t> ids;

  if (decode) {
    if (f.given("text")) {
      if (Status st = parse_ids(text, &ids); !st) return fail("--text: " + st.message());
      auto s = tok.decode(ids);
      if (!s) return fail("--text: " + s.status().message());
      out.text(*s);
      out.text("\n");
    } else {
      std::ifstream in_file;
      std::istream* in = &std::cin;
      if (input != "-") {
        in_file.open(input, std::ios::binary);
        if (!in_file) return fail(fmt::format("--input {}: cannot open", input));
        in = &in_file;
      }
      std::string line;
      int64_t line_no = 0;
      while (std::getline(*in, line)) {
        ++line_no;
        if (Status st = parse_ids(line, &ids); !st) return fail(fmt::format("{}:{}: {}", input, line_no, st.message()));
        auto s = tok.decode(ids);
        if (!s) return fail(fmt::format("{}:{}: {}", input, line_no, s.status().message()));
        // Decoded bytes need not be UTF-8 (a cut inside a character); JSON
        // needs UTF-8, so such bytes are replaced (as Megatron's decode does).
        out.text(nlohmann::json({{"text", *s}}).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        out.text("\n");
        ++docs;
        tokens += static_cast<int64_t>(ids.size());
      }
    }
    if (Status st = out.close(); !st) return fail(st.message(), 1);
    return 0;
  }

  auto emit = [&](std::string_view what, const std::vector<std::string_view>& texts) -> Status {
    ids.clear();
    for (std::string_view t : texts) {
      if (Status st = tok.encode_checked(t, &ids); !st) return Status::invalid(fmt::format("{}: {}", what, st.message()));
      bytes += static_cast<int64_t>(t.size());
    }
    if (append_eod && !ids.empty()) ids.push_back(tok.eod());
    out.ids(ids);
    ++docs;
    tokens += static_cast<int64_t>(ids.size());
    return Status::ok();
  };

  if (f.given("text")) {
    if (Status st = emit("--text", {text}); !st) return fail(st.message());
  } else {
    auto files = data::expand_inputs(input);
    if (!files) return fail(files.status().message());
    data::JsonTextExtractor extractor;
    std::vector<std::vector<std::string>> texts;
    std::vector<std::string_view> flat;
    for (const std::string& file : *files) {
      auto reader = data::LineReader::open(file);
      if (!reader) return fail(reader.status().message(), reader.status().code() == StatusCode::kIoError ? 1 : 2);
      data::LineBatch batch;
      for (;;) {
        auto more = (*reader)->next(size_t{4} << 20, &batch);
        if (!more) return fail(more.status().message(), more.status().code() == StatusCode::kIoError ? 1 : 2);
        if (!*more) break;
        for (size_t i = 0; i < batch.lines.size(); ++i) {
          const auto [off, len] = batch.lines[i];
          const std::string where = fmt::format("{}:{}", file, batch.first_line + static_cast<int64_t>(i));
          Status st = extractor.extract(batch.data.data() + off, len, batch.data.size() - off, json_keys, &texts);
          if (!st) return fail(fmt::format("{}: {}", where, st.message()));
          flat.clear();
          for (const auto& per_key : texts)
            for (const auto& s : per_key) flat.push_back(s);
          if (Status e = emit(where, flat); !e) return fail(e.message());
        }
      }
    }
  }
  if (Status st = out.close(); !st) return fail(st.message(), 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet && !f.given("text"))
    std::fprintf(stderr, "megatron tokenize: %lld documents, %.2f MB, %lld tokens in %.2f s (%.1f MB/s, %s)\n",
                 static_cast<long long>(docs), bytes / 1e6, static_cast<long long>(tokens), secs,
                 bytes / 1e6 / std::max(secs, 1e-9), tok.name().c_str());
  return 0;
}

}  // namespace mt::tools
