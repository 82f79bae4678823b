#include "train/progress_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

namespace mt::train {

namespace {

std::string local_time_text(std::time_t t) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

bool parse_local_time(const std::string& text, std::time_t* out) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%Y-%m-%d %H:%M:%S", &tm);
  if (!end || *end) return false;
  tm.tm_isdst = -1;
  *out = std::mktime(&tm);
  return *out != static_cast<std::time_t>(-1);
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i <= line.size(); ++i)
    if (i == line.size() || line[i] == '\t') out.push_back(line.substr(b, i - b)), b = i + 1;
  return out;
}

// The value of a "Name: value" field (Megatron's _get_field: after ": ").
bool field(const std::string& token, std::string* value) {
  const size_t p = token.find(": ");
  if (p == std::string::npos) return false;
  *value = token.substr(p + 2);
  return true;
}

}  // namespace

ProgressLog::ProgressLog(const std::string& save_dir, int64_t world_size)
    : path_(save_dir + "/progress.txt"), world_(world_size) {}

Status ProgressLog::append(const std::string& what) const {
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string line = fmt::format("{}\tJob ID: {}\t# GPUs: {}\t{}\n", local_time_text(std::time(nullptr)),
                                       job ? job : "", world_, what);
  std::FILE* f = std::fopen(path_.c_str(), "a");
  if (!f) return Status::io_error(fmt::format("--log-progress: cannot open {}: {}", path_, std::strerror(errno)));
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  if (std::fclose(f) != 0 || !ok)
    return Status::io_error(fmt::format("--log-progress: cannot write {}: {}", path_, std::strerror(errno)));
  return Status::ok();
}

Result<ProgressLog::Start> ProgressLog::start_of_world_size() const {
  std::ifstream in(path_);
  if (!in) return Status::io_error(fmt::format("--log-progress: cannot read {}", path_));
  bool have_start = false;
  Start start;
  double latest_flops = 0;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::vector<std::string> t = split_tabs(line);
    std::string gpus;
    if (t.size() < 4 || !field(t[2], &gpus)) continue;
    char* end = nullptr;
    const long long world = std::strtoll(gpus.c_str(), &end, 10);
    if (end == gpus.c_str() || *end) continue;
    if (t[3] == "Saved checkpoint") {
      std::string flops;
      if (t.size() > 7 && field(t[7], &flops)) latest_flops = std::strtod(flops.c_str(), nullptr);
    }
    if (world != world_) {  // a job of another world size: search again after it
      have_start = false;
      continue;
    }
    if (t[3] == "Starting job" && !have_start) {
      std::time_t when = 0;
      if (!parse_local_time(t[0], &when)) continue;
      have_start = true;
      start.time = when;
      start.flops = latest_flops;
    }
  }
  if (!have_start)
    return Status::corrupt(fmt::format("--log-progress: {} has no 'Starting job' line for {} GPUs", path_, world_));
  return start;
}

Status ProgressLog::saved_checkpoint(int64_t iteration, double flops_so_far, double job_flops_start,
                                     double job_seconds, int64_t tokens_so_far) const {
  const double world = static_cast<double>(world_);
  const double job_tflops = (flops_so_far - job_flops_start) / (std::max(job_seconds, 1e-9) * 1e12 * world);
  auto start = start_of_world_size();
  if (!start) return start.status();
  // The file's times have whole seconds: within the first one, one second.
  const double all_s = std::max(1.0, std::difftime(std::time(nullptr), start->time));
  const double cumulative = (flops_so_far - start->flops) / (all_s * 1e12 * world);
  return append(fmt::format("Saved checkpoint\tIteration: {}\tJob throughput: {:.1f} TFLOP/s/GPU\tCumulative "
                            "throughput: {:.1f} TFLOP/s/GPU\tFloating-point operations: {:.2e}\tTokens (in billions): "
                            "{:.2f}",
                            iteration, job_tflops, cumulative, flops_so_far, static_cast<double>(tokens_so_far) / 1e9));
}

}  // namespace mt::train
