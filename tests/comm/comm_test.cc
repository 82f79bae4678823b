// Communicators: every collective and dtype with closed-form expected values,
// point to point, the asynchronous variants, stats byte counts, groups made
// by make_group and ProcessGroups over a RankGrid, and staged groups on the
// simulated device. The same binary runs under
// mpirun with 1, 2 and 4 ranks (MpiCommunicator) and alone (everything a
// SelfCommunicator); its own main initialises and finalises MPI.
//
// Flags after the gtest ones: --expect-world=N (the world size the launcher
// promised) and --expect-mpi=0|1 (whether mpirun started it), so a broken
// launch (e.g. N singletons) fails instead of passing N times at size 1.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "core/device.h"
#include "core/sim_device.h"
#include "../support/comm_values.h"
#include "../support/mpi_test.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"

namespace mt::comm {
namespace {

using namespace ::mt::comm::test;  // NOLINT: the shared value helpers

int g_expect_world = -1;  // -1: not checked
int g_expect_mpi = -1;

// ---- the runtime ----

TEST(Runtime, WorldAsLaunched) {
  auto w = world_communicator();
  int N = world_size();
  if (g_expect_world >= 0) { EXPECT_EQ(N, g_expect_world); }
  if (g_expect_mpi >= 0) { EXPECT_EQ(launched_by_mpi(), g_expect_mpi == 1); }
  EXPECT_EQ(w->size(), N);
  EXPECT_EQ(w->rank(), world_rank());
  std::vector<int> all(N);
  for (int i = 0; i < N; ++i) all[i] = i;
  EXPECT_EQ(w->members(), all);
  EXPECT_EQ(w->name(), group_name("world", all));
  w->barrier();
}

TEST(Runtime, GroupNames) {
  EXPECT_EQ(group_name("tp", {0, 1}), "tp[0,1]");
  EXPECT_EQ(group_name("dp", {0, 2, 4, 6}), "dp[0,2,4,6]");
  EXPECT_EQ(group_name("world", {0, 1, 2, 3, 4, 5, 6, 7}), "world[0..7]");
  EXPECT_EQ(group_name("pp", {3}), "pp[3]");
  EXPECT_EQ(group_name("x", {}), "x[]");
}

// ---- collectives over the world, every dtype ----

template <typename T>
class Collective : public ::testing::Test {};
using AllTypes = ::testing::Types<float, double, int32_t, int64_t, bf16>;
TYPED_TEST_SUITE(Collective, AllTypes, TypeNames);

TYPED_TEST(Collective, AllReduceSumMaxMin) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> v(p.n);
    for (int i = 0; i < p.n; ++i) v[i] = val<T>(r * p.A + i);
    w->all_reduce(host_view(v), op);
    for (int i = 0; i < p.n; ++i)
      EXPECT_EQ(num(v[i]), reduce_closed_form(op, N, p.A, i)) << op_name(op) << " element " << i;
  }
}

TYPED_TEST(Collective, AllGather) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  std::vector<T> in(p.n), out(static_cast<size_t>(N) * p.n, val<T>(-1));
  for (int i = 0; i < p.n; ++i) in[i] = val<T>(r * p.A + i);
  w->all_gather(host_view(in), host_view(out));
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(out[j * p.n + i]), j * p.A + i) << "block " << j << " element " << i;
  for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(in[i]), r * p.A + i) << "in must be untouched";
}

TYPED_TEST(Collective, AllGatherInPlace) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  std::vector<T> buf(static_cast<size_t>(N) * p.n, val<T>(-1));
  for (int i = 0; i < p.n; ++i) buf[r * p.n + i] = val<T>(r * p.A + i);
  Tensor out(buf.data(), Shape{N, p.n}, dtype_of<T>());
  w->all_gather(out.slice(r, r + 1), out);  // in is out's own block
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(buf[j * p.n + i]), j * p.A + i) << "block " << j << " element " << i;
}

TYPED_TEST(Collective, ReduceScatter) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> in(static_cast<size_t>(N) * p.n), out(p.n, val<T>(-1));
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < p.n; ++i) in[j * p.n + i] = val<T>(r * p.A + j * p.B + i);
    w->reduce_scatter(host_view(in), host_view(out), op);
    // Block r of every rank s: s*A + r*B + i.
    for (int i = 0; i < p.n; ++i)
      EXPECT_EQ(num(out[i]), reduce_closed_form(op, N, p.A, r * p.B + i)) << op_name(op) << " element " << i;
  }
}

