// Optimizer in data-parallel training over MPI_COMM_WORLD, fp64 models:
// every rank holds different gradients (1/DP contributions); after the
// GradBuckets reduction, the distributed optimizer (kReduceScatter, state for
// this rank's blocks only, parameter all-gather) and the replicated one
// (kAllReduce) must both match a single-process optimizer fed the sum of all
// ranks' gradients: norms and parameters within 1e-12 relative. Also: the
// ranks' state ranges partition the parameters, NaN checks are collective,
// and the TP-aware norm counts replicated parameters once.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"

namespace mt::optim {
namespace {

using parallel::GradBucketOptions;
using parallel::GradBuckets;
using parallel::GradReduceMode;
using parallel::ParamRange;

model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 2, c.seq_length = 8;
  c.max_position_embeddings = 8, c.vocab_size = 30, c.make_vocab_size_divisible_by = 8;
  c.hidden_dropout = 0, c.attention_dropout = 0;
  c.untie_embeddings_and_output_weights = true;  // an output layer in stage L
  return c;
}

std::unique_ptr<model::GPTModel> make_model(int64_t flat_multiple) {
  model::GPTOptions o;
  o.micro_batch = 1;
  o.dtype = DType::kF64;
  o.flat_multiple = flat_multiple;
  auto m = model::GPTModel::create(tiny_config(), o);
  MT_CHECK(m.is_ok(), m.status().message());
  auto model = std::move(*m);
  model->init_parameters(4321);  // identical on every rank
  return model;
}

std::vector<ParamRange> param_ranges(const model::GPTModel& m) {
  std::vector<ParamRange> r;
  for (size_t i = 0; i < m.params().size(); ++i) {
    const int64_t off = m.flat_offset(static_cast<int>(i));
    r.push_back({off, off + m.params()[i].numel(),
                 model::param_stage(m.specs()[i], m.config().num_layers)});
  }
  return r;
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's gradient of element j of parameter i at `step`: k / (1024 DP) with
// an integer |k| <= 1000, so every partial sum over ranks is exact in fp64.
double grad_value(int r, int step, size_t i, int64_t j, int DP) {
  const uint64_t h = mix(mix(mix(static_cast<uint64_t>(r) * 1000003u + static_cast<uint64_t>(step)) ^ i) ^
                         static_cast<uint64_t>(j));
  const int64_t k = static_cast<int64_t>(h % 2001) - 1000;
  return static_cast<double>(k) / (1024.0 * DP);
}

void fill_rank_grads(model::GPTModel& m, int r, int step, int DP) {
  m.zero_grads();
  for (size_t i = 0; i < m.grads().size(); ++i) {
    const Tensor& g = m.grads()[i];
    for (int64_t j = 0; j < g.numel(); ++j) g.ptr<double>()[j] = grad_value(r, step, i, j, DP);
  }
}

// The reference holds the sum over all ranks (computed here, no MPI).
void fill_summed_grads(model::GPTModel& m, int step, int DP) {
  m.zero_grads();
  for (size_t i = 0; i < m.grads().size(); ++i) {
    const Tensor& g = m.grads()[i];
    for (int64_t j = 0; j < g.numel(); ++j) {
      double s = 0;
      for (int r = 0; r < DP; ++r) s += grad_value(r, step, i, j, DP);
      g.ptr<double>()[j] = s;
    }
  }
}

void expect_params_near(const model::GPTModel& got, const model::GPTModel& ref, double rel, int step) {
  for (size_t i = 0; i < ref.params().size(); ++i) {
    const double* a = got.params()[i].ptr<double>();
    const double* b = ref.params()[i].ptr<double>();
    double diff = 0, scale = 0;
    for (int64_t j = 0; j < ref.params()[i].numel(); ++j) {
      diff = std::max(diff, std::fabs(a[j] - b[j]));
      scale = std::max(scale, std::fabs(b[j]));
    }
    EXPECT_LE(diff, rel * scale) << ref.specs()[i].name << " after step " << step;
  }
}

struct Variant {
  GradReduceMode mode;
  bool overlap_grad, overlap_param;
  int64_t bucket_elems;
};

// Several iterations of: per-rank gradients, bucketed reduction, clipping,
// AdamW; against the single-process reference on the summed gradients.
void run_against_reference(const Variant& v) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  const bool dist = v.mode == GradReduceMode::kReduceScatter;
  auto ref = make_model(1);
  auto model = make_model(DP);
  const int L = static_cast<int>(model->config().num_layers);
  GradBuckets gb(model->flat_grads(), model->flat_params(), param_ranges(*model), *dp,
                 GradBucketOptions{v.mode, v.overlap_grad, v.bucket_elems});
  OptimizerConfig cfg;
  Optimizer ref_opt(*ref, cfg);
  ParallelOptimizerOptions par;
  par.dp = dp.get();
  par.dist_buckets = dist ? &gb : nullptr;
  par.overlap_param_gather = dist && v.overlap_param;
  Optimizer opt(*model, cfg, par);
  EXPECT_EQ(opt.distributed(), dist);
  EXPECT_EQ(opt.exp_avg().empty(), dist);

  for (int step = 1; step <= 4; ++step) {
    const double lr = 1e-2 / step, wd = 0.1;
    const double clip = step % 2 ? 1.0 : (step == 2 ? 0.0 : 1e6);  // clipping, disabled, not triggered
    fill_summed_grads(*ref, step, DP);
    const double ref_norm = ref_opt.clip_grad_norm(clip);
    ref_opt.step(lr, wd);

    fill_rank_grads(*model, r, step, DP);
    if (v.overlap_grad) {
      gb.begin_last_backward();
      for (int s = L; s >= -1; --s) gb.mark_ready(s);
    }
    gb.finish();
    EXPECT_TRUE(opt.grads_finite());
    const double norm = opt.clip_grad_norm(clip);
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm) << "step " << step;
    opt.step(lr, wd);
    if (par.overlap_param_gather) {  // the trainer waits per forward stage
      for (int s = -1; s <= L; ++s) gb.wait_param_gather(s);
      gb.wait_param_gather_all();
    }
    expect_params_near(*model, *ref, 1e-12, step);
  }
  EXPECT_EQ(opt.step_count(), 4);
}

