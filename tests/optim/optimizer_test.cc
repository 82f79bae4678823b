// Optimizer against an independent double-precision reference of
// PyTorch's AdamW (torch.optim.AdamW, foreach=False) with Megatron's gradient
// clipping and no-decay rule (wd_mult = 0 for "*.bias" and every 1-D
// parameter), over several steps with changing lr/wd, clipping on and off.

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <omp.h>
#include <random>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

namespace mt::optim {
namespace {

model::ModelConfig tiny_config(int64_t vocab = 30, bool qk = false) {
  model::ModelConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 2, c.seq_length = 8;
  c.max_position_embeddings = 8, c.vocab_size = vocab, c.make_vocab_size_divisible_by = 8;
  c.hidden_dropout = 0, c.attention_dropout = 0;
  c.qk_layernorm = qk;  // LayerNorm q/k norms: weights and biases
  return c;
}

std::unique_ptr<model::GPTModel> make_model(DType dt, bool bf16 = false, int64_t vocab = 30, bool qk = false,
                                            DType half = DType::kBF16) {
  model::GPTOptions o;
  o.micro_batch = 2;
  o.dtype = dt;
  o.half_compute = bf16;
  o.half = half;
  auto m = model::GPTModel::create(tiny_config(vocab, qk), o);
  MT_CHECK(m.is_ok(), m.status().message());
  auto model = std::move(*m);
  model->init_parameters(1234);
  return model;
}

double get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF64 ? t.ptr<double>()[i] : static_cast<double>(t.ptr<float>()[i]);
}
void set(const Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::kF64) t.ptr<double>()[i] = v;
  else t.ptr<float>()[i] = static_cast<float>(v);
}

// Fills every gradient with N(0, scale^2) values (deterministic per step).
void fill_grads(model::GPTModel& m, int step, double scale) {
  std::mt19937_64 g(1000 + step);
  std::normal_distribution<double> n(0.0, scale);
  for (const Tensor& t : m.grads())
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, n(g));
}

struct Reference {
  std::vector<std::vector<double>> p, m, v;
  std::vector<double> wd_mult;
  int64_t t = 0;
};

// Megatron's weight-decay groups (megatron/core/optimizer get_standard_config_overrides):
// 1-D parameters and biases are exempt, except the q/k norms with
// apply_wd_to_qk_layernorm.
Reference snapshot(const model::GPTModel& model, bool apply_wd_to_qk_layernorm = false) {
  Reference r;
  for (size_t i = 0; i < model.params().size(); ++i) {
    const Tensor& p = model.params()[i];
    std::vector<double> x(static_cast<size_t>(p.numel()));
    for (int64_t j = 0; j < p.numel(); ++j) x[static_cast<size_t>(j)] = get(p, j);
    r.p.push_back(x);
    r.m.emplace_back(x.size(), 0.0);
    r.v.emplace_back(x.size(), 0.0);
    const std::string& name = model.specs()[i].name;
    const bool qk = name.find("q_layernorm.") != std::string::npos || name.find("k_layernorm.") != std::string::npos;
    const bool no_wd = (p.ndim() == 1 || (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0)) &&
                       !(apply_wd_to_qk_layernorm && qk);
    r.wd_mult.push_back(no_wd ? 0.0 : 1.0);
  }
  return r;
}

// One reference step on gradients g (read as the model holds them, before
// clipping). Returns the pre-clip norm.
double reference_step(Reference& r, const std::vector<std::vector<double>>& g_in, double clip, double lr, double wd,
                      double b1, double b2, double eps) {
  double ss = 0;
  for (const auto& g : g_in)
    for (double x : g) ss += x * x;
  const double norm = std::sqrt(ss);
  double coef = 1.0;
  if (clip > 0 && clip / (norm + 1e-6) < 1.0) coef = clip / (norm + 1e-6);
  r.t += 1;
  const double bc1 = 1 - std::pow(b1, r.t), bc2 = 1 - std::pow(b2, r.t);
  for (size_t i = 0; i < r.p.size(); ++i) {
    for (size_t j = 0; j < r.p[i].size(); ++j) {
      const double g = g_in[i][j] * coef;
      double& p = r.p[i][j];
      double& m = r.m[i][j];
      double& v = r.v[i][j];
      p *= 1 - lr * wd * r.wd_mult[i];  // torch: param.mul_(1 - lr * weight_decay)
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g * g;
      const double denom = std::sqrt(v) / std::sqrt(bc2) + eps;
      p -= lr / bc1 * m / denom;
    }
  }
  return norm;
}

