#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <filesystem>

#include <unistd.h>
#include <unordered_map>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/op_profile.h"
#include "core/sim_device.h"
#include "core/signals.h"
#include "core/threads.h"
#include "data/loader.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "parallel/grad_buckets.h"
#include "parallel/process_groups.h"
#include "plan/plan.h"
#include "train/metrics.h"
#include "train/tensorboard.h"
#include "train/pipeline.h"
#include "train/progress_log.h"

namespace mt::train {

namespace {

using Clock = std::chrono::steady_clock;

// int32 [B, T] tensors from a micro-batch; labels are -1 where the loss mask is 0.
struct Batch {
  std::vector<int32_t> tokens, labels, positions, segments;
  Tensor tokens_t, labels_t, positions_t, segments_t;  // the last two with --reset-position-ids / --reset-attention-mask
  MicroBatchInput input(uint64_t dropout_step) const {
    return {tokens_t, labels_t, dropout_step, positions_t, segments_t};
  }
};

Batch to_model_batch(const data::MicroBatch& mb, const data::SampleOptions& so) {
  Batch b;
  const size_t n = mb.tokens.size();
  b.tokens.resize(n), b.labels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.tokens[i] = static_cast<int32_t>(mb.tokens[i]);
    b.labels[i] = mb.loss_mask[i] > 0 ? static_cast<int32_t>(mb.labels[i]) : -1;
  }
  b.tokens_t = Tensor(b.tokens.data(), {mb.batch, mb.seq}, DType::kI32);
  b.labels_t = Tensor(b.labels.data(), {mb.batch, mb.seq}, DType::kI32);
  if (so.reset_position_ids) {
    b.positions.assign(mb.position_ids.begin(), mb.position_ids.end());  // < seq: int32
    b.positions_t = Tensor(b.positions.data(), {mb.batch, mb.seq}, DType::kI32);
  }
  if (so.reset_attention_mask) {
    b.segments = mb.segment_ids;
    b.segments_t = Tensor(b.segments.data(), {mb.batch, mb.seq}, DType::kI32);
  }
  return b;
}

optim::ScheduleFlags schedule_flags(const TrainConfig& cfg, int64_t gbs) {
  optim::ScheduleFlags sf;
  sf.lr = cfg.lr, sf.min_lr = cfg.min_lr, sf.lr_decay_style = cfg.lr_decay_style;
  sf.lr_decay_iters = cfg.lr_decay_iters, sf.lr_decay_samples = cfg.lr_decay_samples;
  sf.lr_warmup_iters = cfg.lr_warmup_iters, sf.lr_warmup_samples = cfg.lr_warmup_samples;
  sf.lr_warmup_fraction = cfg.lr_warmup_fraction, sf.lr_warmup_init = cfg.lr_warmup_init;
  sf.lr_wsd_decay_iters = cfg.lr_wsd_decay_iters, sf.lr_wsd_decay_samples = cfg.lr_wsd_decay_samples;
  sf.lr_wsd_decay_style = cfg.lr_wsd_decay_style, sf.weight_decay = cfg.weight_decay;
  sf.start_weight_decay = cfg.start_weight_decay, sf.end_weight_decay = cfg.end_weight_decay;
  sf.weight_decay_incr_style = cfg.weight_decay_incr_style;
  sf.train_iters = cfg.train_iters, sf.train_samples = cfg.train_samples, sf.global_batch_size = gbs;
  return sf;
}

// Megatron's grad scaler: --loss-scale gives a constant one with --fp16,
// --bf16 or the distributed optimizer; --fp16 alone a dynamic one.
bool uses_grad_scaler(const TrainConfig& cfg, const plan::JobConfig& job) {
  return job.precision.fp16 ||
         (cfg.loss_scale.constant() && (job.precision.bf16 || job.parallel.use_distributed_optimizer));
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "\n  - " + x;
  return s;
}

// Adds the items of a message listing problems ("header (N problems):" and
// "  - item" lines; or one line) to `problems`, leaving out an item whose
// leading flag an earlier problem already starts with: validate_train and
// the scheduler state some rules in their own words.
void add_problems(const std::string& message, std::vector<std::string>* problems) {
  std::vector<std::string> items;
  size_t at = 0;
  while (at <= message.size()) {
    const size_t end = std::min(message.find('\n', at), message.size());
    const std::string line = message.substr(at, end - at);
    if (line.rfind("  - ", 0) == 0) items.push_back(line.substr(4));
    at = end + 1;
  }
  if (items.empty()) items.push_back(message);
  auto first_word = [](const std::string& s) { return s.substr(0, s.find(' ')); };
  for (const std::string& item : items) {
    const std::string flag = first_word(item);
    const bool dup = flag.rfind("--", 0) == 0 && std::any_of(problems->begin(), problems->end(), [&](const std::string& p) {
                       return first_word(p) == flag;
                     });
    if (!dup) problems->push_back(item);
  }
}

}  // namespace

namespace {

// The planner's device profile for a GPU's name (peak FLOP/s for MFU, memory).
std::string gpu_profile_name(const std::string& name) {
  if (name.find("H200") != std::string::npos) return "h200";
  if (name.find("A100") != std::string::npos) return "a100";
  if (name == "simulated") return "cpu";  // MT_SIMULATE_CUDA: host memory and CPU kernels
  return "h100";
}

Result<TrainResult> train_validated(TrainConfig& cfg, plan::PlanReport& plan, std::unique_ptr<data::Tokenizer> tokenizer,
                                    const std::vector<std::string>& argv, std::FILE* out,
                                    const std::vector<std::string>& resume_notes);
}  // namespace

namespace {
// The ranks of the job on this node: OpenMPI's launcher says; otherwise the
// whole world (an upper bound).
int local_ranks() {
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int n = std::atoi(v);
    if (n >= 1) return n;
  }
  return comm::world_size();
}

// The group kinds this trainer communicates device tensors over: TP, PP, DP
// and the embedding group, with context parallelism (cp > 1) the CP and
// DP x CP groups, with expert parallelism (ep > 1) the EP and expert
// data-parallel groups, and with whole experts under TP (ETP 1, the expert
// grid) the expert data-parallel group even without EP; the others (other
// combined kinds) stay MPI groups, so a job makes four NCCL communicators
// (five or six with CP or EP or the expert grid, eight with CP and EP), not
// one per kind.
bool device_group_kind(const std::string& name, int64_t cp, int64_t ep, bool expert_grid) {
  return name == "tp" || name == "pp" || name == "dp" || name == "embedding" ||
         (cp > 1 && (name == "cp" || name == "dp-cp")) || (ep > 1 && name == "ep") ||
         ((ep > 1 || expert_grid) && name == "expert-dp");
}

// The data-parallel gradient buckets: the non-expert parameters' over DP x
// CP, and (--num-experts) the routed experts' region of the flat buffers
// over the expert data-parallel group. Calls go to both.
struct DpBuckets {
  std::unique_ptr<parallel::GradBuckets> dense, expert;
  explicit operator bool() const { return dense != nullptr; }
  template <typename F>
  void each(F&& f) {
    if (dense) f(*dense);
    if (expert) f(*expert);
  }
  void begin_last_backward() { each([](parallel::GradBuckets& b) { b.begin_last_backward(); }); }
  void mark_ready(int stage) { each([&](parallel::GradBuckets& b) { b.mark_ready(stage); }); }
  void finish() { each([](parallel::GradBuckets& b) { b.finish(); }); }
  void wait_param_gather(int stage) { each([&](parallel::GradBuckets& b) { b.wait_param_gather(stage); }); }
  void wait_param_gather_all() { each([](parallel::GradBuckets& b) { b.wait_param_gather_all(); }); }
  size_t buffer_bytes() const { return (dense ? dense->buffer_bytes() : 0) + (expert ? expert->buffer_bytes() : 0); }
};

// Whether a job's groups are NCCL communicators: several ranks on real GPUs
// in a build with NCCL (see train_validated).
bool uses_nccl_groups(const std::string& device, int world) {
#ifdef MT_HAVE_NCCL
  return device == "cuda" && world > 1 && !simdev::enabled();
#else
  (void)device, (void)world;
  return false;
#endif
}
}  // namespace

