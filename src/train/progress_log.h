#pragma once
// Megatron's --log-progress: a progress.txt in the --save directory, one
// tab-separated line per event, as Megatron writes it:
//   2026-12-05 03:10:00<TAB>Job ID: <SLURM_JOB_ID><TAB># GPUs: <world><TAB>Starting job
//   ...<TAB>Saved checkpoint<TAB>Iteration: 20<TAB>Job throughput: 1.2 TFLOP/s/GPU<TAB>
//       Cumulative throughput: 1.1 TFLOP/s/GPU<TAB>Floating-point operations: 3.45e+12<TAB>Tokens (in billions): 0.01
// "Starting job" when training starts; "Saved checkpoint" after each save,
// with the throughput of this job and the cumulative one since the first
// job of the same world size in the file (Megatron's
// get_start_time_from_progress_log), the FLOPs so far and the tokens consumed.
// Rank 0 writes; appends, like Megatron's file opened "a+".

#include <cstdint>
#include <ctime>
#include <string>

#include "core/status.h"

namespace mt::train {

class ProgressLog {
 public:
  ProgressLog() = default;  // disabled
  ProgressLog(const std::string& save_dir, int64_t world_size);
  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // Appends "<local time>\tJob ID: <SLURM_JOB_ID>\t# GPUs: <world>\t<what>".
  Status append(const std::string& what) const;

  struct Start {
    std::time_t time = 0;  // when the first job of this world size started
    double flops = 0;      // FLOPs of the last checkpoint saved before it
  };
  // Megatron's get_start_time_from_progress_log over the file as it is
  // now: the earliest "Starting job" since the world size last changed.
  // Lines that do not have Megatron's layout are skipped.
  Result<Start> start_of_world_size() const;

  // The line after a save: job_flops_start is this job's FLOPs when it
  // started, job_seconds the time since.
  Status saved_checkpoint(int64_t iteration, double flops_so_far, double job_flops_start, double job_seconds,
                          int64_t tokens_so_far) const;

 private:
  std::string path_;
  int64_t world_ = 1;
};

}  // namespace mt::train