std::vector<std::vector<double>> read_grads(const model::GPTModel& m) {
  std::vector<std::vector<double>> r;
  for (const Tensor& t : m.grads()) {
    std::vector<double> x(static_cast<size_t>(t.numel()));
    for (int64_t j = 0; j < t.numel(); ++j) x[static_cast<size_t>(j)] = get(t, j);
    r.push_back(x);
  }
  return r;
}

// Worst over tensors of max_j |a - b| / max(max_j |b|, floor): errors relative
// to each tensor's scale (elementwise relative error is meaningless where
// the terms of m = b1 m + (1 - b1) g cancel).
double max_rel(const std::vector<Tensor>& a, const std::vector<std::vector<double>>& b, double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = 0, scale = floor;
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      const double ref = b[i][static_cast<size_t>(j)];
      err = std::max(err, std::abs(get(a[i], j) - ref));
      scale = std::max(scale, std::abs(ref));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

void run_against_reference(DType dt, double tol, bool qk = false, bool apply_wd_to_qk = false) {
  auto model = make_model(dt, false, 30, qk);
  OptimizerConfig cfg;
  cfg.beta1 = 0.8, cfg.beta2 = 0.95, cfg.eps = 1e-6, cfg.apply_wd_to_qk_layernorm = apply_wd_to_qk;
  Optimizer opt(*model, cfg);
  Reference ref = snapshot(*model, apply_wd_to_qk);
  // (grad scale, clip, lr, wd): step 1 and 3 clip, step 2 has clip off (0), step 4 does not need it.
  const double plan[][4] = {{1.0, 0.5, 1e-2, 0.1}, {0.3, 0.0, 5e-3, 0.2}, {2.0, 1.0, 2e-2, 0.05},
                            {1e-3, 1.0, 1e-2, 0.1}, {0.5, 3.0, 1e-3, 0.0}};
  int step = 0;
  for (const auto& s : plan) {
    fill_grads(*model, step++, s[0]);
    const auto g = read_grads(*model);
    const double norm = opt.clip_grad_norm(s[1]);
    opt.step(s[2], s[3]);
    const double ref_norm = reference_step(ref, g, s[1], s[2], s[3], cfg.beta1, cfg.beta2, cfg.eps);
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm) << "step " << step;
    EXPECT_EQ(opt.step_count(), step);
    EXPECT_LT(max_rel(model->params(), ref.p, 1e-3), tol) << "params after step " << step;
    EXPECT_LT(max_rel(opt.exp_avg(), ref.m, 1e-6), tol) << "exp_avg after step " << step;
    EXPECT_LT(max_rel(opt.exp_avg_sq(), ref.v, 1e-9), tol) << "exp_avg_sq after step " << step;
  }
  // The no-decay group really was exempt: a bias (zero-initialised, so only
  // Adam moves it) and a norm weight exist, with wd_mult 0; weights have 1.
  int nd = 0, d = 0;
  for (size_t i = 0; i < model->specs().size(); ++i) {
    EXPECT_EQ(opt.wd_mult()[i], ref.wd_mult[i]) << model->specs()[i].name;
    (opt.wd_mult()[i] == 0 ? nd : d)++;
  }
  EXPECT_GT(nd, 0);
  EXPECT_GT(d, 0);
}

