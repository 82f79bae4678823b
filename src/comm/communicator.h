#pragma once
// Communicator: the collectives a parallel training step needs, over one
// process group. Implementations: SelfCommunicator (a group of one rank; every
// collective is a copy or nothing), MpiCommunicator (OpenMPI, CPU tensors),
// and NcclCommunicator (comm/nccl.cc: GPU tensors; its differences are listed
// with make_nccl_group below) behind the same interface.
//
// Conventions (all implementations):
// - Collectives are called by every member, in the same order, with tensors
//   of the same dtype and element counts. Tensors are contiguous; shapes do
//   not matter, element counts do. Supported dtypes: fp32, fp64, bf16 (sum is
//   done in fp32 and rounded), int32, int64.
// - Rank numbers passed to or returned by a Communicator are ranks INSIDE
//   the group (0..size()-1); members() maps them to world ranks.
// - Payload bytes: each call adds the bytes of its largest buffer to stats()
//   (all_reduce: t; all_gather: out; reduce_scatter: in; broadcast: t;
//   send/recv: t; all_to_all: in; all_to_all_v: the elements sent). The planner predicts the same quantity,
//   so measured and predicted traffic are comparable number for number.
//   The asynchronous variants count when they start, like their blocking
//   twins; barrier moves no payload and counts nothing (not even a call).
// - Buffers may alias (in place): every implementation gives the result as
//   if the inputs had been read before any output was written.
// - Tensors must be CPU tensors for Self and MPI, CUDA tensors for NCCL; a
//   wrong dtype, count, peer or device is a bug in the caller and fails an
//   MT_CHECK naming the group.
// - Errors inside MPI are fatal (MPI_ERRORS_ARE_FATAL): a failing collective
//   ends the whole job rather than returning, so no rank waits forever.
//
// Thread safety: one thread per Communicator at a time (the caller's).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mt::comm {

enum class ReduceOp { kSum, kMax, kMin };

// What a group has communicated since the last reset (payload bytes, see above).
struct CommStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  uint64_t all_reduce_bytes = 0, all_gather_bytes = 0, reduce_scatter_bytes = 0, broadcast_bytes = 0,
           p2p_bytes = 0, all_to_all_bytes = 0;
};

