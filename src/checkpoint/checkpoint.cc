// Sharded checkpoints: see checkpoint.h for the layout and the guarantees.
//
// Writing streams each rank file (header, then every tensor's bytes) with
// plain write(2) calls, so a checkpoint never needs a second copy of the
// model in memory; every file and directory is fsync'ed before the rename
// that publishes it. Reading maps each rank file read-only and copies the
// overlap of every stored slice with the requested one, run by run.

#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <zlib.h>

#include "core/device.h"
#include "core/file.h"
#include "core/safetensors.h"

namespace mt::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormatName = "megatron-cpp-checkpoint";
constexpr const char* kCommonFile = "common.json";
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 30;

std::string rank_file_name(int rank) { return fmt::format("model_rank{:05d}.safetensors", rank); }

std::string shape_str(const Shape& s) { return s.str(); }

std::string vec_str(const std::vector<int64_t>& v) {
  std::string r = "[";
  for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
  return r + "]";
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16; }

// Converts n elements between float dtypes (or copies when equal). Source and
// destination may be unaligned (mapped file bytes).
void convert_run(const char* src, DType st, char* dst, DType dt, int64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(st));
    return;
  }
  auto load = [&](int64_t i) -> double {
    switch (st) {
      case DType::kF32: { float f; std::memcpy(&f, src + 4 * i, 4); return f; }
      case DType::kF64: { double d; std::memcpy(&d, src + 8 * i, 8); return d; }
      case DType::kBF16: { bf16 h; std::memcpy(&h, src + 2 * i, 2); return bf16_to_float(h); }
      default: MT_CHECK(false, "convert_run: not a float dtype");
    }
    return 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    const double v = load(i);
    switch (dt) {
      case DType::kF32: { float f = static_cast<float>(v); std::memcpy(dst + 4 * i, &f, 4); break; }
      case DType::kF64: std::memcpy(dst + 8 * i, &v, 8); break;
      case DType::kBF16: {
        // fp64 -> fp32 -> bf16 can double-round; only fp32 -> bf16 is used for storage.
        bf16 h = float_to_bf16(static_cast<float>(v));
        std::memcpy(dst + 2 * i, &h, 2);
        break;
      }
      default: MT_CHECK(false, "convert_run: not a float dtype");
    }
  }
}

std::string errno_str() { return std::strerror(errno); }

// ---------------------------------------------------------------- writing

class FileWriter {
 public:
  Status open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::io_error(fmt::format("cannot create '{}': {}", path, errno_str()));
    return Status::ok();
  }
  Status write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::io_error(fmt::format("cannot write '{}': {}", path_, errno_str()));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::ok();
  }
  Status close() {
    if (fd_ < 0) return Status::ok();
    int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      std::string e = errno_str();
      ::close(fd);
      return Status::io_error(fmt::format("cannot flush '{}': {}", path_, e));
    }
    if (::close(fd) != 0) return Status::io_error(fmt::format("cannot close '{}': {}", path_, errno_str()));
    return Status::ok();
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::io_error(fmt::format("cannot open directory '{}': {}", dir, errno_str()));
  int rc = ::fsync(fd);
  std::string e = rc != 0 ? errno_str() : "";
  ::close(fd);
  if (rc != 0) return Status::io_error(fmt::format("cannot flush directory '{}': {}", dir, e));
  return Status::ok();
}

// The crash-test hook (MT_TEST_CHECKPOINT_PAUSE, see checkpoint.h).
void maybe_pause(const std::string& save_dir, const char* stage) {
  const char* want = std::getenv("MT_TEST_CHECKPOINT_PAUSE");
  if (!want || std::strcmp(want, stage) != 0) return;
  const std::string marker = fmt::format("{}/.paused_{}", save_dir, stage);
  std::fprintf(stderr, "checkpoint: MT_TEST_CHECKPOINT_PAUSE=%s: pausing (pid %d); marker %s\n", stage,
               static_cast<int>(getpid()), marker.c_str());
  (void)write_file_atomic(marker, std::to_string(getpid()));
  for (;;) ::pause();
}

std::string tmp_dir_path(const std::string& save_dir, int64_t iteration, const SaveOptions& o) {
  const std::string tag = o.tmp_tag.empty() ? std::to_string(getpid()) : o.tmp_tag;
  return fmt::format("{}/{}.tmp.{}", save_dir, iteration_dir_name(iteration), tag);
}

// Removes "<iter_*|release>.tmp.*" directories and tracker temporaries other than `keep`.
void remove_stale(const std::string& save_dir, const std::string& keep) {
  std::error_code ec;
  fs::directory_iterator it(save_dir, ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const bool ckpt_tmp = (name.rfind("iter_", 0) == 0 || name.rfind("release", 0) == 0) &&
                          name.find(".tmp.") != std::string::npos;
    const bool tracker_tmp = name.rfind(std::string(kTrackerFile) + ".tmp.", 0) == 0;
    if ((ckpt_tmp || tracker_tmp) && it->path().string() != keep) stale.push_back(it->path());
  }
  for (const auto& p : stale) {
    std::error_code e2;
    fs::remove_all(p, e2);
    if (e2) std::fprintf(stderr, "checkpoint: warning: cannot remove stale '%s': %s\n", p.c_str(), e2.message().c_str());
  }
}

struct PlannedSlice {
  const NamedSlice* s;
  std::string key;
  DType store;
  std::vector<int64_t> offsets;
  uint64_t begin = 0, end = 0;
};