TYPED_TEST(Collective, BroadcastFromLastAndFirstRank) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  for (int root : {N - 1, 0}) {
    std::vector<T> v(p.n);
    for (int i = 0; i < p.n; ++i) v[i] = val<T>(r * p.A + i);
    w->broadcast(host_view(v), root);
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(v[i]), root * p.A + i) << "root " << root << " element " << i;
  }
}

TYPED_TEST(Collective, AllToAll) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  std::vector<T> in(static_cast<size_t>(N) * p.n), out(in.size(), val<T>(-1));
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < p.n; ++i) in[j * p.n + i] = val<T>(r * p.A + j * p.B + i);
  w->all_to_all(host_view(in), host_view(out));
  // Block s of out is block r of rank s's in.
  for (int s = 0; s < N; ++s)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(out[s * p.n + i]), s * p.A + r * p.B + i) << "block " << s;
  // In place (in == out): the result is as if in was read first.
  w->all_to_all(host_view(in), host_view(in));
  for (int s = 0; s < N; ++s)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(in[s * p.n + i]), s * p.A + r * p.B + i) << "in place, block " << s;
}

// Blocks of different sizes, zero-sized ones among them: rank r sends
// (r + 2 j) % 4 elements to rank j. The tail of out past the received
// elements is left alone.
TYPED_TEST(Collective, AllToAllV) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const Pattern p = pattern<T>();
  auto sends = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 4); };
  std::vector<int64_t> sc(N), rc(N);
  int64_t ns = 0, nr = 0;
  for (int j = 0; j < N; ++j) sc[j] = sends(r, j), rc[j] = sends(j, r), ns += sc[j], nr += rc[j];
  std::vector<T> in(static_cast<size_t>(ns)), out(static_cast<size_t>(nr) + 3, val<T>(-1));
  for (int j = 0, at = 0; j < N; ++j)
    for (int i = 0; i < sc[j]; ++i) in[at++] = val<T>(r * p.A + j * p.B + i);
  w->reset_stats();
  w->all_to_all_v(host_view(in), sc, host_view(out), rc);
  for (int s = 0, at = 0; s < N; ++s)
    for (int i = 0; i < rc[s]; ++i) EXPECT_EQ(num(out[at++]), s * p.A + r * p.B + i) << "from rank " << s;
  for (size_t i = static_cast<size_t>(nr); i < out.size(); ++i) EXPECT_EQ(num(out[i]), -1) << "tail " << i;
  EXPECT_EQ(w->stats().all_to_all_bytes, static_cast<uint64_t>(ns) * sizeof(T));  // the elements sent
}

// Ring: rank r sends to r+1 and receives from r-1. 5000 elements is past
// OpenMPI's eager limit, so blocking sends rendezvous: even ranks send first.
TYPED_TEST(Collective, SendRecvRing) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  if (N == 1) GTEST_SKIP() << "a group of one has no peer";
  const Pattern p = pattern<T>();
  const int n = 5000, right = (r + 1) % N, left = (r + N - 1) % N;
  std::vector<T> out(n), in(n, val<T>(-1));
  for (int i = 0; i < n; ++i) out[i] = val<T>(r * p.A + i % p.n);
  if (r % 2 == 0) {
    w->send(host_view(out), right, 1);
    w->recv(host_view(in), left, 1);
  } else {
    w->recv(host_view(in), left, 1);
    w->send(host_view(out), right, 1);
  }
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(in[i]), left * p.A + i % p.n) << "element " << i;
}

