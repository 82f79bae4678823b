#pragma once
// One truth for memory (DESIGN principle 2): bytes per rank for parameters,
// gradients, optimizer state and activations, used by the planner now and by
// the trainer's allocator and its "predicted vs measured" log line later.
//
// Two models live here:
//  * megatron_theoretical_memory(): Megatron-LM's own estimate
//    (theoretical_memory_usage.py, spec §12), reproduced number for number so
//    a user can compare with a Megatron log;
//  * stage_memory(): our per-pipeline-stage count of the real tensors
//    (biases, position embedding, output layer on the last stage, GQA, SwiGLU,
//    CP, flash attention, full recomputation, in-flight micro-batches from the
//    simulated schedule), which is what we size buffers with.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/job.h"

namespace mt::plan {

// Bytes per parameter kept on a rank (Megatron's table, spec §10).
// optimizer: fp32 master weights (bf16/fp16), fp32 main grads (fp16) and
// the optimizer's fp32 state tensors (Adam's m and v: 2; SGD's momentum
// buffer: 1, or 0 without momentum), before sharding by the distributed
// optimizer.
struct BytesPerParam {
  double params = 0, grads = 0, optimizer = 0;
  double total(double shard = 1) const { return params + grads + optimizer / shard; }
};
BytesPerParam bytes_per_param(const PrecisionConfig& p, int optimizer_states = 2);

// Megatron's estimate for the most loaded rank (first pipeline stage).
struct MegatronMemoryEstimate {
  double params_on_most_loaded_shard = 0;  // X_tp + X_rep (+ X_exp)
  double weight_and_optimizer_bytes = 0;
  double activation_bytes = 0;
  double total_bytes() const { return weight_and_optimizer_bytes + activation_bytes; }
  bool sp_formula = false;        // SP + selective path (§12.5) vs §12.6
  int64_t printed_in_flight = 0;  // what Megatron prints with VPP
};

// Inputs shared by both models: the resolved layout.
struct MemoryLayout {
  int64_t padded_vocab = 0;
  int64_t dp = 1, edp = 1, etp = 1, vpp = 1;
  int64_t num_microbatches = 1;
};

MegatronMemoryEstimate megatron_theoretical_memory(const JobConfig& job, const MemoryLayout& l);

// One rank of one pipeline stage (ranks within a stage are alike).
struct StageMemory {
  int64_t pp_rank = 0;
  std::vector<int64_t> chunk_layers;  // transformer layers per model chunk
  double stage_params = 0;            // the whole stage's parameters, before any TP/EP split
  double dense_params = 0;            // elements on this rank, sharded over DP*CP by dist-opt
  double expert_params = 0;           // elements on this rank, sharded over expert-DP
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double activation_per_microbatch = 0;  // one micro-batch through every chunk of this stage
  int64_t in_flight = 0;                 // chunk-micro-batches held at the peak
  double activation_bytes = 0;           // what the in-flight micro-batches keep
  double transient_bytes = 0;            // working buffers of the busiest backward step
  double reserve_bytes = 0;              // runtime (device profile)
  double total_bytes() const {
    return param_bytes + grad_bytes + optimizer_bytes + activation_bytes + transient_bytes +
           reserve_bytes;
  }
};

struct StageInputs {
  int64_t pp_rank = 0;
  bool first_stage = false, last_stage = false;
  std::vector<int64_t> chunk_layers;
  std::vector<int64_t> chunk_first;  // each chunk's first layer (--moe-layer-freq: which are MoE); empty: 0, ...
  int64_t in_flight = 1;  // peak chunk-micro-batches from the schedule
  double reserve_bytes = 0;
};
StageMemory stage_memory(const JobConfig& job, const MemoryLayout& l, const StageInputs& in);

// Saved activations of one transformer layer for one micro-batch on one
// rank, in bytes, without recomputation (flash attention: no s x s tensor).
// moe_layer: an MoE layer's (with --num-experts), else a dense one's.
double layer_activation_bytes(const JobConfig& job, const MemoryLayout& l, bool moe_layer);

// What this build's CPU trainer allocates on one rank (TP = PP = 1), from the
// model's own size tables (model::GPTModel::planned_bytes) plus the AdamW
// state: the figure `megatron train` logs beside its measured buffers.
struct TrainerBuffers {
  bool available = false;
  std::string why_not;  // when not available
  double params = 0, grads = 0, lowp = 0, activations = 0, scratch = 0, tables = 0, optimizer = 0;
  double comm = 0;  // reduce-scatter receive blocks (distributed optimizer), the pipeline's gradient receive buffer
  double total() const { return params + grads + lowp + activations + scratch + tables + optimizer + comm; }
};

struct MemoryReport {
  std::vector<StageMemory> stages;
  int64_t peak_stage = 0;
  double peak_bytes = 0;
  double device_bytes = 0;
  bool fits = false;
  MegatronMemoryEstimate megatron;
  // The whole job's model state, unsharded: parameters x bytes per parameter
  // (16 for fp32, 18 for bf16, 20 for fp16), the seed calculator's figure.
  double model_state_bytes_per_param = 0;
  double model_state_bytes = 0;
  double checkpoint_bytes = 0;      // weights + fp32 master + optimizer state
  TrainerBuffers trainer;                     // pipeline rank 0's (what its log line compares)
  std::vector<TrainerBuffers> trainer_stages;  // every pipeline rank's
  int64_t trainer_peak_stage = 0;              // the pipeline rank with the most
  double weights_only_bytes = 0;    // weights in the training dtype (export size)
};

}  // namespace mt::plan
