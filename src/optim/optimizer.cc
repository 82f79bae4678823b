#include "optim/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/communicator.h"
#include "core/device.h"
#include "kernels/optimizer_step.h"
#include "kernels/elementwise.h"
#include "parallel/grad_buckets.h"

namespace mt::optim {
namespace {

// True when every element of a fp32/fp64 tensor is finite.
template <typename T>
bool all_finite(const T* p, int64_t n) {
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad += std::isfinite(p[i]) ? 0 : 1;
  return bad == 0;
}

// Sum of squares in double with a fixed summation order: 16K-element chunks
// (8 interleaved accumulators each, combined in order), chunk sums added in
// order. Independent of the thread count and of OpenMP's reduction order
// (libgomp combines `reduction(+)` partials in thread-arrival order), so the
// gradient norm -- and with it the clipping coefficient -- is bitwise
// reproducible, which an exact resume needs.
template <typename T>
double sum_squares_fixed_order(const T* p, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = b;
    for (; i + 8 <= e; i += 8)
      for (int k = 0; k < 8; ++k) {
        const double x = static_cast<double>(p[i + k]);
        acc[k] += x * x;
      }
    for (; i < e; ++i) {
      const double x = static_cast<double>(p[i]);
      acc[0] += x * x;
    }
    part[static_cast<size_t>(c)] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  double s = 0;
  for (double v : part) s += v;
  return s;
}

template <typename T>
double sum_squares_fixed_order(const Tensor& t) {
  return sum_squares_fixed_order(t.ptr<T>(), t.numel());
}
// A device tensor (CUDA) reduces with its own deterministic kernel
// (kernels::sum_squares); the host keeps the fixed chunk order above.
double sum_squares_of(const Tensor& t) {
  if (t.device() != Device::kCpu) return kernels::sum_squares(t);
  return t.dtype() == DType::kF64 ? sum_squares_fixed_order<double>(t) : sum_squares_fixed_order<float>(t);
}
// sum_squares_of for each tensor of ts (all on one device), in one pass:
// on a device one wait for all of them (kernels::sum_squares_each).
std::vector<double> sums_of_squares(const std::vector<Tensor>& ts) {
  if (ts.empty() || ts[0].device() == Device::kCpu) {
    std::vector<double> r;
    r.reserve(ts.size());
    for (const Tensor& t : ts) r.push_back(sum_squares_of(t));
    return r;
  }
  return kernels::sum_squares_each(ts);
}
// A host tensor without inf or NaN (device tensors: grads_finite's batched check).
bool finite_of(const Tensor& t) {
  return t.dtype() == DType::kF64 ? all_finite(t.ptr<double>(), t.numel()) : all_finite(t.ptr<float>(), t.numel());
}

// Elements [begin, end) of a tensor as a 1-D view.
Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) { return t.view({t.numel()}).slice(begin, end); }

// Sum of one double per rank of `c`, added in rank order on every rank: the
// same bits everywhere whatever reduction tree MPI picks (the clipping
// coefficient must agree across ranks, and a resume must reproduce it).
double sum_over(comm::Communicator* c, double v) {
  if (c == nullptr || c->size() == 1) return v;
  double s = 0;
  for (double x : c->all_gather_scalar(v)) s += x;
  return s;
}

}  // namespace

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::kSgd ? "sgd" : "adam"; }

std::vector<std::string> optimizer_state_names(const OptimizerConfig& c) {
  if (c.kind == OptimizerKind::kAdam) return {"exp_avg", "exp_avg_sq"};
  if (c.sgd_momentum != 0.0) return {"momentum_buffer"};
  return {};
}

