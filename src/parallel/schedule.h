#pragma once
// Pipeline schedules as data (DESIGN principle 4): a pure function of
// (pipeline size P, model chunks per rank V, micro-batches M, group size N)
// giving each pipeline rank's ordered list of compute actions, in Megatron's
// order (../shared/spec/megatron-reference.md §8):
//   P = 1            no pipelining: F0 B0 F1 B1 ...
//   P > 1, V = 1     1F1B: warm-up min(P-r-1, M) forwards, steady 1F+1B pairs,
//                    cool-down backwards
//   P > 1, V > 1     interleaved 1F1B: warm-up (P-r-1)*2 + (V-1)*N chunk
//                    forwards (capped at M*V), micro-batches in groups of N
// The executor runs these lists; the planner simulates and draws them; tests
// check their invariants without a model.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mt::parallel {

enum class ScheduleKind { kNoPipelining, kOneFOneB, kInterleaved };
const char* schedule_kind_name(ScheduleKind k);

struct Action {
  enum Op : uint8_t { kForward, kBackward } op;
  int32_t microbatch;
  int32_t chunk;  // model chunk on this rank (0..V-1)
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::kNoPipelining;
  int64_t pp = 1, vpp = 1, microbatches = 1, group_size = 1;
  std::vector<std::vector<Action>> ranks;  // [pp][actions]
};

// REQUIRES nothing: invalid combinations (e.g. interleaving with M not
// meeting Megatron's rule) come back as an error naming the rule.
Result<Schedule> build_schedule(int64_t pp, int64_t vpp, int64_t microbatches,
                                int64_t group_size /* 0 = P, Megatron's default */);

// Megatron's interleaved order: the (micro-batch, chunk) of the k-th forward
// on any rank. Backward k visits chunk V-1-chunk.
std::vector<std::pair<int32_t, int32_t>> interleaved_order(int64_t vpp, int64_t microbatches,
                                                           int64_t group_size);

// Runs a schedule with fixed action durations, honouring each rank's order
// and the data dependencies between stages (forward of virtual stage s needs
// forward of s-1 for the same micro-batch; backward of s needs backward of
// s+1, or the forward of the last stage). Communication is free.
struct TimedAction {
  Action action;
  double start = 0, end = 0;
};
struct Timeline {
  std::vector<std::vector<TimedAction>> ranks;
  double makespan = 0;
  double busy_per_rank = 0;         // same on every rank
  double bubble_fraction = 0;       // idle / (P * makespan)
  std::vector<int64_t> max_in_flight;  // per rank: chunk-micro-batches with F done, B not
  bool deadlock = false;            // some rank could never proceed
};
Timeline simulate(const Schedule& s, double t_forward, double t_backward);

// Megatron's closed form for the peak number of chunk-micro-batches a rank
// holds (forward done, backward not), §8: 1F1B min(P - r, M); interleaved
// min((P - r - 1)*2 + (V - 1)*N + 1, M*V) (N = group size, 0 = P); 1 without
// pipelining. Equals simulate()'s max_in_flight for every schedule
// build_schedule accepts (the count depends on the order only).
int64_t megatron_in_flight(int64_t pp, int64_t vpp, int64_t microbatches, int64_t group_size,
                           int64_t rank);

// One step of a pipeline rank's program: the compute actions of the schedule
// with the receives before and the sends after them. The virtual stage of
// (rank r, chunk c) is s = c*P + r (Megatron's chunk-major numbering); there
// are S = P*V stages.
//   Forward(m, c):  if s > 0:     RecvForward from rank (r - 1 + P) % P first;
//                   if s < S - 1: SendForward to rank (r + 1) % P after.
//   Backward(m, c): if s < S - 1: RecvBackward from rank (r + 1) % P first;
//                   if s > 0:     SendBackward to rank (r - 1 + P) % P after.
// A communication step carries the micro-batch and chunk of the compute
// action on *this* rank that it feeds (receive) or comes from (send).
// Every message has a tag unique among the messages between two ranks in one
// iteration, so matching never depends on arrival order:
//   tag = (m*S + receiver's virtual stage)*2 + (0 forward | 1 backward),
// which lies in [0, 2*M*S). With P = 2 and V > 1, rank 1 sends both forward
// activations (chunk c -> rank 0's chunk c+1) and backward gradients to
// rank 0; the tags keep them apart. (MPI only promises tags up to 32767;
// 2*M*S can exceed that for large M*S, so an executor on a transport with a
// small MPI_TAG_UB must check it.)
struct PipelineStep {
  enum Kind : uint8_t { kRecvForward, kForward, kSendForward, kRecvBackward, kBackward, kSendBackward };
  Kind kind;
  int32_t microbatch = 0, chunk = 0;
  int32_t peer = -1;  // pipeline rank of the other side (-1 for compute)
  int32_t tag = -1;   // -1 for compute
};
const char* pipeline_step_kind_name(PipelineStep::Kind k);

// [pp][steps]. REQUIRES 2*M*P*V <= INT32_MAX (the tags fit in int32).
std::vector<std::vector<PipelineStep>> pipeline_steps(const Schedule& s);

// Checks step lists against the schedule and runs them with the executor's
// semantics (blocking receives matched by (sender, receiver, tag),
// non-blocking buffered sends) on an ideal machine.
//   completes:       the lists are well formed (compute steps are exactly the
//                    schedule's, in order; every receive precedes the compute
//                    it feeds and every send follows the compute it comes
//                    from; each send has exactly one receive with the same
//                    tag, the opposite kind, consistent peers, the same
//                    micro-batch and the adjacent virtual stage) and every
//                    rank runs to the end (no deadlock).
//   fifo_compatible: for every (sender, receiver, direction), the sender
//                    sends in the order the receiver receives, so a
//                    transport that matches in arrival order (no tags, one
//                    channel per direction) would pair the same messages.
//   pair_fifo_compatible: the same for every (sender, receiver) with both
//                    directions' messages together: what a transport that
//                    matches in issue order per pair of ranks needs (NCCL:
//                    no tags). It holds without virtual stages and for PP >= 3
//                    (a pair then carries one direction), and for PP 2 with
//                    the default micro-batch groups, but not always with
//                    larger groups (e.g. V 4, M 8, groups of 4).
//   problem:         the first thing found wrong, empty when completes and
//                    fifo_compatible hold; pair_problem: the first pair whose
//                    orders differ.
struct P2PCheck {
  bool completes = false;
  bool fifo_compatible = false;
  bool pair_fifo_compatible = false;
  std::string problem, pair_problem;
};
P2PCheck check_pipeline_steps(const Schedule& s, const std::vector<std::vector<PipelineStep>>& steps);

// Textbook bubble (share of the iteration a rank is idle), for equal
// per-micro-batch work: (P-1)/(P-1+M) for 1F1B, (P-1)/(P-1+V*M) interleaved.
double bubble_formula(int64_t pp, int64_t vpp, int64_t microbatches);

}  // namespace mt::parallel
