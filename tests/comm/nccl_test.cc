// The NCCL communicator (comm/nccl.cc) on CUDA tensors: every collective and
// dtype against closed-form values (element i of rank r is r*A + i), in place
// and overlapping buffers, point to point in issue order (NCCL has no tags)
// including the 1F1B "isend then recv" pattern on both sides at once, the
// asynchronous variants, stats, the scalar, barrier, groups from
// make_nccl_group, and the argument checks. Runs under mpirun with 1 and 2
// ranks (one GPU per rank) and alone; its own main initialises MPI, and a
// gtest Environment starts NCCL and makes the world group once.
//
// Every case skips, saying why, when this build has no NCCL communicator, the
// node has no usable GPU, or it runs more ranks than it has GPUs (the ranks
// agree over MPI first, so none enters a collective alone).
//
// Flag after the gtest ones: --expect-world=N (the world size the launcher
// promised), so a broken launch fails instead of passing N times at size 1.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../support/comm_values.h"
#include "../support/mpi_test.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "core/cuda/runtime.h"
#include "core/device.h"
#include "core/sim_device.h"

namespace mt::comm {
namespace {

using namespace ::mt::comm::test;  // NOLINT: the shared value helpers

int g_expect_world = -1;  // -1: not checked
std::unique_ptr<Communicator> g_world;  // the NCCL world, when every rank started NCCL
std::string g_skip = "the test environment did not run";

#define MT_REQUIRE_NCCL()                                              \
  do {                                                                 \
    if (!g_world) GTEST_SKIP() << "NCCL test skipped: " << g_skip;     \
  } while (0)

class NcclEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
#ifdef MT_HAVE_NCCL
    Status st = init_nccl();
    const bool ok = st.is_ok();
    // Agree over MPI (a self communicator without it) before any NCCL
    // collective: a rank that cannot start would leave the others waiting.
    auto mpi = world_communicator();
    const bool all_ok = mpi->all_reduce_scalar(ok ? 1.0 : 0.0, ReduceOp::kMin) == 1.0;
    if (all_ok) {
      g_world = nccl_world_communicator();
      return;
    }
    g_skip = ok ? "another rank could not start NCCL (its skip message says why)" : st.message();
#else
    g_skip = "this build has no NCCL communicator (no CUDA compiler, or nccl.h / libnccl not found at configure time)";
#endif
  }
  void TearDown() override { g_world.reset(); }
};

// ---- device buffers ----

Arena gpu_arena() { return Arena(size_t{32} << 20, "nccl test", Device::kCuda); }

// A device copy of v, shaped [rows, v.size() / rows].
template <typename T>
Tensor to_dev(Arena& a, std::vector<T>& v, int64_t rows = 0) {  // rows 0: one dimension; else [rows, n / rows]
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor d = a.alloc(rows == 0 ? Shape{n} : Shape{rows, n / rows}, dtype_of<T>());
  copy_tensor(host_view(v).view(d.shape()), d);
  return d;
}

// The device tensor's elements (waits for the stream).
template <typename T>
std::vector<T> to_host(const Tensor& d) {
  std::vector<T> v(static_cast<size_t>(d.numel()));
  copy_tensor(d, Tensor(v.data(), d.shape(), d.dtype()));
  return v;
}

template <typename T>
std::vector<T> filled(size_t n, double x) {
  return std::vector<T>(n, val<T>(x));
}

// ---- the runtime ----

TEST(NcclRuntime, WorldAndDevice) {
  MT_REQUIRE_NCCL();
  const int N = world_size();
  if (g_expect_world >= 0) { EXPECT_EQ(N, g_expect_world); }
  EXPECT_EQ(g_world->size(), N);
  EXPECT_EQ(g_world->rank(), world_rank());
  std::vector<int> all(N);
  for (int i = 0; i < N; ++i) all[i] = i;
  EXPECT_EQ(g_world->members(), all);
  EXPECT_EQ(g_world->name(), group_name("world", all));
#ifdef MT_HAVE_NCCL
  EXPECT_TRUE(init_nccl().is_ok()) << "init_nccl is idempotent";
  const int dev = cuda::current_device();
  EXPECT_EQ(select_local_device(), dev) << "the same local rank picks the same GPU";
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (lr) { EXPECT_EQ(dev, std::atoi(lr) % backend_info().cuda_devices); }
#endif
  g_world->barrier();
  g_world->barrier();
}

