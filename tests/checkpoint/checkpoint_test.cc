// Sharded checkpoints: bitwise round trip, resharded reads (a tensor saved as
// 2 or 4 slices read back under other slicings), every error case, a process
// SIGKILLed at each point of a save, standard safetensors files (header parsed
// independently here and by python3's json module), and the training-state
// helpers on a real GPTModel + Optimizer.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string fresh_dir(const std::string& name) {
  const std::string d = fmt::format("{}/ckpt_test_{}_{}", ::testing::TempDir(), name, getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// A buffer-backed tensor for tests.
struct Buf {
  std::vector<char> bytes;
  Tensor t;
  Buf(Shape s, DType dt) : bytes(static_cast<size_t>(s.numel()) * dtype_size(dt) + 1) {
    t = Tensor(bytes.data(), s, dt);
  }
  bool same_bits(const Tensor& o) const { return o.nbytes() == t.nbytes() && !std::memcmp(o.data(), t.data(), t.nbytes()); }
};

// Global tensor whose element at flat index i is 1000 + i (exact in fp32).
std::vector<float> iota_tensor(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 1000.0f + static_cast<float>(i);
  return v;
}

json trainer_common(int64_t iteration) {
  return json{{"iteration", iteration},
              {"consumed_train_samples", iteration * 8},
              {"consumed_valid_samples", 16},
              {"num_floating_point_operations_so_far", 1.2345678901234567e15},
              {"opt_param_scheduler", {{"num_steps", iteration * 8}, {"max_lr", 6e-4}}},
              {"optimizer", {{"step", iteration}}},
              {"rng_state", {{"seed", 1234}, {"philox_offset", uint64_t{18446744073709551557ull}}}},
              {"args", {{"--lr", 6e-4}, {"--lr-decay-style", "cosine"}, {"--bf16", true}}}};
}

// ---------------------------------------------------------------- round trip

TEST(Checkpoint, RoundTripIsBitwiseForEveryDtype) {
  const std::string dir = fresh_dir("roundtrip");
  std::mt19937 g(7);
  Buf f32({3, 5, 7}, DType::kF32), f64({11}, DType::kF64), b16({4, 4}, DType::kBF16), i32({6}, DType::kI32),
      i64({2, 3}, DType::kI64), scalar(Shape{}, DType::kF32), empty({0, 4}, DType::kF32);
  for (auto* b : {&f32, &f64, &b16, &i32, &i64, &scalar})
    for (size_t i = 0; i + 1 < b->bytes.size(); ++i) b->bytes[i] = static_cast<char>(g());
  // Special values survive bit for bit: NaN payload, -0, denormal, inf.
  uint32_t specials[] = {0x7fc01234u, 0x80000000u, 0x00000001u, 0xff800000u};
  std::memcpy(f32.t.data(), specials, sizeof specials);
  std::vector<NamedSlice> ts = {{"decoder.layers.0.self_attention.linear_qkv.weight", {3, 5, 7}, {}, f32.t, {}},
                                {"a.f64", {11}, {}, f64.t, {}},
                                {"a.bf16", {4, 4}, {}, b16.t, {}},
                                {"a.i32", {6}, {}, i32.t, {}},
                                {"a.i64", {2, 3}, {}, i64.t, {}},
                                {"a.scalar", Shape{}, {}, scalar.t, {}},
                                {"a.empty", {0, 4}, {}, empty.t, {}}};
  ASSERT_TRUE(save_checkpoint(dir, 20, ts, trainer_common(20), 0, 1).is_ok());

  EXPECT_EQ(slurp(dir + "/latest_checkpointed_iteration.txt"), "20");  // Megatron's tracker: the bare number
  EXPECT_TRUE(fs::is_directory(dir + "/iter_0000020"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000020/common.json"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000020/model_rank00000.safetensors"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();

  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->iteration(), 20);
  EXPECT_EQ(ck->directory(), dir + "/iter_0000020");
  for (const auto& s : ts) {
    Buf out(s.data.shape(), s.data.dtype());
    ASSERT_TRUE(ck->read(s.name, out.t).is_ok()) << s.name;
    EXPECT_TRUE(out.same_bits(s.data)) << s.name;
    auto info = ck->info(s.name);
    ASSERT_TRUE(info.is_ok());
    EXPECT_EQ(info->global_shape, s.global_shape);
    EXPECT_EQ(info->dtype, s.data.dtype());
  }
  EXPECT_EQ(ck->tensor_names().size(), ts.size());
  // common.json: the trainer's keys verbatim (doubles and uint64 exact) plus ours.
  const json& c = ck->common();
  json want = trainer_common(20);
  for (auto& [k, v] : want.items()) EXPECT_EQ(c[k], v) << k;
  EXPECT_EQ(c["num_floating_point_operations_so_far"].get<double>(), 1.2345678901234567e15);
  EXPECT_EQ(c["rng_state"]["philox_offset"].get<uint64_t>(), 18446744073709551557ull);
  EXPECT_EQ(c["format_version"], kFormatVersion);
  EXPECT_EQ(c["world_size"], 1);
  // Loading a given iteration works too.
  auto ck2 = load_checkpoint(dir, 20);
  ASSERT_TRUE(ck2.is_ok()) << ck2.status().message();
  fs::remove_all(dir);
}

TEST(Checkpoint, StoresBf16WhenAskedAndConvertsOnRequest) {
  const std::string dir = fresh_dir("bf16");
  std::vector<float> v = {1.0f, 1.00390625f /* exact bf16 */, 3.14159265f, -2.5e-3f, 65504.0f, 1e-30f};
  Tensor t(v.data(), {2, 3}, DType::kF32);
  ASSERT_TRUE(save_checkpoint(dir, 1, {{"w", {2, 3}, {}, t, DType::kBF16}}, json::object(), 0, 1).is_ok());
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->info("w")->dtype, DType::kBF16);
  std::vector<float> back(6);
  Tensor o(back.data(), {2, 3}, DType::kF32);
  Status strict = ck->read("w", o);
  EXPECT_EQ(strict.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(strict.message().find("stored as bf16"), std::string::npos) << strict.message();
  EXPECT_NE(strict.message().find("model_rank00000.safetensors"), std::string::npos) << strict.message();
  ASSERT_TRUE(ck->read("w", o, /*allow_dtype_conversion=*/true).is_ok());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(back[i], bf16_to_float(float_to_bf16(v[i]))) << i;
  fs::remove_all(dir);
}

// With require_finite (how weights and optimizer state are loaded) a stored
// NaN or inf (fp32, or bf16 as stored) fails the read with the tensor, its
// file and the element, for a whole read and for a slice; without it the
// bytes come back as stored (the round trip above).
TEST(Checkpoint, NonFiniteValuesFailTheirRead) {
  for (const DType stored : {DType::kF32, DType::kBF16}) {
    for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      const std::string dir = fresh_dir("nonfinite");
      std::vector<float> v = {1, 2, 3, 4, 5, 6};
      v[4] = bad;
      Tensor t(v.data(), {2, 3}, DType::kF32);
      ASSERT_TRUE(save_checkpoint(dir, 1, {{"w", {2, 3}, {}, t, stored}}, json::object(), 0, 1).is_ok());
      auto ck = load_checkpoint(dir);
      ASSERT_TRUE(ck.is_ok()) << ck.status().message();
      std::vector<float> back(6);
      ASSERT_TRUE(ck->read("w", Tensor(back.data(), {2, 3}, DType::kF32), true));
      const Status st = ck->read("w", Tensor(back.data(), {2, 3}, DType::kF32), true, /*require_finite=*/true);
      ASSERT_EQ(st.code(), StatusCode::kCorrupt) << bad;
      EXPECT_NE(st.message().find("tensor 'w' (from '" + dir), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("element 4 of the slice at offsets [0, 0] is not finite"), std::string::npos)
          << st.message();
      // The row without it reads; the row with it fails at its own element 1.
      EXPECT_TRUE(ck->read_slice("w", Shape{2, 3}, {0, 0}, Tensor(back.data(), {1, 3}, DType::kF32), true, true));
      const Status row = ck->read_slice("w", Shape{2, 3}, {1, 0}, Tensor(back.data(), {1, 3}, DType::kF32), true, true);
      EXPECT_NE(row.message().find("element 1 of the slice at offsets [1, 0]"), std::string::npos) << row.message();
      fs::remove_all(dir);
    }
  }
}

// ---------------------------------------------------------------- resharding

// A [6, 8, 4] tensor saved by 2 ranks (split on dim 0) and a [6, 10] tensor
// saved as a 2 x 2 grid of 4 slices by one rank; read back whole and under
// other slicings.
class Reshard : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("reshard");
    a_ = iota_tensor(6 * 8 * 4);
    b_ = iota_tensor(6 * 10);
    // Rank r holds rows [3r, 3r+3) of A; rank 1 also holds the 4-way grid of B.
    std::vector<std::vector<float>> parts;
    for (int r = 0; r < 2; ++r) {
      std::vector<NamedSlice> ts;
      ts.push_back({"A", {6, 8, 4}, {3 * r, 0, 0}, Tensor(a_.data() + r * 3 * 32, {3, 8, 4}, DType::kF32), {}});
      if (r == 1) {
        // B split at row 2 and column 7: [2,7] [2,3] [4,7] [4,3].
        const int64_t rows[2][2] = {{0, 2}, {2, 6}}, cols[2][2] = {{0, 7}, {7, 10}};
        for (auto& rr : rows)
          for (auto& cc : cols) {
            auto& p = parts.emplace_back();
            for (int64_t i = rr[0]; i < rr[1]; ++i)
              for (int64_t j = cc[0]; j < cc[1]; ++j) p.push_back(b_[static_cast<size_t>(i * 10 + j)]);
          }
        int k = 0;
        for (auto& rr : rows)
          for (auto& cc : cols) {
            ts.push_back({"B", {6, 10}, {rr[0], cc[0]},
                          Tensor(parts[static_cast<size_t>(k++)].data(), {rr[1] - rr[0], cc[1] - cc[0]}, DType::kF32),
                          {}});
          }
      }
      SaveOptions o;
      o.tmp_tag = "job42";
      o.commit = false;
      ASSERT_TRUE(save_checkpoint(dir_, 5, ts, trainer_common(5), r, 2, o).is_ok());
    }
    SaveOptions o;
    o.tmp_tag = "job42";
    ASSERT_TRUE(commit_checkpoint(dir_, 5, 2, o).is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Reads A[o0:o0+s0, o1:o1+s1, o2:o2+s2] and compares with the closed form.
  void check_a(std::array<int64_t, 3> off, std::array<int64_t, 3> shp, const LoadedCheckpoint& ck) {
    std::vector<float> out(static_cast<size_t>(shp[0] * shp[1] * shp[2]), -1.0f);
    Tensor t(out.data(), {shp[0], shp[1], shp[2]}, DType::kF32);
    Status st = ck.read_slice("A", {6, 8, 4}, {off[0], off[1], off[2]}, t);
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (int64_t i = 0; i < shp[0]; ++i)
      for (int64_t j = 0; j < shp[1]; ++j)
        for (int64_t k = 0; k < shp[2]; ++k)
          ASSERT_EQ(out[static_cast<size_t>((i * shp[1] + j) * shp[2] + k)],
                    a_[static_cast<size_t>(((off[0] + i) * 8 + off[1] + j) * 4 + off[2] + k)])
              << "A at " << off[0] + i << "," << off[1] + j << "," << off[2] + k;
  }
  void check_b(std::array<int64_t, 2> off, std::array<int64_t, 2> shp, const LoadedCheckpoint& ck) {
    std::vector<double> out(static_cast<size_t>(shp[0] * shp[1]), -1.0);
    Tensor t(out.data(), {shp[0], shp[1]}, DType::kF64);  // read with conversion into fp64
    Status st = ck.read_slice("B", {6, 10}, {off[0], off[1]}, t, true);
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (int64_t i = 0; i < shp[0]; ++i)
      for (int64_t j = 0; j < shp[1]; ++j)
        ASSERT_EQ(out[static_cast<size_t>(i * shp[1] + j)], b_[static_cast<size_t>((off[0] + i) * 10 + off[1] + j)])
            << "B at " << off[0] + i << "," << off[1] + j;
  }

  std::string dir_;
  std::vector<float> a_, b_;
};

TEST_F(Reshard, WholeTensorsAssembleFromAllSlices) {
  auto ck = load_checkpoint(dir_);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->common()["world_size"], 2);
  check_a({0, 0, 0}, {6, 8, 4}, *ck);
  check_b({0, 0}, {6, 10}, *ck);
}

