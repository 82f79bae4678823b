#include <fmt/format.h>

#include <cmath>

#include "plan/render.h"

namespace mt::plan {

std::string group_digits(double v) {
  if (!std::isfinite(v)) return "?";
  bool neg = v < 0;
  std::string digits = fmt::format("{:.0f}", std::fabs(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return neg ? "-" + out : out;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kMiB = 1024.0 * 1024.0;

std::string gib(double b) { return fmt::format("{:.2f}", b / kGiB); }

std::string billions(double n) { return fmt::format("{:.2f}B", n / 1e9); }

std::string join_ranks(const std::vector<int64_t>& g) {
  // Long groups (DP over thousands of ranks) show their ends only.
  std::string s = "[";
  const size_t n = g.size(), head = n > 24 ? 8 : n;
  for (size_t i = 0; i < head; ++i) s += (i ? "," : "") + std::to_string(g[i]);
  if (head < n) s += fmt::format(",...({} more),{}", n - head - 1, g.back());
  return s + "]";
}

}  // namespace

std::string render_text(const PlanReport& r) {
  std::string o;
  auto line = [&](const std::string& s) { o += s + "\n"; };
  const auto& par = r.job.parallel;
  const auto& m = r.job.model;
  if (!r.valid()) {
    line(fmt::format("megatron plan: INVALID configuration ({} problem{})", r.errors.size(), r.errors.size() == 1 ? "" : "s"));
    for (const auto& v : r.errors) {
      std::string flags;
      for (const auto& f : v.flags) flags += (flags.empty() ? "" : ", ") + f;
      line(fmt::format("  error [{}] {}", flags, v.message));
      if (!v.suggestion.empty()) line(fmt::format("        fix: {}", v.suggestion));
    }
    for (const auto& w : r.warnings) line("  warning: " + w);
    return o;
  }
  line("megatron plan: configuration is VALID");
  for (const auto& w : r.warnings) line("  warning: " + w);

  line("\nLayout");
  line(fmt::format("  world size          {} (from {}), {} node{} x {} GPUs per node", r.world,
                   world_source_name(r.world_source), r.num_nodes, r.num_nodes == 1 ? "" : "s", par.gpus_per_node));
  line(fmt::format("  TP x PP x CP x DP   {} x {} x {} x {} = {}", par.tp, par.pp, par.cp, r.dp, r.world));
  if (m.is_moe() || par.ep > 1)
    line(fmt::format("  expert grid         ETP {} x EP {} x PP {} x expert-DP {}", r.etp, par.ep, par.pp, r.edp));
  line(fmt::format("  rank order          {}", r.grid->order()));
  line(fmt::format("  sequence parallel   {}   distributed optimizer {}   precision {}",
                   par.sequence_parallel ? "on" : "off", par.use_distributed_optimizer ? "on" : "off", r.job.precision.name()));

  line("\nBatch");
  line(fmt::format("  micro-batch {} x DP {} x accumulation {} = global batch {}", r.job.batch.micro_batch_size, r.dp,
                   r.num_microbatches, r.global_batch));
  line(fmt::format("  tokens per iteration {} (global batch {} x seq length {})", group_digits(r.tokens_per_iteration),
                   r.global_batch, m.seq_length));
  if (!r.batch_steps.empty()) {
    // --step-batch-size-schedule: the plan above is for its last (largest) step.
    std::string steps;
    for (const BatchStep& st : r.batch_steps)
      steps += fmt::format("{}{} from {} samples ({} tokens)", steps.empty() ? "" : ", ", st.batch,
                           group_digits(static_cast<double>(st.threshold)),
                           group_digits(static_cast<double>(st.threshold) * static_cast<double>(m.seq_length)));
    line("  step schedule       global batch " + steps + "; memory and throughput planned for the last");
  }
  if (r.eval_global_batch != r.global_batch)
    line(fmt::format("  validation batch    {} ({} micro-batches)", r.eval_global_batch, r.eval_microbatches));

  line("\nModel");
  if (r.quick) {
    line(fmt::format("  parameters          {} (given by --num-parameters)", group_digits(r.total_params)));
  } else {
    line(fmt::format("  L={} h={} a={} g={} d={} F={} s={} {}{}{}{}", m.num_layers, m.hidden_size, m.num_attention_heads,
                     r.query_groups, r.head_dim, r.ffn, m.seq_length, model::normalization_name(m.normalization),
                     m.swiglu ? " SwiGLU" : " GELU", m.position_embedding == model::PositionEmbedding::kRope ? " RoPE" : "",
                     m.untie_embeddings_and_output_weights ? " untied" : " tied"));
    if (m.mla())
      line(fmt::format("  attention           multi-latent: q {}, kv rank {}, heads of {} + {} rotated ({}), values {}",
                       m.q_lora_rank ? fmt::format("rank {}", *m.q_lora_rank) : std::string("full rank"),
                       m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim,
                       m.mla_yarn() ? fmt::format("YaRN x{}", m.rotary_scaling_factor) : std::string("RoPE"),
                       m.v_head_dim));
    if (m.mtp_layers())
      line(fmt::format("  multi-token pred.   {} MTP layer{} on the last stage (like layer {}{}), loss weight {}; {} parameters",
                       m.mtp_layers(), m.mtp_layers() > 1 ? "s" : "", m.num_layers - 1,
                       m.mtp_use_repeated_layer ? "; one layer repeated" : "", m.mtp_loss_scaling_factor,
                       group_digits(static_cast<double>(r.params.mtp))));
    line(fmt::format("  vocabulary          {} padded to {} (multiple of {} x TP {})", *m.vocab_size, r.padded_vocab,
                     m.make_vocab_size_divisible_by, par.tp));
    const std::string per_layer =
        m.is_moe() && m.has_dense_layers()  // --moe-layer-freq
            ? fmt::format("per MoE layer {} ({} of {}), per dense layer {}",
                          group_digits(static_cast<double>(r.params.per_layer)), m.num_moe_layers(), m.num_layers,
                          group_digits(static_cast<double>(r.params.dense_per_layer)))
            : fmt::format("per layer {}", group_digits(static_cast<double>(r.params.per_layer)));
    line(fmt::format("  parameters          {} ({}) total; embedding V x h = {}; {}", group_digits(r.total_params),
                     billions(r.total_params), group_digits(static_cast<double>(r.params.word_embedding)), per_layer));
    line(fmt::format("  Megatron's count    {} (no biases or position embedding)", group_digits(static_cast<double>(r.megatron_params.total))));
    std::string split;
    for (const auto& c : r.chunks)
      split += fmt::format("{}pp{}{}:{}-{}", split.empty() ? "" : " ", c.pp_rank, r.vpp > 1 ? fmt::format(".c{}", c.chunk) : "",
                           c.first_layer, c.first_layer + c.num_layers - 1);
    line("  layers per stage    " + split);
  }

  line(fmt::format("\nMemory per rank (GiB; device {} with {:.2f} GiB)", r.device.name, r.memory.device_bytes / kGiB));
  line("  stage  params/stage  params/rank   weights    grads  optimizer  activations(in flight)  transient  reserve    total");
  for (const auto& s : r.memory.stages) {
    line(fmt::format("  {:>5}  {:>12}  {:>11}  {:>7}  {:>7}  {:>9}  {:>11} ({:>3})         {:>9}  {:>7}  {:>7}{}", s.pp_rank,
                     r.quick ? "-" : billions(s.stage_params), billions(s.dense_params + s.expert_params), gib(s.param_bytes), gib(s.grad_bytes), gib(s.optimizer_bytes),
                     gib(s.activation_bytes), s.in_flight, gib(s.transient_bytes), gib(s.reserve_bytes), gib(s.total_bytes()),
                     s.total_bytes() > r.memory.device_bytes ? "  DOES NOT FIT" : ""));
  }
  line(fmt::format("  most loaded rank: stage {}, {} GiB: {}", r.memory.peak_stage, gib(r.memory.peak_bytes),
                   r.memory.fits ? "fits" : "does NOT fit"));
  if (!r.quick) {
    const auto& e = r.memory.megatron;
    line(fmt::format("  Megatron's estimate: weight and optimizer={:.2f} MB, activation={:.2f} MB, total={:.2f} MB ({} formula)",
                     e.weight_and_optimizer_bytes / kMiB, e.activation_bytes / kMiB, e.total_bytes() / kMiB,
                     e.sp_formula ? "SP + selective" : "non-SP"));
    for (const auto& f : r.fit_options)
      line(fmt::format("  {:<4} {:>8} GiB  {}", f.fits ? "fits" : "no", gib(f.peak_bytes), f.options));
  }
  if (r.memory.trainer.available) {
    // Pipeline rank 0, and the most loaded rank when another one is.
    const int64_t peak = r.memory.trainer_peak_stage, P = r.job.parallel.pp;
    auto trainer_line = [&](int64_t p) {
      const auto& t = r.memory.trainer_stages.empty() ? r.memory.trainer : r.memory.trainer_stages[static_cast<size_t>(p)];
      line(fmt::format("  this build's CPU trainer{}: {} GiB (weights {}, grads {}, 16-bit copies {}, optimizer state {}, activations {}, "
                       "scratch {}, comm buffers {})",
                       P == 1 ? std::string() : fmt::format(", pipeline rank {}{}", p, p == peak ? " (the most loaded)" : ""),
                       gib(t.total()), gib(t.params), gib(t.grads), gib(t.lowp), gib(t.optimizer), gib(t.activations),
                       gib(t.scratch), gib(t.comm)));
    };
    trainer_line(0);
    if (peak != 0) trainer_line(peak);
    for (size_t p = 1; p < r.memory.trainer_stages.size(); ++p)
      if (!r.memory.trainer_stages[p].available)
        line(fmt::format("  this build's CPU trainer, pipeline rank {}: not planned: {}", p,
                         r.memory.trainer_stages[p].why_not));
  }
  if (r.comm.available &&
      (r.comm.tp_bytes > 0 || r.comm.dp_bytes > 0 || r.comm.pp_bytes > 0 || r.comm.cp_bytes > 0 || r.comm.ep_bytes > 0)) {
    // Pipeline rank 0, and the rank that sends the most when another one does.
    auto total = [](const CommReport& c) { return c.tp_bytes + c.dp_bytes + c.pp_bytes + c.cp_bytes + c.ep_bytes; };
    int64_t busiest = 0;
    for (size_t p = 1; p < r.comm_stages.size(); ++p)
      if (total(r.comm_stages[p]) > total(r.comm_stages[static_cast<size_t>(busiest)])) busiest = static_cast<int64_t>(p);
    auto comm_line = [&](const CommReport& c, int64_t p) {
      line(fmt::format("  communication       per rank per iteration: TP {:.1f} MB, {} {:.1f} MB, PP {:.1f} MB{}{} "
                       "(this build's trainer, pipeline rank {}{})",
                       c.tp_bytes / 1e6, r.job.parallel.cp > 1 ? "DP x CP (gradients)" : "DP", c.dp_bytes / 1e6,
                       c.pp_bytes / 1e6,
                       r.job.parallel.cp > 1 ? fmt::format(", CP (attention) {:.1f} MB", c.cp_bytes / 1e6) : "",
                       r.job.parallel.ep > 1 ? fmt::format(", EP (tokens, balanced routing) {:.1f} MB", c.ep_bytes / 1e6)
                                             : "",
                       p, busiest != 0 && p == busiest ? ", the busiest" : ""));
    };
    comm_line(r.comm, 0);
    if (busiest != 0) comm_line(r.comm_stages[static_cast<size_t>(busiest)], busiest);
  }
  line(fmt::format("  model state         {} params x {:.0f} bytes = {:.1f} GB ({} precision, before any sharding)",
                   group_digits(r.total_params),
                   r.memory.model_state_bytes_per_param, r.memory.model_state_bytes / 1e9, r.job.precision.name()));
  line(fmt::format("  checkpoint          {:.1f} GB with optimizer state; weights only {:.1f} GB",
                   r.memory.checkpoint_bytes / 1e9, r.memory.weights_only_bytes / 1e9));

  line("\nPipeline");
  line(fmt::format("  schedule            {}, PP {}, virtual stages {}, {} micro-batches", parallel::schedule_kind_name(r.schedule_kind),
                   par.pp, r.vpp, r.num_microbatches));
  if (par.pp > 1) {
    line(fmt::format("  bubble              formula (P-1)/(P-1+{}M) = {}/{} = {:.3f}; simulated {:.3f}", r.vpp > 1 ? "V*" : "",
                     par.pp - 1, par.pp - 1 + r.vpp * r.num_microbatches, r.bubble_formula, r.bubble_simulated));
    std::string inflight;
    for (size_t i = 0; i < r.in_flight.size(); ++i) inflight += fmt::format("{}{}", i ? " " : "", r.in_flight[i]);
    line("  in flight per stage " + inflight + " (chunk-micro-batches)");
  } else {
    line("  bubble              0 (no pipeline)");
  }

  line("\nCompute");
  line(fmt::format("  FLOPs per iteration {:.4g} ({})", r.flops_per_iteration, r.quick ? "6 x params x tokens" : "Megatron's formula"));
  const auto& t = r.throughput;
  line(fmt::format("  {} step time {:.4g} s -> {} tokens/s, {:.1f} TFLOP/s per device, MFU {:.1f}% of {:.1f} TFLOP/s",
                   t.measured ? "given" : fmt::format("predicted (efficiency {:.0f}%)", r.options.assumed_efficiency * 100),
                   t.step_time_s, group_digits(std::round(t.tokens_per_s)), t.tflops_per_device, t.mfu * 100, t.peak_tflops));
  if (t.gemm_ceiling_tflops > 0)
    line(fmt::format("  {:.1f}% of the {:.0f} TFLOP/s bf16 GEMM ceiling measured on this device ({})",
                     t.of_gemm_ceiling * 100, t.gemm_ceiling_tflops, r.device.ceiling_source));

  line("\nRank grid (rank: node/gpu  tp cp ep dp pp)");
  const int64_t shown = std::min<int64_t>(r.world, 64);
  for (int64_t rank = 0; rank < shown; ++rank) {
    auto c = r.grid->coord(rank);
    line(fmt::format("  {:>5}: {:>3}/{:<2}  {:>2} {:>2} {:>2} {:>2} {:>2}", rank, rank / par.gpus_per_node,
                     rank % par.gpus_per_node, c.tp, c.cp, c.ep, c.dp, c.pp));
  }
  if (shown < r.world) line(fmt::format("  ... {} more ranks (use --json for all)", r.world - shown));
  line("\nGroups");
  using parallel::GroupKind;
  for (GroupKind k : {GroupKind::kTensor, GroupKind::kPipeline, GroupKind::kData, GroupKind::kContext, GroupKind::kDataContext,
                      GroupKind::kModel, GroupKind::kEmbedding, GroupKind::kPositionEmbedding, GroupKind::kExpert,
                      GroupKind::kExpertData}) {
    auto groups = r.grid->groups(k);
    std::string s;
    const size_t cap = 16;
    for (size_t i = 0; i < std::min(groups.size(), cap); ++i) s += (i ? " " : "") + join_ranks(groups[i]);
    if (groups.size() > cap) s += fmt::format(" ... ({} groups)", groups.size());
    line(fmt::format("  {:<19} {}", parallel::group_kind_name(k), s));
  }
  return o;
}

}  // namespace mt::plan
