// Shape and type inference functions named by the op table (graph/).
// infer_elementwise.cc: unary, binary, comparison, logic, Where, Clip, Cast, Max/Min, Gelu.
// infer_nn.cc: MatMul, Gemm, FusedMatMul, Softmax family, normalisation, reductions,
//              losses, Dropout, Trilu.
// infer_shape_ops.cc: Reshape, Transpose, Concat, Split, Slice, Squeeze, Unsqueeze, Expand,
//              Gather, Shape, ConstantOfShape, Range, Identity, Constant, Flatten.
// infer_grad_ops.cc: the ai.cleave gradient ops (GatherGrad, SliceGrad,
//              SoftmaxCrossEntropyLossGrad, SoftmaxGrad, LogSoftmaxGrad,
//              LayerNormalizationGrad, GeluGrad).
#pragma once

#include "graph/op_table.h"

namespace cleave::graph {

// infer_elementwise.cc
absl::Status InferUnary(InferContext& ctx);         // out = in dtype/shape
absl::Status InferUnaryFloat(InferContext& ctx);    // same, input must be a float type
absl::Status InferBinaryArith(InferContext& ctx);  // broadcast, same dtype in and out
absl::Status InferBitwise(InferContext& ctx);  // the integer bitwise ops and shifts: broadcast, the dtype kept
absl::Status InferNonZero(InferContext& ctx);   // int64 [rank, ?] (infer_data_movement.cc)
absl::Status InferCompress(InferContext& ctx);  // X with `axis` (or X flattened) selected
absl::Status InferNonMaxSuppression(InferContext& ctx);  // int64 [selected, 3]
absl::Status InferUnique(InferContext& ctx);  // Y, indices, inverse_indices, counts
absl::Status InferPow(InferContext& ctx);           // broadcast, dtype of base
absl::Status InferPRelu(InferContext& ctx);         // X's shape and dtype; the slope broadcasts to X
absl::Status InferCompare(InferContext& ctx);       // broadcast, bool out
absl::Status InferLogical(InferContext& ctx);       // bool in, broadcast, bool out
absl::Status InferNot(InferContext& ctx);
absl::Status InferVariadicMinMax(InferContext& ctx);
absl::Status InferWhere(InferContext& ctx);
absl::Status InferClip(InferContext& ctx);
absl::Status InferCast(InferContext& ctx);
absl::Status InferCastLike(InferContext& ctx);  // input 0's shape in input 1's dtype
absl::Status InferFloatClass(InferContext& ctx);  // IsNaN, IsInf: bool of a float input's shape

// infer_nn.cc
absl::Status InferMatMul(InferContext& ctx);
absl::Status InferGemm(InferContext& ctx);
absl::Status InferFusedMatMul(InferContext& ctx);
absl::Status InferMatMulBf16(InferContext& ctx);
absl::Status InferSoftmax(InferContext& ctx);
absl::Status InferLayerNorm(InferContext& ctx);
absl::Status InferReduce(InferContext& ctx);
absl::Status InferSoftmaxCrossEntropyLoss(InferContext& ctx);
absl::Status InferDropout(InferContext& ctx);
absl::Status InferTrilu(InferContext& ctx);
absl::Status InferDet(InferContext& ctx);  // [..., M, M] -> [...]

// infer_shape_ops.cc
absl::Status InferReshape(InferContext& ctx);
absl::Status InferTranspose(InferContext& ctx);
absl::Status InferConcat(InferContext& ctx);
absl::Status InferSplit(InferContext& ctx);
absl::Status InferSlice(InferContext& ctx);
absl::Status InferSqueeze(InferContext& ctx);
absl::Status InferUnsqueeze(InferContext& ctx);
absl::Status InferExpand(InferContext& ctx);
absl::Status InferGather(InferContext& ctx);
absl::Status InferShape(InferContext& ctx);
absl::Status InferSize(InferContext& ctx);  // an int64 scalar
absl::Status InferGatherElements(InferContext& ctx);   // indices' shape, data's dtype
absl::Status InferScatterElements(InferContext& ctx);  // data's shape and dtype
absl::Status InferConv(InferContext& ctx);      // Y [N, M, out...] from X, W and the attributes
absl::Status InferConvGrad(InferContext& ctx);  // dX, dW, dB of X's, W's and [M]
absl::Status InferResize(InferContext& ctx);      // Y from X and constant scales / sizes (graph/resize_geometry.h)
absl::Status InferResizeGrad(InferContext& ctx);  // dX of the shape input's value
absl::Status InferConvTranspose(InferContext& ctx);      // Y [N, M, out...] from X, W and the attributes
absl::Status InferConvTransposeGrad(InferContext& ctx);  // dX, dW, dB of X's, W's and [M]
absl::Status InferBatchNorm(InferContext& ctx);  // Y of X's; running stats / dScale, dB [C]
absl::Status InferPool(InferContext& ctx);      // Y [N, C, out...] (and int64 Indices) from X and the window
absl::Status InferPoolGrad(InferContext& ctx);  // dX of X's dims (MaxPoolGrad) or the shape input's
absl::Status InferPad(InferContext& ctx);
absl::Status InferPadGrad(InferContext& ctx);  // dY's dtype; dY's dims less the pads where they are constant   // data's dtype; dims known where the pads (and axes) are constant
absl::Status InferTile(InferContext& ctx);  // data's dtype; dims known where the repeats are constant
absl::Status InferCumSum(InferContext& ctx);       // x's dtype and shape; a one-element integer axis
absl::Status InferArgExtreme(InferContext& ctx);  // int64, x's shape less (or keeping as 1) the axis
absl::Status InferGatherND(InferContext& ctx);   // indices' dims less the last, then data's after the indexed
absl::Status InferScatterND(InferContext& ctx);  // data's; the updates checked against the indices
absl::Status InferTopK(InferContext& ctx);  // Values (x's dtype) and int64 Indices: x's shape, k along the axis
absl::Status InferConstantOfShape(InferContext& ctx);
absl::Status InferRange(InferContext& ctx);
absl::Status InferIdentity(InferContext& ctx);
absl::Status InferConstant(InferContext& ctx);
absl::Status InferFlatten(InferContext& ctx);

// infer_decomposed.cc: the ops every session decomposes (graph/passes/decomposition.cc)
absl::Status InferEinsum(InferContext& ctx);              // the equation's output of the inputs' label sizes
absl::Status InferGroupNormalization(InferContext& ctx);  // X's; scale and bias [G] (18) or [C] (21)
absl::Status InferDepthSpace(InferContext& ctx);          // DepthToSpace and SpaceToDepth over [N, C, H, W]
absl::Status InferOneHot(InferContext& ctx);              // indices' shape, depth inserted at axis; values' dtype
absl::Status InferFloatSameShape(InferContext& ctx);      // Hardmax, Shrink, LRN: X's float dtype and shape
absl::Status InferEyeLike(InferContext& ctx);             // X's 2-D shape in `dtype`
absl::Status InferNormalizeAlong(InferContext& ctx);      // MeanVarianceNormalization, LpNormalization: X's
absl::Status InferQuantize(InferContext& ctx);            // QuantizeLinear, DequantizeLinear: X's shape
absl::Status InferDynamicQuantize(InferContext& ctx);     // y uint8 of X's shape, scale f32 [], zero point uint8 []
absl::Status InferLpPool(InferContext& ctx);  // LpPool, GlobalLpPool: p >= 1, then as AveragePool
absl::Status InferWindow(InferContext& ctx);           // [size] in output_datatype
absl::Status InferCenterCropPad(InferContext& ctx);    // X with the target dims along the axes
absl::Status InferReverseSequence(InferContext& ctx);  // X's
absl::Status InferMaxUnpool(InferContext& ctx);        // output_shape, or the pool's input size
absl::Status InferCol2Im(InferContext& ctx);           // [N, C, image_shape...]
absl::Status InferAffineGrid(InferContext& ctx);       // [N, spatial..., axes] of size's values (infer_sampling.cc)
absl::Status InferRecurrent(InferContext& ctx);           // RNN, GRU, LSTM: Y, Y_h (and Y_c) of X, W, R

// infer_sampling.cc
absl::Status InferGridSample(InferContext& ctx);      // (X, grid) -> [N, C, out...]
absl::Status InferGridSampleGrad(InferContext& ctx);  // (dY, X, grid) -> dX, dGrid
absl::Status InferDft(InferContext& ctx);             // the signal dim as bins, the last 2
absl::Status InferStft(InferContext& ctx);            // [batch, frames, bins, 2]
absl::Status InferMelWeightMatrix(InferContext& ctx); // [dft_length / 2 + 1, num_mel_bins]
absl::Status InferRoiAlign(InferContext& ctx);        // [num_rois, C, output_height, output_width]
absl::Status InferRandom(InferContext& ctx);          // the random ops: `shape` or the input's, in `dtype`

// infer_grad_ops.cc
absl::Status InferGatherGrad(InferContext& ctx);   // (shape, indices, dY) -> dX of `shape`
absl::Status InferSliceGrad(InferContext& ctx);    // (dY, shape, starts, ends[, axes, steps])
absl::Status InferSoftmaxCrossEntropyLossGrad(InferContext& ctx);  // -> log_prob's shape
absl::Status InferSoftmaxGrad(InferContext& ctx);  // (dY, Y) {axis} -> Y's shape; LogSoftmaxGrad too
// (dY, X, scale, mean, inv_std_dev) {axis} -> dX of X's shape, dScale and dBias of scale's
absl::Status InferLayerNormGrad(InferContext& ctx);
absl::Status InferSkipLayerNorm(InferContext& ctx);  // (x, skip, scale[, bias]) -> y, mean, inv_std, sum
                                                     // (or SkipRMSNormalization's y, inv_std, sum)
absl::Status InferMultiTensorAdamW(InferContext& ctx);  // (lr, step, scale, 4n tensors) -> 3n
absl::Status InferAttention(InferContext& ctx);      // (q, k, v) -> out, lse
absl::Status InferAttentionGrad(InferContext& ctx);  // (dOut, q, k, v, out, lse) -> dq, dk, dv
absl::Status InferGeluGrad(InferContext& ctx);     // (dY, X) {approximate} -> X's shape
absl::Status InferRotary(InferContext& ctx);       // RotaryEmbedding(Grad) (x, cos, sin) -> x's shape
absl::Status InferSwiGlu(InferContext& ctx);       // SwiGLU (gate, up), SwiGLUGrad (dY, gate, up): one shape
// Training ops (infer_train_ops.cc).
absl::Status InferInPlaceAccumulator(InferContext& ctx);  // (buffer, grad, reset) -> buffer
absl::Status InferSquaredNorm(InferContext& ctx);         // (x...) -> f32 scalar
absl::Status InferIsAllFinite(InferContext& ctx);         // (x...) -> bool scalar
absl::Status InferAdamW(InferContext& ctx);               // -> param, exp_avg, exp_avg_sq
absl::Status InferSGD(InferContext& ctx);                 // -> param[, momentum_buffer]
absl::Status InferMultiTensorSGD(InferContext& ctx);      // (lr, step, scale, kn tensors) -> (k-1)n
// Collectives (infer_collective_ops.cc).
absl::Status InferAllReduce(InferContext& ctx);      // same shape
absl::Status InferAllGather(InferContext& ctx);      // axis x group size
absl::Status InferReduceScatter(InferContext& ctx);  // axis / group size
absl::Status InferSend(InferContext& ctx);           // -> bool scalar
absl::Status InferRecv(InferContext& ctx);           // shape and dtype attributes

}  // namespace cleave::graph
