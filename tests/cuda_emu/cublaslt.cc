// cuBLASLt's matmul over the emulated device (include/cublasLt.h): D = alpha op(A) op(B) +
// beta C, column-major, then the epilogue's bias (one value per row of D) and tanh-GELU, each
// element summed in double and rounded once to D's type. GELU_AUX(_BIAS) also writes the GELU
// input (after the bias) to the aux matrix in D's type, and DGELU multiplies the product by the
// tanh-GELU's derivative at the aux matrix's values; the aux leading dimension must be a
// multiple of 8 of at least D's rows, one matrix (no batch). The bias-gradient epilogues write the
// sums over k of op(A) (BGRADA: one per row of D) or of op(B) (BGRADB: one per column) to the
// bias pointer, in D's type. Attribute sizes, dimensions, the
// epilogue's bias pointer and each pointer's alignment against the one the algorithm was
// chosen for are checked as the library checks them, at the call: a mismatch is
// CUBLAS_STATUS_INVALID_VALUE. The product itself runs on the call's stream.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cublasLt.h"

struct cublasLtContext {
  int unused = 0;
};
struct cublasLtMatmulDescOpaque {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

cleave::cuda_emu::EpilogueRefusal g_bias_gradient_refusal = cleave::cuda_emu::EpilogueRefusal::kNone;

cleave::cuda_emu::EpilogueRefusal g_gelu_aux_refusal = cleave::cuda_emu::EpilogueRefusal::kNone;

bool IsBiasGradient(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB; }
bool IsGeluAux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

constexpr uint64_t kAlgoTag = 0x636c65617665ull;

template <typename T>
cublasStatus_t Put(T* field, const void* buf, size_t bytes) {
  if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

size_t Bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

double Load(cudaDataType_t t, const void* base, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return __half2float(static_cast<const __half*>(base)[i]);
}
void Store(cudaDataType_t t, void* base, int64_t i, double v) {
  const float f = static_cast<float>(v);
  if (t == CUDA_R_32F) static_cast<float*>(base)[i] = f;
  else if (t == CUDA_R_16BF) static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(f);
  else static_cast<__half*>(base)[i] = __float2half_rn(f);
}

struct Shape {
  int64_t m, n, k;
};
// op(A) [m, k] x op(B) [k, n] = D [m, n], with C like D; false when the layouts disagree.
bool Dims(const cublasLtMatmulDescOpaque& op, const cublasLtMatrixLayoutOpaque& a,
          const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
          const cublasLtMatrixLayoutOpaque& d, Shape* s) {
  const bool ta = op.trans_a == CUBLAS_OP_T, tb = op.trans_b == CUBLAS_OP_T;
  const uint64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  if (k != kb || d.rows != m || d.cols != n || c.rows != m || c.cols != n) return false;
  for (const auto* l : {&a, &b, &c, &d})
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1) return false;
  if (d.batch != a.batch || d.batch != b.batch || d.batch != c.batch) return false;
  if (a.type != b.type || c.type != d.type) return false;
  *s = {static_cast<int64_t>(m), static_cast<int64_t>(n), static_cast<int64_t>(k)};
  return true;
}

bool Aligned(const void* p, uint64_t bytes) { return bytes == 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

namespace cleave::cuda_emu {
void SetBiasGradientEpilogueRefusal(EpilogueRefusal refusal) { g_bias_gradient_refusal = refusal; }
void SetGeluAuxEpilogueRefusal(EpilogueRefusal refusal) { g_gelu_aux_refusal = refusal; }
}  // namespace cleave::cuda_emu

const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : s == CUBLAS_STATUS_INVALID_VALUE ? "an invalid value" : "an error";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new cublasLtMatmulDescOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return Put(&d->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return Put(&d->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return Put(&d->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return Put(&d->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return Put(&d->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return Put(&d->aux_ld, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  *l = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld, 1, 0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return Put(&l->batch, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return Put(&l->stride, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return Put(&p->workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return Put(&p->align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return Put(&p->align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return Put(&p->align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return Put(&p->align[3], buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// One algorithm, valid for pointers aligned as the preference says (kept in the algo).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t* results, int* found) {
  Shape s;
  if (!h || !op || !pref || requested < 1 || !Dims(*op, *a, *b, *c, *d, &s)) return CUBLAS_STATUS_INVALID_VALUE;
  if (IsBiasGradient(op->epilogue) &&
      (g_bias_gradient_refusal == cleave::cuda_emu::EpilogueRefusal::kAtHeuristic || d->batch > 1))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (IsGeluAux(op->epilogue) &&
      (g_gelu_aux_refusal == cleave::cuda_emu::EpilogueRefusal::kAtHeuristic || d->batch > 1))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = kAlgoTag;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = pref->align[i];
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t stream) {
  Shape s;
  if (!h || !op || !algo || algo->data[0] != kAlgoTag || !Dims(*op, *a, *b, *c, *d, &s))
    return CUBLAS_STATUS_INVALID_VALUE;
  const cublasLtEpilogue_t e = op->epilogue;
  const bool with_bias =
      e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu = e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                    e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool write_aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = e == CUBLASLT_EPILOGUE_DGELU;
  const bool grad_a = e == CUBLASLT_EPILOGUE_BGRADA, grad_b = e == CUBLASLT_EPILOGUE_BGRADB;
  if ((with_bias || grad_a || grad_b) && !op->bias) return CUBLAS_STATUS_INVALID_VALUE;
  if ((grad_a || grad_b) && (g_bias_gradient_refusal != cleave::cuda_emu::EpilogueRefusal::kNone || d->batch > 1))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (write_aux || dgelu) {
    if (g_gelu_aux_refusal != cleave::cuda_emu::EpilogueRefusal::kNone || d->batch > 1)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!op->aux || op->aux_ld % 8 != 0 || op->aux_ld < static_cast<int64_t>(d->rows) ||
        !Aligned(op->aux, algo->data[4]))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const double al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const void* ptrs[4] = {A, B, C, D};
  const cublasLtMatrixLayoutOpaque* layouts[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i) {
    const uint64_t need = algo->data[1 + i];
    if (!Aligned(ptrs[i], need)) return CUBLAS_STATUS_INVALID_VALUE;
    if (layouts[i]->batch > 1 && (layouts[i]->stride * static_cast<int64_t>(Bytes(layouts[i]->type))) %
                                         static_cast<int64_t>(need) != 0)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  ++cleave::cuda_emu::ThisThreadCalls().launches;
  // The product runs on the stream, with the descriptors as they are now (the library reads
  // them at the call) and alpha and beta read now (host pointers).
  cleave::cuda_emu::Enqueue(stream, [o = *op, la = *a, lb = *b, lc = *c, ld = *d, s, al, be, with_bias, gelu, write_aux,
                                     dgelu, grad_a, grad_b, A, B, C, D] {
    const cublasLtMatmulDescOpaque* op = &o;
    const cublasLtMatrixLayoutOpaque *a = &la, *b = &lb, *c = &lc, *d = &ld;
    const bool ta = op->trans_a == CUBLAS_OP_T, tb = op->trans_b == CUBLAS_OP_T;
    // The bias gradient (one matrix: the heuristic refuses batches): sums over k, in D's type.
    if (grad_a)
      for (int64_t i = 0; i < s.m; ++i) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p) sum += Load(a->type, A, ta ? p + i * a->ld : i + p * a->ld);
        Store(d->type, const_cast<void*>(op->bias), i, sum);
      }
    if (grad_b)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p) sum += Load(b->type, B, tb ? j + p * b->ld : p + j * b->ld);
        Store(d->type, const_cast<void*>(op->bias), j, sum);
      }
    std::vector<double> acc(static_cast<size_t>(s.m));
    for (int32_t bi = 0; bi < d->batch; ++bi) {
      const int64_t oa = bi * a->stride, ob = bi * b->stride, oc = bi * c->stride, od = bi * d->stride;
      for (int64_t j = 0; j < s.n; ++j) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t p = 0; p < s.k; ++p) {
          const double bv = Load(b->type, B, ob + (tb ? j + p * b->ld : p + j * b->ld));
          for (int64_t i = 0; i < s.m; ++i) acc[static_cast<size_t>(i)] += Load(a->type, A, oa + (ta ? p + i * a->ld : i + p * a->ld)) * bv;
        }
        for (int64_t i = 0; i < s.m; ++i) {
          double v = al * acc[static_cast<size_t>(i)];
          if (be != 0.0) v += be * Load(c->type, C, oc + i + j * c->ld);  // C is not read when beta is 0
          if (with_bias) v += Load(d->type, op->bias, i);
          if (write_aux) Store(d->type, const_cast<void*>(op->aux), i + j * op->aux_ld, v);
          if (gelu) v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
          if (dgelu) {  // d/dx of 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3)
            const double x = Load(d->type, op->aux, i + j * op->aux_ld);
            const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
            v *= 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
          }
          Store(d->type, D, od + i + j * d->ld, v);
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
