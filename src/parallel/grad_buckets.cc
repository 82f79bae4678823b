// GradBuckets (parallel/grad_buckets.h): bucket formation, synchronous and
// overlapped gradient reduction, and the distributed optimizer's parameter
// all-gather.
//
// What moves (group = dp), per bucket [b0, b1) of n elements:
//   kAllReduce      all_reduce(grads[b0, b1)) in place; payload n elements.
//   kReduceScatter  reduce_scatter(in = grads[b0, b1), out = this bucket's
//                   block-sized temporary), then the n / DP results are copied
//                   into grads[b0 + r n/DP, ...); payload n elements (what the
//                   planner predicts), memory N / DP extra elements in all.
//   param gather    all_gather(in = params' own block, out = params[b0, b1)),
//                   in place (MPI_IN_PLACE); payload n elements.
// With DP = 1 nothing moves.
#include "parallel/grad_buckets.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/device.h"

namespace mt::parallel {

GradBuckets::GradBuckets(const Tensor& grads, const Tensor& params, std::vector<ParamRange> ranges,
                         comm::Communicator& dp, const GradBucketOptions& options)
    : ranges_(std::move(ranges)), dp_(dp), options_(options) {
  const int64_t DP = dp_.size();
  const std::string where = fmt::format("GradBuckets on {}", dp_.name());
  MT_CHECK(grads.defined(), where + ": expected a gradient buffer, got an undefined tensor");
  MT_CHECK(grads.dtype() == DType::kF32 || grads.dtype() == DType::kF64,
           fmt::format("{}: expected an fp32 or fp64 gradient buffer, got {}", where, dtype_name(grads.dtype())));
  const int64_t N = grads.numel();
  grads_ = grads.view({N});
  if (params.defined()) {
    MT_CHECK(params.numel() == N, fmt::format("{}: expected the parameter buffer to have as many elements as the "
                                              "gradient buffer ({}), got {}",
                                              where, N, params.numel()));
    MT_CHECK(params.dtype() == grads.dtype(),
             fmt::format("{}: expected parameter and gradient buffers of one dtype, got {} and {}", where,
                         dtype_name(params.dtype()), dtype_name(grads.dtype())));
    params_ = params.view({N});
  }
  MT_CHECK(N % DP == 0, fmt::format("{}: expected the buffer length {} to be a multiple of the data-parallel size "
                                    "{} (set GPTOptions::flat_multiple to the DP size)",
                                    where, N, DP));
  MT_CHECK(options_.bucket_elems >= 0,
           fmt::format("{}: expected bucket_elems >= 0 (--ddp-bucket-size), got {}", where, options_.bucket_elems));
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const ParamRange& r = ranges_[i];
    MT_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= N,
             fmt::format("{}: parameter range {} is [{}, {}), expected 0 <= begin <= end <= {} (the buffer)", where,
                         i, r.begin, r.end, N));
    MT_CHECK(i == 0 || ranges_[i - 1].end <= r.begin,
             fmt::format("{}: parameter ranges must be sorted and disjoint, but range {} [{}, {}) starts before "
                         "range {} ends ({})",
                         where, i, r.begin, r.end, i - 1, ranges_[i - 1].end));
  }

  // Buckets: parameters in reverse order; close a bucket once it holds at
  // least bucket_elems elements, at the parameter's start rounded down to a
  // multiple of DP. A boundary at 0 is left to the final bucket.
  if (!options_.overlap_grad_reduce) {
    buckets_.push_back(Bucket{0, N, {}});
  } else {
    const int64_t cap = options_.bucket_elems > 0 ? options_.bucket_elems : std::max<int64_t>(40000000, 1000000 * DP);
    int64_t end = N;
    for (size_t k = ranges_.size(); k-- > 0;) {
      if (end - ranges_[k].begin < cap) continue;
      const int64_t start = ranges_[k].begin / DP * DP;
      if (start <= 0) break;
      buckets_.push_back(Bucket{start, end, {}});
      end = start;
    }
    if (end > 0 || buckets_.empty()) buckets_.push_back(Bucket{0, end, {}});
  }
  for (Bucket& b : buckets_)
    for (size_t i = 0; i < ranges_.size(); ++i)
      if (ranges_[i].begin < b.end && ranges_[i].end > b.begin && ranges_[i].begin < ranges_[i].end)
        b.params.push_back(static_cast<int>(i));

  // This rank's blocks.
  const int64_t r = dp_.rank();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    if (options_.mode == GradReduceMode::kReduceScatter) {
      const int64_t blk = (bk.end - bk.begin) / DP;
      shard_.push_back(ShardBlock{bk.begin + r * blk, bk.begin + (r + 1) * blk, static_cast<int>(b)});
    } else {
      shard_.push_back(ShardBlock{bk.begin, bk.end, static_cast<int>(b)});
    }
  }

  // Receive buffers for the reduce-scatter, allocated once.
  if (options_.mode == GradReduceMode::kReduceScatter && reduces() && N > 0) {
    block_arena_ = Arena((N / DP) * dtype_size(grads_.dtype()), "grad-bucket-blocks", grads_.device());
    Tensor all = block_arena_.alloc({N / DP}, grads_.dtype());
    int64_t off = 0;
    for (const Bucket& bk : buckets_) {
      const int64_t blk = (bk.end - bk.begin) / DP;
      block_tmp_.push_back(all.slice(off, off + blk));
      off += blk;
    }
  }

  launched_.assign(buckets_.size(), 0);
  param_ready_.assign(ranges_.size(), 0);
  grad_work_.resize(buckets_.size());
  param_work_.resize(buckets_.size());
}