Status check_slices(const std::vector<NamedSlice>& tensors, std::vector<PlannedSlice>* out) {
  std::map<std::string, std::vector<size_t>> by_name;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedSlice& s = tensors[i];
    const std::string where = fmt::format("checkpoint slice {} ('{}')", i, s.name);
    if (s.name.empty() || s.name == "__metadata__" || s.name.find('#') != std::string::npos)
      return Status::invalid(fmt::format("{}: invalid tensor name (empty, '__metadata__' or containing '#')", where));
    if (!s.data.defined() && s.data.numel() != 0) return Status::invalid(where + ": no data");
    const int nd = s.global_shape.ndim;
    if (s.data.ndim() != nd)
      return Status::invalid(fmt::format("{}: data shape {} and global shape {} differ in rank", where,
                                         shape_str(s.data.shape()), shape_str(s.global_shape)));
    std::vector<int64_t> off = s.offsets.empty() ? std::vector<int64_t>(static_cast<size_t>(nd), 0) : s.offsets;
    if (static_cast<int>(off.size()) != nd)
      return Status::invalid(fmt::format("{}: {} offsets for a {}-d global shape {}", where, off.size(), nd,
                                         shape_str(s.global_shape)));
    for (int k = 0; k < nd; ++k)
      if (off[k] < 0 || s.data.dim(k) < 0 || off[k] + s.data.dim(k) > s.global_shape[k])
        return Status::invalid(fmt::format("{}: slice at offsets {} with shape {} lies outside the global shape {}",
                                           where, vec_str(off), shape_str(s.data.shape()), shape_str(s.global_shape)));
    DType store = s.store_dtype.value_or(s.data.dtype());
    if (store != s.data.dtype() && !(is_float(store) && is_float(s.data.dtype())))
      return Status::invalid(fmt::format("{}: cannot store {} data as {}", where, dtype_name(s.data.dtype()),
                                         dtype_name(store)));
    for (size_t j : by_name[s.name]) {
      const NamedSlice& o = tensors[j];
      if (!(o.global_shape == s.global_shape))
        return Status::invalid(fmt::format("checkpoint slices {} and {} of '{}' give different global shapes {} and {}",
                                           j, i, s.name, shape_str(o.global_shape), shape_str(s.global_shape)));
      const PlannedSlice& po = (*out)[j];
      bool overlap = true;
      for (int k = 0; k < nd; ++k)
        if (std::max(off[k], po.offsets[k]) >= std::min(off[k] + s.data.dim(k), po.offsets[k] + o.data.dim(k)))
          overlap = false;
      if (overlap && s.data.numel() > 0 && o.data.numel() > 0)
        return Status::invalid(fmt::format("checkpoint slices {} and {} of '{}' overlap (offsets {} and {})", j, i,
                                           s.name, vec_str(po.offsets), vec_str(off)));
    }
    const size_t k = by_name[s.name].size();
    by_name[s.name].push_back(i);
    out->push_back(PlannedSlice{&s, k == 0 ? s.name : fmt::format("{}#{}", s.name, k), store, off});
  }
  return Status::ok();
}

