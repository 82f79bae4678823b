// The parts of comm/communicator.h that do not need MPI: the shared argument
// checks and stats counting, all_reduce_scalar, all_gather_scalar, group names, and
// SelfCommunicator (a group of one rank: every collective is a copy or nothing).
#include "comm/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace mt::comm {

// ---- Communicator: shared helpers ----

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  double x = v;
  all_reduce(Tensor(&x, Shape{1}, DType::kF64), op);
  return x;
}

std::vector<double> Communicator::all_gather_scalar(double v) {
  std::vector<double> all(static_cast<size_t>(size()));
  double x = v;
  all_gather(Tensor(&x, Shape{1}, DType::kF64), Tensor(all.data(), Shape{size()}, DType::kF64));
  return all;
}

void Communicator::record(uint64_t CommStats::*kind, size_t bytes) {
  stats_.calls += 1;
  stats_.bytes += bytes;
  stats_.*kind += bytes;
}

void Communicator::check_tensor(const char* call, const Tensor& t, Device device) const {
  MT_CHECK(t.device() == device,
           device == Device::kCpu
               ? fmt::format("{} on {}: expected a CPU tensor (this communicator moves host memory), got a device "
                             "tensor",
                             call, name())
               : fmt::format("{} on {}: expected a CUDA tensor (this communicator moves device memory), got a CPU "
                             "tensor",
                             call, name()));
  MT_CHECK(t.defined() || t.numel() == 0,
           fmt::format("{} on {}: expected a tensor with memory, got a null tensor of {} elements", call, name(),
                       t.numel()));
}

void Communicator::check_same_dtype(const char* call, const Tensor& a, const Tensor& b) const {
  MT_CHECK(a.dtype() == b.dtype(), fmt::format("{} on {}: expected in and out of the same dtype, got {} and {}", call,
                                               name(), dtype_name(a.dtype()), dtype_name(b.dtype())));
}

void Communicator::check_numel(const char* call, const char* what, const Tensor& t, int64_t expected) const {
  MT_CHECK(t.numel() == expected, fmt::format("{} on {}: expected {} to have {} elements, got {}", call, name(), what,
                                              expected, t.numel()));
}

int64_t Communicator::block_of(const char* call, const Tensor& in) const {
  MT_CHECK(in.numel() % size() == 0,
           fmt::format("{} on {}: expected in's {} elements to divide into {} equal blocks (one per rank)", call,
                       name(), in.numel(), size()));
  return in.numel() / size();
}

void Communicator::check_peer(const char* call, int peer, int tag) const {
  MT_CHECK(peer >= 0 && peer < size() && peer != rank(),
           fmt::format("{} on {}: expected a peer among the other ranks 0..{} of the group (this is rank {}), got {}",
                       call, name(), size() - 1, rank(), peer));
  MT_CHECK(tag >= 0, fmt::format("{} on {}: expected a tag >= 0, got {}", call, name(), tag));
}

int64_t Communicator::check_all_to_all_v(const char* call, const Tensor& in, const std::vector<int64_t>& send_counts,
                                         const Tensor& out, const std::vector<int64_t>& recv_counts) const {
  check_same_dtype(call, in, out);
  const auto n = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == n && recv_counts.size() == n,
           fmt::format("{} on {}: expected one send and one receive count per rank ({}), got {} and {}", call, name(),
                       n, send_counts.size(), recv_counts.size()));
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    MT_CHECK(send_counts[j] >= 0 && recv_counts[j] >= 0,
             fmt::format("{} on {}: expected counts >= 0, got send {} and receive {} for rank {}", call, name(),
                         send_counts[j], recv_counts[j], j));
    sent += send_counts[j], received += recv_counts[j];
  }
  MT_CHECK(sent <= in.numel() && received <= out.numel(),
           fmt::format("{} on {}: the counts ask to send {} of in's {} elements and receive {} into out's {}", call,
                       name(), sent, in.numel(), received, out.numel()));
  const auto a0 = reinterpret_cast<uintptr_t>(in.data()), b0 = reinterpret_cast<uintptr_t>(out.data());
  MT_CHECK(in.nbytes() == 0 || out.nbytes() == 0 || a0 >= b0 + out.nbytes() || b0 >= a0 + in.nbytes(),
           fmt::format("{} on {}: in and out overlap; pass separate buffers", call, name()));
  return sent;
}

