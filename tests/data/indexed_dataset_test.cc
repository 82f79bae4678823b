// Indexed dataset: the spec's byte-exact example, Megatron's golden files,
// and every kind of corruption.
#include "data/indexed_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace mt::data {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::path(::testing::TempDir()) / ("mt_idx_" + std::to_string(getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> v;
    for (auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  fs::path path_;
};

const std::string kGolden = std::string(MT_SHARED_DIR) + "/testdata/megatron-preprocess/small_text_document";

TEST(IndexedDataset, SpecByteExactExample) {
  TempDir dir;
  auto w = IndexedDatasetWriter::create(dir / "ex", DType::kUInt16);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  std::vector<int32_t> a = {10, 11, 12}, b = {13, 14};
  std::vector<int32_t> la = {3}, lb = {2};
  ASSERT_TRUE((*w)->add_document(a, la));
  ASSERT_TRUE((*w)->add_document(b, lb));
  ASSERT_TRUE((*w)->finalize());
  const unsigned char idx[] = {
      0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x08, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00};
  const unsigned char bin[] = {0x0a, 0x00, 0x0b, 0x00, 0x0c, 0x00, 0x0d, 0x00, 0x0e, 0x00};
  EXPECT_EQ(read_file(dir / "ex.idx"), std::string(reinterpret_cast<const char*>(idx), sizeof(idx)));
  EXPECT_EQ(read_file(dir / "ex.bin"), std::string(reinterpret_cast<const char*>(bin), sizeof(bin)));
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"ex.bin", "ex.idx"}));  // no temporaries left

  auto ds = IndexedDataset::open(dir / "ex");
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->num_sequences(), 2);
  EXPECT_EQ(ds->num_documents(), 2);
  EXPECT_EQ(ds->num_tokens(), 5);
  std::vector<int64_t> got(2);
  ds->read(1, 0, 2, got.data());
  EXPECT_EQ(got, (std::vector<int64_t>{13, 14}));
  std::vector<int32_t> mid(1);
  ds->read(0, 1, 1, mid.data());
  EXPECT_EQ(mid[0], 11);
}

TEST(IndexedDataset, ReadsMegatronGoldenAndRewritesItByteForByte) {
  auto ds = IndexedDataset::open(kGolden);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->dtype(), DType::kUInt16);
  EXPECT_EQ(ds->num_sequences(), 134);
  EXPECT_EQ(ds->num_documents(), 135);  // D = 136: the empty document has no sequence
  EXPECT_EQ(ds->document_index(2), 2);
  // Megatron 23.06 wrote each EOD to .bin without counting it in the
  // sequence lengths (fixed upstream in August 2023): 134 more tokens in
  // .bin than the index covers.
  EXPECT_EQ(ds->num_tokens(), 10622);
  EXPECT_EQ(static_cast<int64_t>(ds->bin_bytes().size()), 2 * (10622 + 134));
  int32_t first[3];
  ds->read(0, 0, 3, first);
  EXPECT_EQ(first[0], 25189);
  // Merging it into an empty writer reproduces both files byte for byte.
  TempDir dir;
  auto w = IndexedDatasetWriter::create(dir / "copy", DType::kUInt16);
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE((*w)->add_index(*ds));
  ASSERT_TRUE((*w)->finalize());
  EXPECT_EQ(read_file(dir / "copy.idx"), read_file(kGolden + ".idx"));
  EXPECT_EQ(read_file(dir / "copy.bin"), read_file(kGolden + ".bin"));
}

TEST(IndexedDataset, MergeAppendsShiftedBoundaries) {
  TempDir dir;
  for (const char* name : {"a", "b"}) {
    auto w = IndexedDatasetWriter::create(dir / name, DType::kInt32);
    std::vector<int32_t> t1 = {1, 2, 3}, l1 = {1, 2}, t2 = {70000}, l2 = {1};
    ASSERT_TRUE((*w)->add_document(t1, l1));
    ASSERT_TRUE((*w)->add_document({}, {}));
    ASSERT_TRUE((*w)->add_document(t2, l2));
    ASSERT_TRUE((*w)->finalize());
  }
  auto a = IndexedDataset::open(dir / "a");
  auto b = IndexedDataset::open(dir / "b");
  auto w = IndexedDatasetWriter::create(dir / "ab", DType::kInt32);
  ASSERT_TRUE((*w)->add_index(*a));
  ASSERT_TRUE((*w)->add_index(*b));
  ASSERT_TRUE((*w)->finalize());
  auto ab = IndexedDataset::open(dir / "ab");
  ASSERT_TRUE(ab.is_ok()) << ab.status().message();
  EXPECT_EQ(ab->num_sequences(), 6);
  EXPECT_EQ(ab->num_documents(), 6);
  std::vector<int64_t> bounds;
  for (int64_t i = 0; i <= ab->num_documents(); ++i) bounds.push_back(ab->document_index(i));
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 2, 2, 3, 5, 5, 6}));
  int32_t t;
  ab->read(5, 0, 1, &t);
  EXPECT_EQ(t, 70000);
  auto u16 = IndexedDatasetWriter::create(dir / "u", DType::kUInt16);
  EXPECT_FALSE((*u16)->add_index(*a)) << "dtype mismatch must be refused";
  std::vector<int32_t> big = {70000}, one = {1};
  Status st = (*u16)->add_document(big, one);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("uint16"), std::string::npos);
}