Result<TrainResult> run_training(const TrainConfig& cfg_in, const std::vector<std::string>& argv, std::FILE* out) {
  TrainConfig cfg = cfg_in;
  auto& job = cfg.job;
  auto& mc = job.model;
  for (const auto& n : cfg.checkpoint_arg_notes) std::fprintf(out, "%s\n", n.c_str());  // --use-checkpoint-args

  // ---- 1. Every configuration problem, before anything is allocated.
  std::vector<std::string> problems = validate_train(cfg);
  if (Status st = resolve_data_args_files(&cfg.data); !st) problems.push_back(st.message());
  // The backend. --device auto takes the GPU when one is usable (several
  // ranks: one GPU each, by local rank; train_validated makes their groups).
  const BackendInfo backend = backend_info();
  // auto: the GPUs when this node has one for each of its ranks.
  if (cfg.device == "auto") cfg.device = backend.cuda_devices > 0 && local_ranks() <= backend.cuda_devices ? "cuda" : "cpu";
  if (cfg.device == "cuda" && backend.cuda_devices == 0)
    problems.push_back(fmt::format("[--device] cuda was asked for, but the CUDA backend reports: {} (fix: --device cpu)",
                                   backend.cuda_status));
  else if (uses_nccl_groups(cfg.device, comm::world_size()) && local_ranks() > backend.cuda_devices)
    problems.push_back(fmt::format("[--device] cuda with NCCL groups needs one GPU per rank, but this node runs {} ranks "
                                   "and has {} GPU{} (fix: at most {} ranks per node, or --device cpu)",
                                   local_ranks(), backend.cuda_devices, backend.cuda_devices == 1 ? "" : "s",
                                   backend.cuda_devices));
  data::TokenizerConfig tc = cfg.tokenizer;
  tc.vocab_file = mc.vocab_file;
  if (tc.type == "NullTokenizer" || tc.type == "TikTokenizer") tc.vocab_size = mc.vocab_size;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (!tc.type.empty()) {
    auto tok = data::make_tokenizer(tc);
    if (!tok) problems.push_back(tok.status().message());
    else tokenizer = std::move(*tok);
  }
  if (tokenizer) {
    if (!mc.vocab_size || tc.type != "NullTokenizer") {
      mc.vocab_size = tokenizer->vocab_size();
      mc.vocab_file.clear();  // counted by the tokenizer already
    }
  }
  plan::PlanOptions popts;
  popts.device = cfg.device == "cuda" ? gpu_profile_name(backend.cuda_name) : "cpu";
  // --step-batch-size-schedule is checked for the batches this run uses:
  // from the samples a resumed checkpoint has consumed to --train-samples.
  // (A missing or unreadable checkpoint is dealt with when the trainer loads it.)
  std::optional<checkpoint::LoadedCheckpoint> peeked;
  if (!cfg.load.empty() && !cfg.finetune)
    if (auto ck = checkpoint::load_checkpoint(cfg.load); ck) peeked = std::move(*ck);
  if (job.batch.step_batch_size_schedule) {
    if (cfg.train_samples) popts.batch_to_samples = *cfg.train_samples;
    if (peeked) {
      const nlohmann::json& c = peeked->common();
      if (c.contains("consumed_train_samples") && c["consumed_train_samples"].is_number_integer() &&
          c["consumed_train_samples"].get<int64_t>() >= 0)
        popts.batch_from_samples = c["consumed_train_samples"].get<int64_t>();
    }
  }
  // Megatron restores torch's param_groups with the optimizer state, so a
  // resumed run keeps the checkpoint's betas, eps and momentum whatever the
  // command line says: the same here (before planning: the momentum decides
  // whether SGD keeps a buffer), with a note when they differ.
  std::vector<std::string> resume_notes;
  if (peeked && !cfg.no_load_optim && peeked->common().contains("optimizer") &&
      peeked->common()["optimizer"].is_object()) {
    const nlohmann::json& o = peeked->common()["optimizer"];
    if (o.contains("name") && o["name"] == job.optimizer.name) {
      auto take = [&](const char* key, double& v, const char* flag) {
        if (!o.contains(key) || !o[key].is_number() || o[key].get<double>() == v) return;
        resume_notes.push_back(fmt::format(
            "{} {} from the checkpoint replaces the command line's {}: Megatron restores the optimizer's "
            "hyperparameters with its state (pass --no-load-optim to start the state afresh with yours)",
            flag, o[key].get<double>(), v));
        v = o[key].get<double>();
      };
      if (job.optimizer.name == "sgd") {
        take("sgd_momentum", job.optimizer.sgd_momentum, "--sgd-momentum");
      } else {
        take("adam_beta1", cfg.adam_beta1, "--adam-beta1");
        take("adam_beta2", cfg.adam_beta2, "--adam-beta2");
        take("adam_eps", cfg.adam_eps, "--adam-eps");
      }
    }
  }
  peeked.reset();  // the resume below opens it again, after the plan's checks
  plan::PlanReport plan = plan::make_plan(job, popts);
  for (const auto& v : plan.errors) {
    std::string flags;
    for (const auto& f : v.flags) flags += (flags.empty() ? "" : ", ") + f;
    problems.push_back(fmt::format("[{}] {}{}", flags, v.message, v.suggestion.empty() ? "" : " (fix: " + v.suggestion + ")"));
  }
  if (plan.valid() && !plan.batch_steps.empty() && cfg.train_iters)
    problems.push_back(
        "[--step-batch-size-schedule, --train-iters] a step batch schedule needs sample-based training: Megatron's "
        "iteration-based LR schedule counts --lr-decay-iters x micro-batch x DP samples (the global batch its args "
        "hold under a schedule) while every step consumes the schedule's batch, so the LR would decay early (fix: "
        "--train-samples, with --lr-decay-samples and --lr-warmup-samples)");
  for (const auto& n : plan.no_effect) job.compat.no_effect.push_back(n);
  // Megatron flags for what this trainer does not do: listed whatever else is wrong.
  for (const auto& [flag, why] : job.compat.refused) problems.push_back(fmt::format("[{}] {}", flag, why));
  if (cfg.dataloader_type == "external")
    problems.push_back("[--dataloader-type] the external loader (an iterator the training script supplies) has no "
                       "counterpart in this program (fix: --dataloader-type single or cyclic)");
  if (job.batch.reset_position_ids && mc.position_embedding != model::PositionEmbedding::kLearnedAbsolute)
    job.compat.no_effect.push_back(
        "--reset-position-ids: position ids feed only learned position embeddings (--position-embedding-type "
        "learned_absolute); RoPE rotates by sequence index, as Megatron's GPTModel does (with "
        "--reset-attention-mask each document then sees its own relative positions)");
  if (!job.parallel.cp_comm_type.empty())
    job.compat.no_effect.push_back(
        "--cp-comm-type: context parallelism here all-gathers the roped Q/K/V over the CP group and reduce-scatters "
        "their gradients (Megatron's allgather type); the ring (p2p) and all-to-all types compute the same attention");
  // Megatron's checks on accepted no-effect flags that involve training flags.
  if (job.compat.has("ddp-average-in-collective") && cfg.calculate_per_token_loss)
    problems.push_back("[--ddp-average-in-collective, --calculate-per-token-loss] Megatron: cannot average in the "
                       "collective when calculating per-token loss (fix: drop --ddp-average-in-collective)");
  if (job.compat.value("cuda-graph-impl") == "full_iteration" && cfg.check_for_nan_in_loss_and_grad)
    problems.push_back("[--cuda-graph-impl, --no-check-for-nan-in-loss-and-grad] Megatron: full-iteration CUDA graphs "
                       "need --no-check-for-nan-in-loss-and-grad (fix: drop --cuda-graph-impl, as there are no CUDA "
                       "graphs here, or add --no-check-for-nan-in-loss-and-grad)");
  for (const char* flag : {"dataloader-fast-cache-load", "dataloader-defer-npy-index-mmap"})
    if (job.compat.has(flag) && cfg.data.gpt.cache_dir.empty())
      problems.push_back(fmt::format("[--{}, --data-cache-path] Megatron: --{} needs --data-cache-path (fix: give "
                                     "--data-cache-path, or drop the flag)",
                                     flag, flag));
  if (job.compat.has("dataloader-fast-cache-load") && !cfg.data.data_path.empty())
    problems.push_back("[--dataloader-fast-cache-load, --data-path] Megatron: --dataloader-fast-cache-load cannot be "
                       "combined with --data-path (fix: drop --dataloader-fast-cache-load)");
  // --rerun-mode report_stats: Megatron's rerun machine then skips the NaN check.
  if (job.compat.value("rerun-mode") == "report_stats" && cfg.check_for_nan_in_loss_and_grad) {
    cfg.check_for_nan_in_loss_and_grad = false;
    job.compat.no_effect.push_back("--rerun-mode report_stats: NaN/inf losses and gradients are not checked (Megatron's "
                                   "report_stats mode does not check them)");
  }
  if (cfg.log_progress && cfg.save.empty())
    job.compat.no_effect.push_back("--log-progress: progress.txt goes in the --save directory, and none is given");
  if (cfg.moe_per_layer_logging && !mc.is_moe())
    job.compat.no_effect.push_back("--moe-per-layer-logging: the model has no experts (--num-experts), so no router "
                                   "losses to log");
  if (cfg.dataloader_type == "single" && !cfg.data_sharding)
    job.compat.no_effect.push_back("--no-data-sharding: only the cyclic loader shards its data (as in Megatron)");
  if (cfg.dataloader_type == "cyclic" && !cfg.data_sharding)
    problems.push_back("[--no-data-sharding] the cyclic loader without data sharding is not implemented: Megatron's "
                       "deals one permutation of (size / micro-batch) x micro-batch samples to the ranks, which can "
                       "give them different numbers of micro-batches in an epoch (fix: drop --no-data-sharding)");
  if (job.precision.fp16 && cfg.device == "cuda" && !simdev::enabled())
    problems.push_back("[--fp16] the CUDA backend has no fp16 kernels yet (fp16 trains on the CPU backend) "
                       "(fix: --bf16, the usual choice on A100/H100/H200, or --device cpu)");
  if (job.precision.fp16)
    job.compat.no_effect.push_back(
        "--fp16: gradients are accumulated and reduced in fp32 (Megatron's --accumulate-allreduce-grads-in-fp32); "
        "Megatron's default fp16 gradient buffer is not offered");
  if (cfg.loss_scale.loss_scale && !uses_grad_scaler(cfg, job))
    job.compat.no_effect.push_back("--loss-scale: fp32 training without the distributed optimizer has no grad scaler "
                                   "(as in Megatron)");
  // Megatron turns the NaN checks off under dynamic loss scaling: inf and NaN
  // gradients are the scaler's signal.
  if (job.precision.fp16 && !cfg.loss_scale.constant() && cfg.check_for_nan_in_loss_and_grad) {
    cfg.check_for_nan_in_loss_and_grad = false;
    if (cfg.check_for_nan_asked)
      job.compat.no_effect.push_back("--check-for-nan-in-loss-and-grad: off under dynamic loss scaling (--fp16 without "
                                     "--loss-scale), whose signal inf and NaN gradients are (as in Megatron)");
  }
  const int processes = comm::world_size();
  if (plan.valid()) {
    if (plan.world != processes)
      problems.push_back(processes == 1 && !comm::launched_by_mpi()
                             ? fmt::format("the layout needs {} ranks (world size from {}) but this is one process: "
                                           "launch with mpirun -np {} megatron train ...",
                                           plan.world, plan::world_source_name(plan.world_source), plan.world)
                             : fmt::format("the layout needs {} ranks (world size from {}) but mpirun started {}: "
                                           "use mpirun -np {} or change --world-size",
                                           plan.world, plan::world_source_name(plan.world_source), processes, plan.world));
    // The schedules and the model's own checks, here so that they too are
    // reported once, before any rank allocates.
    if (auto sc = optim::scheduler_from_flags(schedule_flags(cfg, plan.requested_global_batch)); !sc)
      add_problems(sc.status().message(), &problems);
    if (!plan.memory.trainer.available && !plan.memory.trainer.why_not.empty())
      problems.push_back(plan.memory.trainer.why_not);
    // NCCL matches point-to-point messages in issue order per pair of ranks
    // (no tags). With PP 2, virtual stages and micro-batch groups larger than
    // PP, the step lists send one rank's activations and gradients in another
    // order than the other receives them (parallel::P2PCheck), which NCCL
    // would pair wrongly, silently (the tensors have one shape).
    if (uses_nccl_groups(cfg.device, processes) && job.parallel.pp > 1) {
      // Every number of micro-batches the run uses (each step of a schedule).
      std::vector<int64_t> counts{plan.num_microbatches};
      for (const plan::BatchStep& st : plan.batch_steps_used)
        counts.push_back(st.batch / (job.batch.micro_batch_size * plan.dp));
      for (const int64_t M : counts) {
        auto sched = parallel::build_schedule(job.parallel.pp, plan.vpp, M,
                                              job.parallel.microbatch_group_size_per_vp_stage.value_or(0));
        if (!sched) continue;  // the planner has reported it
        const parallel::P2PCheck c = parallel::check_pipeline_steps(*sched, parallel::pipeline_steps(*sched));
        if (c.pair_fifo_compatible) continue;
        problems.push_back(fmt::format(
            "[--pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-stage, "
            "--microbatch-group-size-per-virtual-pipeline-stage] on NCCL groups this interleaved schedule{} mixes "
            "the two directions between a pair of ranks: {}; NCCL pairs messages in issue order, not by tag "
            "(fix: the default micro-batch group size (PP), a pipeline of 3 or more stages, or no virtual stages)",
            plan.batch_steps.empty() ? "" : fmt::format(" ({} micro-batches)", M), c.pair_problem));
        break;
      }
    }
    // Every pipeline stage's model (the planner plans each): layer counts
    // can differ with uneven splits, e.g. against --recompute-num-layers.
    if (plan.memory.trainer.available)
      for (size_t p = 1; p < plan.memory.trainer_stages.size(); ++p)
        if (const plan::TrainerBuffers& t = plan.memory.trainer_stages[p]; !t.available)
          problems.push_back(fmt::format("pipeline stage {}: {}", p, t.why_not));
  }
  if (!problems.empty())
    return Status::invalid(fmt::format("{} problem{} in the configuration:{}", problems.size(), problems.size() == 1 ? "" : "s",
                                       join_lines(problems)));
  // From here on an error may hit one rank only: with several ranks it ends
  // the whole job (MPI_Abort) with the failing rank's message, never a hang.
  // With --use-checkpoint-args a checkpoint of this run stores the merged
  // command line, so that it resumes and generates without the other one.
  auto r = train_validated(cfg, plan, std::move(tokenizer), cfg.merged_argv.empty() ? argv : cfg.merged_argv, out,
                           resume_notes);
  if (!r && processes > 1) {
    std::fflush(out);
    std::fprintf(stderr, "megatron train: error on rank %d of %d: %s\n", comm::world_rank(), processes,
                 r.status().message().c_str());
    comm::abort_job(1);
  }
  return r;
}

