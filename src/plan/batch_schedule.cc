#include "plan/batch_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace mt::plan {

namespace {

constexpr const char* kFlag = "--step-batch-size-schedule";

// Megatron's _parse_numeric_value: an optional suffix K, M, B or T (any case)
// multiplies a decimal number, and the product is truncated toward zero
// (Python's int(float(text) * multiplier)). Python's float() would also take
// "inf", "nan", hex-free forms with underscores; those are refused here.
Result<int64_t> parse_number(const std::string& entry, std::string text, const char* what) {
  auto bad = [&](const std::string& why) {
    return Status::invalid(fmt::format("{}: entry '{}': the {} '{}' {} (expected a number with an optional K, M, B "
                                       "or T suffix, e.g. \"0:256 250B:512\")",
                                       kFlag, entry, what, text, why));
  };
  double mult = 1;
  std::string digits = text;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': mult = 1e3; break;
      case 'M': mult = 1e6; break;
      case 'B': mult = 1e9; break;
      case 'T': mult = 1e12; break;
      default: break;
    }
    if (mult != 1) digits.pop_back();
  }
  if (digits.empty()) return bad("is empty");
  for (char ch : digits)
    if (!std::isdigit(static_cast<unsigned char>(ch)) && ch != '.' && ch != 'e' && ch != 'E' && ch != '+' && ch != '-')
      return bad("is not a number");
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) return bad("is not a number");
  const double x = v * mult;
  if (!std::isfinite(x) || std::fabs(x) >= 9.2e18) return bad("is out of range");
  return static_cast<int64_t>(std::trunc(x));
}

int64_t floor_div(int64_t a, int64_t b) {  // Python's //, b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

}  // namespace

