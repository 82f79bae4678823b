// The emulator's cuBLASLt (fake/cublasLt.h): a host implementation of the
// subset gemm.cu uses that enforces cuBLASLt's documented contract, so a
// wrong layout, transpose, type, attribute size, alignment or workspace in
// gemm.cu fails here as it would (or might) on a GPU. The rules:
//
//  * cublasLtMatmul computes D = alpha * op(A) * op(B) + beta * C
//    (cublasLt.h: "Execute matrix multiplication (D = alpha * op(A) * op(B) + beta * C)").
//  * Every matrix layout is COLUMN-major by default (CUBLASLT_MATRIX_LAYOUT_ORDER
//    default CUBLASLT_ORDER_COL: "Leading dimension is the stride (in elements) to
//    the beginning of next column"), element (i, j) at base[i + j * ld].
//  * A layout describes the matrix AS STORED, before the op: NVIDIA's LtSgemm sample
//    creates Adesc as (transa == N ? m : k) x (transa == N ? k : m) with lda.
//    So op(A) must be m x k, op(B) k x n, C and D m x n.
//  * ld "must be large enough so that matrix memory locations are not overlapping
//    (e.g. greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of CUBLASLT_ORDER_COL)".
//  * SetAttribute returns CUBLAS_STATUS_INVALID_VALUE "if buf is NULL or sizeInBytes
//    doesn't match size of internal storage for selected attribute" (TRANSA/TRANSB:
//    int32_t; MAX_WORKSPACE_BYTES: uint64_t; MIN_ALIGNMENT_*: uint32_t, default 256).
//  * SCALE_TYPE "Defines data type of alpha and beta" (float for 32F, double for 64F);
//    pointer mode default HOST.
//  * MIN_ALIGNMENT_x_BYTES: "Selecting a smaller value will exclude algorithms that can
//    not work with matrix x that is not as strictly aligned as they need": the
//    returned algo is modelled as needing exactly the preferred alignment, and
//    cublasLtMatmul rejects (INVALID_VALUE) a pointer less aligned than the plan.
//  * beta == 0: C is not read (BLAS convention; cuBLAS "if beta == 0 then C does not
//    have to be a valid input").
//  * Type combinations modelled (a subset of the cublasLtMatmul table):
//      COMPUTE_32F / scale 32F: A,B 32F -> C,D 32F;  A,B 16BF -> C,D 32F or 16BF
//      COMPUTE_64F / scale 64F: A,B,C,D 64F
//    anything else: CUBLAS_STATUS_NOT_SUPPORTED.
//  * In-place (C == D) requires Cdesc to describe the same layout as Ddesc.
//  * The algo returned by the heuristic is bound to the problem it was planned
//    for; cublasLtMatmul with a different problem (descriptors' values) is rejected.
//  * The heuristic reports a workspace need (<= MAX_WORKSPACE_BYTES, at most
//    4 MiB); cublasLtMatmul rejects a smaller workspace and scribbles over the
//    bytes it was promised.
//  * Operands and workspace are device memory (the emulator's cudaMalloc).
// Every rejection prints its reason on stderr ("[cublasLt fake] ...");
// MT_EMU_TRACE=1 also prints each plan and each matmul's operand alignment.
//
// What it cannot catch: the real heuristics and algorithms (their choice,
// split-K, tensor cores, bf16 products rounded differently): the product is
// a plain loop accumulating in the compute type, so results agree with a
// GPU to rounding only. Empty matrices are not modelled (rejected).
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

