#include "plan/job.h"

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
  f.add_int("expert-model-parallel-size", &p.ep, "expert-parallel size (EP)", 1, kMaxRanks);
  f.add_int("expert-tensor-parallel-size", &p.etp, "tensor-parallel size of expert layers (ETP); default TP", 1, kMaxRanks);
  f.add_int("data-parallel-size", &p.dp, "data-parallel size (DP); derived as world/(TP*PP*CP) when absent", 1, kMaxRanks);
  f.add_int("num-layers-per-virtual-pipeline-stage", &p.num_layers_per_virtual_pipeline_stage, "layers per virtual stage (interleaved 1F1B)", 1, 1 << 16);
  f.add_int("num-virtual-stages-per-pipeline-rank", &p.num_virtual_stages_per_pipeline_rank, "model chunks per pipeline rank (interleaved 1F1B)", 1, 1 << 16);
  f.add_int("microbatch-group-size-per-virtual-pipeline-stage", &p.microbatch_group_size_per_vp_stage, "micro-batches per group in the interleaved schedule; default PP", 1, kMaxRanks);
  f.add_int("decoder-first-pipeline-num-layers", &p.decoder_first_pipeline_num_layers, "layers on the first pipeline stage (uneven split)", 0, 1 << 16);
  f.add_int("decoder-last-pipeline-num-layers", &p.decoder_last_pipeline_num_layers, "layers on the last pipeline stage (uneven split)", 0, 1 << 16);
  f.add_switch("account-for-embedding-in-pipeline-split", &p.account_for_embedding_in_pipeline_split, "count the embedding as a layer when splitting over PP");
  f.add_switch("account-for-loss-in-pipeline-split", &p.account_for_loss_in_pipeline_split, "count the loss as a layer when splitting over PP");
  f.add_switch("sequence-parallel", &p.sequence_parallel, "shard norms/dropout activations along the sequence over TP");
  f.add_switch("use-distributed-optimizer", &p.use_distributed_optimizer, "shard fp32 master weights and Adam state over DP");
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

  f.section("precision and recomputation");
  f.add_switch("bf16", &j.precision.bf16,
               "bf16 GEMMs (fp32 accumulation), bf16 activations and residual stream (each op computes in fp32 and "
               "rounds once); fp32 master weights and gradients");
  f.add_switch("fp32-residual-connection", &j.precision.fp32_residual_connection,
               "keep the residual stream and its gradient in fp32 under --bf16");
  f.add_switch("fp16", &j.precision.fp16, "fp16 compute with loss scaling");
  f.add_string("recompute-granularity", &j.recompute.granularity, "activation recomputation", {"full", "selective"});
  f.add_string("recompute-method", &j.recompute.method, "which layers full recomputation covers", {"uniform", "block"});
  f.add_int("recompute-num-layers", &j.recompute.num_layers, "layers per recompute group (uniform) or recomputed layers per stage (block)", 1, 1 << 16);
  f.add_switch("recompute-activations", &j.recompute.recompute_activations, "same as --recompute-granularity selective");
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