namespace {

Result<TrainResult> train_validated(TrainConfig& cfg, plan::PlanReport& plan, std::unique_ptr<data::Tokenizer> tokenizer,
                                    const std::vector<std::string>& argv, std::FILE* out,
                                    const std::vector<std::string>& resume_notes) {
  const auto job_start = Clock::now();  // --log-progress's job throughput counts from here
  auto& job = cfg.job;
  auto& mc = job.model;
  // ---- Process groups from the planner's rank grid (the layout `megatron plan` draws).
  const int world = comm::world_size(), rank = comm::world_rank();
  MT_CHECK(plan.grid.has_value(), "a valid plan has a rank grid");
  // Several ranks on GPUs: one GPU per rank (its local rank) and groups that
  // move device memory, NCCL's where this build has it and the GPUs are
  // real; otherwise MPI staged through host buffers (comm::make_staged_group:
  // slow, but the same results; under MT_SIMULATE_CUDA it is how CI trains
  // several ranks on the simulated device). The world communicator below
  // stays MPI: it carries host values only.
  parallel::ProcessGroups::GroupFactory make_group = comm::make_group;
  std::string group_kind = "MPI";
  // ETP 1 under TP: the experts' own grid (their data-parallel group is not DP x CP).
  const bool expert_grid = mc.is_moe() && plan.etp != job.parallel.tp;
  if (uses_nccl_groups(cfg.device, world)) {
#ifdef MT_HAVE_NCCL
    if (Status s = comm::init_nccl(); !s) return s;
    make_group = [cp = job.parallel.cp, ep = job.parallel.ep, expert_grid](const std::vector<int>& members,
                                                                           const std::string& name) {
      return device_group_kind(name, cp, ep, expert_grid) ? comm::make_nccl_group(members, name)
                                                          : comm::make_group(members, name);
    };
    group_kind = "NCCL";
#endif
  } else if (cfg.device == "cuda" && world > 1) {
#ifdef MT_HAVE_CUDA
    comm::select_local_device(/*allow_shared=*/true);
#endif
    make_group = [cp = job.parallel.cp, ep = job.parallel.ep, expert_grid](const std::vector<int>& members,
                                                                           const std::string& name) {
      auto g = comm::make_group(members, name);
      return device_group_kind(name, cp, ep, expert_grid) ? comm::make_staged_group(std::move(g)) : std::move(g);
    };
    group_kind = "MPI staged through host memory";
  }
  auto groups_r = parallel::ProcessGroups::create(*plan.grid, rank, make_group);
  if (!groups_r) return groups_r.status();
  parallel::ProcessGroups& groups = *groups_r;
  comm::Communicator& tp_comm = groups.tp();
  comm::Communicator& dp_comm = groups.dp();
  comm::Communicator& pp_comm = groups.pp();
  std::unique_ptr<comm::Communicator> world_comm = comm::world_communicator();
  const int64_t tp = job.parallel.tp, dp = plan.dp, tp_rank = tp_comm.rank(), dp_rank = dp_comm.rank();
  const int64_t pp = job.parallel.pp, pp_rank = pp_comm.rank(), vpp = plan.vpp, cp = job.parallel.cp;
  // Context parallelism: the CP ranks of a DP rank read the same samples and
  // hold different positions of them; gradients are reduced (and with the
  // distributed optimizer sharded) over DP x CP, as Megatron's dp-cp group.
  comm::Communicator& grad_comm = cp > 1 ? groups.dp_cp() : dp_comm;
  const int64_t gdp = dp * cp;
  // Expert parallelism (--expert-model-parallel-size): EP ranks of one TP
  // and PP position hold different experts; the experts' gradients are
  // reduced over the expert data-parallel group (DP x CP / EP ranks).
  // Without EP the expert data-parallel group has the DP x CP group's members
  // in the same order (EDP = DP x CP): the experts' gradients go over that
  // one (a device group on GPUs; the expert groups are device groups only
  // with EP > 1 or the expert grid). With ETP 1 under TP (expert_grid) each
  // rank holds whole experts, so the TP partners are expert data-parallel
  // ranks too: EDP = TP x DP x CP / EP.
  const int64_t ep = job.parallel.ep;
  comm::Communicator& ep_comm = *groups.get(parallel::GroupKind::kExpert);
  comm::Communicator& expert_dp_comm =
      ep > 1 || expert_grid ? *groups.get(parallel::GroupKind::kExpertData) : grad_comm;
  const bool sp = job.parallel.sequence_parallel && tp > 1;
  const bool dist_opt = job.parallel.use_distributed_optimizer && plan.reduces_gradients();

  // The global batch: constant (gbs, M micro-batches of mbs per DP rank), or
  // with --step-batch-size-schedule the batch in force at the samples
  // consumed, up to gbs (the last step), for which the model is planned.
  const int64_t mbs = job.batch.micro_batch_size, gbs = plan.global_batch;
  const int64_t seq = mc.seq_length;
  const bool stepped = !plan.batch_steps.empty();
  auto batch_for = [&](int64_t consumed) { return stepped ? plan::batch_at(plan.batch_steps, consumed) : gbs; };
  // Megatron's update_train_iters: a sample-based run takes train_samples /
  // the global batch its args hold (as given, also under
  // --decrease-batch-size-if-needed), or the schedule's steps until the
  // samples are reached (the last may pass them).
  const plan::ScheduledRun scheduled =
      stepped ? plan::scheduled_run(plan.batch_steps, *cfg.train_samples) : plan::ScheduledRun{};
  const int64_t train_iters = cfg.train_iters ? *cfg.train_iters
                              : stepped       ? scheduled.iterations
                                              : *cfg.train_samples / plan.requested_global_batch;
  // Default threads: the cores shared among the ranks of this machine.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  set_num_threads(static_cast<int>(cfg.threads.value_or(std::max<int64_t>(1, static_cast<int64_t>(cores) / world))));

  // ---- 2. Model, optimizer, scheduler.
  // This pipeline rank's model as the planner sized it (chunks, slots, TP/SP,
  // recomputation), on this TP rank.
  auto mo_r = plan::trainer_model_options(plan, pp_rank);
  if (!mo_r) return mo_r.status();
  model::GPTOptions mo = *mo_r;
  mo.tp_rank = tp_rank, mo.tp_comm = &tp_comm;
  if (cp > 1) mo.cp_rank = groups.cp().rank(), mo.cp_comm = &groups.cp();
  if (ep > 1) mo.ep_rank = ep_comm.rank(), mo.ep_comm = &ep_comm;
  mo.device = cfg.device == "cuda" ? Device::kCuda : Device::kCpu;
  auto schedule_for = [&](int64_t microbatches) {
    return parallel::build_schedule(pp, vpp, microbatches, job.parallel.microbatch_group_size_per_vp_stage.value_or(0));
  };
  auto schedule = schedule_for(plan.num_microbatches);
  if (!schedule) return schedule.status();
  auto model_r = model::GPTModel::create(mc, mo);
  if (!model_r) return model_r.status();
  model::GPTModel& model = **model_r;
  model.init_parameters(static_cast<uint64_t>(cfg.seed));
  if (job.precision.half()) model.sync_low_precision();
  // Data-parallel (x CP) gradient buckets over the model's flat gradient
  // buffer: the experts' region (--num-experts) over the expert DP group.
  DpBuckets buckets;
  if (plan.reduces_gradients()) {
    const int64_t xb = model.expert_flat_begin(), n = model.flat_grads().numel();
    std::vector<parallel::ParamRange> ranges, expert_ranges;
    for (size_t i = 0; i < model.specs().size(); ++i) {
      const int64_t b = model.flat_offset(static_cast<int>(i)), e = b + model.params()[i].numel();
      const int stage = model::param_stage(model.specs()[i], mc.num_layers);
      if (b < xb) ranges.push_back({b, e, stage});
      else expert_ranges.push_back({b - xb, e - xb, stage});
    }
    parallel::GradBucketOptions bo;
    bo.mode = dist_opt ? parallel::GradReduceMode::kReduceScatter : parallel::GradReduceMode::kAllReduce;
    bo.overlap_grad_reduce = job.parallel.overlap_grad_reduce;
    bo.bucket_elems = job.parallel.ddp_bucket_size.value_or(0);
    auto region = [](const Tensor& flat, int64_t b, int64_t e) { return flat.defined() ? flat.slice(b, e) : flat; };
    const Tensor params = dist_opt ? model.flat_params() : Tensor();
    buckets.dense = std::make_unique<parallel::GradBuckets>(region(model.flat_grads(), 0, xb), region(params, 0, xb),
                                                            std::move(ranges), grad_comm, bo);
    if (xb < n)
      buckets.expert = std::make_unique<parallel::GradBuckets>(region(model.flat_grads(), xb, n), region(params, xb, n),
                                                               std::move(expert_ranges), expert_dp_comm, bo);
  }
  optim::ParallelOptimizerOptions po;
  po.tp = &tp_comm, po.dp = &grad_comm, po.pp = &pp_comm, po.tp_rank = tp_rank;
  po.dist_buckets = dist_opt ? buckets.dense.get() : nullptr;
  po.ep = ep > 1 ? &ep_comm : nullptr;
  po.experts_split_over_tp = !expert_grid;
  po.expert_dp = model.expert_flat_begin() < model.flat_params().numel() ? &expert_dp_comm : nullptr;
  po.expert_dist_buckets = dist_opt ? buckets.expert.get() : nullptr;
  po.overlap_param_gather = dist_opt && job.parallel.overlap_param_gather;
  std::optional<optim::GradScaler> scaler;
  if (uses_grad_scaler(cfg, job)) scaler = optim::GradScaler::from(cfg.loss_scale);
  optim::Optimizer opt(
      model,
      optim::OptimizerConfig{.kind = job.optimizer.name == "sgd" ? optim::OptimizerKind::kSgd : optim::OptimizerKind::kAdam,
                             .sgd_momentum = job.optimizer.sgd_momentum,
                             .beta1 = cfg.adam_beta1,
                             .beta2 = cfg.adam_beta2,
                             .eps = cfg.adam_eps,
                             // MLA's q/kv norms: Megatron's default (Transformer Engine)
                             // fuses them into the up projections
                             // (linear_q_up_proj.layer_norm_weight), which its
                             // "q_layernorm." test does not match: no weight decay.
                             .apply_wd_to_qk_layernorm = cfg.apply_wd_to_qk_layernorm && !mc.mla(),
                             .decoupled_lr = cfg.decoupled_lr,
                             .decoupled_min_lr = cfg.decoupled_min_lr},
      po);
  PipelineExecutor executor(model, pp_comm, *schedule);
  // Tied embeddings over several stages: first and last stage each hold the
  // word embedding and sum its gradients over the embedding group.
  // With --mtp-num-layers the last stage holds it too (the MTP layers embed), tied or not.
  const bool shared_embedding = pp > 1 && (!mc.untie_embeddings_and_output_weights || mc.mtp_layers()) &&
                                groups.embedding() != nullptr && model.find("embedding.word_embeddings.weight") >= 0;
  // With --overlap-param-gather the optimizer's step only starts the
  // parameter all-gather; whoever reads parameters next waits for it.
  bool gather_pending = false;
  auto wait_params = [&] {
    if (!gather_pending) return;
    buckets.wait_param_gather_all();
    if (job.precision.half()) model.sync_low_precision();
    gather_pending = false;
  };
  auto sched_cfg = optim::scheduler_from_flags(schedule_flags(cfg, plan.requested_global_batch));
  if (!sched_cfg) return sched_cfg.status();
  optim::OptimizerParamScheduler sched(*sched_cfg);

  // ---- 3. Resume.
  int64_t iteration = 0, consumed_train = 0, consumed_valid = 0, skipped_train = 0;
  double flops_so_far = 0;
  if (!cfg.load.empty()) {
    auto tracker = checkpoint::read_tracker(cfg.load);
    if (!tracker) return tracker.status();
    if (!*tracker) {
      if (cfg.exit_on_missing_checkpoint)
        return Status::not_found(fmt::format("--load {}: no checkpoint there (no {}), and --exit-on-missing-checkpoint "
                                             "is given; check the path, or drop the flag to train from scratch",
                                             cfg.load, checkpoint::kTrackerFile));
      std::fprintf(out, "no checkpoint in %s (no %s): training from scratch\n", cfg.load.c_str(), checkpoint::kTrackerFile);
    } else {
      auto ck = checkpoint::load_checkpoint(cfg.load);
      if (!ck) return ck.status();
      // --verify-integrity: rank 0 reads every file once (a failure there
      // ends the whole job).
      if (cfg.verify_integrity && rank == 0) MT_RETURN_IF_ERROR(ck->verify_integrity());
      const bool with_optim = !cfg.no_load_optim && !cfg.finetune;
      // The optimizer that saved the state: its name, or in checkpoints from
      // before --optimizer sgd (which name none) Adam when they hold its
      // moments (else their missing state tensors are reported by name below).
      const std::string ours = optim::optimizer_name(opt.config().kind);
      nlohmann::json n;
      if (ck->common().contains("optimizer") && ck->common()["optimizer"].is_object() &&
          ck->common()["optimizer"].contains("name"))
        n = ck->common()["optimizer"]["name"];
      else if (!model.specs().empty() && ck->has_tensor("optimizer.exp_avg." + model.specs()[0].name))
        n = "adam";
      if (with_optim && !n.is_null()) {
        if (!n.is_string())
          return Status::corrupt(fmt::format("{}/common.json: optimizer.name is {}, expected a string such as \"adam\"",
                                             ck->directory(), n.dump()));
        if (n.get<std::string>() != ours)
          return Status::invalid(fmt::format(
              "--load {}: its optimizer state was saved by --optimizer {} but this run uses --optimizer {}; pass "
              "--optimizer {} to continue it, or --no-load-optim to start the {} state afresh",
              ck->directory(), n.get<std::string>(), ours, n.get<std::string>(), ours));
      }
      std::vector<std::string> notes = with_optim ? resume_notes : std::vector<std::string>{};
      MT_RETURN_IF_ERROR(checkpoint::load_training_state(*ck, model, with_optim ? &opt : nullptr, &notes));
      for (const auto& n : notes) std::fprintf(out, "note: %s\n", n.c_str());
      const auto& c = ck->common();
      // A count the checkpoint stores: absent is 0; anything but a
      // non-negative integer (or number, for the FLOPs) names its field.
      auto check = [&](const nlohmann::json& o, const char* key, const std::string& name, bool integer) -> Status {
        if (!o.contains(key)) return Status::ok();
        const nlohmann::json& v = o[key];
        const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
        if ((integer ? v.is_number_integer() : v.is_number()) && v.get<double>() >= 0 && std::isfinite(v.get<double>()) &&
            (!integer || fits))
          return Status::ok();
        return Status::corrupt(fmt::format("{}/common.json: {} is {}, expected a non-negative {}", ck->directory(),
                                           name, v.dump(), integer ? "integer" : "number"));
      };
      if (!cfg.finetune) {
        iteration = ck->iteration();
        MT_RETURN_IF_ERROR(check(c, "consumed_train_samples", "consumed_train_samples", true));
        MT_RETURN_IF_ERROR(check(c, "consumed_valid_samples", "consumed_valid_samples", true));
        MT_RETURN_IF_ERROR(check(c, "skipped_train_samples", "skipped_train_samples", true));
        MT_RETURN_IF_ERROR(check(c, "num_floating_point_operations_so_far", "num_floating_point_operations_so_far", false));
        consumed_train = c.value("consumed_train_samples", int64_t{0});
        consumed_valid = c.value("consumed_valid_samples", int64_t{0});
        skipped_train = c.value("skipped_train_samples", int64_t{0});
        flops_so_far = c.value("num_floating_point_operations_so_far", 0.0);
        if (c.contains("opt_param_scheduler"))
          MT_RETURN_IF_ERROR(sched.load_state(c["opt_param_scheduler"], cfg.use_checkpoint_opt_param_scheduler,
                                              cfg.override_opt_param_scheduler));
        if (with_optim && c.contains("optimizer")) {
          if (!c["optimizer"].is_object())
            return Status::corrupt(fmt::format("{}/common.json: optimizer is {}, expected an object", ck->directory(),
                                               c["optimizer"].dump()));
          MT_RETURN_IF_ERROR(check(c["optimizer"], "step", "optimizer.step", true));
          opt.set_step_count(c["optimizer"].value("step", int64_t{0}));
        }
        // The dynamic scaler's state (Megatron's optimizer grad_scaler); a
        // checkpoint without one (bf16, fp32) leaves the scaler fresh.
        if (with_optim && scaler && c.contains("optimizer") && c["optimizer"].contains("grad_scaler"))
          scaler->load_state_json(c["optimizer"]["grad_scaler"]);
      }
      std::fprintf(out, "loaded checkpoint %s (iteration %lld)%s\n", ck->directory().c_str(),
                   static_cast<long long>(ck->iteration()), cfg.finetune ? " for fine-tuning: iteration and optimizer restart" : "");
    }
  }

  // ---- 4. Data.
  data::DataConfig dc = cfg.data;  // --data-args-path files already read (run_training)
  dc.gpt.seq_length = seq;
  dc.gpt.seed = static_cast<uint32_t>(cfg.seed);
  dc.mock_vocab_size = tokenizer->vocab_size();
  dc.mock_eod = tokenizer->eod();
  dc.gpt.vocab_size = model.vocab();  // every token read must be an id the embedding holds
  const bool do_eval = cfg.eval_interval && cfg.eval_iters > 0;
  // Validation iterations take --eval-global-batch-size (default: the global
  // batch Megatron's args hold), M_eval micro-batches per DP rank.
  const int64_t eval_gbs = plan.eval_global_batch, M_eval = plan.eval_microbatches;
  // The training samples asked of the datasets, as Megatron asks: the
  // global batch its args hold x --train-iters, or --train-samples (the
  // datasets' indices, and so the sample order, depend on it).
  std::array<std::optional<int64_t>, 3> want{train_iters * plan.requested_global_batch, std::nullopt, std::nullopt};
  if (cfg.train_samples) want[0] = *cfg.train_samples;
  if (do_eval) want[1] = (train_iters / *cfg.eval_interval + 1) * cfg.eval_iters * eval_gbs;
  std::vector<std::string> data_log;
  auto sources = data::build_train_valid_test(dc, want, &data_log, {true, do_eval, false});
  if (!sources) return sources.status();
  for (const auto& l : data_log) std::fprintf(out, "%s\n", l.c_str());
  if (!(*sources)[0]) return Status::invalid("the training split is empty: check --split");
  if (do_eval && !(*sources)[1]) return Status::invalid("--eval-interval is set but the validation split is empty: check --split (e.g. 98,2,0)");
  data::SampleOptions so;
  so.eod = tokenizer->eod();
  so.eod_mask_loss = cfg.eod_mask_loss;
  so.reset_position_ids = job.batch.reset_position_ids;
  so.reset_attention_mask = job.batch.reset_attention_mask;
  const data::Sampler sampler = cfg.dataloader_type == "cyclic" ? data::Sampler::kCyclic : data::Sampler::kSingle;
  // A schedule's last iteration may pass --train-samples: where the split
  // holds fewer samples the single loader would run dry there (Megatron's
  // sampler stops mid-iteration), so say it now.
  if (stepped && sampler == data::Sampler::kSingle && (*sources)[0]->size() < scheduled.samples)
    return Status::invalid(fmt::format(
        "--step-batch-size-schedule: the last of the {} iterations ends at {} samples, past --train-samples {}, and "
        "the training split holds {} (fix: a --train-samples whose last iteration ends within the split, or "
        "--dataloader-type cyclic)",
        train_iters, scheduled.samples, *cfg.train_samples, (*sources)[0]->size()));
  data::DataLoader train_loader((*sources)[0], mbs, dp_rank, dp, consumed_train, so, sampler);

  // Unigram baseline for the validation split: cross-entropy of the training
  // tokens' frequencies (add-one smoothed) on the first validation batches.
  std::optional<double> unigram_ppl;
  if (do_eval && rank == 0) {
    std::vector<double> counts(static_cast<size_t>(model.vocab()), 1.0);
    double total = static_cast<double>(counts.size());
    std::vector<int64_t> text(static_cast<size_t>(seq + 1));
    const int64_t n = std::min<int64_t>((*sources)[0]->size(), std::max<int64_t>(1, 2000000 / seq));
    for (int64_t k = 0; k < n; ++k) {
      MT_RETURN_IF_ERROR((*sources)[0]->sample_tokens(k, text.data()));
      for (int64_t t = 1; t <= seq; ++t)
        if (text[t] >= 0 && text[t] < model.vocab()) counts[text[t]] += 1, total += 1;
    }
    double nll = 0, cnt = 0;
    const int64_t nv = std::min<int64_t>((*sources)[1]->size(), cfg.eval_iters * eval_gbs);
    for (int64_t k = 0; k < nv; ++k) {
      MT_RETURN_IF_ERROR((*sources)[1]->sample_tokens(k, text.data()));
      for (int64_t t = 1; t <= seq; ++t)
        if (text[t] >= 0 && text[t] < model.vocab()) nll -= std::log(counts[text[t]] / total), cnt += 1;
    }
    if (cnt > 0) unigram_ppl = std::exp(nll / cnt);
  }

  // ---- 5. Reporting.
  MetricsFile metrics(rank != 0 ? "" : !cfg.metrics_file.empty() ? cfg.metrics_file : cfg.save.empty() ? "" : cfg.save + "/metrics.jsonl");
  // TensorBoard scalars from rank 0, which holds every reduced number.
  TensorBoardWriter tb;
  if (rank == 0 && !cfg.tensorboard_dir.empty()) MT_RETURN_IF_ERROR(tb.open(cfg.tensorboard_dir));
  auto tb_pair = [&](const std::string& tag, double v, int64_t it, int64_t samples) {
    tb.add_scalar(tag, v, it);
    tb.add_scalar(tag + " vs samples", v, samples);
  };
  if (!metrics.path().empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(metrics.path()).parent_path(), ec);
  }
  ProgressBar bar(!cfg.no_progress && rank == 0, cfg.progress);
  const bool half = job.precision.bf16 || job.precision.fp16;
  const double peak_tflops = half ? plan.device.peak_tflops_16bit : plan.device.peak_tflops_32bit;
  const double flops_per_iter = plan.flops_per_iteration;
  auto measured_bytes = [&] {
    return static_cast<double>(model.measured_bytes().total()) + static_cast<double>(opt.state_bytes()) +
           static_cast<double>(buckets.buffer_bytes()) + static_cast<double>(executor.buffer_bytes());
  };
  // The planner's prediction of this trainer's buffers (the model's size
  // tables plus the optimizer state): what `megatron plan` prints for these flags.
  const double planned_bytes = plan.memory.trainer.available ? plan.memory.trainer.total() : 0;
  const std::string layout = (cp > 1 ? fmt::format("TP x CP x PP x DP = {} x {} x {} x {}", tp, cp, pp, dp)
                                      : fmt::format("TP x PP x DP = {} x {} x {}", tp, pp, dp)) +
                             (ep > 1 || expert_grid
                                  ? fmt::format(" (experts: EP {}{} x expert DP {}, {} {}experts per rank)", ep,
                                                expert_grid ? " x ETP 1" : "", expert_dp_comm.size(),
                                                mc.num_experts / ep, expert_grid ? "whole " : "")
                                  : std::string());
  const int64_t routed = mbs * seq / cp / (sp ? tp : 1);  // the tokens one rank's MoE router sees per micro-batch
  std::fprintf(out, "training %s: %lld parameters, %s on %d rank%s%s%s%s, micro-batch %lld x %lld "
                    "micro-batches x DP %lld = global batch %lld, %lld iterations from %lld, %s, %s\n",
               (std::string(mc.swiglu ? "a LLaMA-style GPT" : "a GPT") +
                (mc.mla() ? fmt::format(" with multi-latent attention (q {}, kv rank {}, heads {} + {} rotated ({}), "
                                        "values {})",
                                        mc.q_lora_rank ? fmt::format("rank {}", *mc.q_lora_rank) : "full rank",
                                        mc.kv_lora_rank, mc.qk_head_dim, mc.qk_pos_emb_head_dim,
                                        mc.mla_yarn() ? fmt::format("YaRN x{}", mc.rotary_scaling_factor) : "RoPE",
                                        mc.v_head_dim)
                          : std::string()) +
                (mc.is_moe() ? fmt::format(" with {} experts per layer (top {}{}{}){}", mc.num_experts, mc.moe_router_topk,
                                           mc.drops_tokens()
                                               ? fmt::format(", capacity factor {}: each expert keeps at most {} of the {} "
                                                             "tokens a rank routes, dropping by {}",
                                                             *mc.moe_expert_capacity_factor,
                                                             std::min(mc.moe_capacity(routed), routed), routed,
                                                             mc.moe_token_drop_policy)
                                               : std::string(),
                                           (mc.has_shared_expert()
                                                ? fmt::format(", and a {}shared expert of width {}",
                                                              mc.moe_shared_expert_gate ? "gated " : "",
                                                              mc.moe_shared_expert_intermediate_size)
                                                : std::string()) +
                                               (mc.jitters_router_input()
                                                    ? fmt::format(", router input jitter {}", *mc.moe_input_jitter_eps)
                                                    : std::string()),
                                           mc.has_dense_layers()  // --moe-layer-freq
                                               ? fmt::format(" in {} of its {} layers, the others dense",
                                                             mc.num_moe_layers(), mc.num_layers)
                                               : std::string())
                             : std::string()) +
                (mc.mtp_layers() ? fmt::format(", predicting {} more token{} ahead ({}, loss weight {})",
                                               mc.mtp_layers(), mc.mtp_layers() > 1 ? "s" : "",
                                               mc.mtp_use_repeated_layer
                                                   ? std::string("one MTP layer repeated")
                                                   : fmt::format("{} MTP layer{}", mc.mtp_layers(),
                                                                 mc.mtp_layers() > 1 ? "s" : ""),
                                               mc.mtp_loss_scaling_factor)
                                 : std::string()))
                   .c_str(),
               static_cast<long long>(plan.total_params), layout.c_str(),
               world, world == 1 ? "" : "s",
               vpp > 1 ? fmt::format(", {} virtual stages per pipeline rank", vpp).c_str() : "",
               sp ? ", sequence parallel" : "", dist_opt ? ", distributed optimizer" : "", static_cast<long long>(mbs),
               static_cast<long long>(plan.num_microbatches), static_cast<long long>(dp), static_cast<long long>(gbs),
               static_cast<long long>(train_iters), static_cast<long long>(iteration),
               (job.precision.half() && job.precision.fp32_residual_connection
                    ? fmt::format("{} with an fp32 residual stream", job.precision.name())
                    : std::string(job.precision.name()))
                   .c_str(),
               cfg.device == "cuda" ? fmt::format("on CUDA ({}{})", backend_info().cuda_name,
                                                  world > 1 ? ", " + group_kind + " groups" : "").c_str()
                                    : fmt::format("{} thread{} per rank", num_threads(), num_threads() == 1 ? "" : "s").c_str());
  if (world > 1) {
    // The layout, once: every group of the kinds this build uses.
    for (auto kind : {parallel::GroupKind::kTensor, parallel::GroupKind::kContext, parallel::GroupKind::kPipeline,
                      parallel::GroupKind::kData, parallel::GroupKind::kEmbedding, parallel::GroupKind::kExpert,
                      parallel::GroupKind::kExpertData}) {
      if (kind == parallel::GroupKind::kEmbedding &&
          (pp == 1 || (mc.untie_embeddings_and_output_weights && !mc.mtp_layers())))
        continue;
      if (kind == parallel::GroupKind::kContext && cp == 1) continue;
      if ((kind == parallel::GroupKind::kExpert && ep == 1) ||
          (kind == parallel::GroupKind::kExpertData && ep == 1 && !expert_grid))
        continue;
      std::string line;
      for (const auto& g : plan.grid->groups(kind)) {
        line += line.empty() ? "" : " ";
        line += "[";
        for (size_t i = 0; i < g.size(); ++i) line += (i ? "," : "") + std::to_string(g[i]);
        line += "]";
      }
      std::fprintf(out, "  %s groups: %s\n", parallel::group_kind_name(kind), line.c_str());
    }
    if (pp > 1) {
      std::string split;
      for (const auto& ch : plan.chunks)
        split += fmt::format("{}pp {} chunk {}: layers {}-{}", split.empty() ? "" : "; ", ch.pp_rank, ch.chunk,
                             ch.first_layer, ch.first_layer + ch.num_layers - 1);
      std::fprintf(out, "  stages: %s; schedule %s, bubble %.3f (formula %.3f)\n", split.c_str(),
                   parallel::schedule_kind_name(schedule->kind), plan.bubble_simulated, plan.bubble_formula);
    }
  }
  for (const auto& line : job.compat.no_effect) std::fprintf(out, "accepted with no effect here: %s\n", line.c_str());
  if (stepped) {
    // The batches this run uses (from a resumed checkpoint's samples on),
    // and how many of the schedule's steps it does not reach.
    const std::vector<plan::BatchStep>& used = plan.batch_steps_used.empty() ? plan.batch_steps : plan.batch_steps_used;
    std::string steps;
    for (const plan::BatchStep& st : used)
      steps += fmt::format("{}{} ({} micro-batches) from {} samples", steps.empty() ? "" : ", ", st.batch,
                           st.batch / (mbs * dp), st.threshold);
    // Steps of the schedule whose range [threshold, next threshold) misses
    // the samples this run consumes, [its first batch's start, --train-samples).
    const int64_t from = used.empty() ? 0 : used.front().threshold;
    size_t unused = 0;
    for (size_t k = 0; k < plan.batch_steps.size(); ++k) {
      const int64_t end = k + 1 < plan.batch_steps.size() ? plan.batch_steps[k + 1].threshold : INT64_MAX;
      if (!(plan.batch_steps[k].threshold < *cfg.train_samples && end > from)) ++unused;
    }
    std::fprintf(out, "global batch by --step-batch-size-schedule: %s%s; %lld iterations reach --train-samples %lld "
                      "(%lld samples)\n",
                 steps.c_str(),
                 unused ? fmt::format(" ({} other step{} of the schedule lie{} outside this run)", unused, unused == 1 ? "" : "s", unused == 1 ? "s" : "").c_str()
                        : "",
                 static_cast<long long>(train_iters), static_cast<long long>(*cfg.train_samples),
                 static_cast<long long>(scheduled.samples));
  }
  if (plan.requested_global_batch != gbs && !stepped)
    std::fprintf(out, "--decrease-batch-size-if-needed: training on a global batch of %lld, the %lld asked for rounded "
                      "down to a multiple of micro-batch x DP = %lld (each iteration skips %lld samples)\n",
                 static_cast<long long>(gbs), static_cast<long long>(plan.requested_global_batch),
                 static_cast<long long>(mbs * dp), static_cast<long long>(plan.requested_global_batch - gbs));
  if (eval_gbs != gbs && do_eval)
    std::fprintf(out, "validation batch %lld (%lld micro-batches per iteration)\n", static_cast<long long>(eval_gbs),
                 static_cast<long long>(M_eval));
  if (unigram_ppl) std::fprintf(out, "unigram baseline on the validation batches: perplexity %.2f\n", *unigram_ppl);
  std::fflush(out);

