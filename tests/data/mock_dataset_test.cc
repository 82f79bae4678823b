// --mock-data against numpy itself: numpy's default_rng draws (PCG64 seeded
// by SeedSequence, Lemire's bounded integers), Megatron's mock documents,
// and the GPT indices built over them by the spec-derived reference.
#include "data/mock_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "data/npy.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

struct RefDir {
  fs::path path;
  RefDir() {
    path = fs::path(::testing::TempDir()) / ("mt_mock_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~RefDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

template <typename T>
std::vector<T> load(const std::string& p) {
  std::vector<int64_t> shape;
  auto v = read_npy<T>(p, &shape);
  EXPECT_TRUE(v.is_ok()) << p << ": " << v.status().message();
  return v.is_ok() ? *v : std::vector<T>{};
}

constexpr int64_t kVocab = 50257;
constexpr int32_t kEod = 50256;

class MockVsNumpy : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_numpy()) return;
    dir_ = new RefDir;
    const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/data/mock_reference.py " + dir_->path.string() +
                            " " + std::to_string(kVocab) + " " + std::to_string(kEod);
    ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!have_numpy()) GTEST_SKIP() << "numpy (Debian python3-numpy) missing";
    ASSERT_TRUE(ok_) << "tests/data/mock_reference.py failed";
  }
  static RefDir* dir_;
  static bool ok_;
};
RefDir* MockVsNumpy::dir_ = nullptr;
bool MockVsNumpy::ok_ = false;

TEST_F(MockVsNumpy, RawDrawsEqualPcg64SeededBySeedSequence) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, (uint64_t{1} << 40) + 3}) {
    const auto want = load<int64_t>(*dir_ / ("raw64_" + std::to_string(seed) + ".npy"));
    ASSERT_EQ(want.size(), 64u);
    NumpyGenerator g(seed);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(static_cast<int64_t>(g.next64()), want[i]) << "seed " << seed << " draw " << i;
  }
}

TEST_F(MockVsNumpy, BoundedInt32DrawsEqualGeneratorIntegers) {
  struct Case {
    uint64_t seed;
    int32_t low, high;
  };
  // The same cases, in the same order, as mock_reference.py's INT_CASES.
  const Case cases[] = {{0, 1, 4096},
                        {1, -7, 8},
                        {12345, 0, 2147483647},
                        {(uint64_t{1} << 40) + 3, -2147483647 - 1, 2147483647},
                        {7, 0, 3 * (1 << 29) + 1}};
  for (size_t k = 0; k < std::size(cases); ++k) {
    const auto want = load<int32_t>(*dir_ / ("ints_" + std::to_string(k) + ".npy"));
    ASSERT_FALSE(want.empty());
    NumpyGenerator g(cases[k].seed);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(g.integers_int32(cases[k].low, cases[k].high), want[i]) << "case " << k << " draw " << i;
  }
}

TEST_F(MockVsNumpy, DocumentsAreMegatronsMockDocuments) {
  MockDocuments m(kVocab, kEod);
  EXPECT_EQ(m.sequence_lengths(), load<int32_t>(*dir_ / "lengths.npy"));
  const auto docs = load<int64_t>(*dir_ / "docs.npy");
  std::vector<int64_t> got;
  for (int64_t i = 0; i < 10; ++i) {
    std::vector<int64_t> d(static_cast<size_t>(m.sequence_length(i)));
    m.read(i, 0, m.sequence_length(i), d.data());
    got.insert(got.end(), d.begin(), d.end());
  }
  EXPECT_EQ(got, docs);
  // A read from the middle is the same tokens.
  std::vector<int64_t> part(5);
  m.read(0, 3, 5, part.data());
  EXPECT_EQ(part, std::vector<int64_t>(docs.begin() + 3, docs.begin() + 8));
}

