#pragma once
// The planner: given a JobConfig (the same flags `megatron train` takes) and a
// device profile, check the configuration against Megatron's rules, then
// derive sizes, the rank grid, memory per rank, the pipeline schedule and its
// bubble, FLOPs and throughput. Pure computation: no MPI, no files (except
// --vocab-file), no device. Renderers (render.h) turn a PlanReport into text,
// JSON or a self-contained HTML page.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "parallel/rank_grid.h"
#include "parallel/schedule.h"
#include "plan/batch_schedule.h"
#include "plan/job.h"
#include "plan/memory.h"

namespace mt::plan {

struct DeviceProfile {
  std::string name;
  double peak_tflops_16bit = 0;  // dense bf16/fp16
  double peak_tflops_32bit = 0;  // fp32 (TF32 tensor cores on GPUs)
  double memory_bytes = 0;
  double reserve_bytes = 0;      // runtime context, library workspaces (estimate)
  std::string source;            // where the figures come from
  // The dense bf16 GEMM rate measured on such a device (the MFU a step made
  // only of large GEMMs reaches), 0 where none was measured; and its source.
  double gemm_ceiling_tflops_16bit = 0;
  std::string ceiling_source;
};
// h100, h200, a100, cpu. Returns nullptr for an unknown name.
const DeviceProfile* find_device_profile(const std::string& name);
std::vector<std::string> device_profile_names();

// Planner-only inputs (flags that `megatron train` does not take).
struct PlanOptions {
  std::string device = "h100";
  std::optional<double> peak_tflops;       // override the profile's peak
  std::optional<double> device_memory_gb;  // override the profile's memory (GB = 1e9 bytes)
  std::optional<double> step_time;         // measured or assumed seconds per iteration
  double assumed_efficiency = 0.5;         // share of peak while computing (prediction only)
  std::optional<double> num_parameters;    // quick estimate without an architecture
  // The samples consumed when the run starts (a resumed run's) and when it
  // ends (--train-samples): --step-batch-size-schedule's steps are checked
  // (and the model sized) for the batches in force between them, as Megatron
  // checks each batch when the run reaches it. Default: every step.
  int64_t batch_from_samples = 0;
  int64_t batch_to_samples = INT64_MAX;
};

void register_plan_option_flags(FlagSet& flags, PlanOptions& opts);

struct Violation {
  std::string rule;                // short id, e.g. "world-divisible"
  std::vector<std::string> flags;  // the flags involved, with leading --
  std::string message;             // what is wrong, with the numbers
  std::string suggestion;          // a legal nearby value, or what to change
};

// Layers of one model chunk on one pipeline rank.
struct ChunkLayers {
  int64_t pp_rank = 0, chunk = 0;
  int64_t first_layer = 0;  // 0-based global index of its first layer
  int64_t num_layers = 0;
};

struct Throughput {
  bool measured = false;          // from --step-time, else predicted
  double step_time_s = 0;
  double tokens_per_s = 0;
  double tflops_per_device = 0;   // Megatron's reported figure
  double mfu = 0;                 // against the profile's peak for the dtype
  double peak_tflops = 0;
  double gemm_ceiling_tflops = 0;  // the profile's measured bf16 GEMM rate (16-bit runs), 0: none
  double of_gemm_ceiling = 0;      // tflops_per_device / gemm_ceiling_tflops
};

struct FitOption {
  std::string options;   // e.g. "--use-distributed-optimizer --sequence-parallel"
  double peak_bytes = 0; // most loaded rank
  bool fits = false;
};

// Bytes one rank communicates per training iteration in this build's
// trainer, in comm::CommStats' payload convention (all-reduce: the buffer;
// all-gather: the output; reduce-scatter: the input). Scalars (loss, norm,
// NaN flags: a few dozen bytes) are left out.
struct CommReport {
  bool available = false;  // with the trainer buffers (same limits)
  double tp_bytes = 0;     // activations over the TP group: M micro-batches + replicated grads (SP)
  double dp_bytes = 0;     // gradients (all-reduce), or reduce-scatter + parameter all-gather (dist-opt)
  double pp_bytes = 0;     // activations and their gradients to/from neighbours, tied-embedding all-reduce
  double cp_bytes = 0;     // core attention's Q/K/V all-gathers and gradient reduce-scatters over the CP group
  double ep_bytes = 0;     // the MoE layers' token all-to-alls over the EP group (balanced routing; see GPTCommPlan)
};

struct PlanReport {
  JobConfig job;  // after resolution (world size, vocab)
  PlanOptions options;
  WorldSource world_source = WorldSource::kFlag;
  DeviceProfile device;
  bool quick = false;  // --num-parameters without an architecture

