#include "train/train_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "data/tokenizer_flags.h"

namespace mt::train {

void register_train_flags(FlagSet& f, TrainConfig& c, bool with_device) {
  plan::register_job_flags(f, c.job);
  // --vocab-size and --vocab-file are model flags here (plan/job.h); the
  // trainer hands them to the tokenizer.
  data::register_tokenizer_flags(f, c.tokenizer, /*with_model_flags=*/false);

  f.section("data");
  f.add_list("data-path", &c.data.data_path, "dataset prefixes, optionally weighted: [w1] p1 [w2] p2 ...");
  f.add_list("train-data-path", &c.data.train_data_path, "training dataset prefixes (instead of --data-path + --split)");
  f.add_list("valid-data-path", &c.data.valid_data_path, "validation dataset prefixes");
  f.add_list("test-data-path", &c.data.test_data_path, "test dataset prefixes");
  f.add_string("data-args-path", &c.data.data_args_path,
               "a file whose whitespace-separated tokens are --data-path's (for long blends)");
  f.add_string("per-split-data-args-path", &c.data.per_split_data_args_path,
               "a JSON file {\"train\": ..., \"valid\": ..., \"test\": ...}, each a list or a string of --train-data-path style tokens");
  f.add_switch("mock-data", &c.data.mock,
               "Megatron's synthetic documents (100000 of 1..4095 tokens: 1, 2, 3, ..., EOD) instead of a dataset, split 1,1,1");
  f.add_string("split", &c.data.split, "train,valid,test proportions of each --data-path dataset");
  f.add_string("data-cache-path", &c.data.gpt.cache_dir, "where dataset indices are cached (default: <prefix>/cache/GPTDataset_indices)");
  f.add_double("mid-level-dataset-surplus", &c.data.mid_level_dataset_surplus, "extra samples built per blended dataset", 0, 10);
  f.add_switch("eod-mask-loss", &c.eod_mask_loss, "no loss where the input token is the end-of-document token");
  f.add_choice("dataloader-type",
               "the sample order: single (Megatron's default: in order, the dataset must last) or cyclic (epochs "
               "without end, each data-parallel rank visiting its own bucket in torch.randperm order seeded by the "
               "epoch)",
               {"single", "cyclic", "external"}, "single", [&c](const std::string& v) { c.dataloader_type = v; });
  f.add_switch("no-data-sharding", &c.data_sharding,
               "cyclic loader: one permutation of the whole dataset dealt to the ranks instead of one bucket each "
               "(refused: Megatron's can give ranks different numbers of micro-batches per epoch)",
               false);

  f.section("training");
  f.add_int("train-iters", &c.train_iters, "iterations to train (iteration-based schedule)", 1, INT64_MAX / 4);
  f.add_int("train-samples", &c.train_samples, "samples to train (sample-based schedule)", 1, INT64_MAX / 4);
  f.add_int("seed", &c.seed, "random seed (initialisation, dropout, data order)", 0, UINT32_MAX);
  f.add_string("optimizer", &c.job.optimizer.name,
               "adam (AdamW, decoupled weight decay) or sgd (momentum SGD, weight decay added to the gradient)",
               {"adam", "sgd"});
  f.add_double("sgd-momentum", &c.job.optimizer.sgd_momentum, "momentum factor of --optimizer sgd (0: no momentum buffer)",
               0, 1e3);
  f.add_double("lr", &c.lr, "peak learning rate", 0, 1e3);
  f.add_double("min-lr", &c.min_lr, "minimum learning rate", 0, 1e3);
  f.add_double("decoupled-lr", &c.decoupled_lr,
               "peak learning rate of the word embedding and the output layer (the same schedule)", 0, 1e3);
  f.add_double("decoupled-min-lr", &c.decoupled_min_lr,
               "minimum learning rate of the word embedding and the output layer with --decoupled-lr (default --min-lr)",
               0, 1e3);
  f.add_string("lr-decay-style", &c.lr_decay_style, "learning-rate decay", {"constant", "linear", "cosine", "inverse-square-root", "WSD"});
  f.add_int("lr-decay-iters", &c.lr_decay_iters, "iterations to decay over (default: --train-iters)", 1, INT64_MAX / 4);
  f.add_int("lr-decay-samples", &c.lr_decay_samples, "samples to decay over (default: --train-samples)", 1, INT64_MAX / 4);
  f.add_int("lr-warmup-iters", &c.lr_warmup_iters, "linear warm-up iterations", 0, INT64_MAX / 4);
  f.add_int("lr-warmup-samples", &c.lr_warmup_samples, "linear warm-up samples", 0, INT64_MAX / 4);
  f.add_double("lr-warmup-fraction", &c.lr_warmup_fraction, "warm-up as a fraction of the decay steps", 0, 1);
  f.add_double("lr-warmup-init", &c.lr_warmup_init, "learning rate at the start of warm-up", 0, 1e3);
  f.add_string("lr-wsd-decay-style", &c.lr_wsd_decay_style, "WSD's decay phase", {"exponential", "linear", "cosine", "minus_sqrt"});
  f.add_int("lr-wsd-decay-iters", &c.lr_wsd_decay_iters, "iterations of WSD's decay phase", 1, INT64_MAX / 4);
  f.add_int("lr-wsd-decay-samples", &c.lr_wsd_decay_samples, "samples of WSD's decay phase", 1, INT64_MAX / 4);
  f.add_switch("use-checkpoint-opt-param-scheduler", &c.use_checkpoint_opt_param_scheduler, "take the scheduler settings from the checkpoint");
  f.add_switch("override-opt-param-scheduler", &c.override_opt_param_scheduler, "keep the command line's scheduler settings over the checkpoint's");
  // Megatron's original spellings, which its launch scripts and test configs still use.
  f.add_switch("use-checkpoint-opt_param-scheduler", &c.use_checkpoint_opt_param_scheduler,
               "Megatron's spelling of --use-checkpoint-opt-param-scheduler");
  f.add_switch("override-opt_param-scheduler", &c.override_opt_param_scheduler,
               "Megatron's spelling of --override-opt-param-scheduler");
  f.add_double("weight-decay", &c.weight_decay, "weight decay (decoupled with adam, added to the gradient with sgd)", 0, 1e3);
  f.add_double("start-weight-decay", &c.start_weight_decay, "weight decay at the start (with an increment style)", 0, 1e3);
  f.add_double("end-weight-decay", &c.end_weight_decay, "weight decay at the end (with an increment style)", 0, 1e3);
  f.add_string("weight-decay-incr-style", &c.weight_decay_incr_style, "weight-decay schedule", {"constant", "linear", "cosine"});
  f.add_double("clip-grad", &c.clip_grad, "clip the global gradient norm to this (0: off)", 0, 1e12);
  f.add_double("adam-beta1", &c.adam_beta1, "Adam beta1", 0, 1);
  f.add_double("adam-beta2", &c.adam_beta2, "Adam beta2", 0, 1);
  f.add_double("adam-eps", &c.adam_eps, "Adam epsilon", 0, 1);
  f.add_switch("calculate-per-token-loss", &c.calculate_per_token_loss,
               "the gradient of the global batch's loss summed over its counted tokens / their number (every "
               "token weighs the same), instead of the mean over micro-batches of each one's mean");
  f.add_switch("apply-wd-to-qk-layernorm", &c.apply_wd_to_qk_layernorm,
               "weight decay also on the --qk-layernorm norms' parameters (other norms and biases stay exempt)");
  f.add_seen("no-weight-decay-cond-type", true,
             "Megatron's deprecated spelling of --apply-wd-to-qk-layernorm (its one choice)", {"apply_wd_to_qk_layernorm"},
             [&c](const std::string&) { c.apply_wd_to_qk_layernorm = true; });
  f.add_switch("no-check-for-nan-in-loss-and-grad", &c.check_for_nan_in_loss_and_grad,
               "keep training when the loss or a gradient is NaN/inf (by default the run stops with the iteration, as "
               "Megatron's does; the check is off under --fp16's dynamic loss scaling, whose signal they are)",
               false);
  f.add_switch("check-for-nan-in-loss-and-grad", &c.check_for_nan_asked,
               "older Megatron's switch for what is now the default: stop on a NaN/inf loss or gradient");
  f.add_int("check-weight-hash-across-dp-replicas-interval", &c.check_weight_hash_interval,
            "every N iterations compare a hash of every parameter over the data-parallel replicas; the run stops, "
            "naming the parameters, when they differ", 1, INT64_MAX / 4);
  f.add_double("loss-scale", &c.loss_scale.loss_scale,
               "constant loss scale (with --fp16, --bf16 or --use-distributed-optimizer); unset: dynamic under --fp16",
               -1e308, 1e308);
  f.add_double("initial-loss-scale", &c.loss_scale.initial_loss_scale, "dynamic loss scaling's first scale (2^32)",
               -1e308, 1e308);
  f.add_double("min-loss-scale", &c.loss_scale.min_loss_scale, "dynamic loss scaling's lower bound", -1e308, 1e308);
  f.add_double("loss-scale-window", &c.loss_scale.loss_scale_window,
               "iterations without an inf/NaN gradient before dynamic loss scaling doubles the scale", -1e308, 1e308);
  f.add_int("hysteresis", &c.loss_scale.hysteresis,
            "inf/NaN iterations (since the scale last grew) before dynamic loss scaling halves the scale", -(1 << 30),
            1 << 30);

  f.section("evaluation and logging");
  f.add_int("eval-interval", &c.eval_interval, "iterations between validation runs (default: none)", 1, INT64_MAX / 4);
  f.add_int("eval-iters", &c.eval_iters, "iterations (global batches) per validation run", 0, INT64_MAX / 4);
  f.add_int("log-interval", &c.log_interval, "iterations between log lines", 1, INT64_MAX / 4);
  f.add_string("metrics-file", &c.metrics_file, "JSON-lines metrics file (default: <save>/metrics.jsonl)");
  f.add_switch("moe-per-layer-logging", &c.moe_per_layer_logging,
               "with --num-experts: each MoE layer's load-balancing and z-losses in --metrics-file "
               "(load_balancing_loss_layer_{i}, z_loss_layer_{i}) and TensorBoard (moe/..._layer_{i})");
  f.add_switch("log-progress", &c.log_progress,
               "append Megatron's progress.txt in the --save directory: job starts, and after each save the job's and "
               "the cumulative throughput, FLOPs and tokens so far");
  f.add_switch("profile", &c.profile,
               "time every op of the steps from --profile-step-start to --profile-step-end and print the table (on "
               "CUDA also cudaProfilerStart/Stop around them, for nsys --capture-range=cudaProfilerApi)");
  f.add_int("profile-step-start", &c.profile_step_start, "completed iterations before the profiled steps", 0,
            INT64_MAX / 4);
  f.add_int("profile-step-end", &c.profile_step_end, "iteration after which profiling stops", 0, INT64_MAX / 4);
  f.add_list("profile-ranks", &c.profile_ranks, "global ranks to profile (default: every rank)");
  f.add_switch("log-params-norm", &c.log_params_norm,
               "the L2 norm of the fp32 parameters after each step, in the log line and the metrics");
  f.add_switch("log-num-zeros-in-grad", &c.log_num_zeros_in_grad,
               "log the number of zero gradient elements (each element of the model once) per iteration");
  f.add_string("tensorboard-dir", &c.tensorboard_dir,
               "write TensorBoard scalars (Megatron's: learning-rate, batch-size, lm loss, loss-scale, grad-norm, "
               "params-norm, lm loss validation, each also 'vs samples') to an event file in this directory");
  f.add_int("tensorboard-log-interval", &c.tensorboard_log_interval, "iterations between TensorBoard scalars", 1,
            INT64_MAX / 4);
  f.add_switch("log-timers-to-tensorboard", &c.log_timers_to_tensorboard,
               "also iteration-time (s) and throughput (TFLOP/s per device), at each --log-interval");
  f.add_switch("log-validation-ppl-to-tensorboard", &c.log_validation_ppl_to_tensorboard,
               "also the validation perplexity (lm loss validation ppl)");
  f.add_switch("log-world-size-to-tensorboard", &c.log_world_size_to_tensorboard, "also world-size");
  f.add_switch("no-log-loss-scale-to-tensorboard", &c.log_loss_scale_to_tensorboard,
               "no loss-scale scalar (the grad scaler's scale; 1.0 without loss scaling)", false);
  f.add_switch("no-progress", &c.no_progress, "no progress bar even on a terminal");
  f.add_switch("progress", &c.progress, "a progress bar even when stderr is not a terminal (under mpirun, whose "
                                        "ranks write into pipes)");

  f.section("checkpointing");
  f.add_string("save", &c.save, "directory to save checkpoints to");
  f.add_string("load", &c.load, "directory to load a checkpoint from (its latest iteration)");
  f.add_int("save-interval", &c.save_interval, "iterations between checkpoints", 1, INT64_MAX / 4);
  f.add_int("save-retain-interval", &c.save_retain_interval,
            "keep only checkpoints at multiples of this (a multiple of --save-interval) and the latest: after each "
            "save the previous one (the one the --save tracker named, as in Megatron: even another run's) is deleted "
            "unless it is such a multiple or a symbolic link",
            1, INT64_MAX / 4);
  f.add_switch("verify-integrity", &c.verify_integrity,
               "record each checkpoint file's CRC-32 and size when saving (integrity.json), and check them when "
               "loading: a damaged file stops the run before training");
  f.add_switch("no-save-optim", &c.no_save_optim, "do not save optimizer state");
  f.add_switch("no-save-rng", &c.no_save_rng, "do not save random-number state");
  f.add_switch("no-load-optim", &c.no_load_optim, "do not load optimizer state");
  f.add_switch("no-load-rng", &c.no_load_rng, "do not load random-number state");
  f.add_switch("exit-on-missing-checkpoint", &c.exit_on_missing_checkpoint,
               "with --load: stop with an error when it holds no checkpoint, instead of training from scratch");
  f.add_switch("use-checkpoint-args", &c.use_checkpoint_args,
               "take the model flags from the --load checkpoint's stored arguments (Megatron's list: forced ones "
               "override the command line, the others fill in flags not given)");
  f.add_switch("no-use-tokenizer-model-from-checkpoint-args", &c.use_tokenizer_model_from_checkpoint_args,
               "with --use-checkpoint-args, keep the command line's --tokenizer-type/--tokenizer-model", false);
  f.add_switch("use-mp-args-from-checkpoint-args", &c.use_mp_args_from_checkpoint_args,
               "with --use-checkpoint-args, also take the tensor/pipeline/virtual-pipeline/expert parallel sizes");
  f.add_switch("finetune", &c.finetune, "load only the model: iteration, optimizer, scheduler and data position restart");

  f.section("exit");
  f.add_int("exit-interval", &c.exit_interval, "exit after the iteration divisible by this (after saving)", 1, INT64_MAX / 4);
  f.add_double("exit-duration-in-mins", &c.exit_duration_in_mins, "exit (after saving) once training ran this long", 0, 1e9);
  f.add_switch("exit-signal-handler", &c.exit_signal_handler, "on SIGTERM, save a checkpoint after the current iteration and exit 0");

  f.section("runtime");
  f.add_int("threads", &c.threads, "compute threads per rank (default: all cores; use 1 with many MPI ranks per machine)", 1, 1024);
  if (with_device) f.add_string("device", &c.device,
                                "compute backend: auto (CUDA when a GPU is usable, else cpu), cpu or cuda",
                                {"auto", "cpu", "cuda"});
  f.add_string("config", &c.config_file, "YAML file of flag: value pairs (command-line flags win)");
  plan::register_megatron_compat_flags(f, c.job);
}

namespace {
// Switches whose Megatron form is --no-<name> (store_false, dest <name>).
const std::set<std::string>& negated_switches() {
  static const std::set<std::string> names = [] {
    TrainConfig c;
    FlagSet f("megatron train");
    register_train_flags(f, c);
    std::set<std::string> out;
    for (const std::string& n : f.names())
      if (n.rfind("no-", 0) == 0) out.insert(n.substr(3));
    return out;
  }();
  return names;
}
}  // namespace

Result<std::vector<std::string>> yaml_to_args(const std::string& path) {
  if (path.empty()) return Status::invalid("--config needs the path of a YAML file");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::invalid(fmt::format("--config: '{}' is a directory; name a YAML file", path));
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status::not_found(fmt::format("--config: cannot open '{}'", path));
  } catch (const YAML::Exception& e) {
    return Status::invalid(fmt::format("--config: '{}' line {}: {}", path, e.mark.line + 1, e.msg));
  }
  if (!root.IsMap()) return Status::invalid(fmt::format("--config: '{}' must be a mapping of flag: value", path));
  std::vector<std::string> args;
  for (const auto& kv : root) {
    std::string key;
    try {
      key = kv.first.as<std::string>();
    } catch (const YAML::Exception&) {
      return Status::invalid(fmt::format("--config: '{}' line {}: keys must be flag names", path, kv.first.Mark().line + 1));
    }
    for (char& ch : key)
      if (ch == '_') ch = '-';
    if (key == "config") return Status::invalid(fmt::format("--config: '{}' cannot name another config file", path));
    const YAML::Node& v = kv.second;
    const std::string flag = "--" + key;
    if (v.IsNull()) {
      args.push_back(flag);
    } else if (v.IsScalar()) {
      const std::string s = v.Scalar();
      if (s == "true" || s == "True") args.push_back(flag);
      else if (s == "false" || s == "False") {  // a switch left off, or Megatron's --no-<key> for a store_false one
        if (negated_switches().count(key)) args.push_back("--no-" + key);
        continue;
      }
      else args.push_back(flag), args.push_back(s);
    } else if (v.IsSequence()) {
      args.push_back(flag);
      for (const auto& item : v) {
        if (!item.IsScalar()) return Status::invalid(fmt::format("--config: '{}': {} must be a list of values", path, key));
        args.push_back(item.Scalar());
      }
    } else {
      return Status::invalid(fmt::format("--config: '{}': {} must be a value or a list", path, key));
    }
  }
  return args;
}

