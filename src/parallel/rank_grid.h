#pragma once
// RankGrid: the one truth for the process topology (DESIGN principle 1).
// Pure: world size + parallel sizes + order -> each rank's coordinates and
// every process group, exactly as Megatron-Core's RankGenerator builds them
// (../shared/spec/megatron-reference.md §3). `megatron plan` draws it and
// `megatron train` builds its communicators from it.
//
// Order: "tp-cp-ep-dp-pp" by default, "tp-cp-ep-pp-dp" with
// --use-tp-pp-dp-mapping. The leftmost axis varies fastest. The dense grid
// has EP = 1; the expert grid has CP = 1, TP replaced by ETP and DP by EDP.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mt::parallel {

struct GridSizes {
  int64_t world = 1;
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  int64_t etp = 1;  // expert tensor parallel (Megatron: defaults to tp)
  bool tp_pp_dp_order = false;  // --use-tp-pp-dp-mapping
};

// Coordinates of one rank on both grids.
struct RankCoord {
  int64_t rank = 0;
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;  // dense grid
  int64_t etp = 0, ep = 0, edp = 0;        // expert grid (same pp)
};

enum class GroupKind {
  kTensor,            // "tp"
  kPipeline,          // "pp"
  kData,              // "dp"
  kContext,           // "cp"
  kDataContext,       // "dp-cp": dense gradient reduction
  kModel,             // "tp-pp": model-parallel
  kTensorData,        // "tp-dp"
  kTensorDataContext, // "tp-dp-cp"
  kTensorContext,     // "tp-cp"
  kEmbedding,         // first and last stage of each PP group
  kPositionEmbedding, // first stage of each PP group
  kExpert,            // "ep" on the expert grid
  kExpertTensor,      // "tp" on the expert grid (etp)
  kExpertTensorExpert,// "tp-ep" on the expert grid
  kExpertData,        // "dp" on the expert grid: expert gradient reduction
};

const char* group_kind_name(GroupKind k);   // "tp", "pp", "dp", "cp", "dp-cp", ...
const std::vector<GroupKind>& all_group_kinds();

class RankGrid {
 public:
  // REQUIRES: every size >= 1; world divisible by tp*pp*cp and by etp*ep*pp
  // (validate first: plan::validate reports these as user errors).
  static Result<RankGrid> create(const GridSizes& sizes);

  int64_t world() const { return s_.world; }
  int64_t tp() const { return s_.tp; }
  int64_t pp() const { return s_.pp; }
  int64_t cp() const { return s_.cp; }
  int64_t ep() const { return s_.ep; }
  int64_t etp() const { return s_.etp; }
  int64_t dp() const { return dp_; }
  int64_t edp() const { return edp_; }
  const std::string& order() const { return order_; }

  RankCoord coord(int64_t rank) const;
  // World rank for dense coordinates (inverse of coord()).
  int64_t rank_of(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const;

  // All groups of a kind; members in increasing rank order, groups listed by
  // Megatron's mixed-radix index over the axes not in the group.
  std::vector<std::vector<int64_t>> groups(GroupKind kind) const;
  // The group of `kind` that contains `rank` (empty if none, e.g. embedding
  // groups for middle pipeline stages).
  std::vector<int64_t> group_of(GroupKind kind, int64_t rank) const;

 private:
  RankGrid(const GridSizes& s, int64_t dp, int64_t edp);
  // Groups over one grid: `names`/`sizes` list that grid's axes in order;
  // `members` the axes that vary inside a group.
  static std::vector<std::vector<int64_t>> masked_groups(const std::vector<std::string>& names,
                                                         const std::vector<int64_t>& sizes,
                                                         const std::vector<std::string>& members);
  std::vector<std::string> dense_names_, expert_names_;
  std::vector<int64_t> dense_sizes_, expert_sizes_;
  GridSizes s_;
  int64_t dp_ = 1, edp_ = 1;
  std::string order_;
};

}  // namespace mt::parallel
