// Backward kernels of the training ops on the CPU (kernels/cpu/): GatherGrad (scatter-add),
// SliceGrad (scatter into zeros) and SoftmaxCrossEntropyLossGrad. Plain functions over
// TensorViews the caller has allocated with the right dims. Every output element is written
// (zeros first where the op scatters), and accumulation order does not depend on threads.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "base/tensor.h"
#include "base/thread_pool.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/shape.h"

namespace cleave::kernels::cpu {

// dx = zeros, then dx[..., indices[j], ...] += dy[..., j, ...] along `axis` (normalised):
// the gradient of Gather. dy.dims = dx.dims[:axis] + indices.dims + dx.dims[axis+1:].
// Negative indices count from the end; repeated indices accumulate in index order (so the
// sum is the same for any thread count). An index outside [-d, d) is InvalidArgument and
// is reported before anything is written. dx/dy float32 or float64, indices int32/int64.
absl::Status GatherGrad(const TensorView& dy, const TensorView& indices, int axis, TensorView& dx,
                        ThreadPool* pool);

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
// InvalidArgument. Instantiated for T in {float, double}, L in {int32_t, int64_t}.
template <typename T, typename L>
absl::Status SoftmaxCrossEntropyGrad(const SceParams& p, const T* dy, const T* log_prob,
                                     const L* labels, const T* weights, T* dx, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
