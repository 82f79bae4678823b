#pragma once
// Optimizer: Megatron's optimizers over one GPTModel's parameters: AdamW
// (--optimizer adam, the default) or SGD with momentum (--optimizer sgd).
//
// - Master weights are the model's parameters (fp32; fp64 in tests). With
//   bf16 compute the model keeps bf16 copies of its GEMM weights; step()
//   rewrites them in the same pass as it updates the masters (after the
//   parameter all-gather with the distributed optimizer).
// - Gradients are the model's grads (same dtype as the parameters).
// - State, per parameter, carved from ONE arena with the parameters' size
//   table once per state tensor, so the planner's "states x params" size is
//   what is allocated:
//     AdamW: exp_avg (m) and exp_avg_sq (v) ([all m | all v]);
//     SGD:   momentum_buffer (in m), none with --sgd-momentum 0.
// - AdamW update (PyTorch AdamW / Megatron FusedAdam adam_w_mode,
//   kernels/optimizer_step.h): with t = step_count() after incrementing,
//     p -= lr * wd * wd_mult * p
//     m  = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//     p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//   wd_mult is 0 for parameters whose ParamSpec has weight_decay == false
//   (biases and 1-D norm parameters: Megatron's no-wd group) and 1 otherwise.
// - SGD update (torch.optim.SGD / FusedSGD, coupled weight decay):
//     g += wd * wd_mult * p;  buf = momentum buf + g;  p -= lr * buf
// - clip_grad_norm: Megatron's clip_grad_norm_fp32: norm = sqrt(sum g^2) over
//   every gradient (fp64 accumulation), coef = max_norm / (norm + 1e-6),
//   gradients scaled by coef only when coef < 1 -- by the next step(), which
//   reads each gradient as g * coef (the same rounding as scaling it in place
//   first, without a separate pass; pending_grad_scale()). The norm is summed
//   in a fixed order (independent of threads), so it is bitwise reproducible.
//
// Typical iteration (the trainer's order):
//   model.zero_grads(); forward/backward over micro-batches;
//   if (check_nan && !opt.grads_finite()) -> report;
//   double norm = opt.clip_grad_norm(clip_grad);
//   opt.step(sched);            // uses sched.lr(), sched.wd() (values BEFORE advancing)
//   sched.step(global_batch_size);
//
// Parallel training (ParallelOptimizerOptions):
// - Tensor parallelism: every TP rank updates its own shards; the gradient
//   norm sums squares of split parameters on every TP rank but of replicated
//   parameters (identical on all TP ranks) only on TP rank 0, then
//   all-reduces over TP, so nothing is counted twice. NaN checks are
//   all-reduced likewise.
// - Data parallelism without the distributed optimizer: gradients were
//   all-reduced (parallel::GradBuckets kAllReduce), every DP rank runs the
//   same update on identical values.
// - Distributed optimizer (buckets in kReduceScatter mode): this rank keeps
//   its state only for its shard blocks of the flat buffer (the elements it
//   owns, buckets->shard()), clips and updates only those elements (fp32
//   master weights = the model's fp32 parameters), then all-gathers the
//   updated parameters (GradBuckets::all_gather_params, or asynchronously
//   with overlap_param_gather: the trainer waits per forward stage). The
//   norm sums squares over the owned blocks and all-reduces over DP and TP.
//   SGD works so too (Megatron refuses SGD here because its sharded
//   checkpoint format knows only Adam's state; this program's checkpoints
//   hold whole tensors whatever the layout).
// - Expert parallelism (--num-experts): the experts' region of the flat
//   buffers has its own buckets over the expert data-parallel group (and
//   its own distributed-optimizer shards); the norm's expert part is summed
//   over that group when sharded and over the EP group (each EP rank holds
//   other experts) before it joins the rest.
//
// Thread safety: none. Holds a reference to the model, which must outlive it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "core/arena.h"
#include "core/tensor.h"
#include "model/gpt.h"
#include "optim/scheduler.h"

namespace mt::comm {
class Communicator;
}
namespace mt::parallel {
class GradBuckets;
}

