// comm/communicator.h's GPU side. In every CUDA build: select_local_device
// (local rank -> GPU). With NCCL (MT_HAVE_NCCL): init_nccl, NCCL groups
// bootstrapped over MPI, and NcclCommunicator, the collectives on CUDA
// tensors, all queued on the rank's one stream (cuda::stream()).
//
// Point to point is deferred: isend/irecv wait in pending_ and start together,
// in one ncclGroupStart/End, with the next operation of the communicator or at
// the first wait()/test() of any of them. NCCL serialises a communicator's
// operations, so an isend started alone would block the stream until the
// peer's matching receive runs; two ranks doing "isend to the other, then
// recv from it" (1F1B's steady state) would then wait on each other forever.
// In one group the send and the receive progress together.
//
// Work completion is a CUDA event recorded after the operation; wait() polls
// it and NCCL's asynchronous error state, so a communicator that NCCL reports
// broken ends the job instead of hanging in cudaEventSynchronize.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <mpi.h>
#ifdef MT_HAVE_NCCL
#include <nccl.h>
#endif

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "comm/communicator.h"
#include "core/cuda/check.cuh"
#include "core/sim_device.h"

namespace mt::comm {

namespace {

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// A non-negative decimal environment variable.
bool env_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > INT_MAX) return false;
  *out = static_cast<int>(x);
  return true;
}

// This process among the processes of its node.
struct NodeRanks {
  int local_rank = 0, local_size = 1;
  const char* source = "a single process without MPI";
};

// OpenMPI's environment, else (MPI active) the shared-memory split of the
// world, which is collective over the world.
NodeRanks node_ranks() {
  NodeRanks n;
  int lr = 0, ls = 0;
  if (env_int("OMPI_COMM_WORLD_LOCAL_RANK", &lr) && env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &ls) && lr < ls) {
    n.local_rank = lr;
    n.local_size = ls;
    n.source = "OMPI_COMM_WORLD_LOCAL_RANK/SIZE";
    return n;
  }
  if (mpi_active()) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &n.local_rank);
    MPI_Comm_size(node, &n.local_size);
    MPI_Comm_free(&node);
    n.source = "MPI_COMM_TYPE_SHARED";
  }
  return n;
}

// This rank's device, or -1 with the reason in *why.
int pick_device(const NodeRanks& n, bool allow_shared, std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    *why = fmt::format("no usable GPU on this node ({}: {})", cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
  }
  if (count <= 0) {
    *why = "no GPU on this node (the driver reports none)";
    return -1;
  }
  if (n.local_size > count && !allow_shared) {
    *why = fmt::format(
        "{} ranks run on this node (from {}) but it has {} GPU{}, and each rank needs a GPU of its own: start at "
        "most {} rank{} per node (e.g. mpirun -npernode {}), or ask explicitly for shared GPUs",
        n.local_size, n.source, count, count == 1 ? "" : "s", count, count == 1 ? "" : "s", count);
    return -1;
  }
  return n.local_rank % count;
}

}  // namespace

int select_local_device(bool allow_shared) {
  if (simdev::enabled()) return 0;  // the simulated GPU: nothing to select
  MT_CHECK(mpi_active() || !launched_by_mpi(),
           "select_local_device: this process was started by mpirun but MPI is not initialised; call "
           "comm::init_mpi() first");
  std::string why;
  const int dev = pick_device(node_ranks(), allow_shared, &why);
  MT_CHECK(dev >= 0, "select_local_device: " + why);
  ::mt::cuda::set_device(dev);
  return dev;
}

#ifdef MT_HAVE_NCCL

namespace {

int g_device = -1;  // this rank's GPU, once init_nccl has chosen it

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
  }
  MT_CHECK(false, "NCCL: unknown dtype");
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  MT_CHECK(false, "NCCL: unknown reduce op");
  return ncclSum;
}