TEST_F(Reshard, OtherSlicingsReadBack) {
  auto ck = load_checkpoint(dir_);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  for (int64_t r = 0; r < 3; ++r) check_a({2 * r, 0, 0}, {2, 8, 4}, *ck);   // 3 ranks on dim 0 (crosses the split)
  for (int64_t c = 0; c < 2; ++c) check_a({0, 4 * c, 0}, {6, 4, 4}, *ck);   // 2 ranks on dim 1 (column split)
  for (int64_t c = 0; c < 4; ++c) check_a({0, 0, c}, {6, 8, 1}, *ck);       // split on the last dim: strided runs
  check_a({1, 3, 1}, {4, 5, 2}, *ck);                                       // an interior box
  check_a({5, 7, 3}, {1, 1, 1}, *ck);                                       // one element
  check_a({2, 0, 0}, {0, 8, 4}, *ck);                                       // empty request
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 2; ++c) check_b({2 * r, 5 * c}, {2, 5}, *ck);  // 3 x 2 grid over a 2 x 2 stored grid
  check_b({1, 6}, {4, 3}, *ck);                                            // straddles all four stored slices
  check_b({0, 9}, {6, 1}, *ck);
}

TEST_F(Reshard, FileHoldsSeveralSlicesOfOneNameUnderDistinctKeys) {
  const std::string file = dir_ + "/iter_0000005/model_rank00001.safetensors";
  const std::string bytes = slurp(file);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  json h = json::parse(bytes.substr(8, n));
  EXPECT_TRUE(h.contains("B") && h.contains("B#1") && h.contains("B#2") && h.contains("B#3") && h.contains("A"));
  json d = json::parse(h["__metadata__"]["B#3"].get<std::string>());
  EXPECT_EQ(d["name"], "B");
  EXPECT_EQ(d["global_shape"], json({6, 10}));
  EXPECT_EQ(d["offsets"], json({2, 7}));
  EXPECT_EQ(h["B#3"]["shape"], json({4, 3}));
}

