#pragma once
// JobConfig: everything about a training job's layout that `megatron plan`
// and `megatron train` share, with Megatron-LM's flag names and defaults
// (../shared/spec/megatron-reference.md §4, §9). register_job_flags() binds
// them to a FlagSet; both subcommands call it, so a launch line plans and
// trains with the same flags.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/flags.h"
#include "model/config.h"

namespace mt::plan {

struct ParallelConfig {
  std::optional<int64_t> world_size;  // --world-size; else from the MPI launcher's environment
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  // --cp-comm-type: Megatron's context-parallel attention exchange, one type
  // or one per layer (p2p, a2a, allgather, a2a+p2p). The same attention
  // whichever it is; this program all-gathers (allgather).
  std::vector<std::string> cp_comm_type;
  // --hierarchical-context-parallel-sizes: Megatron's split of the CP group
  // for a2a+p2p (product = CP); accepted with it, the same attention.
  std::vector<std::string> hierarchical_cp_sizes;
  std::optional<int64_t> etp;  // --expert-tensor-parallel-size (default: tp)
  std::optional<int64_t> dp;   // --data-parallel-size: optional; derived when absent
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage;
  std::optional<int64_t> num_virtual_stages_per_pipeline_rank;
  std::optional<int64_t> microbatch_group_size_per_vp_stage;  // default: pp
  std::optional<int64_t> decoder_first_pipeline_num_layers;
  std::optional<int64_t> decoder_last_pipeline_num_layers;
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  bool use_tp_pp_dp_mapping = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  std::optional<int64_t> ddp_bucket_size;  // --ddp-bucket-size (elements); default max(4e7, 1e6 x DP)
  bool overlap_p2p_communication = true;  // --no-overlap-p2p-communication
  int64_t gpus_per_node = 8;
};

struct BatchConfig {
  int64_t micro_batch_size = 0;               // required
  std::optional<int64_t> global_batch_size;   // default micro * DP
  // --step-batch-size-schedule "THRESHOLD:BATCH ..." (plan/batch_schedule.h):
  // the global batch grows with the tokens consumed; excludes
  // --global-batch-size, as in Megatron.
  std::optional<std::string> step_batch_size_schedule;
  // --rampup-batch-size START INCREMENT SAMPLES: deprecated and ignored by
  // Megatron; accepted with a note giving the equivalent step schedule.
  std::vector<std::string> rampup_batch_size;
  // --decrease-batch-size-if-needed: train on the global batch rounded down
  // to a multiple of micro-batch x DP (Megatron's running batch size).
  bool decrease_batch_size_if_needed = false;
  // --eval-global-batch-size (default: the global batch Megatron's args hold:
  // --global-batch-size, or micro x DP under a step schedule) and
  // --eval-micro-batch-size (here only the training micro-batch size).
  std::optional<int64_t> eval_global_batch_size, eval_micro_batch_size;
  // --reset-position-ids / --reset-attention-mask: each micro-batch carries
  // position and document ids (restarting after every EOD token), which the
  // model follows (model::GPTOptions); the planner counts their buffers.
  bool reset_position_ids = false, reset_attention_mask = false;
};

struct PrecisionConfig {
  bool bf16 = false, fp16 = false;
  bool fp32_residual_connection = false;  // under --bf16/--fp16: the residual stream in fp32 (else 16-bit, as Megatron)
  const char* name() const { return bf16 ? "bf16" : fp16 ? "fp16" : "fp32"; }
  bool half() const { return bf16 || fp16; }  // 16-bit compute (GEMM inputs, activations)
};

// --optimizer and --sgd-momentum (registered with the trainer's flags), for
// the planner's optimizer-state bytes.
struct OptimizerChoice {
  std::string name = "adam";  // adam | sgd
  double sgd_momentum = 0.9;
  // State tensors per parameter: Adam's exp_avg and exp_avg_sq, SGD's
  // momentum buffer (none with --sgd-momentum 0, as torch keeps none).
  int state_tensors() const { return name == "sgd" ? (sgd_momentum != 0 ? 1 : 0) : 2; }
};

struct RecomputeConfig {
  std::optional<std::string> granularity;  // full | selective
  std::optional<std::string> method;       // uniform | block
  std::optional<int64_t> num_layers;
  bool recompute_activations = false;      // legacy alias of --recompute-granularity selective
  bool distribute_saved_activations = false;
  // --recompute-modules (selective only; empty: Megatron's default, core_attn).
  std::vector<std::string> modules;
  bool selective() const { return recompute_activations || granularity == "selective"; }
  // Whether selective recomputation covers `module` ("core_attn", "moe_act").
  bool recomputes(const std::string& module) const {
    if (!selective()) return false;
    if (modules.empty()) return module == "core_attn";
    for (const auto& m : modules)
      if (m == module) return true;
    return false;
  }
  bool full() const { return granularity == "full"; }
};

// Megatron flags kept so that a Megatron launch script runs unchanged where
// it can (register_megatron_compat_flags): the given ones that pick an
// implementation, a kernel fusion or a logging detail of a computation that
// is the same here ("--flag: why", accepted; `megatron train` lists them
// once), and the given ones asking for something this program does not do
// ((flag, why and what to do instead): `megatron train` refuses them with
// the other configuration problems, `megatron plan` warns).
struct MegatronCompat {
  std::vector<std::string> no_effect;
  std::vector<std::pair<std::string, std::string>> refused;
  // The no-effect flags given, by name without --, with their values ("" for
  // a switch): Megatron's checks on them still apply (validate.cc, trainer).
  std::map<std::string, std::string> given;
  bool has(const std::string& name) const { return given.count(name) != 0; }
  std::string value(const std::string& name) const {
    auto it = given.find(name);
    return it == given.end() ? std::string() : it->second;
  }
};

struct JobConfig {
  ParallelConfig parallel;
  model::ModelConfig model;
  BatchConfig batch;
  PrecisionConfig precision;
  RecomputeConfig recompute;
  OptimizerChoice optimizer;
  MegatronCompat compat;
};

// Binds every job flag to `job`.
void register_job_flags(FlagSet& flags, JobConfig& job);

// Binds the Megatron flags of MegatronCompat (and the deprecated aliases
// --use-rotary-position-embeddings, --no-position-embedding) in a last
// --help section.
void register_megatron_compat_flags(FlagSet& flags, JobConfig& job);

// Where the world size came from, for the report.
enum class WorldSource { kFlag, kLauncher, kDataParallelProduct, kDefaultOneReplica };
// Fills parallel.world_size: --world-size, else OMPI_COMM_WORLD_SIZE /
// PMI_SIZE / WORLD_SIZE from the launcher, else TP*PP*CP*DP when
// --data-parallel-size is given, else TP*PP*CP (one model replica).
WorldSource resolve_world_size(JobConfig& job);
const char* world_source_name(WorldSource s);

}  // namespace mt::plan
