// Matrix products on the CPU (kernels/cpu/): numpy matmul, ONNX Gemm and the bias +
// activation epilogue of FusedMatMul. fp32 goes to OpenBLAS; other types use plain loops.
// Every output element is computed by one thread in a fixed order, so results do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "base/shape.h"
#include "base/status.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

int64_t MatMulPlan::batch() const {
  int64_t n = 1;
  for (int i = 0; i < batch_rank; ++i) n *= batch_dims[i];
  return n;
}

absl::StatusOr<GemmOpParams> PlanGemm(std::span<const int64_t> a_dims, std::span<const int64_t> b_dims,
                                      const std::span<const int64_t>* c_dims, bool trans_a, bool trans_b,
                                      float alpha, float beta) {
  if (a_dims.size() != 2 || b_dims.size() != 2)
    return InvalidArgument("expected A and B of rank 2, got A ", DimsToString(a_dims), " and B ",
                           DimsToString(b_dims));
  GemmOpParams p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.alpha = alpha;
  p.beta = beta;
  p.M = a_dims[trans_a ? 1 : 0];
  p.K = a_dims[trans_a ? 0 : 1];
  p.N = b_dims[trans_b ? 0 : 1];
  if (b_dims[trans_b ? 1 : 0] != p.K)
    return InvalidArgument("inner dims differ: op(A) of A ", DimsToString(a_dims), " has K = ", p.K,
                           ", op(B) of B ", DimsToString(b_dims), " has K = ", b_dims[trans_b ? 1 : 0]);
  if (c_dims) {
    const std::span<const int64_t> c = *c_dims;
    p.c_rows = c.size() == 2 ? c[0] : 1;
    p.c_cols = !c.empty() ? c.back() : 1;
    if (c.size() > 2 || (p.c_rows != 1 && p.c_rows != p.M) || (p.c_cols != 1 && p.c_cols != p.N))
      return InvalidArgument("C ", DimsToString(c), " does not broadcast to [M, N] = [", p.M, ", ", p.N, "]");
  }
  return p;
}

