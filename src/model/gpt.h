#pragma once
// GPTModel: Megatron's GPTModel on one tensor-parallel rank (TP = 1 for now),
// with explicit forward and backward and no autograd. GPT-2/3 and LLaMA
// styles are the same code selected by ModelConfig flags.
//
// Memory (one allocation each, carved by a SizeTable, llm.c style):
//   params   every parameter of gpt_param_specs(), in registry order
//   grads    same table as params (so flat views line up for reductions)
//   lowp     bf16 copies of the GEMM weights when compute is bf16
//            (refresh with sync_low_precision() after each optimizer step)
//   acts     `slots` activation slots; a slot holds everything one
//            micro-batch's backward needs (see ActivationTable in gpt.cc);
//            a pipeline stage keeps one slot per micro-batch in flight
//   scratch  temporaries of forward/backward, reset after every call
// activation_bytes_per_slot() and scratch_bytes() are the planned sizes.
//
// Activations are in Megatron's [s, b, h] order: row r = t * B + b, so a
// sequence-parallel shard is a contiguous block of rows.
//
// Dropout and initialisation draw from Philox (core/rng.h):
//   init: stream = fnv1a(parameter name), element = global flat index
//   dropout: stream = ((dropout_step * 4096 + layer) * 4 + site); sites:
//            0 attention probabilities, 1 after linear_proj, 2 after
//            linear_fc2, 3 embedding output (layer = 4095)
// Each forward() takes the step index so that backward() regenerates masks.
//
// Communication (for the tensor-parallel issue): linear_qkv and linear_fc1 are
// column-parallel (fwd identity | bwd all-reduce dx), linear_proj and
// linear_fc2 row-parallel (fwd all-reduce y | bwd identity), the embedding
// vocab-parallel (fwd all-reduce), the loss vocab-parallel (kernels/
// cross_entropy.h). With TP = 1 every collective is the identity and omitted.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace mt::model {

struct GPTOptions {
  int64_t micro_batch = 1;       // B
  int64_t seq_length = 0;        // T (0: cfg.seq_length)
  DType dtype = DType::kF32;     // parameters and activations: fp32, or fp64 (tests)
  bool bf16_compute = false;     // GEMM inputs in bf16 with fp32 accumulation
  int slots = 1;                 // activation slots (micro-batches in flight)
  int64_t tp = 1;                // tensor-parallel size (only 1 is implemented here)
};

class GPTModel {
 public:
  // Validates cfg (Status for user errors) and allocates every arena.
  static Result<std::unique_ptr<GPTModel>> create(const ModelConfig& cfg, const GPTOptions& opt);
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // Megatron's initialisation from `seed`: normal(0, init_method_std) for
  // weights and embeddings, std / sqrt(2 L) for linear_proj and linear_fc2,
  // zeros for biases, ones/zeros for norms. Each value depends only on the
  // seed, the parameter's name and its global index (parallel-invariant).
  void init_parameters(uint64_t seed);

  // Forward of one micro-batch into `slot`.
  //   tokens, labels: [B, T] int32 (the data loader's order); label < 0 is ignored.
  // Returns the mean loss over counted labels (Megatron: sum(loss*mask)/sum(mask)).
  // dropout_step keys the dropout masks (see above); training=false disables dropout.
  double forward(int slot, const Tensor& tokens, const Tensor& labels, uint64_t dropout_step = 0,
                 bool training = true);
  // Backward of the micro-batch in `slot`; ACCUMULATES into grads (call
  // zero_grads() once per optimizer step). loss_scale multiplies d(loss)
  // (1/num_microbatches for gradient accumulation).
  void backward(int slot, double loss_scale = 1.0);
  void zero_grads();
  // bf16 copies of the GEMM weights from the fp32 parameters.
  void sync_low_precision();

  // Logits of the last forward in `slot`: [T*B, V] ([s, b] rows). Valid until backward(slot).
  Tensor logits(int slot) const;

  const ModelConfig& config() const { return cfg_; }
  const GPTOptions& options() const { return opt_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& grads() const { return grads_; }
  // Index of a parameter by Megatron name, or -1.
  int find(const std::string& name) const;
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  int64_t vocab() const { return V_; }

  size_t activation_bytes_per_slot() const { return act_table_.total_bytes(); }
  size_t scratch_bytes() const { return scratch_.capacity(); }
  const Arena& scratch_arena() const { return scratch_; }
  const Arena& activation_arena() const { return acts_; }

  // Model FLOPs of one forward+backward of a micro-batch (Megatron's formula,
  // ../shared/spec/megatron-reference.md §5, with B*s tokens).
  double flops_per_micro_batch() const;

 private:
  GPTModel(const ModelConfig& cfg, const GPTOptions& opt);
  struct LayerIdx;
  struct Slot;
  void build_activation_table();
  void linear_fwd(const Tensor& x, int w, int b, const Tensor& y);
  void linear_bwd(const Tensor& x, int w, int b, const Tensor& dy, const Tensor& dx);
  void norm_fwd(const Tensor& x, int w, int b, const Tensor& y, const Tensor& mean, const Tensor& rstd);
  void norm_bwd(const Tensor& dy, const Tensor& x, int w, int b, const Tensor& mean, const Tensor& rstd,
                const Tensor& dx);
  void layer_forward(int l, Slot& s);
  void layer_backward(int l, Slot& s, const Tensor& dresid);
  Tensor scratch(Shape shape, DType dt);

  ModelConfig cfg_;
  GPTOptions opt_;
  int64_t B_ = 0, T_ = 0, N_ = 0, h_ = 0, V_ = 0, qkv_ = 0, fc1_ = 0, F_ = 0;
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, int> index_;
  SizeTable param_table_, act_table_;
  Arena params_arena_, grads_arena_, lowp_arena_, acts_, scratch_, tables_;
  std::vector<Tensor> params_, grads_, lowp_;  // lowp_[i] undefined unless a bf16 GEMM weight
  std::vector<LayerIdx> layers_;
  int word_ = -1, pos_ = -1, final_w_ = -1, final_b_ = -1, out_ = -1;
  std::vector<Slot> slots_;
  Tensor rope_cos_, rope_sin_;  // [T, d/2] in tables_
};

uint64_t fnv1a(const std::string& s);

}  // namespace mt::model