// ---- collectives over the world, every dtype ----

template <typename T>
class NcclCollective : public ::testing::Test {};
using AllTypes = ::testing::Types<float, double, int32_t, int64_t, bf16>;
TYPED_TEST_SUITE(NcclCollective, AllTypes, TypeNames);

TYPED_TEST(NcclCollective, AllReduceSumMaxMin) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> v(p.n);
    for (int i = 0; i < p.n; ++i) v[i] = val<T>(r * p.A + i);
    Tensor d = to_dev(a, v);
    w.all_reduce(d, op);
    std::vector<T> got = to_host<T>(d);
    for (int i = 0; i < p.n; ++i)
      EXPECT_EQ(num(got[i]), reduce_closed_form(op, N, p.A, i)) << op_name(op) << " element " << i;
  }
}

TYPED_TEST(NcclCollective, AllGather) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  std::vector<T> in(p.n), out = filled<T>(static_cast<size_t>(N) * p.n, -1);
  for (int i = 0; i < p.n; ++i) in[i] = val<T>(r * p.A + i);
  Tensor din = to_dev(a, in), dout = to_dev(a, out);
  w.all_gather(din, dout);
  std::vector<T> got = to_host<T>(dout), in_after = to_host<T>(din);
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(got[j * p.n + i]), j * p.A + i) << "block " << j << " element " << i;
  for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(in_after[i]), r * p.A + i) << "in must be untouched";
}

TYPED_TEST(NcclCollective, AllGatherInPlaceAndOverlapping) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  // in is out's own block (NCCL's in place), then out's next block (a copy).
  for (int shift : {0, 1}) {
    const int at = (r + shift) % N;
    std::vector<T> buf = filled<T>(static_cast<size_t>(N) * p.n, -1);
    for (int i = 0; i < p.n; ++i) buf[at * p.n + i] = val<T>(r * p.A + i);
    Tensor out = to_dev(a, buf, N);
    w.all_gather(out.slice(at, at + 1), out);
    std::vector<T> got = to_host<T>(out);
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < p.n; ++i)
        EXPECT_EQ(num(got[j * p.n + i]), j * p.A + i) << "in at block " << at << ": block " << j << " element " << i;
  }
}

TYPED_TEST(NcclCollective, ReduceScatter) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> in(static_cast<size_t>(N) * p.n), out = filled<T>(p.n, -1);
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < p.n; ++i) in[j * p.n + i] = val<T>(r * p.A + j * p.B + i);
    Tensor din = to_dev(a, in, N), dout = to_dev(a, out);
    w.reduce_scatter(din, dout, op);
    std::vector<T> got = to_host<T>(dout);
    // Block r of every rank s: s*A + r*B + i.
    for (int i = 0; i < p.n; ++i)
      EXPECT_EQ(num(got[i]), reduce_closed_form(op, N, p.A, r * p.B + i)) << op_name(op) << " element " << i;
    // out = in's own block (NCCL's in place), then in's next block (scratch).
    for (int shift : {0, 1}) {
      const int at = (r + shift) % N;
      Tensor d = to_dev(a, in, N);
      w.reduce_scatter(d, d.slice(at, at + 1), op);
      std::vector<T> all = to_host<T>(d);
      for (int i = 0; i < p.n; ++i)
        EXPECT_EQ(num(all[at * p.n + i]), reduce_closed_form(op, N, p.A, r * p.B + i))
            << op_name(op) << " out at block " << at << " element " << i;
    }
  }
}

TYPED_TEST(NcclCollective, BroadcastFromLastAndFirstRank) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  for (int root : {N - 1, 0}) {
    std::vector<T> v(p.n);
    for (int i = 0; i < p.n; ++i) v[i] = val<T>(r * p.A + i);
    Tensor d = to_dev(a, v);
    w.broadcast(d, root);
    std::vector<T> got = to_host<T>(d);
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(got[i]), root * p.A + i) << "root " << root << " element " << i;
  }
}