// ---------------------------------------------------------------- the files are standard safetensors

TEST(Checkpoint, FilesAreStandardSafetensors) {
  const std::string dir = fresh_dir("format");
  std::vector<float> w = {1.5f, -2.0f, 0.25f, 8.0f, 3.0f, -7.5f};
  std::vector<double> d = {0.1, 0.2};
  ASSERT_TRUE(save_checkpoint(dir, 3,
                              {{"embedding.word_embeddings.weight", {2, 3}, {}, Tensor(w.data(), {2, 3}, DType::kF32), {}},
                               {"optimizer.exp_avg.x", {4}, {2}, Tensor(d.data(), {2}, DType::kF64), {}}},
                              json::object(), 0, 1)
                  .is_ok());
  const std::string path = dir + "/iter_0000003/model_rank00000.safetensors";
  const std::string bytes = slurp(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);  // little-endian
  ASSERT_LE(8 + n, bytes.size());
  json h = json::parse(bytes.substr(8, n));
  // Data offsets tile the data section exactly, in order, and match dtype x shape.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    uint64_t numel = 1;
    for (auto& s : v["shape"]) numel *= s.get<uint64_t>();
    const uint64_t es = v["dtype"] == "F32" ? 4 : v["dtype"] == "F64" ? 8 : 0;
    ASSERT_NE(es, 0u) << v.dump();
    ranges.push_back({v["data_offsets"][0], v["data_offsets"][1]});
    EXPECT_EQ(ranges.back().second - ranges.back().first, numel * es) << k;
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto& r : ranges) {
    EXPECT_EQ(r.first, at);
    at = r.second;
  }
  EXPECT_EQ(8 + n + at, bytes.size());
  // __metadata__ is a str -> str map, as the format requires.
  for (auto& [k, v] : h["__metadata__"].items()) EXPECT_TRUE(v.is_string()) << k;
  json desc = json::parse(h["__metadata__"]["optimizer.exp_avg.x"].get<std::string>());
  EXPECT_EQ(desc["global_shape"], json({4}));
  EXPECT_EQ(desc["offsets"], json({2}));
  // The bytes of a tensor are the row-major little-endian values.
  float back[6];
  std::memcpy(back, bytes.data() + 8 + n + h["embedding.word_embeddings.weight"]["data_offsets"][0].get<uint64_t>(), 24);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], w[static_cast<size_t>(i)]);

  // The same with Python's standard library only, when python3 exists.
  if (std::system("python3 -c 'import json, struct' >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "python3 not found: skipping the python3 half of FilesAreStandardSafetensors\n");
  } else {
    const std::string script = dir + "/check.py";
    spit(script,
         "import json, struct, sys\n"
         "b = open(sys.argv[1], 'rb').read()\n"
         "(n,) = struct.unpack('<Q', b[:8])\n"
         "h = json.loads(b[8:8 + n])\n"
         "t = h['embedding.word_embeddings.weight']\n"
         "s, e = t['data_offsets']\n"
         "v = struct.unpack('<6f', b[8 + n + s:8 + n + e])\n"
         "assert t['dtype'] == 'F32' and t['shape'] == [2, 3], t\n"
         "assert v == (1.5, -2.0, 0.25, 8.0, 3.0, -7.5), v\n"
         "m = h['__metadata__']\n"
         "assert all(isinstance(x, str) for x in m.values())\n"
         "assert json.loads(m['optimizer.exp_avg.x'])['offsets'] == [2]\n"
         "assert m['format'] == 'megatron-cpp-checkpoint'\n"
         "print('ok')\n");
    EXPECT_EQ(std::system(("python3 " + script + " " + path).c_str()), 0);
  }
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- errors

void expect_error(const Status& st, StatusCode code, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), code) << st.message();
  for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << "'" << n << "' not in: " << st.message();
}

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("errors");
    w_ = iota_tensor(12);
    ASSERT_TRUE(save_checkpoint(dir_, 7, {{"w", {3, 4}, {}, Tensor(w_.data(), {3, 4}, DType::kF32), {}}},
                                trainer_common(7), 0, 1)
                    .is_ok());
    file_ = dir_ + "/iter_0000007/model_rank00000.safetensors";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, file_;
  std::vector<float> w_;
};

