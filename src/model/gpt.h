#pragma once
// GPTModel: Megatron's GPTModel as held by one rank (its tensor-parallel
// shard of its pipeline stage's layers), with explicit forward and backward
// and no autograd. GPT-2/3 and LLaMA
// styles are the same code selected by ModelConfig flags.
//
// Memory (one allocation each, carved by a SizeTable, llm.c style):
//   params   every parameter of gpt_param_specs(), in registry order
//   grads    same table as params (so flat views line up for reductions)
//   lowp     16-bit (bf16 or fp16) copies of the GEMM weights under 16-bit compute
//            (refresh with sync_low_precision() after each optimizer step)
//   acts     `slots` activation slots; a slot holds everything one
//            micro-batch's backward needs (LayerActs and make_tables in gpt.cc);
//            a pipeline stage keeps one slot per micro-batch in flight
//   scratch  temporaries of forward/backward, reset after every call, and
//            (with full recomputation) one recomputed group's activations
// planned_bytes(cfg, opt) gives every size without allocating; the
// constructor allocates exactly those sizes (DESIGN principle 2).
//
// Activations are in Megatron's [s, b, h] order: row r = t * B + b, so a
// sequence-parallel shard is a contiguous block of rows.
//
// Dropout and initialisation draw from Philox (core/rng.h):
//   init: stream = fnv1a(parameter name), element = global flat index
//   dropout: stream = ((dropout_step * 4096 + layer) * 4 + site); sites:
//            0 attention probabilities, 1 after linear_proj, 2 after
//            linear_fc2, 3 embedding output (layer = 4095)
// Each forward() takes the step index so that backward() regenerates masks;
// a recomputed forward uses the same step, so it draws the same masks.
//
// Activation recomputation (Megatron's --recompute-* flags, spec §4.4):
//   full, uniform: layers in groups of recompute_num_layers; a slot keeps only
//     each group's input. backward() re-runs a group's forward into the
//     recompute workspace (in scratch) and then its backward, last group first.
//   full, block: the first recompute_num_layers layers each keep only their
//     input and are recomputed one by one; the other layers keep everything.
//   selective: Megatron recomputes "core attention" (softmax, its dropout and
//     the product with V), whose s x s tensors dominate its memory. Our
//     attention is flash-style and never keeps s x s, so the only core-attention
//     tensors a slot holds are its output (ctx [N, a d]) and the log-sum-exp
//     (lse [B, a, T]). Selective recomputation drops both and re-runs the
//     attention kernel from the saved Q/K/V at the start of the layer's
//     backward (before linear_proj's backward, which reads ctx), with the same
//     dropout stream. Megatron itself still keeps ctx, as linear_proj's saved
//     input; we do not need to, because the recompute happens first.
//   The final norm's input resid[L] and the embedding output resid[0] are
//   always kept. Cost: full recomputation runs each recomputed layer's forward
//   once more (without the last layer of a group's linear_fc2, whose output
//   backward does not need); selective, one attention forward per layer. Results are bitwise identical with and without recomputation
//   (same kernels, same inputs, same masks, same accumulation order).
//   With pipeline parallelism the groups are formed over a stage's layers.
//
// Tensor parallelism (Megatron's mappings; GPTOptions::tp > 1 with tp_comm):
// each rank holds the ParamSpec::local_shape of every parameter (heads and
// query groups, MLP columns and vocabulary rows split over TP) and runs:
//   layer               forward                      backward
//   embedding (vocab)   all-reduce y                 identity (SP: all-gather dy)
//                       (SP: reduce-scatter y)
//   norms, dropout,     on the full sequence; with   same; grads of replicated
//   residual adds       SP on this rank's sequence   parameters are partial with
//                       shard (rows [r Ns, (r+1)Ns))  SP: reduce_tp_replicated_grads()
//   linear_qkv, fc1     identity                     all-reduce dx
//   (column)            (SP: all-gather x)           (SP: reduce-scatter dx)
//   linear_proj, fc2    all-reduce y, then bias      identity (SP: all-gather dy)
//   (row)               (SP: reduce-scatter y)
//   output layer        identity (SP: all-gather x)  all-reduce dx (SP: reduce-scatter)
//   cross-entropy       all-reduce max, sum exp and target logit over the
//                       vocabulary shards; never gathers the logits
// --qk-layernorm's q/k norm weights are replicated but each rank's gradient
// covers only its heads: reduce_tp_replicated_grads() sums them, SP or not.
// With TP = 1 every collective is the identity and omitted. Ns = N / TP with
// sequence parallelism (N otherwise). Dropout masks are keyed by the global
// element index (hidden dropout: row-major over [N, h]; attention dropout:
// global head), so every layout draws the serial model's masks: identical on
// TP ranks for replicated activations, different for split ones -- where
// Megatron's are identical and different.

#include <array>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/qkv_layout.h"
#include "kernels/attention.h"
#include "kernels/mla.h"
#include "kernels/moe.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/params.h"

namespace mt::comm {
class Communicator;
}

namespace mt::model {

enum class RecomputeGranularity { kNone, kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };

struct RecomputeOptions {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kUniform;  // full only
  int64_t num_layers = 0;  // full only: layers per group (uniform) or recomputed layers (block)
  // Selective only (--recompute-modules): core attention's output and
  // log-sum-exp (core_attn, the default), the experts' activation output
  // (moe_act: recomputed from their fc1 output in backward), MLA's roped
  // Q/K/V (mla_up_proj: recomputed in backward from the up projections'
  // inputs and the position key, which are kept).
  bool core_attn = true, moe_act = false, mla_up = false;
  bool recomputes_attention() const { return granularity == RecomputeGranularity::kSelective && core_attn; }
  bool recomputes_moe_act() const { return granularity == RecomputeGranularity::kSelective && moe_act; }
  bool recomputes_mla_up() const { return granularity == RecomputeGranularity::kSelective && mla_up; }