// Tags match regardless of posting order; messages with the same tag between
// one pair arrive in order.
TYPED_TEST(Collective, IsendIrecvTagsAndOrder) {
  using T = TypeParam;
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  if (N == 1) GTEST_SKIP() << "a group of one has no peer";
  const Pattern p = pattern<T>();
  const int n = 3000, right = (r + 1) % N, left = (r + N - 1) % N;
  auto fill = [&](std::vector<T>& v, int rank, int k) {
    for (int i = 0; i < n; ++i) v[i] = val<T>(rank * p.A + (i + k) % p.n);
  };
  std::vector<T> s7(n), s3(n), s9a(n), s9b(n), r7(n), r3(n), r9a(n), r9b(n);
  fill(s7, r, 0), fill(s3, r, 1), fill(s9a, r, 2), fill(s9b, r, 3);
  std::vector<std::unique_ptr<Work>> works;
  works.push_back(w->irecv(host_view(r7), left, 7));
  works.push_back(w->irecv(host_view(r3), left, 3));
  works.push_back(w->irecv(host_view(r9a), left, 9));
  works.push_back(w->irecv(host_view(r9b), left, 9));
  works.push_back(w->isend(host_view(s3), right, 3));
  works.push_back(w->isend(host_view(s9a), right, 9));
  works.push_back(w->isend(host_view(s9b), right, 9));
  works.push_back(w->isend(host_view(s7), right, 7));
  while (!works[0]->test()) {
  }
  EXPECT_TRUE(works[0]->test());  // stays completed
  for (auto& wk : works) wk->wait();
  for (auto& wk : works) wk->wait();  // idempotent
  std::vector<T> e(n);
  fill(e, left, 0);
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(r7[i]), num(e[i])) << "tag 7 element " << i;
  fill(e, left, 1);
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(r3[i]), num(e[i])) << "tag 3 element " << i;
  fill(e, left, 2);
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(r9a[i]), num(e[i])) << "first tag 9 element " << i;
  fill(e, left, 3);
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(r9b[i]), num(e[i])) << "second tag 9 element " << i;
}

// ---- bf16: the sum is formed in fp32 and rounded once ----

// Rank 0 holds 1, every other rank k * 2^-8 (k = 1..3): each value is exact in
// bf16 and the fp32 sum is exact, so the expected bf16 is the fp32 sum rounded
// to nearest even. With 4 ranks and k = 1 that is 1 + 3/256 -> 1.015625, where
// adding in bf16 one rank at a time would round every step down to 1.
TEST(Bf16, SumInFp32RoundedOnce) {
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const int n = 9;
  auto value = [](int rank, int i) { return rank == 0 ? 1.0f : std::ldexp(static_cast<float>(i % 3 + 1), -8); };
  std::vector<bf16> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = b[i] = float_to_bf16(value(r, i));
  w->all_reduce(host_view(a));
  w->iall_reduce(host_view(b))->wait();
  for (int i = 0; i < n; ++i) {
    float sum = 0;
    for (int s = 0; s < N; ++s) sum += value(s, i);
    EXPECT_EQ(a[i].bits, float_to_bf16(sum).bits) << "element " << i << ": got " << bf16_to_float(a[i]);
    EXPECT_EQ(b[i].bits, a[i].bits) << "iall_reduce element " << i;
  }
  if (N == 4) { EXPECT_EQ(bf16_to_float(a[0]), 1.015625f); }
}

// ---- asynchronous collectives ----

// Two gradient buckets in flight at once (fp32 and bf16), completed out of
// order; a third whose Work is dropped (the destructor waits).
TEST(Async, AllReduceBucketsOverlap) {
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  std::vector<float> b1(1000), b3(777);
  std::vector<bf16> b2(3000);
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = static_cast<float>(r * 1000 + i);
  for (size_t i = 0; i < b2.size(); ++i) b2[i] = float_to_bf16(static_cast<float>(r * 16 + i % 16));
  for (size_t i = 0; i < b3.size(); ++i) b3[i] = static_cast<float>(r + 1);
  auto w1 = w->iall_reduce(host_view(b1));
  auto w2 = w->iall_reduce(host_view(b2), ReduceOp::kMax);
  { auto w3 = w->iall_reduce(host_view(b3)); }
  while (!w2->test()) {
  }
  w1->wait();
  EXPECT_TRUE(w1->test());
  for (size_t i = 0; i < b1.size(); ++i) ASSERT_EQ(b1[i], 1000.0 * N * (N - 1) / 2 + N * static_cast<double>(i)) << i;
  for (size_t i = 0; i < b2.size(); ++i) ASSERT_EQ(bf16_to_float(b2[i]), (N - 1) * 16 + i % 16) << i;
  for (size_t i = 0; i < b3.size(); ++i) ASSERT_EQ(b3[i], N * (N + 1) / 2) << i;
}

