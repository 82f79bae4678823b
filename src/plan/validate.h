#pragma once
// Megatron's configuration rules (../shared/spec/megatron-reference.md §4),
// all checked at once: every violation names the flags involved, the numbers,
// and a legal nearby value. Used by `megatron plan` and, before any rank
// allocates, by `megatron train`.

#include <string>
#include <vector>

#include "plan/plan.h"

namespace mt::plan {

// Checks report.job (world size already resolved); fills report.errors and
// report.warnings and, where they can be derived, the sizes the rules need
// (dp, edp, etp, vpp, group_size, num_microbatches, global_batch,
// padded_vocab, chunks).
void validate(PlanReport& report);

// Suggestion helpers, exposed for tests.
std::vector<int64_t> nearby_multiples(int64_t of, int64_t target);  // up to 2, nearest first
int64_t nearest_divisor(int64_t n, int64_t target);

}  // namespace mt::plan