TEST(DistOptimizer, ReduceScatterMatchesReference) {
  run_against_reference({GradReduceMode::kReduceScatter, false, false, 0});
}
TEST(DistOptimizer, ReduceScatterMatchesReference_OverlapSmallBuckets) {
  run_against_reference({GradReduceMode::kReduceScatter, true, true, 1000});
}
TEST(DistOptimizer, ReduceScatterMatchesReference_OverlapGradOnly) {
  run_against_reference({GradReduceMode::kReduceScatter, true, false, 700});
}
TEST(DistOptimizer, AllReduceMatchesReference) { run_against_reference({GradReduceMode::kAllReduce, false, false, 0}); }
TEST(DistOptimizer, AllReduceMatchesReference_Overlap) {
  run_against_reference({GradReduceMode::kAllReduce, true, false, 1000});
}

// The union of every rank's state ranges covers every parameter element
// exactly once (and no padding); m/v are disjoint slices of one arena.
TEST(DistOptimizer, StateRangesPartitionParameters) {
  auto dp = comm::world_communicator();
  const int DP = dp->size();
  auto model = make_model(DP);
  GradBuckets gb(model->flat_grads(), model->flat_params(), param_ranges(*model), *dp,
                 GradBucketOptions{GradReduceMode::kReduceScatter, true, 500});
  ParallelOptimizerOptions par;
  par.dp = dp.get();
  par.dist_buckets = &gb;
  Optimizer opt(*model, {}, par);
  const int64_t N = model->flat_grads().numel();
  std::vector<int64_t> cover(static_cast<size_t>(N), 0);
  int64_t owned = 0;
  const char* lo = nullptr;
  const char* hi = nullptr;
  for (const StateRange& s : opt.state_ranges()) {
    const int64_t off = model->flat_offset(s.param);
    ASSERT_LE(0, s.begin);
    ASSERT_LT(s.begin, s.end);
    ASSERT_LE(s.end, model->params()[static_cast<size_t>(s.param)].numel());
    EXPECT_EQ(s.m.numel(), s.end - s.begin);
    EXPECT_EQ(s.v.numel(), s.end - s.begin);
    EXPECT_EQ(s.m.dtype(), DType::kF64);
    for (int64_t j = off + s.begin; j < off + s.end; ++j) cover[static_cast<size_t>(j)] += 1;
    owned += s.end - s.begin;
    for (const Tensor& t : {s.m, s.v}) {
      const char* b = static_cast<const char*>(t.data());
      lo = lo ? std::min(lo, b) : b;
      hi = hi ? std::max(hi, b + t.nbytes()) : b + t.nbytes();
    }
  }
  // One arena of 2 x owned elements (each half 64-byte aligned) holds every m and v.
  EXPECT_GE(opt.state_bytes(), 2 * static_cast<size_t>(owned) * sizeof(double));
  EXPECT_LE(opt.state_bytes(), 2 * static_cast<size_t>(owned) * sizeof(double) + 128);
  if (owned > 0) {
    EXPECT_LE(static_cast<size_t>(hi - lo), opt.state_bytes());
  }
  // Ranges follow the shard blocks in order, each inside its block.
  size_t b = 0;
  for (const StateRange& s : opt.state_ranges()) {
    const int64_t begin = model->flat_offset(s.param) + s.begin, end = begin + (s.end - s.begin);
    while (b < gb.shard().size() && !(gb.shard()[b].begin <= begin && end <= gb.shard()[b].end)) ++b;
    EXPECT_LT(b, gb.shard().size()) << "range [" << begin << ", " << end << ") out of block order";
  }

  dp->all_reduce(Tensor(cover.data(), {N}, DType::kI64));
  const double total = dp->all_reduce_scalar(static_cast<double>(owned));
  int64_t params_total = 0;
  std::vector<char> is_param(static_cast<size_t>(N), 0);
  for (size_t i = 0; i < model->params().size(); ++i) {
    const int64_t off = model->flat_offset(static_cast<int>(i)), n = model->params()[i].numel();
    params_total += n;
    for (int64_t j = off; j < off + n; ++j) is_param[static_cast<size_t>(j)] = 1;
  }
  int64_t wrong = 0;
  for (int64_t j = 0; j < N; ++j) wrong += cover[static_cast<size_t>(j)] != is_param[static_cast<size_t>(j)];
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(total, static_cast<double>(params_total));
}