Optimizer::Optimizer(model::GPTModel& model, const OptimizerConfig& cfg, const ParallelOptimizerOptions& par)
    : model_(model), cfg_(cfg), par_(par), state_names_(optimizer_state_names(cfg)) {
  const auto& params = model_.params();
  const auto& specs = model_.specs();
  MT_CHECK(params.size() == specs.size(), "Optimizer: params and specs differ in count");
  for (size_t i = 0; i < params.size(); ++i)
    MT_CHECK(params[i].dtype() == DType::kF32 || params[i].dtype() == DType::kF64,
             "Optimizer: master weights must be fp32 or fp64, " + specs[i].name + " is " +
                 dtype_name(params[i].dtype()));
  MT_CHECK(par_.tp == nullptr || par_.tp_rank == par_.tp->rank(),
           fmt::format("Optimizer: ParallelOptimizerOptions::tp_rank is {} but this process is rank {} of {}",
                       par_.tp_rank, par_.tp ? par_.tp->rank() : 0, par_.tp ? par_.tp->name() : ""));
  wd_mult_.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    wd_mult_[i] = specs[i].weight_decay || (cfg_.apply_wd_to_qk_layernorm && model::is_qk_norm(specs[i].name)) ? 1.0 : 0.0;
  }
  decoupled_.assign(specs.size(), 0);
  if (cfg_.decoupled_lr)
    for (size_t i = 0; i < specs.size(); ++i)
      decoupled_[i] = specs[i].name == "embedding.word_embeddings.weight" || specs[i].name == "output_layer.weight";

  const int states = state_count();
  const char* arena_name = cfg_.kind == OptimizerKind::kAdam ? "adam-state" : "sgd-momentum";
  if (!distributed()) {
    SizeTable table;
    for (size_t i = 0; i < params.size(); ++i) table.add(specs[i].name, params[i].shape(), params[i].dtype());
    if (table.total_bytes() > 0 && states > 0) {
      state_arena_ = Arena(states * table.total_bytes(), arena_name, model_.options().device);  // zero-filled
      m_ = state_arena_.carve(table);
      if (states > 1) v_ = state_arena_.carve(table);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = params[i].numel();
      ranges_.push_back(StateRange{static_cast<int>(i), 0, n, states > 0 ? m_[i].view({n}) : Tensor(),
                                   states > 1 ? v_[i].view({n}) : Tensor()});
    }
    return;
  }

  // Distributed optimizer: state for this rank's blocks only, one range per
  // (block, parameter) intersection, in block order.
  const parallel::GradBuckets& gb = *par_.dist_buckets;
  MT_CHECK(gb.mode() == parallel::GradReduceMode::kReduceScatter,
           "Optimizer: the distributed optimizer needs gradient buckets in kReduceScatter mode "
           "(--use-distributed-optimizer reduce-scatters gradients)");
  MT_CHECK(par_.dp != nullptr,
           "Optimizer: the distributed optimizer needs the data-parallel group (ParallelOptimizerOptions::dp) "
           "for the gradient norm");
  const Tensor flat = model_.flat_grads();
  MT_CHECK(flat.defined(), "Optimizer: the distributed optimizer needs a model with gradients (slots > 0)");
  const DType dt = flat.dtype();
  const int64_t xb = model_.expert_flat_begin();
  MT_CHECK(xb == flat.numel() || par_.expert_dist_buckets != nullptr,
           "Optimizer: the distributed optimizer of a model with experts needs expert_dist_buckets over "
           "[expert_flat_begin(), numel) of its flat buffers");
  // Blocks of the dense buckets (built over [0, xb)), then of the experts'
  // (built over [xb, numel): their offsets start at xb).
  auto add_blocks = [&](const parallel::GradBuckets& b, int64_t base, int64_t end) {
    for (const parallel::ShardBlock& blk : b.shard()) {
      MT_CHECK(0 <= blk.begin && blk.begin <= blk.end && base + blk.end <= end,
               fmt::format("Optimizer: shard block [{}, {}) lies outside its region [{}, {}) of the model's flat "
                           "buffer; the buckets must be built over model.flat_grads() split at expert_flat_begin()",
                           blk.begin, blk.end, base, end));
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t off = model_.flat_offset(static_cast<int>(i));
        const int64_t lo = std::max(base + blk.begin, off), hi = std::min(base + blk.end, off + params[i].numel());
        if (lo < hi) ranges_.push_back(StateRange{static_cast<int>(i), lo - off, hi - off, Tensor(), Tensor()});
      }
    }
  };
  add_blocks(gb, 0, xb);
  if (par_.expert_dist_buckets) {
    MT_CHECK(par_.expert_dist_buckets->mode() == parallel::GradReduceMode::kReduceScatter,
             "Optimizer: the experts' buckets must reduce-scatter too");
    add_blocks(*par_.expert_dist_buckets, xb, flat.numel());
  }
  int64_t owned = 0;
  for (const StateRange& r : ranges_) owned += r.end - r.begin;
  if (owned > 0 && states > 0) {
    const size_t one = align_up(static_cast<size_t>(owned) * dtype_size(dt));
    state_arena_ = Arena(states * one, arena_name, model_.options().device);  // zero-filled: [m | v] of every range
    const Tensor m = state_arena_.alloc({owned}, dt), v = states > 1 ? state_arena_.alloc({owned}, dt) : Tensor();
    int64_t at = 0;
    for (StateRange& r : ranges_) {
      r.m = m.slice(at, at + (r.end - r.begin));
      if (states > 1) r.v = v.slice(at, at + (r.end - r.begin));
      at += r.end - r.begin;
    }
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::step(const OptimizerParamScheduler& sched) {
  const double dlr = cfg_.decoupled_lr
                         ? sched.lr_for(*cfg_.decoupled_lr, cfg_.decoupled_min_lr.value_or(sched.config().min_lr))
                         : -1.0;
  step(sched.lr(), sched.wd(), dlr);
}

void Optimizer::step(double lr, double wd, double decoupled_lr) {
  ++step_;
  const auto& params = model_.params();
  const auto& grads = model_.grads();
  for (const StateRange& r : ranges_) {
    const size_t i = static_cast<size_t>(r.param);
    // With the distributed optimizer this rank's elements of the parameter;
    // else the whole parameter, and its bf16 GEMM copy written in the same pass.
    const Tensor p = distributed() ? flat_slice(params[i], r.begin, r.end) : params[i];
    const Tensor g = distributed() ? flat_slice(grads[i], r.begin, r.end) : grads[i];
    const Tensor lowp = distributed() ? Tensor() : model_.low_precision(static_cast<int>(i));
    const double lr_i = decoupled_lr >= 0 && decoupled_[i] ? decoupled_lr : lr;
    if (cfg_.kind == OptimizerKind::kSgd) {
      kernels::SGDOptions o;
      o.lr = lr_i;
      o.momentum = cfg_.sgd_momentum;
      o.weight_decay = wd * wd_mult_[i];
      o.grad_scale = grad_scale_;
      kernels::sgd_step(p, g, r.m, o, lowp);
      continue;
    }
    kernels::AdamWOptions o;
    o.lr = lr_i;
    o.beta1 = cfg_.beta1;
    o.beta2 = cfg_.beta2;
    o.eps = cfg_.eps;
    o.weight_decay = wd * wd_mult_[i];
    o.step = step_;
    o.grad_scale = grad_scale_;  // the clipping coefficient, applied as the update reads each gradient
    kernels::adamw_step(p, g, r.m, r.v, o, lowp);
  }
  grad_scale_ = 1.0;
  if (distributed()) {
    if (par_.overlap_param_gather) {
      par_.dist_buckets->start_param_gather();  // the trainer waits per stage, then syncs bf16 copies per stage
      if (par_.expert_dist_buckets) par_.expert_dist_buckets->start_param_gather();
      return;
    }
    par_.dist_buckets->all_gather_params();
    if (par_.expert_dist_buckets) par_.expert_dist_buckets->all_gather_params();
    if (model_.options().half_compute) model_.sync_low_precision();
  }
}

double Optimizer::grad_norm() const { return norm_of(model_.grads()); }
double Optimizer::params_norm() const { return norm_of(model_.params()); }

std::pair<std::vector<Tensor>, std::vector<Tensor>> Optimizer::counted_parts(
    const std::vector<Tensor>& tensors) const {
  const auto& specs = model_.specs();
  // Replicated parameters are identical on every TP rank: count them on TP rank 0 only.
  // A tied word embedding on the last pipeline stage is a copy of the first
  // stage's: count it there only.
  auto counted = [&](size_t i) {
    return (par_.tp_rank == 0 || specs[i].shard != model::ShardKind::kReplicated) &&
           !model_.is_shared_copy(static_cast<int>(i));
  };
  std::pair<std::vector<Tensor>, std::vector<Tensor>> parts;
  auto add = [&](size_t i, const Tensor& t) { (specs[i].expert >= 0 ? parts.second : parts.first).push_back(t); };
  if (distributed()) {
    for (const StateRange& r : ranges_) {
      const size_t i = static_cast<size_t>(r.param);
      if (counted(i)) add(i, flat_slice(tensors[i], r.begin, r.end));
    }
  } else {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (counted(i)) add(i, tensors[i]);
  }
  return parts;
}

// A per-rank statistic of the non-expert and the expert parameters, summed
// over the ranks that split them: the experts' over the expert data-parallel
// group (sharded) and the EP group, then both over TP (the experts only
// when split over TP) and PP.
double Optimizer::sum_over_model(double dense, double expert) const {
  if (distributed()) {
    dense = sum_over(par_.dp, dense);
    if (par_.expert_dp) expert = sum_over(par_.expert_dp, expert);  // a model with experts
  }
  double v = par_.experts_split_over_tp ? sum_over(par_.tp, dense + sum_over(par_.ep, expert))
                                        : sum_over(par_.tp, dense) + sum_over(par_.ep, expert);
  return sum_over(par_.pp, v);
}

// The global L2 norm of `tensors` (the model's gradients or parameters, in
// parameter order), each element counted once.
double Optimizer::norm_of(const std::vector<Tensor>& tensors) const {
  const auto [dense, expert] = counted_parts(tensors);
  double s = 0, x = 0;
  for (double v : sums_of_squares(dense)) s += v;  // in parameter order
  for (double v : sums_of_squares(expert)) x += v;
  return std::sqrt(sum_over_model(s, x));
}

int64_t Optimizer::grad_zeros() const {
  const auto [dense, expert] = counted_parts(model_.grads());
  int64_t n = 0, x = 0;
  for (int64_t z : kernels::count_zeros_each(dense, grad_scale_)) n += z;
  for (int64_t z : kernels::count_zeros_each(expert, grad_scale_)) x += z;
  return static_cast<int64_t>(sum_over_model(static_cast<double>(n), static_cast<double>(x)));  // exact below 2^53
}

double Optimizer::clip_grad_norm(double max_norm) {
  grad_scale_ = 1.0;
  const double norm = grad_norm();
  if (max_norm <= 0) return norm;
  // Megatron's clip_grad_norm_fp32 (megatron/core/optimizer/clip_grads.py).
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) grad_scale_ = coef;  // applied by step() as it reads the gradients
  return norm;
}

