#include "parallel/rank_grid.h"

#include <fmt/format.h>

#include <algorithm>

namespace mt::parallel {

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::kTensor: return "tp";
    case GroupKind::kPipeline: return "pp";
    case GroupKind::kData: return "dp";
    case GroupKind::kContext: return "cp";
    case GroupKind::kDataContext: return "dp-cp";
    case GroupKind::kModel: return "tp-pp";
    case GroupKind::kTensorData: return "tp-dp";
    case GroupKind::kTensorDataContext: return "tp-dp-cp";
    case GroupKind::kTensorContext: return "tp-cp";
    case GroupKind::kEmbedding: return "embedding";
    case GroupKind::kPositionEmbedding: return "position-embedding";
    case GroupKind::kExpert: return "ep";
    case GroupKind::kExpertTensor: return "expert-tp";
    case GroupKind::kExpertTensorExpert: return "expert-tp-ep";
    case GroupKind::kExpertData: return "expert-dp";
  }
  return "?";
}

const std::vector<GroupKind>& all_group_kinds() {
  static const std::vector<GroupKind> kinds = {
      GroupKind::kTensor,        GroupKind::kPipeline,          GroupKind::kData,
      GroupKind::kContext,       GroupKind::kDataContext,       GroupKind::kModel,
      GroupKind::kTensorData,    GroupKind::kTensorDataContext, GroupKind::kTensorContext,
      GroupKind::kEmbedding,     GroupKind::kPositionEmbedding, GroupKind::kExpert,
      GroupKind::kExpertTensor,  GroupKind::kExpertTensorExpert, GroupKind::kExpertData};
  return kinds;
}

Result<RankGrid> RankGrid::create(const GridSizes& s) {
  if (s.world < 1 || s.tp < 1 || s.pp < 1 || s.cp < 1 || s.ep < 1 || s.etp < 1)
    return Status::invalid("RankGrid: every size must be at least 1");
  if (s.world % (s.tp * s.pp * s.cp) != 0)
    return Status::invalid(fmt::format("RankGrid: world size {} is not divisible by tp*pp*cp = {}",
                                       s.world, s.tp * s.pp * s.cp));
  if (s.world % (s.etp * s.ep * s.pp) != 0)
    return Status::invalid(fmt::format(
        "RankGrid: world size {} is not divisible by expert-tp*ep*pp = {}", s.world, s.etp * s.ep * s.pp));
  int64_t dp = s.world / (s.tp * s.pp * s.cp);
  int64_t edp = s.world / (s.etp * s.ep * s.pp);
  if (s.tp_pp_dp_order && s.pp > 1 && edp != dp)
    return Status::invalid("RankGrid: with the tp-cp-ep-pp-dp order the expert data-parallel size "
                           "must equal the data-parallel size");
  return RankGrid(s, dp, edp);
}

RankGrid::RankGrid(const GridSizes& s, int64_t dp, int64_t edp) : s_(s), dp_(dp), edp_(edp) {
  if (s.tp_pp_dp_order) {
    order_ = "tp-cp-ep-pp-dp";
    dense_names_ = {"tp", "cp", "ep", "pp", "dp"};
    dense_sizes_ = {s.tp, s.cp, 1, s.pp, dp};
    expert_names_ = {"tp", "cp", "ep", "pp", "dp"};
    expert_sizes_ = {s.etp, 1, s.ep, s.pp, edp};
  } else {
    order_ = "tp-cp-ep-dp-pp";
    dense_names_ = {"tp", "cp", "ep", "dp", "pp"};
    dense_sizes_ = {s.tp, s.cp, 1, dp, s.pp};
    expert_names_ = {"tp", "cp", "ep", "dp", "pp"};
    expert_sizes_ = {s.etp, 1, s.ep, edp, s.pp};
  }
}

