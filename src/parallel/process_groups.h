#pragma once
// ProcessGroups: this process's communicators, one per GroupKind, bound from
// the RankGrid (DESIGN principle 1: the groups `megatron plan` draws are the
// groups that run). Built once at start-up; passed explicitly to the layers
// that communicate (tensor-parallel layers get tp(), the DP grad buffer
// dp_cp(), the pipeline pp(), ...), never looked up through globals.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "parallel/rank_grid.h"

namespace mt::parallel {

class ProcessGroups {
 public:
  // Collective over the world: every process calls it with the same grid
  // (its own world rank) and it calls comm::make_group once per kind of
  // all_group_kinds(), in that order, on every rank. Errors: the grid's world
  // size differs from the job's, or world_rank is not this process's rank.
  // Without MPI (world 1) every group is a self communicator.
  // `make` builds each group (make_group's contract): comm::make_group for
  // CPU tensors, comm::make_nccl_group, or a staged group for device tensors.
  using GroupFactory =
      std::function<std::unique_ptr<comm::Communicator>(const std::vector<int>& members, const std::string& name)>;
  static Result<ProcessGroups> create(const RankGrid& grid, int world_rank, GroupFactory make = comm::make_group);

  ProcessGroups(ProcessGroups&&) = default;
  ProcessGroups& operator=(ProcessGroups&&) = default;

  // Groups every rank belongs to.
  comm::Communicator& tp() const { return must("tp", GroupKind::kTensor); }
  comm::Communicator& pp() const { return must("pp", GroupKind::kPipeline); }
  comm::Communicator& dp() const { return must("dp", GroupKind::kData); }
  comm::Communicator& cp() const { return must("cp", GroupKind::kContext); }
  comm::Communicator& dp_cp() const { return must("dp-cp", GroupKind::kDataContext); }
  // First and last pipeline stage (tied embeddings); null on middle stages.
  comm::Communicator* embedding() const { return get(GroupKind::kEmbedding); }
  // Any kind; null where this rank is in no group of that kind.
  comm::Communicator* get(GroupKind kind) const { return comms_[static_cast<size_t>(kind)].get(); }

  const RankCoord& coord() const { return coord_; }
  int world_rank() const { return static_cast<int>(coord_.rank); }

  // One line per group kind, e.g. "tp: ranks [0, 1]" ("embedding: none").
  std::string describe() const;

 private:
  ProcessGroups() = default;
  comm::Communicator& must(const char* what, GroupKind kind) const;

  std::vector<std::unique_ptr<comm::Communicator>> comms_;  // indexed by GroupKind
  RankCoord coord_;
};

}  // namespace mt::parallel
