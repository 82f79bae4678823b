#pragma once
// The training loop of `megatron train` on one rank: gradient accumulation
// over micro-batches, AdamW (or SGD) with Megatron's LR/WD schedules and clipping,
// evaluation, Megatron's log line and JSON metrics, checkpoints that resume
// bit-exactly, and the exit conditions (--exit-interval,
// --exit-duration-in-mins, SIGTERM with --exit-signal-handler).
//
// Order of one iteration (as Megatron's train_step):
//   zero grads; for each micro-batch m: forward (dropout keyed by the global
//   micro-batch index), backward with loss scale 1/M; NaN check; clip; optimizer step
//   with lr/wd read before the scheduler advances; scheduler.step(GBS).
// Everything that decides the next iteration (parameters, optimizer state and
// step, scheduler counter, consumed samples) is in the checkpoint, and the
// dropout masks and data order are functions of (seed, iteration), so a
// resumed run repeats the uninterrupted one bit for bit.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/train_config.h"

namespace mt::train {

struct TrainResult {
  int64_t iteration = 0;          // the last completed iteration
  double last_loss = 0;           // the last iteration's loss
  std::optional<double> valid_loss;  // the last validation loss
  std::string exit_reason;        // "done", "exit-interval", "signal", "duration"
};

// Runs training as configured. `argv` is what the user typed (stored in
// checkpoints). Log lines go to `out`.
Result<TrainResult> run_training(const TrainConfig& cfg, const std::vector<std::string>& argv, std::FILE* out);

}  // namespace mt::train
