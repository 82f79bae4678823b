// ProcessGroups: RankGrid groups bound to communicators (comm::make_group).
#include "parallel/process_groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace mt::parallel {

Result<ProcessGroups> ProcessGroups::create(const RankGrid& grid, int world_rank, GroupFactory make) {
  int job_world = comm::world_size();
  if (grid.world() != job_world)
    return Status::invalid(fmt::format("ProcessGroups: the grid has world size {} but this job has {} process(es)",
                                       grid.world(), job_world));
  if (world_rank != comm::world_rank())
    return Status::invalid(fmt::format("ProcessGroups: expected this process's world rank {}, got {}",
                                       comm::world_rank(), world_rank));
  ProcessGroups pg;
  pg.coord_ = grid.coord(world_rank);
  const auto& kinds = all_group_kinds();
  size_t n = 0;
  for (GroupKind k : kinds) n = std::max(n, static_cast<size_t>(k) + 1);
  pg.comms_.resize(n);
  // Same kinds in the same order on every rank: each group is one collective
  // over the world (an MPI_Comm_split, and for NCCL its id's broadcast).
  for (GroupKind k : kinds) {
    std::vector<int64_t> g = grid.group_of(k, world_rank);
    std::vector<int> members(g.begin(), g.end());
    pg.comms_[static_cast<size_t>(k)] = make(members, group_kind_name(k));
  }
  return pg;
}

comm::Communicator& ProcessGroups::must(const char* what, GroupKind kind) const {
  comm::Communicator* c = get(kind);
  MT_CHECK(c != nullptr, fmt::format("ProcessGroups: expected rank {} to be in a {} group", coord_.rank, what));
  return *c;
}

std::string ProcessGroups::describe() const {
  std::string out;
  for (GroupKind k : all_group_kinds()) {
    const comm::Communicator* c = get(k);
    if (c) out += fmt::format("{}: ranks [{}]\n", group_kind_name(k), fmt::join(c->members(), ", "));
    else out += fmt::format("{}: none\n", group_kind_name(k));
  }
  return out;
}

}  // namespace mt::parallel
