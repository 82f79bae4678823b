// The preprocess pipeline with a simple byte tokenizer (one id per UTF-8
// byte, EOD 256): ordering across workers and partitions, documents and
// sentences, the legacy EOD mode, and every kind of bad line.
#include "data/preprocess.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "data/indexed_dataset.h"
#include "data/jsonl.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

class ByteTokenizer final : public Tokenizer {
 public:
  void encode(std::string_view text, std::vector<int32_t>* out) const override {
    for (unsigned char c : text) out->push_back(c);
  }
  Result<std::string> decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t i : ids) {
      if (i < 0 || i > 255) return Status::invalid("id out of range");
      s += static_cast<char>(i);
    }
    return s;
  }
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  std::string name() const override { return "ByteTokenizer"; }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Dir {
  fs::path path;
  Dir() {
    path = fs::path(::testing::TempDir()) /
           ("mt_pre_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
  void write(const std::string& n, const std::string& content) const {
    std::ofstream(path / n, std::ios::binary) << content;
  }
};

// Documents as the reader sees them: per document, its tokens.
std::vector<std::vector<int32_t>> documents(const std::string& prefix) {
  auto ds = IndexedDataset::open(prefix);
  EXPECT_TRUE(ds.is_ok()) << ds.status().message();
  std::vector<std::vector<int32_t>> docs;
  for (int64_t d = 0; d < ds->num_documents(); ++d) {
    std::vector<int32_t> t;
    for (int64_t s = ds->document_index(d); s < ds->document_index(d + 1); ++s) {
      size_t at = t.size();
      t.resize(at + ds->sequence_length(s));
      ds->read(s, 0, ds->sequence_length(s), t.data() + at);
    }
    docs.push_back(std::move(t));
  }
  return docs;
}

std::vector<int32_t> ids(const std::string& s, bool eod = true) {
  std::vector<int32_t> v(s.begin(), s.end());
  for (auto& x : v) x &= 0xFF;
  if (eod && !s.empty()) v.push_back(256);
  return v;
}

std::string corpus(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string text;
    const int len = static_cast<int>(rng() % 200);
    for (int k = 0; k < len; ++k) text += static_cast<char>('a' + rng() % 26);
    if (i % 17 == 0) text.clear();  // empty documents too
    out += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + text + "\"}\n";
  }
  return out;
}

TEST(Preprocess, WorkersGiveIdenticalBytes) {
  Dir dir;
  const std::string text = corpus(3000, 7);
  dir.write("in.jsonl", text);
  int64_t empties = 0;
  for (size_t at = 0; (at = text.find("\"text\": \"\"", at)) != std::string::npos; ++at) ++empties;
  ByteTokenizer tok;
  std::string ref_bin, ref_idx;
  for (int workers : {1, 2, 5}) {
    PreprocessOptions o;
    o.inputs = {dir / "in.jsonl"};
    o.output_prefix = dir / ("w" + std::to_string(workers));
    o.append_eod = true;
    o.workers = workers;
    o.batch_bytes = 4096;  // many batches, so ordering matters
    auto st = preprocess(tok, o, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    EXPECT_EQ(st->documents, 3000);
    EXPECT_EQ(st->empty_documents, empties);
    EXPECT_GE(empties, (3000 + 16) / 17);
    const std::string prefix = output_name(o.output_prefix, "text");
    EXPECT_EQ(st->outputs, std::vector<std::string>{prefix});
    if (workers == 1) {
      ref_bin = slurp(prefix + ".bin"), ref_idx = slurp(prefix + ".idx");
      auto docs = documents(prefix);
      ASSERT_EQ(docs.size(), 3000u);
      EXPECT_TRUE(docs[0].empty());
      EXPECT_EQ(docs[1].back(), 256);
    } else {
      EXPECT_EQ(slurp(prefix + ".bin"), ref_bin) << workers << " workers";
      EXPECT_EQ(slurp(prefix + ".idx"), ref_idx) << workers << " workers";
    }
  }
  // No temporaries remain.
  for (auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(Preprocess, SentencesKeysAndEod) {
  Dir dir;
  dir.write("in.jsonl",
            "{\"text\": [\"ab\", \"\", \"c\"], \"title\": \"T\"}\n"
            "{\"text\": \"\", \"title\": \"\"}\r\n"
            "  {\"title\": \"x\\u00e9\", \"text\": \"d\\n\"}  \n"
            "{\"text\": \"e\", \"title\": \"y\", \"text\": \"f\"}");  // no final newline; last duplicate wins
  ByteTokenizer tok;
  PreprocessOptions o;
  o.inputs = {dir / "in.jsonl"};
  o.output_prefix = dir / "out";
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  auto st = preprocess(tok, o, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.status().message();
  auto text = IndexedDataset::open(dir / "out_text_document");
  ASSERT_TRUE(text.is_ok());
  // Document 0: sentences "ab" and "c" (the empty sentence is dropped), EOD
  // counted in the last one: lengths [2, 2]. Document 1: no sequences.
  EXPECT_EQ(text->num_documents(), 4);
  EXPECT_EQ(text->num_sequences(), 4);
  EXPECT_EQ(text->sequence_length(0), 2);
  EXPECT_EQ(text->sequence_length(1), 2);
  EXPECT_EQ(text->document_index(1), 2);
  EXPECT_EQ(text->document_index(2), 2);
  auto docs = documents(dir / "out_text_document");
  EXPECT_EQ(docs[0], (std::vector<int32_t>{'a', 'b', 'c', 256}));
  EXPECT_EQ(docs[2], ids("d\n"));
  EXPECT_EQ(docs[3], ids("f"));
  auto titles = documents(dir / "out_title_document");
  EXPECT_EQ(titles[2], ids("x\xc3\xa9"));
  EXPECT_EQ(titles[3], ids("y"));
}

TEST(Preprocess, LegacyUncountedEodMatchesMegatron2306Layout) {
  Dir dir;
  dir.write("in.jsonl", "{\"text\": \"abc\"}\n{\"text\": \"\"}\n{\"text\": \"de\"}\n");
  ByteTokenizer tok;
  PreprocessOptions o;
  o.inputs = {dir / "in.jsonl"};
  o.output_prefix = dir / "old";
  o.append_eod = true;
  o.legacy_uncounted_eod = true;
  ASSERT_TRUE(preprocess(tok, o, nullptr).is_ok());
  auto ds = IndexedDataset::open(dir / "old_text_document");
  ASSERT_TRUE(ds.is_ok());
  EXPECT_EQ(ds->sequence_length(0), 3);  // EOD not counted
  EXPECT_EQ(ds->sequence_length(1), 2);
  EXPECT_EQ(ds->sequence_pointer(1), 6);  // pointers from the lengths alone
  EXPECT_EQ(slurp(dir / "old_text_document.bin").size(), 2u * 7);  // a b c EOD d e EOD
}

TEST(Preprocess, PartitionsReorderLikeMegatron) {
  Dir dir;
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "{\"text\": \"" + std::string(1, static_cast<char>('a' + i)) + "\"}\n";
  dir.write("a.jsonl", lines.substr(0, lines.size() / 2));
  dir.write("b.jsonl", lines.substr(lines.size() / 2));
  auto files = expand_inputs(dir / "*.jsonl");
  ASSERT_TRUE(files.is_ok());
  ASSERT_EQ(files->size(), 2u);
  ByteTokenizer tok;
  auto order = [&](int partitions, bool sequential) {
    PreprocessOptions o;
    o.inputs = *files;
    o.output_prefix = dir / "p";
    o.partitions = partitions;
    o.keep_sequential_samples = sequential;
    auto st = preprocess(tok, o, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.status().message();
    std::string s;
    for (auto& d : documents(dir / "p_text_document")) s += static_cast<char>(d[0]);
    return s;
  };
  EXPECT_EQ(order(1, false), "abcdefghij");
  EXPECT_EQ(order(3, false), "adgjbehcfi");  // line i -> partition i mod 3, then concatenated
  EXPECT_EQ(order(3, true), "abcdefghij");   // contiguous blocks keep the order
}

TEST(Preprocess, GzipInput) {
  Dir dir;
  const std::string text = corpus(200, 3);
  dir.write("plain.jsonl", text);
  gzFile gz = gzopen((dir / "c.jsonl.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  ByteTokenizer tok;
  for (const char* name : {"plain.jsonl", "c.jsonl.gz"}) {
    PreprocessOptions o;
    o.inputs = {dir / name};
    o.output_prefix = dir / name;
    ASSERT_TRUE(preprocess(tok, o, nullptr).is_ok()) << name;
  }
  EXPECT_EQ(slurp(output_name(dir / "plain.jsonl", "text") + ".bin"), slurp(output_name(dir / "c.jsonl.gz", "text") + ".bin"));
  EXPECT_EQ(slurp(output_name(dir / "plain.jsonl", "text") + ".idx"), slurp(output_name(dir / "c.jsonl.gz", "text") + ".idx"));

  // Cut at a flush point after half the lines (every line there complete),
  // or only the 8-byte trailer missing: an error, not half a dataset.
  gz = gzopen((dir / "half.jsonl.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size() / 2));
  gzflush(gz, Z_FULL_FLUSH);
  gzwrite(gz, text.data() + text.size() / 2, static_cast<unsigned>(text.size() - text.size() / 2));
  gzclose(gz);
  const std::string whole = slurp(dir / "half.jsonl.gz");
  const std::string full = slurp(dir / "c.jsonl.gz");
  ASSERT_GT(full.size(), 8u);
  dir.write("no_trailer.jsonl.gz", full.substr(0, full.size() - 8));
  // The flush point: the empty stored block (00 00 ff ff) the full flush wrote.
  const size_t flush = whole.find(std::string("\x00\x00\xff\xff", 4));
  ASSERT_NE(flush, std::string::npos);
  dir.write("cut.jsonl.gz", whole.substr(0, flush + 4));
  for (const char* name : {"no_trailer.jsonl.gz", "cut.jsonl.gz"}) {
    PreprocessOptions o;
    o.inputs = {dir / name};
    o.output_prefix = dir / name;
    const auto st = preprocess(tok, o, nullptr);
    ASSERT_FALSE(st.is_ok()) << name;
    EXPECT_NE(st.status().message().find("ends before its end marker"), std::string::npos)
        << name << ": " << st.status().message();
    EXPECT_FALSE(fs::exists(output_name(dir / name, "text") + ".bin")) << name;
  }
}

TEST(Preprocess, BadLinesStopWithFileAndLineOrAreSkipped) {
  struct Case {
    std::string line, expect;
  };
  const std::vector<Case> cases = {
      {"{\"text\": \"ok\"", "not valid JSON"},
      {"", "empty line"},
      {"[1, 2]", "not an object"},
      {"{\"body\": \"x\"}", "no key \"text\""},
      {"{\"text\": 5}", "not a string or a list of strings"},
      {"{\"text\": [\"a\", 1]}", "a list must hold only strings"},
      {"{\"text\": \"\xff\xfe\"}", "invalid UTF-8"},
      {"{\"text\": \"a\\ud800b\"}", "surrogate"},
      {"{\"text\": \"a\"} x", "not valid JSON"},
  };
  ByteTokenizer tok;
  for (const auto& c : cases) {
    Dir dir;
    dir.write("in.jsonl", "{\"text\": \"first\"}\n" + c.line + "\n{\"text\": \"third\"}\n");
    PreprocessOptions o;
    o.inputs = {dir / "in.jsonl"};
    o.output_prefix = dir / "out";
    auto st = preprocess(tok, o, nullptr);
    ASSERT_FALSE(st.is_ok()) << "accepted: " << c.line;
    const std::string m = st.status().message();  // a copy: status() returns a temporary
    EXPECT_NE(m.find("in.jsonl:2: "), std::string::npos) << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.line << " -> " << m;
    EXPECT_FALSE(fs::exists(dir / "out_text_document.idx")) << "a failed run left an index";
    for (auto& e : fs::directory_iterator(dir.path))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();

    o.skip_bad_lines = true;
    auto skipped = preprocess(tok, o, nullptr);
    ASSERT_TRUE(skipped.is_ok()) << skipped.status().message();
    EXPECT_EQ(skipped->skipped_lines, 1);
    EXPECT_EQ(skipped->documents, 2);
    ASSERT_EQ(skipped->skipped_examples.size(), 1u);
    EXPECT_NE(skipped->skipped_examples[0].find("in.jsonl:2:"), std::string::npos);
  }
}

TEST(Preprocess, MissingInputAndBadGlob) {
  EXPECT_FALSE(expand_inputs("/nonexistent/dir/*.jsonl").is_ok());
  ByteTokenizer tok;
  PreprocessOptions o;
  o.inputs = {"/nonexistent/file.jsonl"};
  o.output_prefix = ::testing::TempDir() + "/never";
  auto st = preprocess(tok, o, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.status().message().find("/nonexistent/file.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace mt::data
