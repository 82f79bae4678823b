#pragma once
// TrainConfig: every flag `megatron train` takes, with Megatron-LM's names and
// defaults (../shared/spec/megatron-reference.md §4, §6, §9): the job layout
// and model (plan/job.h), the data and tokenizer, the optimizer and its
// schedules, evaluation, logging, checkpointing and exit conditions.
// `--config FILE` (YAML) holds the same keys; flags on the command line win.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/flags.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "optim/grad_scaler.h"
#include "plan/job.h"

namespace mt::train {

struct TrainConfig {
  plan::JobConfig job;
  data::TokenizerConfig tokenizer;
  data::DataConfig data;
  bool eod_mask_loss = false;  // --reset-position-ids / --reset-attention-mask: job.batch
  std::string dataloader_type = "single";  // --dataloader-type single | cyclic (data/loader.h)
  bool data_sharding = true;               // --no-data-sharding turns it off (cyclic)

  // Length of training.
  std::optional<int64_t> train_iters, train_samples;
  // Learning rate (spec §6).
  std::optional<double> lr;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<int64_t> lr_decay_iters, lr_decay_samples;
  int64_t lr_warmup_iters = 0, lr_warmup_samples = 0;
  std::optional<double> lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";
  std::optional<int64_t> lr_wsd_decay_iters, lr_wsd_decay_samples;
  bool use_checkpoint_opt_param_scheduler = false, override_opt_param_scheduler = false;
  // Weight decay and Adam.
  double weight_decay = 0.01;
  std::optional<double> start_weight_decay, end_weight_decay;
  std::optional<double> decoupled_lr, decoupled_min_lr;  // --decoupled-lr, --decoupled-min-lr
  std::string weight_decay_incr_style = "constant";
  double clip_grad = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  bool apply_wd_to_qk_layernorm = false;  // --apply-wd-to-qk-layernorm
  bool calculate_per_token_loss = false;  // --calculate-per-token-loss
  int64_t seed = 1234;
  // Evaluation and logging.
  std::optional<int64_t> eval_interval;  // none: no evaluation during training (Megatron-Core >= 0.16)
  int64_t eval_iters = 100;
  int64_t log_interval = 100;
  std::string metrics_file;  // default: <save>/metrics.jsonl when --save is given
  bool no_progress = false;
  bool progress = false;  // --progress: draw the bar even when stderr is not a terminal
  // Checkpoints.
  std::string save, load;
  std::optional<int64_t> save_interval;
  std::optional<int64_t> save_retain_interval;  // --save-retain-interval
  bool verify_integrity = false;                 // --verify-integrity
  // --check-weight-hash-across-dp-replicas-interval: every N iterations the
  // parameters' hashes are compared over the data-parallel replicas.
  std::optional<int64_t> check_weight_hash_interval;
  bool no_save_optim = false, no_save_rng = false, no_load_optim = false, no_load_rng = false, finetune = false;
  // Exits.
  std::optional<int64_t> exit_interval;
  std::optional<double> exit_duration_in_mins;
  bool exit_signal_handler = false;
  // On by default, as in Megatron (--no-check-for-nan-in-loss-and-grad);
  // check_for_nan_asked: older Megatron's --check-for-nan-in-loss-and-grad.
  bool check_for_nan_in_loss_and_grad = true, check_for_nan_asked = false;
  // Loss scaling (--fp16's dynamic scaler, or --loss-scale; optim/grad_scaler.h).
  optim::LossScaleConfig loss_scale;
  bool log_params_norm = false;             // the fp32 parameters' L2 norm in the log line and metrics
  bool log_num_zeros_in_grad = false;       // the number of zero gradient elements, likewise
  // --moe-per-layer-logging: each MoE layer's router losses (mean over the
  // iteration's micro-batches and DP) in --metrics-file and TensorBoard
  // (moe/{name}_layer_{i}, Megatron's tags), beside their mean over layers.
  bool moe_per_layer_logging = false;
  // --profile: the per-op time table (core/op_profile.h) of the steps after
  // --profile-step-start completed iterations up to --profile-step-end, on
  // the ranks of --profile-ranks (none given: every rank), and on CUDA those
  // steps bracketed by cudaProfilerStart/Stop (Megatron's nsys capture range).
  bool log_progress = false;  // --log-progress: {save}/progress.txt (train/progress_log.h)
  bool profile = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<std::string> profile_ranks;
  // TensorBoard scalars (Megatron's names and steps; train/tensorboard.h).
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_timers_to_tensorboard = false, log_validation_ppl_to_tensorboard = false,
       log_world_size_to_tensorboard = false, log_loss_scale_to_tensorboard = true;
  bool exit_on_missing_checkpoint = false;  // --load without a checkpoint is an error, not a fresh start
  // --use-checkpoint-args: the model flags come from the --load checkpoint's
  // stored command line (Megatron's load_args_from_checkpoint list), the
  // tokenizer's too unless --no-use-tokenizer-model-from-checkpoint-args,
  // and the parallel sizes with --use-mp-args-from-checkpoint-args.
  bool use_checkpoint_args = false;
  bool use_tokenizer_model_from_checkpoint_args = true;
  bool use_mp_args_from_checkpoint_args = false;
  // Set by parse_train_args when --use-checkpoint-args merged a checkpoint's
  // flags or a --config file was expanded: the command line as merged,
  // without --config (what a checkpoint of this run stores); and one line
  // per flag taken from the checkpoint.
  std::vector<std::string> merged_argv, checkpoint_arg_notes;
  // Runtime.
  std::optional<int64_t> threads;  // compute threads (default: all cores; 1 per rank under MPI)
  // --device: "auto" (CUDA when a GPU is usable, else the CPU), "cpu" or "cuda".
  std::string device = "auto";

  std::string config_file;  // --config
};

// Registers every flag of `megatron train` on `flags`, bound to `cfg`.
// `with_device`: false for `megatron plan`, whose --device names a device
// profile (h100, ..., cpu) rather than a backend.
void register_train_flags(FlagSet& flags, TrainConfig& cfg, bool with_device = true);

// Parses argv (after the subcommand). A --config YAML file is read first and
// the command line applied on top. On error the Status names the flag or file.
Status parse_train_args(const std::vector<std::string>& args, TrainConfig* cfg, FlagSet* flags, bool* help);

// --data-args-path / --per-split-data-args-path: reads the file into
// data_path / train,valid,test_data_path (as Megatron's
// get_blend_and_blend_per_split). Errors name the file and what was expected.
Status resolve_data_args_files(data::DataConfig* data);

// Turns a YAML mapping of flag names (dashes or underscores) into argv
// tokens: `key: true` is --key, `key: false` is --no-key where that flag
// exists (Megatron's store_false switches, e.g.
// check_for_nan_in_loss_and_grad: false), else nothing. The file may be a
// FIFO (--config <(...)); a directory is refused.
Result<std::vector<std::string>> yaml_to_args(const std::string& path);
// argv with every --config YAML file's flags put first, so that the command
// line wins (train and plan).
Result<std::vector<std::string>> expand_config_files(const std::vector<std::string>& argv);

// Training rules beyond the planner's (iteration vs sample mode, LR bounds,
// warm-up spec, saving, data source...): every violation, at once.
std::vector<std::string> validate_train(const TrainConfig& cfg);

// The arguments as JSON (stored in checkpoints; generate rebuilds the model from them).
nlohmann::json args_to_json(const TrainConfig& cfg, const std::vector<std::string>& argv);

}  // namespace mt::train