// Without the distributed optimizer: one whole range per parameter whose m/v
// alias exp_avg()/exp_avg_sq().
TEST(DistOptimizer, NonDistributedStateRangesAreWholeParameters) {
  auto model = make_model(1);
  Optimizer opt(*model);
  ASSERT_EQ(opt.state_ranges().size(), model->params().size());
  for (size_t i = 0; i < model->params().size(); ++i) {
    const StateRange& s = opt.state_ranges()[i];
    EXPECT_EQ(s.param, static_cast<int>(i));
    EXPECT_EQ(s.begin, 0);
    EXPECT_EQ(s.end, model->params()[i].numel());
    EXPECT_EQ(s.m.data(), opt.exp_avg()[i].data());
    EXPECT_EQ(s.v.data(), opt.exp_avg_sq()[i].data());
  }
}

// A NaN in one rank's owned block makes grads_finite() false on every rank;
// a NaN in a block another rank owns (stale partial sums) is not looked at.
TEST(DistOptimizer, GradsFiniteIsCollective) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  auto model = make_model(DP);
  GradBuckets gb(model->flat_grads(), model->flat_params(), param_ranges(*model), *dp,
                 GradBucketOptions{GradReduceMode::kReduceScatter, false, 0});
  ParallelOptimizerOptions par;
  par.dp = dp.get();
  par.dist_buckets = &gb;
  Optimizer opt(*model, {}, par);
  fill_rank_grads(*model, r, 1, DP);
  gb.finish();
  EXPECT_TRUE(opt.grads_finite());

  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_FALSE(opt.state_ranges().empty());
  const StateRange& s = opt.state_ranges().back();
  double* owned = model->grads()[static_cast<size_t>(s.param)].ptr<double>() + s.end - 1;
  const double saved = *owned;
  if (r == DP - 1) *owned = nan;
  EXPECT_FALSE(opt.grads_finite()) << "rank " << r;
  *owned = saved;
  EXPECT_TRUE(opt.grads_finite());

  if (DP > 1) {  // rank 0 poisons an element it does not own
    std::vector<char> mine(static_cast<size_t>(model->flat_grads().numel()), 0);
    for (const parallel::ShardBlock& b : gb.shard())
      for (int64_t j = b.begin; j < b.end; ++j) mine[static_cast<size_t>(j)] = 1;
    double* other = nullptr;
    for (size_t i = 0; i < model->params().size() && !other; ++i) {
      const int64_t off = model->flat_offset(static_cast<int>(i));
      for (int64_t j = 0; j < model->params()[i].numel() && !other; ++j)
        if (!mine[static_cast<size_t>(off + j)]) other = model->grads()[i].ptr<double>() + j;
    }
    ASSERT_NE(other, nullptr);
    if (r == 0) *other = nan;
    EXPECT_TRUE(opt.grads_finite()) << "rank " << r;
  }
}

