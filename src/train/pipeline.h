#pragma once
// PipelineExecutor: runs one iteration of a pipeline schedule on this rank.
//
// The program is data: parallel::pipeline_steps(schedule)[pp_rank], the
// schedule's compute actions (1F1B, interleaved 1F1B, or plain gradient
// accumulation when PP = 1) with the receives before and the sends after
// them. The executor only interprets it:
//   RecvForward   blocking recv of the previous virtual stage's output into
//                 the chosen slot's chunk_input ([Ns, h]: sequence-sharded
//                 when SP is on, as Megatron sends it)
//   Forward       model.forward_chunk into a free activation slot
//   SendForward   non-blocking send of chunk_output (stays valid: the slot
//                 lives until its backward)
//   RecvBackward  blocking recv of d(output) from the next virtual stage
//   Backward      model.backward_chunk; the slot is freed right after
//   SendBackward  non-blocking send of d(input) from a send buffer that is
//                 reused only once its previous send completed
// Sends never block (a slot's earlier send is waited for only when the slot
// is reused, by which time its receiver has it) and every receive names a
// unique tag, so a schedule that
// check_pipeline_steps() proves deadlock-free cannot deadlock here; pending
// sends are completed before run() returns.
//
// Slots: an activation slot holds one chunk's activations for one
// micro-batch; the model has as many as the planner's in-flight count for
// this rank (simulate()'s max_in_flight), and the executor fails loudly if
// the schedule ever needs more.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/gpt.h"
#include "parallel/schedule.h"

namespace mt::train {

struct MicroBatchInput {
  Tensor tokens, labels;  // [B, T] int32
  uint64_t dropout_step = 0;
  Tensor position_ids, segment_ids;  // [B, T] int32 (--reset-position-ids / --reset-attention-mask), or undefined
};

// What each micro-batch's backward starts from: d(its mean loss) (Megatron's
// default) or d(its loss summed over the counted tokens) (--calculate-per-token-loss).
enum class LossReduction { kMean, kSum };

// What a run's micro-batches give the loss Megatron reports (sum over the
// counted tokens / their number, over the global batch).
struct LossTotals {
  double loss = 0;    // sum of the counted tokens' losses (the last pipeline stage; 0 on the others)
  double tokens = 0;  // labels counted (label >= 0), known on every stage
};

class PipelineExecutor {
 public:
  // `pp` is the pipeline group (size 1 without pipelining); it and `model`
  // must outlive the executor.
  PipelineExecutor(model::GPTModel& model, comm::Communicator& pp, const parallel::Schedule& schedule);

  // One training iteration's forwards and backwards over `batches` (the M
  // micro-batches). before_backward(m, chunk) runs before each backward (the
  // trainer arms its gradient-bucket hooks for the last micro-batch).
  // Each micro-batch's backward starts from loss_scale x d(its mean loss),
  // or with LossReduction::kSum loss_scale x d(its loss sum), i.e. x its
  // label count.
  LossTotals run_train(const std::vector<MicroBatchInput>& batches, double loss_scale, LossReduction reduction,
                       const std::function<void(int microbatch, int chunk)>& before_backward = {},
                       const std::function<void(int microbatch, int chunk)>& after_backward = {});
  // Forward only (evaluation): every micro-batch through every virtual stage
  // in order.
  LossTotals run_forward(const std::vector<MicroBatchInput>& batches);

  // Switches to another schedule of the same pipeline (another number of
  // micro-batches: --step-batch-size-schedule), between iterations. The
  // model's activation slots must suffice for it (take_slot checks).
  void set_schedule(const parallel::Schedule& schedule);
  int64_t microbatches() const { return schedule_.microbatches; }

  int max_slots_used() const { return max_used_; }
  // Bytes of the planned receive buffer (the d(input) send buffers grow on
  // demand and are not counted).
  size_t buffer_bytes() const { return buffers_.capacity(); }
  // Seconds the last run_train spent blocked in receives (waiting on a
  // neighbouring stage): this rank's measured pipeline bubble.
  double last_wait_seconds() const { return wait_s_; }

 private:
  int take_slot();
  void add_loss_totals(int chunk, int slot, LossTotals& t) const;
  void wait_sends();
  Tensor send_buffer();

  model::GPTModel& model_;
  comm::Communicator& pp_;
  parallel::Schedule schedule_;
  std::vector<parallel::PipelineStep> steps_;
  int pp_rank_ = 0;
  std::vector<int> free_slots_;
  int max_used_ = 0;
  double wait_s_ = 0;
  // Communication buffers live where the model does (its options().device):
  // device groups (NCCL, staged) move device memory only.
  Arena buffers_;                    // the d(output) receive buffer
  Tensor grad_in_;                   // [Ns, h]
  std::deque<Arena> send_storage_;   // one buffer each; grows only while sends are still in flight
  std::vector<Tensor> send_bufs_;    // in send_storage_, [Ns, h]
  std::vector<std::unique_ptr<comm::Work>> send_buf_work_;
  size_t next_send_buf_ = 0;
  std::vector<std::unique_ptr<comm::Work>> pending_;  // forward sends
};

}  // namespace mt::train