cudaStream_t rank_stream() { return static_cast<cudaStream_t>(::mt::cuda::stream_handle()); }

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// Prints what failed, where and on which group, then ends every rank of the
// job: the peers may be inside a collective that can no longer complete.
[[noreturn]] void nccl_failed(const char* file, int line, const char* call, ncclResult_t r, ncclComm_t comm,
                              const std::string& group, int rank, int size) {
  const char* last = ncclGetLastError(comm);
  std::fprintf(stderr, "[rank %d] NCCL error at %s:%d: `%s` failed on %s (group rank %d of %d): %s (%d)%s%s; "
               "ending the job\n",
               world_rank(), file, line, call, group.c_str(), rank, size, ncclGetErrorString(r), static_cast<int>(r),
               last && *last ? "; NCCL says: " : "", last ? last : "");
  std::fflush(stderr);
  abort_job(1);
}

// A call during bootstrap, before the communicator exists.
#define MT_NCCL_BOOT_CHECK(group, rank, size, call)                                                    \
  do {                                                                                                 \
    ncclResult_t _r = (call);                                                                          \
    if (_r != ncclSuccess) nccl_failed(__FILE__, __LINE__, #call, _r, nullptr, (group), (rank), (size)); \
  } while (0)

// A call on a communicator's Core.
#define MT_NCCL_CHECK(core, call)                                         \
  do {                                                                    \
    ncclResult_t _r = (call);                                             \
    if (_r != ncclSuccess) (core).failed(__FILE__, __LINE__, #call, _r); \
  } while (0)

// Completion of one operation: an event recorded on the stream after it.
// launched is false while a deferred isend/irecv waits in Core::pending.
struct Launch {
  Launch() { MT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~Launch() {
    if (event) (void)cudaEventDestroy(event);  // released once the event completes
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  void record(cudaStream_t s) {
    MT_CUDA_CHECK(cudaEventRecord(event, s));
    launched = true;
  }
  cudaEvent_t event = nullptr;
  bool launched = false;
};

// One ncclSend or ncclRecv. launch is null for a blocking send/recv.
struct P2P {
  bool send = false;
  void* data = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;
  std::shared_ptr<Launch> launch;
};

// The NCCL communicator and what its Works need after the Communicator may be
// gone (they hold it weakly). Owned by one NcclCommunicator.
struct Core {
  Core() = default;
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  ncclComm_t comm = nullptr;
  std::string name;
  int rank = 0, size = 1, device = 0;
  std::vector<P2P> pending;  // deferred isend/irecv, in issue order
  bool error_seen = false;

  ~Core() {
    if (!comm) return;
    ncclResult_t a = ncclSuccess;
    (void)ncclCommGetAsyncError(comm, &a);
    if (error_seen || (a != ncclSuccess && a != ncclInProgress)) {
      (void)ncclCommAbort(comm);
      return;
    }
    MT_NCCL_CHECK(*this, ncclCommFinalize(comm));
    // A blocking communicator is quiescent when finalize returns; a
    // nonblocking one reports ncclInProgress until then.
    do {
      MT_NCCL_CHECK(*this, ncclCommGetAsyncError(comm, &a));
      if (a == ncclInProgress) std::this_thread::yield();
    } while (a == ncclInProgress);
    if (a != ncclSuccess) failed(__FILE__, __LINE__, "ncclCommFinalize (asynchronous)", a);
    MT_NCCL_CHECK(*this, ncclCommDestroy(comm));
  }

  [[noreturn]] void failed(const char* file, int line, const char* call, ncclResult_t r) {
    error_seen = true;
    nccl_failed(file, line, call, r, comm, name, rank, size);
  }

  // An error NCCL found in an operation already queued (a peer's network
  // failure, a timeout, ...): ends the job.
  void check_async() {
    ncclResult_t a = ncclSuccess;
    MT_NCCL_CHECK(*this, ncclCommGetAsyncError(comm, &a));
    if (a != ncclSuccess && a != ncclInProgress) failed(__FILE__, __LINE__, "an earlier NCCL operation", a);
  }

  // Starts every deferred isend/irecv and `extra` (a blocking send/recv, or
  // null) in one group, then marks the deferred ones launched. Zero-element
  // transfers are not issued: both sides skip them, their counts being equal.
  void flush(const P2P* extra) {
    if (pending.empty() && extra == nullptr) return;
    cudaStream_t s = rank_stream();
    MT_NCCL_CHECK(*this, ncclGroupStart());
    for (const P2P& p : pending) issue(p, s);
    if (extra) issue(*extra, s);
    MT_NCCL_CHECK(*this, ncclGroupEnd());
    for (P2P& p : pending) p.launch->record(s);
    pending.clear();
  }

  void issue(const P2P& p, cudaStream_t s) {
    if (p.count == 0) return;
    if (p.send) {
      MT_NCCL_CHECK(*this, ncclSend(p.data, p.count, p.type, p.peer, comm, s));
    } else {
      MT_NCCL_CHECK(*this, ncclRecv(p.data, p.count, p.type, p.peer, comm, s));
    }
  }
};

// Waits on the host for `ev`, checking the communicator's asynchronous errors
// while it waits (when the communicator still exists).
void wait_event(cudaEvent_t ev, const std::weak_ptr<Core>& core) {
  for (int spin = 0;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) ::mt::cuda::cuda_failed(__FILE__, __LINE__, "cudaEventQuery (NCCL Work)", e);
    (void)cudaGetLastError();  // "not ready" is no error; keep it from later launch checks
    if (auto c = core.lock()) c->check_async();
    if (spin < 1000) {  // short operations: stay on the core
      ++spin;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// Device scratch ordered on the stream: allocated before the operations that
// use it are queued and freed after them, so no host wait is needed.
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t s) : s_(s) { MT_CUDA_CHECK(cudaMallocAsync(&p_, bytes, s_)); }
  ~StreamScratch() {
    if (p_) MT_CUDA_CHECK(cudaFreeAsync(p_, s_));
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  cudaStream_t s_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Launch> launch, std::weak_ptr<Core> core)
      : launch_(std::move(launch)), core_(std::move(core)) {}
  ~NcclWork() override { wait(); }

  void wait() override {
    if (done_) return;
    start();
    wait_event(launch_->event, core_);
    done_ = true;
  }

  bool test() override {
    if (done_) return true;
    start();
    cudaError_t e = cudaEventQuery(launch_->event);
    if (e == cudaSuccess) {
      done_ = true;
    } else if (e != cudaErrorNotReady) {
      ::mt::cuda::cuda_failed(__FILE__, __LINE__, "cudaEventQuery (NCCL Work)", e);
    } else {
      (void)cudaGetLastError();
      if (auto c = core_.lock()) c->check_async();
    }
    return done_;
  }

 private:
  // A deferred isend/irecv starts now (with every other one waiting).
  void start() {
    if (launch_->launched) return;
    std::shared_ptr<Core> c = core_.lock();
    // The communicator's destructor starts everything deferred.
    MT_CHECK(c != nullptr, "NCCL Work: a deferred isend/irecv outlived its communicator unstarted");
    c->flush(nullptr);
  }

  std::shared_ptr<Launch> launch_;
  std::weak_ptr<Core> core_;
  bool done_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::vector<int> members, std::string name, int rank, int device)
      : members_(std::move(members)), core_(std::make_shared<Core>()) {
    core_->comm = comm;
    core_->name = std::move(name);
    core_->rank = rank;
    core_->size = static_cast<int>(members_.size());
    core_->device = device;
    // [0]: all_reduce_scalar and barrier; [1, size]: all_gather_scalar.
    scalar_ = ::mt::cuda::device_malloc(sizeof(double) * (1 + members_.size()),
                                        "NCCL scalars (all_reduce_scalar, all_gather_scalar, barrier)");
  }

  ~NcclCommunicator() override {
    if (!core_->error_seen) {  // else the job is ending: abort, never wait
      core_->flush(nullptr);
      Launch done;  // everything queued so far, ours included
      done.record(rank_stream());
      wait_event(done.event, core_);
      ::mt::cuda::device_free(scalar_);
    }
    core_.reset();  // finalizes and destroys the NCCL communicator (aborts it after an error)
  }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  const std::vector<int>& members() const override { return members_; }
  std::string name() const override { return core_->name; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    reduce("all_reduce", t, op);
    record(&CommStats::all_reduce_bytes, t.nbytes());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    gather("all_gather", in, out);
    record(&CommStats::all_gather_bytes, out.nbytes());
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    scatter("reduce_scatter", in, out, op);
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t, Device::kCuda);
    MT_CHECK(root >= 0 && root < size(), fmt::format("broadcast on {}: expected a root among ranks 0..{}, got {}",
                                                     name(), size() - 1, root));
    begin();
    if (t.numel() > 0) {
      MT_NCCL_CHECK(*core_, ncclBroadcast(t.data(), t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                          root, core_->comm, rank_stream()));
    }
    record(&CommStats::broadcast_bytes, t.nbytes());
  }

  // Blocking send/recv start in one group with every deferred isend/irecv.
  void send(const Tensor& t, int peer, int tag) override {
    P2P op = p2p_args("send", t, peer, tag, /*send=*/true);
    core_->check_async();
    core_->flush(&op);
    record(&CommStats::p2p_bytes, t.nbytes());
  }

  void recv(const Tensor& t, int peer, int tag) override {
    P2P op = p2p_args("recv", t, peer, tag, /*send=*/false);
    core_->check_async();
    core_->flush(&op);
    record(&CommStats::p2p_bytes, t.nbytes());
  }

  std::unique_ptr<Work> isend(const Tensor& t, int peer, int tag) override {
    return defer(p2p_args("isend", t, peer, tag, /*send=*/true), t.nbytes());
  }

  std::unique_ptr<Work> irecv(const Tensor& t, int peer, int tag) override {
    return defer(p2p_args("irecv", t, peer, tag, /*send=*/false), t.nbytes());
  }

  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_tensor("all_to_all", in, Device::kCuda);
    check_tensor("all_to_all", out, Device::kCuda);
    check_same_dtype("all_to_all", in, out);
    check_numel("all_to_all", "out", out, in.numel());
    const int64_t block = block_of("all_to_all", in);
    begin();
    if (block > 0) {
      cudaStream_t s = rank_stream();
      const size_t bb = static_cast<size_t>(block) * dtype_size(in.dtype());
      // In place or overlapping: send from a copy of in.
      std::unique_ptr<StreamScratch> copy;
      const char* src = static_cast<const char*>(in.data());
      if (overlaps(in, out)) {
        copy = std::make_unique<StreamScratch>(in.nbytes(), s);
        MT_CUDA_CHECK(cudaMemcpyAsync(copy->get(), in.data(), in.nbytes(), cudaMemcpyDeviceToDevice, s));
        src = static_cast<const char*>(copy->get());
      }
      char* dst = static_cast<char*>(out.data());
      const int r = rank(), n = size();
      const ncclDataType_t type = nccl_type(in.dtype());
      // This rank's own block is a local copy (src and out are disjoint here).
      MT_CUDA_CHECK(cudaMemcpyAsync(dst + static_cast<size_t>(r) * bb, src + static_cast<size_t>(r) * bb, bb,
                                    cudaMemcpyDeviceToDevice, s));
      if (n > 1) {
        MT_NCCL_CHECK(*core_, ncclGroupStart());
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;
          const size_t off = static_cast<size_t>(j) * bb;
          MT_NCCL_CHECK(*core_, ncclSend(src + off, static_cast<size_t>(block), type, j, core_->comm, s));
          MT_NCCL_CHECK(*core_, ncclRecv(dst + off, static_cast<size_t>(block), type, j, core_->comm, s));
        }
        MT_NCCL_CHECK(*core_, ncclGroupEnd());
      }
    }
    record(&CommStats::all_to_all_bytes, in.nbytes());
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    check_tensor("all_to_all_v", in, Device::kCuda);
    check_tensor("all_to_all_v", out, Device::kCuda);
    const int64_t sent = check_all_to_all_v("all_to_all_v", in, send_counts, out, recv_counts);
    const int r = rank(), n = size();
    MT_CHECK(send_counts[static_cast<size_t>(r)] == recv_counts[static_cast<size_t>(r)],
             fmt::format("all_to_all_v on {}: this rank sends itself {} elements but expects {}", name(),
                         send_counts[static_cast<size_t>(r)], recv_counts[static_cast<size_t>(r)]));
    begin();
    cudaStream_t s = rank_stream();
    const size_t es = dtype_size(in.dtype());
    const char* src = static_cast<const char*>(in.data());
    char* dst = static_cast<char*>(out.data());
    std::vector<size_t> so(static_cast<size_t>(n) + 1, 0), ro(static_cast<size_t>(n) + 1, 0);
    for (int j = 0; j < n; ++j) {
      so[static_cast<size_t>(j) + 1] = so[static_cast<size_t>(j)] + static_cast<size_t>(send_counts[static_cast<size_t>(j)]);
      ro[static_cast<size_t>(j) + 1] = ro[static_cast<size_t>(j)] + static_cast<size_t>(recv_counts[static_cast<size_t>(j)]);
    }
    // This rank's own block is a local copy.
    if (send_counts[static_cast<size_t>(r)] > 0)
      MT_CUDA_CHECK(cudaMemcpyAsync(dst + ro[static_cast<size_t>(r)] * es, src + so[static_cast<size_t>(r)] * es,
                                    static_cast<size_t>(send_counts[static_cast<size_t>(r)]) * es,
                                    cudaMemcpyDeviceToDevice, s));
    if (n > 1) {
      const ncclDataType_t type = nccl_type(in.dtype());
      MT_NCCL_CHECK(*core_, ncclGroupStart());
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        const auto J = static_cast<size_t>(j);
        if (send_counts[J] > 0)
          MT_NCCL_CHECK(*core_, ncclSend(src + so[J] * es, static_cast<size_t>(send_counts[J]), type, j, core_->comm, s));
        if (recv_counts[J] > 0)
          MT_NCCL_CHECK(*core_, ncclRecv(dst + ro[J] * es, static_cast<size_t>(recv_counts[J]), type, j, core_->comm, s));
      }
      MT_NCCL_CHECK(*core_, ncclGroupEnd());
    }
    record(&CommStats::all_to_all_bytes, static_cast<size_t>(sent) * es);
  }

  // An all-reduce of one int, then a host wait: every member has reached it.
  void barrier() override {
    begin();
    cudaStream_t s = rank_stream();
    MT_CUDA_CHECK(cudaMemsetAsync(scalar_, 0, sizeof(int32_t), s));
    MT_NCCL_CHECK(*core_, ncclAllReduce(scalar_, scalar_, 1, ncclInt32, ncclSum, core_->comm, s));
    Launch done;
    done.record(s);
    wait_event(done.event, core_);
  }

  std::unique_ptr<Work> iall_reduce(const Tensor& t, ReduceOp op) override {
    reduce("iall_reduce", t, op);
    record(&CommStats::all_reduce_bytes, t.nbytes());
    return started();
  }

  std::unique_ptr<Work> ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    scatter("ireduce_scatter", in, out, op);
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
    return started();
  }

  std::unique_ptr<Work> iall_gather(const Tensor& in, const Tensor& out) override {
    gather("iall_gather", in, out);
    record(&CommStats::all_gather_bytes, out.nbytes());
    return started();
  }

  // Through the device scalar: host -> device, all-reduce, wait, device -> host.
  double all_reduce_scalar(double v, ReduceOp op) override {
    begin();
    cudaStream_t s = rank_stream();
    MT_CUDA_CHECK(cudaMemcpyAsync(scalar_, &v, sizeof(double), cudaMemcpyHostToDevice, s));
    MT_NCCL_CHECK(*core_, ncclAllReduce(scalar_, scalar_, 1, ncclFloat64, nccl_op(op), core_->comm, s));
    Launch done;
    done.record(s);
    wait_event(done.event, core_);
    double out = 0;
    MT_CUDA_CHECK(cudaMemcpyAsync(&out, scalar_, sizeof(double), cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    record(&CommStats::all_reduce_bytes, sizeof(double));
    return out;
  }

  std::vector<double> all_gather_scalar(double v) override {
    begin();
    cudaStream_t s = rank_stream();
    double* d = static_cast<double*>(scalar_);
    MT_CUDA_CHECK(cudaMemcpyAsync(d, &v, sizeof(double), cudaMemcpyHostToDevice, s));
    MT_NCCL_CHECK(*core_, ncclAllGather(d, d + 1, 1, ncclFloat64, core_->comm, s));
    Launch done;
    done.record(s);
    wait_event(done.event, core_);
    std::vector<double> out(static_cast<size_t>(size()));
    MT_CUDA_CHECK(cudaMemcpyAsync(out.data(), d + 1, sizeof(double) * out.size(), cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    record(&CommStats::all_gather_bytes, sizeof(double) * out.size());
    return out;
  }

 private:
  // Before queueing anything: the right device, no asynchronous error, and
  // every deferred isend/irecv started (they were issued first).
  void begin() {
    const int dev = ::mt::cuda::current_device();
    MT_CHECK(dev == core_->device, fmt::format("{}: the current CUDA device is {}, but this communicator was made on "
                                               "device {} (the rank's GPU from init_nccl)",
                                               name(), dev, core_->device));
    core_->check_async();
    core_->flush(nullptr);
  }

  void reduce(const char* call, const Tensor& t, ReduceOp op) {
    check_tensor(call, t, Device::kCuda);
    begin();
    if (t.numel() == 0) return;
    MT_NCCL_CHECK(*core_, ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                        nccl_op(op), core_->comm, rank_stream()));
  }

  // NCCL's in place is `in` at out's own block; `in` overlapping out
  // anywhere else is gathered from a copy.
  void gather(const char* call, const Tensor& in, const Tensor& out) {
    check_tensor(call, in, Device::kCuda);
    check_tensor(call, out, Device::kCuda);
    check_same_dtype(call, in, out);
    check_numel(call, "out (size() x in.numel())", out, static_cast<int64_t>(size()) * in.numel());
    begin();
    if (in.numel() == 0) return;
    cudaStream_t s = rank_stream();
    const char* own = static_cast<const char*>(out.data()) + static_cast<size_t>(rank()) * in.nbytes();
    const void* send = in.data();
    std::unique_ptr<StreamScratch> copy;
    if (in.data() != own && overlaps(in, out)) {
      copy = std::make_unique<StreamScratch>(in.nbytes(), s);
      MT_CUDA_CHECK(cudaMemcpyAsync(copy->get(), in.data(), in.nbytes(), cudaMemcpyDeviceToDevice, s));
      send = copy->get();
    }
    MT_NCCL_CHECK(*core_, ncclAllGather(send, out.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()),
                                        core_->comm, s));
  }

  // NCCL's in place is out at in's block rank(); out overlapping in anywhere
  // else receives through a scratch block.
  void scatter(const char* call, const Tensor& in, const Tensor& out, ReduceOp op) {
    check_tensor(call, in, Device::kCuda);
    check_tensor(call, out, Device::kCuda);
    check_same_dtype(call, in, out);
    const int64_t block = block_of(call, in);
    check_numel(call, "out (in.numel() / size())", out, block);
    begin();
    if (block == 0) return;
    cudaStream_t s = rank_stream();
    const ncclDataType_t type = nccl_type(in.dtype());
    const char* own = static_cast<const char*>(in.data()) + static_cast<size_t>(rank()) * out.nbytes();
    if (out.data() == own || !overlaps(in, out)) {
      MT_NCCL_CHECK(*core_, ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(block), type, nccl_op(op),
                                              core_->comm, s));
      return;
    }
    StreamScratch tmp(out.nbytes(), s);
    MT_NCCL_CHECK(*core_, ncclReduceScatter(in.data(), tmp.get(), static_cast<size_t>(block), type, nccl_op(op),
                                            core_->comm, s));
    MT_CUDA_CHECK(cudaMemcpyAsync(out.data(), tmp.get(), out.nbytes(), cudaMemcpyDeviceToDevice, s));
  }

  P2P p2p_args(const char* call, const Tensor& t, int peer, int tag, bool send) const {
    check_tensor(call, t, Device::kCuda);
    check_peer(call, peer, tag);  // tags do not match messages (see communicator.h)
    P2P op;
    op.send = send;
    op.data = t.data();
    op.count = static_cast<size_t>(t.numel());
    op.type = nccl_type(t.dtype());
    op.peer = peer;
    return op;
  }

  std::unique_ptr<Work> defer(P2P op, size_t bytes) {
    const int dev = ::mt::cuda::current_device();
    MT_CHECK(dev == core_->device, fmt::format("{}: the current CUDA device is {}, but this communicator was made on "
                                               "device {}", name(), dev, core_->device));
    core_->check_async();
    op.launch = std::make_shared<Launch>();
    std::shared_ptr<Launch> launch = op.launch;
    core_->pending.push_back(std::move(op));
    record(&CommStats::p2p_bytes, bytes);
    return std::make_unique<NcclWork>(std::move(launch), core_);
  }

  // A Work for what was just queued.
  std::unique_ptr<Work> started() {
    auto launch = std::make_shared<Launch>();
    launch->record(rank_stream());
    return std::make_unique<NcclWork>(std::move(launch), core_);
  }

  std::vector<int> members_;
  std::shared_ptr<Core> core_;
  void* scalar_ = nullptr;  // 1 + size() doubles on the device (see the constructor)
};

}  // namespace