TEST(AdamW, MatchesDoubleReference_Fp64) { run_against_reference(DType::kF64, 1e-12); }
TEST(AdamW, MatchesDoubleReference_Fp32) { run_against_reference(DType::kF32, 1e-5); }
// --qk-layernorm's norms are exempt like every norm, and decay with
// --apply-wd-to-qk-layernorm (weights and LayerNorm biases), nothing else changing.
TEST(AdamW, QkLayernormWeightDecayGroups) {
  run_against_reference(DType::kF64, 1e-12, /*qk=*/true, /*apply_wd_to_qk=*/false);
  run_against_reference(DType::kF64, 1e-12, /*qk=*/true, /*apply_wd_to_qk=*/true);
  auto model = make_model(DType::kF64, false, 30, true);
  OptimizerConfig cfg;
  cfg.apply_wd_to_qk_layernorm = true;
  Optimizer opt(*model, cfg);
  int qk = 0;
  for (size_t i = 0; i < model->specs().size(); ++i) {
    const std::string& n = model->specs()[i].name;
    const bool is_qk = n.find("_layernorm.") != std::string::npos && n.find("self_attention.") != std::string::npos;
    qk += is_qk;
    if (is_qk) {
      EXPECT_EQ(opt.wd_mult()[i], 1.0) << n;
    } else if (n.find("layernorm") != std::string::npos || n.find(".bias") != std::string::npos) {
      EXPECT_EQ(opt.wd_mult()[i], 0.0) << n;
    }
  }
  EXPECT_EQ(qk, 8);  // 2 layers x q/k x weight/bias
}

TEST(AdamW, StateIsOneArenaOfTwiceTheParameters) {
  auto model = make_model(DType::kF32);
  Optimizer opt(*model);
  int64_t n = 0;
  for (const Tensor& p : model->params()) n += p.numel();
  EXPECT_GE(opt.state_bytes(), 2 * static_cast<size_t>(n) * 4);
  EXPECT_LT(opt.state_bytes(), 2 * static_cast<size_t>(n) * 4 + 2 * 64 * model->params().size());
  ASSERT_EQ(opt.exp_avg().size(), model->params().size());
  for (size_t i = 0; i < opt.exp_avg().size(); ++i) {
    EXPECT_EQ(opt.exp_avg()[i].shape(), model->params()[i].shape());
    EXPECT_EQ(opt.exp_avg_sq()[i].dtype(), DType::kF32);
  }
  EXPECT_EQ(opt.config().beta1, 0.9);  // Megatron's defaults
  EXPECT_EQ(opt.config().beta2, 0.999);
  EXPECT_EQ(opt.config().eps, 1e-8);
}

TEST(AdamW, ClippingFollowsMegatron) {
  auto model = make_model(DType::kF32);
  Optimizer opt(*model);
  fill_grads(*model, 7, 1.0);
  const auto before = read_grads(*model);
  const double norm = opt.grad_norm();
  // Above the norm: coef >= 1, gradients untouched (bitwise).
  EXPECT_EQ(opt.clip_grad_norm(norm * 2), norm);
  EXPECT_EQ(read_grads(*model), before);
  // 0 disables clipping.
  EXPECT_EQ(opt.clip_grad_norm(0.0), norm);
  EXPECT_EQ(read_grads(*model), before);
  EXPECT_EQ(opt.pending_grad_scale(), 1.0);
  // Below: scaled by clip / (norm + 1e-6) -- applied by step() as it reads
  // each gradient, bitwise as if the gradients had been scaled in place first.
  const double clip = norm / 4;
  EXPECT_EQ(opt.clip_grad_norm(clip), norm);
  const double coef = clip / (norm + 1e-6);
  EXPECT_EQ(opt.pending_grad_scale(), coef);
  EXPECT_EQ(read_grads(*model), before) << "gradients are left for step() to scale";
  auto twin = make_model(DType::kF32, false);
  Optimizer twin_opt(*twin);
  fill_grads(*twin, 7, 1.0);
  for (const Tensor& g : twin->grads()) kernels::scale_inplace(g, coef);
  EXPECT_NEAR(twin_opt.grad_norm(), clip, 1e-5 * clip);
  opt.step(1e-3, 0.1);
  twin_opt.step(1e-3, 0.1);
  EXPECT_EQ(opt.pending_grad_scale(), 1.0) << "the scale is used once";
  for (size_t i = 0; i < model->params().size(); ++i)
    for (int64_t j = 0; j < model->params()[i].numel(); ++j)
      ASSERT_EQ(get(model->params()[i], j), get(twin->params()[i], j)) << model->specs()[i].name << "[" << j << "]";
}