// An operation in flight. wait() completes it (idempotent); test() makes
// progress and says whether it has completed. Destroying an unfinished Work
// waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // this process inside the group
  virtual int size() const = 0;
  // World ranks of the members, in group-rank order.
  virtual const std::vector<int>& members() const = 0;
  // A short description for logs, e.g. "tp[0,1]".
  virtual std::string name() const = 0;

  // t = op over ranks of t (in place).
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  // out (size() x in.numel() elements) = the ranks' `in` concatenated in rank
  // order. `in` may be out's own block (rank() * in.numel()): in place.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // out (in.numel() / size() elements) = op over ranks of block rank() of `in`.
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  // t on every rank = t on `root`.
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Point to point (pipeline stages). Matching by (peer, tag), FIFO per pair.
  virtual void send(const Tensor& t, int peer, int tag = 0) = 0;
  virtual void recv(const Tensor& t, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> isend(const Tensor& t, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> irecv(const Tensor& t, int peer, int tag = 0) = 0;
  // Block j of `in` goes to rank j; block i of `out` comes from rank i
  // (blocks of in.numel() / size() elements).
  virtual void all_to_all(const Tensor& in, const Tensor& out) = 0;
  // Blocks of any size (expert parallelism's token exchange): `in` holds
  // size() consecutive blocks in rank order, block j of send_counts[j]
  // elements going to rank j; `out` receives recv_counts[i] elements from
  // rank i, consecutive in rank order. Counts are elements (>= 0), one per
  // rank; recv_counts[i] must equal rank i's send_counts[rank()] (exchange
  // the counts first, e.g. with all_to_all); the sums must fit in `in` and
  // `out`, whose remaining elements are neither read nor written. in and out
  // must not overlap.
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                            const std::vector<int64_t>& recv_counts) = 0;
  virtual void barrier() = 0;

  // Asynchronous variants (data-parallel gradient buckets overlap with
  // backward). The tensors must stay alive and untouched until wait().
  virtual std::unique_ptr<Work> iall_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Work> ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Work> iall_gather(const Tensor& in, const Tensor& out) = 0;

  // Convenience: a scalar reduced over the group (fp64), host value in and
  // out. Counts as an all_reduce of 8 bytes. Virtual because a GPU
  // communicator reduces it through a device buffer (and then waits for it).
  virtual double all_reduce_scalar(double v, ReduceOp op = ReduceOp::kSum);
  // Every rank's v, in group-rank order (host values). Counts as an
  // all_gather of 8 x size() bytes. Virtual for the same reason.
  virtual std::vector<double> all_gather_scalar(double v);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  // For implementations (communicator.cc): count one call of `bytes` payload
  // in stats_.*kind and in the totals.
  void record(uint64_t CommStats::*kind, size_t bytes);
  // Argument checks shared by the implementations; each failure names the
  // call, the group and what was expected.
  // t lives on `device` (CPU for Self and MPI; CUDA for NCCL and staged
  // groups) and has memory unless it is empty.
  void check_tensor(const char* call, const Tensor& t, Device device = Device::kCpu) const;
  void check_same_dtype(const char* call, const Tensor& a, const Tensor& b) const;
  void check_numel(const char* call, const char* what, const Tensor& t, int64_t expected) const;
  // in.numel() divisible by size(); returns the block size in.numel() / size().
  int64_t block_of(const char* call, const Tensor& in) const;
  void check_peer(const char* call, int peer, int tag) const;
  // all_to_all_v's arguments: same dtype, one count per rank, none negative,
  // sums within in and out, no overlap. Returns the elements sent.
  int64_t check_all_to_all_v(const char* call, const Tensor& in, const std::vector<int64_t>& send_counts,
                             const Tensor& out, const std::vector<int64_t>& recv_counts) const;

  CommStats stats_;
};

// A group of one: this process alone. name() is "self[<world_rank>]", or
// "<name>[<world_rank>]" with a name (make_group without MPI uses that).
std::unique_ptr<Communicator> make_self_communicator(int world_rank = 0);
std::unique_ptr<Communicator> make_self_communicator(int world_rank, const std::string& name);

// "name[0,1]", or "name[0..7]" for three or more consecutive ranks.
std::string group_name(const std::string& name, const std::vector<int>& members);
// A Work that has already completed (wait and test return at once).
std::unique_ptr<Work> completed_work();

// ---- The MPI runtime (comm/mpi.cc) ----

// True when this process was started by mpirun/mpiexec (OpenMPI's or PMIx's
// environment is present). Single-process runs never initialise MPI.
bool launched_by_mpi();
// MPI_Init_thread (MPI_THREAD_FUNNELED) once; no-op when already initialised.
Status init_mpi();
// MPI_Finalize if initialised and not yet finalised.
void finalize_mpi();
// Ends every rank of the job with `code` (MPI_Abort), or std::exit without MPI.
[[noreturn]] void abort_job(int code);
// World rank and size (0 and 1 without MPI).
int world_rank();
int world_size();

// MPI_COMM_WORLD as a Communicator (a self communicator without MPI).
std::unique_ptr<Communicator> world_communicator();
// Collective over the world: every process calls it with the members (world
// ranks, increasing) of the group IT belongs to; groups partition the world
// or some ranks pass an empty list (they get nullptr). Returns this process's
// group, named group_name(name, members), e.g. make_group({0, 1}, "tp") is
// "tp[0,1]". Without MPI, members must be {0} (or empty).
std::unique_ptr<Communicator> make_group(const std::vector<int>& members, const std::string& name);

