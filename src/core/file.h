#pragma once
// Files written so that nothing already there is lost: the bytes go to
// "<path>.tmp.<pid>", are flushed, and the temporary is renamed over `path`
// only when complete.

#include <string>
#include <string_view>

#include "core/status.h"

namespace mt {

Status write_file_atomic(const std::string& path, std::string_view data);

// A regular file opened read-only without blocking (a FIFO in place of a
// file cannot hang the caller): its descriptor, which the caller closes,
// and its size. kNotFound when it does not exist, kIoError when it cannot
// be opened, kInvalid for a directory, FIFO or device, each naming the path.
struct OpenedFile {
  int fd = -1;
  size_t size = 0;
};
Result<OpenedFile> open_regular_file(const std::string& path);

// The whole of a regular file of at most max_bytes. Anything else fails
// with its path: kNotFound when it does not exist, kInvalid for a
// directory, FIFO or device (opened without blocking, so a FIFO in place of
// a file cannot hang the caller), kCorrupt past max_bytes, kIoError when a
// read fails.
Result<std::string> read_regular_file(const std::string& path, size_t max_bytes);

}  // namespace mt
