#include "plan/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/checked.h"
#include "core/flags.h"
#include "model/gpt.h"
#include "parallel/layer_split.h"

namespace mt::plan {

std::vector<int64_t> nearby_multiples(int64_t of, int64_t target) {
  std::vector<int64_t> out;
  if (of <= 0) return out;
  int64_t lo = target / of * of, hi = lo == target ? target : add_sat(lo, of);
  if (lo == target) return {target};
  // nearest first
  if (lo >= of && (target - lo) <= (hi - target)) out = {lo, hi};
  else if (lo >= of) out = {hi, lo};
  else out = {hi};
  return out;
}

int64_t nearest_divisor(int64_t n, int64_t target) {
  int64_t best = 1;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d) continue;
    for (int64_t c : {d, n / d})
      if (std::llabs(c - target) < std::llabs(best - target) ||
          (std::llabs(c - target) == std::llabs(best - target) && c > best))
        best = c;
  }
  return best;
}

namespace {

std::string list_or(const std::vector<int64_t>& v, const std::string& flag) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " or " : "") + fmt::format("{} {}", flag, v[i]);
  return s;
}

struct Checker {
  PlanReport& r;
  void error(std::string rule, std::vector<std::string> flags, std::string msg, std::string fix) {
    r.errors.push_back({std::move(rule), std::move(flags), std::move(msg), std::move(fix)});
  }
  void warn(std::string msg) { r.warnings.push_back(std::move(msg)); }
};

}  // namespace

