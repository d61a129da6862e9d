// MatMul through cuBLASLt (providers/cuda/): row-major products as the column-major
// product of the transposes, batches as one strided-batched call where the strides allow,
// bias, tanh-GELU (writing or reading its input for training) and the bias gradient as epilogues.
#include "providers/cuda/cuda_matmul.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

absl::Status Lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return Internal("cuBLASLt ", what, ": ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")");
}

cudaDataType_t CudaType(DataType t) {
  return t == DataType::kBFloat16 ? CUDA_R_16BF : t == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
}

// Owns the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (y) cublasLtMatrixLayoutDestroy(y);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

absl::Status Layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                    int batch, int64_t stride) {
  RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld), "layout"));
  if (batch > 1) {
    RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
                       "batch count"));
    RETURN_IF_ERROR(Lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof(stride)),
                       "batch stride"));
  }
  return absl::OkStatus();
}

// The descriptors and the chosen algorithm of one product shape, made once: a training step
// repeats the same few shapes hundreds of times, and the heuristic query costs far more than
// the launch. Keyed by the handle too, so each provider (device) has its own entries.
struct GemmKey {
  const void* handle;
  int dt, out_dt;  // operands' and result's storage types
  int64_t M, N, K;
  int64_t lda;  // A's stored row length: M with trans_a, else K, or more for a slice of a wider A
  bool trans_a, trans_b;
  int batch;
  int64_t stride_a, stride_b, stride_c;
  bool bias, gelu_tanh;
  int bgrad;       // the bias gradient of: 0 none, 1 A (the call's B: BGRADB), 2 B (the call's A: BGRADA)
  int aux;         // the GELU input: 0 none, 1 written (GELU_AUX, GELU_AUX_BIAS), 2 read (DGELU)
  uint32_t align;  // bytes every pointer (and batch step) is aligned to, at most 256
  auto tie() const {
    return std::tie(handle, dt, out_dt, M, N, K, lda, trans_a, trans_b, batch, stride_a, stride_b, stride_c, bias,
                    gelu_tanh, bgrad, aux, align);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPlan {
  Descriptors ds;
  cublasLtMatmulAlgo_t algo;
  std::atomic<bool> refused{false};  // a bias-gradient or GELU-input epilogue the library cannot run (remembered)
  std::mutex mu;  // the bias and aux pointers are set on the shared descriptor for each call
};

std::atomic<int64_t> g_refused_bias_gradients{0};
std::atomic<int64_t> g_refused_gelu_aux{0};

void CountRefusal(const GemmKey& key) { (key.bgrad ? g_refused_bias_gradients : g_refused_gelu_aux).fetch_add(1); }

// What Gemm answers (its only Unimplemented) for a bias-gradient or GELU-input epilogue the
// library refuses: the caller runs the plain product and does the epilogue's work itself.
absl::Status EpilogueRefused() { return Unimplemented("cuBLASLt has no such epilogue for this product"); }

absl::StatusOr<GemmPlan*> PlanFor(const CudaExecutionProvider& p, const GemmKey& key);

// One (possibly strided-batched) product: D[M, N] = op(A) op(B) (+ bias) (gelu_tanh), row-major;
// A and B of type dt, D of type out_dt.
// With c_in, D = op(A) op(B) + beta c_in (c_in of D's type and layout; it may be c itself).
// With dbias (bgrad 1: the sums over K of op(A), [M]; 2: of op(B), [N]; D's type), the
// epilogue writes the bias gradient, or EpilogueRefused() has the caller do it. lda > 0: A's
// stored row length where it is wider than op(A) needs (one matrix). With aux (one matrix, D's
// type and shape): aux_mode 1 writes the GELU input there (gelu_tanh), 2 multiplies the product
// by the tanh-GELU's derivative at it (no bias); or EpilogueRefused().
absl::Status Gemm(const CudaExecutionProvider& p, DataType dt, DataType out_dt, const void* a, const void* b, void* c,
                  int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int batch, int64_t stride_a,
                  int64_t stride_b, int64_t stride_c, const void* bias, bool gelu_tanh, const void* c_in = nullptr,
                  float beta = 0.f, void* dbias = nullptr, int bgrad = 0, int64_t lda = 0, const void* aux = nullptr,
                  int aux_mode = 0) {
  // The algorithm must suit the operands' alignment (sub-matrices of a batch may sit at odd
  // offsets): the largest power of two up to 256 dividing every address and batch step.
  const size_t es = ElementSize(dt), out_es = ElementSize(out_dt);
  uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c) |
                   reinterpret_cast<uintptr_t>(bias) | reinterpret_cast<uintptr_t>(c_in) |
                   reinterpret_cast<uintptr_t>(dbias) | reinterpret_cast<uintptr_t>(aux) | 256;
  if (batch > 1) bits |= static_cast<uintptr_t>(stride_a * es) | static_cast<uintptr_t>(stride_b * es) |
                         static_cast<uintptr_t>(stride_c * out_es) | 256;
  const uint32_t align = static_cast<uint32_t>(bits & (~bits + 1));
  if (lda <= 0) lda = trans_a ? M : K;
  const GemmKey key{p.cublaslt(), static_cast<int>(dt), static_cast<int>(out_dt), M, N, K, lda, trans_a, trans_b, batch,
                    stride_a, stride_b, stride_c, bias != nullptr, gelu_tanh, dbias ? bgrad : 0, aux ? aux_mode : 0,
                    align};
  ASSIGN_OR_RETURN(GemmPlan * plan, PlanFor(p, key));
  if (plan->refused) return EpilogueRefused();
  std::lock_guard<std::mutex> lock(plan->mu);
  if (const void* vec = bias ? bias : dbias)
    RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(plan->ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                      sizeof(vec)),
                       "bias pointer"));
  if (aux)
    RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(plan->ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                      sizeof(aux)),
                       "aux pointer"));
  const float alpha = 1.f;
  if (!c_in) beta = 0.f;
  const cublasStatus_t st = cublasLtMatmul(static_cast<cublasLtHandle_t>(p.cublaslt()), plan->ds.op, &alpha, b, plan->ds.x, a,
                           plan->ds.y, &beta, c_in ? c_in : c, plan->ds.d, c, plan->ds.d, &plan->algo, p.workspace(),
                           p.workspace_bytes(), static_cast<cudaStream_t>(p.stream()));
  if (st != CUBLAS_STATUS_SUCCESS && (key.bgrad || key.aux) && !plan->refused.exchange(true)) {
    // Refused at the call rather than by the heuristic: nothing ran; the shape falls back from now on.
    CountRefusal(key);
    return EpilogueRefused();
  }
  return Lt(st, "matmul");
}