// bf16 compute: step() writes the bf16 GEMM copies in the same pass, equal to
// a separate cast of the updated fp32 masters.
// The 16-bit GEMM copies (bf16 under --bf16, fp16 under --fp16) are the
// updated fp32 parameters rounded once, written by the step itself.
TEST(AdamW, HalfCopiesWrittenByTheStep) {
  for (DType half : {DType::kBF16, DType::kF16}) {
    auto model = make_model(DType::kF32, true, 30, false, half);
    Optimizer opt(*model);
    fill_grads(*model, 3, 1.0);
    opt.clip_grad_norm(0.5);
    opt.step(1e-2, 0.1);
    int checked = 0;
    for (size_t i = 0; i < model->params().size(); ++i) {
      const Tensor lp = model->low_precision(static_cast<int>(i));
      if (!lp.defined()) continue;
      ASSERT_EQ(lp.dtype(), half);
      for (int64_t j = 0; j < lp.numel(); ++j) {
        const float p = model->params()[i].ptr<float>()[j];
        const uint16_t want = half == DType::kBF16 ? float_to_bf16(p).bits : float_to_f16(p).bits;
        ASSERT_EQ(static_cast<const uint16_t*>(lp.data())[j], want) << model->specs()[i].name;
      }
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(AdamW, GradNormIsIndependentOfThreadCount) {
  auto model = make_model(DType::kF32, false, 5000);  // word embeddings alone span several 16K chunks
  Optimizer opt(*model);
  fill_grads(*model, 3, 1.0);
  const int threads = omp_get_max_threads();
  std::vector<double> norms;
  for (int t : {1, 2, 3, 5}) {
    omp_set_num_threads(t);
    norms.push_back(opt.grad_norm());
  }
  omp_set_num_threads(threads);
  for (double n : norms) EXPECT_EQ(n, norms[0]);  // bitwise
  double ref = 0;
  for (const auto& g : read_grads(*model))
    for (double x : g) ref += x * x;
  EXPECT_NEAR(norms[0], std::sqrt(ref), 1e-12 * std::sqrt(ref));
}

TEST(AdamW, GradsFiniteDetectsNanAndInf) {
  auto model = make_model(DType::kF32);
  Optimizer opt(*model);
  fill_grads(*model, 1, 1.0);
  EXPECT_TRUE(opt.grads_finite());
  Tensor g = model->grads().back();
  g.ptr<float>()[g.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(opt.grads_finite());
  g.ptr<float>()[g.numel() - 1] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(opt.grads_finite());
  g.ptr<float>()[g.numel() - 1] = 0.0f;
  EXPECT_TRUE(opt.grads_finite());
}

// --log-num-zeros-in-grad: every zero element of every gradient, +0 and -0
// alike, NaN not, each tensor once on one rank.
TEST(AdamW, GradZerosCountsEveryZeroElement) {
  auto model = make_model(DType::kF32, false, 5000);
  Optimizer opt(*model);
  fill_grads(*model, 3, 1.0);
  int64_t want = 0;
  for (const auto& g : read_grads(*model))
    for (double x : g) want += x == 0.0;
  EXPECT_EQ(opt.grad_zeros(), want);
  Tensor g = model->grads().front();
  for (int64_t j = 0; j < 1000; j += 3) g.ptr<float>()[j] = 0.0f;
  g.ptr<float>()[1] = -0.0f;
  g.ptr<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  want = 0;
  for (const auto& t : model->grads())
    for (int64_t j = 0; j < t.numel(); ++j) want += t.ptr<float>()[j] == 0.0f;
  EXPECT_GE(want, 335);
  EXPECT_EQ(opt.grad_zeros(), want);
  // Megatron counts after clipping: a value the clipping coefficient flushes
  // to 0 in fp32 counts (clip_grad_norm only records the coefficient).
  g.ptr<float>()[2] = 0.5f;  // no NaN in the norm (neither counts as a zero)
  g.ptr<float>()[4] = 1e-38f, g.ptr<float>()[5] = -1e-38f;
  opt.clip_grad_norm(1.0);
  EXPECT_EQ(opt.grad_zeros(), want);
  opt.clip_grad_norm(1e-9);  // coefficient ~1e-11: 1e-38 * 1e-11 underflows, the O(1) gradients do not
  ASSERT_LT(opt.pending_grad_scale(), 1e-8);
  EXPECT_EQ(opt.grad_zeros(), want + 2);
}

// --decoupled-lr / --decoupled-min-lr: the word embedding and the output
// layer step with the schedule's LR between the decoupled endpoints (the
// minimum defaulting to --min-lr), every other parameter with the default
// LR: each parameter bitwise what a plain optimizer at that LR gives.
TEST(AdamW, DecoupledLrForEmbeddingAndOutputLayer) {
  SchedulerConfig sc;
  sc.max_lr = 1e-2, sc.min_lr = 1e-3, sc.warmup_steps = 4, sc.decay_steps = 40, sc.decay_style = "cosine";
  sc.start_wd = sc.end_wd = 0.1;
  for (const std::optional<double> dmin : {std::optional<double>(2e-4), std::optional<double>()}) {
    auto untied = [] {
      model::ModelConfig c = tiny_config();
      c.untie_embeddings_and_output_weights = true;
      model::GPTOptions o;
      o.micro_batch = 2;
      auto m = model::GPTModel::create(c, o);
      MT_CHECK(m.is_ok(), m.status().message());
      (*m)->init_parameters(5);
      return std::move(*m);
    };
    auto a = untied(), b = untied(), d = untied();
    OptimizerConfig ca;
    ca.decoupled_lr = 3e-2, ca.decoupled_min_lr = dmin;
    Optimizer oa(*a, ca), ob(*b), od(*d);
    OptimizerParamScheduler s(sc);
    int decoupled = 0;
    for (size_t i = 0; i < a->specs().size(); ++i) decoupled += oa.decoupled(static_cast<int>(i));
    EXPECT_EQ(decoupled, 2) << "word embedding and output layer";
    for (int step = 0; step < 3; ++step) {
      s.step(step == 0 ? 0 : 30);  // past the warmup: the minimum matters near the end of the decay
      fill_grads(*a, step, 1.0), fill_grads(*b, step, 1.0), fill_grads(*d, step, 1.0);
      oa.step(s);
      ob.step(s.lr(), s.wd());
      od.step(s.lr_for(3e-2, dmin.value_or(sc.min_lr)), s.wd());
    }
    for (size_t i = 0; i < a->params().size(); ++i) {
      const model::GPTModel& want = oa.decoupled(static_cast<int>(i)) ? *d : *b;
      EXPECT_EQ(0, std::memcmp(a->params()[i].data(), want.params()[i].data(), a->params()[i].nbytes()))
          << a->specs()[i].name;
    }
  }
}

TEST(AdamW, SchedulerOverloadAndReset) {
  auto a = make_model(DType::kF32), b = make_model(DType::kF32);
  Optimizer oa(*a), ob(*b);
  SchedulerConfig sc;
  sc.max_lr = 1e-2, sc.min_lr = 1e-3, sc.warmup_steps = 4, sc.decay_steps = 40, sc.decay_style = "cosine";
  sc.start_wd = 0.0, sc.end_wd = 0.1, sc.wd_incr_steps = 40, sc.wd_incr_style = "linear";
  OptimizerParamScheduler s(sc);
  for (int i = 0; i < 3; ++i) {
    fill_grads(*a, i, 1.0), fill_grads(*b, i, 1.0);
    oa.step(s);
    ob.step(s.lr(), s.wd());
    s.step(4);
  }
  for (size_t i = 0; i < a->params().size(); ++i)
    ASSERT_EQ(0, std::memcmp(a->params()[i].data(), b->params()[i].data(), a->params()[i].nbytes()));
  oa.reset_state();
  EXPECT_EQ(oa.step_count(), 0);
  for (const Tensor& t : oa.exp_avg_sq())
    for (int64_t j = 0; j < t.numel(); ++j) ASSERT_EQ(t.ptr<float>()[j], 0.0f);
}

TEST(AdamW, Bf16CopiesAreRefreshedByStep) {
  auto model = make_model(DType::kF32, /*bf16=*/true);
  Optimizer opt(*model);
  std::vector<int32_t> tok(16), lab(16);
  for (int i = 0; i < 16; ++i) tok[i] = i % 30, lab[i] = (i * 7) % 30;
  Tensor tokens(tok.data(), {2, 8}, DType::kI32), labels(lab.data(), {2, 8}, DType::kI32);
  model->zero_grads();
  model->forward(0, tokens, labels, 0, false);
  model->backward(0);
  opt.step(1e-1, 0.0);  // a large step so that every bf16 weight moves
  const double after_step = model->forward(0, tokens, labels, 0, false);
  model->sync_low_precision();
  const double after_sync = model->forward(0, tokens, labels, 0, false);
  EXPECT_EQ(after_step, after_sync);  // step() already refreshed the bf16 copies
}

// ---------------------------------------------------------------- SGD

// --optimizer sgd against torch.optim.SGD itself (tests/optim/sgd_reference.py,
// float64), with Megatron's scheduler-set lr and weight decay per group and
// its clipping, over five steps that clip, skip clipping and change lr/wd.
void run_sgd_against_torch(DType dt, double momentum, double tol) {
  auto model = make_model(dt);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::kSgd;
  cfg.sgd_momentum = momentum;
  Optimizer opt(*model, cfg);
  EXPECT_EQ(opt.state_count(), momentum != 0 ? 1 : 0);
  const Reference start = snapshot(*model);
  // (grad scale, clip, lr, wd), as run_against_reference.
  const double plan[][4] = {{1.0, 0.5, 1e-1, 0.1}, {0.3, 0.0, 5e-2, 0.2}, {2.0, 1.0, 2e-1, 0.05},
                            {1e-3, 1.0, 1e-1, 0.1}, {0.5, 3.0, 1e-2, 0.0}};
  std::vector<std::vector<std::vector<double>>> grads;
  std::vector<double> norms;
  nlohmann::json steps = nlohmann::json::array();
  int step = 0;
  for (const auto& s : plan) {
    fill_grads(*model, step++, s[0]);
    grads.push_back(read_grads(*model));
    norms.push_back(opt.clip_grad_norm(s[1]));
    opt.step(s[2], s[3]);
    steps.push_back({{"lr", s[2]}, {"wd", s[3]}, {"clip", s[1]}});
  }
  std::vector<NamedTensor> ts;
  std::vector<std::vector<double>> keep = start.p;
  for (size_t i = 0; i < keep.size(); ++i)
    ts.push_back({fmt::format("param.{}", i), Tensor(keep[i].data(), {static_cast<int64_t>(keep[i].size())}, DType::kF64)});
  for (size_t s = 0; s < grads.size(); ++s)
    for (size_t i = 0; i < grads[s].size(); ++i)
      ts.push_back({fmt::format("grad.{}.{}", s, i),
                    Tensor(grads[s][i].data(), {static_cast<int64_t>(grads[s][i].size())}, DType::kF64)});
  const nlohmann::json meta = {{"momentum", momentum}, {"wd_mult", start.wd_mult}, {"steps", steps}};
  const std::string dir = std::string(MT_BINARY_DIR) + "/test-artifacts";
  std::filesystem::create_directories(dir);
  const std::string tag = fmt::format("{}_{}", dtype_name(dt), momentum);
  const std::string in = dir + "/sgd_ref_" + tag + "_in.safetensors", out = dir + "/sgd_ref_" + tag + "_out.safetensors";
  ASSERT_TRUE(write_safetensors(in, ts, {{"plan", meta.dump()}}).is_ok());
  const std::string cmd = "/usr/bin/python3 " + std::string(MT_SOURCE_DIR) + "/tests/optim/sgd_reference.py " + in + " " + out;
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "PyTorch is not installed for /usr/bin/python3 (apt install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  auto ref = read_safetensors(out);
  ASSERT_TRUE(ref.is_ok()) << ref.status().message();
  auto vec = [&](const std::string& name) {
    auto t = ref->get(name);
    MT_CHECK(t.is_ok(), t.status().message());
    const double* d = t->ptr<double>();
    return std::vector<double>(d, d + t->numel());
  };
  const std::vector<double> ref_norms = vec("norm");
  for (size_t s = 0; s < norms.size(); ++s) EXPECT_NEAR(norms[s], ref_norms[s], 1e-12 * ref_norms[s]) << "norm " << s;
  std::vector<std::vector<double>> ref_p, ref_b;
  for (size_t i = 0; i < model->params().size(); ++i) {
    ref_p.push_back(vec(fmt::format("param.{}", i)));
    if (momentum != 0) ref_b.push_back(vec(fmt::format("momentum_buffer.{}", i)));
  }
  EXPECT_LT(max_rel(model->params(), ref_p, 1e-3), tol) << "params";
  if (momentum != 0) {
    EXPECT_LT(max_rel(opt.exp_avg(), ref_b, 1e-6), tol) << "momentum buffers";
  } else {
    EXPECT_TRUE(opt.exp_avg().empty());
    EXPECT_EQ(opt.state_bytes(), 0u);
  }
}

TEST(Sgd, MatchesTorchSgd_Fp64) { run_sgd_against_torch(DType::kF64, 0.9, 1e-12); }
TEST(Sgd, MatchesTorchSgd_Fp32) { run_sgd_against_torch(DType::kF32, 0.9, 1e-5); }
TEST(Sgd, MatchesTorchSgdWithoutMomentum) { run_sgd_against_torch(DType::kF64, 0.0, 1e-12); }
TEST(Sgd, MatchesTorchSgdOtherMomentum) { run_sgd_against_torch(DType::kF32, 0.5, 1e-5); }

TEST(Sgd, StateIsOneBufferPerParameter) {
  auto model = make_model(DType::kF32);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::kSgd;
  Optimizer opt(*model, cfg);
  int64_t n = 0;
  for (const Tensor& p : model->params()) n += p.numel();
  EXPECT_GE(opt.state_bytes(), static_cast<size_t>(n) * 4);
  EXPECT_LT(opt.state_bytes(), static_cast<size_t>(n) * 4 + 64 * model->params().size());
  EXPECT_EQ(opt.state_names(), std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(opt.config().sgd_momentum, 0.9);  // Megatron's --sgd-momentum default
  EXPECT_TRUE(opt.exp_avg_sq().empty());
  for (const StateRange& r : opt.state_ranges()) {
    EXPECT_TRUE(r.m.defined());
    EXPECT_FALSE(r.v.defined());
  }
}

// The bf16 GEMM copies follow an SGD step too.
TEST(Sgd, Bf16CopiesAreRefreshedByStep) {
  auto model = make_model(DType::kF32, /*bf16=*/true);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::kSgd;
  Optimizer opt(*model, cfg);
  std::vector<int32_t> tok(16), lab(16);
  for (int i = 0; i < 16; ++i) tok[i] = i % 30, lab[i] = (i * 7) % 30;
  Tensor tokens(tok.data(), {2, 8}, DType::kI32), labels(lab.data(), {2, 8}, DType::kI32);
  model->zero_grads();
  const double before = model->forward(0, tokens, labels, 0, false);
  model->backward(0);
  opt.step(1.0, 0.0);
  const double after_step = model->forward(0, tokens, labels, 0, false);
  model->sync_low_precision();
  const double after_sync = model->forward(0, tokens, labels, 0, false);
  EXPECT_EQ(after_step, after_sync);
  EXPECT_LT(after_step, before);  // a descent step
}

}  // namespace
}  // namespace mt::optim