TYPED_TEST(NcclCollective, AllToAll) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  std::vector<T> in(static_cast<size_t>(N) * p.n), out = filled<T>(in.size(), -1);
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < p.n; ++i) in[j * p.n + i] = val<T>(r * p.A + j * p.B + i);
  Tensor din = to_dev(a, in), dout = to_dev(a, out);
  w.all_to_all(din, dout);
  std::vector<T> got = to_host<T>(dout);
  // Block s of out is block r of rank s's in.
  for (int s = 0; s < N; ++s)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(got[s * p.n + i]), s * p.A + r * p.B + i) << "block " << s;
  // In place (in == out): the result is as if in was read first.
  w.all_to_all(din, din);
  got = to_host<T>(din);
  for (int s = 0; s < N; ++s)
    for (int i = 0; i < p.n; ++i) EXPECT_EQ(num(got[s * p.n + i]), s * p.A + r * p.B + i) << "in place, block " << s;
}

// Blocks of different sizes, zero-sized ones among them: rank r sends
// (r + 2 j) % 4 elements to rank j; the tail of out past them is untouched.
TYPED_TEST(NcclCollective, AllToAllV) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const Pattern p = pattern<T>();
  Arena a = gpu_arena();
  auto sends = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 4); };
  std::vector<int64_t> sc(N), rc(N);
  int64_t ns = 0, nr = 0;
  for (int j = 0; j < N; ++j) sc[j] = sends(r, j), rc[j] = sends(j, r), ns += sc[j], nr += rc[j];
  std::vector<T> in(static_cast<size_t>(ns) + 1), out = filled<T>(static_cast<size_t>(nr) + 3, -1);
  for (int j = 0, at = 0; j < N; ++j)
    for (int i = 0; i < sc[j]; ++i) in[at++] = val<T>(r * p.A + j * p.B + i);
  Tensor din = to_dev(a, in), dout = to_dev(a, out);
  w.all_to_all_v(din, sc, dout, rc);
  std::vector<T> got = to_host<T>(dout);
  for (int s = 0, at = 0; s < N; ++s)
    for (int i = 0; i < rc[s]; ++i) EXPECT_EQ(num(got[at++]), s * p.A + r * p.B + i) << "from rank " << s;
  for (size_t i = static_cast<size_t>(nr); i < got.size(); ++i) EXPECT_EQ(num(got[i]), -1) << "tail " << i;
}

// Ring: rank r sends to r+1 and receives from r-1 (even ranks send first).
TYPED_TEST(NcclCollective, SendRecvRing) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  if (N == 1) GTEST_SKIP() << "a group of one has no peer";
  const Pattern p = pattern<T>();
  const int n = 5000, right = (r + 1) % N, left = (r + N - 1) % N;
  Arena a = gpu_arena();
  std::vector<T> out(n), in = filled<T>(n, -1);
  for (int i = 0; i < n; ++i) out[i] = val<T>(r * p.A + i % p.n);
  Tensor dout = to_dev(a, out), din = to_dev(a, in);
  if (r % 2 == 0) {
    w.send(dout, right, 1);
    w.recv(din, left, 1);
  } else {
    w.recv(din, left, 1);
    w.send(dout, right, 1);
  }
  std::vector<T> got = to_host<T>(din);
  for (int i = 0; i < n; ++i) ASSERT_EQ(num(got[i]), left * p.A + i % p.n) << "element " << i;
}