GradBuckets::~GradBuckets() {
  // The temporaries and the buffers must outlive every request using them.
  for (auto& w : grad_work_)
    if (w) w->wait();
  for (auto& w : param_work_)
    if (w) w->wait();
}

void GradBuckets::begin_last_backward() {
  MT_CHECK(std::none_of(grad_work_.begin(), grad_work_.end(), [](const auto& w) { return w != nullptr; }),
           fmt::format("GradBuckets on {}: begin_last_backward() while gradient reductions are in flight; call "
                       "finish() first",
                       dp_.name()));
  std::fill(launched_.begin(), launched_.end(), 0);
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  armed_ = true;
}

void GradBuckets::mark_ready(int stage) {
  if (!options_.overlap_grad_reduce || !reduces() || !armed_) return;
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (ranges_[i].stage == stage) param_ready_[i] = 1;
  // Every rank marks the same stages in the same order, so buckets launch in
  // the same order everywhere (MPI matches collectives by order).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (launched_[b]) continue;
    const auto& ps = buckets_[b].params;
    if (std::all_of(ps.begin(), ps.end(), [&](int p) { return param_ready_[static_cast<size_t>(p)] != 0; }))
      launch(b);
  }
  for (auto& w : grad_work_)
    if (w) w->test();
}

void GradBuckets::launch(size_t b) {
  const Bucket& bk = buckets_[b];
  const Tensor view = grads_.slice(bk.begin, bk.end);
  const bool rs = options_.mode == GradReduceMode::kReduceScatter;
  if (options_.overlap_grad_reduce) {
    grad_work_[b] = rs ? dp_.ireduce_scatter(view, block_tmp_[b]) : dp_.iall_reduce(view);
  } else {
    if (rs) {
      dp_.reduce_scatter(view, block_tmp_[b]);
      copy_block_back(b);
    } else {
      dp_.all_reduce(view);
    }
  }
  launched_[b] = 1;
}

void GradBuckets::copy_block_back(size_t b) {
  const ShardBlock& s = shard_[b];
  const Tensor& tmp = block_tmp_[b];
  if (tmp.nbytes() > 0) copy_tensor(tmp, grads_.slice(s.begin, s.end));  // on the grads' device
}

void GradBuckets::finish() {
  armed_ = false;
  if (!reduces()) return;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!launched_[b]) launch(b);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!grad_work_[b]) continue;
    grad_work_[b]->wait();
    grad_work_[b].reset();
    if (options_.mode == GradReduceMode::kReduceScatter) copy_block_back(b);
  }
  std::fill(launched_.begin(), launched_.end(), 0);
}

void GradBuckets::all_gather_params() {
  if (options_.mode != GradReduceMode::kReduceScatter || !reduces()) return;
  MT_CHECK(params_.defined(), fmt::format("GradBuckets on {}: all_gather_params() needs the parameter buffer, but "
                                          "the buckets were built without one",
                                          dp_.name()));
  wait_param_gather_all();
  for (size_t b = 0; b < buckets_.size(); ++b)
    dp_.all_gather(params_.slice(shard_[b].begin, shard_[b].end), params_.slice(buckets_[b].begin, buckets_[b].end));
}

void GradBuckets::start_param_gather() {
  if (options_.mode != GradReduceMode::kReduceScatter || !reduces()) return;
  MT_CHECK(params_.defined(), fmt::format("GradBuckets on {}: start_param_gather() needs the parameter buffer, but "
                                          "the buckets were built without one",
                                          dp_.name()));
  MT_CHECK(std::none_of(param_work_.begin(), param_work_.end(), [](const auto& w) { return w != nullptr; }),
           fmt::format("GradBuckets on {}: start_param_gather() while the previous gather is in flight; wait for it "
                       "first (wait_param_gather_all)",
                       dp_.name()));
  for (size_t b = 0; b < buckets_.size(); ++b)
    param_work_[b] = dp_.iall_gather(params_.slice(shard_[b].begin, shard_[b].end),
                                     params_.slice(buckets_[b].begin, buckets_[b].end));
}

void GradBuckets::wait_param_gather(int stage) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!param_work_[b]) continue;
    const auto& ps = buckets_[b].params;
    if (std::any_of(ps.begin(), ps.end(), [&](int p) { return ranges_[static_cast<size_t>(p)].stage == stage; })) {
      param_work_[b]->wait();
      param_work_[b].reset();
    }
  }
}

void GradBuckets::wait_param_gather_all() {
  for (auto& w : param_work_)
    if (w) {
      w->wait();
      w.reset();
    }
}

}  // namespace mt::parallel