TEST(Async, ReduceScatterAndAllGather) {
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  const int n = 11;
  // ireduce_scatter fp64 and bf16.
  std::vector<double> in(static_cast<size_t>(N) * n), out(n);
  std::vector<bf16> hin(static_cast<size_t>(N) * 4), hout(4);
  for (int j = 0; j < N; ++j) {
    for (int i = 0; i < n; ++i) in[j * n + i] = r * 1000 + j * 100 + i;
    for (int i = 0; i < 4; ++i) hin[j * 4 + i] = float_to_bf16(static_cast<float>(r * 16 + j * 4 + i));
  }
  auto wa = w->ireduce_scatter(host_view(in), host_view(out));
  auto wb = w->ireduce_scatter(host_view(hin), host_view(hout), ReduceOp::kSum);
  // iall_gather: in place (int64) and out of place (fp32).
  std::vector<int64_t> g(static_cast<size_t>(N) * n, -1);
  for (int i = 0; i < n; ++i) g[r * n + i] = r * 1000 + i;
  Tensor gt(g.data(), Shape{N, n}, DType::kI64);
  std::vector<float> gin(n), gout(static_cast<size_t>(N) * n, -1);
  for (int i = 0; i < n; ++i) gin[i] = static_cast<float>(r * 1000 + i);
  auto wc = w->iall_gather(gt.slice(r, r + 1), gt);
  auto wd = w->iall_gather(host_view(gin), host_view(gout));
  wd->wait(), wc->wait(), wb->wait(), wa->wait();
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], reduce_closed_form(ReduceOp::kSum, N, 1000, r * 100 + i)) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_float(hout[i]), reduce_closed_form(ReduceOp::kSum, N, 16, r * 4 + i));
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(g[j * n + i], j * 1000 + i) << "in place, block " << j;
      EXPECT_EQ(gout[j * n + i], static_cast<float>(j * 1000 + i)) << "block " << j;
    }
}

// ---- stats: the bytes of each call's largest buffer ----

TEST(Stats, ByteCountsAsTheHeaderDefines) {
  auto w = world_communicator();
  const uint64_t N = static_cast<uint64_t>(w->size());
  const int n = static_cast<int>(N);
  w->all_reduce_scalar(1.0);
  w->reset_stats();
  EXPECT_EQ(w->stats().calls, 0u);
  EXPECT_EQ(w->stats().bytes, 0u);

  std::vector<float> a(10, 1.0f);
  w->all_reduce(host_view(a));                                       // 40
  std::vector<int32_t> gi(3), go(3 * N);
  w->all_gather(host_view(gi), host_view(go));                          // out: 12 N
  std::vector<double> ri(2 * N), ro(2);
  w->reduce_scatter(host_view(ri), host_view(ro));                      // in: 16 N
  std::vector<int64_t> bc(5);
  w->broadcast(host_view(bc), n - 1);                                // 40
  std::vector<int32_t> ti(2 * N), to(2 * N);
  w->all_to_all(host_view(ti), host_view(to));                          // in: 8 N
  w->iall_reduce(host_view(a))->wait();                              // 40
  std::vector<bf16> hi(6), ho(6 * N);
  w->iall_gather(host_view(hi), host_view(ho))->wait();                 // out: 12 N
  std::vector<float> si(3 * N), so(3);
  w->ireduce_scatter(host_view(si), host_view(so))->wait();             // in: 12 N
  w->barrier();                                                   // nothing
  w->all_reduce_scalar(2.0);                                      // 8

  const CommStats& s = w->stats();
  EXPECT_EQ(s.calls, 9u);
  EXPECT_EQ(s.all_reduce_bytes, 40u + 40u + 8u);
  EXPECT_EQ(s.all_gather_bytes, 12 * N + 12 * N);
  EXPECT_EQ(s.reduce_scatter_bytes, 16 * N + 12 * N);
  EXPECT_EQ(s.broadcast_bytes, 40u);
  EXPECT_EQ(s.all_to_all_bytes, 8 * N);
  EXPECT_EQ(s.p2p_bytes, 0u);
  EXPECT_EQ(s.bytes, 88u + 24 * N + 28 * N + 40u + 8 * N);

  if (N == 1) return;
  w->reset_stats();
  const int r = w->rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> f(4), g(4);
  if (r % 2 == 0) {
    w->send(host_view(f), right);
    w->recv(host_view(g), left);
  } else {
    w->recv(host_view(g), left);
    w->send(host_view(f), right);
  }
  std::vector<double> d(3), e(3);
  auto rw = w->irecv(host_view(e), left, 2);
  auto sw = w->isend(host_view(d), right, 2);
  sw->wait(), rw->wait();
  EXPECT_EQ(w->stats().calls, 4u);
  EXPECT_EQ(w->stats().p2p_bytes, 16u + 16u + 24u + 24u);
  EXPECT_EQ(w->stats().bytes, 80u);
}

