#include "plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model/gpt.h"
#include "plan/validate.h"

namespace mt::plan {

namespace {

constexpr double kMiB = 1024.0 * 1024.0, kGiB = kMiB * 1024.0;

const std::vector<DeviceProfile>& profiles() {
  static const std::vector<DeviceProfile> p = {
      {"h100", 989.4, 494.7, 81559 * kMiB, 2 * kGiB,
       "NVIDIA H100 SXM5 80GB datasheet (dense bf16 989.4 TFLOP/s, TF32 494.7); 81559 MiB as nvidia-smi reports", 0,
       ""},
      {"h200", 989.4, 494.7, 143771 * kMiB, 2 * kGiB,
       "NVIDIA H200 SXM 141GB datasheet (same compute as H100); 143771 MiB as nvidia-smi reports", 790.0,
       "a bf16 8192^3 matmul in PyTorch on a lent H200, as the project's GPU issue reports it; "
       "bench/device_check.sh's bench_gemm step measures it again"},
      {"a100", 312.0, 156.0, 81920 * kMiB, 2 * kGiB,
       "NVIDIA A100 SXM4 80GB datasheet (dense bf16 312 TFLOP/s, TF32 156)", 0, ""},
      {"cpu", 1.054, 0.527, 24 * kGiB, 0.5 * kGiB,
       "this project's 2-core AVX-512 machine: measured vdpbf16ps 1054 GFLOP/s, zmm FMA 527 GFLOP/s; 24 GiB", 0, ""},
  };
  return p;
}

}  // namespace

const DeviceProfile* find_device_profile(const std::string& name) {
  for (const auto& p : profiles())
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> device_profile_names() {
  std::vector<std::string> n;
  for (const auto& p : profiles()) n.push_back(p.name);
  return n;
}

void register_plan_option_flags(FlagSet& f, PlanOptions& o) {
  f.section("device and throughput (planner only)");
  std::vector<std::string> names = device_profile_names();
  names.push_back("cuda");
  f.add_string("device", &o.device, "device profile: peak FLOP/s and memory (cuda: the default GPU, h100)", names);
  f.add_double("peak-tflops", &o.peak_tflops, "override the profile's peak dense TFLOP/s for the training dtype", 1e-6, 1e9);
  f.add_double("device-memory-gb", &o.device_memory_gb, "override the profile's memory per device, in GB (1e9 bytes)", 1e-3, 1e9);
  f.add_double("step-time", &o.step_time, "measured or assumed seconds per iteration (gives tokens/s and MFU)", 1e-9, 1e12);
  f.add_double("assumed-efficiency", &o.assumed_efficiency, "share of peak FLOP/s reached while computing, for predicted step time", 1e-3, 1);
  f.add_double("num-parameters", &o.num_parameters, "plan from a parameter count alone (e.g. 13e9), without architecture flags", 1, 1e15);
}

double megatron_flops_per_iteration(const model::ModelConfig& m, int64_t V, int64_t global_batch) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq_length);
  return B * s * model::flops_per_token(m, V) + B * s * s * model::flops_per_token_pair(m);
}

