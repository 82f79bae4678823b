// The MPI runtime (init, finalize, abort, world rank and size, group
// creation) and MpiCommunicator: comm/communicator.h's collectives over an
// MPI_Comm on CPU tensors (OpenMPI 4.1, C API only). bf16 reductions go
// through an fp32 copy: the sum is formed in fp32 and rounded once (to
// nearest even) at the end, as the header promises, independent of the
// reduction tree MPI picks.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "comm/communicator.h"

namespace mt::comm {

namespace {

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// Creating a communicator under mpirun without init_mpi() would silently give
// every rank a world of one.
void require_init(const char* call) {
  MT_CHECK(mpi_active() || !launched_by_mpi(),
           fmt::format("{}: this process was started by mpirun but MPI is not initialised; call "
                       "comm::init_mpi() first (and not after finalize_mpi())",
                       call));
}

// Element type on the wire. bf16 moves as its 16-bit payload; reductions of
// bf16 never use this type (they go through fp32).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kF16: return MPI_UINT16_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// 16-bit (bf16, fp16) reductions go through fp32: widened exactly, summed,
// rounded once.
bool half(DType t) { return t == DType::kBF16 || t == DType::kF16; }

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF16) {
    const auto* h = static_cast<const f16*>(t.data());
    for (size_t i = 0; i < f.size(); ++i) f[i] = f16_to_float(h[i]);
  } else {
    const auto* h = static_cast<const bf16*>(t.data());
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_float(h[i]);
  }
  return f;
}

void from_f32(const std::vector<float>& f, const Tensor& t) {
  if (t.dtype() == DType::kF16) {
    auto* h = static_cast<f16*>(t.data());
    for (size_t i = 0; i < f.size(); ++i) h[i] = float_to_f16(f[i]);
  } else {
    auto* h = static_cast<bf16*>(t.data());
    for (size_t i = 0; i < f.size(); ++i) h[i] = float_to_bf16(f[i]);
  }
}

// An MPI request in flight plus what must outlive it (scratch buffers) and
// what must run once it completes (bf16 results copied back, receive checks).
class MpiWork final : public Work {
 public:
  ~MpiWork() override {
    if (!done_ && mpi_active()) wait();
  }
  void wait() override {
    if (done_) return;
    MPI_Status st;
    MPI_Wait(&req, &st);
    complete(st);
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status st;
    MPI_Test(&req, &flag, &st);
    if (flag) complete(st);
    return done_;
  }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<float> f_in, f_out;    // bf16 reductions in fp32
  std::vector<char> bytes;           // a copy of an input that aliases the output
  std::function<void(const MPI_Status&)> finish;