  // From Megatron's flags (--recompute-granularity, --recompute-method,
  // --recompute-num-layers, --recompute-activations), with Megatron's rules
  // (spec §4.4); the error names the flag and what was expected.
  static Result<RecomputeOptions> from_flags(const std::optional<std::string>& granularity,
                                             const std::optional<std::string>& method,
                                             std::optional<int64_t> num_layers,
                                             bool recompute_activations = false,
                                             const std::vector<std::string>& modules = {});
  // "none", "selective", "selective (core_attn, moe_act)", "full uniform 2", "full block 1"
  std::string str() const;
  // What is wrong with --recompute-modules `module` ("--recompute-modules X:
  // ..."), or "" for one this model recomputes (core_attn, moe_act, mla_up_proj).
  static std::string module_problem(const std::string& module);
};

// A run of consecutive layers [begin, end); recomputed groups keep only the
// input of `begin`. Layers that keep everything come as groups of one.
struct LayerGroup {
  int64_t begin = 0, end = 0;
  bool recompute = false;
  bool operator==(const LayerGroup&) const = default;
};
// REQUIRES: valid options (1 <= num_layers <= layers with full).
std::vector<LayerGroup> layer_groups(int64_t layers, const RecomputeOptions& r);

// Consecutive transformer layers [first, first + count) (global indices).
struct LayerRange {
  int64_t first = 0, count = 0;
  bool operator==(const LayerRange&) const = default;
};

struct GPTOptions {
  int64_t micro_batch = 1;       // B
  int64_t seq_length = 0;        // T (0: cfg.seq_length)
  DType dtype = DType::kF32;     // parameters and activations: fp32, or fp64 (tests)
  Device device = Device::kCpu;  // where every arena of the model lives (kCuda: the current GPU);
                                 // forward() and backward() take host tokens/labels and return host losses
  bool half_compute = false;     // GEMM inputs in `half` with fp32 accumulation; activations between
                                 // two GEMMs (qkv, ctx, fc1, act, norm outputs) and their
                                 // gradients stored in `half`; the residual stream and its
                                 // gradient too, unless fp32_residual (Megatron's --bf16, --fp16)
  DType half = DType::kBF16;     // the 16-bit type of half_compute: bf16, or fp16 (--fp16; CPU only)
  bool fp32_residual = false;    // with half_compute: keep the residual stream and its gradient
                                 // in `dtype` (--fp32-residual-connection)
  int slots = 1;                 // activation slots (micro-batches in flight); 0: parameters
                                 // only (inference: no gradients, activations or scratch)
  int64_t tp = 1;                // tensor-parallel size
  int64_t tp_rank = 0;           // this rank in the tensor-parallel group
  bool sequence_parallel = false;  // --sequence-parallel (needs tp > 1 to matter)
  comm::Communicator* tp_comm = nullptr;  // the TP group; required when tp > 1 (not owned)
  // Context parallelism (--context-parallel-size): the sequence of
  // seq_length positions is cut into 2 cp chunks and this rank holds chunks
  // cp_rank and 2 cp - 1 - cp_rank (Megatron's load-balanced split), so every
  // activation covers seq_length / cp positions; attention all-gathers the
  // roped Q/K/V over cp_comm and reduce-scatters their gradients (see
  // kernels::AttentionOptions::cp_size). forward() still takes the full
  // [B, seq_length] tokens and labels and picks this rank's positions; the
  // loss is the mean over this rank's counted labels (as each Megatron CP
  // rank's). Parameters and their gradients are the serial model's: the
  // trainer reduces gradients over DP x CP.
  int64_t cp = 1;
  int64_t cp_rank = 0;
  comm::Communicator* cp_comm = nullptr;  // required when cp > 1 (not owned)
  // Megatron's --reset-position-ids / --reset-attention-mask: forward() then
  // takes each micro-batch's position ids and document (segment) ids. Learned
  // position embeddings follow the ids (RoPE, as in Megatron's GPTModel,
  // rotates by sequence index whatever they are: with the mask, the
  // relative positions inside a document are the restarted ones anyway);
  // attention stays inside each document (the block-diagonal causal mask of
  // Megatron's get_ltor_masks_and_position_ids, which Megatron's flash and
  // TE kernels do not apply; here every attention kernel does).
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  RecomputeOptions recompute;    // activation recomputation (see above)
  // Pipeline parallelism: the model chunks (virtual stages) this rank holds,
  // in chunk order; empty = one chunk with every layer. pre_process: chunk 0
  // starts with the embedding (the first virtual stage); post_process: the
  // last chunk ends with the final norm, output layer and loss (the last
  // virtual stage). With tied embeddings a last stage without the embedding
  // still holds embedding.word_embeddings.weight as its output layer (kept
  // equal to the first stage's by the trainer's embedding-group all-reduce).
  std::vector<LayerRange> chunks;
  bool pre_process = true;
  bool post_process = true;
  int64_t flat_multiple = 1;     // pad the parameter and gradient arenas to a multiple of this many
                                 // elements (the data-parallel size: reduce-scatter blocks divide evenly)
  // Expert parallelism (--expert-model-parallel-size, with --num-experts):
  // this rank holds the routed experts [ep_rank E/ep, (ep_rank + 1) E/ep) of
  // its layers. Each MoE layer routes this rank's tokens, sends every
  // routed slot to the rank holding its expert (ep_comm->all_to_all_v, the
  // EP group: ranks of one TP and PP position that hold different data),
  // runs the local experts on what it receives and sends the outputs back.
  // The experts' parameters lie after the other parameters in the flat
  // buffers (expert_flat_begin()), padded to expert_flat_multiple elements
  // (the expert data-parallel size), since they are reduced over that group.
  // Every MoE model has the expert region, at any ep.
  int64_t ep = 1;
  int64_t ep_rank = 0;
  comm::Communicator* ep_comm = nullptr;  // required when ep > 1 (not owned)
  int64_t expert_flat_multiple = 1;
  // --expert-tensor-parallel-size: 0 (the default) or tp: the experts are
  // split over the TP group like a dense MLP, every TP rank routing the
  // gathered sequence. 1 with tp > 1 (Megatron's common MoE setting): each
  // rank holds its experts whole and routes only its own sequence-parallel
  // rows, which travel to the experts over ep_comm (the expert grid's EP
  // group, which may then hold TP partners) with no TP collective around
  // the routed experts; the router's statistics are summed over TP. Other
  // sizes are refused.
  int64_t etp = 0;
  // Token dropping (--moe-expert-capacity-factor): the micro-batch's rows
  // form this many groups of consecutive rows, each routed with its own
  // expert capacity. 0: as Megatron, where every rank routes its own tokens:
  // one group per TP rank's sequence shard (TP with SP), else one. Tests
  // set it to make one rank drop as a TP layout does.
  int64_t moe_capacity_segments = 0;
};

// The residual stream's dtype under these options (GPTModel::residual_dtype()):
// the 16-bit type under half_compute without fp32_residual, else the model dtype.
// The non-gated MLP activation: --squared-relu, else GELU's tanh or erf form
// (ModelConfig::gelu_tanh()).
inline kernels::GeluKind mlp_activation(const ModelConfig& c) {
  return c.squared_relu ? kernels::GeluKind::kSquaredRelu : c.gelu_tanh() ? kernels::GeluKind::kTanh : kernels::GeluKind::kExact;
}

// The router's options (--moe-router-pre-softmax, --moe-router-score-function,
// --moe-router-topk-scaling-factor).
inline kernels::MoeRouter moe_router(const ModelConfig& c) {
  return {c.moe_router_pre_softmax, c.sigmoid_router(), c.moe_router_topk_scaling_factor.value_or(1.0),
          c.moe_router_group_topk ? c.moe_router_num_groups : 0, c.moe_router_group_topk};
}

inline DType residual_dtype(const GPTOptions& o) {
  return o.half_compute && !o.fp32_residual ? o.half : o.dtype;
}

// The rotary embedding the model flags ask for (--rotary-base, --rotary-percent,
// --rotary-seq-len-interpolation-factor, --use-rope-scaling, --rope-scaling-factor).
// MLA builds its own RotaryEmbedding or YarnRotaryEmbedding over the position
// dims: no Llama 3.1 scaling, no interpolation (Megatron passes neither).
inline kernels::RopeSpec rope_spec(const ModelConfig& c) {
  if (c.mla()) {
    kernels::RopeSpec s{c.rotary_base, c.rotary_dim(), false, 1.0, 1.0, c.rotary_freq_dim()};
    if (c.mla_yarn()) s.yarn = true, s.yarn_factor = c.rotary_scaling_factor, s.mscale = c.mla_rope_mscale();
    return s;
  }
  return kernels::RopeSpec{c.rotary_base, c.rotary_dim(), c.use_rope_scaling, c.rope_scaling_factor,
                           static_cast<double>(c.rotary_seq_len_interpolation_factor.value_or(1)), c.rotary_freq_dim()};
}

// Where backward finalises, and forward first reads, groups of parameters
// (data-parallel buckets key on these; see parallel/grad_buckets.h):
// stage L = final norm + untied output layer, l = transformer layer l,
// -1 = embeddings (word, tied or not, and positions).
int param_stage(const ParamSpec& spec, int64_t num_layers);

// Bytes of every arena of a GPTModel, from the same size tables the model
// carves (so predicted == allocated, exactly).
struct GPTMemoryPlan {
  size_t params = 0;                // parameter arena
  size_t expert_params = 0;         // of which the routed experts' region (--num-experts), padding included
  size_t grads = 0;                 // gradient arena (0 with slots == 0)
  size_t lowp = 0;                  // 16-bit copies of the GEMM weights (16-bit compute)
  size_t activations_per_slot = 0;  // what one micro-batch keeps for backward
  size_t activations = 0;           // slots x activations_per_slot
  size_t recompute_workspace = 0;   // one recomputed group's activations (inside scratch)
  size_t scratch = 0;               // peak temporaries of forward/backward, workspace included
  size_t tables = 0;                // RoPE cos/sin tables, --apply-layernorm-1p's rows, expert biases and counts
  size_t total() const { return params + grads + lowp + activations + scratch + tables; }
};

// Tensor-parallel traffic of one rank, in the payload bytes comm::CommStats
// counts (all-reduce: the buffer; all-gather: the output; reduce-scatter:
// the input), from the collectives forward() and backward() issue.
struct GPTCommPlan {
  double tp_forward_bytes = 0;   // one micro-batch's forward (training)
  double tp_backward_bytes = 0;  // its backward (with recomputed forwards)
  double tp_step_bytes = 0;      // once per iteration: reduce_tp_replicated_grads
  // Context parallelism: core attention's Q/K/V all-gathers (forward, and
  // again in backward and in recomputed forwards) and dQ/dK/dV reduce-scatters.
  double cp_forward_bytes = 0;
  double cp_backward_bytes = 0;
  // Expert parallelism (all_to_all bytes sent): per MoE layer the expert
  // counts and the N k routed slots out, and the experts' outputs for the
  // slots this rank received back; backward the same slots' gradients both
  // ways; recomputed forwards again. What a rank sends back depends on the
  // routing; these figures count N k rows each way, which is exact summed
  // over the EP group and per rank when routing is balanced (with token
  // dropping, the most slots a rank can keep: an upper bound).
  double ep_forward_bytes = 0;
  double ep_backward_bytes = 0;
};

class GPTModel {
 public:
  static constexpr int kLayerFields = 35;  // the activation tensors one layer can keep (gpt.cc's LayerActs)
  // Validates cfg (Status for user errors) and allocates every arena.
  static Result<std::unique_ptr<GPTModel>> create(const ModelConfig& cfg, const GPTOptions& opt);
  // The bytes create() would allocate, without allocating (for the planner);
  // the same validation as create().
  static Result<GPTMemoryPlan> planned_bytes(const ModelConfig& cfg, const GPTOptions& opt);
  // The tensor-parallel bytes this configuration communicates (see GPTCommPlan).
  static Result<GPTCommPlan> planned_comm(const ModelConfig& cfg, const GPTOptions& opt);
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // Megatron's initialisation from `seed`: normal(0, init_method_std) for
  // weights and embeddings (or normal(0, embedding_init_method_std) for the
  // embeddings), std / sqrt(2 L) for linear_proj and linear_fc2,
  // zeros for biases, ones/zeros for norms. Each value depends only on the
  // seed, the parameter's name and its global index (parallel-invariant).
  void init_parameters(uint64_t seed);