void validate(PlanReport& r) {
  Checker c{r};
  JobConfig& j = r.job;
  auto& par = j.parallel;
  auto& m = j.model;
  const int64_t W = par.world_size.value_or(1);
  const int64_t TP = par.tp, PP = par.pp, CP = par.cp, EP = par.ep;
  const int64_t ETP = par.etp.value_or(TP);
  r.etp = ETP;
  constexpr int64_t kMaxRanks = int64_t{1} << 24;

  // ---- Megatron flags kept for launch scripts (plan/job.h MegatronCompat)
  for (const auto& [flag, why] : j.compat.refused) c.warn(fmt::format("megatron train refuses {}: {}", flag, why));

  // ---- precision
  if (j.precision.bf16 && j.precision.fp16)
    c.error("precision", {"--bf16", "--fp16"}, "--bf16 and --fp16 are both set", "choose one of them");
  if (j.precision.fp32_residual_connection && !j.precision.bf16 && !j.precision.fp16)
    c.error("fp32-residual-needs-half", {"--fp32-residual-connection"},
            "--fp32-residual-connection needs --bf16 or --fp16 (the residual is already fp32 otherwise)",
            "add --bf16, or drop --fp32-residual-connection");

  // ---- world size and the dense grid
  const int64_t model_size = mul_sat(TP, PP, CP);
  bool dp_known = false;
  if (model_size > kMaxRanks || W > kMaxRanks) {
    c.error("too-many-ranks", {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"},
            fmt::format("TP x PP x CP = {} ranks exceeds the planner's limit of {}", model_size, kMaxRanks),
            "use smaller parallel sizes");
  } else if (W % model_size != 0) {
    std::vector<std::string> flags = {"--world-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size"};
    if (CP > 1) flags.push_back("--context-parallel-size");
    c.error("world-divisible", flags,
            fmt::format("world size {} is not divisible by TP x PP x CP = {} x {} x {} = {}", W, TP, PP, CP, model_size),
            fmt::format("use {}, or sizes whose product divides {}", list_or(nearby_multiples(model_size, W), "--world-size"), W));
  } else {
    r.dp = W / model_size;
    dp_known = true;
  }
  if (par.dp) {
    const int64_t product = mul_sat(TP, PP, CP, *par.dp);
    if (product != W) {
      std::vector<std::string> flags = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size"};
      if (CP > 1) flags.push_back("--context-parallel-size");
      flags.push_back("--data-parallel-size");
      flags.push_back("--world-size");
      std::string fix = fmt::format("use --world-size {}", product);
      if (model_size <= W && W % model_size == 0)
        fix += fmt::format(", or --data-parallel-size {}", W / model_size);
      c.error("data-parallel-product", flags,
              fmt::format("TP x PP x {}DP = {} x {} x {}{} = {}, but the world size is {}", CP > 1 ? "CP x " : "", TP, PP,
                          CP > 1 ? fmt::format("{} x ", CP) : "", *par.dp, product, W),
              fix);
      dp_known = false;
    }
  }

  // ---- expert grid
  // With EP = 1 and ETP = TP the expert grid divides whenever the dense one
  // does, so it is only checked (and reported) when it differs.
  const int64_t expert_size = mul_sat(ETP, EP, PP);
  const bool expert_grid_differs = EP > 1 || ETP != TP;
  if (expert_size <= kMaxRanks && W % expert_size != 0 && expert_grid_differs) {
    c.error("expert-grid-divisible", {"--world-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--pipeline-model-parallel-size"},
            fmt::format("world size {} is not divisible by ETP x EP x PP = {} x {} x {} = {}", W, ETP, EP, PP, expert_size),
            fmt::format("use {}", list_or(nearby_multiples(expert_size, W), "--world-size")));
  } else if (expert_size <= kMaxRanks && W % expert_size == 0) {
    r.edp = W / expert_size;
    if (par.use_tp_pp_dp_mapping && PP > 1 && dp_known && r.edp != r.dp)
      c.error("expert-dp-order", {"--use-tp-pp-dp-mapping", "--expert-model-parallel-size", "--expert-tensor-parallel-size"},
              fmt::format("with --use-tp-pp-dp-mapping and PP > 1 the expert data-parallel size ({}) must equal the data-parallel size ({})", r.edp, r.dp),
              "drop --use-tp-pp-dp-mapping, or make ETP x EP equal TP x CP");
  }

  // ---- MoE
  if (EP > 1 && m.num_experts == 0)
    c.error("moe-experts-required", {"--expert-model-parallel-size", "--num-experts"},
            fmt::format("--expert-model-parallel-size {} needs --num-experts", EP), "give --num-experts, or drop expert parallelism");
  if (m.num_experts > 0 && m.num_experts % EP != 0)
    c.error("moe-experts-divisible", {"--num-experts", "--expert-model-parallel-size"},
            fmt::format("{} experts do not split over EP = {}", m.num_experts, EP),
            fmt::format("use --expert-model-parallel-size {} or {}", nearest_divisor(m.num_experts, EP),
                        list_or(nearby_multiples(EP, m.num_experts), "--num-experts")));
  if (m.num_experts > 0 && m.moe_router_topk > m.num_experts)
    c.error("moe-topk", {"--moe-router-topk", "--num-experts"},
            fmt::format("each token is routed to {} experts but there are only {}", m.moe_router_topk, m.num_experts),
            fmt::format("use --moe-router-topk {} or fewer", m.num_experts));
  // Megatron's TransformerConfig asserts (spec §4.5).
  if (m.num_experts > 0 && m.add_bias_linear && ETP != 1)
    c.error("moe-bias-etp", {"--num-experts", "--disable-bias-linear", "--expert-tensor-parallel-size"},
            fmt::format("MoE with linear biases needs an expert tensor-parallel size of 1, not {} (Megatron: \"Bias in "
                        "Moe is only supported when ETP==1\")",
                        ETP),
            "add --disable-bias-linear, or --expert-tensor-parallel-size 1");
  if (m.num_experts > 0 && m.moe_router_topk == 1 && !m.moe_router_pre_softmax && !m.sigmoid_router())
    c.error("moe-top1-pre-softmax", {"--moe-router-topk", "--moe-router-pre-softmax"},
            "a top-1 softmax router over the chosen logit alone always gives 1 (Megatron: \"Please use "
            "--moe-router-pre-softmax when topk is 1\")",
            "add --moe-router-pre-softmax, or raise --moe-router-topk");
  if (m.num_experts > 0 && m.moe_router_group_topk > 0) {
    const int64_t G = m.moe_router_num_groups, gk = m.moe_router_group_topk;
    if (G < 1)
      c.error("moe-group-routing", {"--moe-router-group-topk", "--moe-router-num-groups"},
              fmt::format("--moe-router-group-topk {} needs --moe-router-num-groups", gk),
              "give --moe-router-num-groups (a divisor of --num-experts), or drop --moe-router-group-topk");
    else if (m.num_experts % G != 0 || gk > G)
      c.error("moe-group-routing", {"--moe-router-num-groups", "--moe-router-group-topk", "--num-experts"},
              fmt::format("{} experts in {} groups choosing {} groups: the groups must divide the experts and be at "
                          "least the groups chosen",
                          m.num_experts, G, gk),
              fmt::format("use {}", list_or(nearby_multiples(G, m.num_experts), "--num-experts")));
  }
  if (m.num_experts > 0 && m.num_layers > 0) {
    if (auto pat = model::moe_layer_pattern(m.moe_layer_freq, m.num_layers); !pat.is_ok())
      c.error("moe-layer-freq", {"--moe-layer-freq", "--num-layers"}, pat.status().message(),
              fmt::format("give an integer, or a list with {} terms of 0 or 1", m.num_layers));
    else if (m.num_moe_layers() == 0)
      c.error("moe-layer-freq-none", {"--moe-layer-freq", "--num-experts"},
              fmt::format("--moe-layer-freq '{}' makes every layer dense", m.moe_layer_freq),
              "give at least one 1, or drop --num-experts");
  }
  if (m.num_experts > 0 && EP > 1 && TP > 1 && !par.sequence_parallel)
    c.warn("Megatron: with expert and tensor parallelism, sequence parallelism must be used (--sequence-parallel)");

  // ---- batch
  if (j.batch.micro_batch_size <= 0)
    c.error("micro-batch-required", {"--micro-batch-size"}, "--micro-batch-size is required", "give --micro-batch-size, e.g. 1");
  const auto& bc = j.batch;
  if (bc.step_batch_size_schedule && bc.global_batch_size)
    c.error("step-schedule-global-batch", {"--step-batch-size-schedule", "--global-batch-size"},
            "--step-batch-size-schedule sets the global batch: Megatron refuses --global-batch-size with it",
            "drop --global-batch-size (the schedule's last step is the final batch)");
  if (bc.step_batch_size_schedule && bc.decrease_batch_size_if_needed)
    c.error("step-schedule-decrease", {"--step-batch-size-schedule", "--decrease-batch-size-if-needed"},
            "Megatron's step schedules do not round batch sizes down: every step must divide by micro-batch x DP",
            "drop --decrease-batch-size-if-needed");
  if (bc.eval_micro_batch_size && *bc.eval_micro_batch_size != bc.micro_batch_size)
    c.error("eval-micro-batch", {"--eval-micro-batch-size", "--micro-batch-size"},
            fmt::format("--eval-micro-batch-size {} differs from --micro-batch-size {}: validation runs on the "
                        "training micro-batch here (the model's buffers are planned for it)",
                        *bc.eval_micro_batch_size, bc.micro_batch_size),
            "drop --eval-micro-batch-size (set --eval-global-batch-size for the validation batch)");
  if (dp_known && bc.micro_batch_size > 0) {
    const int64_t per_step = mul_sat(bc.micro_batch_size, r.dp);
    r.requested_global_batch = bc.global_batch_size.value_or(per_step);
    r.global_batch = r.requested_global_batch;
    if (bc.step_batch_size_schedule) {
      auto steps = parse_step_batch_size_schedule(*bc.step_batch_size_schedule, m.seq_length);
      std::string too_large;
      if (steps)
        for (const BatchStep& st : *steps)
          if (st.batch > (int64_t{1} << 32)) too_large += fmt::format("{}{}", too_large.empty() ? "" : ", ", st.batch);
      r.global_batch = 0;  // no micro-batch count to check until the schedule is valid
      if (!steps || !too_large.empty()) {
        c.error("step-schedule", {"--step-batch-size-schedule"},
                steps ? fmt::format("--step-batch-size-schedule: batch sizes {} are above 2^32 sequences", too_large)
                      : steps.status().message(),
                "write THRESHOLD:BATCH pairs, thresholds in tokens and the first 0, e.g. \"0:256 250B:512\"");
      } else {
        // Megatron asserts, as the run reaches each batch, that it divides
        // by micro-batch x DP and that the micro-batches never get fewer:
        // here before the run, for the batches it uses between the samples
        // consumed at its start (a resumed run) and its end.
        const std::vector<BatchStep> used =
            steps_in_force(*steps, r.options.batch_from_samples, r.options.batch_to_samples);
        std::string not_multiple, shrinking;
        for (size_t k = 0; k < used.size(); ++k) {
          const BatchStep& st = used[k];
          if (st.batch % per_step)
            not_multiple += fmt::format("{}{} (from {} samples)", not_multiple.empty() ? "" : ", ", st.batch, st.threshold);
          if (k > 0 && st.batch < used[k - 1].batch)
            shrinking += fmt::format("{}{} after {}", shrinking.empty() ? "" : ", ", st.batch, used[k - 1].batch);
        }
        if (!not_multiple.empty())
          c.error("step-schedule-divisible", {"--step-batch-size-schedule", "--micro-batch-size", "--data-parallel-size"},
                  fmt::format("batch sizes {} are not multiples of micro-batch {} x DP {} = {}", not_multiple,
                              bc.micro_batch_size, r.dp, per_step),
                  fmt::format("use multiples of {}", per_step));
        if (!shrinking.empty())
          c.error("step-schedule-shrinks", {"--step-batch-size-schedule"},
                  fmt::format("the batch size falls ({}): Megatron stops when the number of micro-batches decreases",
                              shrinking),
                  "make the batch sizes non-decreasing");
        if (not_multiple.empty() && shrinking.empty()) {
          r.batch_steps = *steps;
          r.batch_steps_used = used;
          // The model is sized for the largest batch the run uses.
          for (const BatchStep& st : used) r.global_batch = std::max(r.global_batch, st.batch);
        }
      }
    } else if (bc.decrease_batch_size_if_needed) {
      // Megatron's running batch: rounded down, at least one micro-batch.
      r.global_batch = r.requested_global_batch / per_step * per_step;
      if (r.global_batch == 0)
        c.error("global-batch-at-least-one", {"--global-batch-size", "--micro-batch-size", "--data-parallel-size"},
                fmt::format("global batch {} rounds down to no micro-batch of micro-batch {} x DP {} = {}",
                            r.requested_global_batch, bc.micro_batch_size, r.dp, per_step),
                fmt::format("use --global-batch-size {} or more", per_step));
      else if (r.global_batch != r.requested_global_batch)
        c.warn(fmt::format("--decrease-batch-size-if-needed: training on a global batch of {} (the {} asked for, "
                           "rounded down to a multiple of micro-batch x DP = {})",
                           r.global_batch, r.requested_global_batch, per_step));
    }
    if (!bc.step_batch_size_schedule && !bc.decrease_batch_size_if_needed && r.global_batch % per_step != 0)
      c.error("global-batch-divisible", {"--global-batch-size", "--micro-batch-size", "--data-parallel-size"},
              fmt::format("global batch {} is not divisible by micro-batch {} x DP {} = {}", r.global_batch,
                          bc.micro_batch_size, r.dp, per_step),
              fmt::format("use {}", list_or(nearby_multiples(per_step, r.global_batch), "--global-batch-size")));
    else if (r.global_batch % per_step == 0 && r.global_batch > 0)
      r.num_microbatches = r.global_batch / per_step;
    else if (r.global_batch == 0)
      r.num_microbatches = 0;  // an invalid schedule: no count to check
    // Validation's batch (Megatron's eval_global_batch_size rule).
    // (A default that fails with the training batch's own rule is not repeated.)
    r.eval_global_batch = bc.eval_global_batch_size.value_or(r.requested_global_batch);
    const bool same_fault = !bc.eval_global_batch_size && !bc.step_batch_size_schedule &&
                            !bc.decrease_batch_size_if_needed && r.requested_global_batch % per_step != 0;
    if (same_fault) {
      // reported above
    } else if (r.eval_global_batch % per_step != 0)
      c.error("eval-global-batch-divisible", {"--eval-global-batch-size", "--micro-batch-size", "--data-parallel-size"},
              fmt::format("the validation batch {}{} is not divisible by micro-batch {} x DP {} = {}", r.eval_global_batch,
                          bc.eval_global_batch_size ? "" : " (Megatron's default: --global-batch-size as given)",
                          bc.micro_batch_size, r.dp, per_step),
              fmt::format("use {}", list_or(nearby_multiples(per_step, r.eval_global_batch), "--eval-global-batch-size")));
    else
      r.eval_microbatches = r.eval_global_batch / per_step;
  }
  if (!bc.rampup_batch_size.empty()) {
    // Megatron warns and ignores it; the note says what to write instead.
    std::vector<int64_t> v;
    for (const std::string& t : bc.rampup_batch_size) {
      int64_t x = 0;
      if (!parse_int("--rampup-batch-size", t, INT64_MIN, INT64_MAX, &x)) break;
      v.push_back(x);
    }
    if (v.size() != 3 || bc.rampup_batch_size.size() != 3) {
      c.error("rampup-batch-size", {"--rampup-batch-size"},
              fmt::format("--rampup-batch-size takes three integers (START INCREMENT SAMPLES), got '{}'",
                          fmt::join(bc.rampup_batch_size, " ")),
              "drop it (Megatron ignores it), or use --step-batch-size-schedule");
    } else {
      std::string note = "--rampup-batch-size: deprecated, and ignored as by Megatron (";
      if (bc.step_batch_size_schedule) {
        note += "--step-batch-size-schedule sets the batch)";
      } else {
        auto eq = rampup_as_step_schedule(v[0], v[1], v[2], r.requested_global_batch, m.seq_length);
        note += fmt::format("the global batch stays {})", r.global_batch);
        if (eq && m.seq_length > 0)
          note += fmt::format("; the ramp it describes is --step-batch-size-schedule \"{}\" in place of "
                              "--global-batch-size",
                              *eq);
        else if (!eq)
          note += "; " + eq.status().message();
      }
      r.no_effect.push_back(note);
      c.warn(note);
    }
  }

  // ---- model shape
  r.quick = r.options.num_parameters.has_value() && !m.num_layers && !m.hidden_size && !m.num_attention_heads;
  if (r.options.num_parameters && (m.num_layers || m.hidden_size || m.num_attention_heads))
    c.error("num-parameters-with-architecture", {"--num-parameters", "--num-layers", "--hidden-size", "--num-attention-heads"},
            "--num-parameters is a shortcut for planning without an architecture, but architecture flags are given too",
            "drop --num-parameters (the count then comes from the architecture), or drop the architecture flags");
  if (!m.seq_length)
    c.error("required", {"--seq-length"}, "--seq-length is required", "give --seq-length, e.g. 2048");
  if (!r.quick) {
    for (auto [v, flag] : {std::pair{m.num_layers, "--num-layers"}, {m.hidden_size, "--hidden-size"},
                          {m.num_attention_heads, "--num-attention-heads"},
                          {m.max_position_embeddings, "--max-position-embeddings"}})
      if (!v)
        c.error("required", {flag}, fmt::format("{} is required (Megatron has no default)", flag),
                std::string(flag) == "--max-position-embeddings" ? "give --max-position-embeddings, usually equal to --seq-length"
                                                                 : fmt::format("give {}", flag));
    if (!m.vocab_size)
      c.error("vocab-required", {"--vocab-size", "--vocab-file"}, "the vocabulary size is unknown",
              "give --vocab-size N (e.g. 50257 for GPT-2, 32000 for LLaMA-2) or --vocab-file vocab.json");
  }
  const bool arch = !r.quick && m.has_architecture();
  if (arch) {
    const int64_t a = m.num_attention_heads, g = m.query_groups(), h = m.hidden_size;
    if (a % TP != 0)
      c.error("heads-divisible", {"--num-attention-heads", "--tensor-model-parallel-size"},
              fmt::format("{} attention heads do not split over TP = {}", a, TP),
              fmt::format("use --tensor-model-parallel-size {}", nearest_divisor(a, TP)));
    if (m.group_query_attention && g % TP != 0 && TP % g != 0)
      c.error("query-groups-tp", {"--num-query-groups", "--tensor-model-parallel-size"},
              fmt::format("{} query groups are neither a multiple nor a divisor of TP = {}", g, TP),
              fmt::format("use --tensor-model-parallel-size {}", nearest_divisor(g, TP)));
    else if (m.group_query_attention && g < TP)
      c.warn(fmt::format("{} query groups < TP = {}: each key/value head is replicated on {} TP ranks (Megatron-Core >= 0.16)", g, TP, TP / g));
    if (a % g != 0)
      c.error("heads-per-group", {"--num-attention-heads", "--num-query-groups"},
              fmt::format("{} attention heads do not divide into {} query groups", a, g),
              fmt::format("use --num-query-groups {}", nearest_divisor(a, g)));
    if (m.mla()) {
      // Megatron's checks (arguments.py, MLATransformerConfig, TransformerConfig)
      // and this program's own limits.
      if (m.group_query_attention)
        c.error("mla-gqa", {"--multi-latent-attention", "--group-query-attention"},
                "multi-latent attention has one key/value head per query head (Megatron asserts the two are exclusive)",
                "drop --group-query-attention");
      if (m.rotary_interleaved)
        c.error("mla-rotary-interleaved", {"--multi-latent-attention", "--rotary-interleaved"},
                "rotary_interleaved does not work with multi-latent attention (Megatron raises it)",
                "drop --rotary-interleaved: MLA pairs its position dims itself");
      if (!m.mla_yarn() && m.position_embedding == model::PositionEmbedding::kRope && !r.job.compat.has("no-rope-fusion"))
        c.error("mla-rope-fusion", {"--rope-type", "--no-rope-fusion"},
                "with --position-embedding-type rope Megatron fuses RoPE, and its fused MLA RoPE takes only YaRN "
                "(MLATransformerConfig raises for --rope-type rope)",
                "add --no-rope-fusion, or use --rope-type yarn");
      if (m.qk_pos_emb_head_dim % 2)
        c.error("mla-pos-dims-even", {"--qk-pos-emb-head-dim"},
                fmt::format("--qk-pos-emb-head-dim {} is odd, and RoPE rotates pairs of dims", m.qk_pos_emb_head_dim),
                fmt::format("use --qk-pos-emb-head-dim {}", m.qk_pos_emb_head_dim + 1));
      else if (m.rotary_freq_dim() <= 0)
        c.error("mla-rotary-percent", {"--rotary-percent", "--qk-pos-emb-head-dim"},
                fmt::format("--rotary-percent {} rotates none of the {} position dims", m.rotary_percent,
                            m.qk_pos_emb_head_dim),
                "raise --rotary-percent, or use --rope-type yarn (which rotates them all)");
      if (m.v_head_dim > m.head_dim())
        c.error("mla-v-head-dim", {"--v-head-dim", "--qk-head-dim", "--qk-pos-emb-head-dim"},
                fmt::format("--v-head-dim {} is above the query/key head width {} + {}: the attention kernel here pads "
                            "the values to that width and cannot take wider ones",
                            m.v_head_dim, m.qk_head_dim, m.qk_pos_emb_head_dim),
                fmt::format("use --v-head-dim {} or less", m.head_dim()));
      if (m.add_qkv_bias)
        c.warn("--add-qkv-bias has no effect with --multi-latent-attention: MLA's projections have no biases (Megatron "
               "builds them without, whatever --add-qkv-bias says)");
      if (m.qk_layernorm && !m.q_lora_rank)
        c.error("mla-qk-norm-without-q-lora", {"--qk-layernorm", "--q-lora-rank"},
                "--qk-layernorm without --q-lora-rank: Megatron then normalises the hidden state before linear_q_proj "
                "(Transformer Engine's fused norm and linear; its local implementation refuses the pair), a norm "
                "this build does not have",
                "give --q-lora-rank (the query's norm then acts on its low-rank projection), or drop --qk-layernorm");
    } else if (m.rope_type == "yarn") {
      c.error("rope-type-yarn-without-mla", {"--rope-type", "--multi-latent-attention"},
              "--rope-type yarn is multi-latent attention's RoPE: Megatron's other attention takes only rope",
              "add --multi-latent-attention, or drop --rope-type");
    }
    if (r.job.compat.has("mla-down-proj-fusion") && (!m.mla() || !m.q_lora_rank))
      c.error("mla-down-proj-fusion", {"--mla-down-proj-fusion", "--multi-latent-attention", "--q-lora-rank"},
              "--mla-down-proj-fusion fuses multi-latent attention's q and kv down projections: Megatron requires "
              "--multi-latent-attention and --q-lora-rank",
              "drop --mla-down-proj-fusion, or use it with --multi-latent-attention --q-lora-rank N");
    if (m.mtp_layers() && m.position_embedding == model::PositionEmbedding::kLearnedAbsolute)
      c.error("mtp-position-embedding", {"--mtp-num-layers", "--position-embedding-type"},
              "multi-token prediction with learned absolute position embeddings: Megatron supports MTP with rope and "
              "none only (arguments.py asserts it)",
              "use --position-embedding-type rope (or none)");
    if (m.mtp_layers() && h % TP != 0)
      c.error("mtp-hidden-divisible", {"--mtp-num-layers", "--hidden-size", "--tensor-model-parallel-size"},
              fmt::format("the MTP layers' eh_proj splits its {} output features over TP = {}", h, TP),
              fmt::format("use {}", list_or(nearby_multiples(TP, h), "--hidden-size")));
    if (!m.kv_channels && h % a != 0)  // (also with MLA, which ignores --kv-channels: Megatron asserts it)
      c.error("hidden-heads", {"--hidden-size", "--num-attention-heads", "--kv-channels"},
              fmt::format("hidden size {} is not divisible by {} heads, and --kv-channels is not given", h, a),
              fmt::format("use {}, or give --kv-channels", list_or(nearby_multiples(a, h), "--hidden-size")));
    if (m.has_dense_layers() && m.ffn() % TP != 0)
      c.error("ffn-divisible", {"--ffn-hidden-size", "--tensor-model-parallel-size"},
              fmt::format("FFN hidden size {} does not split over TP = {}", m.ffn(), TP),
              fmt::format("use {}", list_or(nearby_multiples(TP, m.ffn()), "--ffn-hidden-size")));
    if (m.is_moe() && m.moe_ffn() % ETP != 0)
      c.error("moe-ffn-divisible", {"--moe-ffn-hidden-size", "--expert-tensor-parallel-size"},
              fmt::format("expert FFN hidden size {} does not split over ETP = {}", m.moe_ffn(), ETP),
              fmt::format("use {}", list_or(nearby_multiples(ETP, m.moe_ffn()), "--moe-ffn-hidden-size")));
    if (m.has_shared_expert() && m.moe_shared_expert_intermediate_size % TP != 0)
      c.error("moe-shared-expert-divisible", {"--moe-shared-expert-intermediate-size", "--tensor-model-parallel-size"},
              fmt::format("shared expert size {} does not split over TP = {}", m.moe_shared_expert_intermediate_size, TP),
              fmt::format("use {}", list_or(nearby_multiples(TP, m.moe_shared_expert_intermediate_size),
                                            "--moe-shared-expert-intermediate-size")));
    if (m.moe_router_enable_expert_bias && m.moe_router_score_function != "sigmoid")
      c.error("moe-expert-bias-sigmoid", {"--moe-router-enable-expert-bias", "--moe-router-score-function"},
              "the aux-loss-free expert bias needs the sigmoid score function",
              "add --moe-router-score-function sigmoid");
    if (m.moe_shared_expert_gate && !m.has_shared_expert())
      c.error("moe-shared-expert-gate-needs-expert", {"--moe-shared-expert-gate", "--moe-shared-expert-intermediate-size"},
              "the gate multiplies the shared expert's output, and there is no shared expert",
              "give --moe-shared-expert-intermediate-size, or drop --moe-shared-expert-gate");
    if (m.moe_shared_expert_intermediate_size > 0 && !m.is_moe())
      c.error("moe-shared-expert-needs-experts", {"--moe-shared-expert-intermediate-size", "--num-experts"},
              "a shared expert is part of an MoE layer, and there are no experts", "give --num-experts, or drop the flag");
    if (m.ffn() <= 0)
      c.error("ffn-size", {"--hidden-size", "--ffn-hidden-size"}, fmt::format("the derived FFN hidden size is {}", m.ffn()),
              "give --ffn-hidden-size");
    {  // keep every later count exact in int64 (and in double)
      const double dh = h, dd = m.head_dim(), dF = m.ffn(), dE = std::max<int64_t>(1, m.num_experts);
      const double approx = m.num_layers * (2 * dh * dd * (a + 2.0 * g) +
                                            static_cast<double>(m.mla() ? m.kv_lora_rank + m.q_lora_rank.value_or(0) : 0) *
                                                (dh + a * dd) +
                                            3 * dh * std::max<double>(dF, m.moe_ffn()) * dE) +
                            2 * dh * static_cast<double>(m.vocab_size.value_or(0) + m.make_vocab_size_divisible_by * TP) +
                            dh * static_cast<double>(m.max_position_embeddings);
      if (approx > 1e15)
        c.error("model-too-large", {"--num-layers", "--hidden-size", "--ffn-hidden-size"},
                fmt::format("the model would have about {:.3g} parameters, beyond what the planner handles (1e15)", approx),
                "check the sizes for a typo");
    }
    if (m.max_position_embeddings && m.seq_length && m.max_position_embeddings < m.seq_length)
      c.error("seq-vs-positions", {"--max-position-embeddings", "--seq-length"},
              fmt::format("max_position_embeddings {} is smaller than seq_length {}", m.max_position_embeddings, m.seq_length),
              fmt::format("use --max-position-embeddings {} (or more)", m.seq_length));
  }
  if (m.seq_length && CP > 1 && m.seq_length % (2 * CP) != 0)
    c.error("cp-seq-divisible", {"--seq-length", "--context-parallel-size"},
            fmt::format("with CP = {} the sequence length {} must be a multiple of 2 x CP = {}", CP, m.seq_length, 2 * CP),
            fmt::format("use {}", list_or(nearby_multiples(2 * CP, m.seq_length), "--seq-length")));
  if (!par.cp_comm_type.empty()) {
    for (const std::string& t : par.cp_comm_type)
      if (t != "p2p" && t != "a2a" && t != "allgather" && t != "a2a+p2p")
        c.error("cp-comm-type", {"--cp-comm-type"},
                fmt::format("--cp-comm-type {} is not one of p2p, a2a, allgather, a2a+p2p", t),
                "use p2p (Megatron's default) or allgather");
    if (par.cp_comm_type.size() > 1 && m.num_layers && static_cast<int64_t>(par.cp_comm_type.size()) != m.num_layers)
      c.error("cp-comm-type-layers", {"--cp-comm-type", "--num-layers"},
              fmt::format("--cp-comm-type gives {} types, but a list must have one per layer ({})",
                          par.cp_comm_type.size(), m.num_layers),
              "give one type for every layer, or a single type");
    if (std::find(par.cp_comm_type.begin(), par.cp_comm_type.end(), "a2a+p2p") != par.cp_comm_type.end() &&
        par.hierarchical_cp_sizes.empty())
      c.error("cp-comm-type-hierarchical", {"--cp-comm-type", "--hierarchical-context-parallel-sizes"},
              "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes (Megatron asserts it)",
              fmt::format("add --hierarchical-context-parallel-sizes with a product of {} (e.g. {} 1), or use p2p",
                          CP, CP));
  }
  // Megatron's levels of the CP group: positive integers whose product is CP.
  if (!par.hierarchical_cp_sizes.empty()) {
    int64_t product = 1;
    bool ok = true;
    for (const std::string& v : par.hierarchical_cp_sizes) {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < 1 || x > kMaxRanks) {
        ok = false;
        c.error("hierarchical-cp-sizes-integer", {"--hierarchical-context-parallel-sizes"},
                fmt::format("--hierarchical-context-parallel-sizes: '{}' is not a positive integer", v),
                fmt::format("give sizes whose product is the context-parallel size {}", CP));
        break;
      }
      product = std::min<int64_t>(product * x, kMaxRanks + 1);  // saturates: no overflow, and != CP
    }
    if (ok && product != CP)
      c.error("hierarchical-cp-sizes-product", {"--hierarchical-context-parallel-sizes", "--context-parallel-size"},
              fmt::format("the product of --hierarchical-context-parallel-sizes is {}, but --context-parallel-size "
                          "is {} (Megatron asserts they are equal)",
                          product, CP),
              fmt::format("give sizes whose product is {}", CP));
    r.no_effect.push_back(
        "--hierarchical-context-parallel-sizes: context parallelism here all-gathers Q/K/V over the whole CP group; "
        "the levels of an a2a+p2p exchange compute the same attention");
  }
  // --tp-comm-overlap changes nothing here, but Megatron asserts it needs SP.
  for (const std::string& n : j.compat.no_effect)
    if (n.rfind("--tp-comm-overlap:", 0) == 0 && !par.sequence_parallel)
      c.error("tp-comm-overlap-sp", {"--tp-comm-overlap", "--sequence-parallel"},
              "--tp-comm-overlap needs sequence parallelism (Megatron: \"can happen only when sequence parallelism "
              "is enabled\")",
              TP > 1 ? "add --sequence-parallel, or drop --tp-comm-overlap"
                     : "drop --tp-comm-overlap (with TP 1 there is no tensor-parallel communication to overlap)");
  if (par.sequence_parallel && TP == 1)
    c.error("sp-needs-tp", {"--sequence-parallel", "--tensor-model-parallel-size"},
            "--sequence-parallel needs tensor parallelism (TP > 1); Megatron's launcher would silently switch it off",
            "drop --sequence-parallel, or use --tensor-model-parallel-size 2 or more");
  if (par.sequence_parallel && TP > 1 && m.seq_length && (m.seq_length % CP == 0) && (m.seq_length / CP) % TP != 0)
    c.error("sp-seq-divisible", {"--seq-length", "--tensor-model-parallel-size", "--sequence-parallel"},
            fmt::format("with sequence parallelism, seq_length/CP = {} must be divisible by TP = {}", m.seq_length / CP, TP),
            fmt::format("use {}", list_or(nearby_multiples(TP * CP, m.seq_length), "--seq-length")));

  // ---- pipeline split and virtual stages
  const bool uneven = par.decoder_first_pipeline_num_layers || par.decoder_last_pipeline_num_layers;
  const int64_t Lp = m.num_layers + par.account_for_embedding_in_pipeline_split + par.account_for_loss_in_pipeline_split;
  r.vpp = 1;
  bool split_ok = arch;
  if (par.num_layers_per_virtual_pipeline_stage && par.num_virtual_stages_per_pipeline_rank) {
    c.error("one-vpp-spec", {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"},
            "no more than one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank can be set",
            "keep one of them");
    split_ok = false;
  }
  if (uneven && (par.account_for_embedding_in_pipeline_split || par.account_for_loss_in_pipeline_split)) {
    c.error("uneven-with-account", {"--decoder-first-pipeline-num-layers", "--account-for-embedding-in-pipeline-split"},
            "explicit first/last stage sizes cannot be combined with --account-for-*-in-pipeline-split", "use one way of splitting");
    split_ok = false;
  }
  if (uneven && par.num_layers_per_virtual_pipeline_stage) {
    c.error("uneven-with-vpp-layers", {"--decoder-first-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage"},
            "uneven pipeline stages cannot be combined with --num-layers-per-virtual-pipeline-stage",
            "use --num-virtual-stages-per-pipeline-rank instead");
    split_ok = false;
  }
  if (uneven && PP < 2) {
    c.error("uneven-needs-pp", {"--decoder-first-pipeline-num-layers", "--pipeline-model-parallel-size"},
            "first/last pipeline stage sizes need --pipeline-model-parallel-size 2 or more", "drop them or use pipeline parallelism");
    split_ok = false;
  }
  for (auto [v, flag] : {std::pair{par.decoder_first_pipeline_num_layers, "--decoder-first-pipeline-num-layers"},
                        {par.decoder_last_pipeline_num_layers, "--decoder-last-pipeline-num-layers"}})
    if (v && *v <= 0) {
      c.error("uneven-positive", {flag}, fmt::format("{} must be larger than 0", flag), fmt::format("use {} 1 or more", flag));
      split_ok = false;
    }
  if (arch && !uneven && Lp % PP != 0) {
    std::vector<std::string> flags = {"--num-layers", "--pipeline-model-parallel-size"};
    const int64_t extra = Lp - m.num_layers;
    std::vector<int64_t> layers;
    for (int64_t x : nearby_multiples(PP, Lp))
      if (x - extra > 0) layers.push_back(x - extra);
    c.error("layers-divisible", flags,
            fmt::format("{} layers{} do not split evenly over PP = {}", Lp, extra ? " (counting embedding/loss)" : "", PP),
            fmt::format("use {}, or --pipeline-model-parallel-size {}, or uneven stages with --decoder-first/last-pipeline-num-layers",
                        list_or(layers, "--num-layers"), nearest_divisor(Lp, PP)));
    split_ok = false;
  }
  if (par.num_layers_per_virtual_pipeline_stage && arch && !uneven && Lp % PP == 0) {
    const int64_t n = *par.num_layers_per_virtual_pipeline_stage;
    if ((Lp / PP) % n != 0) {
      c.error("vpp-layers-divisible", {"--num-layers-per-virtual-pipeline-stage", "--num-layers", "--pipeline-model-parallel-size"},
              fmt::format("{} layers per pipeline stage are not divisible by {} layers per virtual stage", Lp / PP, n),
              fmt::format("use --num-layers-per-virtual-pipeline-stage {}", nearest_divisor(Lp / PP, n)));
      split_ok = false;
    } else {
      r.vpp = Lp / PP / n;
    }
  } else if (par.num_virtual_stages_per_pipeline_rank) {
    r.vpp = *par.num_virtual_stages_per_pipeline_rank;
    if (arch && !uneven && Lp % PP == 0 && (Lp / PP) % r.vpp != 0) {
      c.error("vpp-stages-divisible", {"--num-virtual-stages-per-pipeline-rank", "--num-layers", "--pipeline-model-parallel-size"},
              fmt::format("{} layers per pipeline stage do not split into {} virtual stages", Lp / PP, r.vpp),
              fmt::format("use --num-virtual-stages-per-pipeline-rank {}", nearest_divisor(Lp / PP, r.vpp)));
      split_ok = false;
    }
  }
  const bool vpp_given = par.num_layers_per_virtual_pipeline_stage || par.num_virtual_stages_per_pipeline_rank;
  if (vpp_given) {
    const int64_t min_pp = par.overlap_p2p_communication ? 1 : 2;
    if (PP <= min_pp) {
      c.error("vpp-needs-pp", {"--pipeline-model-parallel-size", par.num_layers_per_virtual_pipeline_stage ? "--num-layers-per-virtual-pipeline-stage" : "--num-virtual-stages-per-pipeline-rank"},
              fmt::format("interleaving needs pipeline-model-parallel size greater than {}", min_pp),
              fmt::format("use --pipeline-model-parallel-size {} or more, or drop the virtual-stage flag", min_pp + 1));
      split_ok = false;
    }
  }
  if (split_ok && arch) {
    parallel::LayerSplitSpec spec{m.num_layers, PP, r.vpp, par.decoder_first_pipeline_num_layers,
                                  par.decoder_last_pipeline_num_layers, par.account_for_embedding_in_pipeline_split,
                                  par.account_for_loss_in_pipeline_split};
    auto split = parallel::split_layers(spec);
    if (!split) {
      c.error("pipeline-split", {"--num-layers", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"},
              split.status().message(), "choose first/last stage sizes that leave an even split for the middle stages");
    } else {
      r.chunks.clear();
      for (const auto& cs : *split) r.chunks.push_back({cs.pp_rank, cs.chunk, cs.first_layer, cs.num_layers});
      // The MTP layers' kind: Megatron builds them from the last decoder
      // layer's spec, or, where the last (virtual) stage holds no decoder
      // layer, from the default spec, an MoE layer whenever --num-experts is
      // set. Here they are always like the last layer: refuse the case where
      // the two differ.
      if (m.mtp_layers() && m.is_moe() && !m.is_moe_layer(m.num_layers - 1) && !r.chunks.empty() &&
          r.chunks.back().num_layers == 0)
        c.error("mtp-layer-kind", {"--mtp-num-layers", "--moe-layer-freq", "--account-for-loss-in-pipeline-split"},
                "the last pipeline stage holds no decoder layer, so Megatron builds its MTP layers as MoE layers "
                "while the last decoder layer (which the MTP layers follow here) is dense",
                "give the last stage a layer, or make the last layer MoE in --moe-layer-freq");
    }
  }
  if (r.quick && vpp_given) r.vpp = par.num_virtual_stages_per_pipeline_rank.value_or(1);

  // Interleaved schedule's micro-batch rule (checked at run time by Megatron).
  r.group_size = par.microbatch_group_size_per_vp_stage.value_or(PP);
  // Every micro-batch count the run trains with: each step's of a schedule.
  std::vector<int64_t> counts{r.num_microbatches};
  if (r.dp >= 1 && j.batch.micro_batch_size > 0)
    for (const BatchStep& st : r.batch_steps_used)
      if (const int64_t M = st.batch / (j.batch.micro_batch_size * r.dp);
          std::find(counts.begin(), counts.end(), M) == counts.end())
        counts.push_back(M);
  const bool stepped = !r.batch_steps.empty();
  for (const int64_t M : counts) {
    const int64_t N = r.group_size;
    if (!(r.vpp > 1 && M >= 1)) continue;
    if (N < PP || N > M || (M % N != 0 && M % N < PP)) {
      const int64_t per_mb = j.batch.micro_batch_size * r.dp;
      std::vector<int64_t> gbs;
      for (int64_t x : nearby_multiples(N, std::max(M, N))) gbs.push_back(x * per_mb);
      const std::string batch_flag = stepped ? "--step-batch-size-schedule" : "--global-batch-size";
      c.error("interleaved-microbatches", {batch_flag, "--micro-batch-size", "--microbatch-group-size-per-virtual-pipeline-stage"},
              (stepped ? fmt::format("the schedule's batch {}: ", M * per_mb) : std::string()) +
                  (N < PP || N > M
                       ? fmt::format("the interleaved schedule needs the micro-batch group size {} in [PP = {}, micro-batches = {}]", N, PP, M)
                       : fmt::format("micro-batches {} mod group size {} = {} must be 0 or at least PP = {}", M, N, M % N, PP)),
              stepped ? fmt::format("use batch sizes of {} ({} micro-batches)", fmt::join(gbs, " or "), std::max(M, N))
                      : fmt::format("use {} ({} micro-batches)", list_or(gbs, "--global-batch-size"), std::max(M, N)));
    }
  }

  // ---- recomputation
  const auto& rc = j.recompute;
  if (rc.selective() && rc.method)
    c.error("recompute-selective-method", {"--recompute-method", "--recompute-granularity"},
            "--recompute-method is not supported with selective recomputation", "drop --recompute-method");
  if (rc.selective() && rc.num_layers)
    c.error("recompute-selective-layers", {"--recompute-num-layers", "--recompute-granularity"},
            "--recompute-num-layers must be unset with selective recomputation", "drop --recompute-num-layers");
  // --recompute-modules: Megatron's module names; this build recomputes core_attn and moe_act.
  if (!rc.modules.empty() && !rc.selective())
    c.error("recompute-modules-selective", {"--recompute-modules", "--recompute-granularity"},
            "--recompute-modules applies to --recompute-granularity selective (full recomputation recomputes whole "
            "layers)",
            "add --recompute-granularity selective, or drop --recompute-modules");
  for (const std::string& m : rc.modules)
    if (std::string why = model::RecomputeOptions::module_problem(m); !why.empty())
      c.error("recompute-modules-known", {"--recompute-modules"}, why, "give core_attn, moe_act or mla_up_proj");
  if (rc.recomputes("mla_up_proj") && !m.mla())
    c.error("recompute-mla-up-proj", {"--recompute-modules", "--multi-latent-attention"},
            "--recompute-modules mla_up_proj recomputes multi-latent attention's up projections, and there is none "
            "(Megatron refuses it)",
            "drop mla_up_proj, or add --multi-latent-attention");
  if (rc.recompute_activations && rc.granularity == "full")
    c.error("recompute-both", {"--recompute-activations", "--recompute-granularity"},
            "--recompute-activations means selective, but --recompute-granularity full is given", "keep one of them");
  if (rc.full() && !rc.method)
    c.error("recompute-full-method", {"--recompute-granularity", "--recompute-method"},
            "full recomputation needs --recompute-method uniform or block", "add --recompute-method uniform");
  if (rc.full() && !rc.num_layers)
    c.error("recompute-full-layers", {"--recompute-granularity", "--recompute-num-layers"},
            "full recomputation needs --recompute-num-layers", "add --recompute-num-layers 1");
  if (!rc.granularity && !rc.recompute_activations && (rc.method || rc.num_layers))
    c.error("recompute-granularity-missing", {"--recompute-method", "--recompute-num-layers", "--recompute-granularity"},
            "--recompute-method/--recompute-num-layers only apply with --recompute-granularity full",
            "add --recompute-granularity full, or drop them");
  if (rc.full() && rc.num_layers && arch && PP > 0 && Lp % PP == 0 && *rc.num_layers > Lp / PP)
    c.error("recompute-num-layers-range", {"--recompute-num-layers"},
            fmt::format("--recompute-num-layers {} must be between 1 and the layers per pipeline rank ({})", *rc.num_layers, Lp / PP),
            fmt::format("use --recompute-num-layers {}", std::max<int64_t>(1, Lp / PP)));
  // Megatron recomputes each MTP layer on its own under full uniform
  // recomputation and asserts a group of one (MultiTokenPredictionLayer's
  // _checkpointed_forward); here the MTP layers keep their activations.
  if (m.mtp_layers() && rc.full() && rc.method == "uniform" && rc.num_layers && *rc.num_layers != 1)
    c.error("mtp-recompute-num-layers", {"--mtp-num-layers", "--recompute-method", "--recompute-num-layers"},
            fmt::format("full uniform recomputation of {} layers with multi-token prediction: Megatron asserts "
                        "\"recompute_num_layers must be 1 for MTP recompute\"",
                        *rc.num_layers),
            "use --recompute-num-layers 1, or --recompute-method block");
  if (rc.distribute_saved_activations && (TP == 1 || !rc.full() || !rc.method || par.sequence_parallel))
    c.error("distribute-saved-activations", {"--distribute-saved-activations"},
            "--distribute-saved-activations needs TP > 1, full recomputation with a method, and no --sequence-parallel",
            "drop --distribute-saved-activations");

  // ---- distributed optimizer and overlap
  if (par.overlap_param_gather && (!par.use_distributed_optimizer || !par.overlap_grad_reduce))
    c.error("overlap-param-gather", {"--overlap-param-gather", "--use-distributed-optimizer", "--overlap-grad-reduce"},
            "--overlap-param-gather is only supported with --use-distributed-optimizer and --overlap-grad-reduce",
            "add --use-distributed-optimizer --overlap-grad-reduce");

  // ---- Megatron's checks on flags that change nothing here (MegatronCompat)
  const MegatronCompat& compat = j.compat;
  if (compat.has("overlap-param-gather-with-optimizer-step") &&
      (!par.use_distributed_optimizer || !par.overlap_param_gather || r.vpp <= 1))
    c.error("overlap-param-gather-with-optimizer-step",
            {"--overlap-param-gather-with-optimizer-step", "--use-distributed-optimizer", "--overlap-param-gather"},
            "--overlap-param-gather-with-optimizer-step needs --use-distributed-optimizer, --overlap-param-gather and "
            "the interleaved pipeline schedule (virtual stages), as in Megatron",
            "drop --overlap-param-gather-with-optimizer-step (it changes speed only)");
  const std::string graphs = compat.value("cuda-graph-impl");
  if (compat.has("enable-cuda-graph") && compat.has("cuda-graph-impl") && graphs != "none")
    c.error("cuda-graph-flags", {"--enable-cuda-graph", "--cuda-graph-impl"},
            "Megatron: do not use --enable-cuda-graph with --cuda-graph-impl", "drop --enable-cuda-graph");
  if ((graphs == "local" || graphs == "transformer_engine" || compat.has("enable-cuda-graph")) && rc.full())
    c.error("cuda-graph-full-recompute", {"--cuda-graph-impl", "--recompute-granularity"},
            "Megatron: full recomputation is only supported with full-iteration CUDA graphs",
            "drop the CUDA graph flag (no CUDA graphs here), or use --cuda-graph-impl full_iteration");
  if (compat.has("grad-reduce-in-bf16") && j.precision.bf16)
    c.error("grad-reduce-in-bf16", {"--grad-reduce-in-bf16", "--bf16"},
            "gradients are accumulated and reduced in fp32 here (Megatron's default under --bf16); reducing them in "
            "bf16 is not offered",
            "drop --grad-reduce-in-bf16");
  if (compat.has("cross-entropy-loss-fusion") && compat.value("cross-entropy-fusion-impl") == "te")
    c.error("cross-entropy-fusion-impl", {"--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl"},
            "Megatron refuses Transformer Engine's cross-entropy loss fusion (\"disabled due to stability issues\")",
            "use --cross-entropy-fusion-impl native, or drop --cross-entropy-loss-fusion");
  // Megatron's ModelParallelConfig checks on the deferred embedding wgrad and
  // the warm-up/flush overlap (p2p overlap stays on only with virtual stages).
  if (compat.has("defer-embedding-wgrad-compute")) {
    if (PP == 1)
      c.error("defer-embedding-wgrad-pp", {"--defer-embedding-wgrad-compute", "--pipeline-model-parallel-size"},
              "Megatron: cannot defer embedding wgrad compute when pipeline model parallel is not used",
              "drop --defer-embedding-wgrad-compute (it changes speed only)");
    if (compat.has("no-gradient-accumulation-fusion"))
      c.error("defer-embedding-wgrad-fusion", {"--defer-embedding-wgrad-compute", "--no-gradient-accumulation-fusion"},
              "Megatron: cannot defer embedding wgrad compute when gradient accumulation fusion is not used",
              "drop one of the two flags");
  }
  // Megatron parses these as integers.
  for (const char* flag : {"straggler-minmax-count", "straggler-ctrlr-port"})
    if (compat.has(flag)) {
      const std::string v = compat.value(flag);
      char* end = nullptr;
      (void)std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0')
        c.error(std::string(flag), {std::string("--") + flag},
                fmt::format("--{}: expected an integer, got '{}'", flag, v), "give a whole number");
    }
  if (compat.has("wgrad-deferral-limit")) {
    const std::string v = compat.value("wgrad-deferral-limit");
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0')
      c.error("wgrad-deferral-limit-integer", {"--wgrad-deferral-limit"},
              fmt::format("--wgrad-deferral-limit: expected an integer, got '{}'", v), "give a whole number, e.g. 0");
    else if (x < 0 && compat.has("defer-embedding-wgrad-compute"))
      c.error("wgrad-deferral-limit-negative", {"--wgrad-deferral-limit", "--defer-embedding-wgrad-compute"},
              "Megatron: the wgrad deferral limit should be greater than or equal to 0 when it is enabled",
              "give 0 (defer every micro-batch) or more");
  }
  if (compat.has("overlap-p2p-communication-warmup-flush") && (r.vpp <= 1 || !par.overlap_p2p_communication))
    c.error("overlap-p2p-warmup-flush", {"--overlap-p2p-communication-warmup-flush"},
            "Megatron: pipeline communication overlapping in warm-up and flush is only compatible with p2p overlap "
            "(on only with the interleaved schedule, without --no-overlap-p2p-communication)",
            "drop --overlap-p2p-communication-warmup-flush (it changes speed only)");
  if (compat.has("deterministic-mode"))
    for (const char* other : {"cross-entropy-loss-fusion", "tp-comm-overlap"})
      if (compat.has(other))
        c.error("deterministic-mode", {"--deterministic-mode", std::string("--") + other},
                fmt::format("Megatron's --deterministic-mode refuses --{}", other),
                fmt::format("drop --{} (it changes speed only here)", other));

  // ---- derived vocabulary
  if (m.vocab_size) r.padded_vocab = m.padded_vocab(TP);
  if (r.world_source == WorldSource::kDefaultOneReplica)
    c.warn(fmt::format("no world size given: planning one model replica ({} ranks, DP = 1); give --world-size", W));
}

}  // namespace mt::plan