// Without numpy: a small vocabulary wraps, each document ends with EOD, and
// the three splits are the thirds of the 100000 documents.
TEST(MockData, DocumentsWrapAndSplitsAreThirds) {
  MockDocuments small(5, 4);
  ASSERT_GE(small.sequence_length(0), 8);  // 3484 (numpy's first draw)
  std::vector<int64_t> w(7);
  small.read(0, 0, 7, w.data());
  EXPECT_EQ(w, (std::vector<int64_t>{1, 2, 3, 4, 0, 1, 2}));
  for (int64_t i : {int64_t{0}, int64_t{99999}}) {
    std::vector<int64_t> last(1);
    small.read(i, small.sequence_length(i) - 1, 1, last.data());
    EXPECT_EQ(last[0], 4) << "document " << i << " ends with EOD";
  }
  DataConfig dc;
  dc.mock = true, dc.mock_vocab_size = 100, dc.mock_eod = 99;
  dc.gpt.seq_length = 64;
  auto s = build_train_valid_test(dc, {100, 10, 10}, nullptr, {true, true, true});
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  const std::pair<int32_t, int32_t> bounds[3] = {{0, 33333}, {33333, 66667}, {66667, 100000}};
  for (int k = 0; k < 3; ++k) {
    const auto* d = dynamic_cast<const GptDataset*>((*s)[k].get());
    ASSERT_NE(d, nullptr);
    int32_t lo = 1 << 30, hi = -1;
    for (int32_t doc : d->indices().document_index) lo = std::min(lo, doc), hi = std::max(hi, doc);
    EXPECT_EQ(lo, bounds[k].first) << "split " << k;
    EXPECT_EQ(hi, bounds[k].second - 1) << "split " << k;
  }
}

TEST_F(MockVsNumpy, MockSplitsAreOneThirdEachWithTheReferenceIndices) {
  DataConfig dc;
  dc.mock = true;
  dc.mock_vocab_size = kVocab;
  dc.mock_eod = kEod;
  dc.split = "99,1,0";  // ignored with mock data, as in Megatron
  dc.gpt.seq_length = 256;
  dc.gpt.seed = 1234;
  std::vector<std::string> log;
  auto s = build_train_valid_test(dc, {3000, 500, std::nullopt}, &log, {true, true, true});
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  ASSERT_TRUE((*s)[0] && (*s)[1] && (*s)[2]);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_NE(log[0].find("memory"), std::string::npos) << log[0];  // never cached
  const auto* train = dynamic_cast<const GptDataset*>((*s)[0].get());
  ASSERT_NE(train, nullptr);
  EXPECT_GE(train->size(), 3000);  // whole epochs, as Megatron builds them
  // The train split is sequences [0, 33333) ("1,1,1" of 100000, rounded half to even).
  const std::string out = *dir_ / "train_";
  const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/data/gpt_indices_reference.py " +
                          *dir_ / "lengths.npy" + " 0 33333 3000 256 1234 " + out + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(train->indices().document_index, load<int32_t>(out + "document_index.npy"));
  EXPECT_EQ(train->indices().sample_index, load<int64_t>(out + "sample_index.npy"));
  EXPECT_EQ(train->indices().shuffle_index, load<int64_t>(out + "shuffle_index.npy"));
  // Sample tokens: consecutive within a document, EOD at each document end.
  std::vector<int64_t> t(257);
  ASSERT_TRUE(train->sample_tokens(0, t.data()));
  const auto& idx = train->indices();
  const int64_t j = idx.shuffle_index[0];
  const int64_t d0 = idx.document_index[idx.sample_index[2 * j]], o0 = idx.sample_index[2 * j + 1];
  MockDocuments m(kVocab, kEod);
  const int64_t first = std::min<int64_t>(257, m.sequence_length(d0) - o0);
  std::vector<int64_t> want(static_cast<size_t>(first));
  m.read(d0, o0, first, want.data());
  EXPECT_EQ(std::vector<int64_t>(t.begin(), t.begin() + first), want);
  for (int64_t x : t) EXPECT_TRUE(x >= 0 && x < kVocab) << x;
}

TEST(MockData, OneSourceOnly) {
  DataConfig dc;
  dc.mock = true;
  dc.mock_vocab_size = 100;
  dc.data_path = {"some/prefix"};
  dc.gpt.seq_length = 16;
  auto s = build_train_valid_test(dc, {10, std::nullopt, std::nullopt});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("--mock-data"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace mt::data
