#include "train/metrics.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>

#include <fmt/format.h>

namespace mt::train {

namespace {

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

std::string mib(double b) { return fmt::format("{:.1f}", b / (1024.0 * 1024.0)); }

// Megatron's " mtp_1 loss: ... |" per depth (its MTPLossLoggingHelper names).
std::string mtp_text(const IterationStats& s) {
  std::string t;
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) t += fmt::format(" mtp_{} loss: {:.6E} |", k + 1, s.mtp_losses[k]);
  return t;
}

}  // namespace

std::string format_log_line(const IterationStats& s) {
  // Megatron's training_log layout (the grad norm left out when the last
  // iteration was skipped by the loss scaler), plus throughput and memory.
  return fmt::format(
      " [{}] iteration {:>8}/{:>8} | consumed samples: {:>12} |{} elapsed time per iteration (ms): {:.1f} | "
      "learning rate: {:.6E} | global batch size: {:>5} |{}{} loss scale: {:.1f} |{}{}{} "
      "number of skipped iterations: {:>3} | number of nan iterations: {:>3} | tokens/s: {:.0f} | "
      "throughput per device (TFLOP/s): {:.3f} | MFU: {:.1f}% | memory (MiB): {} measured, {} planned, peak RSS {}",
      now_text(), s.iteration, s.train_iters, s.consumed_samples,
      s.skipped_samples > 0 ? fmt::format(" skipped samples: {:>12} |", s.skipped_samples) : std::string(),
      s.ms_per_iteration, s.learning_rate,
      s.global_batch_size, s.advanced_iterations > 0 ? fmt::format(" lm loss: {:.6E} |", s.loss) : std::string(),
      (s.load_balancing_loss ? fmt::format(" {}: {:.6E} |", s.load_balancing_name, *s.load_balancing_loss) : std::string()) +
          (s.z_loss ? fmt::format(" z_loss: {:.6E} |", *s.z_loss) : std::string()) + mtp_text(s),
      s.loss_scale, s.grad_norm ? fmt::format(" grad norm: {:.3f} |", *s.grad_norm) : std::string(),
      // Megatron reduces the count as a float32 and prints the Python float.
      s.num_zeros ? fmt::format(" num zeros: {:.1f} |", static_cast<double>(static_cast<float>(*s.num_zeros))) : std::string(),
      s.params_norm ? fmt::format(" params norm: {:.3f} |", *s.params_norm) : std::string(), s.skipped_iterations,
      s.nan_iterations, s.tokens_per_s, s.tflops_per_device, s.mfu * 100, mib(s.measured_bytes), mib(s.planned_bytes),
      mib(s.peak_rss_bytes));
}

nlohmann::json to_json(const IterationStats& s) {
  nlohmann::json j = {{"iteration", s.iteration},
          {"train_iters", s.train_iters},
          {"consumed_samples", s.consumed_samples},
          {"ms_per_iteration", s.ms_per_iteration},
          {"learning_rate", s.learning_rate},
          {"global_batch_size", s.global_batch_size},
          {"loss_scale", s.loss_scale},
          {"skipped_iterations", s.skipped_iterations},
          {"nan_iterations", s.nan_iterations},
          {"tokens_per_s", s.tokens_per_s},
          {"tflops_per_device", s.tflops_per_device},
          {"mfu", s.mfu},
          {"memory_measured_bytes", s.measured_bytes},
          {"memory_planned_bytes", s.planned_bytes},
          {"peak_rss_bytes", s.peak_rss_bytes}};
  if (s.grad_norm) j["grad_norm"] = *s.grad_norm;
  if (s.advanced_iterations > 0) j["lm_loss"] = s.loss;  // none when every iteration was skipped
  if (s.params_norm) j["params_norm"] = *s.params_norm;
  if (s.num_zeros) j["num_zeros"] = *s.num_zeros;
  if (s.load_balancing_loss) j[s.load_balancing_name] = *s.load_balancing_loss;
  if (s.z_loss) j["z_loss"] = *s.z_loss;
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) j[fmt::format("mtp_{}_loss", k + 1)] = s.mtp_losses[k];
  if (s.skipped_samples > 0) j["skipped_samples"] = s.skipped_samples;
  return j;
}

ProgressBar::ProgressBar(bool enabled, bool force) : enabled_(enabled && (force || ::isatty(STDERR_FILENO))) {}

void ProgressBar::update(int64_t done, int64_t total, double spi, double loss) {
  if (!enabled_ || total <= 0) return;
  const int width = 30;
  const int filled = static_cast<int>(width * done / total);
  const double eta = spi * static_cast<double>(total - done);
  std::string bar(filled, '=');
  if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
  std::fprintf(stderr, "\r[%s] %3d%% it %lld/%lld | loss %.4f | ETA %dm%02ds ", bar.c_str(),
               static_cast<int>(100 * done / total), static_cast<long long>(done), static_cast<long long>(total), loss,
               static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

void MetricsFile::append(const nlohmann::json& j) const {
  if (path_.empty() || failed_) return;
  std::ofstream out(path_, std::ios::app);
  out << j.dump() << "\n";
  out.flush();
  if (!out) {
    failed_ = true;
    std::fprintf(stderr, "warning: --metrics-file: appending to %s failed; no more metrics are written there\n",
                 path_.c_str());
  }
}

double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}

}  // namespace mt::train