TEST_F(Errors, MissingTensorShapeAndDtypeMismatch) {
  auto ck = load_checkpoint(dir_);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  std::vector<float> o(12);
  std::vector<double> o64(12);
  expect_error(ck->read("nope", Tensor(o.data(), {3, 4}, DType::kF32)), StatusCode::kNotFound, {"'nope'", dir_});
  expect_error(ck->read("w", Tensor(o.data(), {4, 3}, DType::kF32)), StatusCode::kInvalidArgument,
               {"'w'", "global shape [3, 4]", "[4, 3] expected", file_});
  expect_error(ck->read("w", Tensor(o64.data(), {3, 4}, DType::kF64)), StatusCode::kInvalidArgument,
               {"'w'", "stored as fp32", "fp64 requested"});
  expect_error(ck->read_slice("w", {3, 4}, {2, 0}, Tensor(o.data(), {2, 4}, DType::kF32)),
               StatusCode::kInvalidArgument, {"outside the global shape [3, 4]"});
  expect_error(ck->read_slice("w", {3, 4}, {0}, Tensor(o.data(), {2, 4}, DType::kF32)),
               StatusCode::kInvalidArgument, {"does not match"});
  EXPECT_EQ(ck->info("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(Errors, NoCheckpointAndBadTracker) {
  const std::string empty = fresh_dir("empty");
  expect_error(load_checkpoint(empty).status(), StatusCode::kNotFound,
               {"no checkpoint in", "latest_checkpointed_iteration.txt"});
  expect_error(load_checkpoint(empty + "/missing").status(), StatusCode::kNotFound, {"does not exist", "missing"});
  expect_error(load_checkpoint(dir_, 8).status(), StatusCode::kNotFound, {"iter_0000008"});
  spit(dir_ + "/latest_checkpointed_iteration.txt", "9");
  expect_error(load_checkpoint(dir_).status(), StatusCode::kNotFound,
               {"latest_checkpointed_iteration.txt' names iteration 9", "iter_0000009' does not exist"});
  spit(dir_ + "/iter_0000009", "a file");  // where the iteration's directory should be
  expect_error(load_checkpoint(dir_).status(), StatusCode::kNotFound, {"iter_0000009' is not a directory"});
  fs::remove(dir_ + "/iter_0000009");
  expect_error(load_checkpoint(dir_ + "/latest_checkpointed_iteration.txt").status(), StatusCode::kNotFound,
               {"--load: '", "latest_checkpointed_iteration.txt' is not a directory"});
  spit(dir_ + "/latest_checkpointed_iteration.txt", std::string("\x00\xff\n", 3));  // bytes shown escaped
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {"holds \"\\u0000\ufffd\\n\""});
  spit(dir_ + "/latest_checkpointed_iteration.txt", "nine");
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {"holds \"nine\"", "iteration number"});
  spit(dir_ + "/latest_checkpointed_iteration.txt", "7\n");  // whitespace is fine
  EXPECT_TRUE(load_checkpoint(dir_).is_ok());
  EXPECT_EQ(*read_tracker(dir_).value(), 7);
  EXPECT_FALSE(read_tracker(empty).value().has_value());
  EXPECT_FALSE(read_tracker(empty + "/not_created_yet").value().has_value());
  fs::remove_all(empty);
}

