#include "optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/elementwise.h"

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

}  // namespace

AdamWOptimizer::AdamWOptimizer(model::GPTModel& model, const AdamWConfig& cfg) : model_(model), cfg_(cfg) {
  const auto& params = model_.params();
  const auto& specs = model_.specs();
  MT_CHECK(params.size() == specs.size(), "AdamWOptimizer: params and specs differ in count");
  SizeTable table;
  for (size_t i = 0; i < params.size(); ++i) {
    MT_CHECK(params[i].dtype() == DType::kF32 || params[i].dtype() == DType::kF64,
             "AdamWOptimizer: master weights must be fp32 or fp64, " + specs[i].name + " is " +
                 dtype_name(params[i].dtype()));
    table.add(specs[i].name, params[i].shape(), params[i].dtype());
  }
  if (table.total_bytes() > 0) {
    state_arena_ = Arena(2 * table.total_bytes(), "adam-state");  // zero-filled
    m_ = state_arena_.carve(table);
    v_ = state_arena_.carve(table);
  }
  wd_mult_.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) wd_mult_[i] = specs[i].weight_decay ? 1.0 : 0.0;
}

AdamWOptimizer::~AdamWOptimizer() = default;

void AdamWOptimizer::step(double lr, double wd) {
  ++step_;
  const auto& params = model_.params();
  const auto& grads = model_.grads();
  for (size_t i = 0; i < params.size(); ++i) {
    kernels::AdamWOptions o;
    o.lr = lr;
    o.beta1 = cfg_.beta1;
    o.beta2 = cfg_.beta2;
    o.eps = cfg_.eps;
    o.weight_decay = wd * wd_mult_[i];
    o.step = step_;
    kernels::adamw_step(params[i], grads[i], m_[i], v_[i], o);
  }
  if (model_.options().bf16_compute) model_.sync_low_precision();
}

double AdamWOptimizer::grad_norm() const {
  double s = 0;
  for (const Tensor& g : model_.grads())
    s += g.dtype() == DType::kF64 ? sum_squares_fixed_order(g.ptr<double>(), g.numel())
                                  : sum_squares_fixed_order(g.ptr<float>(), g.numel());
  return std::sqrt(s);
}

double AdamWOptimizer::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  if (max_norm <= 0) return norm;
  // Megatron's clip_grad_norm_fp32 (megatron/core/optimizer/clip_grads.py).
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& g : model_.grads()) kernels::scale_inplace(g, coef);
  return norm;
}

bool AdamWOptimizer::grads_finite() const {
  for (const Tensor& g : model_.grads()) {
    bool ok = g.dtype() == DType::kF64 ? all_finite(g.ptr<double>(), g.numel()) : all_finite(g.ptr<float>(), g.numel());
    if (!ok) return false;
  }
  return true;
}

void AdamWOptimizer::reset_state() {
  if (state_arena_.base()) std::memset(state_arena_.base(), 0, state_arena_.used());
  step_ = 0;
}

}  // namespace mt::optim