Status write_rank_file(const std::string& path, const std::string& save_dir, const std::vector<PlannedSlice>& plan,
                       int rank, int world) {
  json h = json::object();
  json meta = json::object();
  meta["format"] = kFormatName;
  meta["format_version"] = std::to_string(kFormatVersion);
  meta["rank"] = std::to_string(rank);
  meta["world_size"] = std::to_string(world);
  uint64_t off = 0;
  std::vector<PlannedSlice> p = plan;
  for (auto& ps : p) {
    const Tensor& d = ps.s->data;
    std::vector<int64_t> shape(d.shape().d.begin(), d.shape().d.begin() + d.ndim());
    std::vector<int64_t> gshape(ps.s->global_shape.d.begin(), ps.s->global_shape.d.begin() + ps.s->global_shape.ndim);
    ps.begin = off;
    ps.end = off + static_cast<uint64_t>(d.numel()) * dtype_size(ps.store);
    off = ps.end;
    h[ps.key] = {{"dtype", safetensors_dtype_name(ps.store)}, {"shape", shape}, {"data_offsets", {ps.begin, ps.end}}};
    meta[ps.key] = json{{"name", ps.s->name}, {"global_shape", gshape}, {"offsets", ps.offsets}}.dump(
        -1, ' ', false, json::error_handler_t::replace);
  }
  h["__metadata__"] = meta;
  std::string header = h.dump(-1, ' ', false, json::error_handler_t::replace);
  while (header.size() % 8) header += ' ';  // 8-byte aligned data section, as safetensors writers do
  FileWriter w;
  MT_RETURN_IF_ERROR(w.open(path));
  const uint64_t n = header.size();
  MT_RETURN_IF_ERROR(w.write(&n, 8));  // little-endian host
  MT_RETURN_IF_ERROR(w.write(header.data(), header.size()));
  std::vector<char> buf;
  bool first = true;
  std::vector<char> staged;  // a device tensor's bytes on the host
  for (const auto& ps : p) {
    Tensor d = ps.s->data;
    if (d.device() != Device::kCpu) {
      staged.resize(d.nbytes());
      Tensor host(staged.data(), d.shape(), d.dtype());
      copy_tensor(d, host);
      d = host;
    }
    if (ps.store == d.dtype()) {
      MT_RETURN_IF_ERROR(w.write(d.data(), d.nbytes()));
    } else {
      constexpr int64_t kChunk = int64_t{1} << 20;
      buf.resize(static_cast<size_t>(kChunk) * dtype_size(ps.store));
      for (int64_t i = 0; i < d.numel(); i += kChunk) {
        const int64_t m = std::min(kChunk, d.numel() - i);
        convert_run(static_cast<const char*>(d.data()) + i * static_cast<int64_t>(dtype_size(d.dtype())), d.dtype(),
                    buf.data(), ps.store, m);
        MT_RETURN_IF_ERROR(w.write(buf.data(), static_cast<size_t>(m) * dtype_size(ps.store)));
      }
    }
    if (first) maybe_pause(save_dir, "mid_file");
    first = false;
  }
  return w.close();
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

Status save_checkpoint(const std::string& save_dir, int64_t iteration, const std::vector<NamedSlice>& tensors,
                       const json& common, int rank, int world, const SaveOptions& options) {
  if (save_dir.empty()) return Status::invalid("--save: empty checkpoint directory");
  if (iteration < 0) return Status::invalid(fmt::format("checkpoint iteration {} is negative", iteration));
  if (world < 1 || rank < 0 || rank >= world)
    return Status::invalid(fmt::format("checkpoint rank {} of world {} is out of range", rank, world));
  if (!common.is_object()) return Status::invalid("checkpoint common state must be a JSON object");
  if (common.contains("iteration") &&
      !(common["iteration"].is_number_integer() && common["iteration"].get<int64_t>() == iteration))
    return Status::invalid(fmt::format("checkpoint common state has iteration {} but the checkpoint is for {}",
                                       common["iteration"].dump(), iteration));
  std::vector<PlannedSlice> plan;
  MT_RETURN_IF_ERROR(check_slices(tensors, &plan));

  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) return Status::io_error(fmt::format("--save: cannot create '{}': {}", save_dir, ec.message()));
  const std::string tmp = tmp_dir_path(save_dir, iteration, options);
  const bool commit = options.commit.value_or(world == 1);
  if (world == 1) {
    remove_stale(save_dir, "");  // includes an old `tmp` of the same tag: start clean
  }
  fs::create_directories(tmp, ec);
  if (ec) return Status::io_error(fmt::format("cannot create '{}': {}", tmp, ec.message()));

  MT_RETURN_IF_ERROR(write_rank_file(tmp + "/" + rank_file_name(rank), save_dir, plan, rank, world));
  if (rank == 0) {
    json c = common;
    c["format"] = kFormatName;
    c["format_version"] = kFormatVersion;
    c["iteration"] = iteration;
    c["world_size"] = world;
    json files = json::array();
    for (int r = 0; r < world; ++r) files.push_back(rank_file_name(r));
    c["files"] = files;
    FileWriter w;
    // Invalid UTF-8 in a trainer string is replaced (U+FFFD), never thrown.
    const std::string text = c.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    MT_RETURN_IF_ERROR(w.open(tmp + "/" + kCommonFile));
    MT_RETURN_IF_ERROR(w.write(text.data(), text.size()));
    MT_RETURN_IF_ERROR(w.close());
  }
  if (!commit) return Status::ok();
  MT_CHECK(rank == 0, "save_checkpoint: only rank 0 commits");
  return commit_checkpoint(save_dir, iteration, world, options);
}

namespace {

constexpr const char* kIntegrityFile = "integrity.json";

// zlib's CRC-32 and the size of a whole regular file (not a link, FIFO or
// device: a name from integrity.json must not block or leave the checkpoint),
// read in 8 MiB blocks.
Result<std::pair<uint64_t, uint32_t>> file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Status::io_error(fmt::format("cannot open '{}': {}", path, errno_str()));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::corrupt(fmt::format("'{}' is not a regular file", path));
  }
  std::vector<unsigned char> buf(size_t{8} << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t bytes = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_str();
      ::close(fd);
      return Status::io_error(fmt::format("cannot read '{}': {}", path, why));
    }
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return std::pair<uint64_t, uint32_t>{bytes, static_cast<uint32_t>(crc)};
}

}  // namespace

Status commit_checkpoint(const std::string& save_dir, int64_t iteration, int world, const SaveOptions& options) {
  const std::string tmp = tmp_dir_path(save_dir, iteration, options);
  const std::string final_dir = fmt::format("{}/{}", save_dir, iteration_dir_name(iteration));
  std::error_code ec;
  if (!fs::is_directory(tmp, ec))
    return Status::not_found(fmt::format("commit_checkpoint: '{}' does not exist (did every rank save?)", tmp));
  std::vector<std::string> need = {kCommonFile};
  for (int r = 0; r < world; ++r) need.push_back(rank_file_name(r));
  for (const auto& f : need)
    if (!fs::is_regular_file(tmp + "/" + f, ec))
      return Status::not_found(fmt::format("commit_checkpoint: '{}/{}' is missing (did every rank save?)", tmp, f));
  if (options.verify_integrity) {
    json files = json::object();
    for (const auto& f : need) {
      auto d = file_crc32(tmp + "/" + f);
      if (!d) return d.status();
      files[f] = {{"bytes", d->first}, {"crc32", d->second}};
    }
    FileWriter w;
    const std::string text = json{{"algorithm", "crc32"}, {"files", files}}.dump(2) + "\n";
    MT_RETURN_IF_ERROR(w.open(tmp + "/" + kIntegrityFile));
    MT_RETURN_IF_ERROR(w.write(text.data(), text.size()));
    MT_RETURN_IF_ERROR(w.close());
  }
  MT_RETURN_IF_ERROR(fsync_dir(tmp));
  maybe_pause(save_dir, "before_rename");

  if (fs::exists(final_dir, ec)) {
    // Swap atomically so that a crash never leaves iter_N missing; the old
    // directory then sits under the temporary name and is removed below.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS)
        return Status::io_error(fmt::format("cannot exchange '{}' and '{}': {}", tmp, final_dir, errno_str()));
      const std::string old = final_dir + ".tmp.old." + std::to_string(getpid());
      if (std::rename(final_dir.c_str(), old.c_str()) != 0)
        return Status::io_error(fmt::format("cannot move '{}' aside: {}", final_dir, errno_str()));
      if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
        return Status::io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, final_dir, errno_str()));
    }
  } else if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return Status::io_error(fmt::format("cannot rename '{}' to '{}': {}", tmp, final_dir, errno_str()));
  }
  MT_RETURN_IF_ERROR(fsync_dir(save_dir));
  maybe_pause(save_dir, "before_tracker");

  // Megatron writes the bare number (no newline).
  MT_RETURN_IF_ERROR(write_file_atomic(fmt::format("{}/{}", save_dir, kTrackerFile), std::to_string(iteration)));
  MT_RETURN_IF_ERROR(fsync_dir(save_dir));
  remove_stale(save_dir, "");
  return Status::ok();
}