namespace {

// Memory of every stage for one job variant; `in_flight` per pp rank.
MemoryReport stage_memories(const PlanReport& r, const JobConfig& job, const MemoryLayout& layout) {
  MemoryReport mem;
  const int64_t P = job.parallel.pp;
  for (int64_t p = 0; p < P; ++p) {
    StageInputs in;
    in.pp_rank = p;
    in.first_stage = p == 0;
    in.last_stage = p == P - 1;
    for (const auto& c : r.chunks)
      if (c.pp_rank == p) in.chunk_layers.push_back(c.num_layers), in.chunk_first.push_back(c.first_layer);
    in.in_flight = r.in_flight.empty() ? 1 : r.in_flight[p];
    in.reserve_bytes = r.device.reserve_bytes;
    mem.stages.push_back(stage_memory(job, layout, in));
  }
  for (size_t i = 0; i < mem.stages.size(); ++i)
    if (mem.stages[i].total_bytes() > mem.peak_bytes) mem.peak_bytes = mem.stages[i].total_bytes(), mem.peak_stage = i;
  return mem;
}

void plan_throughput(PlanReport& r) {
  const bool half = r.job.precision.bf16 || r.job.precision.fp16;
  Throughput& t = r.throughput;
  t.peak_tflops = r.options.peak_tflops.value_or(half ? r.device.peak_tflops_16bit : r.device.peak_tflops_32bit);
  const double world = static_cast<double>(r.world);
  if (r.options.step_time) {
    t.measured = true;
    t.step_time_s = *r.options.step_time;
  } else {
    // Recomputed forward passes cost time but are not model FLOPs.
    double recompute_share = 0;
    const auto& rc = r.job.recompute;
    if (rc.full() && !r.chunks.empty()) {
      if (rc.method == "block") {
        int64_t recomputed = 0, total = 0;
        for (const auto& c : r.chunks) {
          recomputed += std::min<int64_t>(c.num_layers, rc.num_layers.value_or(1));
          total += c.num_layers;
        }
        recompute_share = total ? static_cast<double>(recomputed) / total : 0;
      } else {
        recompute_share = 1;
      }
    }
    const double hw_flops = r.flops_per_iteration * (1 + recompute_share / 3);
    const double compute_s = hw_flops / (world * t.peak_tflops * 1e12 * r.options.assumed_efficiency);
    t.step_time_s = compute_s / (1 - r.bubble_formula);
  }
  t.tokens_per_s = r.tokens_per_iteration / t.step_time_s;
  t.tflops_per_device = r.flops_per_iteration / (t.step_time_s * 1e12 * world);
  t.mfu = t.tflops_per_device / t.peak_tflops;
  if (half && !r.options.peak_tflops && r.device.gemm_ceiling_tflops_16bit > 0) {
    t.gemm_ceiling_tflops = r.device.gemm_ceiling_tflops_16bit;
    t.of_gemm_ceiling = t.tflops_per_device / t.gemm_ceiling_tflops;
  }
}

void plan_schedule(PlanReport& r) {
  const int64_t P = r.job.parallel.pp, V = r.vpp, M = r.num_microbatches, N = r.group_size;
  r.bubble_formula = P > 1 ? parallel::bubble_formula(P, V, M) : 0;
  // The full schedule gives the in-flight counts and the simulated bubble;
  // for very large M the drawn one is shortened.
  const double actions = 2.0 * P * V * M;
  if (actions <= 4e6) {
    auto s = parallel::build_schedule(P, V, M, N);
    if (s) {
      auto t = parallel::simulate(*s, 1.0 / V, 2.0 / V);
      r.schedule_kind = s->kind;
      r.bubble_simulated = t.bubble_fraction;
      r.in_flight = t.max_in_flight;
      if (actions <= 4096) {
        r.timeline = std::move(t);
        r.timeline_microbatches = M;
        return;
      }
    }
  } else {
    r.schedule_kind = V > 1 ? parallel::ScheduleKind::kInterleaved : parallel::ScheduleKind::kOneFOneB;
    r.bubble_simulated = r.bubble_formula;
    r.in_flight.assign(P, 0);
    for (int64_t p = 0; p < P; ++p)
      r.in_flight[p] = V > 1 ? std::min((P - p - 1) * 2 + (V - 1) * N + 1, M * V) : std::min(P - p, M);
  }
  // Draw a shorter run of the same schedule.
  int64_t Md = std::min<int64_t>(M, std::max<int64_t>(2 * P, 4));
  if (V > 1) Md = std::min<int64_t>(M, N * std::max<int64_t>(1, (2 * P + N - 1) / N));
  auto s = parallel::build_schedule(P, V, Md, N);
  if (s) {
    r.timeline = parallel::simulate(*s, 1.0 / V, 2.0 / V);
    r.timeline_microbatches = Md;
  }
}

void plan_fit(PlanReport& r, const MemoryLayout& layout) {
  struct Variant {
    std::string name;
    bool distopt, sp, recompute;
  };
  const auto& par = r.job.parallel;
  const bool can_distopt = !par.use_distributed_optimizer && r.reduces_gradients();
  const auto& m = r.job.model;
  const bool can_sp = !par.sequence_parallel && par.tp > 1 && (m.seq_length / par.cp) % par.tp == 0;
  const bool can_recompute = !r.job.recompute.full();
  std::vector<Variant> variants = {{"as given", false, false, false}};
  if (can_distopt) variants.push_back({"--use-distributed-optimizer", true, false, false});
  if (can_sp) variants.push_back({"--sequence-parallel", false, true, false});
  if (can_distopt && can_sp) variants.push_back({"--use-distributed-optimizer --sequence-parallel", true, true, false});
  if (can_recompute) {
    std::string n = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
    if (can_distopt) n = "--use-distributed-optimizer " + n;
    if (can_sp) n = "--sequence-parallel " + n;
    variants.push_back({n, can_distopt, can_sp, true});
  }
  for (const auto& v : variants) {
    JobConfig j = r.job;
    if (v.distopt) j.parallel.use_distributed_optimizer = true;
    if (v.sp) j.parallel.sequence_parallel = true;
    if (v.recompute) {
      j.recompute = RecomputeConfig{};
      j.recompute.granularity = "full";
      j.recompute.method = "uniform";
      j.recompute.num_layers = 1;
    }
    MemoryReport mem = stage_memories(r, j, layout);
    r.fit_options.push_back({v.name, mem.peak_bytes, mem.peak_bytes <= r.memory.device_bytes});
  }
}

}  // namespace