// NCCL matches by issue order, not tag: the k-th isend to a peer meets the
// k-th irecv from it. Receives posted before sends, all in flight at once.
TYPED_TEST(NcclCollective, IsendIrecvInIssueOrder) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  if (N == 1) GTEST_SKIP() << "a group of one has no peer";
  const Pattern p = pattern<T>();
  const int n = 3000, right = (r + 1) % N, left = (r + N - 1) % N;
  const int tags[4] = {7, 3, 9, 9};
  Arena a = gpu_arena();
  auto fill = [&](int rank, int k) {
    std::vector<T> v(n);
    for (int i = 0; i < n; ++i) v[i] = val<T>(rank * p.A + (i + k) % p.n);
    return v;
  };
  std::vector<Tensor> sends, recvs;
  for (int k = 0; k < 4; ++k) {
    std::vector<T> s = fill(r, k), z = filled<T>(n, -1);
    sends.push_back(to_dev(a, s));
    recvs.push_back(to_dev(a, z));
  }
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 4; ++k) works.push_back(w.irecv(recvs[k], left, tags[k]));
  for (int k = 0; k < 4; ++k) works.push_back(w.isend(sends[k], right, tags[k]));
  while (!works[0]->test()) {
  }
  EXPECT_TRUE(works[0]->test());  // stays completed
  for (auto& wk : works) wk->wait();
  for (auto& wk : works) wk->wait();  // idempotent
  for (int k = 0; k < 4; ++k) {
    std::vector<T> got = to_host<T>(recvs[k]), want = fill(left, k);
    for (int i = 0; i < n; ++i) ASSERT_EQ(num(got[i]), num(want[i])) << "message " << k << " element " << i;
  }
}

// 1F1B's steady state on every rank at once: isend to the right, then a
// blocking recv from the left. Started one by one on one stream each rank's
// send would wait for a receive queued behind it; the deferred isend joins
// the recv's group instead.
TYPED_TEST(NcclCollective, IsendThenRecvOnEveryRank) {
  MT_REQUIRE_NCCL();
  using T = TypeParam;
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  if (N == 1) GTEST_SKIP() << "a group of one has no peer";
  const Pattern p = pattern<T>();
  const int n = 1 << 16, right = (r + 1) % N, left = (r + N - 1) % N;
  Arena a = gpu_arena();
  for (int round = 0; round < 3; ++round) {
    std::vector<T> s(n), z = filled<T>(n, -1);
    for (int i = 0; i < n; ++i) s[i] = val<T>(r * p.A + (i + round) % p.n);
    Tensor ds = to_dev(a, s), dr = to_dev(a, z);
    auto sw = w.isend(ds, right, round);
    w.recv(dr, left, round);
    sw->wait();
    std::vector<T> got = to_host<T>(dr);
    for (int i = 0; i < n; ++i) ASSERT_EQ(num(got[i]), left * p.A + (i + round) % p.n) << "round " << round << " element " << i;
  }
}

// ---- asynchronous collectives ----

// Two gradient buckets in flight at once (fp32 sum, bf16 max), completed out
// of order; a third whose Work is dropped (the destructor waits).
TEST(NcclAsync, AllReduceBucketsOverlap) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  Arena a = gpu_arena();
  std::vector<float> b1(1000), b3(777);
  std::vector<bf16> b2(3000);
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = static_cast<float>(r * 1000 + i);
  for (size_t i = 0; i < b2.size(); ++i) b2[i] = float_to_bf16(static_cast<float>(r * 16 + i % 16));
  for (size_t i = 0; i < b3.size(); ++i) b3[i] = static_cast<float>(r + 1);
  Tensor d1 = to_dev(a, b1), d2 = to_dev(a, b2), d3 = to_dev(a, b3);
  auto w1 = w.iall_reduce(d1);
  auto w2 = w.iall_reduce(d2, ReduceOp::kMax);
  { auto w3 = w.iall_reduce(d3); }
  while (!w2->test()) {
  }
  w1->wait();
  EXPECT_TRUE(w1->test());
  b1 = to_host<float>(d1), b2 = to_host<bf16>(d2), b3 = to_host<float>(d3);
  for (size_t i = 0; i < b1.size(); ++i) ASSERT_EQ(b1[i], 1000.0 * N * (N - 1) / 2 + N * static_cast<double>(i)) << i;
  for (size_t i = 0; i < b2.size(); ++i) ASSERT_EQ(bf16_to_float(b2[i]), (N - 1) * 16 + i % 16) << i;
  for (size_t i = 0; i < b3.size(); ++i) ASSERT_EQ(b3[i], N * (N + 1) / 2) << i;
}

