#pragma once
// What the trainer reports: Megatron's log line, a progress bar with ETA on a
// terminal, JSON-lines metrics, and the process's memory.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::train {

struct IterationStats {
  int64_t iteration = 0, train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;  // Megatron's skipped_train_samples (--decrease-batch-size-if-needed); shown when > 0
  double ms_per_iteration = 0;
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double loss = 0;               // mean over the logging interval
  std::optional<double> grad_norm = 0.0;  // none when the last iteration was skipped (loss scaling)
  double loss_scale = 1.0;               // the grad scaler's scale (1 without one)
  int64_t advanced_iterations = 1;       // not skipped in the interval: none, no lm loss to print
  std::optional<double> params_norm;  // with --log-params-norm
  std::optional<int64_t> num_zeros;   // with --log-num-zeros-in-grad
  // --num-experts: the router losses, unweighted, mean per layer and micro-batch
  std::optional<double> load_balancing_loss, z_loss;
  // Megatron's name for it: seq_load_balancing_loss under seq_aux_loss.
  std::string load_balancing_name = "load_balancing_loss";
  // --mtp-num-layers: each depth's loss ("mtp_1 loss", ...), the mean over
  // the interval's advanced iterations of Megatron's per-iteration value.
  std::vector<double> mtp_losses;
  int64_t skipped_iterations = 0, nan_iterations = 0;
  double tokens_per_s = 0;
  double tflops_per_device = 0;
  double mfu = 0;                // against the device profile's peak
  double planned_bytes = 0;      // the planner's prediction for this rank
  double measured_bytes = 0;     // peak of the trainer's planned buffers
  double peak_rss_bytes = 0;
};

// " [date] iteration   10/  300 | consumed samples: ... | lm loss: 7.123456E+00 | ..."
std::string format_log_line(const IterationStats& s);
nlohmann::json to_json(const IterationStats& s);

// A one-line bar redrawn in place on a terminal; nothing otherwise.
class ProgressBar {
 public:
  // Draws on stderr when enabled and stderr is a terminal, or when forced.
  explicit ProgressBar(bool enabled, bool force = false);
  void update(int64_t done, int64_t total, double seconds_per_iteration, double loss);
  void clear();  // before printing a normal line
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
};

// Appends one JSON object per line; the file is opened per write, so a crash
// loses at most the line being written.
class MetricsFile {
 public:
  MetricsFile() = default;
  explicit MetricsFile(std::string path) : path_(std::move(path)) {}
  void append(const nlohmann::json& j) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  mutable bool failed_ = false;  // warned once that appending failed
};

// VmHWM of this process (bytes), or 0 where /proc is missing.
double peak_rss_bytes();

}  // namespace mt::train