  // Forward of one micro-batch into `slot` (REQUIRES: 0 <= slot < GPTOptions::slots).
  //   tokens, labels: [B, T] int32 (the data loader's order); label < 0 is ignored.
  // Returns the mean loss over counted labels (Megatron: sum(loss*mask)/sum(mask)).
  // dropout_step keys the dropout masks (see above); training=false disables dropout.
  double forward(int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step = 0,
                 bool training = true, const Tensor& position_ids = Tensor(), const Tensor& segment_ids = Tensor());
  // Pipeline form: forward of model chunk `chunk` into `slot` (any slot can
  // hold any chunk). The first virtual stage embeds `tokens`; any other chunk
  // starts from the hidden state in chunk_input(slot) (receive it there).
  // The last virtual stage returns the loss; other chunks return 0 and leave
  // their output in chunk_output(slot) (send it from there; valid until the
  // slot's backward). tokens/labels: [B, T] int32 on every stage.
  // position_ids, segment_ids: [B, T] int32 host tensors (data::MicroBatch's),
  // required with GPTOptions::reset_position_ids (learned position
  // embeddings, first stage) / reset_attention_mask (segment ids
  // nondecreasing along a sequence), ignored otherwise.
  double forward_chunk(int chunk, int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step,
                       bool training, const Tensor& position_ids = Tensor(), const Tensor& segment_ids = Tensor());
  // The last forward of `slot`: how many labels it counted (label >= 0; on
  // every stage) and the sum of their losses (the last virtual stage; 0
  // elsewhere). forward() returns loss_total / label_count.
  double label_count(int slot) const;
  double loss_total(int slot) const;
  Tensor chunk_input(int slot) const;   // [Ns, h]
  Tensor chunk_output(int slot) const;  // [Ns, h], after forward_chunk
  // Backward of the chunk in `slot`. Not the last virtual stage: doutput is
  // d(chunk_output) [Ns, h]. Not the first: dinput receives d(chunk_input).
  void backward_chunk(int slot, double loss_scale, const Tensor& doutput, const Tensor& dinput);
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const std::vector<LayerRange>& chunks() const { return chunks_; }
  bool pre_process() const { return opt_.pre_process; }
  bool post_process() const { return opt_.post_process; }
  // True for a parameter whose value is a copy of another stage's (the last
  // stage's tied word embedding when it does not hold the embedding): not
  // stored in checkpoints and not counted twice in the gradient norm.
  bool is_shared_copy(int i) const { return i == word_ && !opt_.pre_process; }
  // Backward of the micro-batch in `slot`; ACCUMULATES into grads (call
  // zero_grads() once per optimizer step). loss_scale multiplies d(loss)
  // (1/num_microbatches for gradient accumulation).
  void backward(int slot, double loss_scale = 1.0);
  void zero_grads();
  // The parameter and gradient arenas as flat 1-D tensors (same layout:
  // parameter i is elements [flat_offset(i), flat_offset(i) + numel) of both;
  // gaps are zero padding). Length is a multiple of GPTOptions::flat_multiple.
  Tensor flat_params() const;
  Tensor flat_grads() const;
  int64_t flat_offset(int i) const;
  // --num-experts: the routed experts' parameters (specs()[i].expert >= 0,
  // listed after every other parameter) are elements [expert_flat_begin(),
  // numel) of the flat buffers; the rest [0, expert_flat_begin()). Both
  // lengths are multiples of their flat_multiple. numel without experts.
  int64_t expert_flat_begin() const { return expert_flat_begin_; }
  // Called during backward with each stage (param_stage) as its gradients
  // become final for this micro-batch: L first, then this rank's layers in
  // reverse, then -1 (first pipeline stage only: a last stage's tied word
  // embedding is never reported; its bucket waits for finish()). And during
  // forward before a stage's parameters are first read: -1 (embedding, or a
  // last stage's tied output weight), the layers, L.
  void set_backward_hook(std::function<void(int stage)> hook) { backward_hook_ = std::move(hook); }
  void set_forward_hook(std::function<void(int stage)> hook) { forward_hook_ = std::move(hook); }
  // The bf16 GEMM copy of parameter i (undefined without bf16 compute or for
  // parameters no GEMM reads); the optimizer writes it as it updates.
  Tensor low_precision(int i) const { return lowp_[static_cast<size_t>(i)]; }
  // 16-bit copies of one stage's GEMM weights (after a distributed-optimizer
  // parameter gather of that stage).
  void sync_low_precision(int stage);
  // With sequence parallelism, the gradients of replicated parameters (norms,
  // row-parallel biases, position embeddings) are partial sums over this
  // rank's sequence shard: all-reduce them over TP (Megatron's
  // _allreduce_layernorm_grads), and with --qk-layernorm the q/k norm
  // weights (each TP rank's heads give a partial sum). Call once per
  // iteration after the last backward. No-op with TP = 1.
  void reduce_tp_replicated_grads();
  // 16-bit copies of the GEMM weights from the fp32 parameters.
  void sync_low_precision();

