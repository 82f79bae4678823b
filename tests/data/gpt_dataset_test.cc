// GPT dataset indices against the spec's worked examples, numpy's output for
// a larger case, blending, caching and the loader's masks and sampler.
#include "data/gpt_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <fmt/format.h>
#include <random>

#include "data/loader.h"
#include "data/npy.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  Dir() {
    path = fs::path(::testing::TempDir()) /
           ("mt_gpt_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A dataset whose sequence i holds tokens 1000*i + 0, 1, 2, ...
std::shared_ptr<const IndexedDataset> make_dataset(const std::string& prefix, const std::vector<int32_t>& lengths) {
  auto w = IndexedDatasetWriter::create(prefix, DType::kInt32);
  EXPECT_TRUE(w.is_ok());
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> t(lengths[i]);
    for (int32_t k = 0; k < lengths[i]; ++k) t[k] = static_cast<int32_t>(1000 * i + k);
    std::vector<int32_t> l = {lengths[i]};
    EXPECT_TRUE((*w)->add_document(t, l));
  }
  EXPECT_TRUE((*w)->finalize());
  auto ds = IndexedDataset::open(prefix);
  EXPECT_TRUE(ds.is_ok()) << ds.status().message();
  return std::make_shared<const IndexedDataset>(std::move(*ds));
}

TEST(NumpyRandomState, SpecTestVector) {
  NumpyRandomState rs(1234);
  std::vector<int32_t> a = {5, 6, 7, 8, 9, 5, 6, 7, 8, 9};
  rs.shuffle(a.data(), a.size());
  EXPECT_EQ(a, (std::vector<int32_t>{7, 7, 9, 6, 5, 8, 9, 5, 6, 8}));
  std::vector<uint32_t> b = {0, 1, 2, 3, 4, 5, 6};
  rs.shuffle(b.data(), b.size());
  EXPECT_EQ(b, (std::vector<uint32_t>{6, 4, 0, 5, 3, 2, 1}));
}

TEST(Split, SpecExampleAndRounding) {
  auto w = parse_split("969,30,1");
  ASSERT_TRUE(w.is_ok());
  auto r = split_ranges(*w, 1000000);
  ASSERT_TRUE(r[0] && r[1] && r[2]);
  EXPECT_EQ(r[0]->begin, 0);
  EXPECT_EQ(r[0]->end, 969000);
  EXPECT_EQ(r[1]->begin, 969000);
  EXPECT_EQ(r[1]->end, 999000);
  EXPECT_EQ(r[2]->begin, 999000);
  EXPECT_EQ(r[2]->end, 1000000);
  // Megatron's legacy default string parses the same way.
  EXPECT_EQ(*parse_split("969, 30, 1"), *w);
  // Python's round: 2.5 -> 2 and 7.5 -> 8 (half to even).
  auto half = split_ranges(*parse_split("1,1"), 5);
  EXPECT_EQ(half[0]->end, 2);
  EXPECT_EQ(half[1]->begin, 2);
  EXPECT_FALSE(half[2].has_value());
  auto odd = split_ranges(*parse_split("1,1"), 15);
  EXPECT_EQ(odd[0]->end, 8);
  EXPECT_EQ(*parse_split("100"), (std::array<double, 3>{1, 0, 0}));
  EXPECT_FALSE(parse_split("1,2,3,4").is_ok());
  EXPECT_FALSE(parse_split("0,0,0").is_ok());
  EXPECT_FALSE(parse_split("1..2,3").is_ok());
}

TEST(SampleIndex, SpecWorkedExampleAndReading) {
  // lengths [5,3,4], document_index [0,1,2] (unshuffled), s = 4, one epoch:
  // T = 12, n = (12-1)//4 = 2, sample_index [(0,0),(0,4),(2,0)].
  std::vector<int32_t> lengths = {5, 3, 4}, doc = {0, 1, 2};
  auto idx = build_sample_index(lengths, doc, 4, 1, 12, true);
  EXPECT_EQ(idx, (std::vector<int64_t>{0, 0, 0, 4, 2, 0}));

  Dir dir;
  auto ds = make_dataset(dir / "d", lengths);
  GptDatasetConfig cfg;
  cfg.seq_length = 4;
  cfg.no_cache = true;
  auto g = GptDataset::build(ds, Split::kTrain, {0, 3}, std::nullopt, cfg);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  ASSERT_EQ((*g)->size(), 2);
  // Whatever the shuffles did, every sample has 5 tokens and consecutive
  // samples in sample-index order overlap by one token.
  const auto& I = (*g)->indices();
  std::vector<std::vector<int64_t>> by_row(2, std::vector<int64_t>(5));
  for (int64_t k = 0; k < 2; ++k) ASSERT_TRUE((*g)->sample_tokens(k, by_row[I.shuffle_index[k]].data()));
  EXPECT_EQ(by_row[0].back(), by_row[1].front());
  std::multiset<int64_t> all;
  for (auto& r : by_row)
    for (int64_t t : r) all.insert(t);
  EXPECT_EQ(all.size(), 10u);
}

