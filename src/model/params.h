#pragma once
// The parameter registry: every parameter of a GPTModel with its Megatron
// name, GLOBAL shape (before any split), how tensor parallelism splits it,
// how it is initialised and whether weight decay applies. Checkpointing, the
// distributed optimizer, HF export and the planner all read this one list.
//
// Names follow Megatron core's local (non-Transformer-Engine) layer spec:
//   embedding.word_embeddings.weight                      [V, h]        vocab  (dim 0)
//   embedding.position_embeddings.weight                  [maxpos, h]   replicated (learned_absolute only)
//   decoder.layers.{i}.input_layernorm.{weight,bias}      [h]           replicated
//   decoder.layers.{i}.self_attention.linear_qkv.weight   [(a+2g)d, h]  column (dim 0), rows grouped per query
//                                                                       group [q heads | k | v] (kernels/qkv_layout.h)
//   decoder.layers.{i}.self_attention.linear_qkv.bias     [(a+2g)d]     column
//   decoder.layers.{i}.self_attention.q_layernorm.{weight,bias}  [d]    replicated (--qk-layernorm; k_layernorm too)
//   decoder.layers.{i}.self_attention.linear_proj.weight  [h, a d]      row (dim 1)
//   decoder.layers.{i}.self_attention.linear_proj.bias    [h]           replicated
//   decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}    [h]           replicated
//   decoder.layers.{i}.mlp.linear_fc1.weight              [F or 2F, h]  column (dim 0); with --swiglu two chunks
//                                                                       [gate; up], each split separately
//   decoder.layers.{i}.mlp.linear_fc1.bias                [F or 2F]     column (chunks as the weight)
//   decoder.layers.{i}.mlp.linear_fc2.weight              [h, F]        row (dim 1)
//   decoder.layers.{i}.mlp.linear_fc2.bias                [h]           replicated
//   with --num-experts E, instead of the two mlp.linear_fc* (no biases):
//   decoder.layers.{i}.mlp.router.weight                  [E, h]        replicated
//   decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight  [Fe or 2Fe, h]  column, as fc1
//   decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight  [h, Fe]         row, as fc2
//   decoder.layers.{i}.mlp.shared_experts.linear_fc{1,2}.weight   [S or 2S, h], [h, S]  as fc1, fc2
//                                                                 (--moe-shared-expert-intermediate-size S)
//   decoder.layers.{i}.mlp.shared_experts.gate_weight            [1, h]  replicated (--moe-shared-expert-gate)
//   decoder.final_layernorm.{weight,bias}                 [h]           replicated
//   with --mtp-num-layers D, for each depth k < D (after decoder.final_layernorm):
//   mtp.layers.{k}.{enorm,hnorm}.{weight,bias}            [h]           replicated
//   mtp.layers.{k}.eh_proj.weight                         [h, 2h]       column (dim 0); input [embedding | hidden]
//   mtp.layers.{k}.transformer_layer.*                    a layer's parameters, as the last decoder layer's
//   mtp.layers.{k}.final_layernorm.{weight,bias}          [h]           replicated
//   output_layer.weight                                   [V, h]        vocab (dim 0), untied only
// With Transformer Engine Megatron names the first norm of each block
// self_attention.linear_qkv.layer_norm_{weight,bias} and the second
// mlp.linear_fc1.layer_norm_{weight,bias}: te_name() gives that spelling.

#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace mt::model {

enum class ShardKind {
  kReplicated,  // every TP rank holds all of it (grads all-reduced over TP when sequence parallel,
                // and always for the q/k norms: GPTModel::reduce_tp_replicated_grads)
  kColumn,      // split along dim 0 (output features) of a column-parallel linear
  kRow,         // split along dim 1 (input features) of a row-parallel linear
  kVocab,       // split along dim 0 (vocabulary rows), VocabParallelEmbedding / output layer
};

enum class InitKind { kNormal, kScaledNormal, kOnes, kZeros };

// A --qk-layernorm norm parameter (self_attention.{q,k}_layernorm.{weight,bias}).
inline bool is_qk_norm(const std::string& name) {
  return name.find("self_attention.q_layernorm.") != std::string::npos ||
         name.find("self_attention.k_layernorm.") != std::string::npos;
}

struct ParamSpec {
  std::string name;
  Shape global_shape;
  ShardKind shard = ShardKind::kReplicated;
  int shard_dim = -1;     // 0 or 1; -1 when replicated
  int shard_chunks = 1;   // 2 for SwiGLU's fc1: [gate; up] each split over TP, shard = [gate_r; up_r]
  InitKind init = InitKind::kNormal;
  bool weight_decay = true;  // false for biases and norm parameters (Megatron's no_wd group)
  int layer = -1;            // transformer layer index, -1 for embedding/final/output
  // --num-experts: the routed expert (global index) a weight belongs to, -1
  // for every other parameter. With expert parallelism a rank holds the
  // experts [ep_rank E/EP, (ep_rank + 1) E/EP) of its layers, under these
  // global names, and their gradients are reduced over the expert
  // data-parallel group instead of DP x CP.
  int expert = -1;

  // This rank's shape for a TP size (REQUIRES: the split dimension divides).
  Shape local_shape(int64_t tp) const;
  // The Transformer Engine spelling of the name (see above).
  std::string te_name() const;
};

// A rectangular piece of a parameter's GLOBAL tensor held by one TP rank:
// global [offsets, offsets + shape) is local rows [local_row, local_row +
// shape[0]) of the rank's tensor (all local columns). One piece per chunk
// (two for SwiGLU's fc1), in local order; replicated parameters: the whole.
struct ShardPiece {
  std::vector<int64_t> offsets;  // global offsets, one per dim
  Shape shape;                   // piece shape (global == local extents)
  int64_t local_row = 0;         // first local row (dim 0) of the piece
};
std::vector<ShardPiece> shard_pieces(const ParamSpec& spec, int64_t tp, int64_t tp_rank);

// The elements [begin, end) of a rank's local tensor (row-major flat indices)
// as rectangular global pieces: at most a partial row, a block of whole rows
// and a partial row per shard piece (1-D tensors: one run). local_row of the
// result is unused; local_flat gives where each piece starts in the local
// tensor. Used for distributed-optimizer state, whose shards are flat ranges.
struct FlatPiece {
  std::vector<int64_t> offsets;  // global offsets
  Shape shape;                   // piece shape (same ndim as the global tensor)
  int64_t local_flat = 0;        // first local flat index
};
std::vector<FlatPiece> flat_range_pieces(const ParamSpec& spec, int64_t tp, int64_t tp_rank, int64_t begin,
                                         int64_t end);

// Every parameter in Megatron's order: embeddings, layers, final norm, output layer.
// REQUIRES: cfg.has_architecture() and vocab_size set.
std::vector<ParamSpec> gpt_param_specs(const ModelConfig& cfg, int64_t tp);

const char* shard_kind_name(ShardKind k);

}  // namespace mt::model