  // Logits of the last forward in `slot`: [T*B, local_vocab()] ([s, b] rows). Valid until backward(slot).
  Tensor logits(int slot) const;

  const ModelConfig& config() const { return cfg_; }
  const GPTOptions& options() const { return opt_; }
  // The residual stream's dtype (chunk inputs and outputs, the gradients a
  // pipeline stage exchanges): bf16 under half_compute without
  // fp32_residual, else the model dtype.
  DType residual_dtype() const { return rs_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The group a parameter is split over and this rank's place in it: the
  // routed experts' over the expert tensor-parallel group (GPTOptions::etp),
  // every other parameter's over TP. For shard_pieces / flat_range_pieces.
  struct SplitGroup {
    int64_t size = 1, rank = 0;
  };
  SplitGroup split_group(const ParamSpec& s) const {
    return s.expert >= 0 && xlocal_ ? SplitGroup{1, 0} : SplitGroup{opt_.tp, opt_.tp_rank};
  }
  // --expert-tensor-parallel-size 1 with TP > 1 (see GPTOptions::etp).
  bool experts_local() const { return xlocal_; }
  const std::vector<Tensor>& params() const { return params_; }
  // The weight norm parameter w multiplies by: params()[w], or with
  // --apply-layernorm-1p 1 + params()[w] (written to a model buffer that the
  // next call overwrites: callers, the model and a Decoder on it, run their
  // norms one after another on the model's one stream).
  Tensor norm_weight(int w) const;
  const std::vector<Tensor>& grads() const { return grads_; }
  // Index of a parameter by Megatron name, or -1.
  int find(const std::string& name) const;
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  int64_t vocab() const { return Vg_; }        // padded vocabulary (all shards)
  int64_t local_vocab() const { return V_; }   // this TP rank's rows
  int64_t vocab_start() const { return opt_.tp_rank * V_; }

  size_t activation_bytes_per_slot() const { return plan_.activations_per_slot; }
  size_t scratch_bytes() const { return plan_.scratch; }
  const GPTMemoryPlan& memory_plan() const { return plan_; }
  // What the arenas actually hold: capacities, with scratch at its high-water
  // mark (the trainer logs this beside the planner's prediction).
  GPTMemoryPlan measured_bytes() const {
    GPTMemoryPlan m = plan_;
    m.params = params_arena_.capacity(), m.grads = grads_arena_.capacity(), m.lowp = lowp_arena_.capacity();
    m.activations = acts_.capacity(), m.scratch = scratch_.high_water(), m.tables = tables_.capacity();
    return m;
  }
  const std::vector<LayerGroup>& groups() const { return chunk_groups_[0]; }
  const Arena& scratch_arena() const { return scratch_; }
  const Arena& activation_arena() const { return acts_; }

  // --num-experts: the last forward of `slot` (training): its chunk's layers'
  // load-balancing losses (Megatron's switch loss E/(k T^2) sum_e P_e n_e,
  // without --moe-aux-loss-coeff) and z-losses (mean logsumexp^2, without
  // --moe-z-loss-coeff), summed over the layers; this rank's share (summed
  // over CP they are the micro-batch's).
  double moe_load_balancing_loss(int slot) const;
  double moe_z_loss(int slot) const;
  // The factor on the load-balancing and z-loss gradients in backward: by
  // default backward's loss_scale times CP (each CP rank holds a share of
  // these losses, whereas its language-model loss is a mean over its own
  // tokens); the trainer sets Megatron's 1 / (micro-batches x DP), or the
  // micro-batch's tokens under --calculate-per-token-loss.
  void set_moe_loss_scale(std::optional<double> scale) { moe_loss_scale_override_ = scale; }
  // The training forwards' router losses since the last take (the trainer's
  // log: Megatron's load_balancing_loss and z_loss are their means per layer
  // and micro-batch): sums over layers and micro-batches, and the count of
  // (layer, micro-batch) pairs; and per global layer (--moe-per-layer-logging:
  // zeros for the layers this rank does not hold or that are dense).
  struct MoeStats {
    double load_balancing = 0, z = 0, layer_forwards = 0;
    std::vector<double> layer_load_balancing, layer_z, layer_micro_batches;
  };
  MoeStats take_moe_stats() { return std::exchange(moe_stats_, MoeStats{}); }
  // --mtp-num-layers (the last pipeline stage): the last forward of `slot`,
  // depth k's (0-based) counted labels and the sum of their losses.
  double mtp_label_count(int slot, int k) const;
  // Depth k's logits [T*B, local_vocab()] ([s, b] rows), as logits().
  Tensor mtp_logits(int slot, int k) const;
  double mtp_loss_total(int slot, int k) const;
  // The training forwards' MTP losses since the last take (the trainer's
  // log): per depth the sum over micro-batches of each one's mean over its
  // counted labels (0 where none; Megatron's mtp_loss_for_log), and the
  // micro-batches. Empty on a stage without the MTP layers.
  // And Megatron's acceptance counts per depth: counted labels that are the
  // depth's greedy guess (correct) out of the counted labels (total).
  struct MtpStats {
    std::vector<double> loss, correct, total;
    double micro_batches = 0;
  };
  MtpStats take_mtp_stats() { return std::exchange(mtp_stats_, MtpStats{}); }
  // --moe-input-jitter-eps (tests; a CPU model): the factors layer `layer`'s
  // router multiplied its input by in the last forward of `slot`, [N, h]
  // row-major in [s, b] row order (this rank's N rows).
  std::vector<double> router_jitter_factors(int slot, int layer) const;

  // --moe-router-enable-expert-bias: layer l's expert bias [E] (undefined
  // where this rank does not hold layer l or there is none), zeros at first.
  const Tensor& expert_bias(int layer) const { return expert_bias_[static_cast<size_t>(layer)]; }
  // Checkpoint names ("decoder.layers.{l}.mlp.router.expert_bias") and
  // tensors of the biases this rank holds.
  std::vector<std::pair<std::string, Tensor>> expert_bias_tensors() const;
  // Megatron's aux-loss-free update, once per iteration after the training
  // micro-batches: each held layer's tokens per expert since the last
  // update (this rank's routing, summed over `group`, the DP x CP group)
  // move its bias by rate x sign(mean - count). Collective over `group`
  // (null: this rank alone). A no-op without expert bias.
  void update_expert_bias(comm::Communicator* group);

  // Model FLOPs of one forward+backward of a micro-batch on this rank
  // (Megatron's formula, ../shared/spec/megatron-reference.md §5, with B*s
  // tokens; with CP this rank's share: its B*s/CP tokens and 1/CP of the
  // attention pairs).
  double flops_per_micro_batch() const;

 private:
  struct Tables;
  GPTModel(const ModelConfig& cfg, const GPTOptions& opt, Tables&& t);
  static Result<Tables> make_tables(const ModelConfig& cfg, const GPTOptions& opt);
  struct LayerIdx;
  struct LayerActs;
  struct Slot;
  struct Workspace;
  Tensor as_half(const Tensor& x);
  // rows [r0, r1) of the weight only (r1 < 0: all): MLA's kv down projection
  // computes its compressed and position outputs as two products.
  void linear_fwd(const Tensor& x, int w, int b, const Tensor& y, int64_t r0 = 0, int64_t r1 = -1);
  // accumulate: dx += dy W instead of dx = dy W.
  void linear_bwd(const Tensor& x, int w, int b, const Tensor& dy, const Tensor& dx, int64_t r0 = 0, int64_t r1 = -1,
                  bool accumulate = false);
  // Tensor-parallel wrappers (see the table above). x_own: this rank's rows of
  // the full input `x_full` (they alias when not sequence parallel).
  void column_fwd_input(const Tensor& x_own, const Tensor& x_full);
  void row_linear_fwd(const Tensor& x, int w, int b, const Tensor& y_own);
  // out = res + dropout(row_linear_fwd(x)): the residual connection after a
  // block's output projection (tmp: [Ns, h] scratch when it is not fused).
  void residual_linear_fwd(const Tensor& x, int w, int b, double dropout, uint64_t dropout_stream_id,
                           const Tensor& res, const Tensor& tmp, const Tensor& out);
  // Hidden dropout of this rank's [Ns, h] rows (in place allowed), each
  // element keyed by its index in the serial model's [T*B, h] tensor, so
  // that SP and CP ranks draw the serial model's mask.
  void hidden_dropout(const Tensor& x, const Tensor& y, double p, uint64_t stream) const;
  // Core attention of this rank's queries: with CP, over the all-gathered
  // sequence (see GPTOptions::cp); dqkv written (this rank's rows).
  void attention_fwd(const Tensor& qkv, const kernels::AttentionOptions& o, const Tensor& ctx, const Tensor& lse);
  void attention_bwd(const Tensor& qkv, const Tensor& ctx, const Tensor& dctx, const Tensor& lse,
                     const kernels::AttentionOptions& o, const Tensor& dqkv);
  // CP: rows of a [T*B, W] tensor between the CP group's rank order (rank r's
  // T/cp positions at rows [r N, (r+1) N)) and sequence order.
  void cp_reorder(const Tensor& src, const Tensor& dst, bool to_sequence_order) const;
  // RoPE on a layer's fused QKV (forward) or its gradient (backward), from
  // the table of this rank's positions.
  void rope(const Tensor& qkv, bool backward) const;
  kernels::AttentionOptions attention_options(const Slot& s, int l) const;
  void row_linear_bwd(const Tensor& x, int w, int b, const Tensor& dy_own, const Tensor& dx);
  void column_linear_bwd(const Tensor& x_full, int w, int b, const Tensor& dy, const Tensor& dx_own);
  Tensor own_rows(const Tensor& full) const;  // rows [r Ns, (r+1) Ns) with SP, else full
  bool sp() const { return opt_.sequence_parallel && opt_.tp > 1; }
  void norm_fwd(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd);
  void norm_bwd(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean, const Tensor& rstd,
                const Tensor& dx);
  bool first_stage(int chunk) const { return chunk == 0 && opt_.pre_process; }
  bool last_stage(int chunk) const { return chunk + 1 == num_chunks() && opt_.post_process; }
  // x: the layer's input; a: where its activations go; out: its output, or
  // undefined to stop after the MLP activation (the last layer of a
  // recomputed group: backward needs nothing after it).
  void layer_forward(int l, const Tensor& x, LayerActs& a, const Tensor& out, const Slot& s);
  // dresid holds d(output) on entry and d(x) on exit.
  void layer_backward(int l, const Tensor& x, LayerActs& a, const Slot& s, const Tensor& dresid);
  // --num-experts: the MoE MLP of layer l (gpt.cc has the details).
  void moe_forward(int l, const LayerIdx& p, const LayerActs& a, const Tensor& y_own, const Slot& s);
  void moe_backward(int l, const LayerIdx& p, const LayerActs& a, const Slot& s, const Tensor& dy_own,
                    const Tensor& dact, const Tensor& dfc1, const Tensor& dln_own);
  void moe_record_losses(int l, const LayerActs& a, const std::vector<int64_t>& off, const Slot& s);
  // The shared expert's output on all N rows [N, h] (scratch; with TP this
  // rank's columns' partial sum), times its gate (--moe-shared-expert-gate:
  // sigmoid(ln2 . g) per row, which commutes with the TP sum).
  Tensor shared_expert_out(const LayerIdx& p, const LayerActs& a);
  // --moe-shared-expert-gate: g [N, 1] = sigmoid(ln2 . gate_weight), all N rows.
  void shared_gate_scores(const LayerIdx& p, const LayerActs& a, const Tensor& g);
  std::vector<int64_t> expert_offsets(const LayerActs& a) const;
  // --moe-input-jitter-eps: y = x times layer l's router noise for the
  // slot's step (y may alias x); x holds this rank's own rows (own) or all N.
  // Keyed by the serial model's element index, so every layout draws the
  // serial model's noise.
  void router_jitter(const Tensor& x, const Tensor& y, bool own, int l, const Slot& s) const;
  std::vector<int64_t> source_rows(const std::vector<int64_t>& recv) const;
  std::vector<int64_t> rows_to_elements(std::vector<int64_t> rows) const;
  static LayerActs bind_layer(const std::vector<Tensor>& views, const std::array<int, kLayerFields>& entries);
  // A layer position's activations with fc1 and act shaped for a dense or an
  // MoE layer (--moe-layer-freq: a position may hold either; see make_tables).
  LayerActs mlp_shaped(const LayerActs& a, bool moe) const;
  // --qk-layernorm on layer p's fused QKV (forward: a.qkv in place; backward: dqkv in place).
  // --multi-latent-attention: the fused Q/K/V (roped) from the input norm's
  // rows, and the gradients back to them (dln_own written). See gpt.cc.
  kernels::MlaDims mla_dims() const;
  // qkv: a.qkv, or scratch when --recompute-modules mla_up_proj keeps it not.
  void mla_fwd(const LayerIdx& p, const LayerActs& a, const Tensor& ln1_own, const Tensor& qkv);
  // The up projections, packing and RoPE from the kept cq/ckv (or ln1) and
  // the position key kpe: mla_fwd's second half, and mla_up_proj's recompute.
  void mla_up_fwd(const LayerIdx& p, const LayerActs& a, const Tensor& kpe, const Tensor& qkv);
  void mla_bwd(const LayerIdx& p, const LayerActs& a, const Tensor& dqkv, const Tensor& ln1_own, const Tensor& dln_own);
  void qk_norm_fwd(const LayerIdx& p, const kernels::QkvLayout& L, const LayerActs& a);
  void qk_norm_bwd(const LayerIdx& p, const kernels::QkvLayout& L, const LayerActs& a, const Tensor& dqkv);
  Workspace carve_workspace();
  // g: global layer numbers.
  void group_forward(const LayerGroup& g, const Tensor& x, Workspace& ws, const Tensor& out, const Slot& s);
  Tensor scratch(Shape shape, DType dt);

  ModelConfig cfg_;
  GPTOptions opt_;
  int64_t B_ = 0, T_ = 0, N_ = 0, h_ = 0, V_ = 0, qkv_ = 0, fc1_ = 0, F_ = 0;
  int64_t Fd_ = 0, fc1d_ = 0;  // the dense MLP's (fc1_, F_: the experts' with --num-experts)
  int64_t expert_flat_begin_ = 0;
  std::vector<Tensor> expert_bias_;                  // per global layer (--moe-router-enable-expert-bias)
  Tensor expert_bias_counts_;                        // [held MoE layers, E]: the update's all-reduce buffer
  std::vector<std::vector<double>> bias_counts_;     // per global layer: tokens per expert since the update
  int64_t Rx_ = 0;  // --num-experts: the rows this rank's experts can receive (R_ without expert parallelism)
  bool drops_ = false;  // --moe-expert-capacity-factor: each expert keeps cap_ slots per sequence shard
  int64_t segs_ = 1, cap_ = 0;
  int64_t R_ = 0;  // the MLP's rows: N, or N k routed slots with --num-experts (fc1_, F_ the expert's)
  // ETP 1 under TP (GPTOptions::etp): the MoE layers route this rank's Ns
  // rows only (Lr_ = Ns_, R_ = Ns k); else every TP rank routes all N.
  bool xlocal_ = false;
  int64_t Lr_ = 0;
  // The rows this rank routes of ln2 [N, h]: its own with xlocal_, else all.
  // The routing tensors (r_idx, r_probs, r_scores, r_lse, pos, dprobs) hold
  // exactly those rows ([Lr, ...]) and pass through unchanged.
  Tensor routed(const Tensor& t) const { return xlocal_ && t.dim(0) == N_ ? own_rows(t) : t; }
  double moe_loss_scale_ = 1;
  std::optional<double> moe_loss_scale_override_;
  MoeStats moe_stats_;
  MtpStats mtp_stats_;
  // --mtp-num-layers: each depth's own parameters (its transformer layer is
  // layers_[L + k]).
  struct MtpIdx {
    int enorm_w = -1, enorm_b = -1, hnorm_w = -1, hnorm_b = -1, eh_w = -1, final_w = -1, final_b = -1;
  };
  std::vector<MtpIdx> mtp_;
  struct MtpActs;
  // The output layer and vocabulary-parallel cross-entropy on a final
  // norm's output lnf [N, h] (all rows): the logits and the loss's
  // statistics written; returns the sum of the counted labels' losses.
  double output_loss_fwd(const Tensor& lnf, const Tensor& labels, const Tensor& logits, const Tensor& mx,
                         const Tensor& se, const Tensor& tl, const Tensor& loss);
  // Its backward with d(loss) = g for every counted label: dlnf_own (this
  // rank's rows) written, the output layer's gradient accumulated.
  void output_loss_bwd(const Tensor& lnf, const Tensor& labels, const Tensor& logits, const Tensor& mx,
                       const Tensor& se, double g, const Tensor& dlnf_own);
  // The MTP depths after the decoder's final norm (forward), and their
  // backward, last depth first, adding d(h_0) into dlnf (this rank's rows).
  void mtp_forward(Slot& s, const int32_t* tokens, const int32_t* labels);
  void mtp_backward(Slot& s, double loss_scale, const Tensor& dlnf);
  void record_moe_stats(const Slot& s, const std::vector<int64_t>& ran);
  // Stored dtype of qkv, ctx, fc1 and their gradients (and act's gradient):
  // bf16 under --bf16 (they only meet GEMMs and the ops between two GEMMs),
  // else the model dtype.
  DType mid_ = DType::kF32;
  DType rs_ = DType::kF32;  // the residual stream and its gradient
  DType gemm_in_ = DType::kF32;  // what GEMMs read: act (bf16 under --bf16)
  DType dn_ = DType::kF32;  // the gradient of a norm's output (a GEMM's dx)
  int64_t Ns_ = 0, Vg_ = 0, a_ = 0, g_ = 0;  // rows held (N or N/TP), global vocab, local heads/groups
  int64_t Tg_ = 0;  // the whole sequence (T_ = Tg_ / CP positions are this rank's)
  // This rank's Ns rows as runs of consecutive positions: `rows` rows from
  // row `row` of the shard are positions pos, pos + 1, ... (one run without
  // CP; up to two with it).
  struct RowRun {
    int64_t row, rows, pos;
  };
  std::vector<RowRun> runs_;
  std::vector<RowRun> all_runs_;  // the same for all N rows of this rank's positions
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, int> index_;
  std::vector<LayerRange> chunks_;
  std::vector<std::vector<LayerGroup>> chunk_groups_;  // per chunk, positions relative to the chunk
  GPTMemoryPlan plan_;
  SizeTable param_table_, act_table_, workspace_table_;
  SizeTable expert_table_;  // --num-experts: the routed experts' parameters (after param_table_'s)
  std::vector<Tensor> carve_params(Arena& arena) const;
  Arena params_arena_, grads_arena_, lowp_arena_, acts_, scratch_, tables_;
  std::vector<Tensor> params_, grads_, lowp_;  // lowp_[i] undefined unless a bf16 GEMM weight
  std::vector<LayerIdx> layers_;
  int word_ = -1, pos_ = -1, final_w_ = -1, final_b_ = -1, out_ = -1;
  std::vector<Slot> slots_;
  std::vector<std::array<int, kLayerFields>> ws_layers_;  // workspace table entries per group position
  std::vector<int> ws_resid_;
  Tensor rope_cos_, rope_sin_;  // [T, r/2] in tables_: this rank's positions
  Tensor gate_rows_;            // --moe-shared-expert-gate: [N, 1] int32 rows 0..N-1
  Tensor norm_ones_, norm_w1_;  // --apply-layernorm-1p: ones [h], and 1 + gamma of the norm being run
  std::function<void(int)> backward_hook_, forward_hook_;
};

uint64_t fnv1a(const std::string& s);

}  // namespace mt::model