// The descriptors of `key` and the algorithm the heuristic picks for them, into *plan.
absl::Status Describe(const CudaExecutionProvider& p, const GemmKey& key, GemmPlan* plan) {
  const int64_t M = key.M, N = key.N, K = key.K;
  const bool trans_a = key.trans_a, trans_b = key.trans_b, gelu_tanh = key.gelu_tanh;
  const int batch = key.batch;
  const cudaDataType_t t = CudaType(static_cast<DataType>(key.dt)), out_t = CudaType(static_cast<DataType>(key.out_dt));
  Descriptors& ds = plan->ds;
  RETURN_IF_ERROR(Lt(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc"));
  // Column-major: D^T [N, M] = op(B)^T [N, K] * op(A)^T [K, M]; the first operand is B.
  const cublasOperation_t op_x = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof(op_x)), "transa"));
  RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof(op_y)), "transb"));
  if (key.bias || gelu_tanh || key.bgrad || key.aux) {
    // Our A is the call's B: its sums over K are BGRADB's (one per column of D^T); our B's are BGRADA's.
    const cublasLtEpilogue_t e =
        key.bgrad == 1   ? CUBLASLT_EPILOGUE_BGRADB
        : key.bgrad == 2 ? CUBLASLT_EPILOGUE_BGRADA
        : key.aux == 2   ? CUBLASLT_EPILOGUE_DGELU
        : key.aux == 1   ? (key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
        : key.bias       ? (gelu_tanh ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                         : CUBLASLT_EPILOGUE_GELU;
    RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)), "epilogue"));
    if (key.aux) {  // the GELU input is laid out as D^T [N, M]
      const int64_t aux_ld = N;
      RETURN_IF_ERROR(Lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                        sizeof(aux_ld)),
                         "aux leading dimension"));
    }
  }
  RETURN_IF_ERROR(trans_b ? Layout(&ds.x, t, K, N, K, batch, key.stride_b)
                          : Layout(&ds.x, t, N, K, N, batch, key.stride_b));
  RETURN_IF_ERROR(trans_a ? Layout(&ds.y, t, M, K, key.lda, batch, key.stride_a)
                          : Layout(&ds.y, t, K, M, key.lda, batch, key.stride_a));
  RETURN_IF_ERROR(Layout(&ds.d, out_t, N, M, N, batch, key.stride_c));
  RETURN_IF_ERROR(Lt(cublasLtMatmulPreferenceCreate(&ds.pref), "preference"));
  const size_t ws = p.workspace_bytes();
  RETURN_IF_ERROR(Lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                          sizeof(ws)),
                     "workspace preference"));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    RETURN_IF_ERROR(Lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, attr, &key.align, sizeof(key.align)),
                       "alignment preference"));
  cublasLtMatmulHeuristicResult_t best;
  int found = 0;
  auto handle = static_cast<cublasLtHandle_t>(p.cublaslt());
  RETURN_IF_ERROR(Lt(cublasLtMatmulAlgoGetHeuristic(handle, ds.op, ds.x, ds.y, ds.d, ds.d, ds.pref, 1, &best, &found),
                     "heuristic"));
  if (found == 0) return Internal("cuBLASLt found no algorithm for [", M, ",", K, "] x [", K, ",", N, "]");
  plan->algo = best.algo;
  return absl::OkStatus();
}