  if (cfg.log_progress && !cfg.save.empty() && rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.save, ec);
    if (Status ps = ProgressLog(cfg.save, world).append("Starting job"); !ps)
      std::fprintf(stderr, "warning: %s\n", ps.message().c_str());
  }

  // ---- 6. Save / evaluate helpers.
  // Every rank writes into the same temporary directory: rank 0's pid names it.
  int64_t tag_pid = static_cast<int64_t>(::getpid());
  world_comm->broadcast(Tensor(&tag_pid, {1}, DType::kI64), 0);
  const std::string save_tag = std::to_string(tag_pid);
  // --log-progress (Megatron's progress.txt; rank 0; needs --save, as there).
  const ProgressLog progress = cfg.log_progress && !cfg.save.empty() && rank == 0
                                   ? ProgressLog(cfg.save, world) : ProgressLog();
  const double job_flops_start = flops_so_far;
  auto save = [&](int64_t it) -> Status {
    nlohmann::json common;
    common["iteration"] = it;
    common["consumed_train_samples"] = consumed_train;
    common["consumed_valid_samples"] = consumed_valid;
    if (skipped_train > 0) common["skipped_train_samples"] = skipped_train;
    common["num_floating_point_operations_so_far"] = flops_so_far;
    common["opt_param_scheduler"] = sched.state_json();
    common["optimizer"] = {{"name", optim::optimizer_name(opt.config().kind)}, {"step", opt.step_count()}};
    if (opt.config().kind == optim::OptimizerKind::kSgd) {
      common["optimizer"]["sgd_momentum"] = opt.config().sgd_momentum;
    } else {
      common["optimizer"]["adam_beta1"] = opt.config().beta1;
      common["optimizer"]["adam_beta2"] = opt.config().beta2;
      common["optimizer"]["adam_eps"] = opt.config().eps;
    }
    if (scaler) common["optimizer"]["grad_scaler"] = scaler->state_json();
    if (!cfg.no_save_rng)
      common["rng_state"] = {{"seed", cfg.seed}, {"kind", "philox4x32-10 keyed by (seed, global micro-batch index)"}};
    common["args"] = args_to_json(cfg, argv);
    common["parallel"] = {{"tensor_model_parallel_size", tp}, {"data_parallel_size", dp}, {"sequence_parallel", sp},
                          {"context_parallel_size", cp}, {"expert_model_parallel_size", ep},
                          {"expert_tensor_parallel_size", plan.etp},
                          {"use_distributed_optimizer", dist_opt}, {"world_size", world}};
    wait_params();
    auto slices =
        checkpoint::training_state_slices(model, cfg.no_save_optim ? nullptr : &opt, std::nullopt, grad_comm.rank() == 0,
                                          expert_dp_comm.rank() == 0);
    // --save-retain-interval (Megatron's iter_finalize_fn): the checkpoint
    // the tracker names before this save.
    std::optional<int64_t> previous;
    if (cfg.save_retain_interval && rank == 0)
      if (auto t = checkpoint::read_tracker(cfg.save); t.is_ok() && *t) previous = **t;
    const auto t0 = Clock::now();
    checkpoint::SaveOptions so_opts;
    so_opts.tmp_tag = save_tag;
    so_opts.commit = world == 1;
    so_opts.verify_integrity = cfg.verify_integrity;
    Status st = checkpoint::save_checkpoint(cfg.save, it, slices, common, rank, world, so_opts);
    if (!st) return st;
    if (world > 1) {
      world_comm->barrier();  // every rank file is complete
      if (rank == 0) MT_RETURN_IF_ERROR(checkpoint::commit_checkpoint(cfg.save, it, world, so_opts));
      world_comm->barrier();  // committed before anyone goes on (or exits)
    }
    bar.clear();
    std::fprintf(out, "saved checkpoint %s/%s in %.0f ms\n", cfg.save.c_str(), checkpoint::iteration_dir_name(it).c_str(),
                 std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    std::fflush(out);
    if (progress.enabled())
      if (Status ps = progress.saved_checkpoint(it, flops_so_far, job_flops_start,
                                                std::chrono::duration<double>(Clock::now() - job_start).count(),
                                                consumed_train * seq);
          !ps)
        std::fprintf(stderr, "warning: %s\n", ps.message().c_str());
    // Then that previous checkpoint goes unless it is a multiple of the
    // interval (or this very iteration, saved again); a symbolic link stays.
    // A failed deletion is reported and training goes on, as in Megatron.
    if (previous && *previous > 0 && *previous != it && *previous % *cfg.save_retain_interval != 0) {
      const std::string dir = cfg.save + "/" + checkpoint::iteration_dir_name(*previous);
      std::error_code ec;
      const auto st = std::filesystem::symlink_status(dir, ec);
      if (!std::filesystem::is_directory(st) && !std::filesystem::is_symlink(st)) {
        std::fprintf(stderr, "warning: could not delete checkpoint %s (--save-retain-interval): not a directory\n",
                     dir.c_str());
      } else if (std::filesystem::is_symlink(st)) {
        std::fprintf(out, "skipping deleting checkpoint from iteration %lld at %s since it is a symbolic link\n",
                     static_cast<long long>(*previous), cfg.save.c_str());
      } else if (std::filesystem::remove_all(dir, ec); ec) {
        std::fprintf(stderr, "warning: could not delete checkpoint %s (--save-retain-interval): %s\n", dir.c_str(),
                     ec.message().c_str());
      } else {
        std::fprintf(out, "deleted checkpoint %s (--save-retain-interval %lld)\n", dir.c_str(),
                     static_cast<long long>(*cfg.save_retain_interval));
        if (progress.enabled())
          if (Status ps = progress.append(fmt::format("Deleted checkpoint\tIteration: {}", *previous)); !ps)
            std::fprintf(stderr, "warning: %s\n", ps.message().c_str());
      }
    }
    return Status::ok();
  };
  // The loss Megatron reports (training and validation): the counted tokens'
  // losses summed over the global batch, over their number. The losses live
  // on the last stage (summed over the pipeline); every stage counts the
  // tokens, so only DP (x CP: each CP rank has its positions') sums them.
  // Returns {loss, the global batch's counted tokens}.
  auto reported_loss = [&](const LossTotals& t) {
    double sum = pp > 1 ? pp_comm.all_reduce_scalar(t.loss) : t.loss, tokens = t.tokens;
    sum = grad_comm.all_reduce_scalar(sum);
    if (gdp > 1) tokens = grad_comm.all_reduce_scalar(tokens);
    return std::pair<double, double>{tokens > 0 ? sum / tokens : 0.0, tokens};
  };
  auto evaluate = [&](int64_t it) -> Result<double> {
    wait_params();
    data::DataLoader vl((*sources)[1], mbs, dp_rank, dp, consumed_valid, so, sampler);
    LossTotals sum;
    for (int64_t e = 0; e < cfg.eval_iters; ++e) {
      std::vector<Batch> batches(static_cast<size_t>(M_eval));
      std::vector<MicroBatchInput> inputs(static_cast<size_t>(M_eval));
      for (int64_t m = 0; m < M_eval; ++m) {
        auto mb = vl.next();
        if (!mb) return mb.status();
        batches[static_cast<size_t>(m)] = to_model_batch(*mb, so);
        inputs[static_cast<size_t>(m)] = batches[static_cast<size_t>(m)].input(0);
      }
      const LossTotals t = executor.run_forward(inputs);
      sum.loss += t.loss, sum.tokens += t.tokens;
    }
    consumed_valid = vl.consumed_samples();
    const double loss = reported_loss(sum).first;
    bar.clear();
    std::fprintf(out, "---------------------------------------------------------------------------------------------\n"
                      " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E%s\n"
                      "---------------------------------------------------------------------------------------------\n",
                 static_cast<long long>(it), loss, std::exp(loss),
                 unigram_ppl ? fmt::format(" | unigram baseline PPL: {:.6E}", *unigram_ppl).c_str() : "");
    std::fflush(out);
    metrics.append({{"iteration", it}, {"valid_lm_loss", loss}, {"valid_ppl", std::exp(loss)}});
    if (tb.is_open()) {
      tb_pair("lm loss validation", loss, it, consumed_train);
      if (cfg.log_validation_ppl_to_tensorboard)
        tb_pair("lm loss validation ppl", std::exp(std::min(20.0, loss)), it, consumed_train);
    }
    return loss;
  };

  if (cfg.exit_signal_handler) install_stop_signal_handler(SIGTERM);
  const char* nan_env = std::getenv("MEGATRON_CPP_TEST_NAN_ITERATION");  // test hook: poison a weight
  const int64_t nan_at = nan_env ? std::atoll(nan_env) : -1;

  // --check-weight-hash-across-dp-replicas-interval: the data-parallel
  // replicas hold the same parameters (checked before the loop, as Megatron
  // does, and after every N-th iteration).
  auto check_weight_hashes = [&](int64_t it) -> Status {
    wait_params();
    const std::vector<std::string> differ = opt.params_differing_across_replicas();
    if (!differ.empty()) {
      std::string names;
      for (size_t k = 0; k < differ.size() && k < 8; ++k) names += (k ? ", " : "") + differ[k];
      if (differ.size() > 8) names += fmt::format(" and {} more", differ.size() - 8);
      return Status::internal(fmt::format(
          "--check-weight-hash-across-dp-replicas-interval: parameter hashes do not match across the data-parallel "
          "replicas after iteration {} ({} of this stage: {}); the replicas have parted, so the run stops (resume "
          "from the last checkpoint)",
          it, differ.size(), names));
    }
    bar.clear();
    std::fprintf(out, ">>> Weight hashes match after %lld iterations...\n", static_cast<long long>(it));
    return Status::ok();
  };
  if (cfg.check_weight_hash_interval) MT_RETURN_IF_ERROR(check_weight_hashes(iteration));

  // ---- 7. The loop.
  TrainResult result;
  result.exit_reason = "done";
  const auto start = Clock::now();
  const int64_t first_iteration = iteration;
  auto interval_start = Clock::now();
  double interval_loss = 0, interval_wait = 0, interval_lb = 0, interval_z = 0, interval_flops = 0;
  std::vector<double> interval_mtp(static_cast<size_t>(mc.mtp_layers()), 0.0);
  std::vector<double> mtp_correct_so_far, mtp_total_so_far;  // the acceptance counts since this process started
  int64_t interval_samples = 0;
  int64_t last_saved = -1;  // the iteration last saved (a batch change saves, as Megatron does)
  double bubble_simulated = plan.bubble_simulated, bubble_formula = plan.bubble_formula;  // of the schedule in force
  const bool moe_lb_active = mc.moe_aux_loss_active();
  const char* lb_name = mc.seq_aux_loss() ? "seq_load_balancing_loss" : "load_balancing_loss";  // Megatron's names
  int64_t interval_iters = 0, interval_advanced = 0, skipped = 0, nan_iters = 0;
  std::optional<double> last_norm = 0.0;  // none after a skipped iteration
  const char* kill_env = std::getenv("MEGATRON_CPP_TEST_KILL");  // test hook: "rank:iteration" dies mid-iteration
  int kill_rank = -1;
  int64_t kill_iteration = -1;
  if (kill_env) std::sscanf(kill_env, "%d:%lld", &kill_rank, reinterpret_cast<long long*>(&kill_iteration));
  const char* fail_env = std::getenv("MEGATRON_CPP_TEST_FAIL");  // test hook: "rank:iteration" returns an error
  int fail_rank = -1;
  int64_t fail_iteration = -1;
  if (fail_env) std::sscanf(fail_env, "%d:%lld", &fail_rank, reinterpret_cast<long long*>(&fail_iteration));
  const bool overlap_grads = static_cast<bool>(buckets) && job.parallel.overlap_grad_reduce;
  std::vector<char> gathered(static_cast<size_t>(mc.num_layers + 2), 0);  // stages -1..L waited this iteration
  // Time per op (core/op_profile.h): with MT_PROFILE_OPS from the end of the
  // first iteration to the end of the run; with --profile (which takes its
  // place) the steps after --profile-step-start completed iterations up to
  // iteration --profile-step-end, as Megatron's nsys range, on the ranks of
  // --profile-ranks (default all). The table goes to the log (rank 0) or to
  // stderr (other ranks), and to the metrics file.
  bool profile_this_rank = cfg.profile && cfg.profile_ranks.empty();
  for (const std::string& r : cfg.profile_ranks) profile_this_rank |= std::atoll(r.c_str()) == rank;
  const bool profiling = profile::enabled() && !cfg.profile;
  if (cfg.profile) profile::set_enabled(false);  // --profile times its window only
  int64_t profiled_from = -1;
  Clock::time_point profile_start;
  auto report_profile = [&](int64_t first, int64_t n) {
    const std::vector<profile::OpStat> stats = profile::collect();
    const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - profile_start).count();
    const std::string table = profile::table(stats, n, wall_ms);
    bar.clear();
    if (rank == 0) std::fprintf(out, "%s", table.c_str());
    else if (cfg.profile)
      std::fprintf(stderr, "rank %d, iterations %lld-%lld:\n%s", rank, static_cast<long long>(first),
                   static_cast<long long>(first + n - 1), table.c_str());
    nlohmann::json ops = nlohmann::json::array();
    for (const profile::OpStat& st : stats)
      ops.push_back({{"op", st.op}, {"device", st.device == Device::kCuda ? "cuda" : "cpu"}, {"calls", st.calls},
                     {"ms", st.ms}, {"flops", st.flops}});
    metrics.append({{"kind", "op_profile"}, {"iterations", n}, {"first_iteration", first}, {"wall_ms", wall_ms},
                    {"ops", ops}});
  };
  bool profile_window = false;  // --profile: between its start and end step
  auto close_profile_window = [&](int64_t last) {
    if (!profile_window) return;
    profile_window = false;
    if (cfg.device == "cuda") device_profiler_capture(false);
    report_profile(profiled_from, last - profiled_from + 1);
    profile::set_enabled(false);
  };
  while (iteration < train_iters) {
    const int64_t it = iteration + 1;
    if (profile_this_rank && iteration == cfg.profile_step_start) {
      profile::set_enabled(true);
      profile::reset();
      profile_window = true;
      profile_start = Clock::now();
      profiled_from = it;
      if (cfg.device == "cuda") device_profiler_capture(true);
    }
    if (it == nan_at) {
      float nan = std::nanf("");
      copy_tensor(Tensor(&nan, {1}, DType::kF32), model.params()[0].view({model.params()[0].numel()}).slice(0, 1));
    }
    model.zero_grads();
    tp_comm.reset_stats();
    grad_comm.reset_stats();
    if (ep > 1 || expert_grid) expert_dp_comm.reset_stats(), ep_comm.reset_stats();
    if (cp > 1) groups.cp().reset_stats();
    pp_comm.reset_stats();
    if (groups.embedding()) groups.embedding()->reset_stats();
    if (gather_pending) {
      // --overlap-param-gather: the first forward of each stage's parameters
      // waits for their all-gather just before using them.
      std::fill(gathered.begin(), gathered.end(), 0);
      model.set_forward_hook([&](int stage) {
        char& done = gathered[static_cast<size_t>(stage + 1)];
        if (done) return;
        done = 1;
        buckets.wait_param_gather(stage);
        if (job.precision.half()) model.sync_low_precision(stage);
      });
    }
    // This iteration's global batch (--step-batch-size-schedule: the step in
    // force at the samples consumed so far). Megatron saves a checkpoint
    // before the first iteration with another number of micro-batches.
    const int64_t gbs_it = batch_for(consumed_train), M = gbs_it / (mbs * dp);
    // Megatron's checks of the batch in force, every iteration: it divides by
    // micro-batch x DP and (within a run) never has fewer micro-batches. The
    // planner checked the batches between the resumed samples and
    // --train-samples; a run resumed off the schedule's path can meet others.
    if (stepped && (gbs_it % (mbs * dp) != 0 || gbs_it > gbs ||
                    (it > first_iteration + 1 && M < executor.microbatches())))
      return Status::invalid(fmt::format(
          "--step-batch-size-schedule: at iteration {} ({} samples consumed) the global batch is {}, {}", it,
          consumed_train, gbs_it,
          gbs_it % (mbs * dp) != 0 ? fmt::format("not a multiple of micro-batch {} x DP {}", mbs, dp)
          : gbs_it > gbs           ? fmt::format("above the {} the run was planned for", gbs)
                                   : fmt::format("fewer micro-batches than the {} before (Megatron stops there too)",
                                                 executor.microbatches())));
    if (M != executor.microbatches()) {
      if (it > first_iteration + 1 && !cfg.save.empty() && last_saved != iteration) {
        MT_RETURN_IF_ERROR(save(iteration));
        last_saved = iteration;
      }
      auto next = schedule_for(M);
      if (!next) return next.status();
      executor.set_schedule(*next);
      if (pp > 1) {  // the log's bubble figures, for this number of micro-batches (as the planner computes them)
        bubble_formula = parallel::bubble_formula(pp, vpp, M);
        bubble_simulated = parallel::simulate(*next, 1.0 / static_cast<double>(vpp), 2.0 / static_cast<double>(vpp)).bubble_fraction;
      }
      if (stepped && it > first_iteration + 1) {
        bar.clear();
        std::fprintf(out, "global batch %lld from iteration %lld (%lld samples consumed): %lld micro-batches\n",
                     static_cast<long long>(gbs_it), static_cast<long long>(it), static_cast<long long>(consumed_train),
                     static_cast<long long>(M));
      }
    }
    // The iteration's micro-batches (every stage reads them: the first needs
    // the tokens, the last the labels).
    std::vector<Batch> batches(static_cast<size_t>(M));
    std::vector<MicroBatchInput> inputs(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
      auto mb = train_loader.next();
      if (!mb) return mb.status();
      batches[static_cast<size_t>(m)] = to_model_batch(*mb, so);
      // The global micro-batch index: the same masks as a single rank running
      // all M x DP micro-batches (data-parallel rank r's m-th is number m x DP + r),
      // counted from the micro-batches consumed before this iteration (whatever
      // global batches they came in: --step-batch-size-schedule, a resume
      // with another --global-batch-size).
      inputs[static_cast<size_t>(m)] = batches[static_cast<size_t>(m)].input(
          static_cast<uint64_t>(consumed_train / mbs + m * dp + dp_rank));
    }
    if (rank == fail_rank && it == fail_iteration)
      return Status::io_error(fmt::format("injected failure at iteration {} (MEGATRON_CPP_TEST_FAIL)", it));
    bool armed = false;
    // Loss scale 1 / (M x DP): summing over DP gives the mean gradient.
    // With CP, 1 / (M x DP x CP): each CP rank's loss is the mean over its
    // own counted labels, and the DP x CP sum averages them (Megatron's
    // gradient scaling over the dp-cp group).
    // Per-token loss: each micro-batch's loss sum, divided below by the
    // tokens of the whole global batch.
    // The router losses' gradients (--num-experts): Megatron's scale,
    // 1 / (M x DP) (each CP rank holds a share of a micro-batch's), or under
    // --calculate-per-token-loss the micro-batch's tokens, divided with every
    // gradient by the global batch's counted tokens below.
    // Loss scaling (--fp16, --loss-scale): every backward starts from the
    // scale times these, the router losses' included (Megatron's
    // grad_scale_func and MoE aux-loss scale).
    const double S = scaler ? static_cast<double>(scaler->scale()) : 1.0;
    if (mc.is_moe())
      model.set_moe_loss_scale(S * (cfg.calculate_per_token_loss ? static_cast<double>(mbs * seq)
                                                                 : 1.0 / static_cast<double>(M * dp)));
    const LossTotals totals = executor.run_train(
        inputs, S * (cfg.calculate_per_token_loss ? 1.0 : 1.0 / static_cast<double>(M * gdp)),
        cfg.calculate_per_token_loss ? LossReduction::kSum : LossReduction::kMean,
        [&](int m, int) {
          if (rank == kill_rank && it == kill_iteration) std::raise(SIGKILL);
          if (!overlap_grads || m + 1 != M) return;
          // The last micro-batch's backward of a chunk finalises its
          // gradients: buckets launch as their stages report in.
          if (!armed) buckets.begin_last_backward(), armed = true;
          model.set_backward_hook([&](int stage) {
            // A tied embedding shared by the first and last stage is reduced
            // over the embedding group first (below), then in finish().
            if (stage == -1 && shared_embedding) return;
            buckets.mark_ready(stage);
          });
        },
        [&](int, int) { model.set_backward_hook(nullptr); });
    model.set_forward_hook(nullptr);
    if (gather_pending) {
      // Every gather this rank started is complete, and every stage's bf16
      // copy is fresh, before anything else reads the parameters.
      buckets.wait_param_gather_all();
      if (job.precision.half())
        for (int st = -1; st <= static_cast<int>(mc.num_layers); ++st)
          if (!gathered[static_cast<size_t>(st + 1)]) model.sync_low_precision(st);
      gather_pending = false;
    }
    // Tied embeddings split over the pipeline: first and last stage sum their
    // word-embedding gradients (Megatron's embedding group all-reduce).
    if (shared_embedding) groups.embedding()->all_reduce(model.grad("embedding.word_embeddings.weight"));
    buckets.finish();
    // --moe-router-enable-expert-bias: Megatron's update in finalize_model_grads,
    // from the iteration's tokens per expert summed over DP x CP.
    if (mc.has_expert_bias()) model.update_expert_bias(&grad_comm);
    model.reduce_tp_replicated_grads();
    const auto [loss, global_tokens] = reported_loss(totals);
    // Megatron's finalize_model_grads under --calculate-per-token-loss: every
    // gradient / the global batch's counted tokens (each stage counts them
    // from the labels; summed over DP x CP).
    if (cfg.calculate_per_token_loss) kernels::scale_inplace(model.flat_grads(), 1.0 / std::max(1.0, global_tokens));
    // Unscaled as Megatron's optimizer does (x 1/scale in fp32), then one
    // inf/NaN test over every rank's gradients.
    if (scaler && scaler->inv_scale() != 1.0f) kernels::scale_inplace(model.flat_grads(), scaler->inv_scale());
    const bool grads_ok = opt.grads_finite();
    // (Megatron stops on an inf or NaN gradient too, a constant --loss-scale's
    // included; dynamic scaling has turned the check off above.)
    if (cfg.check_for_nan_in_loss_and_grad && (!std::isfinite(loss) || !grads_ok)) {
      bar.clear();
      return Status::invalid(fmt::format("NaN or Inf found in the {} at iteration {} (the run stops, as Megatron's "
                                         "does; --no-check-for-nan-in-loss-and-grad keeps training)",
                                         std::isfinite(loss) ? "gradients" : "loss", it));
    }
    // With a grad scaler an inf or NaN gradient skips the step: no update,
    // no scheduler step (Megatron's update_successful false), the scale moves.
    const bool skip = scaler && !grads_ok;
    if (scaler) scaler->update(!grads_ok);
    std::optional<int64_t> num_zeros;
    std::optional<double> params_norm;
    if (skip) {
      ++skipped;
      if (!std::isfinite(loss)) ++nan_iters;  // Megatron counts a skipped iteration's non-finite loss
      last_norm.reset();
    } else {
      if (!scaler && (!grads_ok || !std::isfinite(loss))) ++nan_iters;
      last_norm = opt.clip_grad_norm(cfg.clip_grad);
      if (cfg.log_num_zeros_in_grad) num_zeros = opt.grad_zeros();
      opt.step(sched);
      gather_pending = po.overlap_param_gather;
      sched.step(gbs_it);
      interval_loss += loss;
      ++interval_advanced;
    }
    // Every iteration, skipped or not (Megatron's calc_params_l2_norm).
    if (cfg.log_params_norm) params_norm = opt.params_norm();
    consumed_train += gbs_it;
    // Megatron's skipped_train_samples: the global batch asked for minus the
    // one trained on (--decrease-batch-size-if-needed).
    if (!stepped) skipped_train += plan.requested_global_batch - gbs_it;
    // Megatron's FLOPs formula is linear in the batch (plan: the last step's).
    const double flops_it = flops_per_iter * static_cast<double>(gbs_it) / static_cast<double>(gbs);
    flops_so_far += flops_it;
    interval_flops += flops_it;
    interval_samples += gbs_it;
    iteration = it;
    result.iteration = it;
    result.last_loss = loss;
    std::optional<double> lb_loss, z_loss;
    struct LayerLosses {
      int64_t layer;
      double load_balancing, z;
    };
    std::vector<LayerLosses> moe_layer_losses;  // --moe-per-layer-logging
    if (mc.is_moe()) {
      // Per layer and micro-batch, over the whole model: every rank's sums
      // (TP ranks alike, CP ranks' shares adding up to the micro-batch's).
      const model::GPTModel::MoeStats ms = model.take_moe_stats();
      const double n = world_comm->all_reduce_scalar(ms.layer_forwards) / static_cast<double>(cp);
      // Logged as Megatron logs them: the load-balancing loss while it
      // trains (type aux_loss, coefficient > 0), the z-loss with its flag.
      if (moe_lb_active) lb_loss = world_comm->all_reduce_scalar(ms.load_balancing) / std::max(1.0, n);
      if (mc.moe_z_loss_coeff) z_loss = world_comm->all_reduce_scalar(ms.z) / std::max(1.0, n);
      interval_lb += lb_loss.value_or(0.0), interval_z += z_loss.value_or(0.0);
      if (cfg.moe_per_layer_logging) {
        // --moe-per-layer-logging: each MoE layer's losses, summed over the
        // ranks (a layer lives on one pipeline stage) and divided by its
        // micro-batch forwards (TP ranks alike, CP ranks' shares adding up).
        // The MTP layers are layers L.. (Megatron's tracker numbers them so).
        const size_t L = static_cast<size_t>(mc.total_layers());
        std::vector<double> v(3 * L, 0.0);
        for (size_t l = 0; l < L && ms.layer_micro_batches.size() == L; ++l)
          v[l] = ms.layer_load_balancing[l], v[L + l] = ms.layer_z[l], v[2 * L + l] = ms.layer_micro_batches[l];
        world_comm->all_reduce(Tensor(v.data(), {static_cast<int64_t>(3 * L)}, DType::kF64));
        moe_layer_losses.clear();
        for (size_t l = 0; l < L; ++l) {
          if (!mc.is_moe_layer(static_cast<int64_t>(l))) continue;
          const double c = std::max(1.0, v[2 * L + l] / static_cast<double>(cp));
          moe_layer_losses.push_back({static_cast<int64_t>(l), v[l] / c, v[L + l] / c});
        }
      }
    }
    std::vector<double> mtp_losses, mtp_accept, mtp_accept_cum;  // --mtp-num-layers: this iteration's, per depth
    if (mc.mtp_layers()) {
      // Megatron's MTPLossLoggingHelper: each depth's per-micro-batch means
      // over the micro-batches, averaged over DP x CP. The last stage's
      // ranks hold them (TP ranks alike): sums over the world, divided by
      // their micro-batches.
      // And the acceptance counts (Megatron's mtp_k_acceptance_rate, and
      // the cumulative rate since this process started, as its tracker).
      model::GPTModel::MtpStats st = model.take_mtp_stats();
      const size_t D = static_cast<size_t>(mc.mtp_layers());
      std::vector<double> v(3 * D + 1, 0.0);
      for (size_t k = 0; k < st.loss.size(); ++k) v[k] = st.loss[k], v[D + k] = st.correct[k], v[2 * D + k] = st.total[k];
      v.back() = st.micro_batches;
      world_comm->all_reduce(Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::kF64));
      mtp_correct_so_far.resize(D, 0.0), mtp_total_so_far.resize(D, 0.0);
      for (size_t k = 0; k < D; ++k) {
        mtp_losses.push_back(v[k] / std::max(1.0, v.back()));
        interval_mtp[k] += mtp_losses.back();
        mtp_correct_so_far[k] += v[D + k], mtp_total_so_far[k] += v[2 * D + k];
        mtp_accept.push_back(100 * v[D + k] / std::max(1.0, v[2 * D + k]));
        mtp_accept_cum.push_back(100 * mtp_correct_so_far[k] / std::max(1.0, mtp_total_so_far[k]));
      }
    }
    interval_wait += executor.last_wait_seconds();
    ++interval_iters;
    const double tp_bytes = static_cast<double>(tp_comm.stats().bytes);
    // The gradients: the non-expert ones over DP x CP, the experts' over the expert DP group.
    const double dp_bytes = static_cast<double>(grad_comm.stats().bytes) +
                            (ep > 1 || expert_grid ? static_cast<double>(expert_dp_comm.stats().bytes) : 0.0);
    const double cp_bytes = cp > 1 ? static_cast<double>(groups.cp().stats().bytes) : 0.0;
    const double ep_bytes = ep > 1 ? static_cast<double>(ep_comm.stats().bytes) : 0.0;
    const double pp_bytes = static_cast<double>(pp_comm.stats().bytes) +
                            (groups.embedding() ? static_cast<double>(groups.embedding()->stats().bytes) : 0.0);
    nlohmann::json row = {{"iteration", it}, {"lm_loss", loss}, {"learning_rate", sched.lr()},
                          {"consumed_samples", consumed_train}, {"tp_bytes", tp_bytes}, {"dp_bytes", dp_bytes},
                          {"pp_bytes", pp_bytes}};
    if (last_norm) row["grad_norm"] = *last_norm;
    if (scaler) row["loss_scale"] = scaler->scale(), row["skipped"] = skip;
    if (cp > 1) row["cp_bytes"] = cp_bytes;
    if (ep > 1) row["ep_bytes"] = ep_bytes;
    if (lb_loss) row[lb_name] = *lb_loss;
    if (z_loss) row["z_loss"] = *z_loss;
    for (size_t k = 0; k < mtp_losses.size(); ++k) {
      row[fmt::format("mtp_{}_loss", k + 1)] = mtp_losses[k];
      row[fmt::format("mtp_{}_acceptance_rate", k + 1)] = mtp_accept[k];
      row[fmt::format("mtp_{}_cumulative_acceptance_rate", k + 1)] = mtp_accept_cum[k];
    }
    for (const LayerLosses& x : moe_layer_losses) {
      if (lb_loss) row[fmt::format("{}_layer_{}", lb_name, x.layer)] = x.load_balancing;
      if (z_loss) row[fmt::format("z_loss_layer_{}", x.layer)] = x.z;
    }
    if (tb.is_open()) {  // Megatron's MoE tracker writes every iteration: the means, and per layer under moe/
      if (lb_loss) tb.add_scalar(lb_name, *lb_loss, it);
      if (z_loss) tb.add_scalar("z_loss", *z_loss, it);
      for (size_t k = 0; k < mtp_losses.size(); ++k) {
        tb.add_scalar(fmt::format("mtp_{} loss", k + 1), mtp_losses[k], it);
        tb.add_scalar(fmt::format("mtp_{}_acceptance_rate", k + 1), mtp_accept[k], it);
        tb.add_scalar(fmt::format("mtp_{}_cumulative_acceptance_rate", k + 1), mtp_accept_cum[k], it);
      }
      for (const LayerLosses& x : moe_layer_losses) {
        if (lb_loss) tb.add_scalar(fmt::format("moe/{}_layer_{}", lb_name, x.layer), x.load_balancing, it);
        if (z_loss) tb.add_scalar(fmt::format("moe/z_loss_layer_{}", x.layer), x.z, it);
      }
    }
    if (params_norm) row["params_norm"] = *params_norm;
    if (num_zeros) row["num_zeros"] = *num_zeros;
    metrics.append(row);
    if (tb.is_open() && it % cfg.tensorboard_log_interval == 0) {  // Megatron's training_log scalars
      tb_pair("learning-rate", sched.lr(), it, consumed_train);
      if (skipped_train > 0) tb.add_scalar("skipped-train-samples", static_cast<double>(skipped_train), it);
      tb_pair("batch-size", static_cast<double>(gbs_it), it, consumed_train);
      tb_pair("lm loss", loss, it, consumed_train);
      if (cfg.log_loss_scale_to_tensorboard)
        tb_pair("loss-scale", scaler ? static_cast<double>(scaler->scale()) : 1.0, it, consumed_train);
      if (cfg.log_world_size_to_tensorboard) tb_pair("world-size", static_cast<double>(world), it, consumed_train);
      if (last_norm) tb_pair("grad-norm", *last_norm, it, consumed_train);
      if (num_zeros) tb_pair("num-zeros", static_cast<double>(*num_zeros), it, consumed_train);
      if (params_norm) tb_pair("params-norm", *params_norm, it, consumed_train);
    }
    if (profiling && it == first_iteration + 1) {
      profile::reset();
      profile_start = Clock::now();
      profiled_from = it;
    }
    if (it == first_iteration + 1 && world > 1) {
      bar.clear();
      std::fprintf(out, "communication per rank per iteration: TP %.2f MB (planned %.2f MB), %s %.2f MB (planned %.2f MB), "
                        "PP %.2f MB (planned %.2f MB)%s%s\n",
                   tp_bytes / 1e6, plan.comm.tp_bytes / 1e6, cp > 1 ? "DP x CP" : "DP", dp_bytes / 1e6,
                   plan.comm.dp_bytes / 1e6, pp_bytes / 1e6, plan.comm.pp_bytes / 1e6,
                   cp > 1 ? fmt::format(", CP {:.2f} MB (planned {:.2f} MB)", cp_bytes / 1e6, plan.comm.cp_bytes / 1e6).c_str()
                          : "",
                   ep > 1 ? fmt::format(", EP {:.2f} MB (planned {:.2f} MB with balanced routing)", ep_bytes / 1e6,
                                        plan.comm.ep_bytes / 1e6)
                                .c_str()
                          : "");
    }

    const double secs_since_start = std::chrono::duration<double>(Clock::now() - start).count();
    if (it % cfg.log_interval == 0 || it == train_iters) {
      const double secs = std::chrono::duration<double>(Clock::now() - interval_start).count();
      IterationStats s;
      s.iteration = it, s.train_iters = train_iters, s.consumed_samples = consumed_train, s.skipped_samples = skipped_train;
      s.ms_per_iteration = 1000 * secs / static_cast<double>(interval_iters);
      // Megatron's average: the advanced (not skipped) iterations' losses.
      s.learning_rate = sched.lr(), s.global_batch_size = gbs_it,
      s.loss = interval_loss / static_cast<double>(std::max<int64_t>(1, interval_advanced));
      s.loss_scale = scaler ? static_cast<double>(scaler->scale()) : 1.0;
      s.advanced_iterations = interval_advanced;
      // (Megatron divides every tracked loss, the router's and the MTP
      // depths' too, by the interval's advanced iterations: skipped ones add
      // their values all the same.)
      const double advanced = static_cast<double>(std::max<int64_t>(1, interval_advanced));
      if (moe_lb_active) s.load_balancing_loss = interval_lb / advanced;
      s.load_balancing_name = lb_name;
      if (mc.moe_z_loss_coeff) s.z_loss = interval_z / advanced;
      for (double& x : interval_mtp) {
        s.mtp_losses.push_back(x / advanced);
        x = 0;
      }
      s.grad_norm = last_norm, s.params_norm = params_norm, s.num_zeros = num_zeros, s.skipped_iterations = skipped, s.nan_iterations = nan_iters;
      s.tokens_per_s = static_cast<double>(interval_samples * seq) / secs;
      s.tflops_per_device = interval_flops / secs / 1e12 / static_cast<double>(world);
      s.mfu = s.tflops_per_device / peak_tflops;
      s.planned_bytes = planned_bytes, s.measured_bytes = measured_bytes(), s.peak_rss_bytes = peak_rss_bytes();
      if (tb.is_open() && cfg.log_timers_to_tensorboard) {
        tb.add_scalar("iteration-time", s.ms_per_iteration / 1000, it);
        tb.add_scalar("throughput", s.tflops_per_device, it);
      }
      bar.clear();
      std::fprintf(out, "%s\n", format_log_line(s).c_str());
      if (pp > 1)
        std::fprintf(out, " pipeline rank 0 idle (blocked on neighbours): %.3f of the iteration | schedule bubble %.3f "
                          "(formula %.3f)\n",
                     interval_wait / secs, bubble_simulated, bubble_formula);
      std::fflush(out);
      nlohmann::json j = to_json(s);
      j["kind"] = "log";
      // Communication buffers alone (exactly planned; small beside the total).
      j["memory_comm_measured_bytes"] =
          static_cast<double>(buckets.buffer_bytes()) + static_cast<double>(executor.buffer_bytes());
      j["memory_comm_planned_bytes"] = plan.memory.trainer.comm;
      if (pp > 1) j["pipeline_idle_fraction"] = interval_wait / secs;
      metrics.append(j);
      interval_loss = 0, interval_iters = 0, interval_advanced = 0, skipped = 0, nan_iters = 0, interval_wait = 0, interval_lb = 0, interval_z = 0;
      interval_samples = 0, interval_flops = 0;
      interval_start = Clock::now();
    }
    bar.update(it, train_iters, secs_since_start / static_cast<double>(it - first_iteration), loss);

    // Megatron's post-step check that the data-parallel replicas still hold
    // the same parameters (a silent data corruption, or a bug, would part them).
    if (cfg.check_weight_hash_interval && it % *cfg.check_weight_hash_interval == 0)
      MT_RETURN_IF_ERROR(check_weight_hashes(it));

    if (do_eval && it % *cfg.eval_interval == 0) {
      auto v = evaluate(it);
      if (!v) return v.status();
      result.valid_loss = *v;
    }
    // --profile's window ends after its last step's logging and evaluation
    // (Megatron stops the profiler in its post-step callbacks).
    if (it == cfg.profile_step_end) close_profile_window(it);
    // A signal on any rank, or rank 0's clock, stops every rank at the same iteration.
    bool signal = cfg.exit_signal_handler && stop_requested();
    bool by_time = cfg.exit_duration_in_mins && secs_since_start / 60.0 > *cfg.exit_duration_in_mins;
    if (world > 1) {
      if (cfg.exit_signal_handler) signal = world_comm->all_reduce_scalar(signal ? 1 : 0, comm::ReduceOp::kMax) > 0;
      if (cfg.exit_duration_in_mins) {
        double t = by_time ? 1 : 0;
        Tensor tt(&t, {1}, DType::kF64);
        world_comm->broadcast(tt, 0);
        by_time = t > 0;
      }
    }
    const bool by_interval = cfg.exit_interval && it % *cfg.exit_interval == 0;
    const bool periodic = cfg.save_interval && it % *cfg.save_interval == 0;
    if (!cfg.save.empty() && (periodic || signal || by_interval || by_time)) {
      MT_RETURN_IF_ERROR(save(it));
      last_saved = it;
    }
    if (signal || by_interval || by_time) {
      result.exit_reason = signal ? "signal" : by_interval ? "exit-interval" : "duration";
      bar.finish();
      std::fprintf(out, "exiting at iteration %lld (%s)\n", static_cast<long long>(it), result.exit_reason.c_str());
      close_profile_window(it);
      return result;
    }
  }
  bar.finish();
  if (profiling && profiled_from >= 0 && iteration > profiled_from)
    report_profile(profiled_from + 1, iteration - profiled_from);
  close_profile_window(iteration);  // --profile-step-end beyond the run
  if (!cfg.save.empty() && (!cfg.save_interval || iteration % *cfg.save_interval != 0) && iteration > 0)
    MT_RETURN_IF_ERROR(save(iteration));
  wait_params();
  return result;
}

}  // namespace

}  // namespace mt::train