Status init_nccl(bool allow_shared_gpus) {
  if (simdev::enabled())
    return Status::invalid("init_nccl: MT_SIMULATE_CUDA=1 simulates the GPU on the host, and NCCL needs real GPUs");
  if (launched_by_mpi() && !mpi_active())
    return Status::internal("init_nccl: this process was started by mpirun but MPI is not initialised; call "
                            "comm::init_mpi() first (and not after finalize_mpi())");
  if (g_device >= 0) return Status::ok();
  std::string why;
  const int dev = pick_device(node_ranks(), allow_shared_gpus, &why);
  if (dev < 0) return Status::invalid("init_nccl: " + why);
  ::mt::cuda::set_device(dev);
  g_device = dev;
  return Status::ok();
}

std::unique_ptr<Communicator> nccl_world_communicator() {
  std::vector<int> all(static_cast<size_t>(world_size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return make_nccl_group(all, "world");
}

std::unique_ptr<Communicator> make_nccl_group(const std::vector<int>& members, const std::string& name) {
  const std::string wanted = group_name(name, members);
  MT_CHECK(g_device >= 0, fmt::format("make_nccl_group {}: NCCL is not initialised; call comm::init_nccl() first "
                                      "(after comm::init_mpi())",
                                      wanted));
  // The MPI group of the same members checks the lists (collective over the
  // world, like make_group) and carries the id from the first member.
  std::unique_ptr<Communicator> boot = make_group(members, name);
  if (!boot) return nullptr;
  ::mt::cuda::set_device(g_device);
  const int rank = boot->rank(), size = boot->size();
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0, "ncclUniqueId travels as int64 words");
  alignas(int64_t) ncclUniqueId id{};
  if (rank == 0) MT_NCCL_BOOT_CHECK(wanted, rank, size, ncclGetUniqueId(&id));
  boot->broadcast(Tensor(&id, Shape{static_cast<int64_t>(sizeof(id) / sizeof(int64_t))}, DType::kI64), 0);
  // Blocking whatever NCCL_COMM_BLOCKING says: every call here expects it.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  MT_NCCL_BOOT_CHECK(wanted, rank, size, ncclCommInitRankConfig(&comm, size, id, rank, &config));
  return std::make_unique<NcclCommunicator>(comm, boot->members(), wanted, rank, g_device);
}

#endif  // MT_HAVE_NCCL

}  // namespace mt::comm