Result<std::vector<std::string>> expand_config_files(const std::vector<std::string>& argv) {
  std::vector<std::string> all;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string path;
    if (argv[i] == "--config" && i + 1 < argv.size()) path = argv[i + 1];
    else if (argv[i].rfind("--config=", 0) == 0) path = argv[i].substr(9);
    else continue;
    auto extra = yaml_to_args(path);
    if (!extra) return extra.status();
    all.insert(all.end(), extra->begin(), extra->end());
  }
  for (const auto& a : argv) all.push_back(a);
  return all;
}

namespace {

// Megatron's load_args_from_checkpoint (megatron/training/checkpointing.py),
// in this program's flag names: (flag, forced). A forced flag is always the
// checkpoint's (given there or not); the others only when the command line
// does not give them.
struct CkptArg {
  const char* flag;
  bool forced;
};
constexpr CkptArg kModelArgs[] = {
    {"num-layers", false}, {"hidden-size", false}, {"ffn-hidden-size", false}, {"seq-length", false},
    {"num-attention-heads", false}, {"num-query-groups", true}, {"group-query-attention", true},
    {"kv-channels", false}, {"max-position-embeddings", false}, {"position-embedding-type", true},
    {"add-qkv-bias", true},
    {"use-rotary-position-embeddings", true}, {"no-position-embedding", true}, {"rotary-base", true},
    {"rotary-percent", true}, {"rotary-interleaved", true}, {"disable-bias-linear", true}, {"swiglu", true},
    {"squared-relu", true},
    {"untie-embeddings-and-output-weights", true}, {"apply-layernorm-1p", true}, {"normalization", true},
    {"attention-dropout", true}, {"hidden-dropout", true}, {"num-experts", true}, {"moe-ffn-hidden-size", true},
    {"moe-router-topk", true}, {"moe-router-pre-softmax", true}, {"moe-router-topk-scaling-factor", true},
    {"moe-shared-expert-intermediate-size", true}, {"moe-router-score-function", true},
    {"moe-router-enable-expert-bias", true}, {"moe-layer-freq", true}, {"mtp-num-layers", true}, {"mtp-use-repeated-layer", true},
    // Not in Megatron's list: without it a checkpoint's shared-expert gates
    // would be left out of the model.
    {"moe-shared-expert-gate", true},
    // Not in Megatron's list either (it leaves the MLA flags to the command
    // line): without them an MLA checkpoint's tensors have no place in the
    // model. Multi-latent attention itself is forced, its sizes and RoPE
    // settings filled in where the command line has none.
    {"multi-latent-attention", true}, {"q-lora-rank", false}, {"kv-lora-rank", false}, {"qk-head-dim", false},
    {"qk-pos-emb-head-dim", false}, {"v-head-dim", false}, {"rope-type", false}, {"rotary-scaling-factor", false},
    {"mscale", false}, {"mscale-all-dim", false},
    // Forced whatever --use-tokenizer-model-from-checkpoint-args says, as Megatron's _set_arg('tiktoken_pattern').
    {"tiktoken-pattern", true},
    // Not in Megatron's list (its padded vocabulary comes from the tokenizer):
    // a NullTokenizer's --vocab-size when the command line has none.
    {"vocab-size", false}};
constexpr CkptArg kTokenizerArgs[] = {{"tokenizer-type", true}, {"tokenizer-model", true}};
constexpr CkptArg kParallelArgs[] = {{"tensor-model-parallel-size", true},
                                     {"pipeline-model-parallel-size", true},
                                     {"num-virtual-stages-per-pipeline-rank", true},
                                     {"num-layers-per-virtual-pipeline-stage", false},
                                     {"expert-model-parallel-size", true}};

// argv's tokens without those of the flags in `drop` (and their values).
std::vector<std::string> without_flags(const FlagSet& flags, const std::vector<std::string>& argv,
                                       const std::set<std::string>& drop) {
  std::vector<std::string> out;
  for (const auto& [name, toks] : flags.groups(argv))
    if (!drop.count(name)) out.insert(out.end(), toks.begin(), toks.end());
  return out;
}

// --use-checkpoint-args: rewrites `all` (the expanded command line, already
// parsed once into `first` / `first_flags`) with the checkpoint's flags.
Result<std::vector<std::string>> merge_checkpoint_args(const std::vector<std::string>& all, const TrainConfig& first,
                                                       const FlagSet& first_flags, std::vector<std::string>* notes) {
  if (first.load.empty()) return Status::invalid("--use-checkpoint-args needs --load DIR (the checkpoint to take them from)");
  auto tracked = checkpoint::read_tracker(first.load);
  if (!tracked) return tracked.status();
  // Neither flag belongs in the merged (stored) command line.
  std::set<std::string> drop = {"use-checkpoint-args", "config"};
  if (!*tracked) {
    notes->push_back(fmt::format("--use-checkpoint-args: no checkpoint in {} to provide arguments, using the command line's",
                                 first.load));
    return without_flags(first_flags, all, drop);
  }
  auto ck = checkpoint::load_checkpoint(first.load);
  if (!ck) return ck.status();
  const std::string where = ck->directory() + "/common.json";
  auto stored = checkpoint::training_argv(ck->common(), where);
  if (!stored) return stored.status();
  auto stored_all = expand_config_files(*stored);
  if (!stored_all) return Status(stored_all.status().code(), where + ": " + stored_all.status().message());

  std::vector<CkptArg> take(std::begin(kModelArgs), std::end(kModelArgs));
  if (first.use_tokenizer_model_from_checkpoint_args) take.insert(take.end(), std::begin(kTokenizerArgs), std::end(kTokenizerArgs));
  if (first.use_mp_args_from_checkpoint_args) take.insert(take.end(), std::begin(kParallelArgs), std::end(kParallelArgs));
  std::set<std::string> from_ckpt;
  for (const CkptArg& a : take)
    if (a.forced || !first_flags.given(a.flag)) from_ckpt.insert(a.flag);
  // The command line without the flags the checkpoint decides, then the checkpoint's tokens for them.
  drop.insert(from_ckpt.begin(), from_ckpt.end());
  std::vector<std::string> merged = without_flags(first_flags, all, drop);
  std::set<std::string> seen;
  for (const auto& [name, toks] : first_flags.groups(*stored_all)) {
    if (!from_ckpt.count(name)) continue;
    merged.insert(merged.end(), toks.begin(), toks.end());
    std::string shown;
    for (size_t i = 1; i < toks.size(); ++i) shown += (i > 1 ? " " : "") + toks[i];
    if (seen.insert(name).second)
      notes->push_back(fmt::format("setting --{}{} from checkpoint", name, shown.empty() ? "" : " to " + shown));
  }
  for (const CkptArg& a : take)
    if (from_ckpt.count(a.flag) && !seen.count(a.flag) && first_flags.given(a.flag))
      notes->push_back(fmt::format("dropping --{}: the checkpoint's arguments do not have it", a.flag));
  // Model flags Megatron's list leaves to the command line although they
  // change the model: a value that differs from the checkpoint's is warned of.
  TrainConfig was, now;
  FlagSet fw(first_flags.program()), fn(first_flags.program());
  register_train_flags(fw, was, first_flags.has("device"));
  register_train_flags(fn, now, first_flags.has("device"));
  if (fw.parse(*stored_all) && fn.parse(merged)) {
    const model::ModelConfig &a = was.job.model, &b = now.job.model;
    auto warn = [&](const char* flag, const std::string& x, const std::string& y) {
      if (x != y)
        notes->push_back(fmt::format("warning: the checkpoint was trained with --{} {} but this run has {}: Megatron's "
                                     "--use-checkpoint-args does not take --{}; give it to train the same model",
                                     flag, x, y, flag));
    };
    auto yes = [](bool v) { return std::string(v ? "on" : "off"); };
    auto num = [](double v) { return fmt::format("{}", v); };
    warn("use-rope-scaling", yes(a.use_rope_scaling), yes(b.use_rope_scaling));
    if (a.use_rope_scaling && b.use_rope_scaling) warn("rope-scaling-factor", num(a.rope_scaling_factor), num(b.rope_scaling_factor));
    warn("rotary-seq-len-interpolation-factor", num(static_cast<double>(a.rotary_seq_len_interpolation_factor.value_or(1))),
         num(static_cast<double>(b.rotary_seq_len_interpolation_factor.value_or(1))));
    warn("norm-epsilon", num(a.norm_epsilon), num(b.norm_epsilon));
    warn("qk-layernorm", yes(a.qk_layernorm), yes(b.qk_layernorm));
    warn("openai-gelu", yes(a.openai_gelu), yes(b.openai_gelu));
    warn("no-bias-gelu-fusion", yes(!a.bias_gelu_fusion), yes(!b.bias_gelu_fusion));
    warn("apply-residual-connection-post-layernorm", yes(a.apply_residual_connection_post_layernorm),
         yes(b.apply_residual_connection_post_layernorm));
    warn("make-vocab-size-divisible-by", num(static_cast<double>(a.make_vocab_size_divisible_by)),
         num(static_cast<double>(b.make_vocab_size_divisible_by)));
  }
  notes->insert(notes->begin(), fmt::format("--use-checkpoint-args: model flags from {}", where));
  return merged;
}

}  // namespace