TEST(Scalar, AllReduceScalar) {
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  EXPECT_EQ(w->all_reduce_scalar(r + 1.0), N * (N + 1) / 2.0);
  EXPECT_EQ(w->all_reduce_scalar(r + 1.0, ReduceOp::kMax), N);
  EXPECT_EQ(w->all_reduce_scalar(r + 1.0, ReduceOp::kMin), 1.0);
  EXPECT_EQ(w->all_reduce_scalar(0.25 * (r + 1)), 0.25 * N * (N + 1) / 2.0);
}

TEST(Scalar, AllGatherScalar) {
  auto w = world_communicator();
  const int N = w->size(), r = w->rank();
  w->reset_stats();
  const std::vector<double> all = w->all_gather_scalar(0.5 * r + 1.0);
  ASSERT_EQ(all.size(), static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], 0.5 * i + 1.0) << "rank " << i;
  EXPECT_EQ(w->stats().all_gather_bytes, sizeof(double) * static_cast<size_t>(N));
}

// ---- staged groups (device tensors through host buffers) ----
//
// On the simulated device (MT_SIMULATE_CUDA=1, which the comm.mpi_np* tests
// set), "device" memory faults on any host access outside kernels and
// copies, so every result is checked through copy_tensor; on a real GPU
// (bench/device_check.sh runs this binary there) the same test moves real
// device memory.
bool have_device_memory() { return simdev::enabled() || backend_info().cuda_devices > 0; }

std::vector<float> to_host(const Tensor& d) {
  std::vector<float> h(static_cast<size_t>(d.numel()));
  copy_tensor(d, Tensor(h.data(), Shape{d.numel()}, DType::kF32));
  return h;
}
void to_device(const std::vector<float>& h, const Tensor& d) {
  copy_tensor(Tensor(const_cast<float*>(h.data()), Shape{d.numel()}, DType::kF32), d);
}