Result<std::vector<BatchStep>> parse_step_batch_size_schedule(const std::string& text, int64_t seq_length) {
  if (seq_length <= 0) return Status::invalid(fmt::format("{}: needs --seq-length (thresholds are tokens)", kFlag));
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::vector<BatchStep> steps;
  size_t i = 0;
  while (i < spaced.size()) {
    if (std::isspace(static_cast<unsigned char>(spaced[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < spaced.size() && !std::isspace(static_cast<unsigned char>(spaced[j]))) ++j;
    const std::string entry = spaced.substr(i, j - i);
    i = j;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      return Status::invalid(fmt::format("{}: entry '{}' is not THRESHOLD:BATCH_SIZE (thresholds in tokens, e.g. "
                                         "\"0:256 250B:512\")",
                                         kFlag, entry));
    auto threshold = parse_number(entry, entry.substr(0, colon), "threshold");
    if (!threshold) return threshold.status();
    auto batch = parse_number(entry, entry.substr(colon + 1), "batch size");
    if (!batch) return batch.status();
    if (*batch <= 0)
      return Status::invalid(fmt::format("{}: entry '{}': the batch size must be positive, got {}", kFlag, entry, *batch));
    steps.push_back({floor_div(*threshold, seq_length), *batch});
  }
  if (steps.empty())
    return Status::invalid(fmt::format("{}: no entries (expected THRESHOLD:BATCH_SIZE pairs, e.g. \"0:256 250B:512\")", kFlag));
  std::stable_sort(steps.begin(), steps.end(), [](const BatchStep& a, const BatchStep& b) { return a.threshold < b.threshold; });
  if (steps[0].threshold != 0)
    return Status::invalid(fmt::format("{}: the first entry must have threshold 0 (the batch size to start with), got "
                                       "{} samples (fix: add an entry 0:BATCH_SIZE)",
                                       kFlag, steps[0].threshold));
  for (size_t k = 1; k < steps.size(); ++k)
    if (steps[k].threshold <= steps[k - 1].threshold)
      return Status::invalid(fmt::format("{}: thresholds must be strictly increasing in samples (tokens / --seq-length "
                                         "{}, rounded down): {} comes after {}",
                                         kFlag, seq_length, steps[k].threshold, steps[k - 1].threshold));
  return steps;
}

int64_t batch_at(const std::vector<BatchStep>& steps, int64_t consumed) {
  int64_t b = steps.front().batch;
  for (const BatchStep& s : steps) {
    if (consumed < s.threshold) break;
    b = s.batch;
  }
  return b;
}

ScheduledRun scheduled_run(const std::vector<BatchStep>& steps, int64_t train_samples) {
  ScheduledRun r;
  while (r.samples < train_samples) {
    // Whole iterations at the batch in force, up to the next threshold or the end.
    const int64_t b = batch_at(steps, r.samples);
    int64_t bound = train_samples;
    for (const BatchStep& s : steps)
      if (s.threshold > r.samples) {
        bound = std::min(bound, s.threshold);
        break;
      }
    const int64_t n = (bound - r.samples + b - 1) / b;
    r.iterations += n;
    r.samples += n * b;
  }
  return r;
}

std::vector<BatchStep> steps_in_force(const std::vector<BatchStep>& steps, int64_t from, int64_t to) {
  std::vector<BatchStep> used{{from, batch_at(steps, from)}};
  __int128 consumed = from;
  while (consumed < to) {
    // Whole iterations at the batch in force, up to the next threshold.
    const int64_t b = batch_at(steps, static_cast<int64_t>(consumed));
    const BatchStep* next = nullptr;
    for (const BatchStep& s : steps)
      if (s.threshold > consumed) {
        next = &s;
        break;
      }
    if (!next || next->threshold >= to) break;  // this batch to the end
    consumed += (next->threshold - consumed + b - 1) / b * b;
    if (consumed >= to) break;
    const int64_t nb = batch_at(steps, static_cast<int64_t>(consumed));
    if (nb != used.back().batch) used.push_back({static_cast<int64_t>(consumed), nb});
  }
  return used;
}

Result<std::string> rampup_as_step_schedule(int64_t start, int64_t increment, int64_t samples, int64_t global_batch,
                                            int64_t seq_length) {
  const char* flag = "--rampup-batch-size";
  if (start <= 0) return Status::invalid(fmt::format("{}: the start batch size must be positive, got {}", flag, start));
  if (increment <= 0) return Status::invalid(fmt::format("{}: the increment must be positive, got {}", flag, increment));
  if (samples <= 0)
    return Status::invalid(fmt::format("{}: the ramp-up samples must be positive, got {} (Megatron's ramp divides by "
                                       "them)",
                                       flag, samples));
  const int64_t diff = global_batch - start;
  if (diff < 0)
    return Status::invalid(fmt::format("{}: the start batch size {} is above --global-batch-size {}", flag, start,
                                       global_batch));
  if (diff == 0 || diff % increment != 0)
    return Status::invalid(fmt::format("{}: --global-batch-size {} - start {} = {} must be a positive multiple of the "
                                       "increment {}",
                                       flag, global_batch, start, diff, increment));
  const int64_t n = diff / increment;
  // Written out only while it stays a readable line (and in range in tokens).
  if (n > 64 || samples >= INT64_MAX / std::max<int64_t>(seq_length, 1) - 1)
    return Status::invalid(fmt::format("{}: the ramp has {} steps over {} samples; write the ones wanted as "
                                       "--step-batch-size-schedule THRESHOLD:BATCH pairs (thresholds in tokens)",
                                       flag, n, samples));
  const double per = static_cast<double>(samples) / static_cast<double>(n);  // samples per increment
  // Step k starts at the first consumed count c with int(c / per) >= k (as
  // the ramp computed it), or at samples + 1 where rounding leaves the last
  // step short (past `samples` the ramp gave the full batch).
  // Fewer samples than increments make several steps start together: the
  // last of them wins.
  std::vector<BatchStep> steps{{0, start}};
  for (int64_t k = 1; k <= n; ++k) {
    auto reaches = [&](int64_t c) { return static_cast<int64_t>(static_cast<double>(c) / per) >= k; };
    int64_t c = static_cast<int64_t>(std::ceil(static_cast<double>(k) * per));
    while (c > 0 && reaches(c - 1)) --c;
    while (c <= samples && !reaches(c)) ++c;
    c = std::min(c, samples + 1);
    if (c == steps.back().threshold) steps.back().batch = start + k * increment;
    else steps.push_back({c, start + k * increment});
  }
  std::string out;
  for (const BatchStep& s : steps) out += fmt::format("{}{}:{}", out.empty() ? "" : " ", s.threshold * seq_length, s.batch);
  return out;
}

}  // namespace mt::plan
