// oneDNN-backed GEMM. fp32 goes through dnnl_sgemm (measured fastest here on
// most shapes), except x W^T with a long reduction (K >= 2N, K >= 1024, M >= 256:
// linear_fc2's forward), where oneDNN's matmul primitive (brgemm) is faster
// on Zen 4 (216 vs 173 GFLOP/s for GPT-2's 1024x768x3072, 2 threads; bench/
// gemm_bench) and Zen 5 (340 vs 265). Not for qkv's 1024x2304x768 (sgemm 360,
// matmul 325 on Zen 5) nor proj's 768x768 (even). bf16 through a matmul
// primitive where this oneDNN has bf16 kernels (AVX-512 and up), else widened
// to fp32 (gemm_half_widened: the same products; fp16 likewise). Primitives are cached
// per (dtype, shape, transposes, beta) since creating one costs far more than
// running a small one. The choice depends only on the shape, so results are
// deterministic.

#include "kernels/gemm.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/device.h"
#include "kernels/cpu/common.h"
#include "kernels/elementwise.h"

namespace mt::kernels::cpu {
namespace {

void check_operand(const Tensor& t, int64_t rows, int64_t cols, const char* name) {
  MT_CHECK(t.numel() >= rows * cols,
           fmt::format("gemm: operand {} has {} elements, needs {}x{}", name, t.numel(), rows, cols));
}

template <typename T>
void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B,
              T beta, T* C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k) {
        T a = ta ? A[k * M + i] : A[i * K + k];
        T b = tb ? B[j * K + k] : B[k * N + j];
        s += a * b;
      }
      C[i * N + j] = alpha * s + (beta == T(0) ? T(0) : beta * C[i * N + j]);
    }
  }
}

struct PrimKey {
  DType in;  // A and B: fp32, bf16 or fp16
  bool ta, tb, acc;
  int64_t M, N, K;
  DType c;  // fp32, or the 16-bit input type
  bool operator<(const PrimKey& o) const {
    return std::tie(in, ta, tb, acc, M, N, K, c) < std::tie(o.in, o.ta, o.tb, o.acc, o.M, o.N, o.K, o.c);
  }
};

dnnl::memory::data_type dnnl_type(DType t) {
  using dt = dnnl::memory::data_type;
  return t == DType::kBF16 ? dt::bf16 : t == DType::kF16 ? dt::f16 : dt::f32;
}

struct MatmulPrim {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
  size_t scratch_bytes = 0;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

const MatmulPrim& matmul_prim(const PrimKey& k) {
  static std::mutex mu;
  static std::map<PrimKey, MatmulPrim> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt in = dnnl_type(k.in);
  dnnl::memory::desc a({k.M, k.K}, in, k.ta ? dims{1, k.M} : dims{k.K, 1});
  dnnl::memory::desc b({k.K, k.N}, in, k.tb ? dims{1, k.K} : dims{k.N, 1});
  dnnl::memory::desc c({k.M, k.N}, dnnl_type(k.c), dims{k.N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  MatmulPrim p{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc().get_size()};
  return cache.emplace(k, std::move(p)).first->second;
}

// C = A B (beta 0) or C += A B (beta 1) through a cached matmul primitive.
void gemm_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B, float beta,
                 const Tensor& C) {
  MT_CHECK(beta == 0.0f || beta == 1.0f, "gemm (matmul primitive): beta must be 0 or 1");
  const MatmulPrim& p = matmul_prim(PrimKey{A.dtype(), ta, tb, beta == 1.0f, M, N, K, C.dtype()});
  thread_local dnnl::stream stream(engine());
  thread_local std::vector<char> scratch;
  if (scratch.size() < p.scratch_bytes) scratch.resize(p.scratch_bytes);
  dnnl::memory am(p.a, engine(), A.data()), bm(p.b, engine(), B.data()), cm(p.c, engine(), C.data());
  dnnl::memory sm(dnnl::memory::desc({static_cast<int64_t>(p.scratch_bytes)}, dnnl::memory::data_type::u8,
                                     dnnl::memory::dims{1}),
                  engine(), scratch.data());
  p.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                          {DNNL_ARG_SCRATCHPAD, sm}});
  stream.wait();
}