TEST(GptIndices, EpochsAndSeparateLastEpoch) {
  // 10 sequences of 10 tokens: T = 100, s = 9, per epoch (100-1)//9 = 11.
  std::vector<int32_t> lengths(10, 10);
  // 12 samples: E*100 >= 12*9+1 = 109 -> E = 2; sans = 11, from final = 1 < int(0.8*11) = 8 -> separate.
  auto a = build_gpt_indices(lengths, {0, 10}, 12, 9, 1234);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->num_epochs, 2);
  EXPECT_TRUE(a->separate_final_epoch);
  EXPECT_EQ(a->num_samples(), (2 * 100 - 1) / 9);
  // The last epoch's documents stay at the end, and so do its samples.
  std::multiset<int32_t> tail(a->document_index.begin() + 10, a->document_index.end());
  EXPECT_EQ(tail.size(), 10u);
  for (int32_t i = 0; i < 10; ++i) EXPECT_EQ(tail.count(i), 1u);
  for (int64_t k = 11; k < a->num_samples(); ++k) EXPECT_GE(a->shuffle_index[k], 11);
  // 20 samples: from final = 9 >= 8 -> one global shuffle.
  auto b = build_gpt_indices(lengths, {0, 10}, 20, 9, 1234);
  EXPECT_EQ(b->num_epochs, 2);
  EXPECT_FALSE(b->separate_final_epoch);
  // Errors: too short to make a sample.
  std::vector<int32_t> tiny = {1};
  EXPECT_FALSE(build_gpt_indices(tiny, {0, 1}, 1, 4, 1).is_ok());
}

TEST(GptIndices, MatchNumpyOnALargerCase) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) GTEST_SKIP() << "numpy (Debian python3-numpy) missing";
  Dir dir;
  std::mt19937 rng(7);
  std::vector<int32_t> lengths(3000);
  for (auto& l : lengths) l = 1 + static_cast<int32_t>(rng() % 700);
  ASSERT_TRUE(write_npy(dir / "lengths.npy", lengths, {3000}));
  struct Case {
    int64_t begin, end;
    std::optional<int64_t> n;
    int64_t s;
    uint32_t seed;
  };
  for (const Case& c : {Case{0, 2907, 9000, 128, 1234}, Case{2907, 2997, 5000, 64, 1234}, Case{0, 3000, std::nullopt, 256, 99},
                        Case{100, 200, 151, 63, 5}}) {
    const std::string out = dir / "ref_";
    const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/data/gpt_indices_reference.py " +
                            dir / "lengths.npy" + " " + std::to_string(c.begin) + " " + std::to_string(c.end) + " " +
                            (c.n ? std::to_string(*c.n) : "none") + " " + std::to_string(c.s) + " " + std::to_string(c.seed) +
                            " " + out + " > " + dir / "log.txt";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto got = build_gpt_indices(lengths, {c.begin, c.end}, c.n, c.s, c.seed);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    std::vector<int64_t> shape;
    EXPECT_EQ(got->document_index, *read_npy<int32_t>(out + "document_index.npy", &shape)) << c.begin;
    EXPECT_EQ(got->sample_index, *read_npy<int64_t>(out + "sample_index.npy", &shape)) << c.begin;
    EXPECT_EQ(shape, (std::vector<int64_t>{got->num_samples() + 1, 2}));
    EXPECT_EQ(got->shuffle_index, *read_npy<int64_t>(out + "shuffle_index.npy", &shape)) << c.begin;
  }
}