TEST_F(Errors, CorruptFilesAreNamed) {
  const std::string good = slurp(file_);
  // Truncated data.
  spit(file_, good.substr(0, good.size() - 5));
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "tensor 'w'", "file truncated"});
  // Header length beyond the file.
  std::string bad = good;
  bad[6] = 0x7f;
  spit(file_, bad);
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "offset 0", "header length"});
  // Header not JSON.
  bad = good;
  bad[8] = '#';
  spit(file_, bad);
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "offset 8", "not a JSON object"});
  // Too short to be safetensors.
  spit(file_, "abc");
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "8-byte header length"});
  // Unknown dtype.
  bad = good;
  bad.replace(bad.find("\"F32\""), 5, "\"F16\"");
  spit(file_, bad);
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "dtype \"F16\""});
  // A plain safetensors file from elsewhere (no slice metadata).
  {
    uint64_t n;
    std::memcpy(&n, good.data(), 8);
    json h = json::parse(good.substr(8, n));
    h.erase("__metadata__");
    std::string hs = h.dump();
    uint64_t m = hs.size();
    std::string f(reinterpret_cast<char*>(&m), 8);
    spit(file_, f + hs + good.substr(8 + n));
    expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {file_, "__metadata__", "not a megatron-cpp"});
  }
  // Rank file missing.
  fs::remove(file_);
  expect_error(load_checkpoint(dir_).status(), StatusCode::kNotFound, {file_});
  spit(file_, good);
  ASSERT_TRUE(load_checkpoint(dir_).is_ok());
  // common.json: missing, not JSON, wrong version, wrong iteration, bad file name.
  const std::string common = dir_ + "/iter_0000007/common.json";
  const std::string cgood = slurp(common);
  fs::remove(common);
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {common, "incomplete"});
  spit(common, "{not json");
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {common, "not a JSON object"});
  json c = json::parse(cgood);
  c["format_version"] = 99;
  spit(common, c.dump());
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {common, "format_version 99"});
  c = json::parse(cgood);
  c["iteration"] = 8;
  spit(common, c.dump());
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {common, "iteration 8", "iteration 7"});
  c = json::parse(cgood);
  c["files"] = {"../../etc/passwd"};
  spit(common, c.dump());
  expect_error(load_checkpoint(dir_).status(), StatusCode::kCorrupt, {"not a plain file name"});
}