namespace mt::optim {

struct ParallelOptimizerOptions {
  comm::Communicator* tp = nullptr;      // tensor-parallel group (null: TP = 1)
  comm::Communicator* dp = nullptr;      // data-parallel group (null: DP = 1)
  comm::Communicator* pp = nullptr;      // pipeline group (null: PP = 1): norms and NaN checks span the stages
  int64_t tp_rank = 0;                   // for counting replicated parameters once
  // Set with mode kReduceScatter for the distributed optimizer (not owned;
  // built over the model's flat_grads()/flat_params()).
  parallel::GradBuckets* dist_buckets = nullptr;
  bool overlap_param_gather = false;     // step() starts the gather; the trainer waits
  // --num-experts: the routed experts' parameters (model.expert_flat_begin()
  // on) differ over the expert-parallel group `ep` (null: EP = 1) and are
  // reduced over the expert data-parallel group `expert_dp` (null: a model
  // without experts; the DP x CP group itself when EP = 1, so that it is
  // recognised as the same group); with the distributed optimizer, expert_dist_buckets are
  // built over that region of the flat buffers (kReduceScatter) and shard
  // their Adam state over expert_dp, as dist_buckets do the rest over dp.
  comm::Communicator* ep = nullptr;
  comm::Communicator* expert_dp = nullptr;
  // false with --expert-tensor-parallel-size 1 under TP: every rank holds
  // its experts whole, so norms count them over EP only, not over TP too.
  bool experts_split_over_tp = true;
  parallel::GradBuckets* expert_dist_buckets = nullptr;
};

// The part of one parameter whose optimizer state this rank keeps: local
// flat elements [begin, end) of parameter `param`; m and v are 1-D views of
// end - begin elements (Optimizer::state_count() of them are defined: AdamW's
// exp_avg and exp_avg_sq, SGD's momentum buffer in m).
struct StateRange {
  int param = 0;
  int64_t begin = 0, end = 0;
  Tensor m, v;
  const Tensor& state(int k) const { return k == 0 ? m : v; }
};

enum class OptimizerKind { kAdam, kSgd };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdam;  // --optimizer
  double sgd_momentum = 0.9;                  // --sgd-momentum
  double beta1 = 0.9;    // --adam-beta1
  double beta2 = 0.999;  // --adam-beta2
  double eps = 1e-8;     // --adam-eps
  // --apply-wd-to-qk-layernorm: the q/k norm parameters (--qk-layernorm)
  // decay like the weights; every other 1-D parameter and bias stays exempt.
  bool apply_wd_to_qk_layernorm = false;
  // --decoupled-lr / --decoupled-min-lr: the word embedding and the output
  // layer (Megatron's is_embedding_or_output_parameter: a last stage's copy
  // of a tied embedding too) follow the same schedule between these
  // endpoints; the minimum defaults to --min-lr.
  std::optional<double> decoupled_lr{}, decoupled_min_lr{};
};

// Megatron's name of the optimizer (--optimizer) and its state tensors, as
// torch's optimizers name them in their state dicts (the checkpoint's
// "optimizer.<state>.<param>" tensors).
const char* optimizer_name(OptimizerKind k);
std::vector<std::string> optimizer_state_names(const OptimizerConfig& c);