TEST(Staged, CollectivesAndPointToPointOnDeviceTensors) {
  if (!have_device_memory()) GTEST_SKIP() << "needs device memory: a GPU, or MT_SIMULATE_CUDA=1";
  std::vector<int> all;
  for (int i = 0; i < world_size(); ++i) all.push_back(i);
  auto g = make_staged_group(make_group(all, "staged"));
  ASSERT_NE(g, nullptr);
  const int N = g->size(), r = g->rank();
  EXPECT_EQ(g->name(), group_name("staged", all));
  Arena dev(size_t{1} << 20, "staged test", Device::kCuda);
  const int64_t n = 6;

  // all_reduce: sum over ranks of (r + 1) (i + 1).
  Tensor t = dev.alloc({n}, DType::kF32);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * (i + 1));
  to_device(x, t);
  g->reset_stats();
  g->all_reduce(t);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(to_host(t)[i], static_cast<float>(N * (N + 1) / 2 * (i + 1)));
  EXPECT_EQ(g->stats().all_reduce_bytes, static_cast<uint64_t>(n * 4));

  // all_gather in place (this rank's block of out), then reduce_scatter back.
  Tensor out = dev.alloc({n * N}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(100 * r + i);
  to_device(x, out.slice(r * n, (r + 1) * n));
  g->all_gather(out.slice(r * n, (r + 1) * n), out);
  std::vector<float> got = to_host(out);
  for (int k = 0; k < N; ++k)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[k * n + i], static_cast<float>(100 * k + i));
  Tensor mine = dev.alloc({n}, DType::kF32);
  g->reduce_scatter(out, mine);  // every rank holds the same out: block r times N
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(to_host(mine)[i], static_cast<float>(N * (100 * r + i)));

  // broadcast from the last rank.
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(r == N - 1 ? 7 * i : -1);
  to_device(x, t);
  g->broadcast(t, N - 1);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(to_host(t)[i], static_cast<float>(7 * i));

  // A ring, both sides isend first (1F1B's order): stays asynchronous, no deadlock.
  if (N > 1) {
    Tensor s = dev.alloc({n}, DType::kF32), rcv = dev.alloc({n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(10 * r + i);
    to_device(x, s);
    auto ws = g->isend(s, (r + 1) % N, 3);
    g->recv(rcv, (r + N - 1) % N, 3);
    ws->wait();
    const int from = (r + N - 1) % N;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(to_host(rcv)[i], static_cast<float>(10 * from + i));
    // irecv lands in the device tensor once waited for.
    auto wr = g->irecv(rcv, from, 4);
    g->send(s, (r + 1) % N, 4);
    wr->wait();
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(to_host(rcv)[i], static_cast<float>(10 * from + i));
  }

  // Asynchronous collectives complete into the device tensors at wait().
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  to_device(x, t);
  auto wa = g->iall_reduce(t, ReduceOp::kMax);
  wa->wait();
  EXPECT_EQ(to_host(t)[0], 1.0f);
  EXPECT_EQ(g->all_gather_scalar(r + 2.0).back(), N + 1.0);
  EXPECT_EQ(g->all_reduce_scalar(1.0), N);

  // all_to_all_v: rank r sends r + j + 1 elements to rank j; the tail of out
  // past what arrives keeps its values.
  {
    std::vector<int64_t> sc(N), rc(N);
    int64_t ns = 0, nr = 0;
    for (int j = 0; j < N; ++j) sc[j] = r + j + 1, rc[j] = j + r + 1, ns += sc[j], nr += rc[j];
    std::vector<float> hin(static_cast<size_t>(ns)), hout(static_cast<size_t>(nr) + 2, -5.0f);
    for (int j = 0, at = 0; j < N; ++j)
      for (int64_t i = 0; i < sc[j]; ++i) hin[at++] = static_cast<float>(1000 * r + 10 * j + i);
    Tensor din = dev.alloc({ns}, DType::kF32), dout = dev.alloc({nr + 2}, DType::kF32);
    to_device(hin, din), to_device(hout, dout);
    g->reset_stats();
    g->all_to_all_v(din, sc, dout, rc);
    got = to_host(dout);
    for (int s = 0, at = 0; s < N; ++s)
      for (int64_t i = 0; i < rc[s]; ++i) EXPECT_EQ(got[at++], static_cast<float>(1000 * s + 10 * r + i));
    EXPECT_EQ(got[nr], -5.0f);
    EXPECT_EQ(got[nr + 1], -5.0f);
    EXPECT_EQ(g->stats().all_to_all_bytes, static_cast<uint64_t>(ns * 4));
  }
}

TEST(StagedDeathTest, HostTensorsAreRefused) {
  if (!have_device_memory()) GTEST_SKIP() << "needs device memory: a GPU, or MT_SIMULATE_CUDA=1";
  if (launched_by_mpi()) GTEST_SKIP() << "death tests fork: comm.self runs this one, without MPI";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto g = make_staged_group(make_group({0}, "staged"));
  float v = 1.0f;
  EXPECT_DEATH(g->all_reduce(Tensor(&v, Shape{1}, DType::kF32)),
               "all_reduce on staged\\[0\\]: expected a CUDA tensor");
}

// ---- make_group ----

TEST(MakeGroup, HalvesAndAnEmptyList) {
  const int N = world_size(), r = world_rank();
  // Two halves (one group when N == 1).
  int half = (N + 1) / 2;
  std::vector<int> members;
  for (int m = (r < half ? 0 : half); m < (r < half ? half : N); ++m) members.push_back(m);
  auto g = make_group(members, "half");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->members(), members);
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(g->rank(), r - members.front());
  EXPECT_EQ(g->name(), group_name("half", members));
  double expect = 0;
  for (int m : members) expect += m + 1;
  EXPECT_EQ(g->all_reduce_scalar(r + 1.0), expect);

  // Rank 0 in no group; the rest together.
  std::vector<int> rest;
  if (r != 0)
    for (int m = 1; m < N; ++m) rest.push_back(m);
  auto h = make_group(rest, "rest");
  if (r == 0) {
    EXPECT_EQ(h, nullptr);
  } else {
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->members(), rest);
    EXPECT_EQ(h->all_reduce_scalar(1.0), N - 1.0);
  }
}

// ---- ProcessGroups over a RankGrid ----