 private:
  void complete(const MPI_Status& st) {
    done_ = true;
    if (finish) finish(st);
    finish = nullptr;
    f_in = {};
    f_out = {};
    bytes = {};
  }
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, const std::string& name) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(comm_, &group);
    std::vector<int> local(size_);
    for (int i = 0; i < size_; ++i) local[i] = i;
    members_.resize(size_);
    MPI_Group_translate_ranks(group, size_, local.data(), world_group, members_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    name_ = group_name(name, members_);
  }
  ~MpiCommunicator() override {
    if (owned_ && mpi_active()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }
  std::string name() const override { return name_; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor("all_reduce", t);
    int n = count("all_reduce", t.numel());
    if (half(t.dtype())) {
      std::vector<float> f = to_f32(t);
      MPI_Allreduce(MPI_IN_PLACE, f.data(), n, MPI_FLOAT, mpi_op(op), comm_);
      from_f32(f, t);
    } else {
      MPI_Allreduce(MPI_IN_PLACE, t.data(), n, mpi_type(t.dtype()), mpi_op(op), comm_);
    }
    record(&CommStats::all_reduce_bytes, t.nbytes());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    std::vector<char> copy;
    const void* send = gather_args("all_gather", in, out, copy);
    int n = count("all_gather", in.numel());
    MPI_Datatype type = mpi_type(in.dtype());
    MPI_Allgather(send, send == MPI_IN_PLACE ? 0 : n, send == MPI_IN_PLACE ? MPI_DATATYPE_NULL : type, out.data(), n,
                  type, comm_);
    record(&CommStats::all_gather_bytes, out.nbytes());
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    int n = scatter_args("reduce_scatter", in, out);
    if (half(in.dtype())) {
      std::vector<float> fin = to_f32(in), fout(static_cast<size_t>(n));
      MPI_Reduce_scatter_block(fin.data(), fout.data(), n, MPI_FLOAT, mpi_op(op), comm_);
      from_f32(fout, out);
    } else if (overlaps(in, out)) {
      std::vector<char> tmp(out.nbytes());
      MPI_Reduce_scatter_block(in.data(), tmp.data(), n, mpi_type(in.dtype()), mpi_op(op), comm_);
      std::memcpy(out.data(), tmp.data(), tmp.size());
    } else {
      MPI_Reduce_scatter_block(in.data(), out.data(), n, mpi_type(in.dtype()), mpi_op(op), comm_);
    }
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t);
    MT_CHECK(root >= 0 && root < size_, fmt::format("broadcast on {}: expected a root among ranks 0..{}, got {}",
                                                    name_, size_ - 1, root));
    MPI_Bcast(t.data(), count("broadcast", t.numel()), mpi_type(t.dtype()), root, comm_);
    record(&CommStats::broadcast_bytes, t.nbytes());
  }

  void send(const Tensor& t, int peer, int tag) override {
    int n = p2p_args("send", t, peer, tag);
    MPI_Send(t.data(), n, mpi_type(t.dtype()), peer, tag, comm_);
    record(&CommStats::p2p_bytes, t.nbytes());
  }

  void recv(const Tensor& t, int peer, int tag) override {
    int n = p2p_args("recv", t, peer, tag);
    MPI_Status st;
    MPI_Recv(t.data(), n, mpi_type(t.dtype()), peer, tag, comm_, &st);
    check_received(name_, st, t, n, peer, tag);
    record(&CommStats::p2p_bytes, t.nbytes());
  }

  std::unique_ptr<Work> isend(const Tensor& t, int peer, int tag) override {
    int n = p2p_args("isend", t, peer, tag);
    auto w = std::make_unique<MpiWork>();
    MPI_Isend(t.data(), n, mpi_type(t.dtype()), peer, tag, comm_, &w->req);
    record(&CommStats::p2p_bytes, t.nbytes());
    return w;
  }

  std::unique_ptr<Work> irecv(const Tensor& t, int peer, int tag) override {
    int n = p2p_args("irecv", t, peer, tag);
    auto w = std::make_unique<MpiWork>();
    MPI_Irecv(t.data(), n, mpi_type(t.dtype()), peer, tag, comm_, &w->req);
    // Copies, not `this`: the Work may outlive the communicator.
    w->finish = [name = name_, t, n, peer, tag](const MPI_Status& st) { check_received(name, st, t, n, peer, tag); };
    record(&CommStats::p2p_bytes, t.nbytes());
    return w;
  }

  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_tensor("all_to_all", in);
    check_tensor("all_to_all", out);
    check_same_dtype("all_to_all", in, out);
    check_numel("all_to_all", "out", out, in.numel());
    int n = count("all_to_all", block_of("all_to_all", in));
    std::vector<char> copy;
    const void* send = in.data();
    if (overlaps(in, out)) {
      copy.assign(static_cast<const char*>(in.data()), static_cast<const char*>(in.data()) + in.nbytes());
      send = copy.data();
    }
    MPI_Datatype type = mpi_type(in.dtype());
    MPI_Alltoall(send, n, type, out.data(), n, type, comm_);
    record(&CommStats::all_to_all_bytes, in.nbytes());
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    check_tensor("all_to_all_v", in);
    check_tensor("all_to_all_v", out);
    const int64_t sent = check_all_to_all_v("all_to_all_v", in, send_counts, out, recv_counts);
    const auto n = static_cast<size_t>(size());
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int64_t so = 0, ro = 0;
    for (size_t j = 0; j < n; ++j) {
      sc[j] = count("all_to_all_v", send_counts[j]), sd[j] = count("all_to_all_v", so);
      rc[j] = count("all_to_all_v", recv_counts[j]), rd[j] = count("all_to_all_v", ro);
      so += send_counts[j], ro += recv_counts[j];
    }
    MPI_Datatype type = mpi_type(in.dtype());
    MPI_Alltoallv(in.data(), sc.data(), sd.data(), type, out.data(), rc.data(), rd.data(), type, comm_);
    record(&CommStats::all_to_all_bytes, static_cast<size_t>(sent) * dtype_size(in.dtype()));
  }

  void barrier() override { MPI_Barrier(comm_); }

  std::unique_ptr<Work> iall_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor("iall_reduce", t);
    int n = count("iall_reduce", t.numel());
    auto w = std::make_unique<MpiWork>();
    if (half(t.dtype())) {
      w->f_in = to_f32(t);
      MPI_Iallreduce(MPI_IN_PLACE, w->f_in.data(), n, MPI_FLOAT, mpi_op(op), comm_, &w->req);
      MpiWork* raw = w.get();
      w->finish = [raw, t](const MPI_Status&) { from_f32(raw->f_in, t); };
    } else {
      MPI_Iallreduce(MPI_IN_PLACE, t.data(), n, mpi_type(t.dtype()), mpi_op(op), comm_, &w->req);
    }
    record(&CommStats::all_reduce_bytes, t.nbytes());
    return w;
  }

  std::unique_ptr<Work> ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    int n = scatter_args("ireduce_scatter", in, out);
    auto w = std::make_unique<MpiWork>();
    MpiWork* raw = w.get();
    if (half(in.dtype())) {
      w->f_in = to_f32(in);
      w->f_out.resize(static_cast<size_t>(n));
      MPI_Ireduce_scatter_block(w->f_in.data(), w->f_out.data(), n, MPI_FLOAT, mpi_op(op), comm_, &w->req);
      w->finish = [raw, out](const MPI_Status&) { from_f32(raw->f_out, out); };
    } else if (overlaps(in, out)) {
      w->bytes.resize(out.nbytes());
      MPI_Ireduce_scatter_block(in.data(), w->bytes.data(), n, mpi_type(in.dtype()), mpi_op(op), comm_, &w->req);
      w->finish = [raw, out](const MPI_Status&) { std::memcpy(out.data(), raw->bytes.data(), raw->bytes.size()); };
    } else {
      MPI_Ireduce_scatter_block(in.data(), out.data(), n, mpi_type(in.dtype()), mpi_op(op), comm_, &w->req);
    }
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
    return w;
  }

  std::unique_ptr<Work> iall_gather(const Tensor& in, const Tensor& out) override {
    auto w = std::make_unique<MpiWork>();
    const void* send = gather_args("iall_gather", in, out, w->bytes);
    int n = count("iall_gather", in.numel());
    MPI_Datatype type = mpi_type(in.dtype());
    MPI_Iallgather(send, send == MPI_IN_PLACE ? 0 : n, send == MPI_IN_PLACE ? MPI_DATATYPE_NULL : type, out.data(),
                   n, type, comm_, &w->req);
    record(&CommStats::all_gather_bytes, out.nbytes());
    return w;
  }

 private:
  // MPI counts are ints.
  int count(const char* call, int64_t n) const {
    MT_CHECK(n <= INT_MAX, fmt::format("{} on {}: {} elements per rank exceed MPI's int count limit ({}); "
                                       "split the buffer into smaller calls",
                                       call, name_, n, INT_MAX));
    return static_cast<int>(n);
  }

  // Checks all_gather's arguments; returns the send buffer: MPI_IN_PLACE when
  // `in` is out's own block, a copy in `copy` when it overlaps out elsewhere.
  const void* gather_args(const char* call, const Tensor& in, const Tensor& out, std::vector<char>& copy) const {
    check_tensor(call, in);
    check_tensor(call, out);
    check_same_dtype(call, in, out);
    check_numel(call, "out (size() x in.numel())", out, static_cast<int64_t>(size_) * in.numel());
    if (in.nbytes() == 0) return in.data();
    const char* own = static_cast<const char*>(out.data()) + static_cast<size_t>(rank_) * in.nbytes();
    if (in.data() == own) return MPI_IN_PLACE;
    if (!overlaps(in, out)) return in.data();
    copy.assign(static_cast<const char*>(in.data()), static_cast<const char*>(in.data()) + in.nbytes());
    return copy.data();
  }

  // Checks reduce_scatter's arguments; returns the block's element count.
  int scatter_args(const char* call, const Tensor& in, const Tensor& out) const {
    check_tensor(call, in);
    check_tensor(call, out);
    check_same_dtype(call, in, out);
    int64_t block = block_of(call, in);
    check_numel(call, "out (in.numel() / size())", out, block);
    return count(call, block);
  }

  int p2p_args(const char* call, const Tensor& t, int peer, int tag) const {
    check_tensor(call, t);
    check_peer(call, peer, tag);
    // MPI only promises tags up to MPI_TAG_UB (>= 32767); a pipeline's tags
    // grow with micro-batches x stages.
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    MT_CHECK(!flag || tag <= *ub, fmt::format("{} on {}: tag {} exceeds this MPI's MPI_TAG_UB {} (fewer micro-batches "
                                              "or virtual stages per iteration)", call, name_, tag, *ub));
    return count(call, t.numel());
  }

  static void check_received(const std::string& name, const MPI_Status& st, const Tensor& t, int n, int peer,
                             int tag) {
    int got = 0;
    MPI_Get_count(&st, mpi_type(t.dtype()), &got);
    MT_CHECK(got == n, fmt::format("recv on {}: expected {} {} elements from rank {} (tag {}), got {}", name, n,
                                   dtype_name(t.dtype()), peer, tag, got));
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<int> members_;
  std::string name_;
};

}  // namespace