// ---------------------------------------------------------------- reading

namespace {

struct MappedFile {
  std::string path;
  const char* base = nullptr;  // whole file
  size_t size = 0;
  const char* data = nullptr;  // data section
  size_t data_size = 0;
  ~MappedFile() {
    if (base && size) ::munmap(const_cast<char*>(base), size);
  }
};

struct StoredSlice {
  int file;
  std::string key;
  Shape shape;
  std::vector<int64_t> offsets;
  DType dtype;
  const char* data;
};

struct StoredTensor {
  Shape global_shape;
  DType dtype;
  std::vector<StoredSlice> slices;
};

}  // namespace

struct LoadedCheckpoint::Impl {
  std::string dir;
  int64_t iteration = 0;
  json common;
  std::vector<std::unique_ptr<MappedFile>> files;
  std::map<std::string, StoredTensor> tensors;
};

LoadedCheckpoint::LoadedCheckpoint() : impl_(std::make_unique<Impl>()) {}
LoadedCheckpoint::LoadedCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedCheckpoint::~LoadedCheckpoint() = default;
LoadedCheckpoint::LoadedCheckpoint(LoadedCheckpoint&&) noexcept = default;
LoadedCheckpoint& LoadedCheckpoint::operator=(LoadedCheckpoint&&) noexcept = default;

int64_t LoadedCheckpoint::iteration() const { return impl_->iteration; }
const std::string& LoadedCheckpoint::directory() const { return impl_->dir; }
const json& LoadedCheckpoint::common() const { return impl_->common; }

Status LoadedCheckpoint::verify_integrity() const {
  const std::string path = impl_->dir + "/" + kIntegrityFile;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::not_found(fmt::format("--verify-integrity: {} has no {}: it was saved without --verify-integrity "
                                         "(drop the flag to load it unchecked)",
                                         impl_->dir, kIntegrityFile));
  auto text = read_regular_file(path, size_t{64} << 20);
  if (!text) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("algorithm") || j["algorithm"] != "crc32" || !j.contains("files") ||
      !j["files"].is_object())
    return Status::corrupt(fmt::format("{}: expected {{\"algorithm\": \"crc32\", \"files\": {{...}}}}", path));
  const json& files = j["files"];
  // Every file the checkpoint consists of must be listed.
  std::vector<std::string> need = {kCommonFile};
  for (const auto& f : impl_->files) need.push_back(fs::path(f->path).filename().string());
  for (const std::string& f : need)
    if (!files.contains(f))
      return Status::corrupt(fmt::format("{}: {} is not listed, so its integrity cannot be checked", path, f));
  for (const auto& [name, rec] : files.items()) {
    if (name.empty() || name.find('/') != std::string::npos || name.find('\0') != std::string::npos || name == "." ||
        name == ".." || !rec.is_object() ||
        !rec.contains("bytes") || !rec["bytes"].is_number_unsigned() || !rec.contains("crc32") ||
        !rec["crc32"].is_number_unsigned())
      return Status::corrupt(fmt::format("{}: entry '{}' is not {{\"bytes\": n, \"crc32\": c}}", path, name));
    auto d = file_crc32(impl_->dir + "/" + name);
    if (!d) return d.status();
    const uint64_t bytes = rec["bytes"].get<uint64_t>(), crc = rec["crc32"].get<uint64_t>();
    if (d->first != bytes || d->second != crc)
      return Status::corrupt(fmt::format(
          "--verify-integrity: {}/{} has changed since it was saved ({} bytes with CRC-32 {:08x}; saved: {} bytes "
          "with {:08x}): the file is damaged; load an earlier checkpoint",
          impl_->dir, name, d->first, d->second, bytes, crc));
  }
  return Status::ok();
}
bool LoadedCheckpoint::has_tensor(const std::string& name) const { return impl_->tensors.count(name) > 0; }

std::vector<std::string> LoadedCheckpoint::tensor_names() const {
  std::vector<std::string> r;
  for (const auto& [k, v] : impl_->tensors) r.push_back(k);
  return r;
}

Result<TensorInfo> LoadedCheckpoint::info(const std::string& name) const {
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end())
    return Status::not_found(fmt::format("checkpoint '{}' has no tensor '{}'", impl_->dir, name));
  return TensorInfo{name, it->second.global_shape, it->second.dtype};
}