Status parse_train_args(const std::vector<std::string>& argv, TrainConfig* cfg, FlagSet* flags, bool* help) {
  auto all = expand_config_files(argv);
  if (!all) return all.status();
  if (std::find(all->begin(), all->end(), "--use-checkpoint-args") != all->end()) {
    // A first parse into a scratch config says where to load from and which flags are given.
    TrainConfig first;
    FlagSet first_flags(flags->program());
    register_train_flags(first_flags, first, flags->has("device"));
    bool first_help = false;
    first_flags.add_switch("help", &first_help, "show this help");
    if (first_flags.parse(*all) && first.use_checkpoint_args && !first_help) {
      std::vector<std::string> notes;
      auto merged = merge_checkpoint_args(*all, first, first_flags, &notes);
      if (!merged) return merged.status();
      flags->add_switch("help", help, "show this help");
      Status st = flags->parse(*merged);
      cfg->use_checkpoint_args = true;  // for the banner; the merged argv no longer has it
      cfg->merged_argv = std::move(*merged);
      cfg->checkpoint_arg_notes = std::move(notes);
      return st;
    }
  }
  flags->add_switch("help", help, "show this help");
  Status st = flags->parse(*all);
  if (st && all->size() != argv.size()) {
    // A --config file's flags are stored in checkpoints as flags, not as a
    // path that may change or move before a resume or a generation reads it.
    cfg->merged_argv = without_flags(*flags, *all, {"config"});
  }
  return st;
}

