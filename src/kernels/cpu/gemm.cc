// oneDNN-backed GEMM. fp32 goes through dnnl_sgemm (measured fastest here on
// most shapes), except x W^T with a long reduction (K >= 2N, K >= 1024, M >= 256:
// linear_fc2's forward), where oneDNN's matmul primitive (brgemm) is faster
// on Zen 4 (216 vs 173 GFLOP/s for GPT-2's 1024x768x3072, 2 threads; bench/
// gemm_bench) and Zen 5 (340 vs 265). Not for qkv's 1024x2304x768 (sgemm 360,
// matmul 325 on Zen 5) nor proj's 768x768 (even). bf16 through a matmul
// primitive where this oneDNN has bf16 kernels (AVX-512 and up), else widened
// to fp32 (gemm_bf16_widened: the same products). Primitives are cached
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
  bool bf16, ta, tb, acc;
  int64_t M, N, K;
  bool c_bf16;  // bf16 C (bf16 inputs only)
  bool operator<(const PrimKey& o) const {
    return std::tie(bf16, ta, tb, acc, M, N, K, c_bf16) < std::tie(o.bf16, o.ta, o.tb, o.acc, o.M, o.N, o.K, o.c_bf16);
  }
};

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
  const dt in = k.bf16 ? dt::bf16 : dt::f32;
  dnnl::memory::desc a({k.M, k.K}, in, k.ta ? dims{1, k.M} : dims{k.K, 1});
  dnnl::memory::desc b({k.K, k.N}, in, k.tb ? dims{1, k.K} : dims{k.N, 1});
  dnnl::memory::desc c({k.M, k.N}, k.c_bf16 ? dt::bf16 : dt::f32, dims{k.N, 1});
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
void gemm_matmul(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                 float beta, const Tensor& C) {
  MT_CHECK(beta == 0.0f || beta == 1.0f, "gemm (matmul primitive): beta must be 0 or 1");
  const MatmulPrim& p = matmul_prim(PrimKey{bf16, ta, tb, beta == 1.0f, M, N, K, C.dtype() == DType::kBF16});
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

// Whether this CPU's oneDNN can build bf16 matmul primitives: oneDNN 2.6
// has bf16 kernels from AVX-512 up; on an AVX2-only CPU the primitive
// descriptor cannot be created. Probed once.
bool bf16_matmul_available() {
  static const bool ok = [] {
    try {
      matmul_prim(PrimKey{true, false, true, false, 16, 16, 16, false});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

// The bf16 GEMM without bf16 kernels: the operands widened to fp32
// (exactly) and one fp32 sgemm, whose products are the bf16 products
// exactly (8-bit significands multiply exactly in fp32); a bf16 C is read
// as fp32 for beta 1 and the sum rounded to bf16 once, as the matmul
// primitive's sum post-op rounds. The same values as the primitive's up to
// the order of the fp32 accumulation.
void gemm_bf16_widened(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                       float beta, const Tensor& C) {
  // Per call (freed on return): a bf16 GEMM on such a CPU briefly holds
  // fp32 copies of its operands, outside the memory plan.
  std::vector<float> a, b, c;
  auto widen = [](const Tensor& t, int64_t n, std::vector<float>& out) {
    out.resize(static_cast<size_t>(n));
    const bf16* p = t.ptr<bf16>();
    float* o = out.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_float(p[i]);
  };
  widen(A, M * K, a);
  widen(B, K * N, b);
  const bool c_bf16 = C.dtype() == DType::kBF16;
  float* cp = c_bf16 ? nullptr : C.ptr<float>();
  if (c_bf16) {
    if (beta == 1.0f) widen(C, M * N, c);
    else c.assign(static_cast<size_t>(M * N), 0.0f);
    cp = c.data();
  }
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, a.data(), ta ? M : K, b.data(),
                                tb ? K : N, beta, cp, N);
  MT_CHECK(st == dnnl_success, "gemm: dnnl_sgemm failed (bf16 widened to fp32)");
  if (c_bf16) {
    bf16* out = C.ptr<bf16>();
    const float* sum = c.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M * N; ++i) out[i] = float_to_bf16(sum[i]);
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
        gemm_matmul(false, ta, tb, M, N, K, A, B, beta, C);
        return;
      }
      dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A.ptr<float>(),
                                    ta ? M : K, B.ptr<float>(), tb ? K : N, beta, C.ptr<float>(), N);
      MT_CHECK(st == dnnl_success, "gemm: dnnl_sgemm failed");
      return;
    }
    case DType::kBF16:
      MT_CHECK(B.dtype() == DType::kBF16 && (C.dtype() == DType::kF32 || C.dtype() == DType::kBF16),
               fmt::format("gemm: bf16 A needs bf16 B and an fp32 or bf16 C (got B {}, C {})", dtype_name(B.dtype()),
                           dtype_name(C.dtype())));
      MT_CHECK(alpha == 1.0f, "gemm bf16: alpha must be 1");
      MT_CHECK(beta == 0.0f || beta == 1.0f, "gemm bf16: beta must be 0 or 1");
      if (bf16_matmul_available()) gemm_matmul(true, ta, tb, M, N, K, A, B, beta, C);
      else gemm_bf16_widened(ta, tb, M, N, K, A, B, beta, C);
      return;
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
  if (D.dtype() == DType::kBF16) {
    // D = R, then D += A B by the matmul's sum post-op: the fp32 product
    // plus R, rounded to bf16 once (as cuBLASLt's epilogue does).
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