TEST_F(Errors, IncompleteCoverageAndOverlaps) {
  const std::string d = fresh_dir("coverage");
  std::vector<float> v = iota_tensor(8);
  // Only rows [0, 2) of a [4, 2] tensor are saved.
  ASSERT_TRUE(save_checkpoint(d, 1, {{"t", {4, 2}, {0, 0}, Tensor(v.data(), {2, 2}, DType::kF32), {}}},
                              json::object(), 0, 1)
                  .is_ok());
  auto ck = load_checkpoint(d);
  ASSERT_TRUE(ck.is_ok());
  std::vector<float> o(8);
  EXPECT_TRUE(ck->read_slice("t", {4, 2}, {0, 0}, Tensor(o.data(), {2, 2}, DType::kF32)).is_ok());
  expect_error(ck->read("t", Tensor(o.data(), {4, 2}, DType::kF32)), StatusCode::kCorrupt, {"'t'", "cover 4 of the 8"});
  // Overlapping slices are refused at save ...
  expect_error(save_checkpoint(d, 2,
                               {{"t", {4, 2}, {0, 0}, Tensor(v.data(), {2, 2}, DType::kF32), {}},
                                {"t", {4, 2}, {1, 0}, Tensor(v.data(), {2, 2}, DType::kF32), {}}},
                               json::object(), 0, 1),
               StatusCode::kInvalidArgument, {"overlap"});
  // ... and at load when two ranks wrote the same region.
  SaveOptions o2;
  o2.tmp_tag = "t", o2.commit = false;
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(save_checkpoint(d, 3, {{"t", {4, 2}, {r, 0}, Tensor(v.data(), {2, 2}, DType::kF32), {}}},
                                json::object(), r, 2, o2)
                    .is_ok());
  o2.commit.reset();
  ASSERT_TRUE(commit_checkpoint(d, 3, 2, o2).is_ok());
  expect_error(load_checkpoint(d).status(), StatusCode::kCorrupt, {"overlaps another stored slice"});
  // Bad slices at save.
  expect_error(save_checkpoint(d, 4, {{"t", {4, 2}, {3, 0}, Tensor(v.data(), {2, 2}, DType::kF32), {}}},
                               json::object(), 0, 1),
               StatusCode::kInvalidArgument, {"outside the global shape"});
  expect_error(save_checkpoint(d, 4, {{"t", {8}, {}, Tensor(v.data(), {2, 2}, DType::kF32), {}}}, json::object(), 0, 1),
               StatusCode::kInvalidArgument, {"differ in rank"});
  expect_error(save_checkpoint(d, 4, {}, json{{"iteration", 5}}, 0, 1), StatusCode::kInvalidArgument,
               {"iteration 5", "for 4"});
  expect_error(save_checkpoint(d, 4, {}, json::array(), 0, 1), StatusCode::kInvalidArgument, {"JSON object"});
  // commit without every rank's file.
  SaveOptions o3;
  o3.tmp_tag = "u", o3.commit = false;
  ASSERT_TRUE(save_checkpoint(d, 5, {}, json::object(), 0, 2, o3).is_ok());
  o3.commit.reset();
  expect_error(commit_checkpoint(d, 5, 2, o3), StatusCode::kNotFound, {"model_rank00001.safetensors", "missing"});
  fs::remove_all(d);
}

// ---------------------------------------------------------------- killed mid-write