Result<model::GPTOptions> trainer_model_options(const PlanReport& r, int64_t pp_rank) {
  const auto& p = r.job.parallel;
  model::GPTOptions go;
  go.micro_batch = r.job.batch.micro_batch_size;
  go.seq_length = r.job.model.seq_length;
  go.half_compute = r.job.precision.half();
  go.half = r.job.precision.fp16 ? DType::kF16 : DType::kBF16;
  go.fp32_residual = r.job.precision.fp32_residual_connection;
  go.tp = p.tp;
  go.sequence_parallel = p.sequence_parallel;
  go.cp = p.cp;  // the trainer sets cp_rank and cp_comm
  go.reset_position_ids = r.job.batch.reset_position_ids;
  go.reset_attention_mask = r.job.batch.reset_attention_mask;
  go.flat_multiple = r.dp * p.cp;  // bucket boundaries and reduce-scatter blocks divide by DP x CP
  go.ep = p.ep;                    // the trainer sets ep_rank and ep_comm
  go.expert_flat_multiple = r.edp; // the experts' region: by the expert DP size
  go.etp = r.etp;                  // --expert-tensor-parallel-size (TP or 1)
  for (const ChunkLayers& c : r.chunks)
    if (c.pp_rank == pp_rank) go.chunks.push_back({c.first_layer, c.num_layers});
  go.pre_process = pp_rank == 0;
  go.post_process = pp_rank == p.pp - 1;
  go.slots = static_cast<int>(r.in_flight.empty() ? 1 : std::max<int64_t>(1, r.in_flight[static_cast<size_t>(pp_rank)]));
  auto rc = model::RecomputeOptions::from_flags(r.job.recompute.granularity, r.job.recompute.method,
                                                r.job.recompute.num_layers, r.job.recompute.recompute_activations,
                                                r.job.recompute.modules);
  if (!rc) return rc.status();
  go.recompute = *rc;
  return go;
}