TEST(NcclAsync, ReduceScatterAndAllGather) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  const int n = 11;
  Arena a = gpu_arena();
  // ireduce_scatter fp64 and bf16.
  std::vector<double> in(static_cast<size_t>(N) * n), out(n);
  std::vector<bf16> hin(static_cast<size_t>(N) * 4), hout(4);
  for (int j = 0; j < N; ++j) {
    for (int i = 0; i < n; ++i) in[j * n + i] = r * 1000 + j * 100 + i;
    for (int i = 0; i < 4; ++i) hin[j * 4 + i] = float_to_bf16(static_cast<float>(r * 16 + j * 4 + i));
  }
  Tensor din = to_dev(a, in), dout = to_dev(a, out), dhin = to_dev(a, hin), dhout = to_dev(a, hout);
  auto wa = w.ireduce_scatter(din, dout);
  auto wb = w.ireduce_scatter(dhin, dhout, ReduceOp::kSum);
  // iall_gather: in place (int64) and out of place (fp32).
  std::vector<int64_t> g(static_cast<size_t>(N) * n, -1);
  for (int i = 0; i < n; ++i) g[r * n + i] = r * 1000 + i;
  std::vector<float> gin(n), gout(static_cast<size_t>(N) * n, -1);
  for (int i = 0; i < n; ++i) gin[i] = static_cast<float>(r * 1000 + i);
  Tensor dg = to_dev(a, g, N), dgin = to_dev(a, gin), dgout = to_dev(a, gout);
  auto wc = w.iall_gather(dg.slice(r, r + 1), dg);
  auto wd = w.iall_gather(dgin, dgout);
  wd->wait(), wc->wait(), wb->wait(), wa->wait();
  out = to_host<double>(dout), hout = to_host<bf16>(dhout), g = to_host<int64_t>(dg), gout = to_host<float>(dgout);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], reduce_closed_form(ReduceOp::kSum, N, 1000, r * 100 + i)) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_float(hout[i]), reduce_closed_form(ReduceOp::kSum, N, 16, r * 4 + i));
  for (int j = 0; j < N; ++j)
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(g[j * n + i], j * 1000 + i) << "in place, block " << j;
      EXPECT_EQ(gout[j * n + i], static_cast<float>(j * 1000 + i)) << "block " << j;
    }
}

// ---- stats: the bytes of each call's largest buffer, as for MPI ----

TEST(NcclStats, ByteCountsAsTheHeaderDefines) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const uint64_t N = static_cast<uint64_t>(w.size());
  const int n = static_cast<int>(N);
  Arena a = gpu_arena();
  auto dev = [&](DType t, int64_t count) { return a.alloc(Shape{count}, t); };
  w.all_reduce_scalar(1.0);
  w.reset_stats();
  EXPECT_EQ(w.stats().calls, 0u);
  EXPECT_EQ(w.stats().bytes, 0u);

  Tensor f10 = dev(DType::kF32, 10);
  w.all_reduce(f10);                                                           // 40
  w.all_gather(dev(DType::kI32, 3), dev(DType::kI32, 3 * n));                  // out: 12 N
  w.reduce_scatter(dev(DType::kF64, 2 * n), dev(DType::kF64, 2));              // in: 16 N
  w.broadcast(dev(DType::kI64, 5), n - 1);                                     // 40
  w.all_to_all(dev(DType::kI32, 2 * n), dev(DType::kI32, 2 * n));              // in: 8 N
  w.iall_reduce(f10)->wait();                                                  // 40
  w.iall_gather(dev(DType::kBF16, 6), dev(DType::kBF16, 6 * n))->wait();       // out: 12 N
  w.ireduce_scatter(dev(DType::kF32, 3 * n), dev(DType::kF32, 3))->wait();     // in: 12 N
  w.barrier();                                                                 // nothing
  w.all_reduce_scalar(2.0);                                                    // 8

  const CommStats& s = w.stats();
  EXPECT_EQ(s.calls, 9u);
  EXPECT_EQ(s.all_reduce_bytes, 40u + 40u + 8u);
  EXPECT_EQ(s.all_gather_bytes, 12 * N + 12 * N);
  EXPECT_EQ(s.reduce_scatter_bytes, 16 * N + 12 * N);
  EXPECT_EQ(s.broadcast_bytes, 40u);
  EXPECT_EQ(s.all_to_all_bytes, 8 * N);
  EXPECT_EQ(s.p2p_bytes, 0u);
  EXPECT_EQ(s.bytes, 88u + 24 * N + 28 * N + 40u + 8 * N);

  if (N == 1) return;
  w.reset_stats();
  const int r = w.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  Tensor f = dev(DType::kF32, 4), g = dev(DType::kF32, 4);
  if (r % 2 == 0) {
    w.send(f, right);
    w.recv(g, left);
  } else {
    w.recv(g, left);
    w.send(f, right);
  }
  Tensor d = dev(DType::kF64, 3), e = dev(DType::kF64, 3);
  auto rw = w.irecv(e, left, 2);
  auto sw = w.isend(d, right, 2);
  sw->wait(), rw->wait();
  EXPECT_EQ(w.stats().calls, 4u);
  EXPECT_EQ(w.stats().p2p_bytes, 16u + 16u + 24u + 24u);
  EXPECT_EQ(w.stats().bytes, 80u);
}