// Saves iteration 10, then forks a child that saves iteration 20 with
// MT_TEST_CHECKPOINT_PAUSE=<stage>, waits until it pauses, SIGKILLs it, and
// checks that iteration 10 still loads exactly and the tracker names it.
class KilledMidWrite : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledMidWrite, PreviousCheckpointSurvives) {
  const std::string stage = GetParam();
  const std::string dir = fresh_dir(std::string("kill_") + stage);
  std::vector<float> old_w = iota_tensor(64), new_w(1 << 20, 3.0f), new_b(1 << 18, 4.0f);
  ASSERT_TRUE(save_checkpoint(dir, 10, {{"w", {64}, {}, Tensor(old_w.data(), {64}, DType::kF32), {}}},
                              trainer_common(10), 0, 1)
                  .is_ok());
  const std::string marker = dir + "/.paused_" + stage;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MT_TEST_CHECKPOINT_PAUSE", stage.c_str(), 1);
    Status st = save_checkpoint(dir, 20,
                                {{"w", {1 << 20}, {}, Tensor(new_w.data(), {1 << 20}, DType::kF32), {}},
                                 {"b", {1 << 18}, {}, Tensor(new_b.data(), {1 << 18}, DType::kF32), {}}},
                                trainer_common(20), 0, 1);
    _exit(st.is_ok() ? 3 : 4);  // reaching here means the hook did not pause
  }
  bool paused = false;
  for (int i = 0; i < 2000 && !paused; ++i) {
    paused = fs::exists(marker);
    if (!paused) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(paused) << "the child never reached stage " << stage;
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  fs::remove(marker);

  EXPECT_EQ(slurp(dir + "/latest_checkpointed_iteration.txt"), "10");
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->iteration(), 10);
  EXPECT_EQ(ck->common()["consumed_train_samples"], 80);
  std::vector<float> back(64);
  ASSERT_TRUE(ck->read("w", Tensor(back.data(), {64}, DType::kF32)).is_ok());
  EXPECT_EQ(back, old_w);
  bool stale = false;
  for (const auto& e : fs::directory_iterator(dir)) stale |= e.path().filename().string().find(".tmp.") != std::string::npos;
  if (std::string(stage) != "before_tracker") {
    EXPECT_TRUE(stale) << "expected the dead writer's temporary directory";
  }

  // The next save removes the dead writer's temporaries and moves the tracker on.
  ASSERT_TRUE(save_checkpoint(dir, 30, {{"w", {64}, {}, Tensor(old_w.data(), {64}, DType::kF32), {}}},
                              trainer_common(30), 0, 1)
                  .is_ok());
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  EXPECT_EQ(load_checkpoint(dir)->iteration(), 30);
  EXPECT_TRUE(load_checkpoint(dir, 10).is_ok());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, KilledMidWrite, ::testing::Values("mid_file", "before_rename", "before_tracker"));