void check_groups(const parallel::RankGrid& grid) {
  const int r = world_rank();
  auto pg = parallel::ProcessGroups::create(grid, r);
  ASSERT_TRUE(pg.is_ok()) << pg.status().message();
  EXPECT_EQ(pg->coord().rank, r);
  EXPECT_EQ(pg->coord().tp, grid.coord(r).tp);
  EXPECT_EQ(pg->coord().pp, grid.coord(r).pp);
  EXPECT_EQ(pg->coord().dp, grid.coord(r).dp);
  std::string described;
  for (parallel::GroupKind k : parallel::all_group_kinds()) {
    std::vector<int64_t> want64 = grid.group_of(k, r);
    std::vector<int> want(want64.begin(), want64.end());
    Communicator* c = pg->get(k);
    if (want.empty()) {
      EXPECT_EQ(c, nullptr) << parallel::group_kind_name(k);
      described += fmt::format("{}: none\n", parallel::group_kind_name(k));
      continue;
    }
    ASSERT_NE(c, nullptr) << parallel::group_kind_name(k);
    EXPECT_EQ(c->members(), want) << parallel::group_kind_name(k);
    EXPECT_EQ(c->name(), group_name(parallel::group_kind_name(k), want));
    described += fmt::format("{}: ranks [{}]\n", parallel::group_kind_name(k), fmt::join(want, ", "));
  }
  EXPECT_EQ(pg->describe(), described);
  EXPECT_EQ(&pg->tp(), pg->get(parallel::GroupKind::kTensor));
  EXPECT_EQ(&pg->pp(), pg->get(parallel::GroupKind::kPipeline));
  EXPECT_EQ(&pg->dp(), pg->get(parallel::GroupKind::kData));
  EXPECT_EQ(&pg->cp(), pg->get(parallel::GroupKind::kContext));
  EXPECT_EQ(&pg->dp_cp(), pg->get(parallel::GroupKind::kDataContext));
  EXPECT_EQ(pg->embedding(), pg->get(parallel::GroupKind::kEmbedding));

  // An all-reduce over each group sums exactly its members' values
  // (element i on rank m: m*1000 + i), in the same order on every rank.
  for (parallel::GroupKind k : parallel::all_group_kinds()) {
    Communicator* c = pg->get(k);
    if (!c) continue;
    std::vector<int32_t> v(5);
    for (int i = 0; i < 5; ++i) v[i] = r * 1000 + i;
    c->all_reduce(host_view(v));
    for (int i = 0; i < 5; ++i) {
      int32_t expect = 0;
      for (int m : c->members()) expect += m * 1000 + i;
      EXPECT_EQ(v[i], expect) << parallel::group_kind_name(k) << " element " << i;
    }
  }
}

TEST(ProcessGroups, TensorAndPipelineGrid) {
  const int N = world_size();
  auto grid = parallel::RankGrid::create({.world = N, .tp = N >= 2 ? 2 : 1, .pp = N >= 4 ? 2 : 1});
  ASSERT_TRUE(grid.is_ok()) << grid.status().message();
  check_groups(*grid);
  if (N >= 2) {
    auto pg = parallel::ProcessGroups::create(*grid, world_rank());
    ASSERT_TRUE(pg.is_ok());
    const int r = world_rank();
    std::vector<int> tp = {r - r % 2, r - r % 2 + 1};  // tp pairs in the default order
    EXPECT_EQ(pg->tp().members(), tp);
    EXPECT_EQ(pg->tp().all_reduce_scalar(r + 1.0), tp[0] + tp[1] + 2.0);
    EXPECT_NE(pg->describe().find(fmt::format("tp: ranks [{}, {}]\n", tp[0], tp[1])), std::string::npos)
        << pg->describe();
  }
}

// Every rank its own pipeline stage: middle stages have no embedding group.
TEST(ProcessGroups, PipelineOnlyGrid) {
  const int N = world_size(), r = world_rank();
  auto grid = parallel::RankGrid::create({.world = N, .pp = N});
  ASSERT_TRUE(grid.is_ok()) << grid.status().message();
  check_groups(*grid);
  auto pg = parallel::ProcessGroups::create(*grid, r);
  ASSERT_TRUE(pg.is_ok());
  bool edge = r == 0 || r == N - 1;
  EXPECT_EQ(pg->embedding() != nullptr, edge);
  if (!edge) { EXPECT_NE(pg->describe().find("embedding: none\n"), std::string::npos); }
}

TEST(ProcessGroups, RejectsAGridOfAnotherWorld) {
  const int N = world_size();
  auto grid = parallel::RankGrid::create({.world = 2 * N, .tp = 2});
  ASSERT_TRUE(grid.is_ok());
  auto pg = parallel::ProcessGroups::create(*grid, world_rank());
  ASSERT_FALSE(pg.is_ok());
  EXPECT_NE(pg.status().message().find(fmt::format("world size {}", 2 * N)), std::string::npos)
      << pg.status().message();
  auto same = parallel::RankGrid::create({.world = N});
  auto wrong_rank = parallel::ProcessGroups::create(*same, (world_rank() + 1) % (N + 1));
  EXPECT_FALSE(wrong_rank.is_ok());
}

// ---- the self communicator (any world size) ----