// ---- the scalar, barrier, empty tensors ----

TEST(NcclScalar, AllReduceScalar) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  EXPECT_EQ(w.all_reduce_scalar(r + 1.0), N * (N + 1) / 2.0);
  EXPECT_EQ(w.all_reduce_scalar(r + 1.0, ReduceOp::kMax), N);
  EXPECT_EQ(w.all_reduce_scalar(r + 1.0, ReduceOp::kMin), 1.0);
  EXPECT_EQ(w.all_reduce_scalar(0.25 * (r + 1)), 0.25 * N * (N + 1) / 2.0);
}

TEST(NcclScalar, AllGatherScalarInRankOrder) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  w.reset_stats();
  const std::vector<double> all = w.all_gather_scalar(0.5 * r + 1.0);
  ASSERT_EQ(all.size(), static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], 0.5 * i + 1.0) << "rank " << i;
  EXPECT_EQ(w.stats().all_gather_bytes, sizeof(double) * static_cast<size_t>(N));
  EXPECT_EQ(w.all_reduce_scalar(r + 1.0), N * (N + 1) / 2.0);  // the scalar buffers do not overlap
}

TEST(NcclBarrier, CountsNothingAndOrdersQueuedWork) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  Arena a = gpu_arena();
  std::vector<int32_t> v(1 << 16, r + 1);
  Tensor d = to_dev(a, v);
  w.reset_stats();
  auto work = w.iall_reduce(d);
  w.barrier();  // waits on the host for everything queued before it
  EXPECT_TRUE(work->test());
  EXPECT_EQ(w.stats().calls, 1u);  // the iall_reduce only
  v = to_host<int32_t>(d);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], N * (N + 1) / 2) << i;
}

TEST(NcclEdge, EmptyTensors) {
  MT_REQUIRE_NCCL();
  Communicator& w = *g_world;
  const int N = w.size(), r = w.rank();
  Tensor none(nullptr, Shape{0}, DType::kF32, Device::kCuda);
  w.all_reduce(none);
  w.all_gather(none, none);
  w.reduce_scatter(none, none);
  w.broadcast(none, 0);
  w.all_to_all(none, none);
  w.iall_reduce(none)->wait();
  if (N > 1) {
    auto s = w.isend(none, (r + 1) % N);
    w.recv(none, (r + N - 1) % N);
    s->wait();
  }
  EXPECT_EQ(w.all_reduce_scalar(1.0), N);  // still in step
}

// ---- make_nccl_group ----