namespace {

// The trainer's buffers and traffic on pipeline rank `prank`.
void trainer_buffers_for(const PlanReport& r, int64_t prank, TrainerBuffers& t, CommReport& comm) {
  const auto& p = r.job.parallel;
  // Gradients are reduced, and with the distributed optimizer sharded, over
  // DP x CP; the routed experts' (--num-experts) over the expert DP group.
  const int64_t gdp = r.dp * p.cp;
  const bool dist_opt = p.use_distributed_optimizer && r.reduces_gradients();
  auto go_r = trainer_model_options(r, prank);
  if (!go_r) {
    t.why_not = go_r.status().message();
    return;
  }
  const model::GPTOptions& go = *go_r;
  auto mp = model::GPTModel::planned_bytes(r.job.model, go);
  if (!mp) {
    t.why_not = mp.status().message();
    return;
  }
  t.available = true;
  t.params = static_cast<double>(mp->params);
  t.grads = static_cast<double>(mp->grads);
  t.lowp = static_cast<double>(mp->lowp);
  t.activations = static_cast<double>(mp->activations);
  t.scratch = static_cast<double>(mp->scratch);
  t.tables = static_cast<double>(mp->tables);
  if (auto cp = model::GPTModel::planned_comm(r.job.model, go); cp.is_ok()) {
    comm.available = true;
    comm.tp_bytes = static_cast<double>(r.num_microbatches) * (cp->tp_forward_bytes + cp->tp_backward_bytes) + cp->tp_step_bytes;
    // The non-expert gradients over DP x CP, the experts' over the expert DP group.
    const double dense = static_cast<double>(mp->params - mp->expert_params), expert = static_cast<double>(mp->expert_params);
    comm.dp_bytes = ((gdp > 1 ? dense : 0.0) + (r.edp > 1 ? expert : 0.0)) * (dist_opt ? 2.0 : 1.0);
    comm.cp_bytes = static_cast<double>(r.num_microbatches) * (cp->cp_forward_bytes + cp->cp_backward_bytes);
    comm.ep_bytes = static_cast<double>(r.num_microbatches) * (cp->ep_forward_bytes + cp->ep_backward_bytes);
    // Per micro-batch and chunk, the activation received from the previous
    // virtual stage and sent to the next, and the gradient received back and
    // sent back ([Ns, h] each); plus the tied embedding's gradient all-reduce
    // between the first and the last stage.
    if (p.pp > 1) {
      const double ns = static_cast<double>(go.micro_batch * go.seq_length) / static_cast<double>(p.cp) /
                        (p.sequence_parallel && p.tp > 1 ? p.tp : 1);
      // The residual stream's dtype (bf16 under --bf16 without --fp32-residual-connection).
      const double act = ns * static_cast<double>(r.job.model.hidden_size) *
                         static_cast<double>(dtype_size(model::residual_dtype(go)));
      const int64_t S = p.pp * r.vpp;
      for (int64_t c = 0; c < r.vpp; ++c) {
        const int64_t s = c * p.pp + prank;
        comm.pp_bytes += static_cast<double>(r.num_microbatches) * act * (2.0 * (s > 0) + 2.0 * (s < S - 1));
      }
      // The embedding group's all-reduce of the word embedding's gradient:
      // tied, or with --mtp-num-layers (the last stage's MTP layers embed).
      if ((!r.job.model.untie_embeddings_and_output_weights || r.job.model.mtp_layers()) &&
          (prank == 0 || prank == p.pp - 1))
        comm.pp_bytes += static_cast<double>(r.padded_vocab / p.tp * r.job.model.hidden_size) * 4.0;
    }
  }
  // The optimizer's state (Adam's m and v, SGD's momentum buffer): the
  // parameters' size table once per state tensor, or with the distributed
  // optimizer this rank's 1/DP of the (DP-padded) flat buffer once per state
  // tensor. The experts' region is sharded over the expert DP group instead.
  const double dense = static_cast<double>(mp->params - mp->expert_params), expert = static_cast<double>(mp->expert_params);
  const double states = r.job.optimizer.state_tensors();
  t.optimizer = dist_opt ? states * (dense / static_cast<double>(gdp) + expert / static_cast<double>(r.edp))
                         : states * static_cast<double>(mp->params);
  // Communication buffers the trainer allocates (parallel/grad_buckets.h, train/pipeline.h).
  if (dist_opt) {  // the reduce-scatter receive blocks (none over a group of one)
    if (gdp > 1) t.comm += static_cast<double>(align_up(static_cast<size_t>(dense / static_cast<double>(gdp))));
    if (expert > 0 && r.edp > 1)
      t.comm += static_cast<double>(align_up(static_cast<size_t>(expert / static_cast<double>(r.edp))));
  }
  if (p.pp > 1) {
    const double ns = static_cast<double>(go.micro_batch * go.seq_length) / static_cast<double>(p.cp) /
                      (p.sequence_parallel && p.tp > 1 ? p.tp : 1);
    t.comm += static_cast<double>(align_up(static_cast<size_t>(
        ns * static_cast<double>(r.job.model.hidden_size) * static_cast<double>(dtype_size(model::residual_dtype(go))))));
  }
}

// Every pipeline rank's buffers and traffic (stages differ: the embedding
// and output layer, uneven splits, --moe-layer-freq's dense and MoE
// layers); r.memory.trainer and r.comm are pipeline rank 0's, which its log
// line compares with what it allocates and sends.
void plan_trainer_buffers(PlanReport& r) {
  const int64_t P = r.job.parallel.pp;
  r.memory.trainer_stages.assign(static_cast<size_t>(P), TrainerBuffers{});
  r.comm_stages.assign(static_cast<size_t>(P), CommReport{});
  for (int64_t p = 0; p < P; ++p) {
    trainer_buffers_for(r, p, r.memory.trainer_stages[static_cast<size_t>(p)], r.comm_stages[static_cast<size_t>(p)]);
    const TrainerBuffers& t = r.memory.trainer_stages[static_cast<size_t>(p)];
    if (t.available && t.total() > r.memory.trainer_stages[static_cast<size_t>(r.memory.trainer_peak_stage)].total())
      r.memory.trainer_peak_stage = p;
  }
  r.memory.trainer = r.memory.trainer_stages[0];
  r.comm = r.comm_stages[0];
}

}  // namespace