absl::StatusOr<MatMulPlan> PlanMatMul(std::span<const int64_t> a_dims,
                                      std::span<const int64_t> b_dims, bool trans_b, bool trans_a) {
  const int ra = static_cast<int>(a_dims.size()), rb = static_cast<int>(b_dims.size());
  auto describe = [&] {
    return absl::StrCat("A ", DimsToString(a_dims.data(), ra), trans_a ? " (transposed)" : "", " and B ",
                        DimsToString(b_dims.data(), rb), trans_b ? " (transposed)" : "");
  };
  if (ra == 0 || rb == 0)
    return InvalidArgument("matmul expects operands of rank >= 1, got ", describe());
  if (trans_a && ra < 2) return InvalidArgument("a transposed A needs rank >= 2, got ", describe());
  MatMulPlan p;
  p.trans_b = trans_b;
  p.trans_a = trans_a;
  p.M = ra >= 2 ? a_dims[ra - (trans_a ? 1 : 2)] : 1;
  p.K = a_dims[ra - (trans_a ? 2 : 1)];
  int64_t kb = rb >= 2 ? b_dims[rb - (trans_b ? 1 : 2)] : b_dims[0];
  p.N = rb >= 2 ? b_dims[rb - (trans_b ? 2 : 1)] : 1;
  if (kb != p.K)
    return InvalidArgument("matmul inner dims differ: ", describe(), " give K = ", p.K, " vs ", kb);
  const int ba = std::max(ra - 2, 0), bb = std::max(rb - 2, 0);
  p.batch_rank = std::max(ba, bb);
  p.out_rank = p.batch_rank + (ra >= 2) + (rb >= 2);
  if (p.out_rank > kMaxRank)
    return InvalidArgument("matmul output rank ", p.out_rank, " exceeds ", kMaxRank);
  // Walk batch dims right to left so each operand's stride is the product of its own later
  // batch dims times its matrix size; broadcast dims get stride 0.
  int64_t sa = p.M * p.K, sb = p.K * p.N;
  for (int i = p.batch_rank - 1; i >= 0; --i) {
    int ia = i - (p.batch_rank - ba), ib = i - (p.batch_rank - bb);
    int64_t da = ia >= 0 ? a_dims[ia] : 1, db = ib >= 0 ? b_dims[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return InvalidArgument("matmul batch dims do not broadcast: ", describe(), " differ at batch axis ",
                             i, " (", da, " vs ", db, ")");
    p.batch_dims[i] = da == 1 ? db : da;
    p.a_strides[i] = da == 1 ? 0 : sa;
    p.b_strides[i] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  int r = 0;
  for (int i = 0; i < p.batch_rank; ++i) p.out_dims[r++] = p.batch_dims[i];
  if (ra >= 2) p.out_dims[r++] = p.M;
  if (rb >= 2) p.out_dims[r++] = p.N;
  return p;
}

namespace {

// True when A's matrices are stacked densely in batch order (no broadcast batch dim) and
// every product shares B: then the whole batch is one [batch * M, K] x [K, N] GEMM.
bool CanFoldBatchIntoM(const MatMulPlan& p) {
  if (p.trans_a) return false;
  int64_t expect = p.M * p.K;
  for (int i = p.batch_rank - 1; i >= 0; --i) {
    if (p.batch_dims[i] == 1) continue;
    if (p.b_strides[i] != 0 || p.a_strides[i] != expect) return false;
    expect *= p.batch_dims[i];
  }
  return true;
}

}  // namespace

void MatMulF32(const MatMulPlan& p, const float* A, const float* B, float beta, float* C,
               ThreadPool* pool) {
  const int64_t batch = p.batch();
  if (batch == 0 || p.M == 0 || p.N == 0) return;
  GemmParams g;
  g.M = p.M;
  g.N = p.N;
  g.K = p.K;
  g.trans_b = p.trans_b;
  g.trans_a = p.trans_a;
  g.beta = beta;
  if (CanFoldBatchIntoM(p)) {
    g.M = batch * p.M;
    Sgemm(g, A, B, C, pool);
    return;
  }
  GemmBatch gb;
  gb.rank = p.batch_rank;
  int64_t sc = p.M * p.N;
  for (int i = p.batch_rank - 1; i >= 0; --i) {
    gb.dims[i] = p.batch_dims[i];
    gb.stride_a[i] = p.a_strides[i];
    gb.stride_b[i] = p.b_strides[i];
    gb.stride_c[i] = sc;
    sc *= p.batch_dims[i];
  }
  SgemmBatched(g, gb, A, B, C, pool);
}

template <typename T>
void MatMulLoops(const MatMulPlan& p, const T* A, const T* B, T* C, ThreadPool* pool) {
  const int64_t rows = p.batch() * p.M, M = p.M, N = p.N, K = p.K;
  if (rows == 0 || N == 0) return;
  GemmBatch gb;  // only for its offset arithmetic
  gb.rank = p.batch_rank;
  for (int i = 0; i < p.batch_rank; ++i) {
    gb.dims[i] = p.batch_dims[i];
    gb.stride_a[i] = p.a_strides[i];
    gb.stride_b[i] = p.b_strides[i];
  }
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * K));
  ParallelFor(pool, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t oa, ob, oc;
      gb.Offsets(r / M, &oa, &ob, &oc);
      // Row r % M of op(A): contiguous, or a column of A's [K, M] matrix when transposed.
      const int64_t a_step = p.trans_a ? M : 1;
      const T* a = A + oa + (p.trans_a ? r % M : (r % M) * K);
      const T* b = B + ob;
      T* c = C + r * N;
      if (p.trans_b) {  // b is [N, K]: one dot product per output
        for (int64_t n = 0; n < N; ++n) {
          T acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += a[k * a_step] * b[n * K + k];
          c[n] = acc;
        }
      } else {  // i-k-j order: the inner loop runs along contiguous rows of B and C
        std::fill(c, c + N, T(0));
        for (int64_t k = 0; k < K; ++k) {
          const T av = a[k * a_step];
          const T* bk = b + k * N;
          for (int64_t n = 0; n < N; ++n) c[n] += av * bk[n];
        }
      }
    }
  });
}