TEST(GptDataset, CacheIsReusedAndRebuiltWhenInputsChange) {
  Dir dir;
  auto ds = make_dataset(dir / "d", std::vector<int32_t>(50, 20));
  GptDatasetConfig cfg;
  cfg.seq_length = 16;
  cfg.cache_dir = dir / "cache";
  std::string log;
  auto a = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(log.rfind("built", 0), 0u) << log;
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir / "cache")) files += e.path().filename().string().find(".tmp.") == std::string::npos;
  EXPECT_EQ(files, 4u);
  auto b = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(log.rfind("loaded", 0), 0u) << log;
  EXPECT_EQ((*a)->indices().shuffle_index, (*b)->indices().shuffle_index);
  EXPECT_EQ((*a)->indices().sample_index, (*b)->indices().sample_index);
  // Another seed or sample count is another cache entry.
  cfg.seed = 7;
  auto c = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  EXPECT_EQ(log.rfind("built", 0), 0u) << log;
  // A rewritten dataset (new .idx) is rebuilt, not loaded.
  auto ds2 = make_dataset(dir / "d", std::vector<int32_t>(50, 21));
  cfg.seed = 1234;
  auto d = GptDataset::build(ds2, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(log.rfind("built", 0), 0u) << log;
}

// A damaged cache is rebuilt, not trusted: a sample row whose offset lies
// past its sequence (sample_tokens would read outside it), and a shape
// whose element count exceeds the file.
TEST(GptDataset, DamagedCacheIsRebuilt) {
  Dir dir;
  auto ds = make_dataset(dir / "d", std::vector<int32_t>(50, 20));
  GptDatasetConfig cfg;
  cfg.seq_length = 16;
  cfg.cache_dir = dir / "cache";
  std::string log;
  auto a = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::string sample_file;
  for (auto& e : fs::directory_iterator(dir / "cache"))
    if (e.path().string().find("sample_index.npy") != std::string::npos) sample_file = e.path().string();
  ASSERT_FALSE(sample_file.empty());
  const GptIndices good = (*a)->indices();
  auto damaged = good.sample_index;
  damaged[2 * 3 + 1] = 20;  // row 3's offset: every sequence here has 20 tokens
  ASSERT_TRUE(write_npy(sample_file, damaged, {static_cast<int64_t>(damaged.size() / 2), 2}));
  auto b = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(log.rfind("built", 0), 0u) << log;
  EXPECT_EQ((*b)->indices().sample_index, good.sample_index);
  // The header claims more rows than the file holds (its row count's digits
  // all 9s, the header length unchanged): an error, then a rebuild.
  std::string bytes = slurp_file(sample_file);
  const size_t at = bytes.find("'shape': (");
  ASSERT_NE(at, std::string::npos);
  const size_t comma = bytes.find(',', at);
  for (size_t i = at + 10; i < comma; ++i) bytes[i] = '9';
  std::ofstream(sample_file, std::ios::binary | std::ios::trunc) << bytes;
  std::vector<int64_t> shape_read;
  auto bad = read_npy<int64_t>(sample_file, &shape_read);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("holds more elements than the file's"), std::string::npos)
      << bad.status().message();
  auto c = GptDataset::build(ds, Split::kTrain, {0, 50}, 100, cfg, &log);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(log.rfind("built", 0), 0u) << log;
}

