// CUDA kernel launchers (kernels/cuda/): host functions over device pointers, callable from
// C++ that never includes a CUDA header. Each enqueues its work on `stream` (a cudaStream_t)
// and returns the launch's cudaError_t as an int (0 = success); errors of the work itself
// surface at the stream's next synchronisation. Floating-point math accumulates in fp32
// whatever the storage type (fp32, bf16 or fp16), as the CPU kernels do.
#pragma once

#include <cstdint>

#include "kernels/grid_sample.h"
#include "kernels/nd_index.h"
#include "kernels/pad_coord.h"
#include "kernels/pool_window.h"
#include "kernels/random_draw.h"
#include "kernels/rotary_layout.h"

namespace cleave::kernels::cuda {

enum class Dt : int { kF32 = 0, kBf16 = 1, kF16 = 2 };  // the same values as Elem's first three

inline constexpr int kMaxRank = 8;

// Broadcasting of two operands into an output of `rank` dims: element strides of each
// operand per output dim (0 where the operand is broadcast).
struct Broadcast {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
};

// kMod: the remainder with the divisor's sign (ONNX Mod, fmod 0); kFmod: with the dividend's
// (C's fmod; fmod 1).
enum class BinaryOp : int { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow, kMod, kFmod, kPRelu,
                            // integers only (IntBinary): a shift by the width or more gives 0
                            kBitAnd, kBitOr, kBitXor, kShiftLeft, kShiftRight };
enum class UnaryOp : int { kIdentity, kRelu, kGelu, kGeluTanh, kTanh, kExp, kLog, kNeg, kSqrt, kSigmoid, kErf,
                           kReciprocal, kAbs, kSin, kCos,
                           kTan, kAsin, kAcos, kAtan, kSinh, kCosh, kAsinh, kAcosh, kAtanh,
                           kSoftplus, kSoftsign, kMish, kFloor, kCeil, kRound, kSign,
                           // with UnaryParams, as the CPU's ActivationParams (kernels/cpu/elementwise.h)
                           kLeakyRelu, kElu, kSelu, kCelu, kHardSigmoid, kHardSwish, kThresholdedRelu };
struct UnaryParams {
  float alpha = 0.f, beta = 0.f, gamma = 0.f;
};

// y = a op b; bc null when a, b and y have the same n elements.
int Binary(BinaryOp op, Dt dt, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc, void* stream);

// Element types of the comparison, integer and cast kernels: the float storage types, float64,
// the signed and unsigned integers, bool.
enum class Elem : int { kF32 = 0, kBf16 = 1, kF16 = 2, kI64, kI32, kBool, kF64, kI8, kI16, kU8, kU16, kU32, kU64 };
enum class CompareOp : int { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual, kAnd, kOr, kXor };
// y (bool) = a op b, with broadcasting as Binary: comparisons over any Elem (bf16 / fp16 compared
// as float32, so NaN compares false; bool only for Equal), And, Or and Xor over bool alone.
int Compare(CompareOp op, Elem t, const void* a, const void* b, bool* y, int64_t n, const Broadcast* bc, void* stream);
// y = a op b over any integer Elem, with broadcasting as Binary: Add, Sub and Mul wrap around; Div
// truncates toward zero and x / 0 is 0 (the CPU's); Max, Min; Mod and Fmod, x mod 0 and x mod -1
// being 0 (the CPU's); the bitwise ops and shifts. (No Pow.)
int IntBinary(BinaryOp op, Elem t, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc,
              void* stream);
// y = !x over bool.
int Not(const bool* x, bool* y, int64_t n, void* stream);
// y (bool) = x is NaN (nan), or else x is +inf (with pos) or -inf (with neg): IsNaN and IsInf.
int FloatClass(Dt dt, const void* x, bool* y, int64_t n, bool nan, bool pos, bool neg, void* stream);
int Unary(UnaryOp op, Dt dt, const void* x, void* y, int64_t n, void* stream, UnaryParams params = {});
// y = min(max(x, lo), hi) as the CPU's Clip compares: NaN passes through, and with lo > hi every
// element ends at hi.
int Clip(Dt dt, const void* x, void* y, int64_t n, float lo, float hi, void* stream);
int Cast(Dt from, Dt to, const void* x, void* y, int64_t n, void* stream);
// Cast between any two Elem types, as the CPU's Cast: float -> integer truncates toward zero,
// saturating (NaN -> 0); integers wrap; -> bool tests != 0; bool -> number is 0 / 1; float64 and
// integers -> bf16 / fp16 round once.
int CastElem(Elem from, Elem to, const void* x, void* y, int64_t n, void* stream);
// y [rows, cols] = alpha * y + beta * c, with c (null: none) of [c_rows, c_cols] broadcast to it
// (each 1 or the full size): Gemm's scaling and its C where the product's epilogue cannot.
int GemmScaleAdd(Dt dt, void* y, float alpha, const void* c, float beta, int64_t rows, int64_t cols, int64_t c_rows,
                 int64_t c_cols, void* stream);
// Training-mode dropout with the CPU's counter-based mask (kernels/cpu/nn.h DropoutKeyed):
// element 2j + h is kept when uniform h of Philox4x32-10 counter j under the key
// (kernels/philox.h), a double in [0, 1), is >= ratio, so the CPU and CUDA masks of one key are
// the same bits. mask may be null.
int DropoutKeyed(Dt dt, uint64_t key, float ratio, const void* x, void* y, bool* mask, int64_t n, void* stream);
// The same with a mask drawn elsewhere: y = keep ? x / (1 - ratio) : 0, the scale rounded to
// float32 as DropoutKeyed's.
int DropoutMasked(Dt dt, const bool* keep, float ratio, const void* x, void* y, int64_t n, void* stream);
// Rotary embedding over x's rows (kernels/rotary_layout.h). Forward y = x cos + concat(-x2, x1)
// sin; backward (x is dY) dX = dY cos + concat((dY sin)2, -(dY sin)1).
using kernels::RotaryLayout;
int Rotary(Dt dt, const RotaryLayout& l, bool backward, const void* x, const void* cos, const void* sin, void* y,
           void* stream);
// y = silu(gate) * up over n elements, and its gradients dgate = dy * up * silu'(gate), dup = dy *
// silu(gate) (either may be null).
int SwiGlu(Dt dt, const void* gate, const void* up, void* y, int64_t n, void* stream);
int SwiGluGrad(Dt dt, const void* dy, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
               void* stream);
// dx = dy * gelu'(x), exact (erf) or tanh form.
int GeluGrad(Dt dt, const void* dy, const void* x, void* dx, int64_t n, bool tanh_form, void* stream);

// BatchNormalization over x [N, C, S] of type t, the per-channel operands [C] of type p (float32
// or t): y = (x - mean) / sqrt(var + eps) * scale + bias, with training's batch mean and biased
// variance (then running_mean / running_var, when non-null, = input * momentum + batch *
// (1 - momentum)) or the inputs'. stats: float32 scratch of 2C (mean, var). y may be null.
int BatchNorm(Dt t, Dt p, const void* x, const void* scale, const void* bias, const void* mean, const void* var,
              void* y, void* running_mean, void* running_var, float* stats, int64_t N, int64_t C, int64_t S,
              float eps, float momentum, bool training, void* stream);
// Its gradient: dscale = sum(dy xhat), dbias = sum(dy), dx through the batch statistics in
// training (scale inv / M (M dy - sum(dy) - xhat sum(dy xhat))) or dy scale inv; each output may
// be null. stats: float32 scratch of 4C.
int BatchNormGrad(Dt t, Dt p, const void* dy, const void* x, const void* scale, const void* mean, const void* var,
                  void* dx, void* dscale, void* dbias, float* stats, int64_t N, int64_t C, int64_t S, float eps,
                  bool training, void* stream);
// InstanceNormalization over x [N, C, S]: each image's channel normalised by its own mean and
// biased variance over S, then times scale[c] plus bias[c] (of type p). stats: float32 scratch
// of 2 N C.
int InstanceNorm(Dt t, Dt p, const void* x, const void* scale, const void* bias, void* y, float* stats, int64_t N,
                 int64_t C, int64_t S, float eps, void* stream);
// Its gradient: dx per image and channel as BatchNormGrad's training form over S, dscale and
// dbias the planes' sums added over the images; each output may be null. stats: float32 scratch
// of 4 N C.
int InstanceNormGrad(Dt t, Dt p, const void* dy, const void* x, const void* scale, void* dx, void* dscale,
                     void* dbias, float* stats, int64_t N, int64_t C, int64_t S, float eps, void* stream);

// Row-wise over [rows, cols]: y = (x - mean) * inv_std * gamma + beta (beta may be null);
// mean and inv_std [rows] fp32 (may be null). rms: RMSNorm, the mean taken as 0.
int LayerNorm(Dt dt, const void* x, const void* gamma, const void* beta, void* y, float* mean, float* inv_std,
              int64_t rows, int64_t cols, float epsilon, void* stream, bool rms = false);
// The same over sum = x + skip, written to `sum` (may be null) as well; skip of x's type dt, or
// (dt float32) of skip_dt bf16 / fp16, added as float32.
int SkipLayerNorm(Dt dt, Dt skip_dt, Dt y_dt, const void* x, const void* skip, const void* gamma, const void* beta,
                  void* y, float* mean, float* inv_std, void* sum, int64_t rows, int64_t cols, float epsilon,
                  void* stream, bool rms = false);
// dx [rows, cols] (plus dx_add [rows, cols] when it is not null); dgamma, dbeta [cols] fp32 sums
// over rows (either may be null). The sums
// split the rows over blocks and add their partial sums in a second pass, in a fixed order:
// `scratch` is device memory of LayerNormGradScratch(rows, cols) floats.
int64_t LayerNormGradScratch(int64_t rows, int64_t cols);
// With dx_low (dt float32 only), dx is also written rounded to low_dt (bf16 or fp16), as a Cast
// of it would round it; dx may then be null. dy is of x's type dt, or (dt float32) of dy_dt
// bf16 / fp16, read as float32. A null mean is RMSNorm's gradient (no mean, no mean(g) term;
// dbeta is then null too).
int LayerNormGrad(Dt dt, const void* dy, const void* x, const void* gamma, const float* mean, const float* inv_std,
                  const void* dx_add, void* dx, float* dgamma, float* dbeta, float* scratch, int64_t rows, int64_t cols,
                  void* dx_low, Dt low_dt, Dt dy_dt, void* stream);
// Softmax or LogSoftmax over the middle axis of [rows, cols, inner]: over the last axis of
// [rows, cols] when inner is 1.
int Softmax(Dt dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, void* stream, int64_t inner = 1);

// Cross-entropy of fp32 scores [N, C] against int64 labels [N] in one pass per row (the
// probabilities are never stored): row_loss[n] = logsumexp(scores[n]) - scores[n, label]
// (0 where label == ignore_index when has_ignore); log_prob [N, C] is written when non-null.
// Then loss = the sum, the mean over counted rows, or row_loss itself (reduction 2 = none,
// 1 = sum, 0 = mean); `count` is device scratch of one double.
int SoftmaxCrossEntropy(const float* scores, const int64_t* labels, float* row_loss, float* log_prob, float* loss,
                        double* count, int64_t N, int64_t C, int reduction, bool has_ignore, int64_t ignore_index,
                        void* stream);
// d_scores [N, C] from log_prob and labels, as SoftmaxCrossEntropyLossGrad: dy is a device
// scalar (mean, sum) or [N] (none); the one-hot term lands at label - class_offset. With
// from_scores, `in` holds the scores and each row's log-sum-exp is formed on the way (one
// block per row, one online max-and-sum pass before the gradient's): the forward stores no
// log_prob. dx has type out_dt (bf16 / fp16 for a mixed-precision backward). With from_scores
// and row_loss [N] (device), also the forward's loss: row_loss as SoftmaxCrossEntropy forms it,
// and `loss` its sum or mean (reduction 1, 0; row_loss is the loss for 2).
// in has type in_dt: float32, or with from_scores also bf16 / fp16 scores (read as float32).
int SoftmaxCrossEntropyGrad(const float* dy, const void* in, Dt in_dt, bool from_scores, const int64_t* labels,
                            void* dx, Dt out_dt, double* count, int64_t N, int64_t C, int reduction, bool has_ignore,
                            int64_t ignore_index, int64_t class_offset, float* row_loss, float* loss,
                            void* stream);

// SoftmaxGrad (dx = y * (dy - sum(dy * y))) or LogSoftmaxGrad (dx = dy - exp(y) * sum(dy))
// over the middle axis of [rows, cols, inner], as Softmax.
int SoftmaxGrad(Dt dt, const void* dy, const void* y, void* dx, int64_t rows, int64_t cols, bool log, void* stream,
                int64_t inner = 1);

enum class ReduceOp : int { kSum, kMean, kMax, kMin, kL1, kL2, kSumSquare, kLogSum, kLogSumExp, kProd };
// Reduces x over the dims flagged in `reduce` (x_dims of rank `rank`); y holds the kept dims in
// order. Accumulates in double: sums of the elements, their magnitudes (L1) or squares
// (SumSquare; L2 takes the root, LogSum the log of the plain sum). LogSumExp takes each
// output's maximum first and sums exp(x - max) (a block per output over trailing axes, else one
// thread per output). Reducing leading axes into few columns (a bias gradient) splits the rows
// over blocks and combines their partial results in a second pass, in a fixed order: `scratch`
// is device memory of ReduceScratch(rank, x_dims, reduce) doubles (null when 0).
int64_t ReduceScratch(int rank, const int64_t* x_dims, const bool* reduce);
int Reduce(ReduceOp op, Dt dt, const void* x, void* y, int rank, const int64_t* x_dims, const bool* reduce,
           double* scratch, void* stream);
// y [C] (float32) = the column sums of x [R, C] (a bias gradient from its low-precision
// gradient, where cuBLASLt's epilogue cannot form it): R split over chunks of rows, as Reduce
// does, their partial sums (double) combined in order; `scratch` is device memory of
// ColumnSumsScratch(R, C) doubles.
int64_t ColumnSumsScratch(int64_t R, int64_t C);
int ColumnSums(Dt dt, const void* x, float* y, int64_t R, int64_t C, double* scratch, void* stream);
// y = cond ? a : b with broadcasting (strides per output dim for each operand; elem_bytes of a).
struct Broadcast3 {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
};
int Where(int elem_bytes, const bool* cond, const void* a, const void* b, void* y, int64_t n, const Broadcast3& bc,
          void* stream);

// Where row t of slice b (of `batch` = batch x heads slices) of an attention operand starts, in
// elements: (b / heads) * batch + (b % heads) * head + t * row, as the CPU kernels' strides.
struct AttentionStrides {
  int64_t batch = 0, head = 0, row = 0;
};
// The additive bias of the scores (fp32 device memory, or null for none): query row i and key j
// of slice b at (b / heads) * batch + (b % heads) * head + i * row + j * col, strides of 0
// broadcasting it, as the CPU kernels' AttentionBias.
struct AttentionBias {
  const float* data = nullptr;
  int64_t heads = 1, batch = 0, head = 0, row = 0, col = 0;
};
// The operands' layouts: q, k, v and o (out and dout); dq, dk and dv are laid out as q, k and v,
// and lse and delta are always contiguous [batch, T]. The bias rides along, and so does where the
// backward writes the scores' gradient before the scale (fp32 [batch, T, S], zeros where a key
// is hidden; null for none).
struct AttentionLayout {
  int64_t heads = 1;
  AttentionStrides q, k, v, o;
  AttentionBias bias;
  float* dscores = nullptr;
};
// Slices of q [T, D], k [S, D], v [S, Dv] and out [T, Dv] one after another.
inline AttentionLayout ContiguousAttention(int64_t T, int64_t S, int64_t D, int64_t Dv) {
  return {1, {T * D, 0, D}, {S * D, 0, D}, {S * Dv, 0, Dv}, {T * Dv, 0, Dv}, {}, nullptr};
}

// Scaled dot-product attention over `batch` (batch x heads) slices of q [T, D], k [S, D], v [S, Dv]
// (D, Dv <= 256), read and written through `layout`: out [T, Dv] and lse [T] (fp32, may be null).
// Causal: query i sees keys j <= i + S - T. The layout's bias joins the scaled scores; a row whose
// every score is -inf attends to nothing (zeros, lse -inf). The backward writes dq, dk, dv from dout, the inputs,
// out and lse; `delta` is fp32 device scratch of batch * T.
int AttentionForward(Dt dt, const AttentionLayout& layout, const void* q, const void* k, const void* v, void* out,
                     float* lse, int64_t batch, int64_t T, int64_t S, int D, int Dv, float scale, bool causal,
                     void* stream);
int AttentionBackward(Dt dt, const AttentionLayout& layout, const void* dout, const void* q, const void* k,
                      const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                      int64_t batch, int64_t T, int64_t S, int D, int Dv, float scale, bool causal, void* stream);

// Where a kernel reports the first index it found out of range: `words` (4 int64 of device
// memory, zero until then) get {tag, the index, its position among the indices, the axis size};
// the tag (non-zero) says which node. Null words: nothing is reported.
struct BadIndex {
  int64_t* words = nullptr;
  int64_t tag = 0;
};
// Gather along one axis: table [outer, rows, inner] (the axis is `rows`), ids int64 or (ids_int32)
// int32, out [outer, num_ids, inner]; negative ids count from the end, ids out of range give
// zeros and are reported in `bad`. The embedding lookup is outer = 1.
int Gather(int elem_bytes, const void* table, const void* ids, bool ids_int32, void* out, int64_t outer,
           int64_t num_ids, int64_t rows, int64_t inner, void* stream, BadIndex bad = {});
// dtable [outer, rows, inner] = scatter-add of dy [outer, num_ids, inner] along the axis at ids,
// onto zeros or onto `base` (of dtable's size; it may be dtable itself: then only the entries
// at ids are touched); ids out of range add nothing and are reported in `bad`.
int GatherGrad(const float* dy, const void* ids, bool ids_int32, float* dtable, int64_t outer, int64_t num_ids,
               int64_t rows, int64_t inner, void* stream, const float* base = nullptr, BadIndex bad = {});
// y [out_dims] = the elements of x at sum_d k_d * in_strides[d] (element strides of either sign,
// from x as given): a Slice, its start already added to x; an Expand, with 0 for the dims it
// broadcasts.
int StridedCopy(int elem_bytes, const void* x, void* y, int rank, const int64_t* out_dims, const int64_t* in_strides,
                void* stream);
// The inverse: x [x_dims] contiguous, element k of it written to y at sum_d k_d * out_strides[d]
// (strides of either sign, no two elements to one place; the rest of y is left as it is): a
// SliceGrad into zeros, its start already added to y.
int StridedScatter(int elem_bytes, const void* x, void* y, int rank, const int64_t* x_dims, const int64_t* out_strides,
                   void* stream);
// n copies of the elem_bytes (1, 2, 4 or 8) low bytes of `value` (ConstantOfShape).
int Fill(int elem_bytes, uint64_t value, void* y, int64_t n, void* stream);
// y[i] = start + i * delta over n elements, int64 / int32 computed in int64, float32 in double
// and rounded once (the CPU's Range).
int Range(Elem t, int64_t start_i, int64_t delta_i, double start_f, double delta_f, void* y, int64_t n, void* stream);
// x [batch, rows, cols] with the elements outside the kept triangle zeroed: upper keeps
// j >= i + k, lower j <= i + k (Trilu).
int Trilu(int elem_bytes, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
          void* stream);
// y = x with axes permuted (y dim k = x dim perm[k]).
int Transpose(int elem_bytes, const void* x, void* y, int rank, const int64_t* x_dims, const int64_t* perm,
              void* stream);

// Pooling over [planes, in_size] planes (kernels/pool_window.h), every sum and comparison in
// float32. MaxPool: y [planes, out_size] the first largest tap (NaN beats every number; -inf for
// a window in the padding), and indices (when non-null) its flat offset in x, the plane laid out
// column-major with column_major (storage_order 1). AveragePool: y the taps' mean over the
// window's divisor.
using kernels::PoolLayout;
int MaxPool(Dt dt, const PoolLayout& l, int64_t planes, const void* x, void* y, int64_t* indices, bool column_major,
            void* stream);
int AveragePool(Dt dt, const PoolLayout& l, int64_t planes, const void* x, void* y, void* stream);
// Their gradients dx [planes, in_size], each element gathered from the windows that read it:
// MaxPoolGrad sums the dy of the windows that chose it (arg: scratch of planes * out_size, for
// the choices found again from x); AveragePoolGrad sums dy / divisor.
int MaxPoolGrad(Dt dt, const PoolLayout& l, int64_t planes, const void* dy, const void* x, int64_t* arg, void* dx,
                void* stream);
int AveragePoolGrad(Dt dt, const PoolLayout& l, int64_t planes, const void* dy, void* dx, void* stream);

using kernels::RandomKind;

// y[i] = draw i under `key` (kernels/random_draw.h): uniform in [a, b), normal of mean a and
// scale b, or Bernoulli(p[i]) as 1 or 0.
int RandomDraw(RandomKind kind, uint64_t key, double a, double b, const double* p, double* y, int64_t n, void* stream);

using kernels::GridSampleLayout;

// GridSample (kernels/grid_sample.h): y [N, C, out...] from x [N, C, in...] at grid [N, out...,
// axes], all of dt. The gradient adds into dx, a float32 [N, C, in...] the caller zeroed, and
// writes dgrid (of dt, the grid's shape) unless it is null.
int GridSample(Dt dt, const GridSampleLayout& l, const void* x, const void* grid, void* y, void* stream);
int GridSampleGrad(Dt dt, const GridSampleLayout& l, const void* dy, const void* x, const void* grid, float* dx,
                   void* dgrid, void* stream);

// Resize's resampling along one dim (graph/resize_geometry.h ResizePass): y [outer, out, inner]
// from x [outer, in, inner], output index o the sum of x's rows index[e] times weight[e] over e in
// [offsets[o], offsets[o + 1]) in float32 (extrapolation where its one index is -1). The adjoint
// gathers: dx's row i the sum of dy's rows outputs[offsets[i] .. offsets[i + 1]) times their
// weights, in that order.
int Resample(Dt dt, const int64_t* offsets, const int64_t* index, const float* weight, const void* x, void* y,
             int64_t outer, int64_t in, int64_t out, int64_t inner, float extrapolation, void* stream);
int ResampleGrad(Dt dt, const int64_t* offsets, const int64_t* outputs, const float* weights, const void* dy, void* dx,
                 int64_t outer, int64_t in, int64_t out, int64_t inner, void* stream);

// The geometry of a convolution over `spatial` dims (kernels/cpu/conv.h's ConvParams, less the
// images and the filters): C input channels of in[] elements, a kernel[] window read every
// stride[] positions with dilation[] between its taps, pad_begin[] zeros before each dim, out[]
// output positions; the sizes are the products of in, kernel and out.
struct ConvGeometry {
  int spatial = 0;
  int64_t C = 0, in_size = 0, kernel_size = 0, out_size = 0;
  int64_t in[kMaxRank] = {}, kernel[kMaxRank] = {}, out[kMaxRank] = {};
  int64_t stride[kMaxRank] = {}, dilation[kMaxRank] = {}, pad_begin[kMaxRank] = {};
};
// col [C * kernel_size, images, out_size] = the patch elements of x [images, C, in...] (zeros
// where a patch reaches into the padding): row (c, k) holds channel c at kernel position k for
// every image and output position, so one product per group of channels covers all the images.
int Im2Col(Dt dt, const ConvGeometry& g, const void* x, void* col, int64_t images, void* stream);
// Its adjoint: dx [images, C, in...] (written, not added to) = for each input element the sum,
// in float32 and in a fixed order, of the float32 col entries of the patch positions that read
// it, plus bias[c] (of dt; null: none); rounded once to dt.
int Col2Im(Dt dt, const ConvGeometry& g, const float* col, const void* bias, void* dx, int64_t images, void* stream);
// y [images, M, O] = the float32 product [M, images, O] (each group's filters times the columns)
// plus bias [M] (of dt, or null), rounded once to dt.
int ConvOutput(Dt dt, const float* product, const void* bias, void* y, int64_t images, int64_t M, int64_t O,
               void* stream);

// Pad (and Tile: wrap mode, nothing before): y [out_dims] reads x [in_dims] at each dim's
// kernels::PadSourceCoord (kernels/pad_coord.h), or holds `fill` (the elem_bytes low bytes) where
// a coordinate lies outside x in constant mode. before may be negative (a crop).
using kernels::PadMode;
struct PadLayout {
  int rank = 0;
  int64_t out_dims[kMaxRank] = {}, in_dims[kMaxRank] = {}, before[kMaxRank] = {};
};
int Pad(int elem_bytes, PadMode mode, const PadLayout& l, const void* x, void* y, uint64_t fill, void* stream);
// Pad's gradient: dx [n elements of l.x_dims] = for each element the float32 sum, in
// PadGradGather's order, of the dy elements that read it; l's preimages in device memory.
using kernels::PadGradLayout;
int PadGrad(Dt dt, const PadGradLayout& l, const void* dy, void* dx, int64_t n, void* stream);
// y = the running sums of x [outer, len, inner] along len (exclusive: each sum leaves out its own
// element; reverse: from the end), one thread per line, summed in the CPU's order: floats in
// float32 rounded to the storage type at each step, integers wrapping.
int CumSum(Elem t, const void* x, void* y, int64_t outer, int64_t len, int64_t inner, bool exclusive, bool reverse,
           void* stream);
// y [outer, inner] = the index along len (>= 1) of the largest (max) or smallest element of x
// [outer, len, inner], the first of equals or with `last` the last; NaN counts as the extreme.
int ArgExtreme(Elem t, bool max, bool last, const void* x, int64_t* y, int64_t outer, int64_t len, int64_t inner,
               void* stream);
// TopK: values [outer, k, inner] (x's type) and int64 indices of the first k elements of each
// line of x [outer, len, inner] in kernels/topk_order.h's order (0 <= k <= len).
int TopK(Elem t, bool largest, const void* x, void* values, int64_t* indices, int64_t outer, int64_t len,
         int64_t inner, int64_t k, void* stream);
// GatherElements and ScatterElements: data x_dims and indices idx_dims of one rank, an index per
// element along `axis` (negative ones from the end; one outside [-len, len) is reported in `bad`
// and reads zeros, or writes nothing).
struct ElementsLayout {
  int rank = 0, axis = 0;
  int64_t x_dims[kMaxRank] = {}, idx_dims[kMaxRank] = {};
};
// y [idx_dims] = x at the indices.
int GatherElements(int elem_bytes, const ElementsLayout& l, const void* x, const void* idx, bool idx_int32, void* y,
                   void* stream, BadIndex bad = {});
// y (holding the data already) gets upd [idx_dims] at the indices: written (kNone, any element
// of elem_bytes), or combined by the reduction over t's arithmetic (floats in float32, integers
// wrapping); duplicates apply in index order (one thread per line along the axis, no atomics).
enum class ScatterReduction : int { kNone, kAdd, kMul, kMax, kMin };
int ScatterElements(Elem t, int elem_bytes, ScatterReduction r, const ElementsLayout& l, const void* idx,
                    bool idx_int32, const void* upd, void* y, void* stream, BadIndex bad = {});

// GatherND: y [batches, tuples, slice] = the slice of x each tuple of k coordinates addresses
// within its batch (kernels/nd_index.h); a tuple out of range reads zeros and is reported in
// `bad`. ScatterND (batches 1): y, holding the data already, gets each update slice at its
// tuple, written (kNone, one thread per element; duplicates in no set order) or combined by the
// reduction in tuple order (one thread per slice element).
int GatherND(int elem_bytes, const NdIndexLayout& l, const void* x, const int64_t* idx, void* y, void* stream,
             BadIndex bad = {});
int ScatterND(Elem t, int elem_bytes, ScatterReduction r, const NdIndexLayout& l, const int64_t* idx, const void* upd,
              void* y, void* stream, BadIndex bad = {});

// NegativeLogLikelihoodLoss of input [N, C, D] (log-probabilities, dt) against target [N, D]
// (int64, or int32): each position's loss is -weight[label] * input[n, label, d] (weight [C] of
// dt, or null for ones; 0 where the label is ignore_index); loss = those [N, D] (reduction 2 =
// none), their sum (1), or their sum over the weights' sum (0 = mean; NaN when every position is
// ignored), formed in double in a fixed order. A label outside [0, C) is recorded in `bad` and
// counts as ignored. pos_loss and pos_weight are float32 device scratch of N * D each (unread
// with no reduction), sums of 2 doubles.
int NllLoss(Dt dt, const void* input, const void* target, bool target_int32, const void* weight, void* loss,
            float* pos_loss, float* pos_weight, double* sums, int64_t N, int64_t C, int64_t D, int reduction,
            bool has_ignore, int64_t ignore_index, void* stream, BadIndex bad = {});
// Its gradient dx [N, C, D] (dt): -weight[label] times dY (at [n, d] for none, the scalar for sum,
// over the weights' sum for mean) at each position's label, zeros elsewhere. pos_weight and sums
// as above (the mean's weights' sum is formed again).
int NllLossGrad(Dt dt, const void* dy, const void* target, bool target_int32, const void* weight, void* dx,
                float* pos_weight, double* sums, int64_t N, int64_t C, int64_t D, int reduction, bool has_ignore,
                int64_t ignore_index, void* stream);

// AdamW (decoupled weight decay, bias-corrected, grad multiplied by grad_scale first, or by
// *device_scale when given; outputs may alias inputs) over `count` tensors in as few launches as their pointers fit in (32 per
// launch): the host arrays give tensor k's inputs and outputs and its n[k] elements.
int MultiTensorAdamW(int count, const float* const* param, const float* const* grad, const float* const* m,
                     const float* const* v, float* const* param_out, float* const* m_out, float* const* v_out,
                     const int64_t* n, float lr, float beta1, float beta2, float epsilon, float weight_decay,
                     int64_t step, float grad_scale, void* stream, const float* device_scale = nullptr);
// SGD (weight decay, momentum with dampening, Nesterov; the CPU's SgdStep) over `count`
// tensors, 32 per launch; buf and buf_out are read only with momentum (step 1 starts them).
int MultiTensorSgd(int count, const float* const* param, const float* const* grad, const float* const* buf,
                   float* const* param_out, float* const* buf_out, const int64_t* n, float lr, float momentum,
                   float dampening, float weight_decay, bool nesterov, int64_t step, float grad_scale, void* stream,
                   const float* device_scale = nullptr);
// The global-norm clipping between SquaredNorm and the update, on the device (no host round
// trip): norm = sqrt(*sumsq) * grad_scale, and *scale_out = grad_scale * min(1, max_norm /
// (norm + epsilon)) when max_norm > 0, else grad_scale; the float operations of the CPU's.
// `norm_out` may be `sumsq`. MultiTensorAdamW then reads the scale as `device_scale`.
int ClipScale(const float* sumsq, float grad_scale, float max_norm, float epsilon, float* norm_out, float* scale_out,
              void* stream);
// out = sum of squares of every element of the `count` tensors (128 per launch); `acc` is
// device scratch of one double. xs and ns are host arrays.
int SquaredNorm(const float* const* xs, const int64_t* ns, int count, float* out, double* acc, void* stream);
// *out = no element of the `count` tensors is infinite or NaN (128 per launch; `out` is one
// device bool). xs and ns are host arrays.
int AllFinite(const float* const* xs, const int64_t* ns, int count, bool* out, void* stream);

}  // namespace cleave::kernels::cuda