// Device tensors over a host communicator (comm/staged.cc), e.g.
// make_staged_group(make_group(members, name)): each call copies its inputs
// from the device into host buffers, runs `host`'s operation on them (its
// asynchronous variant, so isend/irecv and the i* collectives stay
// asynchronous and 1F1B cannot deadlock), and copies the results into the
// device tensors when it completes. Like the NCCL communicator it takes CUDA
// tensors only. Two host copies per call: it is how several ranks train on
// GPUs where NCCL is missing, and how CI trains several ranks on the
// simulated device (MT_SIMULATE_CUDA), never the fast path. Null in, null out.
std::unique_ptr<Communicator> make_staged_group(std::unique_ptr<Communicator> host);

#ifdef MT_HAVE_CUDA
// ---- This rank's GPU (comm/nccl.cc; every CUDA build) ----

// Selects this rank's GPU: the local rank (OMPI_COMM_WORLD_LOCAL_RANK, else the
// rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), which is then collective
// over the world; 0 without MPI) modulo the node's device count. Makes it
// current (cuda::set_device) and returns its index. Fails (MT_CHECK) without a
// usable GPU, and when more ranks run on this node than it has GPUs unless
// allow_shared (then ranks share GPUs round-robin; NCCL refuses two ranks of
// one communicator on one GPU, so that suits only runs without NCCL). With
// MT_SIMULATE_CUDA=1 there is nothing to select: returns 0.
int select_local_device(bool allow_shared = false);
#endif

#ifdef MT_HAVE_NCCL
// ---- The NCCL runtime (comm/nccl.cc; CUDA builds that found NCCL) ----
//
// NcclCommunicator: the collectives above on CUDA tensors of this rank's GPU,
// bootstrapped over MPI (the group's first member makes the ncclUniqueId and
// broadcasts it over an MPI group of the same members). Where it differs:
// - Streams: every operation is queued on the rank's stream (cuda::stream())
//   and returns without waiting; "blocking" calls are ordered before every
//   later kernel, copy and NCCL call of this rank, and a copy to the host
//   sees their result. barrier() and all_reduce_scalar() wait on the host.
//   A Work's wait() blocks the host until the operation has completed on the
//   GPU (checking NCCL's asynchronous errors meanwhile); test() asks.
// - Point to point: NCCL has no tags. A tag must still be >= 0, but matching
//   is by issue order: the k-th send from A to B meets the k-th receive on B
//   from A, so both sides must issue them in the same order, and the counts
//   must agree (NCCL cannot check them). isend/irecv are not started at once:
//   they wait, and start together in one NCCL group with the next operation
//   of this communicator (a blocking send/recv joins that group; any other
//   call starts them first), or at the first wait()/test() of any of them.
//   So "isend to B, then recv from B" on both sides (1F1B) cannot deadlock,
//   whereas two blocking sends issued against each other still do.
// - bf16 sums use NCCL's own bf16 reduction: with 2 ranks that is the fp32
//   sum rounded once; with more, each step of NCCL's algorithm rounds to bf16
//   (deterministic for a given rank count and topology).
// - Errors: a failing NCCL call, or an asynchronous NCCL error seen while
//   waiting, prints the call, group, rank and NCCL's message and ends the
//   whole job (abort_job) rather than leave peers waiting. A rank that dies
//   is not an NCCL error within a node: mpirun ends the job then.
// - Destruction waits for everything queued, then frees the NCCL communicator
//   (ncclCommAbort instead after an asynchronous error). NCCL may synchronise
//   the members of a node in it: destroy a group on all of its members.

// Once per process, after init_mpi() and before any NCCL group: checks that
// this node has a GPU for each of its ranks (else an error naming both counts;
// allow_shared_gpus lifts that, see select_local_device) and selects this
// rank's GPU. Fails on a simulated device (MT_SIMULATE_CUDA). Idempotent.
Status init_nccl(bool allow_shared_gpus = false);
// The world as an NCCL group (collective over the world), named "world[...]".
std::unique_ptr<Communicator> nccl_world_communicator();
// make_group's contract (collective over the world; members = world ranks of
// this process's group, increasing, or empty for none -> nullptr), giving an
// NcclCommunicator named group_name(name, members).
std::unique_ptr<Communicator> make_nccl_group(const std::vector<int>& members, const std::string& name);
#endif

}  // namespace mt::comm