// --check-weight-hash-across-dp-replicas-interval: identical replicas match;
// one element changed on the last rank (the sign bit of an fp64 value, then
// its lowest mantissa bit) names that parameter, and only it, on every rank.
TEST(DistOptimizer, ParamHashesAcrossReplicas) {
  auto dp = comm::world_communicator();
  const int DP = dp->size(), r = dp->rank();
  auto model = make_model(DP);
  ParallelOptimizerOptions par;
  par.dp = dp.get();
  Optimizer opt(*model, {}, par);
  EXPECT_TRUE(opt.params_differing_across_replicas().empty());
  if (DP == 1) return;  // nothing to compare with
  const size_t victim = model->params().size() / 2;
  double* e = model->params()[victim].ptr<double>() + 3;
  const double saved = *e;
  for (const double changed : {-saved, std::nextafter(saved, 1e300)}) {
    if (r == DP - 1) *e = changed;
    const std::vector<std::string> differ = opt.params_differing_across_replicas();
    ASSERT_EQ(differ.size(), 1u) << "rank " << r;
    EXPECT_EQ(differ[0], model->specs()[victim].name) << "rank " << r;
    *e = saved;
  }
  EXPECT_TRUE(opt.params_differing_across_replicas().empty());
}

// TP-aware norm: with the world as a "TP group" whose ranks hold identical
// gradients, split parameters count once per rank and replicated ones once.
TEST(DistOptimizer, TensorParallelNormCountsReplicatedOnce) {
  auto tp = comm::world_communicator();
  const int TP = tp->size(), r = tp->rank();
  auto model = make_model(1);
  ParallelOptimizerOptions par;
  par.tp = tp.get();
  par.tp_rank = r;
  Optimizer opt(*model, {}, par);
  fill_rank_grads(*model, 0, 7, 1);  // the same on every rank
  double replicated = 0, split = 0;
  for (size_t i = 0; i < model->grads().size(); ++i) {
    const Tensor& g = model->grads()[i];
    double s = 0;
    for (int64_t j = 0; j < g.numel(); ++j) s += g.ptr<double>()[j] * g.ptr<double>()[j];
    (model->specs()[i].shard == model::ShardKind::kReplicated ? replicated : split) += s;
  }
  ASSERT_GT(replicated, 0);
  ASSERT_GT(split, 0);
  const double want = std::sqrt(replicated + TP * split);
  EXPECT_NEAR(opt.grad_norm(), want, 1e-12 * want);
  // NaN checks are all-reduced over TP.
  EXPECT_TRUE(opt.grads_finite());
  if (r == TP - 1) model->grads()[0].ptr<double>()[0] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(opt.grads_finite()) << "rank " << r;
}

}  // namespace
}  // namespace mt::optim