bool launched_by_mpi() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr; }

Status init_mpi() {
  if (!launched_by_mpi()) return Status::ok();
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return Status::internal("init_mpi: MPI was already finalised and cannot be initialised again");
  if (init) return Status::ok();
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return Status::internal("init_mpi: MPI_Init_thread failed");
  if (provided < MPI_THREAD_FUNNELED)
    return Status::internal(fmt::format("init_mpi: expected MPI thread support MPI_THREAD_FUNNELED ({}), got {}",
                                        MPI_THREAD_FUNNELED, provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  return Status::ok();
}

void finalize_mpi() {
  if (mpi_active()) MPI_Finalize();
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

int world_rank() {
  if (!mpi_active()) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  if (!mpi_active()) return 1;
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::unique_ptr<Communicator> world_communicator() {
  require_init("world_communicator");
  if (!mpi_active()) return make_self_communicator(0, "world");
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, /*owned=*/false, "world");
}

std::unique_ptr<Communicator> make_group(const std::vector<int>& members, const std::string& name) {
  require_init("make_group");
  std::string wanted = group_name(name, members);
  if (!mpi_active()) {
    MT_CHECK(members.empty() || members == std::vector<int>{0},
             fmt::format("make_group {}: without MPI the only process is rank 0, so expected members [0] or none",
                         wanted));
    if (members.empty()) return nullptr;
    return make_self_communicator(0, name);
  }
  int rank = world_rank(), size = world_size();
  for (size_t i = 0; i < members.size(); ++i) {
    MT_CHECK(members[i] >= 0 && members[i] < size && (i == 0 || members[i] > members[i - 1]),
             fmt::format("make_group {}: expected increasing world ranks in 0..{}", wanted, size - 1));
  }
  MT_CHECK(members.empty() || std::find(members.begin(), members.end(), rank) != members.end(),
           fmt::format("make_group {}: expected the group of this process (world rank {}) or none", wanted, rank));
  // Members share a colour (their smallest rank); key = world rank keeps
  // group ranks in world order.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, members.empty() ? MPI_UNDEFINED : members.front(), rank, &comm);
  if (members.empty()) return nullptr;
  int got = 0;
  MPI_Comm_size(comm, &got);
  MT_CHECK(got == static_cast<int>(members.size()),
           fmt::format("make_group {}: expected a group of {} ranks, but {} ranks chose this colour; every "
                       "member must pass the same list",
                       wanted, members.size(), got));
  auto c = std::make_unique<MpiCommunicator>(comm, /*owned=*/true, name);
  MT_CHECK(c->members() == members,
           fmt::format("make_group {}: expected these members, but the ranks that joined are {}", wanted, c->name()));
  return c;
}

}  // namespace mt::comm