template void MatMulLoops<double>(const MatMulPlan&, const double*, const double*, double*,
                                  ThreadPool*);
template void MatMulLoops<int32_t>(const MatMulPlan&, const int32_t*, const int32_t*, int32_t*,
                                   ThreadPool*);
template void MatMulLoops<int64_t>(const MatMulPlan&, const int64_t*, const int64_t*, int64_t*,
                                   ThreadPool*);

namespace {

// Y[m, n] = beta * C[m or 0, n or 0]: C broadcast to [M, N].
template <typename T>
void FillWithScaledC(const GemmOpParams& p, const T* C, T* Y) {
  const T beta = static_cast<T>(p.beta);
  for (int64_t m = 0; m < p.M; ++m) {
    const T* c = C + (p.c_rows == 1 ? 0 : m * p.c_cols);
    T* y = Y + m * p.N;
    if (p.c_cols == 1) std::fill(y, y + p.N, beta * c[0]);
    else for (int64_t n = 0; n < p.N; ++n) y[n] = beta * c[n];
  }
}

}  // namespace

template <typename T>
void GemmOp(const GemmOpParams& p, const T* A, const T* B, const T* C, T* Y, ThreadPool* pool) {
  GemmParams g;
  g.M = p.M;
  g.N = p.N;
  g.K = p.K;
  g.trans_a = p.trans_a;
  g.trans_b = p.trans_b;
  g.alpha = p.alpha;
  // beta * C is written first and the product accumulated onto it (sgemm's beta = 1), so
  // the broadcast C never needs a materialised [M, N] copy of its own.
  const bool with_c = C != nullptr && p.beta != 0.f;
  if (with_c) FillWithScaledC(p, C, Y);
  g.beta = with_c ? 1.f : 0.f;
  GemmOf<T>(g, A, B, Y, pool);
}

template void GemmOp<float>(const GemmOpParams&, const float*, const float*, const float*, float*,
                            ThreadPool*);
template void GemmOp<double>(const GemmOpParams&, const double*, const double*, const double*,
                             double*, ThreadPool*);

template <typename T>
void BroadcastRows(T* y, const T* row, int64_t rows, int64_t cols, ThreadPool* pool) {
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols));
  ParallelFor(pool, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(y + r * cols, row, cols * sizeof(T));
  });
}

template void BroadcastRows<float>(float*, const float*, int64_t, int64_t, ThreadPool*);
template void BroadcastRows<double>(double*, const double*, int64_t, int64_t, ThreadPool*);

void BiasActivation(float* y, const float* bias, int64_t rows, int64_t cols, Activation act,
                    ThreadPool* pool) {
  // One pass over each row while it is in cache: add the bias, then the activation in
  // place (the fast_math functions read each element before writing it).
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
  ParallelFor(pool, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = y + r * cols;
      if (bias)
        for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
      if (act == Activation::kGelu) GeluF32(row, row, cols);
      else if (act == Activation::kGeluTanh) GeluTanhF32(row, row, cols);
    }
  });
}

void BiasActivation(double* y, const double* bias, int64_t rows, int64_t cols, Activation act,
                    ThreadPool* pool) {
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  ParallelFor(pool, rows * cols, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      double v = y[i] + (bias ? bias[i % cols] : 0.0);
      if (act == Activation::kGelu) {
        // 0.5 x (1 + erf(x / sqrt 2)) written with erfc so negative tails do not cancel.
        v = 0.5 * v * std::erfc(-v * kInvSqrt2);
      } else if (act == Activation::kGeluTanh) {
        double u = kSqrt2OverPi * (v + 0.044715 * v * v * v);
        v = 0.5 * v * (1.0 + std::tanh(u));
      }
      y[i] = v;
    }
  });
}

}  // namespace cleave::kernels::cpu
