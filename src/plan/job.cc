#include "plan/job.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/checked.h"

namespace mt::plan {

void register_job_flags(FlagSet& f, JobConfig& j) {
  constexpr int64_t kMaxRanks = int64_t{1} << 24;
  auto& p = j.parallel;
  f.section("parallel layout");
  f.add_int("world-size", &p.world_size, "number of ranks (GPUs); default: from mpirun, else one model replica", 1, kMaxRanks);
  f.add_int("tensor-model-parallel-size", &p.tp, "tensor-parallel size (TP)", 1, kMaxRanks);
  f.add_int("pipeline-model-parallel-size", &p.pp, "pipeline-parallel size (PP)", 1, kMaxRanks);
  f.add_int("context-parallel-size", &p.cp, "context-parallel size (CP)", 1, kMaxRanks);
  f.add_list("cp-comm-type", &p.cp_comm_type,
             "Megatron's CP attention exchange, one type or one per layer: p2p (default), a2a, allgather, a2a+p2p; "
             "the same attention whichever is given (this program all-gathers Q/K/V)");
  f.add_list("hierarchical-context-parallel-sizes", &p.hierarchical_cp_sizes,
             "Megatron's levels of the CP group for --cp-comm-type a2a+p2p (their product is CP); the same attention");
  f.add_int("expert-model-parallel-size", &p.ep, "expert-parallel size (EP)", 1, kMaxRanks);
  f.add_int("expert-tensor-parallel-size", &p.etp,
            "tensor-parallel size of expert layers (ETP); default TP (megatron train: TP, or 1 for whole experts)", 1,
            kMaxRanks);
  f.add_int("data-parallel-size", &p.dp, "data-parallel size (DP); derived as world/(TP*PP*CP) when absent", 1, kMaxRanks);
  f.add_int("num-layers-per-virtual-pipeline-stage", &p.num_layers_per_virtual_pipeline_stage, "layers per virtual stage (interleaved 1F1B)", 1, 1 << 16);
  f.add_int("num-virtual-stages-per-pipeline-rank", &p.num_virtual_stages_per_pipeline_rank, "model chunks per pipeline rank (interleaved 1F1B)", 1, 1 << 16);
  f.add_int("microbatch-group-size-per-virtual-pipeline-stage", &p.microbatch_group_size_per_vp_stage, "micro-batches per group in the interleaved schedule; default PP", 1, kMaxRanks);
  f.add_int("decoder-first-pipeline-num-layers", &p.decoder_first_pipeline_num_layers, "layers on the first pipeline stage (uneven split)", 0, 1 << 16);
  f.add_int("decoder-last-pipeline-num-layers", &p.decoder_last_pipeline_num_layers, "layers on the last pipeline stage (uneven split)", 0, 1 << 16);
  f.add_switch("account-for-embedding-in-pipeline-split", &p.account_for_embedding_in_pipeline_split, "count the embedding as a layer when splitting over PP");
  f.add_switch("account-for-loss-in-pipeline-split", &p.account_for_loss_in_pipeline_split, "count the loss as a layer when splitting over PP");
  f.add_switch("sequence-parallel", &p.sequence_parallel, "shard norms/dropout activations along the sequence over TP");
  f.add_switch("use-distributed-optimizer", &p.use_distributed_optimizer, "shard fp32 master weights and optimizer state over DP");
  f.add_switch("use-tp-pp-dp-mapping", &p.use_tp_pp_dp_mapping, "rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp");
  f.add_switch("overlap-grad-reduce", &p.overlap_grad_reduce, "overlap DP gradient reduction with backward");
  f.add_switch("overlap-param-gather", &p.overlap_param_gather, "overlap the distributed optimizer's all-gather with forward");
  f.add_int("ddp-bucket-size", &p.ddp_bucket_size, "elements per DP gradient bucket with --overlap-grad-reduce; default max(40M, 1M x DP)", 1, int64_t{1} << 40);
  f.add_switch("no-overlap-p2p-communication", &p.overlap_p2p_communication, "do not overlap pipeline sends/receives with compute", false);
  f.add_int("gpus-per-node", &p.gpus_per_node, "devices per node (for drawing nodes)", 1, 1 << 16);

  model::register_model_flags(f, j.model);

  f.section("batch");
  f.add_int("micro-batch-size", &j.batch.micro_batch_size, "sequences per micro-batch per DP rank (required)", 1, int64_t{1} << 24);
  f.add_int("global-batch-size", &j.batch.global_batch_size, "sequences per iteration; default micro-batch * DP", 1, int64_t{1} << 32);
  f.add_string("step-batch-size-schedule", &j.batch.step_batch_size_schedule,
               "the global batch in steps of the tokens consumed: \"THRESHOLD:BATCH ...\" (tokens, suffixes K M B T; "
               "first threshold 0), e.g. \"0:256 10B:512 20B:1024\"; instead of --global-batch-size");
  f.add_list("rampup-batch-size", &j.batch.rampup_batch_size,
             "START INCREMENT SAMPLES: deprecated, and ignored as by Megatron (a note gives the equivalent "
             "--step-batch-size-schedule)");
  f.add_switch("decrease-batch-size-if-needed", &j.batch.decrease_batch_size_if_needed,
               "train on the global batch rounded down to a multiple of micro-batch x DP instead of refusing it");
  f.add_int("eval-global-batch-size", &j.batch.eval_global_batch_size,
            "sequences per validation iteration; default --global-batch-size (micro-batch x DP under a step schedule)",
            1, int64_t{1} << 32);
  f.add_int("eval-micro-batch-size", &j.batch.eval_micro_batch_size,
            "micro-batch size of validation; only --micro-batch-size is supported here", 1, int64_t{1} << 24);
  f.add_switch("reset-position-ids", &j.batch.reset_position_ids,
               "restart position ids after each end-of-document token (learned position embeddings follow them; "
               "RoPE rotates by sequence index, as in Megatron)");
  f.add_switch("reset-attention-mask", &j.batch.reset_attention_mask,
               "no attention across end-of-document tokens: each token sees its own document only (the "
               "block-diagonal mask Megatron builds in the data loader; applied in every attention kernel here)");

  f.section("precision and recomputation");
  f.add_switch("bf16", &j.precision.bf16,
               "bf16 GEMMs (fp32 accumulation), bf16 activations and residual stream (each op computes in fp32 and "
               "rounds once); fp32 master weights and gradients");
  f.add_switch("fp32-residual-connection", &j.precision.fp32_residual_connection,
               "keep the residual stream and its gradient in fp32 under --bf16 or --fp16");
  f.add_switch("fp16", &j.precision.fp16, "fp16 compute with loss scaling (CPU backend): GEMM inputs and the activations between GEMMs in IEEE half, fp32 master weights and gradients");
  f.add_string("recompute-granularity", &j.recompute.granularity, "activation recomputation", {"full", "selective"});
  f.add_string("recompute-method", &j.recompute.method, "which layers full recomputation covers", {"uniform", "block"});
  f.add_int("recompute-num-layers", &j.recompute.num_layers, "layers per recompute group (uniform) or recomputed layers per stage (block)", 1, 1 << 16);
  f.add_switch("recompute-activations", &j.recompute.recompute_activations, "same as --recompute-granularity selective");
  f.add_list("recompute-modules", &j.recompute.modules,
             "with --recompute-granularity selective, what backward recomputes instead of keeping: core_attn (the "
             "default: attention's output), moe_act (the experts' activation function, from their fc1 output), "
             "mla_up_proj (multi-latent attention's up projections and RoPE, from their inputs)");
  f.add_switch("distribute-saved-activations", &j.recompute.distribute_saved_activations, "split the saved layer inputs of full recomputation over TP");
}

static std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 1) return std::nullopt;
  return static_cast<int64_t>(x);
}