struct cublasLtContext {
  uint64_t magic = 0xC0B1A5;
};
struct cublasLtMatmulDescFake {
  int32_t compute, scale, pointer_mode = 0, transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutFake {
  int32_t type;
  uint64_t rows, cols;
  int64_t ld;
  bool operator==(const cublasLtMatrixLayoutFake& o) const {
    return type == o.type && rows == o.rows && cols == o.cols && ld == o.ld;
  }
};
struct cublasLtMatmulPreferenceFake {
  uint32_t search_mode = 0;
  uint64_t max_ws = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

std::mutex g_mu;

struct PlannedProblem {
  cublasLtMatmulDescFake desc;
  cublasLtMatrixLayoutFake a, b, c, d;
  uint32_t align[4];
  uint64_t workspace;
};
std::vector<PlannedProblem> g_plans;
constexpr uint64_t kAlgoMagic = 0xA160FA4Eull;

cublasStatus_t fail(cublasStatus_t s, const std::string& why) {
  std::fprintf(stderr, "[cublasLt fake] %s -> %s\n", why.c_str(), cublasLtGetStatusName(s));
  return s;
}

size_t elem_size(int32_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16BF: return 2;
    case CUDA_R_16F: return 2;
  }
  return 0;
}

std::string lay_str(const cublasLtMatrixLayoutFake& l) {
  return "type " + std::to_string(l.type) + " " + std::to_string(l.rows) + "x" + std::to_string(l.cols) + " ld " +
         std::to_string(l.ld);
}

// Rows/cols of op(X) for a layout X.
void op_dims(const cublasLtMatrixLayoutFake& l, int32_t op, uint64_t& r, uint64_t& c) {
  if (op == CUBLAS_OP_N)
    r = l.rows, c = l.cols;
  else
    r = l.cols, c = l.rows;
}

// Validates a (desc, A, B, C, D) problem. Returns SUCCESS or the status to return.
cublasStatus_t check_problem(const cublasLtMatmulDescFake* d, const cublasLtMatrixLayoutFake* A,
                             const cublasLtMatrixLayoutFake* B, const cublasLtMatrixLayoutFake* C,
                             const cublasLtMatrixLayoutFake* D, const char* who) {
  std::string w = who;
  if (!d || !A || !B || !C || !D) return fail(CUBLAS_STATUS_INVALID_VALUE, w + ": null descriptor");
  for (int32_t op : {d->transa, d->transb})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
      return fail(CUBLAS_STATUS_INVALID_VALUE, w + ": bad TRANSA/TRANSB value " + std::to_string(op));
  if (d->transc != CUBLAS_OP_N) return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + ": TRANSC must be N");
  if (d->pointer_mode != 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + ": fake models host pointer mode only");
  // Types.
  bool ok = false;
  if (d->compute == CUBLAS_COMPUTE_32F && d->scale == CUDA_R_32F) {
    if (A->type == CUDA_R_32F && B->type == CUDA_R_32F)
      ok = C->type == CUDA_R_32F && D->type == CUDA_R_32F;
    else if (A->type == CUDA_R_16BF && B->type == CUDA_R_16BF)
      ok = C->type == D->type && (C->type == CUDA_R_32F || C->type == CUDA_R_16BF);
  } else if (d->compute == CUBLAS_COMPUTE_64F && d->scale == CUDA_R_64F) {
    ok = A->type == CUDA_R_64F && B->type == CUDA_R_64F && C->type == CUDA_R_64F && D->type == CUDA_R_64F;
  }
  if (!ok)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + ": unsupported type combination compute " +
                                                 std::to_string(d->compute) + " scale " + std::to_string(d->scale) +
                                                 " A " + std::to_string(A->type) + " B " + std::to_string(B->type) +
                                                 " C " + std::to_string(C->type) + " D " + std::to_string(D->type));
  // Leading dimensions (column order: ld >= rows).
  const cublasLtMatrixLayoutFake* L[4] = {A, B, C, D};
  const char* nm[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (L[i]->ld < 1 || static_cast<uint64_t>(L[i]->ld) < L[i]->rows)
      return fail(CUBLAS_STATUS_INVALID_VALUE, w + ": " + nm[i] + " ld < rows (" + lay_str(*L[i]) + ")");
    if (L[i]->rows == 0 || L[i]->cols == 0)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  w + ": fake does not model empty matrices (" + nm[i] + " " + lay_str(*L[i]) + ")");
  }
  // Dimensions: op(A) m x k, op(B) k x n, C and D m x n.
  uint64_t m, k, kb, n;
  op_dims(*A, d->transa, m, k);
  op_dims(*B, d->transb, kb, n);
  if (kb != k)
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + ": op(A) is " + std::to_string(m) + "x" + std::to_string(k) +
                                                 " but op(B) is " + std::to_string(kb) + "x" + std::to_string(n));
  if (C->rows != m || C->cols != n || D->rows != m || D->cols != n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + ": C/D must be " + std::to_string(m) + "x" + std::to_string(n) +
                                                 " (C " + lay_str(*C) + ", D " + lay_str(*D) + ")");
  return CUBLAS_STATUS_SUCCESS;
}

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16_bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

double load(const void* base, int32_t type, int64_t idx) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(base)[idx];
    case CUDA_R_64F: return static_cast<const double*>(base)[idx];
    case CUDA_R_16BF: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[idx]);
  }
  return NAN;
}