TEST(IndexedDataset, UnfinishedWriterLeavesNothingAndKeepsOldFiles) {
  TempDir dir;
  {
    auto w = IndexedDatasetWriter::create(dir / "x", DType::kUInt16);
    std::vector<int32_t> t = {1}, l = {1};
    ASSERT_TRUE((*w)->add_document(t, l));
    ASSERT_TRUE((*w)->finalize());
  }
  const std::string old_idx = read_file(dir / "x.idx");
  {
    auto w = IndexedDatasetWriter::create(dir / "x", DType::kUInt16);
    std::vector<int32_t> t = {1, 2}, l = {2};
    ASSERT_TRUE((*w)->add_document(t, l));
    // destroyed without finalize: an interrupted run
  }
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"x.bin", "x.idx"}));
  EXPECT_EQ(read_file(dir / "x.idx"), old_idx);
  EXPECT_TRUE(IndexedDataset::open(dir / "x").is_ok());
}

// ---- corruption: each case edits a valid pair and expects a clear error.

struct Corruption {
  std::string name;
  std::function<void(std::string& idx, std::string& bin)> edit;
  std::string expect;  // substring of the message
};

void put64(std::string& s, size_t at, int64_t v) { std::memcpy(&s[at], &v, 8); }
void put32(std::string& s, size_t at, int32_t v) { std::memcpy(&s[at], &v, 4); }

TEST(IndexedDataset, CorruptFilesGiveClearErrors) {
  // Base: 3 sequences (lengths 3, 2, 4; uint16), 2 documents: D = 3.
  TempDir dir;
  {
    auto w = IndexedDatasetWriter::create(dir / "base", DType::kUInt16);
    std::vector<int32_t> t1 = {1, 2, 3, 4, 5}, l1 = {3, 2}, t2 = {6, 7, 8, 9}, l2 = {4};
    ASSERT_TRUE((*w)->add_document(t1, l1));
    ASSERT_TRUE((*w)->add_document(t2, l2));
    ASSERT_TRUE((*w)->finalize());
  }
  const std::string idx0 = read_file(dir / "base.idx"), bin0 = read_file(dir / "base.bin");
  const size_t S = 3, len_off = 34, ptr_off = 34 + 4 * S, doc_off = 34 + 12 * S;
  std::vector<Corruption> cases = {
      {"empty idx", [](std::string& i, std::string&) { i.clear(); }, "shorter than the 34-byte header"},
      {"truncated header", [](std::string& i, std::string&) { i.resize(20); }, "offset 0: file is 20 bytes"},
      {"wrong magic", [](std::string& i, std::string&) { i[0] = 'X'; }, "offset 0: bad magic"},
      {"wrong version", [](std::string& i, std::string&) { put64(i, 9, 2); }, "offset 9: version 2: expected 1"},
      {"bad dtype", [](std::string& i, std::string&) { i[17] = 9; }, "offset 17: dtype code 9"},
      {"truncated body", [](std::string& i, std::string&) { i.resize(i.size() - 1); }, "offset 18: header says 3 sequences and 3 document entries"},
      {"huge counts", [](std::string& i, std::string&) { put64(i, 18, INT64_MAX); }, "offset 18: header says"},
      {"extra bytes", [](std::string& i, std::string&) { i += "zz"; }, "offset 18"},
      {"negative length", [=](std::string& i, std::string&) { put32(i, len_off + 4, -1); }, "sequence 1 has negative length -1"},
      {"pointer backwards", [=](std::string& i, std::string&) { put64(i, ptr_off + 8, 2); }, "sequence 1 starts at byte 2, before the end of sequence 0"},
      {"pointer past end", [=](std::string& i, std::string&) { put64(i, ptr_off + 16, 1000); }, "sequence 2 ends at byte 1008"},
      {"truncated bin", [](std::string&, std::string& b) { b.resize(b.size() - 2); }, "but the file has 16 bytes (truncated .bin"},
      {"first boundary", [=](std::string& i, std::string&) { put64(i, doc_off, 1); }, "first document boundary is 1: expected 0"},
      {"boundary decreasing", [=](std::string& i, std::string&) { put64(i, doc_off + 8, 5); }, "document boundary 1 is 5"},
      {"last boundary", [=](std::string& i, std::string&) { put64(i, doc_off + 16, 2); }, "last document boundary is 2: expected the sequence count 3"},
  };
  for (const auto& c : cases) {
    std::string idx = idx0, bin = bin0;
    c.edit(idx, bin);
    write_file(dir / "bad.idx", idx);
    write_file(dir / "bad.bin", bin);
    auto ds = IndexedDataset::open(dir / "bad");
    ASSERT_FALSE(ds.is_ok()) << c.name << " was accepted";
    EXPECT_NE(ds.status().message().find(c.expect), std::string::npos) << c.name << ": " << ds.status().message();
    EXPECT_NE(ds.status().message().find("bad."), std::string::npos) << c.name << " does not name the file";
  }
  auto missing = IndexedDataset::open(dir / "nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("nope.idx: cannot open"), std::string::npos);
}

TEST(IndexedDataset, OptimalDtypeAsMegatron) {
  EXPECT_EQ(optimal_dtype(50257), DType::kUInt16);
  EXPECT_EQ(optimal_dtype(65499), DType::kUInt16);
  EXPECT_EQ(optimal_dtype(65500), DType::kInt32);
  EXPECT_EQ(optimal_dtype(128256), DType::kInt32);
}

}  // namespace
}  // namespace mt::data