bool Optimizer::grads_finite() const {
  bool ok = true;
  std::vector<Tensor> parts;
  if (distributed()) {
    const auto& grads = model_.grads();
    for (const StateRange& r : ranges_) parts.push_back(flat_slice(grads[static_cast<size_t>(r.param)], r.begin, r.end));
  } else {
    parts = model_.grads();
  }
  if (!parts.empty() && parts[0].device() != Device::kCpu) {
    // On a device, one batched reduction: any inf or NaN makes the double
    // sum of squares non-finite, and no finite fp32 gradient overflows it.
    for (double v : kernels::sum_squares_each(parts)) ok = ok && std::isfinite(v);
  } else {
    for (const Tensor& g : parts)
      if (ok) ok = finite_of(g);
  }
  // Without the distributed optimizer the DP ranks hold identical gradients.
  double bad = ok ? 0.0 : 1.0;
  if (par_.tp && par_.tp->size() > 1) bad = par_.tp->all_reduce_scalar(bad, comm::ReduceOp::kMax);
  if (distributed() && par_.dp->size() > 1) bad = par_.dp->all_reduce_scalar(bad, comm::ReduceOp::kMax);
  // The experts' gradients differ over EP, and when sharded over their own group.
  comm::Communicator* xdp = par_.expert_dp;
  if (distributed() && xdp && xdp != par_.dp && xdp->size() > 1) bad = xdp->all_reduce_scalar(bad, comm::ReduceOp::kMax);
  if (par_.ep && par_.ep->size() > 1) bad = par_.ep->all_reduce_scalar(bad, comm::ReduceOp::kMax);
  if (par_.pp && par_.pp->size() > 1) bad = par_.pp->all_reduce_scalar(bad, comm::ReduceOp::kMax);
  return bad == 0.0;
}