// Whether this CPU's oneDNN can build 16-bit matmul primitives: oneDNN 2.6
// has bf16 kernels from AVX-512 up and fp16 ones only with AVX512-FP16; where
// it has none the primitive descriptor cannot be created. Probed once per type.
bool half_matmul_available(DType t) {
  auto probe = [](DType h) {
    try {
      matmul_prim(PrimKey{h, false, true, false, 16, 16, 16, DType::kF32});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  };
  static const bool bf16_ok = probe(DType::kBF16), f16_ok = probe(DType::kF16);
  return t == DType::kBF16 ? bf16_ok : f16_ok;
}

// The 16-bit GEMM without 16-bit kernels: the operands widened to fp32
// (exactly) and one fp32 sgemm, whose products are the bf16 or fp16 products
// exactly (8- and 11-bit significands multiply exactly in fp32); a 16-bit C
// is read as fp32 for beta 1 and the sum rounded once, as the matmul
// primitive's sum post-op rounds. The same values as the primitive's up to
// the order of the fp32 accumulation.
template <typename H>
void gemm_half_widened(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                       float beta, const Tensor& C) {
  // Per call (freed on return): a 16-bit GEMM on such a CPU briefly holds
  // fp32 copies of its operands, outside the memory plan.
  std::vector<float> a, b, c;
  auto widen = [](const Tensor& t, int64_t n, std::vector<float>& out) {
    out.resize(static_cast<size_t>(n));
    const H* p = t.ptr<H>();
    float* o = out.data();
    if constexpr (std::is_same_v<H, f16>) {
      f16_widen_n(p, o, n);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = ld<float>(p[i]);
    }
  };
  widen(A, M * K, a);
  widen(B, K * N, b);
  const bool c_half = C.dtype() == dtype_of<H>();
  float* cp = c_half ? nullptr : C.ptr<float>();
  if (c_half) {
    if (beta == 1.0f) widen(C, M * N, c);
    else c.assign(static_cast<size_t>(M * N), 0.0f);
    cp = c.data();
  }
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, a.data(), ta ? M : K, b.data(),
                                tb ? K : N, beta, cp, N);
  MT_CHECK(st == dnnl_success, "gemm: dnnl_sgemm failed (16-bit operands widened to fp32)");
  if (c_half) {
    H* out = C.ptr<H>();
    const float* sum = c.data();
    if constexpr (std::is_same_v<H, f16>) {
      f16_round_n(sum, out, M * N);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < M * N; ++i) out[i] = to_out<H>(sum[i]);
    }
  }
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
          const Tensor& B, float beta, const Tensor& C) {
  check_operand(A, M, K, "A");
  check_operand(B, K, N, "B");
  check_operand(C, M, N, "C");
  if (M == 0 || N == 0) return;
  switch (A.dtype()) {
    case DType::kF32: {
      MT_CHECK(B.dtype() == DType::kF32 && C.dtype() == DType::kF32, "gemm: fp32 A needs fp32 B and C");
      if (!ta && tb && K >= 2 * N && K >= 1024 && M >= 256 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        gemm_matmul(ta, tb, M, N, K, A, B, beta, C);
        return;
      }
      dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A.ptr<float>(),
                                    ta ? M : K, B.ptr<float>(), tb ? K : N, beta, C.ptr<float>(), N);
      MT_CHECK(st == dnnl_success, "gemm: dnnl_sgemm failed");
      return;
    }
    case DType::kBF16:
    case DType::kF16: {
      const DType h = A.dtype();
      MT_CHECK(B.dtype() == h && (C.dtype() == DType::kF32 || C.dtype() == h),
               fmt::format("gemm: {0} A needs {0} B and an fp32 or {0} C (got B {1}, C {2})", dtype_name(h),
                           dtype_name(B.dtype()), dtype_name(C.dtype())));
      MT_CHECK(alpha == 1.0f, fmt::format("gemm {}: alpha must be 1", dtype_name(h)));
      MT_CHECK(beta == 0.0f || beta == 1.0f, fmt::format("gemm {}: beta must be 0 or 1", dtype_name(h)));
      if (half_matmul_available(h)) gemm_matmul(ta, tb, M, N, K, A, B, beta, C);
      else if (h == DType::kBF16) gemm_half_widened<bf16>(ta, tb, M, N, K, A, B, beta, C);
      else gemm_half_widened<f16>(ta, tb, M, N, K, A, B, beta, C);
      return;
    }
    case DType::kF64:
      MT_CHECK(B.dtype() == DType::kF64 && C.dtype() == DType::kF64, "gemm: fp64 A needs fp64 B and C");
      gemm_ref<double>(ta, tb, M, N, K, alpha, A.ptr<double>(), B.ptr<double>(), beta, C.ptr<double>());
      return;
    default:
      MT_CHECK(false, fmt::format("gemm: unsupported dtype {}", dtype_name(A.dtype())));
  }
}

void gemm_add(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B, const Tensor& R,
              const Tensor& D) {
  if (D.dtype() == DType::kBF16 || D.dtype() == DType::kF16) {
    // D = R, then D += A B by the matmul's sum post-op: the fp32 product
    // plus R, rounded to 16 bits once (as cuBLASLt's epilogue does).
    if (M == 0 || N == 0) return;
    const Tensor d = D.view(Shape{D.numel()}).slice(0, M * N);
    copy_tensor(R.view(Shape{R.numel()}).slice(0, M * N), d);
    gemm(ta, tb, M, N, K, 1.0f, A, B, 1.0f, D);
    return;
  }
  gemm(ta, tb, M, N, K, 1.0f, A, B, 0.0f, D);
  if (M == 0 || N == 0) return;
  const Tensor d = D.view(Shape{D.numel()}).slice(0, M * N);
  add(d, R.view(Shape{R.numel()}).slice(0, M * N), d);
}

}  // namespace mt::kernels::cpu
