// StagedCommunicator: device tensors through a host communicator. Each call
// copies its device inputs into host buffers (copy_tensor), runs the wrapped
// communicator's asynchronous variant on them, and copies the results back
// into the device tensors when the operation completes (a blocking call
// completes before it returns; a Work when it is waited for or tests done).
// See make_staged_group in comm/communicator.h for where it is used.
#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/device.h"

namespace mt::comm {

namespace {

// Device tensors only (check_tensor with Device::kCuda), like the NCCL
// communicator: a host tensor passed to a device group fails here, in CI,
// rather than on a GPU.

// A host buffer shaped like a device tensor (same dtype and element count),
// uninitialised (gradient buckets are large; every byte is written before it
// is read).
struct HostBuffer {
  std::unique_ptr<std::byte[]> bytes;
  Tensor t;
  explicit HostBuffer(const Tensor& like) : bytes(new std::byte[like.nbytes()]) {
    t = Tensor(bytes.get(), Shape{like.numel()}, like.dtype());
  }
};

// An inner operation on host buffers, and the copies into device tensors
// that follow its completion. The buffers live until then.
class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, std::vector<std::unique_ptr<HostBuffer>> buffers,
             std::vector<std::pair<const HostBuffer*, Tensor>> copy_back)
      : inner_(std::move(inner)), buffers_(std::move(buffers)), copy_back_(std::move(copy_back)) {}
  // As every Work: destroying an unfinished one waits for it (the inner
  // Work's destructor does, as its transport allows), then the results land.
  ~StagedWork() override {
    if (done_) return;
    inner_.reset();
    finish();
  }

  void wait() override {
    if (done_) return;
    inner_->wait();
    finish();
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    for (const auto& [host, device] : copy_back_) copy_tensor(host->t, device);
    buffers_.clear();
    done_ = true;
  }

  std::unique_ptr<Work> inner_;
  std::vector<std::unique_ptr<HostBuffer>> buffers_;
  std::vector<std::pair<const HostBuffer*, Tensor>> copy_back_;
  bool done_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::vector<int>& members() const override { return host_->members(); }
  std::string name() const override { return host_->name(); }

  void all_reduce(const Tensor& t, ReduceOp op) override { iall_reduce(t, op)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) override { iall_gather(in, out)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    ireduce_scatter(in, out, op)->wait();
  }
  void send(const Tensor& t, int peer, int tag) override { isend(t, peer, tag)->wait(); }
  void recv(const Tensor& t, int peer, int tag) override { irecv(t, peer, tag)->wait(); }
  void barrier() override { host_->barrier(); }
  double all_reduce_scalar(double v, ReduceOp op) override {
    record(&CommStats::all_reduce_bytes, sizeof(double));
    return host_->all_reduce_scalar(v, op);
  }

  std::vector<double> all_gather_scalar(double v) override {
    record(&CommStats::all_gather_bytes, sizeof(double) * static_cast<size_t>(size()));
    return host_->all_gather_scalar(v);
  }

  void broadcast(const Tensor& t, int root) override {
    check_tensor("broadcast", t, Device::kCuda);
    auto h = rank() == root ? stage_in(t) : std::make_unique<HostBuffer>(t);  // only the root's bytes are read
    host_->broadcast(h->t, root);
    copy_tensor(h->t, t);
    record(&CommStats::broadcast_bytes, t.nbytes());
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    check_tensor("all_to_all", in, Device::kCuda), check_tensor("all_to_all", out, Device::kCuda);
    auto hi = stage_in(in);
    HostBuffer ho(out);
    host_->all_to_all(hi->t, ho.t);
    copy_tensor(ho.t, out);
    record(&CommStats::all_to_all_bytes, in.nbytes());
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    check_tensor("all_to_all_v", in, Device::kCuda), check_tensor("all_to_all_v", out, Device::kCuda);
    const int64_t sent = check_all_to_all_v("all_to_all_v", in, send_counts, out, recv_counts);
    int64_t received = 0;
    for (int64_t c : recv_counts) received += c;
    // Only the counted prefixes travel between device and host.
    const Tensor in_used = in.view({in.numel()}).slice(0, sent), out_used = out.view({out.numel()}).slice(0, received);
    auto hi = stage_in(in_used);
    HostBuffer ho(out_used);
    host_->all_to_all_v(hi->t, send_counts, ho.t, recv_counts);
    copy_tensor(ho.t, out_used);
    record(&CommStats::all_to_all_bytes, static_cast<size_t>(sent) * dtype_size(in.dtype()));
  }