namespace {

// FNV-1a over 64-bit words (the tail byte by byte), kept to 52 bits so that
// it travels exactly as a double (Communicator::all_gather_scalar).
uint64_t hash52(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  constexpr uint64_t kPrime = 1099511628211ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
  }
  for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * kPrime;
  return (h ^ (h >> 52)) & ((uint64_t{1} << 52) - 1);
}

}  // namespace

std::vector<std::string> Optimizer::params_differing_across_replicas() const {
  const auto& params = model_.params();
  const auto& specs = model_.specs();
  std::vector<uint64_t> hash(params.size());
  std::vector<char> staging;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const char* bytes = static_cast<const char*>(p.data());
    if (p.device() != Device::kCpu) {  // hashed on the host, as Megatron does
      staging.resize(p.nbytes());
      copy_tensor(p, Tensor(staging.data(), p.shape(), p.dtype()));
      bytes = staging.data();
    }
    hash[i] = hash52(bytes, p.nbytes());
  }
  std::vector<std::string> differing;
  for (const bool experts : {false, true}) {
    comm::Communicator* group = experts ? par_.expert_dp : par_.dp;
    std::vector<size_t> mine;
    for (size_t i = 0; i < params.size(); ++i)
      if ((specs[i].expert >= 0) == experts) mine.push_back(i);
    if (group == nullptr || group->size() == 1 || mine.empty()) continue;
    // One exchange of the hashes' combination; only when some rank differs,
    // one per parameter to name them.
    std::vector<uint64_t> listed;
    for (size_t i : mine) listed.push_back(hash[i]);
    const uint64_t all = hash52(reinterpret_cast<const char*>(listed.data()), listed.size() * 8);
    const std::vector<double> got = group->all_gather_scalar(static_cast<double>(all));
    if (std::all_of(got.begin(), got.end(), [&](double v) { return v == got[0]; })) continue;
    for (size_t i : mine) {
      const std::vector<double> h = group->all_gather_scalar(static_cast<double>(hash[i]));
      if (!std::all_of(h.begin(), h.end(), [&](double v) { return v == h[0]; })) differing.push_back(specs[i].name);
    }
  }
  return differing;
}

void Optimizer::reset_state() {
  if (state_arena_.base())  // every byte in use (a multiple of kArenaAlign), on the state's device
    Tensor(state_arena_.base(), {static_cast<int64_t>(state_arena_.used() / 4)}, DType::kI32, state_arena_.device())
        .zero();
  step_ = 0;
  grad_scale_ = 1.0;
}

}  // namespace mt::optim
