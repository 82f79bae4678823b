#include "train/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>

namespace mt::train {

namespace {
using Step = parallel::PipelineStep;
using Clock = std::chrono::steady_clock;
}

PipelineExecutor::PipelineExecutor(model::GPTModel& model, comm::Communicator& pp, const parallel::Schedule& schedule)
    : model_(model), pp_(pp), schedule_(schedule), pp_rank_(pp.rank()) {
  MT_CHECK(schedule.pp == pp.size(), fmt::format("PipelineExecutor: schedule for PP {} on a pipeline group of {}",
                                                 schedule.pp, pp.size()));
  MT_CHECK(schedule.vpp == model.num_chunks(),
           fmt::format("PipelineExecutor: schedule has {} chunks per rank, the model {}", schedule.vpp, model.num_chunks()));
  set_schedule(schedule);
  const int slots = static_cast<int>(model.options().slots);
  for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
  if (schedule.pp > 1) {  // the gradient from the next stage arrives here
    const Tensor in = model.chunk_input(0);
    buffers_ = Arena(align_up(in.nbytes()), "pipeline-grad-recv", model.options().device);
    grad_in_ = buffers_.alloc(in.shape(), in.dtype());
  }
}

void PipelineExecutor::set_schedule(const parallel::Schedule& schedule) {
  MT_CHECK(schedule.pp == schedule_.pp && schedule.vpp == schedule_.vpp,
           "PipelineExecutor::set_schedule: the new schedule is for another pipeline");
  schedule_ = schedule;
  steps_ = parallel::pipeline_steps(schedule)[static_cast<size_t>(pp_rank_)];
}

int PipelineExecutor::take_slot() {
  MT_CHECK(!free_slots_.empty(),
           fmt::format("pipeline rank {}: the schedule has more micro-batches in flight than the {} activation slots "
                       "planned for it",
                       pp_rank_, model_.options().slots));
  const int s = free_slots_.back();
  free_slots_.pop_back();
  max_used_ = std::max(max_used_, static_cast<int>(model_.options().slots) - static_cast<int>(free_slots_.size()));
  return s;
}

// A [Ns, h] buffer whose previous send (if any) has completed. A buffer whose
// send is still in flight is never waited for (its receiver may first need
// something from this rank): a new one is made instead; at most as many as
// sends in flight, which the schedule bounds.
Tensor PipelineExecutor::send_buffer() {
  for (size_t k = 0; k < send_bufs_.size(); ++k) {
    const size_t i = (next_send_buf_ + k) % send_bufs_.size();
    if (!send_buf_work_[i] || send_buf_work_[i]->test()) {
      send_buf_work_[i].reset();
      next_send_buf_ = (i + 1) % send_bufs_.size();
      return send_bufs_[i];
    }
  }
  const Tensor in = model_.chunk_input(0);
  send_storage_.emplace_back(align_up(in.nbytes()), "pipeline-grad-send", model_.options().device);
  send_bufs_.push_back(send_storage_.back().alloc(in.shape(), in.dtype()));
  send_buf_work_.emplace_back();
  next_send_buf_ = 0;
  return send_bufs_.back();
}

void PipelineExecutor::wait_sends() {
  for (auto& w : pending_)
    if (w) w->wait();
  pending_.clear();
  for (auto& w : send_buf_work_)
    if (w) w->wait(), w.reset();
}

// Each micro-batch counted once per rank: after the forward of its last chunk here.
void PipelineExecutor::add_loss_totals(int chunk, int slot, LossTotals& t) const {
  if (chunk + 1 != model_.num_chunks()) return;
  t.loss += model_.loss_total(slot);
  t.tokens += model_.label_count(slot);
}

LossTotals PipelineExecutor::run_train(const std::vector<MicroBatchInput>& batches, double loss_scale,
                                       LossReduction reduction,
                                       const std::function<void(int, int)>& before_backward,
                                       const std::function<void(int, int)>& after_backward) {
  MT_CHECK(static_cast<int64_t>(batches.size()) == schedule_.microbatches,
           fmt::format("PipelineExecutor: {} micro-batches for a schedule of {}", batches.size(), schedule_.microbatches));
  std::map<std::pair<int, int>, int> slot_of;  // (micro-batch, chunk) -> slot
  wait_s_ = 0;
  std::vector<std::unique_ptr<comm::Work>> slot_send(static_cast<size_t>(model_.options().slots));
  LossTotals totals;
  int recv_slot = -1;  // slot chosen by a RecvForward for the Forward that follows
  Tensor pending_dinput;
  for (const Step& st : steps_) {
    const int m = st.microbatch, c = st.chunk;
    switch (st.kind) {
      case Step::kRecvForward: {
        recv_slot = take_slot();
        auto& w = slot_send[static_cast<size_t>(recv_slot)];
        // The slot's previous output was received long ago: its backward ran,
        // which needed the next stage's gradient, which needed that output.
        if (w) w->wait(), w.reset();
        const auto t0 = Clock::now();
        pp_.recv(model_.chunk_input(recv_slot), st.peer, st.tag);
        wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
        break;
      }
      case Step::kForward: {
        int slot = recv_slot;
        if (slot < 0) {
          slot = take_slot();
          auto& w = slot_send[static_cast<size_t>(slot)];
          if (w) w->wait(), w.reset();
        }
        recv_slot = -1;
        slot_of[{m, c}] = slot;
        const MicroBatchInput& b = batches[static_cast<size_t>(m)];
        model_.forward_chunk(c, slot, b.tokens, b.labels, b.dropout_step, /*training=*/true, b.position_ids,
                             b.segment_ids);
        add_loss_totals(c, slot, totals);
        break;
      }
      case Step::kSendForward: {
        const int slot = slot_of.at({m, c});
        slot_send[static_cast<size_t>(slot)] = pp_.isend(model_.chunk_output(slot), st.peer, st.tag);
        break;
      }
      case Step::kRecvBackward: {
        const auto t0 = Clock::now();
        pp_.recv(grad_in_, st.peer, st.tag);
        wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
        break;
      }
      case Step::kBackward: {
        auto it = slot_of.find({m, c});
        MT_CHECK(it != slot_of.end(), fmt::format("pipeline rank {}: backward of micro-batch {} chunk {} before its forward",
                                                  pp_rank_, m, c));
        const int slot = it->second;
        const bool last = model_.post_process() && c + 1 == model_.num_chunks();
        const bool first = model_.pre_process() && c == 0;
        pending_dinput = first ? Tensor() : send_buffer();
        if (before_backward) before_backward(m, c);
        const double scale =
            reduction == LossReduction::kSum ? loss_scale * model_.label_count(slot) : loss_scale;
        model_.backward_chunk(slot, scale, last ? Tensor() : grad_in_, pending_dinput);
        if (after_backward) after_backward(m, c);
        slot_of.erase(it);
        free_slots_.push_back(slot);
        break;
      }
      case Step::kSendBackward: {
        MT_CHECK(pending_dinput.defined(), "pipeline: SendBackward without a backward before it");
        for (size_t i = 0; i < send_bufs_.size(); ++i)
          if (send_bufs_[i].data() == pending_dinput.data()) send_buf_work_[i] = pp_.isend(pending_dinput, st.peer, st.tag);
        pending_dinput = Tensor();
        break;
      }
    }
  }
  for (auto& w : slot_send)
    if (w) w->wait();
  wait_sends();
  MT_CHECK(slot_of.empty(), fmt::format("pipeline rank {}: {} micro-batches were never backwarded", pp_rank_, slot_of.size()));
  return totals;
}

LossTotals PipelineExecutor::run_forward(const std::vector<MicroBatchInput>& batches) {
  const int P = static_cast<int>(schedule_.pp), V = static_cast<int>(schedule_.vpp), S = P * V;
  LossTotals totals;
  const int slot = 0;
  std::unique_ptr<comm::Work> send;
  for (size_t m = 0; m < batches.size(); ++m)
    for (int s = 0; s < S; ++s) {
      if (s % P != pp_rank_) continue;
      const int c = s / P;
      // Same tag convention as pipeline_steps: (m * S + receiving stage) * 2 + 0.
      if (send) send->wait(), send.reset();  // slot 0 is about to be overwritten
      if (s > 0) pp_.recv(model_.chunk_input(slot), (pp_rank_ - 1 + P) % P, static_cast<int>((m * S + s) * 2));
      const MicroBatchInput& b = batches[m];
      model_.forward_chunk(c, slot, b.tokens, b.labels, 0, /*training=*/false, b.position_ids, b.segment_ids);
      add_loss_totals(c, slot, totals);
      if (s + 1 < S) send = pp_.isend(model_.chunk_output(slot), (pp_rank_ + 1) % P, static_cast<int>((m * S + s + 1) * 2));
    }
  if (send) send->wait();
  return totals;
}

}  // namespace mt::train
