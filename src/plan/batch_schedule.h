#pragma once
// Megatron's step batch-size schedule (--step-batch-size-schedule,
// megatron/core/num_microbatches_calculator.py, StepBatchsizeNumMicroBatchesCalculator):
// "THRESHOLD:BATCH ..." pairs, the global batch growing in steps as training
// consumes samples. Megatron's trainer hands the calculator the sequence
// length, so thresholds are tokens (suffixes K, M, B, T: 1e3 .. 1e12),
// converted to samples by floor division; the batch size in force is the one
// of the last threshold at or below the samples consumed so far.
//
// And what the deprecated --rampup-batch-size START INCREMENT SAMPLES meant
// (Megatron ignores it now): the same ramp as a step schedule, for the note
// that tells a user what to write instead.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mt::plan {

struct BatchStep {
  int64_t threshold = 0;  // samples consumed from which `batch` applies
  int64_t batch = 0;      // global batch size (sequences)
};

// Parses the flag's text for a run of `seq_length` tokens per sample: entries
// split at spaces and commas, sorted by threshold (stable); the first must
// be 0 and the thresholds (in samples) strictly increasing, every batch size
// positive (Megatron's _validate_schedule). Errors name the flag and entry.
Result<std::vector<BatchStep>> parse_step_batch_size_schedule(const std::string& text, int64_t seq_length);

// The batch size in force after `consumed` samples. REQUIRES: steps from the
// parser (non-empty, first threshold 0).
int64_t batch_at(const std::vector<BatchStep>& steps, int64_t consumed);

// Iterations a sample-based run of `train_samples` takes under the schedule
// (Megatron's update_train_iters: steps while consumed < train_samples, so
// the last may pass it), and the samples those iterations consume.
struct ScheduledRun {
  int64_t iterations = 0, samples = 0;
};
ScheduledRun scheduled_run(const std::vector<BatchStep>& steps, int64_t train_samples);

// The batches a run uses between `from` samples consumed (0, or a resumed
// run's count) and `to` (its --train-samples), in order of use: each with
// the samples consumed when it first applies. A step whose threshold the
// run jumps over (a batch crossing two thresholds) is never in force.
// Megatron checks each batch as the run reaches it; so does the planner,
// on this list.
std::vector<BatchStep> steps_in_force(const std::vector<BatchStep>& steps, int64_t from, int64_t to);

// The step schedule equal to the classic ramp of --rampup-batch-size (start,
// increment, samples) up to `global_batch` (Megatron's former
// RampupBatchsizeNumMicroBatchesCalculator: start + floor(consumed /
// (samples / increments)) x increment while consumed <= samples), written in
// tokens for `seq_length`. Errors as that calculator's checks.
Result<std::string> rampup_as_step_schedule(int64_t start, int64_t increment, int64_t samples, int64_t global_batch,
                                            int64_t seq_length);

}  // namespace mt::plan