TEST(Self, CopiesAndCounts) {
  auto s = make_self_communicator(3);
  EXPECT_EQ(s->rank(), 0);
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->members(), std::vector<int>{3});
  EXPECT_EQ(s->name(), "self[3]");
  std::vector<float> in = {1, 2, 3, 4}, out(4, -1);
  s->all_gather(host_view(in), host_view(out));
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), -1.0f);
  s->reduce_scatter(host_view(in), host_view(out), ReduceOp::kMax);
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), -1.0f);
  s->all_to_all(host_view(in), host_view(out));
  EXPECT_EQ(out, in);
  s->all_reduce(host_view(in));
  s->broadcast(host_view(in), 0);
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3, 4}));
  // Overlapping in and out: as if in was read first (memmove).
  std::vector<int32_t> buf = {1, 2, 3, 4, 5};
  Tensor b(buf.data(), Shape{5}, DType::kI32);
  s->all_to_all(b.slice(0, 4), b.slice(1, 5));
  EXPECT_EQ(buf, (std::vector<int32_t>{1, 1, 2, 3, 4}));
  // all_to_all_v: the counted prefix, the rest untouched.
  EXPECT_EQ(s->stats().all_to_all_bytes, 16u + 16u);
  std::vector<float> big(6, -1);
  s->all_to_all_v(host_view(in), {3}, host_view(big), {3});
  EXPECT_EQ(big, (std::vector<float>{1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(s->stats().all_to_all_bytes, 16u + 16u + 12u);
  s->reset_stats();
  EXPECT_TRUE(s->iall_reduce(host_view(in))->test());
  EXPECT_TRUE(s->ireduce_scatter(host_view(in), host_view(out))->test());
  EXPECT_TRUE(s->iall_gather(host_view(in), host_view(out))->test());
  s->barrier();
  EXPECT_EQ(s->all_reduce_scalar(2.5), 2.5);
  // Since the reset: 16 bytes each: iall_reduce, ireduce_scatter,
  // iall_gather; the scalar 8.
  EXPECT_EQ(s->stats().calls, 4u);
  EXPECT_EQ(s->stats().all_reduce_bytes, 16u + 8u);
  EXPECT_EQ(s->stats().all_gather_bytes, 16u);
  EXPECT_EQ(s->stats().reduce_scatter_bytes, 16u);
  EXPECT_EQ(s->stats().all_to_all_bytes, 0u);
  EXPECT_EQ(s->stats().broadcast_bytes, 0u);
  EXPECT_EQ(s->stats().bytes, 24u + 16u + 16u);
}

TEST(SelfDeathTest, MisuseFailsWithAMessage) {
  if (launched_by_mpi()) GTEST_SKIP() << "death tests fork; only without mpirun";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto s = make_self_communicator(0);
  std::vector<float> v(4), small(3);
  EXPECT_DEATH(s->send(host_view(v), 0), "a pipeline with one stage never sends");
  EXPECT_DEATH(s->irecv(host_view(v), 0), "group of one has no peer");
  EXPECT_DEATH(s->all_gather(host_view(v), host_view(small)), "expected out to have 4 elements, got 3");
  EXPECT_DEATH(s->broadcast(host_view(v), 1), "expected root 0");
  std::vector<double> d(4);
  EXPECT_DEATH(s->all_to_all(host_view(v), host_view(d)), "expected in and out of the same dtype, got fp32 and fp64");
  EXPECT_DEATH(s->all_to_all_v(host_view(v), {5}, host_view(small), {5}), "send 5 of in's 4 elements");
  EXPECT_DEATH(s->all_to_all_v(host_view(v), {1, 1}, host_view(small), {1, 1}), "one send and one receive count per rank");
  EXPECT_DEATH(s->all_to_all_v(host_view(v), {2}, host_view(v), {2}), "in and out overlap");
  EXPECT_DEATH(make_group({0, 1}, "tp"), "expected members \\[0\\] or none");
  // Without MPI, abort_job is a flushed exit with the code.
  EXPECT_EXIT(abort_job(3), ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace mt::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--expect-world=", 0) == 0) mt::comm::g_expect_world = std::stoi(a.substr(15));
    else if (a.rfind("--expect-mpi=", 0) == 0) mt::comm::g_expect_mpi = std::stoi(a.substr(13));
    else {
      std::fprintf(stderr, "comm_test: unknown argument %s (expected --expect-world=N or --expect-mpi=0|1)\n", argv[i]);
      return 2;
    }
  }
  return mt::test::run_all_tests_with_mpi("comm_test");
}