PlanReport make_plan(JobConfig job, const PlanOptions& options) {
  PlanReport r;
  r.options = options;
  r.world_source = resolve_world_size(job);
  // `--device cuda` (a backend name, as `megatron train` takes it) plans for the default GPU.
  if (const DeviceProfile* d = find_device_profile(options.device == "cuda" ? "h100" : options.device)) r.device = *d;
  else r.device = *find_device_profile("h100");
  r.job = job;
  if (Status st = model::resolve_vocab(r.job.model); !st) {
    r.errors.push_back({"vocab-file", {"--vocab-file"}, st.message(), "pass GPT-2's vocab.json, or --vocab-size N"});
  }
  validate(r);
  if (!r.valid()) return r;

  const auto& par = r.job.parallel;
  const auto& m = r.job.model;
  r.world = *par.world_size;
  r.num_nodes = (r.world + par.gpus_per_node - 1) / par.gpus_per_node;
  parallel::GridSizes gs{r.world, par.tp, par.pp, par.cp, par.ep, r.etp, par.use_tp_pp_dp_mapping};
  auto grid = parallel::RankGrid::create(gs);
  if (!grid) {
    r.errors.push_back({"rank-grid", {}, grid.status().message(), ""});
    return r;
  }
  r.grid = std::move(*grid);
  r.tokens_per_iteration = static_cast<double>(r.global_batch) * m.seq_length;

  if (r.options.device_memory_gb) r.memory.device_bytes = *r.options.device_memory_gb * 1e9;
  else r.memory.device_bytes = r.device.memory_bytes;

  plan_schedule(r);

  const BytesPerParam bpp = bytes_per_param(r.job.precision, r.job.optimizer.state_tensors());
  r.memory.model_state_bytes_per_param = bpp.total();
  if (r.quick) {
    // Seed-calculator mode: parameters spread evenly over TP x PP, no activations.
    r.total_params = *r.options.num_parameters;
    r.flops_per_iteration = 6 * r.total_params * r.tokens_per_iteration;
    const double shard = static_cast<double>(par.tp * par.pp);
    const double dshard = par.use_distributed_optimizer ? static_cast<double>(r.dp * par.cp) : 1;
    for (int64_t p = 0; p < par.pp; ++p) {
      StageMemory s;
      s.pp_rank = p;
      s.dense_params = r.total_params / shard;
      s.param_bytes = s.dense_params * bpp.params;
      s.grad_bytes = s.dense_params * bpp.grads;
      s.optimizer_bytes = s.dense_params * bpp.optimizer / dshard;
      s.in_flight = r.in_flight.empty() ? 1 : r.in_flight[p];
      s.reserve_bytes = r.device.reserve_bytes;
      r.memory.stages.push_back(s);
    }
    for (size_t i = 0; i < r.memory.stages.size(); ++i)
      if (r.memory.stages[i].total_bytes() > r.memory.peak_bytes)
        r.memory.peak_bytes = r.memory.stages[i].total_bytes(), r.memory.peak_stage = i;
    r.warnings.push_back("planned from --num-parameters alone: no activation memory, FLOPs as 6 x parameters x tokens");
  } else {
    r.ffn = m.ffn();
    r.head_dim = m.head_dim();
    r.query_groups = m.query_groups();
    r.params = model::model_params(m, r.padded_vocab);
    r.total_params = static_cast<double>(r.params.total());
    r.megatron_params = model::megatron_param_count(m, r.padded_vocab);
    r.flops_per_iteration = megatron_flops_per_iteration(m, r.padded_vocab, r.global_batch);
    MemoryLayout layout{r.padded_vocab, r.dp, r.edp, r.etp, r.vpp, r.num_microbatches};
    MemoryReport mem = stage_memories(r, r.job, layout);
    mem.device_bytes = r.memory.device_bytes;
    mem.megatron = megatron_theoretical_memory(r.job, layout);
    r.memory = std::move(mem);
    plan_fit(r, layout);
    plan_trainer_buffers(r);
  }
  r.memory.model_state_bytes_per_param = bpp.total();
  r.memory.model_state_bytes = r.total_params * bpp.total();
  const bool half = r.job.precision.bf16 || r.job.precision.fp16;
  r.memory.weights_only_bytes = r.total_params * bpp.params;
  r.memory.checkpoint_bytes = r.total_params * (bpp.params + (half ? 4 : 0) + 4.0 * r.job.optimizer.state_tensors());
  r.memory.fits = r.memory.peak_bytes <= r.memory.device_bytes;
  if (!r.memory.fits)
    r.warnings.push_back(fmt::format("the most loaded rank needs {:.1f} GiB but the device has {:.1f} GiB",
                                     r.memory.peak_bytes / kGiB, r.memory.device_bytes / kGiB));
  plan_throughput(r);
  return r;
}

}  // namespace mt::plan