namespace {

// The tracker and common.json: small text files (a FIFO or directory in
// their place is refused rather than read).
constexpr size_t kMaxTextFileBytes = size_t{64} << 20;

// Shape from a JSON array of non-negative integers.
bool parse_dims(const json& j, std::vector<int64_t>* v) {
  if (!j.is_array() || j.size() > static_cast<size_t>(kMaxDims)) return false;
  v->clear();
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return false;
    v->push_back(d.get<int64_t>());
  }
  return true;
}

Shape to_shape(const std::vector<int64_t>& v) {
  Shape s;
  for (int64_t d : v) s.d[s.ndim++] = d;
  return s;
}

Status open_rank_file(const std::string& path, int index, std::unique_ptr<MappedFile>* out,
                      std::map<std::string, StoredTensor>* tensors) {
  auto f = std::make_unique<MappedFile>();
  f->path = path;
  auto opened = open_regular_file(path);
  if (!opened) return Status(opened.status().code(), "checkpoint file: " + opened.status().message());
  const int fd = opened->fd;
  f->size = opened->size;
  if (f->size < 8) {
    ::close(fd);
    return Status::corrupt(fmt::format("'{}': {} bytes; a safetensors file starts with an 8-byte header length", path,
                                       f->size));
  }
  void* m = ::mmap(nullptr, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::io_error(fmt::format("cannot map '{}': {}", path, errno_str()));
  f->base = static_cast<const char*>(m);
  uint64_t n = 0;
  std::memcpy(&n, f->base, 8);
  if (n > kMaxHeaderBytes || n > f->size - 8)
    return Status::corrupt(fmt::format("'{}': offset 0: header length {} exceeds the file ({} bytes)", path, n, f->size));
  f->data = f->base + 8 + n;
  f->data_size = f->size - 8 - n;
  json h = json::parse(f->base + 8, f->base + 8 + n, nullptr, false);
  if (h.is_discarded() || !h.is_object())
    return Status::corrupt(fmt::format("'{}': offset 8: the {}-byte header is not a JSON object", path, n));
  auto mit = h.find("__metadata__");
  if (mit == h.end() || !mit->is_object())
    return Status::corrupt(fmt::format("'{}': header has no \"__metadata__\" object; not a megatron-cpp checkpoint file",
                                       path));
  const json& meta = *mit;
  if (!meta.contains("format") || meta["format"] != kFormatName)
    return Status::corrupt(fmt::format("'{}': __metadata__.format is {}, expected \"{}\"", path,
                                       meta.contains("format") ? meta["format"].dump() : "missing", kFormatName));
  if (!meta.contains("format_version") || meta["format_version"] != std::to_string(kFormatVersion))
    return Status::corrupt(fmt::format("'{}': __metadata__.format_version is {}, this build reads \"{}\"", path,
                                       meta.contains("format_version") ? meta["format_version"].dump() : "missing",
                                       kFormatVersion));
  for (const auto& [key, v] : h.items()) {
    if (key == "__metadata__") continue;
    const std::string where = fmt::format("'{}': tensor '{}'", path, key);
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v.contains("data_offsets"))
      return Status::corrupt(where + ": expected an object with dtype, shape and data_offsets");
    DType dt;
    // F16 is a safetensors type (Hugging Face imports read it) but never one
    // of this format's: its tensors are fp32 (or bf16, int) slices.
    if (!parse_safetensors_dtype(v["dtype"].get<std::string>(), &dt) || dt == DType::kF16)
      return Status::corrupt(fmt::format("{}: dtype {} is not one of F32, F64, BF16, I32, I64", where, v["dtype"].dump()));
    std::vector<int64_t> shape, range, gshape, offsets;
    if (!parse_dims(v["shape"], &shape)) return Status::corrupt(where + ": shape is not a list of non-negative integers");
    if (!parse_dims(v["data_offsets"], &range) || range.size() != 2 || range[1] < range[0])
      return Status::corrupt(where + ": data_offsets is not [begin, end] with begin <= end");
    const Shape s = to_shape(shape);
    uint64_t want = dtype_size(dt);
    for (int64_t d : shape)
      if (__builtin_mul_overflow(want, static_cast<uint64_t>(d), &want))
        return Status::corrupt(fmt::format("{}: shape {} is too large", where, s.str()));
    if (static_cast<uint64_t>(range[1] - range[0]) != want || static_cast<uint64_t>(range[1]) > f->data_size)
      return Status::corrupt(fmt::format("{}: data_offsets [{}, {}] (at file offset {}) do not hold {} {} elements of "
                                         "shape {} within the {} data bytes (file truncated?)",
                                         where, range[0], range[1], 8 + n + static_cast<uint64_t>(range[0]), s.numel(),
                                         safetensors_dtype_name(dt), s.str(), f->data_size));
    if (!meta.contains(key) || !meta[key].is_string())
      return Status::corrupt(fmt::format("{}: __metadata__ has no slice description for it", where));
    json sd = json::parse(meta[key].get<std::string>(), nullptr, false);
    if (sd.is_discarded() || !sd.is_object() || !sd.contains("name") || !sd["name"].is_string() ||
        !sd.contains("global_shape") || !sd.contains("offsets") || !parse_dims(sd["global_shape"], &gshape) ||
        !parse_dims(sd["offsets"], &offsets))
      return Status::corrupt(fmt::format("{}: __metadata__ entry {} is not {{\"name\", \"global_shape\", \"offsets\"}}",
                                         where, meta[key].dump()));
    if (gshape.size() != shape.size() || offsets.size() != shape.size())
      return Status::corrupt(fmt::format("{}: shape {}, global_shape {} and offsets {} differ in rank", where, s.str(),
                                         vec_str(gshape), vec_str(offsets)));
    for (size_t k = 0; k < shape.size(); ++k)
      if (offsets[k] > gshape[k] - shape[k])
        return Status::corrupt(fmt::format("{}: slice at offsets {} with shape {} lies outside global shape {}", where,
                                           vec_str(offsets), s.str(), vec_str(gshape)));
    const std::string name = sd["name"].get<std::string>();
    const Shape gs = to_shape(gshape);
    StoredSlice slice{index, key, s, offsets, dt, f->data + range[0]};
    auto [it, fresh] = tensors->try_emplace(name, StoredTensor{gs, dt, {}});
    StoredTensor& t = it->second;
    if (!fresh) {
      if (!(t.global_shape == gs) || t.dtype != dt)
        return Status::corrupt(fmt::format("{}: global shape {} {} disagrees with another slice of '{}' ({} {})", where,
                                           gs.str(), safetensors_dtype_name(dt), name, t.global_shape.str(), safetensors_dtype_name(t.dtype)));
      for (const auto& o : t.slices) {
        bool overlap = s.numel() > 0 && o.shape.numel() > 0;
        for (size_t k = 0; k < shape.size() && overlap; ++k)
          if (std::max(offsets[k], o.offsets[k]) >= std::min(offsets[k] + shape[k], o.offsets[k] + o.shape[k]))
            overlap = false;
        if (overlap)
          return Status::corrupt(fmt::format("{}: slice at offsets {} of '{}' overlaps another stored slice at {} "
                                             "(key '{}' of file {})",
                                             where, vec_str(offsets), name, vec_str(o.offsets), o.key, o.file));
      }
    }
    t.slices.push_back(std::move(slice));
  }
  *out = std::move(f);
  return Status::ok();
}