// A stored value that is not an id of the model's vocabulary fails the read
// of its sample with the file, byte, sequence and token, whatever the
// dtype: ids past the padded vocabulary, negative ids (-1 is not taken for
// padding), int64 ids past int32, and in float files NaN, inf, fractions
// and values past int64 (which a cast would turn into some other id).
TEST(GptDataset, TokensOutsideTheVocabularyFailTheirSample) {
  Dir dir;
  const std::string prefix = dir / "bad";
  const int64_t kVocab = 512;
  // Two sequences of 10 tokens, all 3 except sequence 1, token 4; one sample of 19 + 1 tokens reads both.
  auto make = [&](bool as_float, int64_t ibad, double fbad) -> std::shared_ptr<const IndexedDataset> {
    {
      auto w = IndexedDatasetWriter::create(prefix, DType::kInt64);
      EXPECT_TRUE(w.is_ok());
      const std::vector<int32_t> t(10, 3), l = {10};
      EXPECT_TRUE((*w)->add_document(t, l));
      EXPECT_TRUE((*w)->add_document(t, l));
      EXPECT_TRUE((*w)->finalize());
    }
    std::fstream bin(prefix + ".bin", std::ios::in | std::ios::out | std::ios::binary);
    for (int i = 0; i < 20; ++i) {
      char b[8];
      const int64_t iv = i == 14 ? ibad : 3;
      const double dv = i == 14 ? fbad : 3.0;
      if (as_float) std::memcpy(b, &dv, 8);
      else std::memcpy(b, &iv, 8);
      bin.seekp(8 * i), bin.write(b, 8);
    }
    bin.close();
    if (as_float) {  // the .idx dtype code (byte 17) from int64 (5) to float64 (6)
      std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
      idx.seekp(17), idx.put(6);
    }
    auto ds = IndexedDataset::open(prefix);
    EXPECT_TRUE(ds.is_ok()) << ds.status().message();
    return std::make_shared<const IndexedDataset>(std::move(*ds));
  };
  auto sample = [&](std::shared_ptr<const IndexedDataset> ds, int64_t vocab) {
    GptDatasetConfig cfg;
    cfg.seq_length = 19, cfg.no_cache = true, cfg.vocab_size = vocab;
    auto g = GptDataset::build(ds, Split::kTrain, IndexRange{0, 2}, std::nullopt, cfg);
    EXPECT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_EQ((*g)->size(), 1);
    std::vector<int64_t> text(20);
    return (*g)->sample_tokens(0, text.data());
  };
  const std::string place = fmt::format("{}.bin byte {} (sequence 1, token 4)", prefix, 8 * 14);
  for (const int64_t bad : {int64_t{512}, int64_t{600}, int64_t{-1}, int64_t{-7}, (int64_t{1} << 40) + 5}) {
    const Status st = sample(make(false, bad, 0), kVocab);
    ASSERT_FALSE(st) << bad;
    EXPECT_EQ(st.code(), StatusCode::kCorrupt);
    EXPECT_NE(st.message().find(place + " holds token id " + std::to_string(bad) + ", outside the model's vocabulary [0, 512)"),
              std::string::npos)
        << st.message();
    EXPECT_TRUE(sample(make(false, bad, 0), 0)) << "vocab_size 0 checks nothing";
  }
  EXPECT_TRUE(sample(make(false, 511, 0), kVocab));
  for (const double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 2.5, 1e300, -1e300, 9.3e18}) {
    const Status st = sample(make(true, 0, bad), kVocab);
    ASSERT_FALSE(st) << bad;
    EXPECT_NE(st.message().find(place + " holds a value that is no integer token id"), std::string::npos)
        << st.message();
  }
  EXPECT_TRUE(sample(make(true, 0, 511.0), kVocab));
  const Status neg = sample(make(true, 0, -2.0), kVocab);
  EXPECT_NE(neg.message().find("holds token id -2,"), std::string::npos) << neg.message();
}

TEST(Blending, SpecSequenceAndSizes) {
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices({0.3, 0.7}, 10, &di, &dsi);
  std::vector<std::pair<int, int64_t>> got;
  for (size_t i = 0; i < di.size(); ++i) got.emplace_back(di[i], dsi[i]);
  EXPECT_EQ(got, (std::vector<std::pair<int, int64_t>>{{1, 0}, {0, 0}, {1, 1}, {1, 2}, {0, 1}, {1, 3}, {1, 4}, {0, 2}, {1, 5}, {1, 6}}));
  build_exhaustive_blending_indices({2, 5}, &di, &dsi);
  EXPECT_EQ(std::count(di.begin(), di.end(), 0), 2);
  EXPECT_EQ(std::count(di.begin(), di.end(), 1), 5);

  Dir dir;
  make_dataset(dir / "a", std::vector<int32_t>(400, 33));
  make_dataset(dir / "b", std::vector<int32_t>(900, 33));
  DataConfig cfg;
  cfg.data_path = {"30", dir / "a", "70", dir / "b"};
  cfg.split = "100,0,0";
  cfg.gpt.seq_length = 32;
  cfg.gpt.cache_dir = dir / "cache";
  std::vector<std::string> log;
  auto built = build_train_valid_test(cfg, {1000, std::nullopt, std::nullopt}, &log);
  ASSERT_TRUE(built.is_ok()) << built.status().message();
  auto* blend = dynamic_cast<BlendedDataset*>((*built)[0].get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 1000);  // 300 + 700
  // Each dataset was asked for ceil(t * 1.005) samples: 302 and 704 (their
  // cache descriptions record the request).
  std::string descriptions;
  for (auto& e : fs::directory_iterator(dir / "cache"))
    if (e.path().string().ends_with("description.txt")) {
      std::ifstream in(e.path());
      descriptions += std::string(std::istreambuf_iterator<char>(in), {});
    }
  EXPECT_NE(descriptions.find("\"num_samples\": 302,"), std::string::npos) << descriptions;
  EXPECT_NE(descriptions.find("\"num_samples\": 704,"), std::string::npos) << descriptions;
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ((*built)[1], nullptr);
  EXPECT_EQ(std::count(blend->dataset_index().begin(), blend->dataset_index().end(), 0), 300);
  std::vector<int64_t> text(33);
  ASSERT_TRUE(blend->sample_tokens(999, text.data()));

  // Errors name the flag.
  cfg.data_path = {"0.5", dir / "a", dir / "b"};
  auto bad = build_train_valid_test(cfg, {10, std::nullopt, std::nullopt});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--data-path"), std::string::npos) << bad.status().message();
  cfg.data_path = {dir / "missing"};
  bad = build_train_valid_test(cfg, {10, std::nullopt, std::nullopt});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("missing.idx"), std::string::npos) << bad.status().message();
}