Status resolve_data_args_files(data::DataConfig* d) {
  auto read = [](const std::string& flag, const std::string& path) -> Result<std::string> {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      return Status::invalid(fmt::format("{}: '{}' is a directory; name a file", flag, path));
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::invalid(fmt::format("{}: cannot open '{}'", flag, path));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto tokens = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream ss(text);
    for (std::string t; ss >> t;) out.push_back(t);
    return out;
  };
  if (!d->data_args_path.empty()) {
    auto text = read("--data-args-path", d->data_args_path);
    if (!text) return text.status();
    d->data_path = tokens(*text);
    if (d->data_path.empty())
      return Status::invalid(fmt::format("--data-args-path '{}' is empty: expected --data-path's tokens ([w1] p1 [w2] p2 ...)",
                                         d->data_args_path));
  }
  if (!d->per_split_data_args_path.empty()) {
    const std::string& p = d->per_split_data_args_path;
    auto text = read("--per-split-data-args-path", p);
    if (!text) return text.status();
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return Status::invalid(fmt::format("--per-split-data-args-path '{}' is not a JSON object with \"train\", \"valid\" and "
                                         "\"test\" keys", p));
    std::vector<std::string>* dst[3] = {&d->train_data_path, &d->valid_data_path, &d->test_data_path};
    const char* keys[3] = {"train", "valid", "test"};
    for (int i = 0; i < 3; ++i) {
      if (!j.contains(keys[i]))
        return Status::invalid(fmt::format("--per-split-data-args-path '{}': no \"{}\" key (give it, null or [] for no data)", p,
                                           keys[i]));
      const nlohmann::json& v = j[keys[i]];
      dst[i]->clear();
      if (v.is_null()) continue;
      if (v.is_string()) {
        *dst[i] = tokens(v.get<std::string>());
      } else if (v.is_array()) {
        for (const auto& x : v) {
          if (x.is_string()) dst[i]->push_back(x.get<std::string>());
          else if (x.is_number()) dst[i]->push_back(x.dump());
          else return Status::invalid(fmt::format("--per-split-data-args-path '{}': \"{}\" holds {}, expected strings (prefixes) "
                                                  "and numbers (weights)", p, keys[i], x.dump()));
        }
      } else {
        return Status::invalid(fmt::format("--per-split-data-args-path '{}': \"{}\" must be a list or a string of "
                                           "[weight] prefix tokens, not {}", p, keys[i], v.dump()));
      }
    }
    if (d->train_data_path.empty())
      return Status::invalid(fmt::format("--per-split-data-args-path '{}': \"train\" names no dataset", p));
  }
  return Status::ok();
}