// --verify-integrity: the commit records every file's CRC-32 and size (a
// two-rank save, each rank writing its file); verify_integrity() passes on
// the saved files and names the file when one byte of it, or of common.json,
// changes; a checkpoint saved without it has nothing to verify.
TEST(Checkpoint, IntegrityRecordsAndChecksEveryFile) {
  const std::string dir = fresh_dir("integrity");
  std::vector<float> a = {1, 2, 3, 4};
  SaveOptions so;
  so.tmp_tag = "t";
  so.verify_integrity = true;
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(save_checkpoint(dir, 5, {{"w", {4}, {2 * r}, Tensor(a.data() + 2 * r, {2}, DType::kF32), {}}},
                                trainer_common(5), r, 2, so)
                    .is_ok());
  ASSERT_TRUE(commit_checkpoint(dir, 5, 2, so).is_ok());
  const std::string it = dir + "/iter_0000005";
  const json j = json::parse(std::ifstream(it + "/integrity.json"));
  EXPECT_EQ(j["algorithm"], "crc32");
  EXPECT_EQ(j["files"].size(), 3u);  // common.json and two rank files
  EXPECT_EQ(j["files"]["model_rank00001.safetensors"]["bytes"].get<uint64_t>(),
            fs::file_size(it + "/model_rank00001.safetensors"));
  {
    auto ck = load_checkpoint(dir);
    ASSERT_TRUE(ck.is_ok()) << ck.status().message();
    EXPECT_TRUE(ck->verify_integrity().is_ok()) << ck->verify_integrity().message();
  }
  for (const std::string f : {"model_rank00001.safetensors", "common.json"}) {
    const std::string path = it + "/" + f;
    std::string bytes = slurp(path);
    const std::string saved = bytes;
    if (f == "common.json") {  // a count changed, still valid JSON
      const size_t at = bytes.find("\"consumed_valid_samples\": 16");
      ASSERT_NE(at, std::string::npos);
      bytes[at + 27] = '7';
    } else {
      bytes[bytes.size() - 3] ^= 0x01;  // a flipped bit in the last value
    }
    spit(path, bytes);
    auto ck = load_checkpoint(dir);
    ASSERT_TRUE(ck.is_ok()) << ck.status().message();
    const Status st = ck->verify_integrity();
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << f;
    EXPECT_NE(st.message().find(f + " has changed since it was saved"), std::string::npos) << st.message();
    spit(path, saved);
  }
  fs::remove(it + "/integrity.json");
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok());
  EXPECT_EQ(ck->verify_integrity().code(), StatusCode::kNotFound);
  EXPECT_NE(ck->verify_integrity().message().find("saved without --verify-integrity"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, ReleaseTrackerNamesTheReleaseDirectory) {
  const std::string dir = fresh_dir("release");
  std::vector<float> a = {1, 2};
  ASSERT_TRUE(save_checkpoint(dir, 0, {{"w", {2}, {}, Tensor(a.data(), {2}, DType::kF32), {}}}, json::object(), 0, 1).is_ok());
  fs::rename(dir + "/iter_0000000", dir + "/release");
  spit(dir + "/latest_checkpointed_iteration.txt", "release");
  EXPECT_EQ(*read_tracker(dir).value(), 0);
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ(ck->iteration(), 0);
  EXPECT_EQ(ck->directory(), dir + "/release");
  fs::remove_all(dir);
}

TEST(Checkpoint, ResavingAnIterationReplacesIt) {
  const std::string dir = fresh_dir("resave");
  std::vector<float> a = {1, 2}, b = {3, 4};
  ASSERT_TRUE(save_checkpoint(dir, 4, {{"w", {2}, {}, Tensor(a.data(), {2}, DType::kF32), {}}}, json::object(), 0, 1).is_ok());
  ASSERT_TRUE(save_checkpoint(dir, 4, {{"w", {2}, {}, Tensor(b.data(), {2}, DType::kF32), {}}}, json::object(), 0, 1).is_ok());
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok());
  std::vector<float> o(2);
  ASSERT_TRUE(ck->read("w", Tensor(o.data(), {2}, DType::kF32)).is_ok());
  EXPECT_EQ(o, b);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- training state

model::ModelConfig tiny(int64_t hidden) {
  model::ModelConfig c;
  c.num_layers = 2, c.hidden_size = hidden, c.num_attention_heads = 2, c.seq_length = 8;
  c.max_position_embeddings = 8, c.vocab_size = 30, c.make_vocab_size_divisible_by = 8;
  c.hidden_dropout = 0, c.attention_dropout = 0;
  return c;
}

std::unique_ptr<model::GPTModel> make_model(int64_t hidden, uint64_t seed) {
  auto m = model::GPTModel::create(tiny(hidden), model::GPTOptions{});
  MT_CHECK(m.is_ok(), m.status().message());
  auto model = std::move(*m);
  model->init_parameters(seed);
  return model;
}

TEST(TrainingState, ModelAndMomentsRoundTripBitwise) {
  const std::string dir = fresh_dir("train_state");
  auto a = make_model(16, 1);
  optim::Optimizer oa(*a);
  std::mt19937 g(3);
  std::normal_distribution<float> n;
  for (int s = 0; s < 2; ++s) {
    for (const Tensor& t : a->grads())
      for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = n(g);
    oa.step(1e-2, 0.1);
  }
  json common = trainer_common(2);
  common["optimizer"] = {{"step", oa.step_count()}};
  ASSERT_TRUE(save_checkpoint(dir, 2, training_state_slices(*a, &oa), common, 0, 1).is_ok());

  auto b = make_model(16, 99);  // different initial weights
  optim::Optimizer ob(*b);
  auto ck = load_checkpoint(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  ASSERT_TRUE(load_training_state(*ck, *b, &ob).is_ok());
  ob.set_step_count(ck->common()["optimizer"]["step"].get<int64_t>());
  for (size_t i = 0; i < a->params().size(); ++i) {
    ASSERT_EQ(0, std::memcmp(a->params()[i].data(), b->params()[i].data(), a->params()[i].nbytes())) << i;
    ASSERT_EQ(0, std::memcmp(oa.exp_avg()[i].data(), ob.exp_avg()[i].data(), oa.exp_avg()[i].nbytes())) << i;
    ASSERT_EQ(0, std::memcmp(oa.exp_avg_sq()[i].data(), ob.exp_avg_sq()[i].data(), oa.exp_avg_sq()[i].nbytes())) << i;
  }
  // One more identical step on both stays bitwise identical.
  for (auto* m : {a.get(), b.get()}) {
    std::mt19937 g2(5);
    for (const Tensor& t : m->grads())
      for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = n(g2);
  }
  oa.step(1e-2, 0.1), ob.step(1e-2, 0.1);
  for (size_t i = 0; i < a->params().size(); ++i)
    ASSERT_EQ(0, std::memcmp(a->params()[i].data(), b->params()[i].data(), a->params()[i].nbytes())) << i;
  EXPECT_TRUE(ck->has_tensor("optimizer.exp_avg.embedding.word_embeddings.weight"));
  EXPECT_TRUE(ck->has_tensor("optimizer.exp_avg_sq.decoder.final_layernorm.bias"));

  // A model with another hidden size: the first parameter's shape is reported.
  auto c = make_model(32, 1);
  expect_error(load_training_state(*ck, *c, nullptr), StatusCode::kInvalidArgument,
               {"embedding.word_embeddings.weight", "global shape [32, 16]", "[32, 32] expected"});
  // Saved without optimizer state: loading moments names --no-load-optim; params alone load.
  const std::string dir2 = fresh_dir("train_state_noopt");
  ASSERT_TRUE(save_checkpoint(dir2, 1, training_state_slices(*a, nullptr), json::object(), 0, 1).is_ok());
  auto ck2 = load_checkpoint(dir2);
  ASSERT_TRUE(ck2.is_ok());
  expect_error(load_training_state(*ck2, *b, &ob), StatusCode::kNotFound, {"--no-load-optim"});
  EXPECT_TRUE(load_training_state(*ck2, *b, nullptr).is_ok());
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

}  // namespace
}  // namespace mt::checkpoint