TEST(Loader, SamplerMasksAndPositions) {
  // One sequence per document; EOD = 9 ends each.
  Dir dir;
  auto w = IndexedDatasetWriter::create(dir / "e", DType::kUInt16);
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> t = {1, 2, 3, 9}, l = {4};
    ASSERT_TRUE((*w)->add_document(t, l));
  }
  ASSERT_TRUE((*w)->finalize());
  auto ds = std::make_shared<const IndexedDataset>(std::move(*IndexedDataset::open(dir / "e")));
  GptDatasetConfig cfg;
  cfg.seq_length = 6;
  cfg.no_cache = true;
  auto g = GptDataset::build(ds, Split::kTrain, {0, 40}, std::nullopt, cfg);
  ASSERT_TRUE(g.is_ok());
  SampleOptions opts;
  opts.eod = 9;
  opts.eod_mask_loss = opts.reset_position_ids = opts.reset_attention_mask = true;
  // mbs 2, DP 3, rank 1, resuming after 12 samples: ids 14,15 then 20,21.
  DataLoader loader(*g, 2, 1, 3, 12, opts);
  auto mb = loader.next();
  ASSERT_TRUE(mb.is_ok());
  EXPECT_EQ(mb->sample_ids, (std::vector<int64_t>{14, 15}));
  EXPECT_EQ(loader.next()->sample_ids, (std::vector<int64_t>{20, 21}));
  EXPECT_EQ(loader.consumed_samples(), 24);
  // Every sample is a rotation of 1 2 3 9 1 2 3 ...; check the masks row by row.
  for (int64_t r = 0; r < 2; ++r) {
    int64_t pos = 0, seg = 0;
    for (int64_t t = 0; t < 6; ++t) {
      const int64_t tok = mb->tokens[r * 6 + t];
      EXPECT_EQ(mb->position_ids[r * 6 + t], pos);
      EXPECT_EQ(mb->segment_ids[r * 6 + t], seg);
      EXPECT_EQ(mb->loss_mask[r * 6 + t], tok == 9 ? 0.0f : 1.0f);
      pos = tok == 9 ? 0 : pos + 1;
      seg += tok == 9;
      if (t + 1 < 6) {
        EXPECT_EQ(mb->labels[r * 6 + t], mb->tokens[r * 6 + t + 1]);
      }
    }
    auto mask = attention_mask(*mb, r);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 6; ++j) {
        const bool same = mb->segment_ids[r * 6 + i] == mb->segment_ids[r * 6 + j];
        if (j <= i) {
          EXPECT_EQ(mask[i * 6 + j], !same);
        }
      }
  }
  // Exhaustion is an error that says what to change.
  DataLoader big(*g, 8, 0, 8, 0, opts);
  auto e = big.next();
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("exhausted"), std::string::npos);
}

