#include <fmt/format.h>

#include "plan/render.h"

namespace mt::plan {

using nlohmann::json;

namespace {

constexpr int64_t kMaxRanksInJson = 65536;

json form_values(const PlanReport& r) {
  // What the page's form shows: the flags as the planner resolved them.
  const auto& p = r.job.parallel;
  const auto& m = r.job.model;
  json f;
  f["world-size"] = p.world_size.value_or(1);
  f["tensor-model-parallel-size"] = p.tp;
  f["pipeline-model-parallel-size"] = p.pp;
  f["context-parallel-size"] = p.cp;
  f["expert-model-parallel-size"] = p.ep;
  f["num-virtual-stages-per-pipeline-rank"] = r.vpp;
  f["gpus-per-node"] = p.gpus_per_node;
  f["num-layers"] = m.num_layers;
  f["hidden-size"] = m.hidden_size;
  f["num-attention-heads"] = m.num_attention_heads;
  f["num-query-groups"] = m.group_query_attention ? m.num_query_groups.value_or(1) : 0;
  f["ffn-hidden-size"] = m.ffn_hidden_size.value_or(0);
  f["seq-length"] = m.seq_length;
  f["max-position-embeddings"] = m.max_position_embeddings;
  f["vocab-size"] = m.vocab_size.value_or(0);
  f["num-experts"] = m.num_experts;
  f["multi-latent-attention"] = m.mla();
  f["q-lora-rank"] = m.q_lora_rank.value_or(0);
  f["kv-lora-rank"] = m.kv_lora_rank;
  f["mtp-num-layers"] = m.mtp_layers();
  f["position-embedding-type"] = model::position_embedding_name(m.position_embedding);
  f["micro-batch-size"] = r.job.batch.micro_batch_size;
  f["global-batch-size"] = r.job.batch.global_batch_size.value_or(0);
  f["step-batch-size-schedule"] = r.job.batch.step_batch_size_schedule.value_or("");
  f["optimizer"] = r.job.optimizer.name;
  f["sequence-parallel"] = p.sequence_parallel;
  f["use-distributed-optimizer"] = p.use_distributed_optimizer;
  f["swiglu"] = m.swiglu;
  f["untie-embeddings-and-output-weights"] = m.untie_embeddings_and_output_weights;
  f["precision"] = r.job.precision.name();
  f["recompute"] = r.job.recompute.full() ? "full" : r.job.recompute.selective() ? "selective" : "none";
  f["device"] = r.options.device;
  if (r.options.step_time) f["step-time"] = *r.options.step_time;
  if (r.options.num_parameters) f["num-parameters"] = *r.options.num_parameters;
  return f;
}

json stage_json(const StageMemory& s) {
  return {{"pp_rank", s.pp_rank},
          {"chunk_layers", s.chunk_layers},
          {"stage_params", s.stage_params},
          {"params", s.dense_params + s.expert_params},
          {"expert_params", s.expert_params},
          {"param_bytes", s.param_bytes},
          {"grad_bytes", s.grad_bytes},
          {"optimizer_bytes", s.optimizer_bytes},
          {"activation_bytes", s.activation_bytes},
          {"activation_per_microbatch", s.activation_per_microbatch},
          {"in_flight", s.in_flight},
          {"transient_bytes", s.transient_bytes},
          {"reserve_bytes", s.reserve_bytes},
          {"total_bytes", s.total_bytes()}};
}

}  // namespace

json to_json(const PlanReport& r) {
  json j;
  j["valid"] = r.valid();
  j["errors"] = json::array();
  for (const auto& v : r.errors)
    j["errors"].push_back({{"rule", v.rule}, {"flags", v.flags}, {"message", v.message}, {"suggestion", v.suggestion}});
  j["warnings"] = r.warnings;
  j["form"] = form_values(r);
  if (!r.valid()) return j;

  const auto& p = r.job.parallel;
  const auto& m = r.job.model;
  j["layout"] = {{"world", r.world},
                 {"world_source", world_source_name(r.world_source)},
                 {"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep}, {"etp", r.etp},
                 {"dp", r.dp}, {"edp", r.edp}, {"vpp", r.vpp},
                 {"order", r.grid->order()},
                 {"gpus_per_node", p.gpus_per_node}, {"num_nodes", r.num_nodes},
                 {"sequence_parallel", p.sequence_parallel},
                 {"distributed_optimizer", p.use_distributed_optimizer},
                 {"precision", r.job.precision.name()}};
  j["batch"] = {{"micro_batch_size", r.job.batch.micro_batch_size},
                {"num_microbatches", r.num_microbatches},
                {"global_batch_size", r.global_batch},
                {"tokens_per_iteration", r.tokens_per_iteration},
                {"eval_global_batch_size", r.eval_global_batch}};
  if (!r.batch_steps.empty()) {
    json steps = json::array();
    for (const BatchStep& st : r.batch_steps) steps.push_back({{"from_samples", st.threshold}, {"global_batch_size", st.batch}});
    j["batch"]["step_schedule"] = steps;
  }
  json model = {{"quick", r.quick}, {"seq_length", m.seq_length}, {"total_params", r.total_params}};
  if (!r.quick) {
    model.update({{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"num_attention_heads", m.num_attention_heads},
                  {"query_groups", r.query_groups}, {"head_dim", r.head_dim}, {"ffn_hidden_size", r.ffn},
                  {"vocab_size", m.vocab_size.value_or(0)}, {"padded_vocab_size", r.padded_vocab},
                  {"normalization", model::normalization_name(m.normalization)},
                  {"position_embedding", model::position_embedding_name(m.position_embedding)},
                  {"swiglu", m.swiglu}, {"untied", m.untie_embeddings_and_output_weights},
                  {"num_experts", m.num_experts}, {"num_moe_layers", m.num_moe_layers()},
                  {"params", {{"per_layer", r.params.per_layer}, {"dense_per_layer", r.params.dense_per_layer},
                              {"layers", r.params.layers},
                              {"word_embedding", r.params.word_embedding},
                              {"position_embedding", r.params.position_embedding},
                              {"final_norm", r.params.final_norm}, {"output_layer", r.params.output_layer},
                              {"mtp", r.params.mtp},
                              {"megatron_total", r.megatron_params.total}}}});
    if (m.mla())
      model["multi_latent_attention"] = {
          {"q_lora_rank", m.q_lora_rank ? json(*m.q_lora_rank) : json(nullptr)}, {"kv_lora_rank", m.kv_lora_rank},
          {"qk_head_dim", m.qk_head_dim}, {"qk_pos_emb_head_dim", m.qk_pos_emb_head_dim}, {"v_head_dim", m.v_head_dim},
          {"rope_type", m.mla_yarn() ? "yarn" : "rope"}, {"rotary_scaling_factor", m.rotary_scaling_factor},
          {"softmax_scale", m.softmax_scale()}};
    if (m.mtp_layers())
      model["multi_token_prediction"] = {{"mtp_num_layers", m.mtp_layers()},
                                         {"mtp_loss_scaling_factor", m.mtp_loss_scaling_factor},
                                         {"mtp_use_repeated_layer", m.mtp_use_repeated_layer}};
  }
  j["model"] = model;
  j["chunks"] = json::array();
  for (const auto& c : r.chunks)
    j["chunks"].push_back({{"pp_rank", c.pp_rank}, {"chunk", c.chunk}, {"first_layer", c.first_layer}, {"num_layers", c.num_layers}});

  const int64_t n = std::min(r.world, kMaxRanksInJson);
  json ranks = json::array();
  for (int64_t rank = 0; rank < n; ++rank) {
    auto c = r.grid->coord(rank);
    ranks.push_back({{"rank", rank}, {"node", rank / p.gpus_per_node}, {"gpu", rank % p.gpus_per_node},
                     {"tp", c.tp}, {"cp", c.cp}, {"ep", c.ep}, {"dp", c.dp}, {"pp", c.pp},
                     {"etp", c.etp}, {"edp", c.edp}});
  }
  j["ranks"] = std::move(ranks);
  j["ranks_truncated"] = n < r.world;
  json groups = json::object();
  if (r.world <= kMaxRanksInJson)
    for (auto k : parallel::all_group_kinds()) groups[parallel::group_kind_name(k)] = r.grid->groups(k);
  j["groups"] = std::move(groups);

  const auto& mem = r.memory;
  json stages = json::array();
  for (const auto& s : mem.stages) stages.push_back(stage_json(s));
  json fit = json::array();
  for (const auto& f : r.fit_options) fit.push_back({{"options", f.options}, {"peak_bytes", f.peak_bytes}, {"fits", f.fits}});
  j["memory"] = {{"device", r.device.name},
                 {"device_source", r.device.source},
                 {"device_bytes", mem.device_bytes},
                 {"stages", std::move(stages)},
                 {"peak_stage", mem.peak_stage},
                 {"peak_bytes", mem.peak_bytes},
                 {"fits", mem.fits},
                 {"fit_options", std::move(fit)},
                 {"model_state_bytes_per_param", mem.model_state_bytes_per_param},
                 {"model_state_bytes", mem.model_state_bytes},
                 {"checkpoint_bytes", mem.checkpoint_bytes},
                 {"weights_only_bytes", mem.weights_only_bytes}};
  auto comm_json = [](const CommReport& c) {
    return json{{"tp_bytes_per_iteration", c.tp_bytes}, {"dp_bytes_per_iteration", c.dp_bytes},
                {"pp_bytes_per_iteration", c.pp_bytes}, {"cp_bytes_per_iteration", c.cp_bytes},
                {"ep_bytes_per_iteration", c.ep_bytes}};
  };
  if (r.comm.available) {  // pipeline rank 0's, and every pipeline rank's
    j["communication"] = comm_json(r.comm);
    j["communication"]["stages"] = json::array();
    for (const CommReport& c : r.comm_stages) j["communication"]["stages"].push_back(comm_json(c));
  }
  auto trainer_json = [](const TrainerBuffers& t) {
    if (!t.available) return json{{"available", false}, {"why_not", t.why_not}};
    return json{{"available", true}, {"params", t.params}, {"grads", t.grads}, {"lowp", t.lowp}, {"optimizer", t.optimizer},
                {"activations", t.activations}, {"scratch", t.scratch}, {"tables", t.tables}, {"comm", t.comm},
                {"total", t.total()}};
  };
  if (mem.trainer.available) {  // pipeline rank 0's, every pipeline rank's, and the most loaded
    j["memory"]["trainer"] = trainer_json(mem.trainer);
    j["memory"]["trainer"]["stages"] = json::array();
    for (const TrainerBuffers& t : mem.trainer_stages) j["memory"]["trainer"]["stages"].push_back(trainer_json(t));
    j["memory"]["trainer"]["peak_stage"] = mem.trainer_peak_stage;
  }
  if (!r.quick)
    j["memory"]["megatron"] = {{"weight_and_optimizer_bytes", mem.megatron.weight_and_optimizer_bytes},
                               {"activation_bytes", mem.megatron.activation_bytes},
                               {"total_bytes", mem.megatron.total_bytes()},
                               {"params_on_most_loaded_shard", mem.megatron.params_on_most_loaded_shard},
                               {"sp_formula", mem.megatron.sp_formula}};

  json tl_ranks = json::array();
  for (const auto& rank : r.timeline.ranks) {
    json acts = json::array();
    for (const auto& a : rank)
      acts.push_back({a.action.op == parallel::Action::kForward ? "F" : "B", a.action.microbatch, a.action.chunk, a.start, a.end});
    tl_ranks.push_back(std::move(acts));
  }
  j["pipeline"] = {{"schedule", parallel::schedule_kind_name(r.schedule_kind)},
                   {"microbatch_group_size", r.group_size},
                   {"bubble_formula", r.bubble_formula},
                   {"bubble_simulated", r.bubble_simulated},
                   {"in_flight", r.in_flight},
                   {"timeline", {{"microbatches", r.timeline_microbatches},
                                 {"makespan", r.timeline.makespan},
                                 {"bubble", r.timeline.bubble_fraction},
                                 {"ranks", std::move(tl_ranks)}}}};
  const auto& t = r.throughput;
  j["compute"] = {{"flops_per_iteration", r.flops_per_iteration},
                  {"measured", t.measured},
                  {"step_time_s", t.step_time_s},
                  {"tokens_per_s", t.tokens_per_s},
                  {"tflops_per_device", t.tflops_per_device},
                  {"mfu", t.mfu},
                  {"peak_tflops", t.peak_tflops},
                  {"assumed_efficiency", r.options.assumed_efficiency}};
  if (t.gemm_ceiling_tflops > 0) {
    j["compute"]["gemm_ceiling_tflops"] = t.gemm_ceiling_tflops;
    j["compute"]["of_gemm_ceiling"] = t.of_gemm_ceiling;
    j["compute"]["gemm_ceiling_source"] = r.device.ceiling_source;
  }
  return j;
}

}  // namespace mt::plan