  std::vector<Violation> errors;
  std::vector<std::string> warnings;
  bool valid() const { return errors.empty(); }
  // Whether gradients are reduced over more than one rank: DP x CP > 1, or
  // (--num-experts) an expert data-parallel group > 1 (whole experts under
  // TP, ETP 1, have one even at DP x CP = 1). The distributed optimizer
  // shards over those groups only then.
  bool reduces_gradients() const { return dp * job.parallel.cp > 1 || (job.model.is_moe() && edp > 1); }

  // Everything below is filled only when valid().
  int64_t world = 1, dp = 1, edp = 1, etp = 1, vpp = 1, group_size = 1;
  // num_microbatches and global_batch: the largest batch the run trains on
  // (the last step of --step-batch-size-schedule; rounded down under
  // --decrease-batch-size-if-needed), what memory and throughput are planned for.
  int64_t num_microbatches = 1, global_batch = 1, padded_vocab = 0;
  // --step-batch-size-schedule's steps (plan/batch_schedule.h); empty: the
  // batch is global_batch throughout.
  std::vector<BatchStep> batch_steps;
  // Of those, the batches the run uses (PlanOptions::batch_from_samples to
  // batch_to_samples), each from the samples consumed when it first applies.
  std::vector<BatchStep> batch_steps_used;
  // The global batch Megatron's args hold: --global-batch-size as given, or
  // micro-batch x DP (also under a step schedule). Iteration-based LR
  // schedules and sample-based iteration counts use it.
  int64_t requested_global_batch = 1;
  int64_t eval_global_batch = 1, eval_microbatches = 1;  // --eval-global-batch-size
  // Lines `megatron train` lists as accepted with no effect (--rampup-batch-size).
  std::vector<std::string> no_effect;
  int64_t num_nodes = 1;
  int64_t ffn = 0, head_dim = 0, query_groups = 0;
  std::vector<ChunkLayers> chunks;  // [pp * vpp], pp-major
  model::ModelParams params;        // real tensors, whole model
  double total_params = 0;          // real total (or --num-parameters)
  model::MegatronParamCount megatron_params;
  std::optional<parallel::RankGrid> grid;

  MemoryReport memory;
  CommReport comm;                      // pipeline rank 0's (what its log line compares)
  std::vector<CommReport> comm_stages;  // every pipeline rank's
  std::vector<FitOption> fit_options;  // what fits the device, cheapest first

  parallel::ScheduleKind schedule_kind = parallel::ScheduleKind::kNoPipelining;
  double bubble_formula = 0;
  double bubble_simulated = 0;
  std::vector<int64_t> in_flight;  // per pp rank, chunk-micro-batches (from the schedule)
  parallel::Timeline timeline;     // the drawn schedule
  int64_t timeline_microbatches = 0;  // M of the drawn schedule (may be < M for huge M)

  double flops_per_iteration = 0;  // Megatron's formula, one global batch fwd+bwd
  double tokens_per_iteration = 0;
  Throughput throughput;
};

// The options of the model this build's trainer builds on pipeline rank
// `pp_rank` for the planned job: its chunks, first/last-stage roles, one
// activation slot per micro-batch its schedule keeps in flight, TP and SP,
// DP padding of the flat buffers, recomputation. TP rank 0 and no
// communicator: the trainer sets tp_rank and tp_comm. REQUIRES: r.valid().
Result<model::GPTOptions> trainer_model_options(const PlanReport& r, int64_t pp_rank);

// Runs the planner. Never fails: problems land in report.errors.
PlanReport make_plan(JobConfig job, const PlanOptions& options);

// Megatron's FLOPs per iteration (§5, HEAD formula).
double megatron_flops_per_iteration(const model::ModelConfig& m, int64_t padded_vocab,
                                    int64_t global_batch);

}  // namespace mt::plan