std::string group_name(const std::string& name, const std::vector<int>& members) {
  bool consecutive = members.size() >= 3;
  for (size_t i = 1; consecutive && i < members.size(); ++i) consecutive = members[i] == members[i - 1] + 1;
  if (consecutive) return fmt::format("{}[{}..{}]", name, members.front(), members.back());
  return fmt::format("{}[{}]", name, fmt::join(members, ","));
}

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A group of one. Results are copies (memmove: in and out may alias).
class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(int world_rank, std::string name) : members_{world_rank}, name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& members() const override { return members_; }
  std::string name() const override { return name_; }

  void all_reduce(const Tensor& t, ReduceOp) override {
    check_tensor("all_reduce", t);
    record(&CommStats::all_reduce_bytes, t.nbytes());
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    copy("all_gather", in, out);
    record(&CommStats::all_gather_bytes, out.nbytes());
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp) override {
    copy("reduce_scatter", in, out);
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
  }
  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t);
    MT_CHECK(root == 0, fmt::format("broadcast on {}: expected root 0 (the only rank of a group of one), got {}",
                                    name_, root));
    record(&CommStats::broadcast_bytes, t.nbytes());
  }
  void send(const Tensor&, int peer, int) override { no_peer("send", peer); }
  void recv(const Tensor&, int peer, int) override { no_peer("recv", peer); }
  std::unique_ptr<Work> isend(const Tensor&, int peer, int) override { no_peer("isend", peer); }
  std::unique_ptr<Work> irecv(const Tensor&, int peer, int) override { no_peer("irecv", peer); }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    copy("all_to_all", in, out);
    record(&CommStats::all_to_all_bytes, in.nbytes());
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    check_tensor("all_to_all_v", in), check_tensor("all_to_all_v", out);
    const int64_t n = check_all_to_all_v("all_to_all_v", in, send_counts, out, recv_counts);
    MT_CHECK(recv_counts[0] == n, fmt::format("all_to_all_v on {}: a group of one receives what it sends ({} "
                                              "elements), got a receive count of {}",
                                              name_, n, recv_counts[0]));
    if (n > 0) std::memcpy(out.data(), in.data(), static_cast<size_t>(n) * dtype_size(in.dtype()));
    record(&CommStats::all_to_all_bytes, static_cast<size_t>(n) * dtype_size(in.dtype()));
  }
  void barrier() override {}

  std::unique_ptr<Work> iall_reduce(const Tensor& t, ReduceOp op) override {
    all_reduce(t, op);
    return completed_work();
  }
  std::unique_ptr<Work> ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    reduce_scatter(in, out, op);
    return completed_work();
  }
  std::unique_ptr<Work> iall_gather(const Tensor& in, const Tensor& out) override {
    all_gather(in, out);
    return completed_work();
  }

 private:
  // With one rank every block-wise collective is out = in.
  void copy(const char* call, const Tensor& in, const Tensor& out) {
    check_tensor(call, in);
    check_tensor(call, out);
    check_same_dtype(call, in, out);
    check_numel(call, "out", out, in.numel());
    if (in.data() != out.data() && in.nbytes() > 0) std::memmove(out.data(), in.data(), in.nbytes());
  }
  [[noreturn]] void no_peer(const char* call, int peer) const {
    check_failed(__FILE__, __LINE__, "peer != self",
                 fmt::format("{} on {}: a group of one has no peer to reach (asked for peer {}); "
                             "a pipeline with one stage never sends",
                             call, name_, peer));
  }

  std::vector<int> members_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Work> completed_work() { return std::make_unique<CompletedWork>(); }

std::unique_ptr<Communicator> make_self_communicator(int world_rank) {
  return make_self_communicator(world_rank, "self");
}

std::unique_ptr<Communicator> make_self_communicator(int world_rank, const std::string& name) {
  return std::make_unique<SelfCommunicator>(world_rank, group_name(name, {world_rank}));
}

}  // namespace mt::comm