// torch.randperm with a generator seeded by the epoch, as the cyclic loader
// draws it. Swap-loop branch: PyTorch's own output (torch 1.13 from Debian,
// the same loop PyTorch >= 2.6 keeps below 2^32/20): first elements and
// sum(i * p[i]). Inside-out branch (PyTorch >= 2.6 from 2^32/20 on, forced
// here with a small threshold; Debian's torch predates it): values from a
// Python transcription of that loop over its own MT19937.
TEST(TorchRandperm, MatchesPyTorch) {
  struct Case {
    int64_t n;
    uint64_t seed;
    std::vector<int64_t> head;
    int64_t weighted;
  };
  for (const Case& c : {Case{10, 0, {4, 1, 7, 5, 3, 9, 0, 8, 6, 2}, 209},
                        Case{37, 1, {30, 24, 6, 11, 29, 14, 27, 18, 15, 33, 0, 1}, 11410},
                        Case{1000, 3, {986, 114, 871, 894, 140, 885, 232, 402, 837, 674, 854, 689}, 249390222}}) {
    const std::vector<int64_t> p = torch_randperm(c.n, c.seed);
    ASSERT_EQ(static_cast<int64_t>(p.size()), c.n);
    EXPECT_EQ(std::vector<int64_t>(p.begin(), p.begin() + static_cast<int64_t>(c.head.size())), c.head) << c.n;
    int64_t w = 0;
    for (int64_t i = 0; i < c.n; ++i) w += i * p[static_cast<size_t>(i)];
    EXPECT_EQ(w, c.weighted) << c.n;
  }
  EXPECT_EQ(torch_randperm(12, 7, /*large=*/5), (std::vector<int64_t>{1, 8, 7, 3, 4, 5, 9, 6, 2, 10, 0, 11}));
  const std::vector<int64_t> io = torch_randperm(1000, 2, /*large=*/1000);
  int64_t w = 0;
  for (int64_t i = 0; i < 1000; ++i) w += i * io[static_cast<size_t>(i)];
  EXPECT_EQ(std::vector<int64_t>(io.begin(), io.begin() + 12),
            (std::vector<int64_t>{493, 153, 234, 857, 356, 56, 400, 219, 222, 767, 204, 245}));
  EXPECT_EQ(w, 248039516);
  EXPECT_EQ(torch_randperm(999, 2, 1000), torch_randperm(999, 2)) << "below the threshold: the swap loop";
  EXPECT_TRUE(torch_randperm(0, 1).empty());
  EXPECT_EQ(torch_randperm(1, 1), (std::vector<int64_t>{0}));
}

// A source whose sample k is the tokens k, k, ... (enough for the ids).
class IdSource : public SampleSource {
 public:
  explicit IdSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return 2; }
  Status sample_tokens(int64_t k, int64_t* out) const override {
    out[0] = out[1] = out[2] = k;
    return Status::ok();
  }
  std::string describe() const override { return "ids"; }

 private:
  int64_t n_;
};

// --dataloader-type cyclic: every micro-batch of every rank, across epoch
// boundaries and from a resumed consumed count, is the one Megatron's
// MegatronPretrainingRandomSampler (data sharding, cyclic_iter) yields with
// PyTorch's randperm (tests/data/cyclic_sampler_reference.py).
TEST(Loader, CyclicMatchesMegatronsRandomSampler) {
  struct Case {
    int64_t total, mbs, dp, consumed, steps;
  };
  for (const Case& c : {Case{23, 2, 3, 0, 10}, Case{50, 4, 2, 16, 12}, Case{7, 1, 1, 5, 9}, Case{64, 8, 1, 0, 17}}) {
    for (int64_t rank = 0; rank < c.dp; ++rank) {
      const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/data/cyclic_sampler_reference.py {} {} {} {} {} {}",
                                          MT_SOURCE_DIR, c.total, c.mbs, c.dp, rank, c.consumed, c.steps);
      FILE* p = ::popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string out;
      char buf[4096];
      while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
      const int rc = ::pclose(p);
      if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3";
      ASSERT_EQ(rc, 0) << cmd;
      DataLoader loader(std::make_shared<IdSource>(c.total), c.mbs, rank, c.dp, c.consumed, SampleOptions{},
                        Sampler::kCyclic);
      std::istringstream lines(out);
      std::string line;
      int64_t steps = 0;
      while (std::getline(lines, line)) {
        std::istringstream ids(line);
        std::vector<int64_t> want{std::istream_iterator<int64_t>(ids), std::istream_iterator<int64_t>()};
        auto mb = loader.next();
        ASSERT_TRUE(mb.is_ok()) << mb.status().message();
        EXPECT_EQ(mb->sample_ids, want) << cmd << " step " << steps;
        EXPECT_EQ(mb->tokens[0], want[0]);
        ++steps;
      }
      EXPECT_EQ(steps, c.steps) << cmd;
      EXPECT_EQ(loader.consumed_samples(), c.consumed + c.steps * c.mbs * c.dp);
    }
  }
  // Fewer samples than one step, and a consumed count between steps: errors.
  DataLoader tiny(std::make_shared<IdSource>(5), 2, 0, 3, 0, SampleOptions{}, Sampler::kCyclic);
  auto e = tiny.next();
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("fewer than one step"), std::string::npos) << e.status().message();
  DataLoader odd(std::make_shared<IdSource>(50), 2, 0, 3, 4, SampleOptions{}, Sampler::kCyclic);
  EXPECT_FALSE(odd.next().is_ok());
}

}  // namespace
}  // namespace mt::data