// The product in compute type Acc (float for COMPUTE_32F, double for COMPUTE_64F):
// element (i, j) of a column-major layout is base[i + j * ld].
template <typename Acc>
void run(const cublasLtMatmulDescFake& d, Acc alpha, Acc beta, const void* A, const cublasLtMatrixLayoutFake& la,
         const void* B, const cublasLtMatrixLayoutFake& lb, const void* C, const cublasLtMatrixLayoutFake& lc, void* D,
         const cublasLtMatrixLayoutFake& ld) {
  uint64_t m, k, kb, n;
  op_dims(la, d.transa, m, k);
  op_dims(lb, d.transb, kb, n);
  // Inputs converted once to Acc (exact: bf16 and fp32 values are representable).
  std::vector<Acc> av(la.rows * la.cols), bv(lb.rows * lb.cols);
  for (uint64_t c = 0; c < la.cols; ++c)
    for (uint64_t r = 0; r < la.rows; ++r)
      av[r + c * la.rows] = static_cast<Acc>(load(A, la.type, static_cast<int64_t>(r + c * la.ld)));
  for (uint64_t c = 0; c < lb.cols; ++c)
    for (uint64_t r = 0; r < lb.rows; ++r)
      bv[r + c * lb.rows] = static_cast<Acc>(load(B, lb.type, static_cast<int64_t>(r + c * lb.ld)));
  // op(A)(i, p) = A(i, p) or A(p, i); op(B)(p, j) = B(p, j) or B(j, p), on the copies repacked with ld == rows.
  const int64_t pa_i = d.transa == CUBLAS_OP_N ? 1 : la.rows, pa_p = d.transa == CUBLAS_OP_N ? la.rows : 1;
  const int64_t pb_p = d.transb == CUBLAS_OP_N ? 1 : lb.rows, pb_j = d.transb == CUBLAS_OP_N ? lb.rows : 1;
  std::vector<Acc> out(m * n);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      Acc s = 0;
      for (uint64_t p = 0; p < k; ++p) s += av[i * pa_i + p * pa_p] * bv[p * pb_p + j * pb_j];
      Acc v = alpha * s;
      if (beta != Acc(0)) v += beta * static_cast<Acc>(load(C, lc.type, static_cast<int64_t>(i + j * lc.ld)));
      out[i + j * m] = v;
    }
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      const int64_t idx = static_cast<int64_t>(i + j * ld.ld);
      const Acc v = out[i + j * m];
      switch (ld.type) {
        case CUDA_R_32F: static_cast<float*>(D)[idx] = static_cast<float>(v); break;
        case CUDA_R_64F: static_cast<double*>(D)[idx] = static_cast<double>(v); break;
        case CUDA_R_16BF: static_cast<uint16_t*>(D)[idx] = float_to_bf16_bits(static_cast<float>(v)); break;
      }
    }
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "cuBLASLt fake error";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new cublasLtMatmulDescFake{static_cast<int32_t>(compute), static_cast<int32_t>(scale)};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!d || !buf) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: null");
  int32_t* field = nullptr;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: field = &d->compute; break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: field = &d->scale; break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: field = &d->pointer_mode; break;
    case CUBLASLT_MATMUL_DESC_TRANSA: field = &d->transa; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: field = &d->transb; break;
    case CUBLASLT_MATMUL_DESC_TRANSC: field = &d->transc; break;
    default: return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: attribute not modelled by the fake");
  }
  if (size != sizeof(int32_t))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute: size " + std::to_string(size) + " != 4");
  std::memcpy(field, buf, 4);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutFake{static_cast<int32_t>(type), rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new cublasLtMatmulPreferenceFake;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!p || !buf) return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceSetAttribute: null");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      if (size != 4) return fail(CUBLAS_STATUS_INVALID_VALUE, "PREF_SEARCH_MODE: size != 4");
      std::memcpy(&p->search_mode, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != 8) return fail(CUBLAS_STATUS_INVALID_VALUE, "PREF_MAX_WORKSPACE_BYTES: size != 8");
      std::memcpy(&p->max_ws, buf, 8);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (size != 4) return fail(CUBLAS_STATUS_INVALID_VALUE, "PREF_MIN_ALIGNMENT: size != 4");
      std::memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
      return CUBLAS_STATUS_SUCCESS;
  }
  return fail(CUBLAS_STATUS_INVALID_VALUE, "MatmulPreferenceSetAttribute: attribute not modelled by the fake");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!h || h->magic != 0xC0B1A5) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "AlgoGetHeuristic: bad handle");
  if (requested <= 0 || !results || !returned || !pref)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "AlgoGetHeuristic: requestedAlgoCount <= 0 or null output/pref");
  *returned = 0;
  cublasStatus_t s = check_problem(d, A, B, C, D, "AlgoGetHeuristic");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  PlannedProblem p{*d, *A, *B, *C, *D, {}, 0};
  std::memcpy(p.align, pref->align, sizeof(p.align));
  p.workspace = pref->max_ws < (uint64_t{4} << 20) ? pref->max_ws : (uint64_t{4} << 20);
  g_plans.push_back(p);
  if (emu::trace())
    std::fprintf(stderr, "[cublasLt fake] plan %zu: transa %d transb %d A %s, B %s, C %s, D %s, align %u/%u/%u/%u\n",
                 g_plans.size() - 1, d->transa, d->transb, lay_str(*A).c_str(), lay_str(*B).c_str(),
                 lay_str(*C).c_str(), lay_str(*D).c_str(), p.align[0], p.align[1], p.align[2], p.align[3]);
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = g_plans.size() - 1;
  r.workspaceSize = p.workspace;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t ws_bytes, cudaStream_t) {
  std::unique_lock<std::mutex> lock(g_mu);
  if (!h || h->magic != 0xC0B1A5) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "Matmul: bad handle");
  cublasStatus_t s = check_problem(d, Adesc, Bdesc, Cdesc, Ddesc, "Matmul");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (!alpha || !beta || !A || !B || !D) return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: null pointer");
  // In-place needs identical C and D layouts; out-of-place: same type/rows/cols (checked above for rows/cols).
  if (C == D && !(*Cdesc == *Ddesc)) return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: C == D but Cdesc != Ddesc");
  // The algo and the problem it was planned for.
  if (!algo) return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: null algo (fake requires a heuristic's algo)");
  if (algo->data[0] != kAlgoMagic || algo->data[1] >= g_plans.size())
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: algo not from cublasLtMatmulAlgoGetHeuristic");
  const PlannedProblem& p = g_plans[algo->data[1]];
  if (emu::trace())
    std::fprintf(stderr, "[cublasLt fake] matmul with plan %lu: A%%256=%lu B%%256=%lu C%%256=%lu D%%256=%lu\n",
                 (unsigned long)algo->data[1], (unsigned long)(reinterpret_cast<uintptr_t>(A) % 256),
                 (unsigned long)(reinterpret_cast<uintptr_t>(B) % 256),
                 (unsigned long)(reinterpret_cast<uintptr_t>(C) % 256),
                 (unsigned long)(reinterpret_cast<uintptr_t>(D) % 256));
  if (!(p.a == *Adesc && p.b == *Bdesc && p.c == *Cdesc && p.d == *Ddesc) || p.desc.compute != d->compute ||
      p.desc.scale != d->scale || p.desc.transa != d->transa || p.desc.transb != d->transb)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: algo was planned for a different problem");
  // Alignment: each pointer at least as aligned as the preference the algo was chosen under,
  // and naturally aligned for its type.
  const void* ptr[4] = {A, B, C, D};
  const cublasLtMatrixLayoutFake* lay[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  const char* nm[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (i == 2 && !C) continue;  // (C is checked whenever passed, even with beta == 0)
    if (!emu::is_device_memory(ptr[i]))
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("Matmul: ") + nm[i] + " is not device memory");
    const auto addr = reinterpret_cast<uintptr_t>(ptr[i]);
    if (p.align[i] > 1 && addr % p.align[i] != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("Matmul: ") + nm[i] + " pointer " +
                                                   std::to_string(addr % 256) + " mod 256 is less aligned than the " +
                                                   std::to_string(p.align[i]) +
                                                   "-byte MIN_ALIGNMENT it was planned with");
    if (addr % elem_size(lay[i]->type) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string("Matmul: ") + nm[i] + " not aligned to its element");
  }
  if (ws_bytes < p.workspace || (p.workspace > 0 && !workspace))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: workspace smaller than the algo needs");
  if (workspace && !emu::is_device_memory(workspace))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: the workspace is not device memory");
  if (p.workspace > 0) std::memset(workspace, 0xA5, p.workspace);  // the library may use all of it
  {
    double bb = 0;
    if (d->compute == CUBLAS_COMPUTE_64F)
      std::memcpy(&bb, beta, 8);
    else {
      float bf;
      std::memcpy(&bf, beta, 4);
      bb = bf;
    }
    if (bb != 0 && !C) return fail(CUBLAS_STATUS_INVALID_VALUE, "Matmul: beta != 0 with null C");
  }
  lock.unlock();
  if (d->compute == CUBLAS_COMPUTE_64F) {
    double a, b;
    std::memcpy(&a, alpha, 8);
    std::memcpy(&b, beta, 8);
    run<double>(*d, a, b, A, *Adesc, B, *Bdesc, C, *Cdesc, D, *Ddesc);
  } else {
    float a, b;
    std::memcpy(&a, alpha, 4);
    std::memcpy(&b, beta, 4);
    run<float>(*d, a, b, A, *Adesc, B, *Bdesc, C, *Cdesc, D, *Ddesc);
  }
  return CUBLAS_STATUS_SUCCESS;
}
