#include "parallel/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace mt::parallel {

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kNoPipelining: return "no-pipelining";
    case ScheduleKind::kOneFOneB: return "1F1B";
    case ScheduleKind::kInterleaved: return "interleaved-1F1B";
  }
  return "?";
}

std::vector<std::pair<int32_t, int32_t>> interleaved_order(int64_t vpp, int64_t m, int64_t n) {
  std::vector<std::pair<int32_t, int32_t>> table;
  table.reserve(static_cast<size_t>(vpp * m));
  for (int64_t lo = 0; lo < m; lo += n) {
    int64_t hi = (lo + n >= m) ? m : lo + n;  // the last group takes what remains
    for (int64_t c = 0; c < vpp; ++c)
      for (int64_t mb = lo; mb < hi; ++mb)
        table.emplace_back(static_cast<int32_t>(mb), static_cast<int32_t>(c));
  }
  return table;
}

Result<Schedule> build_schedule(int64_t pp, int64_t vpp, int64_t m, int64_t n) {
  if (pp < 1 || vpp < 1 || m < 1) return Status::invalid("schedule: sizes must be at least 1");
  if (n == 0) n = pp;
  Schedule s;
  s.pp = pp, s.vpp = vpp, s.microbatches = m, s.group_size = n;
  s.ranks.resize(static_cast<size_t>(pp));
  auto F = [](int64_t mb, int64_t c) { return Action{Action::kForward, (int32_t)mb, (int32_t)c}; };
  auto B = [](int64_t mb, int64_t c) { return Action{Action::kBackward, (int32_t)mb, (int32_t)c}; };
  if (vpp > 1) {
    if (pp < 2) return Status::invalid("interleaved schedule needs pipeline size > 1");
    if (n < pp || n > m)
      return Status::invalid(fmt::format(
          "interleaved schedule: micro-batch group size {} must lie in [pipeline size {}, "
          "micro-batches {}]", n, pp, m));
    if (m % n != 0 && m % n < pp)
      return Status::invalid(fmt::format(
          "interleaved schedule: micro-batches {} mod group size {} = {} must be 0 or at least "
          "the pipeline size {}", m, n, m % n, pp));
    s.kind = ScheduleKind::kInterleaved;
    auto order = interleaved_order(vpp, m, n);
    const int64_t total = m * vpp;
    for (int64_t r = 0; r < pp; ++r) {
      auto& a = s.ranks[r];
      int64_t warm = std::min((pp - r - 1) * 2 + (vpp - 1) * n, total);
      int64_t f = 0, b = 0;
      auto fwd = [&] { a.push_back(F(order[f].first, order[f].second)); ++f; };
      auto bwd = [&] { a.push_back(B(order[b].first, vpp - 1 - order[b].second)); ++b; };
      for (int64_t i = 0; i < warm; ++i) fwd();
      for (int64_t i = 0; i < total - warm; ++i) fwd(), bwd();
      while (b < total) bwd();
    }
    return s;
  }
  s.kind = pp == 1 ? ScheduleKind::kNoPipelining : ScheduleKind::kOneFOneB;
  for (int64_t r = 0; r < pp; ++r) {
    auto& a = s.ranks[r];
    int64_t warm = std::min(pp - r - 1, m);
    int64_t f = 0, b = 0;
    for (int64_t i = 0; i < warm; ++i) a.push_back(F(f++, 0));
    for (int64_t i = 0; i < m - warm; ++i) a.push_back(F(f++, 0)), a.push_back(B(b++, 0));
    while (b < m) a.push_back(B(b++, 0));
  }
  return s;
}

Timeline simulate(const Schedule& s, double tf, double tb) {
  const int64_t P = s.pp, V = s.vpp, M = s.microbatches;
  const int64_t stages = P * V;
  constexpr double kNotDone = -1;
  // end time of forward/backward of (virtual stage, micro-batch)
  std::vector<double> fend(stages * M, kNotDone), bend(stages * M, kNotDone);
  auto vstage = [&](int64_t rank, int64_t chunk) { return chunk * P + rank; };
  Timeline t;
  t.ranks.resize(P);
  t.max_in_flight.assign(P, 0);
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0);
  std::vector<int64_t> in_flight(P, 0);
  size_t remaining = 0;
  for (auto& r : s.ranks) remaining += r.size();
  while (remaining > 0) {
    bool progress = false;
    for (int64_t r = 0; r < P; ++r) {
      while (next[r] < s.ranks[r].size()) {
        const Action& a = s.ranks[r][next[r]];
        int64_t vs = vstage(r, a.chunk);
        double ready;
        if (a.op == Action::kForward) {
          ready = vs == 0 ? 0 : fend[(vs - 1) * M + a.microbatch];
        } else {
          double own = fend[vs * M + a.microbatch];
          double dep = vs == stages - 1 ? own : bend[(vs + 1) * M + a.microbatch];
          ready = (own == kNotDone || dep == kNotDone) ? kNotDone : std::max(own, dep);
        }
        if (ready == kNotDone) break;
        double start = std::max(ready, free_at[r]);
        double end = start + (a.op == Action::kForward ? tf : tb);
        (a.op == Action::kForward ? fend : bend)[vs * M + a.microbatch] = end;
        free_at[r] = end;
        t.ranks[r].push_back({a, start, end});
        if (a.op == Action::kForward) {
          t.max_in_flight[r] = std::max(t.max_in_flight[r], ++in_flight[r]);
        } else {
          --in_flight[r];
        }
        ++next[r];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      t.deadlock = true;
      break;
    }
  }
  for (int64_t r = 0; r < P; ++r) t.makespan = std::max(t.makespan, free_at[r]);
  t.busy_per_rank = static_cast<double>(M * V) * (tf + tb);
  if (!t.deadlock && t.makespan > 0)
    t.bubble_fraction = 1.0 - t.busy_per_rank / t.makespan;
  return t;
}

double bubble_formula(int64_t pp, int64_t vpp, int64_t m) {
  double idle = static_cast<double>(pp - 1);
  return idle / (idle + static_cast<double>(vpp) * static_cast<double>(m));
}

}  // namespace mt::parallel