static std::vector<int64_t> decompose(int64_t rank, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> c(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    c[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return c;
}

static int64_t axis(const std::vector<std::string>& names, const std::vector<int64_t>& c,
                    const char* name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return c[i];
  return 0;
}

RankCoord RankGrid::coord(int64_t rank) const {
  RankCoord r;
  r.rank = rank;
  auto d = decompose(rank, dense_sizes_);
  r.tp = axis(dense_names_, d, "tp");
  r.cp = axis(dense_names_, d, "cp");
  r.dp = axis(dense_names_, d, "dp");
  r.pp = axis(dense_names_, d, "pp");
  auto e = decompose(rank, expert_sizes_);
  r.etp = axis(expert_names_, e, "tp");
  r.ep = axis(expert_names_, e, "ep");
  r.edp = axis(expert_names_, e, "dp");
  return r;
}

int64_t RankGrid::rank_of(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const {
  int64_t rank = 0, stride = 1;
  for (size_t i = 0; i < dense_names_.size(); ++i) {
    const std::string& n = dense_names_[i];
    int64_t c = n == "tp" ? tp : n == "cp" ? cp : n == "dp" ? dp : n == "pp" ? pp : 0;
    rank += c * stride;
    stride *= dense_sizes_[i];
  }
  return rank;
}

std::vector<std::vector<int64_t>> RankGrid::masked_groups(const std::vector<std::string>& names,
                                                          const std::vector<int64_t>& sizes,
                                                          const std::vector<std::string>& members) {
  std::vector<size_t> in, out;
  for (size_t i = 0; i < names.size(); ++i) {
    bool m = std::find(members.begin(), members.end(), names[i]) != members.end();
    (m ? in : out).push_back(i);
  }
  std::vector<int64_t> stride(names.size());
  int64_t st = 1;
  for (size_t i = 0; i < names.size(); ++i) stride[i] = st, st *= sizes[i];
  int64_t n_groups = 1, group_size = 1;
  for (size_t i : out) n_groups *= sizes[i];
  for (size_t i : in) group_size *= sizes[i];
  std::vector<std::vector<int64_t>> groups(n_groups);
  for (int64_t g = 0; g < n_groups; ++g) {
    int64_t base = 0, rem = g;
    for (size_t i : out) base += (rem % sizes[i]) * stride[i], rem /= sizes[i];
    groups[g].reserve(group_size);
    for (int64_t m = 0; m < group_size; ++m) {
      int64_t r = base, mr = m;
      for (size_t i : in) r += (mr % sizes[i]) * stride[i], mr /= sizes[i];
      groups[g].push_back(r);
    }
    std::sort(groups[g].begin(), groups[g].end());
  }
  return groups;
}

std::vector<std::vector<int64_t>> RankGrid::groups(GroupKind kind) const {
  auto dense = [&](std::vector<std::string> m) { return masked_groups(dense_names_, dense_sizes_, m); };
  auto expert = [&](std::vector<std::string> m) { return masked_groups(expert_names_, expert_sizes_, m); };
  switch (kind) {
    case GroupKind::kTensor: return dense({"tp"});
    case GroupKind::kPipeline: return dense({"pp"});
    case GroupKind::kData: return dense({"dp"});
    case GroupKind::kContext: return dense({"cp"});
    case GroupKind::kDataContext: return dense({"dp", "cp"});
    case GroupKind::kModel: return dense({"tp", "pp"});
    case GroupKind::kTensorData: return dense({"tp", "dp"});
    case GroupKind::kTensorDataContext: return dense({"tp", "dp", "cp"});
    case GroupKind::kTensorContext: return dense({"tp", "cp"});
    case GroupKind::kEmbedding:
    case GroupKind::kPositionEmbedding: {
      auto pp_groups = dense({"pp"});
      for (auto& g : pp_groups) {
        if (kind == GroupKind::kPositionEmbedding || g.size() == 1) g = {g.front()};
        else g = {g.front(), g.back()};
      }
      return pp_groups;
    }
    case GroupKind::kExpert: return expert({"ep"});
    case GroupKind::kExpertTensor: return expert({"tp"});
    case GroupKind::kExpertTensorExpert: return expert({"tp", "ep"});
    case GroupKind::kExpertData: return expert({"dp"});
  }
  return {};
}

std::vector<int64_t> RankGrid::group_of(GroupKind kind, int64_t rank) const {
  for (auto& g : groups(kind))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  return {};
}

}  // namespace mt::parallel