#ifdef MT_HAVE_NCCL
TEST(NcclMakeGroup, HalvesAndAnEmptyList) {
  MT_REQUIRE_NCCL();
  const int N = world_size(), r = world_rank();
  Arena a = gpu_arena();
  int half = (N + 1) / 2;
  std::vector<int> members;
  for (int m = (r < half ? 0 : half); m < (r < half ? half : N); ++m) members.push_back(m);
  auto g = make_nccl_group(members, "half");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->members(), members);
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(g->rank(), r - members.front());
  EXPECT_EQ(g->name(), group_name("half", members));
  std::vector<int32_t> v(5);
  for (int i = 0; i < 5; ++i) v[i] = r * 1000 + i;
  Tensor d = to_dev(a, v);
  g->all_reduce(d);
  v = to_host<int32_t>(d);
  for (int i = 0; i < 5; ++i) {
    int32_t expect = 0;
    for (int m : members) expect += m * 1000 + i;
    EXPECT_EQ(v[i], expect) << "element " << i;
  }
  double sum = 0;
  for (int m : members) sum += m + 1;
  EXPECT_EQ(g->all_reduce_scalar(r + 1.0), sum);

  // Rank 0 in no group; the rest together.
  std::vector<int> rest;
  if (r != 0)
    for (int m = 1; m < N; ++m) rest.push_back(m);
  auto h = make_nccl_group(rest, "rest");
  if (r == 0) {
    EXPECT_EQ(h, nullptr);
  } else {
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->members(), rest);
    EXPECT_EQ(h->all_reduce_scalar(1.0), N - 1.0);
  }
  g_world->barrier();
}
#endif

// ---- misuse fails with a message naming the call and the group ----

TEST(NcclDeathTest, MisuseFailsWithAMessage) {
  MT_REQUIRE_NCCL();
  if (launched_by_mpi()) GTEST_SKIP() << "death tests fork; only without mpirun";
  GTEST_FLAG_SET(death_test_style, "fast");  // the child fails its check before touching the GPU
  Communicator& w = *g_world;
  Arena a = gpu_arena();
  std::vector<float> host(4);
  Tensor v = a.alloc(Shape{4}, DType::kF32), small = a.alloc(Shape{3}, DType::kF32);
  Tensor d = a.alloc(Shape{4}, DType::kF64);
  EXPECT_DEATH(w.all_reduce(host_view(host)), "all_reduce on world\\[0\\]: expected a CUDA tensor");
  EXPECT_DEATH(w.iall_gather(v, small), "iall_gather on world\\[0\\]: expected out \\(size\\(\\) x in.numel\\(\\)\\) to have 4 elements, got 3");
  EXPECT_DEATH(w.all_to_all(v, d), "expected in and out of the same dtype, got fp32 and fp64");
  EXPECT_DEATH(w.broadcast(v, 1), "broadcast on world\\[0\\]: expected a root among ranks 0..0, got 1");
  EXPECT_DEATH(w.isend(v, 0), "isend on world\\[0\\]: expected a peer among the other ranks");
  EXPECT_DEATH(w.reduce_scatter(v, small), "expected out \\(in.numel\\(\\) / size\\(\\)\\) to have 4 elements, got 3");
}

// More ranks on a node than GPUs: an error naming both counts. The child is a
// fresh run of this binary (threadsafe style) that believes itself one of
// (GPUs + 1) local ranks.
TEST(NcclDeathTest, MoreLocalRanksThanGpus) {
#ifdef MT_HAVE_NCCL
  if (launched_by_mpi()) GTEST_SKIP() << "death tests fork; only without mpirun";
  const BackendInfo bi = backend_info();
  if (bi.cuda_devices == 0 || simdev::enabled()) GTEST_SKIP() << "needs a real GPU: " << bi.cuda_status;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int gpus = bi.cuda_devices;
  const std::string ranks = std::to_string(gpus + 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", ranks.c_str(), 1);
  EXPECT_DEATH(select_local_device(),
               fmt::format("select_local_device: {} ranks run on this node .* but it has {} GPU", gpus + 1, gpus));
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
#else
  GTEST_SKIP() << "NCCL test skipped: " << g_skip;
#endif
}

}  // namespace
}  // namespace mt::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--expect-world=", 0) == 0) {
      mt::comm::g_expect_world = std::stoi(a.substr(15));
    } else {
      std::fprintf(stderr, "nccl_test: unknown argument %s (expected --expect-world=N)\n", argv[i]);
      return 2;
    }
  }
  ::testing::AddGlobalTestEnvironment(new mt::comm::NcclEnvironment);
  return mt::test::run_all_tests_with_mpi("nccl_test");
}
