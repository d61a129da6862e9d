// Backward kernels of the training ops on the CPU (kernels/cpu/): GatherGrad (scatter-add),
// SliceGrad (scatter into zeros), SoftmaxCrossEntropyLossGrad (grad.cc), Softmax, LogSoftmax
// and Gelu gradients (activation_grad.cc) and LayerNormalization's (layer_norm_grad.cc).
// Plain functions over buffers the caller has allocated with the right dims. Every output
// element is written (zeros first where the op scatters), and accumulation order does not
// depend on threads.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "base/tensor.h"
#include "base/thread_pool.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/shape.h"

namespace cleave::kernels::cpu {

// dx = zeros (or `base`, dx's dims and type, which may be dx itself), then
// dx[..., indices[j], ...] += dy[..., j, ...] along `axis` (normalised): the gradient of
// Gather, or that gradient added to an accumulated one. dy.dims = dx.dims[:axis] +
// indices.dims + dx.dims[axis+1:]. Negative indices count from the end; repeated indices
// accumulate in index order (so the sum is the same for any thread count). An index outside
// [-d, d) is InvalidArgument and is reported before anything is written. dx/dy float32 or
// float64, indices int32/int64.
absl::Status GatherGrad(const TensorView& dy, const TensorView& indices, int axis, TensorView& dx,
                        ThreadPool* pool, const void* base = nullptr);

// dx = zeros, with dy written into the positions Slice with `p` reads from a tensor of
// dx's dims (p resolved by ResolveSlice against dx.dims; p.out_dims == dy.dims). Any
// fixed-size dtype.
void SliceGrad(const TensorView& dy, const SliceParams& p, TensorView& dx, ThreadPool* pool);

// The gradient of SoftmaxCrossEntropyLoss with respect to the scores, from the forward
// log_prob [N, C, D]: dx[n, c, d] = g * w[l] * (exp(log_prob[n, c, d]) - [c == l]) with
// l = labels[n, d], w the class weights (1 without them) and g = dy[n, d] for kNone, dy[0]
// for kSum and dy[0] / (sum of w[l] over non-ignored positions, or N * D when there are
// neither weights nor ignore_index) for kMean, as the forward divides. Positions whose
// label is ignore_index get 0. A label outside [0, C) that is not ignored is
// InvalidArgument. Over a slice of the classes (p.class_offset, p.num_classes) the one-hot
// term lands only on the labels inside the slice. Instantiated for T in {float, double}, L in
// {int32_t, int64_t}.
template <typename T, typename L>
absl::Status SoftmaxCrossEntropyGrad(const SceParams& p, const T* dy, const T* log_prob,
                                     const L* labels, const T* weights, T* dx, ThreadPool* pool);

// The loss and its gradient in one pass over each row of the scores [N, C] (p.D = 1), for the
// gradient that reads the scores (from_scores) without class weights or a class slice: each
// row's log-sum-exp is formed once, dx = g (softmax(x) - onehot(label)) with g as
// SoftmaxCrossEntropyGrad defines it, and loss (null: not wanted) as SoftmaxCrossEntropy
// computes it. scores and dx may be float32, bfloat16 or float16 (each row is widened into, or
// rounded from, a per-thread float32 row); dy and loss are float32. `scratch` holds N doubles.
// Labels are checked first, as the other two check them; nothing is written on an error.
template <typename L>
absl::Status SoftmaxCrossEntropyFromScores(const SceParams& p, const float* dy, const TensorView& scores,
                                           const L* labels, TensorView& dx, float* loss, double* scratch,
                                           ThreadPool* pool);

// ---- Activations and normalisation (activation_grad.cc, layer_norm_grad.cc) ----

// The gradient of Softmax (p.log false) or LogSoftmax (p.log true) along the middle dim of
// [outer, axis, inner], from the forward output y:
//   softmax:     dx = y * (dy - sum_axis(dy * y))
//   log-softmax: dx = dy - exp(y) * sum_axis(dy)
// Each slice's sum accumulates in double in axis order, by one thread.
void SoftmaxGrad(const SoftmaxParams& p, const float* dy, const float* y, float* dx,
                 ThreadPool* pool);
void SoftmaxGrad(const SoftmaxParams& p, const double* dy, const double* y, double* dx,
                 ThreadPool* pool);

// dx = dy * gelu'(x) for n elements: gelu'(x) = Phi(x) + x phi(x) for the erf form, and for
// tanh_form the derivative of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void GeluGrad(bool tanh_form, const float* dy, const float* x, float* dx, int64_t n,
              ThreadPool* pool);
void GeluGrad(bool tanh_form, const double* dy, const double* x, double* dx, int64_t n,
              ThreadPool* pool);

// The gradients of LayerNormalization over `rows` rows of `cols` (the normalised dims
// flattened), from the forward's saved statistics mean[r] and inv_std[r] (type U, the
// stash type). With xhat = (x - mean) inv_std and g = dy * scale:
//   dx = inv_std * (g - mean_row(g) - xhat * mean_row(g * xhat))
//   dscale[c] = sum_r dy[r, c] xhat[r, c],   dbias[c] = sum_r dy[r, c]
// scale has `cols` elements. dscale and dbias (`cols` elements each) may be null. The
// column sums are deterministic: rows are cut into LayerNormGradBlocks(rows) fixed blocks
// (a function of rows alone), each block's sums go to its own slice of `workspace`
// (LayerNormGradWorkspace(p) doubles) in row order, and the blocks are added in block order.
// RMSNorm (rms): xhat = x inv_std and dx = inv_std * (g - xhat * mean_row(g * xhat)), with no
// mean (null) and no dbias.
struct LayerNormGradParams {
  int64_t rows = 0, cols = 0;
  bool rms = false;
};
int64_t LayerNormGradBlocks(int64_t rows);
int64_t LayerNormGradWorkspace(const LayerNormGradParams& p);
// Instantiated for (T, U) in {float, double}^2.
template <typename T, typename U>
void LayerNormGrad(const LayerNormGradParams& p, const T* dy, const T* x, const T* scale,
                   const U* mean, const U* inv_std, T* dx, T* dscale, T* dbias,
                   double* workspace, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