  std::unique_ptr<Work> iall_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor("all_reduce", t, Device::kCuda);
    auto h = stage_in(t);
    auto inner = host_->iall_reduce(h->t, op);
    record(&CommStats::all_reduce_bytes, t.nbytes());
    const HostBuffer* back = h.get();  // before h is moved (argument order is unspecified)
    return finish_later(std::move(inner), {back, t}, std::move(h));
  }
  std::unique_ptr<Work> iall_gather(const Tensor& in, const Tensor& out) override {
    check_tensor("all_gather", in, Device::kCuda), check_tensor("all_gather", out, Device::kCuda);
    auto hi = stage_in(in);
    auto ho = std::make_unique<HostBuffer>(out);
    auto inner = host_->iall_gather(hi->t, ho->t);
    record(&CommStats::all_gather_bytes, out.nbytes());
    const HostBuffer* back = ho.get();
    return finish_later(std::move(inner), {back, out}, std::move(hi), std::move(ho));
  }
  std::unique_ptr<Work> ireduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_tensor("reduce_scatter", in, Device::kCuda), check_tensor("reduce_scatter", out, Device::kCuda);
    auto hi = stage_in(in);
    auto ho = std::make_unique<HostBuffer>(out);
    auto inner = host_->ireduce_scatter(hi->t, ho->t, op);
    record(&CommStats::reduce_scatter_bytes, in.nbytes());
    const HostBuffer* back = ho.get();
    return finish_later(std::move(inner), {back, out}, std::move(hi), std::move(ho));
  }
  std::unique_ptr<Work> isend(const Tensor& t, int peer, int tag) override {
    check_tensor("send", t, Device::kCuda);
    auto h = stage_in(t);
    auto inner = host_->isend(h->t, peer, tag);
    record(&CommStats::p2p_bytes, t.nbytes());
    std::vector<std::unique_ptr<HostBuffer>> keep;
    keep.push_back(std::move(h));
    return std::make_unique<StagedWork>(std::move(inner), std::move(keep),
                                        std::vector<std::pair<const HostBuffer*, Tensor>>{});
  }
  std::unique_ptr<Work> irecv(const Tensor& t, int peer, int tag) override {
    check_tensor("recv", t, Device::kCuda);
    auto h = std::make_unique<HostBuffer>(t);
    auto inner = host_->irecv(h->t, peer, tag);
    record(&CommStats::p2p_bytes, t.nbytes());
    const HostBuffer* back = h.get();
    return finish_later(std::move(inner), {back, t}, std::move(h));
  }

 private:
  static std::unique_ptr<HostBuffer> stage_in(const Tensor& t) {
    auto h = std::make_unique<HostBuffer>(t);
    copy_tensor(t, h->t);
    return h;
  }
  template <typename... Buffers>
  static std::unique_ptr<Work> finish_later(std::unique_ptr<Work> inner, std::pair<const HostBuffer*, Tensor> back,
                                            Buffers... buffers) {
    std::vector<std::unique_ptr<HostBuffer>> keep;
    (keep.push_back(std::move(buffers)), ...);
    return std::make_unique<StagedWork>(std::move(inner), std::move(keep),
                                        std::vector<std::pair<const HostBuffer*, Tensor>>{std::move(back)});
  }

  std::unique_ptr<Communicator> host_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_group(std::unique_ptr<Communicator> host) {
  if (!host) return nullptr;
  return std::make_unique<StagedCommunicator>(std::move(host));
}

}  // namespace mt::comm