struct TrackerValue {
  int64_t iteration;
  std::string dir_name;
  std::string raw;
};

Result<std::optional<TrackerValue>> read_tracker_value(const std::string& dir) {
  // A missing directory is "no tracker" (Megatron starts from scratch when
  // --load names a directory that a first run's --save has not created yet).
  std::error_code ec;
  const std::string path = fmt::format("{}/{}", dir, kTrackerFile);
  if (!fs::exists(path, ec)) return std::optional<TrackerValue>();
  auto text = read_regular_file(path, kMaxTextFileBytes);
  if (!text) return text.status();
  std::string t = *text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  size_t b = 0;
  while (b < t.size() && std::isspace(static_cast<unsigned char>(t[b]))) ++b;
  t = t.substr(b);
  if (t == "release") return std::optional<TrackerValue>(TrackerValue{0, "release", t});
  if (t.empty() || t.size() > 18 || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return Status::corrupt(fmt::format("'{}' holds {}; expected an iteration number or \"release\"", path,
                                       json(text->substr(0, 64)).dump(-1, ' ', false, json::error_handler_t::replace)));
  const int64_t it = std::stoll(t);
  return std::optional<TrackerValue>(TrackerValue{it, iteration_dir_name(it), t});
}

}  // namespace

Result<std::optional<int64_t>> read_tracker(const std::string& dir) {
  auto r = read_tracker_value(dir);
  if (!r.is_ok()) return r.status();
  if (!r->has_value()) return std::optional<int64_t>();
  return std::optional<int64_t>((*r)->iteration);
}

Result<LoadedCheckpoint> load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration) {
  const std::string tracker = fmt::format("{}/{}", load_dir, kTrackerFile);
  auto impl = std::make_unique<LoadedCheckpoint::Impl>();
  std::string dir_name;
  {
    std::error_code ec;
    if (!fs::is_directory(load_dir, ec))
      return Status::not_found(fs::exists(load_dir, ec)
                                   ? fmt::format("--load: '{}' is not a directory (a checkpoint is the directory "
                                                 "--save named)",
                                                 load_dir)
                                   : fmt::format("--load: checkpoint directory '{}' does not exist", load_dir));
  }
  if (iteration) {
    impl->iteration = *iteration;
    dir_name = iteration_dir_name(*iteration);
  } else {
    auto tv = read_tracker_value(load_dir);
    if (!tv.is_ok()) return tv.status();
    if (!tv->has_value())
      return Status::not_found(fmt::format("no checkpoint in '{}': '{}' does not exist", load_dir, tracker));
    impl->iteration = (*tv)->iteration;
    dir_name = (*tv)->dir_name;
  }
  impl->dir = fmt::format("{}/{}", load_dir, dir_name);
  std::error_code ec;
  if (!fs::is_directory(impl->dir, ec)) {
    const char* what = fs::exists(impl->dir, ec) ? "is not a directory" : "does not exist";
    return Status::not_found(iteration ? fmt::format("no checkpoint for iteration {}: '{}' {}", *iteration, impl->dir,
                                                     what)
                                       : fmt::format("'{}' names iteration {}, but '{}' {}", tracker, impl->iteration,
                                                     impl->dir, what));
  }
  const std::string common_path = impl->dir + "/" + kCommonFile;
  auto text = read_regular_file(common_path, kMaxTextFileBytes);
  if (!text)
    return text.status().code() == StatusCode::kNotFound
               ? Status::corrupt(fmt::format("'{}' is missing; the checkpoint is incomplete", common_path))
               : text.status();
  json c = json::parse(*text, nullptr, false);
  if (c.is_discarded() || !c.is_object())
    return Status::corrupt(fmt::format("'{}' is not a JSON object", common_path));
  auto want_int = [&](const char* key) -> Result<int64_t> {
    if (!c.contains(key) || !c[key].is_number_integer())
      return Status::corrupt(fmt::format("'{}': \"{}\" is {}, expected an integer", common_path, key,
                                         c.contains(key) ? c[key].dump() : "missing"));
    return c[key].get<int64_t>();
  };
  if (!c.contains("format") || c["format"] != kFormatName)
    return Status::corrupt(fmt::format("'{}': \"format\" is {}, expected \"{}\"", common_path,
                                       c.contains("format") ? c["format"].dump() : "missing", kFormatName));
  auto ver = want_int("format_version");
  if (!ver.is_ok()) return ver.status();
  if (*ver != kFormatVersion)
    return Status::corrupt(fmt::format("'{}': format_version {} is not the version this build reads ({})", common_path,
                                       *ver, kFormatVersion));
  auto it = want_int("iteration");
  if (!it.is_ok()) return it.status();
  if (*it != impl->iteration)
    return Status::corrupt(fmt::format("'{}': iteration {} but the directory is for iteration {}", common_path, *it,
                                       impl->iteration));
  auto world = want_int("world_size");
  if (!world.is_ok()) return world.status();
  if (!c.contains("files") || !c["files"].is_array() || static_cast<int64_t>(c["files"].size()) != *world)
    return Status::corrupt(fmt::format("'{}': \"files\" must list {} rank files", common_path, *world));
  for (const auto& f : c["files"]) {
    if (!f.is_string() || f.get<std::string>().empty() || f.get<std::string>().find('/') != std::string::npos ||
        f.get<std::string>()[0] == '.')
      return Status::corrupt(fmt::format("'{}': \"files\" entry {} is not a plain file name", common_path, f.dump()));
    std::unique_ptr<MappedFile> mf;
    MT_RETURN_IF_ERROR(open_rank_file(impl->dir + "/" + f.get<std::string>(), static_cast<int>(impl->files.size()), &mf,
                                      &impl->tensors));
    impl->files.push_back(std::move(mf));
  }
  impl->common = std::move(c);
  return LoadedCheckpoint(std::move(impl));
}

