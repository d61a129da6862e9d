// Neural-network kernels on the CPU (kernels/cpu/): matrix products, softmax, layer
// normalisation, reductions, softmax cross-entropy, dropout and Trilu.
// Plain functions over raw pointers and params structs. Shapes arrive resolved and checked
// by providers/cpu/, so the only errors raised here concern values known at run time
// (labels out of range); nothing allocates (callers pass scratch where it is needed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "base/thread_pool.h"
#include "kernels/rotary_layout.h"

namespace cleave::kernels::cpu {

// ---- Matrix products (matmul.cc) -------------------------------------------------------

// C = A @ op(B) for numpy matmul shapes. A 1-D A is read as [1, K] and a 1-D B as [K, 1];
// the added dim is dropped from the output. Batch dims (all but the last two) broadcast.
struct MatMulPlan {
  int64_t M = 1, N = 1, K = 0;
  bool trans_b = false;  // B's matrices are stored [N, K]
  bool trans_a = false;  // A's matrices are stored [K, M]
  int batch_rank = 0;
  int64_t batch_dims[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};  // elements between A's matrices per batch dim; 0 = broadcast
  int64_t b_strides[kMaxRank] = {};
  int out_rank = 0;
  int64_t out_dims[kMaxRank] = {};

  int64_t batch() const;
  std::span<const int64_t> out_shape() const { return {out_dims, static_cast<size_t>(out_rank)}; }
};

// Errors (InvalidArgument) when K differs, a batch dim does not broadcast, or an operand
// is a scalar.
absl::StatusOr<MatMulPlan> PlanMatMul(std::span<const int64_t> a_dims,
                                      std::span<const int64_t> b_dims, bool trans_b = false,
                                      bool trans_a = false);

// fp32 through OpenBLAS. beta 0 overwrites C; beta 1 adds to it (a pre-filled bias).
void MatMulF32(const MatMulPlan& p, const float* A, const float* B, float beta, float* C,
               ThreadPool* pool);
// Other arithmetic types: plain loops accumulating in T (ints wrap, as numpy's do).
// Instantiated for double, int32_t and int64_t.
template <typename T>
void MatMulLoops(const MatMulPlan& p, const T* A, const T* B, T* C, ThreadPool* pool);

// ONNX Gemm: Y[M, N] = alpha * op(A) @ op(B) + beta * C, with C (optional) of dims
// [c_rows, c_cols] where each is 1 (broadcast) or M / N respectively.
struct GemmOpParams {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;
  int64_t c_rows = 1, c_cols = 1;
};
// The parameters of a Gemm of 2-D A and B (op(A) [M, K], op(B) [K, N]) and C of `c_dims` (null:
// no C) broadcast to [M, N] from a scalar, [N], [1, N], [M, 1] or [M, N]; errors for other ranks,
// inner dims that differ, or a C that does not broadcast.
absl::StatusOr<GemmOpParams> PlanGemm(std::span<const int64_t> a_dims, std::span<const int64_t> b_dims,
                                      const std::span<const int64_t>* c_dims, bool trans_a, bool trans_b,
                                      float alpha, float beta);
// Instantiated for float (OpenBLAS) and double (loops).
template <typename T>
void GemmOp(const GemmOpParams& p, const T* A, const T* B, const T* C, T* Y, ThreadPool* pool);

// The activation FusedMatMul applies after its bias.
enum class Activation { kNone, kGelu, kGeluTanh };
// y[r, :] = act(y[r, :] + bias) for `rows` rows of `cols`; bias (length cols) may be null.
void BiasActivation(float* y, const float* bias, int64_t rows, int64_t cols, Activation act,
                    ThreadPool* pool);
void BiasActivation(double* y, const double* bias, int64_t rows, int64_t cols, Activation act,
                    ThreadPool* pool);
// Copies `row` (length cols) into each of `rows` rows of y.
template <typename T>
void BroadcastRows(T* y, const T* row, int64_t rows, int64_t cols, ThreadPool* pool);

// ---- Softmax (softmax.cc) ----------------------------------------------------------------

// Normalises over the middle dim of x viewed as [outer, axis, inner]. `log` gives
// LogSoftmax. Rows are shifted by their max before exp, so no input overflows.
struct SoftmaxParams {
  int64_t outer = 1, axis = 1, inner = 1;
  bool log = false;
};
void Softmax(const SoftmaxParams& p, const float* x, float* y, ThreadPool* pool);
void Softmax(const SoftmaxParams& p, const double* x, double* y, ThreadPool* pool);

// ---- Layer normalisation (layer_norm.cc) ---------------------------------------------------

// y = (x - mean) / sqrt(var + epsilon) * scale + bias over each of `rows` rows of `cols`
// elements; scale and bias (optional) have `cols` elements. mean and inv_std (optional,
// `rows` elements each, type U = the stash type) receive the row statistics.
struct LayerNormParams {
  int64_t rows = 0, cols = 0;
  double epsilon = 1e-5;
  // RMSNorm: no centring, y = x / sqrt(mean(x^2) + eps) * scale; the saved mean is 0 (mean
  // may be null).
  bool rms = false;
};
// Instantiated for (T, U) in {float, double}^2.
template <typename T, typename U>
void LayerNorm(const LayerNormParams& p, const T* x, const T* scale, const T* bias, T* y,
               U* mean, U* inv_std, ThreadPool* pool);

// ---- Rotary position embedding (rotary.cc) ----------------------------------------------------

// The layout (kernels/rotary_layout.h) holds x's leading dims.
static_assert(RotaryLayout::kMaxLeadRank >= kMaxRank - 1);
// The layout of x's rows against a cos / sin table of dims `table`: an error naming both shapes
// unless x's last dim is even and the table broadcasts to x (its last dim x's or 1).
absl::StatusOr<RotaryLayout> PlanRotary(std::span<const int64_t> x, std::span<const int64_t> table);
// Forward: y = x cos + rotate_half(x) sin with rotate_half(x) = concat(-x[h:], x[:h]), h = dim/2.
// Backward (x is dY): dX = dY cos + concat((dY sin)[h:], -(dY sin)[:h]), rotate_half's transpose.
// Instantiated for float and double.
template <typename T>
void Rotary(const RotaryLayout& p, bool backward, const T* x, const T* cos, const T* sin, T* y, ThreadPool* pool);

// ---- SwiGLU (swiglu.cc) --------------------------------------------------------------------

// y = silu(gate) * up = gate * sigmoid(gate) * up over n elements (LLaMA's gated MLP).
// Instantiated for float and double.
template <typename T>
void SwiGlu(const T* gate, const T* up, T* y, int64_t n, ThreadPool* pool);
// dgate = dy * up * silu'(gate), silu'(g) = s + g s (1 - s) with s = sigmoid(g); dup = dy *
// silu(gate). Either output may be null.
template <typename T>
void SwiGluGrad(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, ThreadPool* pool);

// ---- Reductions (reduce.cc) ----------------------------------------------------------------

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd };

