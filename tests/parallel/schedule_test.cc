// Pipeline schedules checked without a model: order invariants, Megatron's
// interleaved order, in-flight counts, deadlock freedom and the bubble; the
// point-to-point programs the executor runs (pipeline_steps) and their checker.
#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "../support/plan_helpers.h"

namespace mt::parallel {
namespace {

bool interleaved_valid(int64_t P, int64_t M, int64_t N) { return N >= P && N <= M && (M % N == 0 || M % N >= P); }

TEST(Schedule, MegatronInterleavedOrderExample) {
  // From schedules.py: P=2, N=3, M=5, V=2.
  auto order = interleaved_order(2, 5, 3);
  std::vector<int> mb, chunk;
  for (auto [m, c] : order) mb.push_back(m), chunk.push_back(c);
  EXPECT_EQ(mb, (std::vector<int>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunk, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
}

TEST(Schedule, OneFOneBWarmupCounts) {
  auto s = build_schedule(4, 1, 8, 0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->kind, ScheduleKind::kOneFOneB);
  for (int r = 0; r < 4; ++r) {
    int warm = 0;
    for (const auto& a : s->ranks[r]) {
      if (a.op == Action::kBackward) break;
      ++warm;
    }
    EXPECT_EQ(warm, std::min(4 - r - 1, 8) + 1) << "rank " << r;  // warm-up plus the first steady forward
  }
}

TEST(Schedule, InvariantsAndNoDeadlockAcrossSizes) {
  for (int64_t P : {1, 2, 4, 8})
    for (int64_t V : {1, 2, 4}) {
      if (P == 1 && V > 1) continue;
      for (int64_t M = P; M <= 4 * P; ++M) {
        if (V > 1 && !interleaved_valid(P, M, P)) {
          EXPECT_FALSE(build_schedule(P, V, M, 0).is_ok()) << P << " " << V << " " << M;
          continue;
        }
        auto s = build_schedule(P, V, M, 0);
        ASSERT_TRUE(s.is_ok()) << s.status().message();
        for (int64_t r = 0; r < P; ++r) {
          std::set<std::pair<int, int>> fwd, bwd;
          for (const auto& a : s->ranks[r]) {
            auto key = std::make_pair(a.microbatch, a.chunk);
            if (a.op == Action::kForward) {
              EXPECT_TRUE(fwd.insert(key).second) << "forward twice";
            } else {
              EXPECT_TRUE(fwd.count(key)) << "backward before forward: P=" << P << " V=" << V << " M=" << M << " r=" << r;
              EXPECT_TRUE(bwd.insert(key).second) << "backward twice";
            }
          }
          EXPECT_EQ(fwd.size(), static_cast<size_t>(M * V));
          EXPECT_EQ(bwd.size(), static_cast<size_t>(M * V));
        }
        Timeline t = simulate(*s, 1, 1);
        ASSERT_FALSE(t.deadlock) << "P=" << P << " V=" << V << " M=" << M;
        for (int64_t r = 0; r < P; ++r) {
          int64_t expect = V == 1 ? std::min(P - r, M) : std::min((P - r - 1) * 2 + (V - 1) * P + 1, M * V);
          if (P == 1) expect = 1;
          EXPECT_EQ(t.max_in_flight[r], expect) << "P=" << P << " V=" << V << " M=" << M << " r=" << r;
        }
      }
    }
}

TEST(Schedule, OneFOneBBubbleMatchesFormula) {
  for (int64_t P : {2, 4, 8})
    for (int64_t M = P; M <= 4 * P; ++M)
      for (double tb : {1.0, 2.0}) {
        auto s = build_schedule(P, 1, M, 0);
        Timeline t = simulate(*s, 1, tb);
        EXPECT_NEAR(t.bubble_fraction, bubble_formula(P, 1, M), 1e-12) << "P=" << P << " M=" << M << " tb=" << tb;
      }
}

TEST(Schedule, InterleavedBubbleMatchesFormulaForFullGroups) {
  // Unit-time chunk actions, M a multiple of P: the simulated idle share is
  // (P-1)/(P-1+V*M), a V-fold smaller bubble than 1F1B.
  for (int64_t P : {2, 4, 8})
    for (int64_t V : {2, 4})
      for (int64_t M : {P, 2 * P, 4 * P}) {
        auto s = build_schedule(P, V, M, 0);
        ASSERT_TRUE(s.is_ok());
        Timeline t = simulate(*s, 1, 1);
        EXPECT_NEAR(t.bubble_fraction, bubble_formula(P, V, M), 1e-12) << "P=" << P << " V=" << V << " M=" << M;
      }
}

// The sizes the pipeline tests sweep: P in {2,4,8}, V in {1,2,4}, M from P
// to 4P, with Megatron's default group size N = P; for V > 1 also N = P+1
// and N = 2P where Megatron's rule allows them. `fn` gets every schedule
// build_schedule accepts.
void for_each_pipeline_schedule(const std::function<void(const Schedule&, const std::string&)>& fn) {
  for (int64_t P : {2, 4, 8})
    for (int64_t V : {1, 2, 4})
      for (int64_t M = P; M <= 4 * P; ++M)
        for (int64_t N : {int64_t{0}, P + 1, 2 * P}) {
          if (V == 1 && N != 0) continue;
          auto s = build_schedule(P, V, M, N);
          if (!s.is_ok()) continue;
          fn(*s, "P=" + std::to_string(P) + " V=" + std::to_string(V) + " M=" + std::to_string(M) +
                     " N=" + std::to_string(s->group_size));
        }
}

// Peak chunk-micro-batches held (forward done, backward not), walking a step list.
int64_t walk_in_flight(const std::vector<PipelineStep>& steps) {
  int64_t now = 0, peak = 0;
  for (const auto& st : steps) {
    if (st.kind == PipelineStep::kForward) peak = std::max(peak, ++now);
    if (st.kind == PipelineStep::kBackward) --now;
  }
  return peak;
}

TEST(Schedule, AcceptsMegatronMicroBatchCounts) {
  for (int64_t P : {1, 2, 4, 8})
    for (int64_t M = 1; M <= 4 * P; ++M) {
      // 1F1B (and no pipelining) has no condition on M.
      auto s = build_schedule(P, 1, M, 0);
      EXPECT_TRUE(s.is_ok()) << "P=" << P << " M=" << M << ": " << s.status().message();
    }
  for (int64_t P : {2, 4, 8})
    for (int64_t V : {2, 4})
      for (int64_t M = 1; M <= 4 * P; ++M) {
        // Interleaved with the default group size N = P: M mod P must be 0
        // (it cannot be >= P), and M >= N.
        auto s = build_schedule(P, V, M, 0);
        EXPECT_EQ(s.is_ok(), M % P == 0) << "P=" << P << " V=" << V << " M=" << M;
        if (!s.is_ok()) {
          EXPECT_NE(s.status().message().find("micro"), std::string::npos) << s.status().message();
        }
      }
}

TEST(PipelineSteps, ComputeOrderAndCoverage) {
  int cases = 0;
  for_each_pipeline_schedule([&](const Schedule& s, const std::string& what) {
    ++cases;
    auto steps = pipeline_steps(s);
    ASSERT_EQ(steps.size(), static_cast<size_t>(s.pp)) << what;
    for (int64_t r = 0; r < s.pp; ++r) {
      std::set<std::pair<int, int>> fwd, bwd;
      std::vector<Action> compute;
      for (const auto& st : steps[r]) {
        if (st.kind != PipelineStep::kForward && st.kind != PipelineStep::kBackward) continue;
        EXPECT_EQ(st.peer, -1);
        EXPECT_EQ(st.tag, -1);
        auto key = std::make_pair(st.microbatch, st.chunk);
        ASSERT_TRUE(st.microbatch >= 0 && st.microbatch < s.microbatches && st.chunk >= 0 && st.chunk < s.vpp) << what;
        if (st.kind == PipelineStep::kForward) {
          EXPECT_TRUE(fwd.insert(key).second) << what << " r=" << r << ": forward twice";
          compute.push_back({Action::kForward, st.microbatch, st.chunk});
        } else {
          EXPECT_TRUE(fwd.count(key)) << what << " r=" << r << ": backward before forward";
          EXPECT_TRUE(bwd.insert(key).second) << what << " r=" << r << ": backward twice";
          compute.push_back({Action::kBackward, st.microbatch, st.chunk});
        }
      }
      EXPECT_EQ(fwd.size(), static_cast<size_t>(s.microbatches * s.vpp)) << what << " r=" << r;
      EXPECT_EQ(bwd.size(), static_cast<size_t>(s.microbatches * s.vpp)) << what << " r=" << r;
      // The compute steps are the schedule's actions, in its order.
      ASSERT_EQ(compute.size(), s.ranks[r].size()) << what;
      for (size_t i = 0; i < compute.size(); ++i) {
        EXPECT_EQ(compute[i].op, s.ranks[r][i].op) << what << " r=" << r << " i=" << i;
        EXPECT_EQ(compute[i].microbatch, s.ranks[r][i].microbatch) << what << " r=" << r << " i=" << i;
        EXPECT_EQ(compute[i].chunk, s.ranks[r][i].chunk) << what << " r=" << r << " i=" << i;
      }
    }
  });
  EXPECT_GT(cases, 100);
}

TEST(PipelineSteps, EverySendHasOneMatchingReceive) {
  for_each_pipeline_schedule([&](const Schedule& s, const std::string& what) {
    const int64_t P = s.pp, S = s.pp * s.vpp;
    auto steps = pipeline_steps(s);
    // (sender, receiver, tag) -> the send and whether a receive took it.
    std::map<std::tuple<int64_t, int64_t, int32_t>, std::pair<PipelineStep, int>> sends;
    size_t sends_seen = 0, recvs_seen = 0;
    for (int64_t r = 0; r < P; ++r)
      for (const auto& st : steps[r]) {
        const bool fwd = st.kind == PipelineStep::kSendForward, bwd = st.kind == PipelineStep::kSendBackward;
        if (!fwd && !bwd) continue;
        ++sends_seen;
        const int64_t vs = st.chunk * P + r, to = fwd ? vs + 1 : vs - 1;
        ASSERT_TRUE(to >= 0 && to < S) << what;
        EXPECT_EQ(st.peer, to % P) << what << " r=" << r;
        EXPECT_EQ(st.tag, (st.microbatch * S + to) * 2 + (fwd ? 0 : 1)) << what << " r=" << r;
        EXPECT_TRUE(sends.emplace(std::make_tuple(r, int64_t{st.peer}, st.tag), std::make_pair(st, 0)).second)
            << what << ": tag " << st.tag << " used twice from rank " << r << " to rank " << st.peer;
      }
    for (int64_t r = 0; r < P; ++r)
      for (const auto& st : steps[r]) {
        const bool fwd = st.kind == PipelineStep::kRecvForward, bwd = st.kind == PipelineStep::kRecvBackward;
        if (!fwd && !bwd) continue;
        ++recvs_seen;
        const int64_t vs = st.chunk * P + r, from = fwd ? vs - 1 : vs + 1;
        ASSERT_TRUE(from >= 0 && from < S) << what;
        EXPECT_EQ(st.peer, from % P) << what << " r=" << r;
        auto it = sends.find(std::make_tuple(int64_t{st.peer}, r, st.tag));
        ASSERT_NE(it, sends.end()) << what << ": receive on rank " << r << " tag " << st.tag << " has no send";
        const PipelineStep& snd = it->second.first;
        EXPECT_EQ(++it->second.second, 1) << what << ": two receives for one send";
        EXPECT_EQ(snd.kind, fwd ? PipelineStep::kSendForward : PipelineStep::kSendBackward) << what;
        EXPECT_EQ(snd.peer, r) << what;
        EXPECT_EQ(snd.microbatch, st.microbatch) << what;
        EXPECT_EQ(snd.chunk * P + st.peer, from) << what << ": the send comes from the wrong virtual stage";
      }
    EXPECT_EQ(sends_seen, recvs_seen) << what;
    for (const auto& [key, v] : sends) EXPECT_EQ(v.second, 1) << what << ": a send nobody receives";
    // Every stage boundary carries M activations forward and M gradients back.
    EXPECT_EQ(sends_seen, static_cast<size_t>(2 * (S - 1) * s.microbatches)) << what;

    P2PCheck c = check_pipeline_steps(s, steps);
    EXPECT_TRUE(c.completes) << what << ": " << c.problem;
    EXPECT_TRUE(c.fifo_compatible) << what << ": " << c.problem;
    // One channel per pair of ranks (NCCL) is safe wherever a pair carries
    // one direction, and (found by enumeration) with PP 2's default groups.
    if (P >= 3 || s.vpp == 1 || s.group_size == P) {
      EXPECT_TRUE(c.pair_fifo_compatible) << what << ": " << c.pair_problem;
    }
    EXPECT_EQ(c.problem, "") << what;
  });
}

TEST(PipelineSteps, TwoRanksInterleavedSendBothDirectionsToRankZero) {
  // P = 2, V = 2: rank 1 sends rank 0 the activations of its chunk 0 (for
  // rank 0's chunk 1) and the gradients of its chunks; the tags differ.
  auto s = build_schedule(2, 2, 4, 0);
  ASSERT_TRUE(s.is_ok());
  auto steps = pipeline_steps(*s);
  std::set<int32_t> fwd_tags, bwd_tags;
  for (const auto& st : steps[1]) {
    if (st.kind != PipelineStep::kSendForward && st.kind != PipelineStep::kSendBackward) continue;
    EXPECT_EQ(st.peer, 0);
    (st.kind == PipelineStep::kSendForward ? fwd_tags : bwd_tags).insert(st.tag);
  }
  EXPECT_EQ(fwd_tags.size(), 4u);  // chunk 0 of 4 micro-batches (chunk 1 is the last stage)
  EXPECT_EQ(bwd_tags.size(), 8u);  // both chunks of 4 micro-batches
  for (int32_t t : fwd_tags) EXPECT_FALSE(bwd_tags.count(t)) << t;
  // Forward of m on stage 1 (rank 1, chunk 0) goes to stage 2: tag (m*4 + 2)*2.
  EXPECT_TRUE(fwd_tags.count((3 * 4 + 2) * 2));
  // Backward of m on stage 3 (rank 1, chunk 1) goes to stage 2: tag (m*4 + 2)*2 + 1.
  EXPECT_TRUE(bwd_tags.count((3 * 4 + 2) * 2 + 1));
  // The first steps of rank 1: receive from rank 0, forward, send on.
  ASSERT_GE(steps[1].size(), 3u);
  EXPECT_EQ(steps[1][0].kind, PipelineStep::kRecvForward);
  EXPECT_EQ(steps[1][1].kind, PipelineStep::kForward);
  EXPECT_EQ(steps[1][2].kind, PipelineStep::kSendForward);
  // Rank 0 starts with its chunk-0 forwards, which need no receive.
  EXPECT_EQ(steps[0][0].kind, PipelineStep::kForward);
  EXPECT_EQ(steps[0][1].kind, PipelineStep::kSendForward);
}

// With PP 2 and virtual stages, rank 0 -> rank 1 carries activations and
// gradients, and the step lists keep each direction's order, not the order
// across the two: NCCL (issue order per pair of ranks, no tags) would hand
// rank 1 a gradient as an activation of the same shape. The trainer refuses
// such a layout on NCCL groups (pair_fifo_compatible false).
TEST(PipelineSteps, TwoRanksInterleavedMayMixDirectionsOnOnePair) {
  // Micro-batch groups of 4 per virtual stage (Megatron's
  // --microbatch-group-size-per-virtual-pipeline-stage; the default is PP).
  auto s = build_schedule(2, 4, 8, 4);
  ASSERT_TRUE(s.is_ok());
  P2PCheck c = check_pipeline_steps(*s, pipeline_steps(*s));
  EXPECT_TRUE(c.completes && c.fifo_compatible) << c.problem;
  EXPECT_FALSE(c.pair_fifo_compatible);
  EXPECT_NE(c.pair_problem.find("rank 0 sends rank 1 the gradient with tag"), std::string::npos) << c.pair_problem;
  EXPECT_NE(c.pair_problem.find("but rank 1 receives the activation with tag"), std::string::npos) << c.pair_problem;
  // With the default groups it holds here.
  auto s2 = build_schedule(2, 4, 8, 0);
  ASSERT_TRUE(s2.is_ok());
  P2PCheck c2 = check_pipeline_steps(*s2, pipeline_steps(*s2));
  EXPECT_TRUE(c2.pair_fifo_compatible) << c2.pair_problem;
}

TEST(PipelineSteps, NoPipeliningHasNoMessages) {
  auto s = build_schedule(1, 1, 3, 0);
  ASSERT_TRUE(s.is_ok());
  auto steps = pipeline_steps(*s);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].size(), 6u);
  P2PCheck c = check_pipeline_steps(*s, steps);
  EXPECT_TRUE(c.completes && c.fifo_compatible) << c.problem;
}

TEST(PipelineSteps, InFlightMatchesSimulateAndMegatron) {
  for_each_pipeline_schedule([&](const Schedule& s, const std::string& what) {
    auto steps = pipeline_steps(s);
    Timeline t = simulate(s, 1, 1);
    ASSERT_EQ(t.max_in_flight.size(), static_cast<size_t>(s.pp));
    for (int64_t r = 0; r < s.pp; ++r) {
      const int64_t walked = walk_in_flight(steps[r]);
      EXPECT_EQ(walked, t.max_in_flight[r]) << what << " r=" << r;
      // Megatron's closed form (§8), written out here as well so a change to
      // megatron_in_flight cannot hide a change of the schedule.
      const int64_t P = s.pp, V = s.vpp, M = s.microbatches, N = s.group_size;
      const int64_t closed = V == 1 ? std::min(P - r, M) : std::min((P - r - 1) * 2 + (V - 1) * N + 1, M * V);
      EXPECT_EQ(walked, closed) << what << " r=" << r;
      EXPECT_EQ(megatron_in_flight(P, V, M, s.group_size, r), closed) << what << " r=" << r;
    }
  });
}

TEST(PipelineSteps, InFlightMatchesThePlannersMemoryAssumption) {
  // The planner (plan.cc, plan_schedule) takes each stage's in-flight count
  // from simulate(), or from the closed form when the schedule is too big to
  // simulate; the memory of stage p is that count times its chunk activations.
  using plan::testing::plan_from;
  using plan::testing::rules_of;
  for (int64_t P : {2, 4, 8})
    for (int64_t V : {1, 2, 4})
      for (int64_t M : {P, 2 * P, 4 * P, 3 * P + 1}) {
        if (V > 1 && M % P != 0) continue;
        std::string args = "--world-size " + std::to_string(P) + " --pipeline-model-parallel-size " + std::to_string(P) +
                           " --num-layers " + std::to_string(P * V) +
                           " --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32"
                           " --vocab-size 128 --micro-batch-size 1 --global-batch-size " + std::to_string(M) +
                           " --device cpu";
        if (V > 1) args += " --num-layers-per-virtual-pipeline-stage 1";
        const std::string what = "P=" + std::to_string(P) + " V=" + std::to_string(V) + " M=" + std::to_string(M);
        plan::PlanReport r = plan_from(args);
        ASSERT_TRUE(r.valid()) << what << ": " << rules_of(r);
        ASSERT_EQ(r.vpp, V) << what;
        ASSERT_EQ(r.num_microbatches, M) << what;
        auto s = build_schedule(P, V, M, r.group_size);
        ASSERT_TRUE(s.is_ok()) << what;
        auto steps = pipeline_steps(*s);
        ASSERT_EQ(r.in_flight.size(), static_cast<size_t>(P)) << what;
        ASSERT_EQ(r.memory.stages.size(), static_cast<size_t>(P)) << what;
        for (int64_t p = 0; p < P; ++p) {
          EXPECT_EQ(r.in_flight[p], walk_in_flight(steps[p])) << what << " p=" << p;
          EXPECT_EQ(r.memory.stages[p].in_flight, walk_in_flight(steps[p])) << what << " p=" << p;
        }
      }
}

TEST(Schedule, BubbleMatchesTextbookFormulaForEveryAcceptedSize) {
  // simulate() defines the bubble as 1 - busy/makespan with busy = M*V*(tf+tb)
  // per rank, i.e. idle share of the slowest rank's span. With every chunk
  // action taking the same time on every rank, the critical path is (P-1)
  // forward plus (P-1) backward steps on top of one rank's work, so the
  // bubble is (P-1)/(P-1+M) for 1F1B and (P-1)/(P-1+V*M) interleaved, for
  // tb = tf and tb = 2*tf alike. No restriction is needed: the sweep shows it
  // also holds where the last micro-batch group is partial (M not a multiple
  // of N > P), which the paper's derivation does not cover, and for 1F1B
  // with M < P.
  for_each_pipeline_schedule([&](const Schedule& s, const std::string& what) {
    for (double tb : {1.0, 2.0}) {
      Timeline t = simulate(s, 1, tb);
      ASSERT_FALSE(t.deadlock) << what << " tb=" << tb;
      EXPECT_NEAR(t.bubble_fraction, bubble_formula(s.pp, s.vpp, s.microbatches), 1e-12) << what << " tb=" << tb;
      EXPECT_NEAR(t.makespan, (static_cast<double>(s.microbatches * s.vpp) + static_cast<double>(s.pp - 1)) * (1 + tb),
                  1e-9)
          << what << " tb=" << tb;
    }
  });
  // 1F1B with fewer micro-batches than stages (no condition on M there).
  for (int64_t P : {2, 4, 8})
    for (int64_t M = 1; M < P; ++M) {
      auto s = build_schedule(P, 1, M, 0);
      ASSERT_TRUE(s.is_ok());
      Timeline t = simulate(*s, 1, 2);
      ASSERT_FALSE(t.deadlock);
      EXPECT_NEAR(t.bubble_fraction, bubble_formula(P, 1, M), 1e-12) << "P=" << P << " M=" << M;
      auto steps = pipeline_steps(*s);
      P2PCheck c = check_pipeline_steps(*s, steps);
      EXPECT_TRUE(c.completes && c.fifo_compatible) << c.problem;
      for (int64_t r = 0; r < P; ++r) {
        EXPECT_EQ(walk_in_flight(steps[r]), std::min(P - r, M)) << "P=" << P << " M=" << M << " r=" << r;
        EXPECT_EQ(t.max_in_flight[r], std::min(P - r, M)) << "P=" << P << " M=" << M << " r=" << r;
      }
    }
}

// The checker must see broken programs, or the tests above prove nothing.
// (Also tried by hand: dropping the direction bit or the factor 2 from the
// tag, using the sender's stage in the tag, not wrapping the peer from rank
// P-1 to rank 0, dropping a send: EverySendHasOneMatchingReceive fails.)
TEST(PipelineSteps, CheckerCatchesBrokenPrograms) {
  auto s = build_schedule(2, 1, 2, 0);  // rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1
  ASSERT_TRUE(s.is_ok());
  const auto good = pipeline_steps(*s);
  ASSERT_TRUE(check_pipeline_steps(*s, good).completes);
  auto find = [](const std::vector<PipelineStep>& l, PipelineStep::Kind k, int m) {
    for (size_t i = 0; i < l.size(); ++i)
      if (l[i].kind == k && l[i].microbatch == m) return i;
    ADD_FAILURE() << "step not found";
    return size_t{0};
  };

  {  // Rank 0 waits for the gradient of micro-batch 0 before sending its activation: deadlock.
    auto bad = good;
    auto i = find(bad[0], PipelineStep::kRecvBackward, 0);
    PipelineStep st = bad[0][i];
    bad[0].erase(bad[0].begin() + static_cast<ptrdiff_t>(i));
    bad[0].insert(bad[0].begin(), st);
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("deadlock"), std::string::npos) << c.problem;
  }
  {  // Rank 1 takes micro-batch 1's activation first: completes (tags), not FIFO.
    auto bad = good;
    auto i0 = find(bad[1], PipelineStep::kRecvForward, 0), i1 = find(bad[1], PipelineStep::kRecvForward, 1);
    PipelineStep st = bad[1][i1];
    bad[1].erase(bad[1].begin() + static_cast<ptrdiff_t>(i1));
    bad[1].insert(bad[1].begin() + static_cast<ptrdiff_t>(i0), st);
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_TRUE(c.completes) << c.problem;
    EXPECT_FALSE(c.fifo_compatible);
    EXPECT_NE(c.problem.find("forward messages rank 0 -> rank 1"), std::string::npos) << c.problem;
  }
  {  // Swapped tags: each receive gets the other micro-batch's activation.
    auto bad = good;
    std::swap(bad[1][find(bad[1], PipelineStep::kRecvForward, 0)].tag,
              bad[1][find(bad[1], PipelineStep::kRecvForward, 1)].tag);
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("wrong direction, micro-batch or stage"), std::string::npos) << c.problem;
  }
  {  // A missing send.
    auto bad = good;
    bad[0].erase(bad[0].begin() + static_cast<ptrdiff_t>(find(bad[0], PipelineStep::kSendForward, 1)));
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("never sent"), std::string::npos) << c.problem;
  }
  {  // A receive after the compute it feeds.
    auto bad = good;
    auto i = find(bad[1], PipelineStep::kRecvForward, 0);
    std::swap(bad[1][i], bad[1][i + 1]);
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("no receive before it"), std::string::npos) << c.problem;
  }
  {  // The wrong peer.
    auto bad = good;
    bad[0][find(bad[0], PipelineStep::kSendForward, 0)].peer = 0;
    EXPECT_FALSE(check_pipeline_steps(*s, bad).completes);
  }
  {  // Compute out of the schedule's order.
    auto bad = good;
    std::swap(bad[0][find(bad[0], PipelineStep::kForward, 0)], bad[0][find(bad[0], PipelineStep::kForward, 1)]);
    P2PCheck c = check_pipeline_steps(*s, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("the schedule's action"), std::string::npos) << c.problem;
  }
  {  // Interleaved, P = 2: forward and backward messages rank 1 -> rank 0 share tags when
     // the direction bit is dropped; the checker sees the clash.
    auto si = build_schedule(2, 2, 2, 0);
    ASSERT_TRUE(si.is_ok());
    auto bad = pipeline_steps(*si);
    for (auto& l : bad)
      for (auto& st : l)
        if (st.tag >= 0) st.tag /= 2;
    P2PCheck c = check_pipeline_steps(*si, bad);
    EXPECT_FALSE(c.completes);
    EXPECT_NE(c.problem.find("tag already used"), std::string::npos) << c.problem;
  }
}

TEST(Schedule, NoPipeliningAlternates) {
  auto s = build_schedule(1, 1, 3, 0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->kind, ScheduleKind::kNoPipelining);
  ASSERT_EQ(s->ranks[0].size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s->ranks[0][i].op, i % 2 == 0 ? Action::kForward : Action::kBackward);
  EXPECT_EQ(simulate(*s, 1, 2).bubble_fraction, 0);
}

TEST(Schedule, SeedBubble) {
  EXPECT_NEAR(bubble_formula(2, 1, 8), 1.0 / 9.0, 1e-15);
  EXPECT_NEAR(bubble_formula(2, 1, 8), 0.111, 5e-4);
}

}  // namespace
}  // namespace mt::parallel