namespace {

// The first element of a host tensor that is NaN or infinite, or -1 (any
// other dtype: -1).
int64_t first_non_finite(const Tensor& t) {
  const int64_t n = t.numel();
  auto scan = [&](auto bad) {
    for (int64_t i = 0; i < n; ++i)
      if (bad(i)) return i;
    return int64_t{-1};
  };
  switch (t.dtype()) {
    case DType::kF32: return scan([&](int64_t i) { return !std::isfinite(t.ptr<float>()[i]); });
    case DType::kF64: return scan([&](int64_t i) { return !std::isfinite(t.ptr<double>()[i]); });
    case DType::kBF16: {  // exponent all ones
      const auto* u = static_cast<const uint16_t*>(t.data());
      return scan([&](int64_t i) { return (u[i] & 0x7f80) == 0x7f80; });
    }
    case DType::kF16: {
      const auto* u = static_cast<const uint16_t*>(t.data());
      return scan([&](int64_t i) { return (u[i] & 0x7c00) == 0x7c00; });
    }
    default: return -1;
  }
}

}  // namespace

Status LoadedCheckpoint::read(const std::string& name, const Tensor& out, bool allow_dtype_conversion,
                              bool require_finite) const {
  return read_slice(name, out.shape(), {}, out, allow_dtype_conversion, require_finite);
}

