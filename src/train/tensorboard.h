#pragma once
// TensorBoardWriter: scalar summaries in TensorBoard's event-file format, for
// Megatron's --tensorboard-dir, without TensorFlow or protobuf libraries.
//
// An event file is a sequence of TFRecords; each record is
//   uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// (little endian; masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, CRC-32C
// as in iSCSI), and each data is a serialized tensorflow.Event:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2". The file is named
// events.out.tfevents.<seconds>.<host>.<pid>.0 (TensorBoard reads every file
// whose name contains "tfevents"), appended to and flushed after each
// scalar, so a running TensorBoard follows the run, and a run that dies
// leaves every complete record readable.

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/status.h"

namespace mt::train {

// CRC-32C (Castagnoli) of bytes, and TFRecord's masked form of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Creates `dir` (and parents) and a new event file in it.
  Status open(const std::string& dir);
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }

  // One scalar (stored as float, as TensorBoard's simple_value is) at `step`.
  void add_scalar(const std::string& tag, double value, int64_t step);

 private:
  void write_event(const std::string& event);

  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace mt::train