std::vector<std::string> validate_train(const TrainConfig& c) {
  std::vector<std::string> e;
  auto err = [&](std::string s) { e.push_back(std::move(s)); };
  const bool iter_mode = c.train_iters.has_value();
  if (!c.train_iters && !c.train_samples) err("give --train-iters (iteration-based) or --train-samples (sample-based)");
  if (c.train_iters && c.train_samples) err("--train-iters and --train-samples are exclusive: choose one way to count");
  if (iter_mode) {
    if (c.lr_decay_samples) err("--lr-decay-samples needs sample-based training; with --train-iters use --lr-decay-iters");
    if (c.lr_warmup_samples) err("--lr-warmup-samples needs sample-based training; with --train-iters use --lr-warmup-iters");
    if (c.lr_wsd_decay_samples) err("--lr-wsd-decay-samples needs sample-based training; use --lr-wsd-decay-iters");
    if (c.lr_warmup_fraction && c.lr_warmup_iters) err("--lr-warmup-fraction and --lr-warmup-iters: can only specify one");
  } else if (c.train_samples) {
    if (c.lr_decay_iters) err("--lr-decay-iters needs iteration-based training; with --train-samples use --lr-decay-samples");
    if (c.lr_warmup_iters) err("--lr-warmup-iters needs iteration-based training; use --lr-warmup-samples");
    if (c.lr_wsd_decay_iters) err("--lr-wsd-decay-iters needs iteration-based training; use --lr-wsd-decay-samples");
    if (c.lr_warmup_fraction && c.lr_warmup_samples) err("--lr-warmup-fraction and --lr-warmup-samples: can only specify one");
  }
  if (!c.lr) err("--lr is required (Megatron has no default learning rate)");
  if (c.lr && c.min_lr > *c.lr) err(fmt::format("--min-lr {} is larger than --lr {}", c.min_lr, *c.lr));
  if (c.lr_decay_style == "WSD" && !c.lr_wsd_decay_iters && !c.lr_wsd_decay_samples)
    err("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
  const bool wd_range = c.start_weight_decay || c.end_weight_decay;
  if (c.weight_decay_incr_style == "constant" && wd_range)
    err("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
  if (c.weight_decay_incr_style != "constant" && (!c.start_weight_decay || !c.end_weight_decay))
    err(fmt::format("--weight-decay-incr-style {} needs both --start-weight-decay and --end-weight-decay", c.weight_decay_incr_style));
  if (c.use_checkpoint_opt_param_scheduler && c.override_opt_param_scheduler)
    err("--use-checkpoint-opt-param-scheduler and --override-opt-param-scheduler are exclusive");
  if (!c.save.empty() && !c.save_interval && !c.exit_signal_handler && !c.exit_interval && !c.exit_duration_in_mins)
    err("--save needs --save-interval (Megatron asserts it)");
  if (c.save_interval && c.save.empty()) err("--save-interval needs --save DIR");
  if (c.save_retain_interval && !c.save.empty() && c.save_interval && *c.save_retain_interval % *c.save_interval != 0)
    err(fmt::format("--save-retain-interval {} must be a multiple of --save-interval {} (Megatron asserts it)",
                    *c.save_retain_interval, *c.save_interval));
  if (c.save_retain_interval && !c.save.empty() && !c.save_interval)
    err("--save-retain-interval needs --save-interval (Megatron asserts it)");
  if (c.profile && c.profile_step_end <= c.profile_step_start)
    err(fmt::format("--profile-step-end {} must be after --profile-step-start {}: no step would be profiled",
                    c.profile_step_end, c.profile_step_start));
  for (const std::string& r : c.profile_ranks) {
    int64_t v = 0;
    if (Status st = parse_int("--profile-ranks", r, 0, INT64_MAX, &v); !st) err(st.message());
  }
  if (c.exit_signal_handler && c.save.empty()) err("--exit-signal-handler saves before exiting: give --save DIR");
  // Output paths that cannot work, found now rather than after training.
  std::error_code ec;
  if (!c.save.empty() && std::filesystem::exists(c.save, ec) && !std::filesystem::is_directory(c.save, ec))
    err(fmt::format("--save {}: exists and is not a directory; name a directory (created when missing)", c.save));
  if (!c.metrics_file.empty() && std::filesystem::is_directory(c.metrics_file, ec))
    err(fmt::format("--metrics-file {}: is a directory; name a file in it, e.g. {}/metrics.jsonl", c.metrics_file,
                    c.metrics_file));
  const bool per_split_flags = !c.data.train_data_path.empty() || !c.data.valid_data_path.empty() || !c.data.test_data_path.empty();
  const bool per_split = per_split_flags || !c.data.per_split_data_args_path.empty();
  const bool data_path = !c.data.data_path.empty() || !c.data.data_args_path.empty();
  if (!c.data.data_path.empty() && !c.data.data_args_path.empty()) err("--data-path and --data-args-path: give one of them");
  if (per_split_flags && !c.data.per_split_data_args_path.empty())
    err("--per-split-data-args-path and --train/valid/test-data-path: give one of them");
  const int sources = (c.data.mock ? 1 : 0) + (data_path ? 1 : 0) + (per_split ? 1 : 0);
  if (sources == 0) err("give --data-path PREFIX (a preprocessed dataset), --train-data-path, or --mock-data");
  if (sources > 1)
    err("give one of --mock-data, --data-path, --train/valid/test-data-path: a single data source must be provided");
  if (c.tokenizer.type.empty()) err("--tokenizer-type is required (e.g. GPT2BPETokenizer with --vocab-file and --merge-file)");
  for (std::string& p : optim::loss_scale_problems(c.loss_scale)) err(std::move(p));
  if (c.eval_interval && c.eval_iters > 0 && per_split_flags && c.data.valid_data_path.empty())
    err("--eval-interval with --train-data-path needs --valid-data-path");
  return e;
}

nlohmann::json args_to_json(const TrainConfig& c, const std::vector<std::string>& argv) {
  nlohmann::json j;
  j["argv"] = argv;
  j["seed"] = c.seed;
  // The GELU form the model computed (see checkpoint::training_argv: a
  // checkpoint without this key predates the tanh default).
  j["gelu"] = c.job.model.gelu_tanh() ? "tanh" : "erf";
  return j;
}

}  // namespace mt::train