Status LoadedCheckpoint::read_slice(const std::string& name, const Shape& global_shape,
                                    const std::vector<int64_t>& offsets_in, const Tensor& out,
                                    bool allow_dtype_conversion, bool require_finite) const {
  if (out.device() != Device::kCpu) {  // read on the host, then copy to the device
    std::vector<char> host(out.nbytes());
    Tensor h(host.data(), out.shape(), out.dtype());
    MT_RETURN_IF_ERROR(read_slice(name, global_shape, offsets_in, h, allow_dtype_conversion, require_finite));
    copy_tensor(h, out);
    return Status::ok();
  }
  auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end())
    return Status::not_found(fmt::format("checkpoint '{}' has no tensor '{}' ({} tensors stored)", impl_->dir, name,
                                         impl_->tensors.size()));
  const StoredTensor& t = it->second;
  const std::string first_file = impl_->files[static_cast<size_t>(t.slices[0].file)]->path;
  if (!(t.global_shape == global_shape))
    return Status::invalid(fmt::format("tensor '{}': global shape {} in '{}', but {} expected (was the checkpoint saved "
                                       "with another model configuration?)",
                                       name, t.global_shape.str(), first_file, global_shape.str()));
  if (out.dtype() != t.dtype && !(allow_dtype_conversion && is_float(out.dtype()) && is_float(t.dtype)))
    return Status::invalid(fmt::format("tensor '{}': stored as {} in '{}', but {} requested", name, dtype_name(t.dtype),
                                       first_file, dtype_name(out.dtype())));
  const int nd = global_shape.ndim;
  const std::vector<int64_t> off = offsets_in.empty() ? std::vector<int64_t>(static_cast<size_t>(nd), 0) : offsets_in;
  if (out.ndim() != nd || static_cast<int>(off.size()) != nd)
    return Status::invalid(fmt::format("tensor '{}': request of shape {} at offsets {} does not match the {}-d global "
                                       "shape {}",
                                       name, out.shape().str(), vec_str(off), nd, global_shape.str()));
  for (int k = 0; k < nd; ++k)
    if (off[k] < 0 || off[k] + out.dim(k) > global_shape[k])
      return Status::invalid(fmt::format("tensor '{}': requested slice at offsets {} with shape {} lies outside the "
                                         "global shape {}",
                                         name, vec_str(off), out.shape().str(), global_shape.str()));
  if (out.numel() > 0 && !out.defined()) return Status::invalid(fmt::format("tensor '{}': output has no memory", name));

  const size_t esz_src = dtype_size(t.dtype), esz_dst = dtype_size(out.dtype());
  int64_t covered = 0;
  for (const StoredSlice& s : t.slices) {
    // Intersection [lo, hi) in global coordinates.
    std::array<int64_t, kMaxDims> lo{}, hi{};
    bool empty = false;
    for (int k = 0; k < nd; ++k) {
      lo[k] = std::max(off[k], s.offsets[k]);
      hi[k] = std::min(off[k] + out.dim(k), s.offsets[k] + s.shape[k]);
      if (lo[k] >= hi[k]) empty = true;
    }
    if (empty || s.shape.numel() == 0 || out.numel() == 0) continue;
    // Row-major strides (elements) of the stored slice and of `out`.
    std::array<int64_t, kMaxDims> ss{}, ds{};
    int64_t a = 1, b = 1;
    for (int k = nd - 1; k >= 0; --k) {
      ss[k] = a;
      ds[k] = b;
      a *= s.shape[k];
      b *= out.dim(k);
    }
    // Merge trailing dimensions the intersection spans completely in both
    // tensors into one contiguous run: dims [k0, nd) are copied as a block.
    int k0 = nd;
    int64_t run = 1;
    while (k0 > 0) {
      const int k = k0 - 1;
      run *= hi[k] - lo[k];
      k0 = k;
      const bool full_src = lo[k] == s.offsets[k] && hi[k] == s.offsets[k] + s.shape[k];
      const bool full_dst = lo[k] == off[k] && hi[k] == off[k] + out.dim(k);
      if (!(full_src && full_dst)) break;
    }
    // Odometer over dims [0, k0).
    std::array<int64_t, kMaxDims> idx{};
    for (int k = 0; k < k0; ++k) idx[k] = lo[k];
    for (;;) {
      int64_t so = 0, dof = 0;
      for (int k = 0; k < nd; ++k) {
        const int64_t g = k < k0 ? idx[k] : lo[k];
        so += (g - s.offsets[k]) * ss[k];
        dof += (g - off[k]) * ds[k];
      }
      convert_run(s.data + so * static_cast<int64_t>(esz_src), t.dtype,
                  static_cast<char*>(out.data()) + dof * static_cast<int64_t>(esz_dst), out.dtype(), run);
      covered += run;
      int k = k0 - 1;
      while (k >= 0 && ++idx[k] == hi[k]) {
        idx[k] = lo[k];
        --k;
      }
      if (k < 0) break;
    }
  }
  if (covered != out.numel())
    return Status::corrupt(fmt::format("tensor '{}': the checkpoint's {} stored slice(s) cover {} of the {} elements "
                                       "requested at offsets {} with shape {} (global shape {}); a rank file is "
                                       "missing slices",
                                       name, t.slices.size(), covered, out.numel(), vec_str(off), out.shape().str(),
                                       global_shape.str()));
  if (const int64_t bad = require_finite ? first_non_finite(out) : -1; bad >= 0)
    return Status::corrupt(fmt::format("tensor '{}' (from '{}'): element {} of the slice at offsets {} is not finite: the "
                                       "run that saved it diverged, or the file is damaged; load an earlier iteration",
                                       name, first_file, bad, vec_str(off)));
  return Status::ok();
}

Result<std::vector<std::string>> training_argv(const nlohmann::json& common, const std::string& where) {
  if (!common.is_object() || !common.contains("args"))
    return Status::corrupt(fmt::format("{}: common.json has no \"args\" (the training arguments), so the model "
                                       "cannot be rebuilt", where));
  const nlohmann::json& a = common["args"];
  std::vector<std::string> argv;
  if (a.is_object() && a.contains("argv")) {
    if (!a["argv"].is_array())
      return Status::corrupt(fmt::format("{}: common.json args.argv must be a list of strings", where));
    for (const auto& t : a["argv"]) {
      if (!t.is_string()) return Status::corrupt(fmt::format("{}: common.json args.argv must be a list of strings", where));
      argv.push_back(t.get<std::string>());
    }
    // Checkpoints written before GELU followed Megatron's default fused
    // bias-GELU (the tanh form) computed the exact one unless --openai-gelu:
    // they have no "gelu" key, and rebuild that model.
    if (!a.contains("gelu") && std::find(argv.begin(), argv.end(), "--no-bias-gelu-fusion") == argv.end())
      argv.push_back("--no-bias-gelu-fusion");
    return argv;
  }
  if (!a.is_object()) return Status::corrupt(fmt::format("{}: common.json \"args\" must be an object", where));
  for (const auto& [key, v] : a.items()) {
    std::string flag = "--" + key;
    for (char& c : flag)
      if (c == '_') c = '-';
    if (v.is_boolean()) {
      if (v.get<bool>()) argv.push_back(flag);
    } else if (v.is_null()) {
      continue;
    } else if (v.is_string()) {
      argv.push_back(flag), argv.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      argv.push_back(flag);
      for (const auto& x : v) argv.push_back(x.is_string() ? x.get<std::string>() : x.dump());
    } else {
      argv.push_back(flag), argv.push_back(v.dump());
    }
  }
  return argv;
}

}  // namespace mt::checkpoint
