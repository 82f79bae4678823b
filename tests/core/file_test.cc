// core/file.h: atomic writes and reads that refuse what is not a regular file.
#include "core/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace mt {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::path(::testing::TempDir()) / ("mt_file_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(ReadRegularFile, ReadsFilesAndRefusesEverythingElse) {
  TempDir d;
  const std::string f = (d.path / "a.txt").string();
  ASSERT_TRUE(write_file_atomic(f, std::string("hello\0world", 11)));
  auto r = read_regular_file(f, 11);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(*r, std::string("hello\0world", 11));
  EXPECT_FALSE(fs::exists(f + ".tmp." + std::to_string(getpid()))) << "the temporary is renamed";

  auto big = read_regular_file(f, 10);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(big.status().message().find("11 bytes, more than the 10"), std::string::npos) << big.status().message();

  auto missing = read_regular_file((d.path / "none").string(), 100);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  auto dir = read_regular_file(d.path.string(), 100);
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dir.status().message().find("is not a regular file"), std::string::npos) << dir.status().message();

  // A FIFO with no writer: a blocking open would wait forever.
  const std::string fifo = (d.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto p = read_regular_file(fifo, 100);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(fifo), std::string::npos) << p.status().message();
}

}  // namespace
}  // namespace mt
