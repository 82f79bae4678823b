#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace mt {

Status write_file_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::io_error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::io_error(fmt::format("cannot write '{}': {}", tmp, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::io_error(fmt::format("cannot flush '{}': {}", tmp, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err)));
  }
  return Status::ok();
}

Result<OpenedFile> open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = fmt::format("cannot open '{}': {}", path, std::strerror(err));
    return err == ENOENT ? Status::not_found(msg) : Status::io_error(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid(fmt::format("'{}' is not a regular file (a directory, FIFO or device stands in its place)", path));
  }
  return OpenedFile{fd, static_cast<size_t>(st.st_size)};
}

Result<std::string> read_regular_file(const std::string& path, size_t max_bytes) {
  auto f = open_regular_file(path);
  if (!f) return f.status();
  const int fd = f->fd;
  if (f->size > max_bytes) {
    ::close(fd);
    return Status::corrupt(fmt::format("'{}' is {} bytes, more than the {} such a file can hold", path, f->size,
                                       max_bytes));
  }
  std::string out(f->size, '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::io_error(fmt::format("cannot read '{}': {}", path, std::strerror(err)));
    }
    if (n == 0) break;  // shrank while read
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

}  // namespace mt