WorldSource resolve_world_size(JobConfig& j) {
  auto& p = j.parallel;
  if (p.world_size) return WorldSource::kFlag;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"}) {
    if (auto w = env_int(var)) {
      p.world_size = *w;
      return WorldSource::kLauncher;
    }
  }
  if (p.dp) {
    p.world_size = mul_sat(p.tp, p.pp, p.cp, *p.dp);
    return WorldSource::kDataParallelProduct;
  }
  p.world_size = mul_sat(p.tp, p.pp, p.cp);
  return WorldSource::kDefaultOneReplica;
}

void register_megatron_compat_flags(FlagSet& f, JobConfig& j) {
  MegatronCompat* c = &j.compat;
  model::ModelConfig* m = &j.model;
  f.section("accepted from Megatron command lines");
  // Implementation, fusion and logging choices whose computation is the same here.
  struct NoEffect {
    const char* name;
    std::vector<std::string> choices;  // empty with takes_value false: a switch; empty otherwise: any value
    bool takes_value;
    const char* why;
  };
  const char* const kFusion = "a kernel-fusion choice: the same math either way, and the kernels here are fixed";
  const char* const kTimers = "Megatron's internal timers: the log line reports the iteration time and throughput";
  const std::vector<NoEffect> no_effect = {
      {"use-mcore-models", {}, false, "the model is Megatron-Core's GPT model, the only one here"},
      {"transformer-impl", {"local", "transformer_engine", "inference_optimized"}, true,
       "an implementation choice: every one computes the same model"},
      {"use-flash-attn", {}, false, "attention is always flash-style (tiled, never an s x s matrix)"},
      {"attention-backend", {"auto", "flash", "fused", "unfused", "local"}, true,
       "an attention implementation choice with the same math; attention here is always flash-style"},
      {"attention-softmax-in-fp32", {}, false, "the attention softmax is always computed in fp32"},
      {"no-masked-softmax-fusion", {}, false, kFusion},
      {"no-bias-swiglu-fusion", {}, false, kFusion},
      {"no-bias-dropout-fusion", {}, false, kFusion},
      {"no-rope-fusion", {}, false, kFusion},
      {"mla-down-proj-fusion", {}, false, kFusion},
      {"no-persist-layer-norm", {}, false, kFusion},
      {"no-gradient-accumulation-fusion", {}, false, kFusion},
      {"cross-entropy-loss-fusion", {}, false, kFusion},
      {"accumulate-allreduce-grads-in-fp32", {}, false, "gradients are always accumulated and reduced in fp32"},
      {"tp-comm-overlap", {}, false, "overlapping tensor-parallel communication with GEMMs changes speed, not results"},
      {"use-cpu-initialization", {}, false,
       "initialisation draws the same values on every backend and layout (Philox by global element index)"},
      {"distributed-backend", {"nccl", "gloo"}, true,
       "the backend follows --device: MPI between CPU ranks, NCCL between GPUs"},
      {"no-create-attention-mask-in-dataloader", {}, false, "the causal mask is applied inside the attention kernel"},
      {"num-workers", {}, true, "data loading runs in the training process"},
      {"num-dataset-builder-threads", {}, true, "dataset indices are built once per rank and cached (--data-cache-path)"},
      {"log-throughput", {}, false, "tokens/s, TFLOP/s and MFU are always logged"},
      {"manual-gc", {}, false, "there is no garbage collector to drive"},
      {"manual-gc-interval", {}, true, "there is no garbage collector to drive"},
      {"timing-log-level", {"0", "1", "2"}, true, kTimers},
      {"timing-log-option", {"max", "minmax", "all"}, true, kTimers},
      {"tensorboard-queue-size", {}, true, "TensorBoard records are written and flushed as they come"},
      {"distributed-timeout-minutes", {}, true,
       "no collective timeout to set: a rank that dies ends the whole job (MPI/NCCL abort)"},
      {"async-save", {}, false, "checkpoints are written synchronously (to a temporary name, then renamed)"},
      {"moe-grouped-gemm", {}, false,
       "the experts run one GEMM each (SequentialMLP's arithmetic); a grouped GEMM computes the same products"},
      {"moe-token-dispatcher-type", {"allgather", "alltoall", "flex"}, true,
       "tokens are permuted locally and, with --expert-model-parallel-size, exchanged with an all-to-all over the EP "
       "group (Megatron's alltoall dispatcher); the dispatchers move the same tokens to the same experts"},
      {"moe-shared-expert-overlap", {}, false,
       "overlapping the shared expert with the token exchange changes speed, not results"},
      {"moe-router-dtype", {"fp32"}, true,
       "the router's logits, softmax, top-k and losses are always fp32 here (under --bf16 its two GEMMs take bf16 "
       "inputs with fp32 accumulation, as every GEMM here; Megatron's fp64 router is not offered)"},
      {"moe-permute-fusion", {}, false, kFusion},
      {"moe-router-fusion", {}, false, kFusion},
      {"empty-unused-memory-level", {"0", "1", "2"}, true,
       "buffers are planned and allocated once: there is no allocator cache to empty"},
      {"no-mmap-bin-files", {}, false, "the same tokens either way (the .bin files are memory-mapped here)"},
      {"deterministic-mode", {}, false,
       "the kernels and reductions here are deterministic: a rerun of the same layout gives the same losses bit for "
       "bit"},
      {"apply-query-key-layer-scaling", {}, false,
       "attention scores and their softmax are fp32 here, where the layer-number scale and its inverse cancel (it "
       "guards fp16 scores against overflow)"},
      {"cuda-graph-impl", {"none", "local", "transformer_engine", "full_iteration"}, true,
       "no CUDA graphs here: the same kernels run launched one by one"},
      {"enable-cuda-graph", {}, false, "no CUDA graphs here: the same kernels run launched one by one"},
      {"rerun-mode", {"disabled", "validate_results", "report_stats"}, true,
       "there is no rerun state machine: a NaN or inf loss or gradient stops the run at once (without re-running the "
       "iteration to tell a transient fault from a reproducible one); report_stats checks nothing, as in Megatron"},
      {"use-persistent-ckpt-worker", {}, false,
       "checkpoints are written synchronously (to a temporary name, then renamed)"},
      {"auto-detect-ckpt-format", {}, false, "checkpoints here have one format"},
      {"dist-ckpt-optim-fully-reshardable", {}, false,
       "checkpoints here load under any other layout, optimizer state included"},
      {"ckpt-fully-parallel-save", {}, false, "every rank writes its own slices"},
      {"no-ckpt-fully-parallel-save", {}, false, "every rank writes its own slices"},
      {"ckpt-fully-parallel-load", {}, false, "every rank reads only its own slices"},
      {"ckpt-assume-constant-structure", {}, false, "a checkpoint's layout is read from its files each time"},
      {"ddp-average-in-collective", {}, false,
       "the loss is scaled by 1 / (micro-batches x DP) before backward, so the gradients' sum over DP is their mean "
       "either way"},
      {"ddp-reduce-scatter-with-fp32-accumulation", {}, false, "gradients are fp32 and reduced in fp32 here"},
      {"ddp-pad-buckets-for-high-nccl-busbw", {}, false, "bucket padding changes bandwidth, not the gradients"},
      {"no-gradient-reduce-div-fusion", {}, false, kFusion},
      {"no-align-param-gather", {}, false, "when the stages launch their parameter all-gathers changes speed, not results"},
      {"overlap-param-gather-with-optimizer-step", {}, false,
       "overlapping the parameter all-gather with the optimizer step changes speed, not results"},
      {"create-all-gather-group", {}, false, "a separate all-gather communicator changes speed, not results"},
      {"dataloader-defer-npy-index-mmap", {}, false, "how the index cache is mapped changes speed, not the samples"},
      {"dataloader-fast-cache-load", {}, false, "how the index cache is loaded changes speed, not the samples"},
      {"no-one-logger", {}, false, "there is no OneLogger telemetry here"},
      {"cross-entropy-fusion-impl", {"native", "te"}, true, kFusion},
      {"test-mode", {}, false, "Megatron's in-run self-tests of its attention internals: the same attention here"},
      {"data-parallel-sharding-strategy", {"no_shard", "optim", "optim_grads", "optim_grads_params"}, true,
       "a Megatron-FSDP setting (--use-megatron-fsdp is refused here)"},
      {"megatron-fsdp-main-params-dtype", {"fp32", "bf16", "fp16", "auto"}, true, "a Megatron-FSDP setting (--use-megatron-fsdp is refused here)"},
      {"megatron-fsdp-main-grads-dtype", {"fp32", "bf16", "fp16", "auto"}, true, "a Megatron-FSDP setting (--use-megatron-fsdp is refused here)"},
      {"megatron-fsdp-grad-comm-dtype", {"fp32", "bf16", "fp16", "auto"}, true, "a Megatron-FSDP setting (--use-megatron-fsdp is refused here)"},
      {"tp-comm-overlap-cfg", {}, true,
       "Transformer Engine's tensor-parallel overlap settings: overlapping communication with GEMMs changes speed, "
       "not results"},
      {"async-ckpt-use-cpu-shm", {}, false, "checkpoints are written synchronously (to a temporary name, then renamed)"},
      {"disable-gloo-process-groups", {}, false,
       "there are no Gloo process groups here: MPI between CPU ranks, NCCL between GPUs"},
      {"overlap-p2p-communication-warmup-flush", {}, false,
       "overlapping the pipeline's sends and receives in its warm-up and flush changes speed, not results"},
      {"defer-embedding-wgrad-compute", {}, false,
       "deferring the output layer's weight-gradient GEMMs to the pipeline flush changes speed, not results"},
      {"wgrad-deferral-limit", {}, true,
       "deferring the output layer's weight-gradient GEMMs to the pipeline flush changes speed, not results"},
      {"async-strategy", {"nvrx", "mcore"}, true,
       "checkpoints are written synchronously (to a temporary name, then renamed)"},
      {"te-rng-tracker", {}, false,
       "dropout masks come from Philox keyed by the seed and each element's global index: there is no RNG state "
       "to track, on any backend"},
      {"straggler-minmax-count", {}, true, "Megatron's straggler detector is not implemented (see --log-straggler)"},
      {"straggler-ctrlr-port", {}, true, "Megatron's straggler detector is not implemented (see --log-straggler)"},
      {"disable-straggler-on-startup", {}, false,
       "Megatron's straggler detector is not implemented (see --log-straggler)"},
      {"grad-reduce-in-bf16", {}, false,
       "without --bf16 Megatron reduces gradients in their own precision too (with --bf16 it is refused here)"},
  };
  for (const NoEffect& e : no_effect) {
    const std::string line = fmt::format("--{}: {}", e.name, e.why);
    const std::string name = e.name;
    f.add_seen(e.name, e.takes_value, std::string("no effect here: ") + e.why, e.choices,
               [c, line, name](const std::string& value) {
                 c->given[name] = value;
                 if (std::find(c->no_effect.begin(), c->no_effect.end(), line) == c->no_effect.end())
                   c->no_effect.push_back(line);
               });
  }
  // Things this program does not do: refused by `megatron train`, each with
  // what to do instead.
  const char* const kLogging =
      "Weights & Biases logs are not written here: every logged number is a JSON line in --metrics-file "
      "(default <save>/metrics.jsonl), and --tensorboard-dir writes TensorBoard scalars; drop the flag";
  const char* const kCkpt =
      "checkpoints are megatron-cpp's own (safetensors per rank plus JSON; they load under any other parallel "
      "layout), not PyTorch's torch/torch_dist formats; drop the flag";
  struct Refused {
    const char* name;
    bool takes_value;
    const char* brief;  // for --help
    const char* why;    // the error
  };
  const char* const kTb = "no W&B logs: metrics are JSON lines (and --tensorboard-dir)";
  const char* const kCk = "checkpoints are megatron-cpp's own format";
  const std::vector<Refused> refused = {
      {"log-memory-to-tensorboard", false, "no allocator statistics",
       "the memory scalars are PyTorch's CUDA allocator statistics, which this program does not have: the "
       "trainer's measured and planned buffer bytes are in the log line and --metrics-file; drop the flag"},
      {"wandb-project", true, kTb, kLogging},
      {"wandb-exp-name", true, kTb, kLogging},
      {"wandb-save-dir", true, kTb, kLogging},
      {"wandb-entity", true, kTb, kLogging},
      {"ckpt-format", true, kCk, kCkpt},
      {"use-dist-ckpt", false, kCk, kCkpt},
      {"fp8-format", true, "no fp8 training", "fp8 training is not implemented: use --bf16"},
      // Flags Megatron itself no longer accepts (its messages).
      {"batch-size", true, "no longer valid in Megatron",
       "--batch-size is no longer valid (in Megatron too): use --micro-batch-size (and --global-batch-size)"},
      {"warmup", true, "no longer valid in Megatron",
       "--warmup is no longer valid (in Megatron too): use --lr-warmup-fraction"},
      {"model-parallel-size", true, "no longer valid in Megatron",
       "--model-parallel-size is no longer valid (in Megatron too): use --tensor-model-parallel-size"},
      {"checkpoint-activations", false, "no longer valid in Megatron",
       "--checkpoint-activations is no longer valid (in Megatron too): use --recompute-activations, or for more "
       "control --recompute-granularity and --recompute-method"},
      {"use-pytorch-profiler", false, "no PyTorch profiler",
       "there is no PyTorch profiler here: --profile prints the trainer's time per op for the profiled steps (and on "
       "CUDA brackets them with cudaProfilerStart/Stop for nsys); drop the flag"},
      {"fp8-recipe", true, "no fp8 training", "fp8 training is not implemented: use --bf16"},
      {"fp8-amax-history-len", true, "no fp8 training", "fp8 training is not implemented: use --bf16"},
      {"fp8-amax-compute-algo", true, "no fp8 training", "fp8 training is not implemented: use --bf16"},
      {"fp8-param-gather", false, "no fp8 training", "fp8 training is not implemented: use --bf16"},
      {"dist-ckpt-strictness", true, kCk, kCkpt},
      {"cache-mla-latents", false, "training only",
       "--cache-mla-latents caches multi-latent attention's latents for Megatron's dynamic inference engine, and "
       "Megatron refuses it in training: drop the flag"},
      {"fp16-lm-cross-entropy", false, "no fp16 cross entropy",
       "the cross entropy takes fp32 logits here (Megatron's default); computing it on fp16 logits is not "
       "offered: drop the flag"},
      {"log-straggler", false, "no straggler detector",
       "Megatron's straggler detector (each GPU's throughput, the slowest and fastest ranks) is not implemented: the "
       "log line reports the iteration time, tokens/s and MFU, and --profile each op's time per rank; drop the flag"},
      {"use-megatron-fsdp", false, "no FSDP",
       "FSDP is not implemented: --use-distributed-optimizer shards the fp32 master weights and optimizer state over "
       "DP (the same training; the parameters stay whole on every rank)"},
      {"error-injection-rate", true, "no rerun state machine",
       "there is no rerun state machine here (a NaN or inf loss or gradient stops the run), so there is nothing for "
       "injected errors to exercise; drop the flag"},
      {"error-injection-type", true, "no rerun state machine",
       "there is no rerun state machine here (a NaN or inf loss or gradient stops the run), so there is nothing for "
       "injected errors to exercise; drop the flag"},
      {"use-torch-fsdp2", false, "no FSDP",
       "FSDP is not implemented: --use-distributed-optimizer shards the fp32 master weights and optimizer state over DP"},
      // Mixture-of-experts features beyond the dropless top-k softmax router.
      {"moe-pad-expert-input-to-capacity", false, "no padding to the expert capacity",
       "padding each expert's input to its capacity (Megatron's static shapes for CUDA graphs) is not "
       "implemented: with --moe-expert-capacity-factor the experts run on the kept tokens only, which gives the "
       "same losses and gradients (the padding rows have routing probability 0; Megatron's expert-bias update "
       "would count every expert as full); drop the flag"},
  };
  for (const Refused& r : refused) {
    const std::string flag = std::string("--") + r.name, why = r.why;
    f.add_seen(r.name, r.takes_value, std::string("refused by megatron train: ") + r.brief, {},
               [c, flag, why](const std::string&) {
                 for (const auto& e : c->refused)
                   if (e.first == flag) return;
                 c->refused.emplace_back(flag, why);
               });
  }
  // Megatron's deprecated spellings of --position-embedding-type.
  f.add_seen("use-rotary-position-embeddings", false, "same as --position-embedding-type rope (Megatron's deprecated "
             "spelling)", {}, [m](const std::string&) { m->position_embedding = model::PositionEmbedding::kRope; });
  f.add_seen("no-position-embedding", false, "same as --position-embedding-type none (Megatron's deprecated spelling)",
             {}, [m](const std::string&) { m->position_embedding = model::PositionEmbedding::kNone; });
}

const char* world_source_name(WorldSource s) {
  switch (s) {
    case WorldSource::kFlag: return "--world-size";
    case WorldSource::kLauncher: return "the MPI launcher";
    case WorldSource::kDataParallelProduct: return "TP x PP x CP x --data-parallel-size";
    case WorldSource::kDefaultOneReplica: return "TP x PP x CP (one model replica; give --world-size)";
  }
  return "?";
}

}  // namespace mt::plan