class Optimizer {
 public:
  // Allocates the state (zeros) for every parameter of `model`.
  Optimizer(model::GPTModel& model, const OptimizerConfig& cfg = {}, const ParallelOptimizerOptions& par = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter with learning rate `lr` and weight
  // decay `wd` (times each parameter's wd_mult); increments step_count() first;
  // then refreshes the model's bf16 copies when it computes in bf16.
  // decoupled_lr: the learning rate of the word embedding and output layer
  // (OptimizerConfig::decoupled_lr); negative: `lr` for them too.
  void step(double lr, double wd, double decoupled_lr = -1);
  // step(sched.lr(), sched.wd()), with the decoupled parameters' LR from the
  // same schedule at their endpoints. Does NOT advance the scheduler.
  void step(const OptimizerParamScheduler& sched);
  // Whether parameter i takes the decoupled learning rate.
  bool decoupled(int i) const { return decoupled_[static_cast<size_t>(i)] != 0; }

  // Global L2 norm of all gradients (fp64 accumulation); no change to them.
  double grad_norm() const;
  // Global L2 norm of the fp32 parameters (--log-params-norm; Megatron's
  // calc_params_l2_norm): each element counted once, whatever the layout
  // (TP-replicated tensors on TP rank 0, a tied output weight on the first
  // stage, with the distributed optimizer each DP rank's own shard, which
  // step() has updated even while an overlapped all-gather is in flight).
  double params_norm() const;
  // The number of zero gradient elements of the whole model
  // (--log-num-zeros-in-grad; Megatron's count_zeros_fp32), each element
  // counted once as params_norm() counts it. Counted, as Megatron does, on
  // the gradients scaled by the pending clipping coefficient (call after
  // clip_grad_norm): a value the scaling flushes to 0 counts.
  int64_t grad_zeros() const;
  // Megatron's clipping (see above). Returns the norm BEFORE clipping.
  // max_norm <= 0 disables clipping (the norm is still computed and returned).
  double clip_grad_norm(double max_norm);
  // The clipping coefficient the next step() applies (1 when not clipping).
  double pending_grad_scale() const { return grad_scale_; }
  // False if any gradient element is NaN or +-Inf (--check-for-nan-in-loss-and-grad).
  bool grads_finite() const;
  // --check-weight-hash-across-dp-replicas-interval (Megatron's
  // check_param_hashes_across_dp_replicas with cross_check): a 52-bit hash
  // of every parameter's bytes, compared over the ranks that hold replicas
  // of it (the data-parallel group; routed experts' over the expert DP
  // group). Returns the names of the parameters whose hash differs on some
  // rank of its group -- the same list on every rank of that group; empty
  // when all match. A collective over those groups: every rank calls it.
  std::vector<std::string> params_differing_across_replicas() const;

  // Checkpoint state: every range of optimizer state this rank keeps (one
  // per parameter, whole, without the distributed optimizer), and the state
  // tensors each range holds (state_names()[k] is StateRange::state(k)).
  const std::vector<StateRange>& state_ranges() const { return ranges_; }
  const std::vector<std::string>& state_names() const { return state_names_; }
  int state_count() const { return static_cast<int>(state_names_.size()); }
  bool distributed() const { return par_.dist_buckets != nullptr; }
  // Without the distributed optimizer: the state per parameter (AdamW's
  // moments; SGD's momentum buffer in exp_avg()), in the model's order
  // (model.specs()), same shapes and dtype as the parameters; write into
  // them to restore. Empty with the distributed optimizer, and where the
  // optimizer has no such state.
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }
  const std::vector<Tensor>& exp_avg() const { return m_; }
  const std::vector<Tensor>& exp_avg_sq() const { return v_; }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  // Zeroes the state and the step count.
  void reset_state();

  // 0 or 1 per parameter (model.specs() order).
  const std::vector<double>& wd_mult() const { return wd_mult_; }
  const OptimizerConfig& config() const { return cfg_; }
  model::GPTModel& model() const { return model_; }
  size_t state_bytes() const { return state_arena_.capacity(); }

 private:
  double norm_of(const std::vector<Tensor>& tensors) const;
  // The pieces of `tensors` (gradients or parameters) this rank counts toward
  // a whole-model statistic, and the sum of a per-rank value over the ranks
  // that split the model (TP, PP, and DP with the distributed optimizer).
  // Returned as {non-expert parts, expert parts}.
  std::pair<std::vector<Tensor>, std::vector<Tensor>> counted_parts(const std::vector<Tensor>& tensors) const;
  double sum_over_model(double dense, double expert) const;

  model::GPTModel& model_;
  OptimizerConfig cfg_;
  std::vector<char> decoupled_;  // per parameter: the word embedding / output layer under --decoupled-lr
  ParallelOptimizerOptions par_;
  double grad_scale_ = 1.0;  // clipping coefficient for the next step()
  std::vector<std::string> state_names_;
  std::vector<StateRange> ranges_;
  Arena state_arena_;
  std::vector<Tensor> m_, v_;
  std::vector<double> wd_mult_;
  int64_t step_ = 0;
};

}  // namespace mt::optim