absl::StatusOr<GemmPlan*> PlanFor(const CudaExecutionProvider& p, const GemmKey& key) {
  static std::mutex cache_mu;
  static auto* cache = new std::map<GemmKey, std::unique_ptr<GemmPlan>>();
  std::lock_guard<std::mutex> lock(cache_mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second.get();
  auto plan = std::make_unique<GemmPlan>();
  if (absl::Status s = Describe(p, key, plan.get()); !s.ok()) {
    if (!key.bgrad && !key.aux) return s;
    // A library (or layout) without the bias-gradient or GELU-input epilogue: remembered, so the
    // shape is asked once and its products run plain, the caller doing the epilogue's work.
    plan->refused = true;
    CountRefusal(key);
  }
  GemmPlan* made = plan.get();
  (*cache)[key] = std::move(plan);
  return made;
}

}  // namespace

int64_t RefusedBiasGradientEpilogues() { return g_refused_bias_gradients.load(); }
int64_t RefusedGeluAuxEpilogues() { return g_refused_gelu_aux.load(); }

absl::Status CudaMatMul(const CudaExecutionProvider& p, const kernels::cpu::MatMulPlan& plan, DataType dt,
                        DataType out_dt, const void* a, const void* b, void* c, const void* bias, bool gelu_tanh,
                        const float* accumulate, bool reset, const DbiasRequest& dbias, int64_t lda,
                        const GeluAuxRequest& gelu_aux) {
  const int64_t M = plan.M, N = plan.N, K = plan.K, batch = plan.batch();
  if (gelu_aux.formed) *gelu_aux.formed = false;
  if (lda > 0 && (batch != 1 || plan.batch_rank != 0 || lda < (plan.trans_a ? M : K)))
    return InvalidArgument("a row length of A (", lda, ") for one 2-D product with rows of at least ",
                           plan.trans_a ? M : K);
  if (dbias.dbias) {
    // One product whose epilogue forms a float32 bias gradient of A [K, M] or B [K, N].
    *dbias.formed = false;
    if (batch != 1 || plan.batch_rank != 0 || out_dt != DataType::kFloat32 || bias || gelu_tanh ||
        (dbias.of_a ? !plan.trans_a : plan.trans_b))
      return Unimplemented("a bias gradient in the epilogue: one 2-D float32 product without bias or activation, "
                           "summing A [K, M] (transA) or B [K, N]");
    const int64_t n = dbias.of_a ? M : N;
    if (K == 0 && n > 0) {
      RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(dbias.dbias, 0, static_cast<size_t>(n) * sizeof(float), static_cast<cudaStream_t>(p.stream())),
          "MatMul dbias zero fill"));
      *dbias.formed = true;
    }
    if (K > 0 && M > 0 && N > 0) {
      const float* acc = reset ? nullptr : accumulate;
      absl::Status s = Gemm(p, dt, out_dt, a, b, c, M, N, K, plan.trans_a, plan.trans_b, 1, 0, 0, 0, nullptr, false,
                            acc, acc ? 1.f : 0.f, dbias.dbias, dbias.of_a ? 1 : 2, lda);
      if (s.ok()) {
        *dbias.formed = true;
        return s;
      }
      if (!absl::IsUnimplemented(s)) return s;  // Unimplemented: the epilogue was refused
    }
    // The product alone; the caller sums the operand.
  }
  if (batch == 0 || M == 0 || N == 0) return absl::OkStatus();
  const size_t es = ElementSize(dt), out_es = ElementSize(out_dt);
  // Per flattened batch index, each operand either steps by a whole matrix or stays put.
  bool a_contiguous = true, a_fixed = true, b_contiguous = true, b_fixed = true;
  int64_t ea = M * K, eb = K * N;
  for (int d = plan.batch_rank - 1; d >= 0; --d) {
    if (plan.batch_dims[d] == 1) continue;
    a_contiguous &= plan.a_strides[d] == ea;
    b_contiguous &= plan.b_strides[d] == eb;
    a_fixed &= plan.a_strides[d] == 0;
    b_fixed &= plan.b_strides[d] == 0;
    ea *= plan.batch_dims[d];
    eb *= plan.batch_dims[d];
  }
  if (gelu_aux.formed) {
    // The GELU input written or read in the epilogue: one product (the batch folded into M), its
    // [rows, N] aux rows a multiple of 8 elements long. Otherwise, or where the library refuses
    // it, nothing runs and the caller does the work itself.
    const bool fold = b_fixed && a_contiguous && !plan.trans_a;
    const bool read = gelu_aux.pre_in != nullptr;
    if ((fold || batch == 1) && K > 0 && N % 8 == 0 && lda == 0 && !accumulate && !dbias.dbias &&
        (read ? !bias && !gelu_tanh : gelu_tanh && gelu_aux.pre_out)) {
      absl::Status s = Gemm(p, dt, out_dt, a, b, c, fold ? batch * M : M, N, K, !fold && plan.trans_a, plan.trans_b,
                            1, 0, 0, 0, bias, gelu_tanh, nullptr, 0.f, nullptr, 0, 0,
                            read ? gelu_aux.pre_in : gelu_aux.pre_out, read ? 2 : 1);
      if (s.ok()) *gelu_aux.formed = true;
      if (!absl::IsUnimplemented(s)) return s;
    }
    return absl::OkStatus();
  }
  if (accumulate) {
    // A gradient added to its accumulation buffer in the epilogue (beta = 1), or written over it.
    if (batch != 1 || out_dt != DataType::kFloat32 || bias || gelu_tanh)
      return Unimplemented("accumulating into a buffer: one float32 product without bias or activation");
    if (K == 0) {
      if (reset)
        return CudaStatus(cudaMemsetAsync(c, 0, static_cast<size_t>(M * N) * out_es, static_cast<cudaStream_t>(p.stream())),
                          "MatMul zero fill");
      return CudaStatus(cudaMemcpyAsync(c, accumulate, static_cast<size_t>(M * N) * out_es, cudaMemcpyDeviceToDevice,
                                        static_cast<cudaStream_t>(p.stream())),
                        "MatMul accumulation copy");
    }
    return Gemm(p, dt, out_dt, a, b, c, M, N, K, plan.trans_a, plan.trans_b, 1, 0, 0, 0, nullptr, false,
                reset ? nullptr : accumulate, reset ? 0.f : 1.f, nullptr, 0, lda);
  }
  if (K == 0) {
    // An empty sum: zeros (plus the bias epilogue's work, which an empty product skips).
    if (bias || gelu_tanh) return Unimplemented("FusedMatMul with K = 0");
    return CudaStatus(
        cudaMemsetAsync(c, 0, static_cast<size_t>(batch * M * N) * out_es, static_cast<cudaStream_t>(p.stream())),
        "MatMul zero fill");
  }
  if (b_fixed && a_contiguous && !plan.trans_a) {
    // The batch folds into M: one product.
    return Gemm(p, dt, out_dt, a, b, c, batch * M, N, K, false, plan.trans_b, 1, 0, 0, 0, bias, gelu_tanh, nullptr, 0.f,
                nullptr, 0, lda);
  }
  if (lda > 0)  // one 2-D product (checked above)
    return Gemm(p, dt, out_dt, a, b, c, M, N, K, plan.trans_a, plan.trans_b, 1, 0, 0, 0, bias, gelu_tanh, nullptr, 0.f,
                nullptr, 0, lda);
  if ((a_contiguous || a_fixed) && (b_contiguous || b_fixed) && batch <= (int64_t{1} << 30))
    return Gemm(p, dt, out_dt, a, b, c, M, N, K, plan.trans_a, plan.trans_b, static_cast<int>(batch), a_fixed ? 0 : M * K,
                b_fixed ? 0 : K * N, M * N, bias, gelu_tanh);
  // Irregular broadcasting: one product per matrix.
  for (int64_t i = 0; i < batch; ++i) {
    int64_t rest = i, oa = 0, ob = 0;
    for (int d = plan.batch_rank - 1; d >= 0; --d) {
      const int64_t k = rest % plan.batch_dims[d];
      rest /= plan.batch_dims[d];
      oa += k * plan.a_strides[d];
      ob += k * plan.b_strides[d];
    }
    RETURN_IF_ERROR(Gemm(p, dt, out_dt, static_cast<const char*>(a) + oa * es, static_cast<const char*>(b) + ob * es,
                         static_cast<char*>(c) + i * M * N * out_es, M, N, K, plan.trans_a, plan.trans_b, 1, 0, 0, 0,
                         bias, gelu_tanh));
  }
  return absl::OkStatus();
}

}  // namespace cleave::providers
