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

// Textbook bubble (share of the iteration a rank is idle), for equal
// per-micro-batch work: (P-1)/(P-1+M) for 1F1B, (P-1)/(P-1+V*M) interleaved.
double bubble_formula(int64_t pp, int64_t vpp, int64_t microbatches);

}  // namespace mt::parallel
