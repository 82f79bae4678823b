#include "parallel/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <new>
#include <set>
#include <tuple>

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

namespace {
Result<Schedule> build_schedule_lists(int64_t pp, int64_t vpp, int64_t m, int64_t n);
}  // namespace

// Checks the sizes the action lists can hold (int32 micro-batch and chunk
// ids) and turns an allocation failure into an error naming the count.
Result<Schedule> build_schedule(int64_t pp, int64_t vpp, int64_t m, int64_t n) {
  if (pp < 1 || vpp < 1 || m < 1) return Status::invalid("schedule: sizes must be at least 1");
  if (m > std::numeric_limits<int32_t>::max() / vpp)
    return Status::invalid(fmt::format("{} micro-batches a step (--global-batch-size / (--micro-batch-size x DP)) "
                                       "are more than a schedule holds; lower --global-batch-size",
                                       m));
  try {
    return build_schedule_lists(pp, vpp, m, n);
  } catch (const std::bad_alloc&) {
    return Status::invalid(fmt::format("the pipeline schedule of {} micro-batches a step does not fit in memory: "
                                       "lower --global-batch-size (or raise --micro-batch-size)",
                                       m));
  }
}

namespace {
Result<Schedule> build_schedule_lists(int64_t pp, int64_t vpp, int64_t m, int64_t n) {
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
}  // namespace

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

int64_t megatron_in_flight(int64_t pp, int64_t vpp, int64_t m, int64_t n, int64_t rank) {
  if (pp <= 1) return m >= 1 ? 1 : 0;
  if (vpp <= 1) return std::min(pp - rank, m);
  if (n == 0) n = pp;
  return std::min((pp - rank - 1) * 2 + (vpp - 1) * n + 1, m * vpp);
}

const char* pipeline_step_kind_name(PipelineStep::Kind k) {
  switch (k) {
    case PipelineStep::kRecvForward: return "RecvForward";
    case PipelineStep::kForward: return "Forward";
    case PipelineStep::kSendForward: return "SendForward";
    case PipelineStep::kRecvBackward: return "RecvBackward";
    case PipelineStep::kBackward: return "Backward";
    case PipelineStep::kSendBackward: return "SendBackward";
  }
  return "?";
}

std::vector<std::vector<PipelineStep>> pipeline_steps(const Schedule& s) {
  const int64_t P = s.pp, S = s.pp * s.vpp;
  MT_CHECK(2 * s.microbatches * S <= std::numeric_limits<int32_t>::max(),
           fmt::format("pipeline tags 2*M*S = {} do not fit in int32", 2 * s.microbatches * S));
  auto tag = [&](int64_t m, int64_t receiver_stage, int dir) {
    return static_cast<int32_t>((m * S + receiver_stage) * 2 + dir);
  };
  const auto prev = [&](int64_t r) { return static_cast<int32_t>((r - 1 + P) % P); };
  const auto next = [&](int64_t r) { return static_cast<int32_t>((r + 1) % P); };
  std::vector<std::vector<PipelineStep>> out(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    auto& o = out[static_cast<size_t>(r)];
    o.reserve(s.ranks[static_cast<size_t>(r)].size() * 3);
    for (const Action& a : s.ranks[static_cast<size_t>(r)]) {
      const int64_t vs = a.chunk * P + r;
      const int32_t m = a.microbatch, c = a.chunk;
      if (a.op == Action::kForward) {
        if (vs > 0) o.push_back({PipelineStep::kRecvForward, m, c, prev(r), tag(m, vs, 0)});
        o.push_back({PipelineStep::kForward, m, c, -1, -1});
        if (vs < S - 1) o.push_back({PipelineStep::kSendForward, m, c, next(r), tag(m, vs + 1, 0)});
      } else {
        if (vs < S - 1) o.push_back({PipelineStep::kRecvBackward, m, c, next(r), tag(m, vs, 1)});
        o.push_back({PipelineStep::kBackward, m, c, -1, -1});
        if (vs > 0) o.push_back({PipelineStep::kSendBackward, m, c, prev(r), tag(m, vs - 1, 1)});
      }
    }
  }
  return out;
}

namespace {

bool is_send(PipelineStep::Kind k) { return k == PipelineStep::kSendForward || k == PipelineStep::kSendBackward; }
bool is_recv(PipelineStep::Kind k) { return k == PipelineStep::kRecvForward || k == PipelineStep::kRecvBackward; }
bool is_compute(PipelineStep::Kind k) { return k == PipelineStep::kForward || k == PipelineStep::kBackward; }
int direction(PipelineStep::Kind k) {  // 0 forward, 1 backward
  return k == PipelineStep::kRecvForward || k == PipelineStep::kForward || k == PipelineStep::kSendForward ? 0 : 1;
}

std::string describe(int64_t rank, size_t index, const PipelineStep& st) {
  std::string s = fmt::format("rank {} step {} {}(m={}, c={}", rank, index, pipeline_step_kind_name(st.kind),
                              st.microbatch, st.chunk);
  if (!is_compute(st.kind)) s += fmt::format(", peer={}, tag={}", st.peer, st.tag);
  return s + ")";
}

// The structural checks: everything but the run itself. Returns the first
// problem, or an empty string.
std::string check_structure(const Schedule& s, const std::vector<std::vector<PipelineStep>>& steps) {
  const int64_t P = s.pp, V = s.vpp, M = s.microbatches, S = P * V;
  if (static_cast<int64_t>(steps.size()) != P)
    return fmt::format("{} step lists for pipeline size {}", steps.size(), P);
  if (static_cast<int64_t>(s.ranks.size()) != P)
    return fmt::format("schedule has {} rank lists for pipeline size {}", s.ranks.size(), P);
  // (sender, receiver, tag) -> (sender rank, step index), for the matching.
  using Key = std::tuple<int64_t, int64_t, int32_t>;
  std::map<Key, std::pair<int64_t, size_t>> sends;
  for (int64_t r = 0; r < P; ++r) {
    const auto& list = steps[static_cast<size_t>(r)];
    const auto& actions = s.ranks[static_cast<size_t>(r)];
    size_t next_action = 0;
    // (m, c) received but not yet consumed / computed, per direction.
    std::set<std::pair<int32_t, int32_t>> received[2], computed[2], sent[2];
    for (size_t i = 0; i < list.size(); ++i) {
      const PipelineStep& st = list[i];
      const int dir = direction(st.kind);
      if (st.microbatch < 0 || st.microbatch >= M || st.chunk < 0 || st.chunk >= V)
        return describe(r, i, st) + ": micro-batch or chunk out of range";
      const auto mc = std::make_pair(st.microbatch, st.chunk);
      const int64_t vs = st.chunk * P + r;
      if (is_compute(st.kind)) {
        if (st.peer != -1 || st.tag != -1) return describe(r, i, st) + ": compute step with a peer or tag";
        if (next_action >= actions.size()) return describe(r, i, st) + ": more compute steps than the schedule has";
        const Action& a = actions[next_action++];
        if ((a.op == Action::kForward) != (st.kind == PipelineStep::kForward) || a.microbatch != st.microbatch ||
            a.chunk != st.chunk)
          return describe(r, i, st) + fmt::format(": the schedule's action {} is {}(m={}, c={})", next_action - 1,
                                                  a.op == Action::kForward ? "Forward" : "Backward", a.microbatch,
                                                  a.chunk);
        const bool needs_input = dir == 0 ? vs > 0 : vs < S - 1;
        if (needs_input && received[dir].erase(mc) == 0)
          return describe(r, i, st) + ": no receive before it";
        if (!computed[dir].insert(mc).second) return describe(r, i, st) + ": computed twice";
        if (dir == 1 && !computed[0].count(mc)) return describe(r, i, st) + ": backward before its forward";
        continue;
      }
      // Communication: the peer and the stage on the other side.
      const bool sending = is_send(st.kind);
      const bool towards_next = (dir == 0) == sending;  // forward sends and backward receives face stage s+1
      const int64_t other_stage = towards_next ? vs + 1 : vs - 1;
      if (other_stage < 0 || other_stage >= S)
        return describe(r, i, st) + ": no stage on the other side";
      const int64_t expect_peer = other_stage % P;
      if (st.peer != expect_peer)
        return describe(r, i, st) + fmt::format(": peer should be rank {} (stage {})", expect_peer, other_stage);
      if (st.tag < 0) return describe(r, i, st) + ": negative tag";
      if (sending) {
        if (!computed[dir].count(mc)) return describe(r, i, st) + ": send before the compute it comes from";
        if (!sent[dir].insert(mc).second) return describe(r, i, st) + ": sent twice";
        auto [it, fresh] = sends.emplace(Key{r, st.peer, st.tag}, std::make_pair(r, i));
        if (!fresh)
          return describe(r, i, st) + ": tag already used by " + describe(r, it->second.second,
                                                                          list[it->second.second]);
      } else {
        if (computed[dir].count(mc)) return describe(r, i, st) + ": receive after the compute it feeds";
        if (!received[dir].insert(mc).second) return describe(r, i, st) + ": received twice";
      }
    }
    if (next_action != actions.size())
      return fmt::format("rank {}: {} compute steps for {} scheduled actions", r, next_action, actions.size());
    for (int dir = 0; dir < 2; ++dir) {
      if (!received[dir].empty())
        return fmt::format("rank {}: a {} receive feeds no compute", r, dir == 0 ? "forward" : "backward");
      // Every computed (m, c) whose output goes on is sent exactly once.
      for (const auto& mc : computed[dir]) {
        const int64_t vs = mc.second * P + r;
        const bool needs_output = dir == 0 ? vs < S - 1 : vs > 0;
        if (needs_output != (sent[dir].count(mc) > 0))
          return fmt::format("rank {}: {}(m={}, c={}) {}", r, dir == 0 ? "Forward" : "Backward", mc.first, mc.second,
                             needs_output ? "is never sent on" : "is sent but nobody needs it");
      }
    }
  }
  // Each receive matches exactly one send with the opposite kind, the same
  // micro-batch and the adjacent virtual stage.
  std::set<Key> matched;
  for (int64_t r = 0; r < P; ++r) {
    const auto& list = steps[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const PipelineStep& st = list[i];
      if (!is_recv(st.kind)) continue;
      const Key key{st.peer, r, st.tag};
      auto it = sends.find(key);
      if (it == sends.end()) return describe(r, i, st) + ": no matching send";
      if (!matched.insert(key).second) return describe(r, i, st) + ": a second receive for one send";
      const PipelineStep& snd = steps[static_cast<size_t>(it->second.first)][it->second.second];
      const int dir = direction(st.kind);
      const int64_t send_stage = snd.chunk * P + st.peer, recv_stage = st.chunk * P + r;
      if (direction(snd.kind) != dir || snd.microbatch != st.microbatch ||
          recv_stage != (dir == 0 ? send_stage + 1 : send_stage - 1))
        return describe(r, i, st) + " matches " + describe(st.peer, it->second.second, snd) +
               ": wrong direction, micro-batch or stage";
    }
  }
  if (matched.size() != sends.size()) {
    for (const auto& [key, where] : sends)
      if (!matched.count(key))
        return describe(where.first, where.second, steps[static_cast<size_t>(where.first)][where.second]) +
               ": nobody receives it";
  }
  return {};
}

}  // namespace

P2PCheck check_pipeline_steps(const Schedule& s, const std::vector<std::vector<PipelineStep>>& steps) {
  P2PCheck out;
  out.problem = check_structure(s, steps);
  if (!out.problem.empty()) return out;
  const int64_t P = s.pp;

  // FIFO: per (sender, receiver, direction), the tags in the sender's
  // program order against those in the receiver's.
  using Channel = std::tuple<int64_t, int64_t, int>;
  std::map<Channel, std::vector<int32_t>> send_order, recv_order;
  for (int64_t r = 0; r < P; ++r)
    for (const PipelineStep& st : steps[static_cast<size_t>(r)]) {
      if (is_send(st.kind)) send_order[{r, st.peer, direction(st.kind)}].push_back(st.tag);
      if (is_recv(st.kind)) recv_order[{st.peer, r, direction(st.kind)}].push_back(st.tag);
    }
  // The same per (sender, receiver), both directions in one order.
  using Pair = std::pair<int64_t, int64_t>;
  std::map<Pair, std::vector<std::pair<int32_t, int>>> pair_sent, pair_received;  // (tag, direction)
  for (int64_t r = 0; r < P; ++r)
    for (const PipelineStep& st : steps[static_cast<size_t>(r)]) {
      if (is_send(st.kind)) pair_sent[{r, st.peer}].push_back({st.tag, direction(st.kind)});
      if (is_recv(st.kind)) pair_received[{st.peer, r}].push_back({st.tag, direction(st.kind)});
    }
  out.pair_fifo_compatible = true;
  for (const auto& [pair, order] : pair_sent) {
    const auto& got = pair_received[pair];
    if (order == got) continue;
    out.pair_fifo_compatible = false;
    size_t k = 0;
    while (k < order.size() && k < got.size() && order[k] == got[k]) ++k;
    auto what = [](const std::vector<std::pair<int32_t, int>>& v, size_t i) {
      return i < v.size() ? fmt::format("the {} with tag {}", v[i].second == 0 ? "activation" : "gradient", v[i].first)
                          : std::string("nothing");
    };
    out.pair_problem = fmt::format("rank {} sends rank {} {} as its message {} to it, but rank {} receives {} there",
                                   pair.first, pair.second, what(order, k), k, pair.second, what(got, k));
    break;
  }

  out.fifo_compatible = true;
  std::string fifo_problem;
  for (const auto& [ch, order] : send_order) {
    const auto& got = recv_order[ch];
    if (order != got) {
      out.fifo_compatible = false;
      size_t k = 0;
      while (k < order.size() && k < got.size() && order[k] == got[k]) ++k;
      fifo_problem = fmt::format("{} messages rank {} -> rank {}: message {} is sent with tag {} but received as tag {}",
                                 std::get<2>(ch) == 0 ? "forward" : "backward", std::get<0>(ch), std::get<1>(ch), k,
                                 k < order.size() ? order[k] : -1, k < got.size() ? got[k] : -1);
      break;
    }
  }

  // The run: a receive blocks until its send has been posted; sends and
  // compute never block.
  using Key = std::tuple<int64_t, int64_t, int32_t>;
  std::set<Key> posted;
  std::vector<size_t> pc(static_cast<size_t>(P), 0);
  size_t remaining = 0;
  for (const auto& list : steps) remaining += list.size();
  while (remaining > 0) {
    bool progress = false;
    for (int64_t r = 0; r < P; ++r) {
      const auto& list = steps[static_cast<size_t>(r)];
      size_t& i = pc[static_cast<size_t>(r)];
      for (; i < list.size(); ++i, --remaining, progress = true) {
        const PipelineStep& st = list[i];
        if (is_send(st.kind)) posted.insert({r, st.peer, st.tag});
        if (is_recv(st.kind) && posted.erase({st.peer, r, st.tag}) == 0) break;
      }
    }
    if (!progress) {
      std::string blocked;
      for (int64_t r = 0; r < P; ++r) {
        const auto& list = steps[static_cast<size_t>(r)];
        size_t i = pc[static_cast<size_t>(r)];
        if (i < list.size()) blocked += (blocked.empty() ? "" : "; ") + describe(r, i, list[i]);
      }
      out.problem = "deadlock: " + blocked;
      return out;
    }
  }
  out.completes = true;
  out.problem = fifo_problem;
  return out;
}

double bubble_formula(int64_t pp, int64_t vpp, int64_t m) {
  double idle = static_cast<double>(pp - 1);
  return idle / (idle + static_cast<double>(vpp) * static_cast<double>(m));
}

}  // namespace mt::parallel