// x's dims with size-1 dims dropped and neighbouring dims of equal status (reduced or
// kept) merged, so ReduceMean over [B, T, C] at axes {2} is a [B*T, C] row reduction and
// at axes {0, 1} a [B*T, C] column reduction.
struct ReducePlan {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  bool reduced[kMaxRank] = {};
  int64_t in_numel = 0;
  int64_t out_numel = 0;  // product of the kept dims
  int64_t count = 0;      // elements reduced into each output (product of reduced dims)
};
// `axes` are normalised to [0, rank) and distinct.
ReducePlan PlanReduce(std::span<const int64_t> dims, std::span<const int> axes);
// Instantiated for float, double, int32_t, int64_t; bool for kMax and kMin only.
// Float sums and products accumulate in double (integer ones in 64 bits, wrapping); an empty
// reduction yields 0 (sum), NaN (mean), 1 (product), -inf / the lowest value (max) and +inf /
// the highest value (min).
template <typename T>
void Reduce(ReduceKind kind, const ReducePlan& p, const T* x, T* y, ThreadPool* pool);

// ---- Softmax cross-entropy loss (loss.cc) -----------------------------------------------------

enum class LossReduction { kNone, kSum, kMean };
// scores [N, C, D] (D = product of the trailing dims, 1 when there are none), labels
// [N, D], weights [C] (optional). loss is [N, D] for kNone, else one element; log_prob
// (optional) is [N, C, D]. For kSum / kMean, `scratch` holds 2 * N * D doubles.
struct SceParams {
  int64_t N = 0, C = 0, D = 1;
  LossReduction reduction = LossReduction::kMean;
  std::optional<int64_t> ignore_index;
  // The gradient over a slice of the classes (a vocabulary-parallel loss): log_prob holds
  // classes [class_offset, class_offset + C) of `num_classes` (0: C, the whole range).
  int64_t class_offset = 0, num_classes = 0;
  // The scores are already log-probabilities (NegativeLogLikelihoodLoss): the loss is
  // -w x[label], with no softmax taken, its gradient -w [c == label], and no log_prob output.
  bool nll = false;
};
// InvalidArgument when a label that is not ignore_index lies outside [0, C).
// Instantiated for T in {float, double}, L in {int32_t, int64_t}.
template <typename T, typename L>
absl::Status SoftmaxCrossEntropy(const SceParams& p, const T* scores, const L* labels,
                                 const T* weights, T* loss, T* log_prob, double* scratch,
                                 ThreadPool* pool);

// ---- Dropout and Trilu (nn.cc) ----------------------------------------------------------------

// Training-mode dropout: element i is kept when u_i >= ratio, where u_0, u_1, ... are
// uniform doubles drawn from `gen` exactly as numpy's RandomState.uniform draws them, so a
// generator seeded with s reproduces RandomState(s) (the ONNX reference). Kept values are
// scaled by 1 / (1 - ratio). Draws happen in element order on one thread, so the mask does
// not depend on the thread count. mask may be null. Instantiated for float and double.
template <typename T>
void Dropout(std::mt19937& gen, float ratio, int64_t n, const T* x, T* y, bool* mask);
// One of those draws: numpy's random_sample (a 27-bit and a 26-bit word make a double in
// [0, 1)), compared against the ratio widened to double; true keeps the element.
inline bool DrawKeep(std::mt19937& gen, double ratio) {
  const uint32_t a = static_cast<uint32_t>(gen()) >> 5;
  const uint32_t b = static_cast<uint32_t>(gen()) >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0 >= ratio;
}
// Counter-based Dropout: elements 2j and 2j+1 take the two uniforms of Philox4x32-10 counter j
// under the key (kernels/philox.h), so a mask is a pure function of the key (recomputable,
// thread-count independent, the CUDA kernel's bits) and runs in parallel.
template <typename T>
void DropoutKeyed(uint64_t key, float ratio, int64_t n, const T* x, T* y, bool* mask, ThreadPool* pool);

// y = x with the elements outside the upper (j - i >= k) or lower (j - i <= k) triangle
// of each trailing [rows, cols] matrix set to zero. Works by element size.
struct TriluParams {
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t k = 0;
  bool upper = true;
  size_t elem_size = 4;
};
void Trilu(const TriluParams& p, const void* x, void* y, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
