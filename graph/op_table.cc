// The op table rows and version resolution (graph/).
// `versions` lists each op's since_versions in the ONNX default domain up to opset 22, so
// that a model's opset import resolves to the exact op version it means.
#include "graph/op_table.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/dims_value.h"
#include "graph/infer_fns.h"

namespace cleave::graph {

namespace {

constexpr int kVar = -1;
const char* const kOnnx = "";

std::vector<OpDef> BuildTable() {
  const char* const C = kCleaveDomain;
  // {domain, name, versions, first_supported, in min,max, out min,max, infer, differentiable}
  return {
      // Unary elementwise.
      {kOnnx, "Abs", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnary, true},
      {kOnnx, "Neg", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnary, true},
      {kOnnx, "Exp", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Log", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Sqrt", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Reciprocal", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Sin", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Cos", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Tanh", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Erf", {9, 13}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Relu", {1, 6, 13, 14}, 6, 1, 1, 1, 1, InferUnary, true},
      {kOnnx, "Sigmoid", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Gelu", {20}, 20, 1, 1, 1, 1, InferUnaryFloat, true},
      {C, "Gelu", {1}, 1, 1, 1, 1, 1, InferUnaryFloat, true},
      {C, "SwiGLU", {1}, 1, 2, 2, 1, 1, InferSwiGlu, true},
      {C, "RotaryEmbedding", {1}, 1, 3, 3, 1, 1, InferRotary, true},
      {kOnnx, "Not", {1}, 1, 1, 1, 1, 1, InferNot, false},
      {kOnnx, "Sign", {9, 13}, 9, 1, 1, 1, 1, InferUnary, true},
      {kOnnx, "Tan", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Asin", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Acos", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Atan", {7, 22}, 7, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Sinh", {9, 22}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Cosh", {9, 22}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Asinh", {9, 22}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Acosh", {9, 22}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Atanh", {9, 22}, 9, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Softplus", {1, 22}, 1, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Softsign", {1, 22}, 1, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Mish", {18, 22}, 18, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Floor", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Ceil", {1, 6, 13}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Round", {11, 22}, 11, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "LeakyRelu", {1, 6, 16}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Elu", {1, 6, 22}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Selu", {1, 6, 22}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "Celu", {12}, 12, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "HardSigmoid", {1, 6, 22}, 6, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "HardSwish", {14, 22}, 14, 1, 1, 1, 1, InferUnaryFloat, true},
      {kOnnx, "ThresholdedRelu", {10, 22}, 10, 1, 1, 1, 1, InferUnaryFloat, true},
      // Binary elementwise with broadcasting.
      {kOnnx, "Add", {1, 6, 7, 13, 14}, 7, 2, 2, 1, 1, InferBinaryArith, true},
      {kOnnx, "Sub", {1, 6, 7, 13, 14}, 7, 2, 2, 1, 1, InferBinaryArith, true},
      {kOnnx, "Mul", {1, 6, 7, 13, 14}, 7, 2, 2, 1, 1, InferBinaryArith, true},
      {kOnnx, "Div", {1, 6, 7, 13, 14}, 7, 2, 2, 1, 1, InferBinaryArith, true},
      {kOnnx, "Pow", {1, 7, 12, 13, 15}, 7, 2, 2, 1, 1, InferPow, true},
      {kOnnx, "PRelu", {1, 6, 7, 9, 16}, 7, 2, 2, 1, 1, InferPRelu, true},
      {kOnnx, "Max", {1, 6, 8, 12, 13}, 8, 1, kVar, 1, 1, InferVariadicMinMax, true},
      {kOnnx, "Min", {1, 6, 8, 12, 13}, 8, 1, kVar, 1, 1, InferVariadicMinMax, true},
      {kOnnx, "Sum", {1, 6, 8, 13}, 6, 1, kVar, 1, 1, InferVariadicMinMax, true},
      {kOnnx, "Mean", {1, 6, 8, 13}, 6, 1, kVar, 1, 1, InferVariadicMinMax, true},
      {kOnnx, "Equal", {1, 7, 11, 13, 19}, 7, 2, 2, 1, 1, InferCompare, false},
      {kOnnx, "Less", {1, 7, 9, 13}, 7, 2, 2, 1, 1, InferCompare, false},
      {kOnnx, "Greater", {1, 7, 9, 13}, 7, 2, 2, 1, 1, InferCompare, false},
      {kOnnx, "LessOrEqual", {12, 16}, 12, 2, 2, 1, 1, InferCompare, false},
      {kOnnx, "GreaterOrEqual", {12, 16}, 12, 2, 2, 1, 1, InferCompare, false},
      {kOnnx, "And", {1, 7}, 7, 2, 2, 1, 1, InferLogical, false},
      {kOnnx, "Or", {1, 7}, 7, 2, 2, 1, 1, InferLogical, false},
      {kOnnx, "Xor", {1, 7}, 7, 2, 2, 1, 1, InferLogical, false},
      {kOnnx, "Mod", {10, 13}, 10, 2, 2, 1, 1, InferBinaryArith, false},
      {kOnnx, "BitShift", {11}, 11, 2, 2, 1, 1, InferBitwise, false},
      {kOnnx, "BitwiseAnd", {18}, 18, 2, 2, 1, 1, InferBitwise, false},
      {kOnnx, "BitwiseOr", {18}, 18, 2, 2, 1, 1, InferBitwise, false},
      {kOnnx, "BitwiseXor", {18}, 18, 2, 2, 1, 1, InferBitwise, false},
      {kOnnx, "BitwiseNot", {18}, 18, 1, 1, 1, 1, InferBitwise, false, true},
      {kOnnx, "IsNaN", {9, 13, 20}, 9, 1, 1, 1, 1, InferFloatClass, false},
      {kOnnx, "IsInf", {10, 20}, 10, 1, 1, 1, 1, InferFloatClass, false},
      {kOnnx, "Where", {9, 16}, 9, 3, 3, 1, 1, InferWhere, true},
      {kOnnx, "Clip", {1, 6, 11, 12, 13}, 6, 1, 3, 1, 1, InferClip, true},
      {kOnnx, "Cast", {1, 6, 9, 13, 19, 21}, 6, 1, 1, 1, 1, InferCast, true},
      {kOnnx, "CastLike", {15, 19, 21}, 15, 2, 2, 1, 1, InferCastLike, true},
      // Linear algebra, normalisation, reductions, losses.
      {kOnnx, "MatMul", {1, 9, 13}, 1, 2, 2, 1, 1, InferMatMul, true},
      {kOnnx, "Gemm", {1, 6, 7, 9, 11, 13}, 7, 2, 3, 1, 1, InferGemm, true},
      {C, "FusedMatMul", {1}, 1, 2, 3, 1, 1, InferFusedMatMul, true},
      {C, "MatMulBf16", {1}, 1, 2, 6, 1, 3, InferMatMulBf16, false},
      {C, "MatMulF16", {1}, 1, 2, 6, 1, 3, InferMatMulBf16, false},
      {kOnnx, "Softmax", {1, 11, 13}, 1, 1, 1, 1, 1, InferSoftmax, true},
      {kOnnx, "LogSoftmax", {1, 11, 13}, 1, 1, 1, 1, 1, InferSoftmax, true},
      {kOnnx, "LayerNormalization", {17}, 17, 2, 3, 1, 3, InferLayerNorm, true},
      {C, "LayerNormalization", {1}, 1, 2, 3, 1, 3, InferLayerNorm, true},
      {C, "RMSNormalization", {1}, 1, 2, 2, 1, 2, InferLayerNorm, true},
      {kOnnx, "ReduceMean", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceL1", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceL2", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceSumSquare", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceProd", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceLogSum", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceLogSumExp", {1, 11, 13, 18}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceSum", {1, 11, 13}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceMax", {1, 11, 12, 13, 18, 20}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "ReduceMin", {1, 11, 12, 13, 18, 20}, 1, 1, 2, 1, 1, InferReduce, true},
      {kOnnx, "Conv", {1, 11, 22}, 1, 2, 3, 1, 1, InferConv, true},
      {C, "ConvGrad", {1}, 1, 3, 3, 1, 3, InferConvGrad, false},
      {kOnnx, "ConvTranspose", {1, 11, 22}, 1, 2, 3, 1, 1, InferConvTranspose, true},
      {C, "ConvTransposeGrad", {1}, 1, 3, 3, 1, 3, InferConvTransposeGrad, false},
      {kOnnx, "BatchNormalization", {1, 6, 7, 9, 14, 15}, 6, 5, 5, 1, 5, InferBatchNorm, true},
      {C, "BatchNormalizationGrad", {1}, 1, 5, 5, 1, 3, InferBatchNorm, false},
      {kOnnx, "InstanceNormalization", {1, 6, 22}, 6, 3, 3, 1, 1, InferBatchNorm, true},
      {C, "InstanceNormalizationGrad", {1}, 1, 3, 3, 1, 3, InferBatchNorm, false},
      {kOnnx, "MaxPool", {1, 8, 10, 11, 12, 22}, 1, 1, 1, 1, 2, InferPool, true},
      {kOnnx, "AveragePool", {1, 7, 10, 11, 19, 22}, 1, 1, 1, 1, 1, InferPool, true},
      {kOnnx, "GlobalMaxPool", {1, 22}, 1, 1, 1, 1, 1, InferPool, true},
      {kOnnx, "GlobalAveragePool", {1, 22}, 1, 1, 1, 1, 1, InferPool, true},
      {C, "MaxPoolGrad", {1}, 1, 2, 2, 1, 1, InferPoolGrad, false},
      {C, "AveragePoolGrad", {1}, 1, 2, 2, 1, 1, InferPoolGrad, false},
      {kOnnx, "Resize", {10, 11, 13, 18, 19}, 11, 1, 4, 1, 1, InferResize, true},
      // Decomposed into other ops by every session (graph/passes/decomposition.cc).
      {kOnnx, "Einsum", {12}, 12, 1, kVar, 1, 1, InferEinsum, true, true},
      {kOnnx, "GroupNormalization", {18, 21}, 18, 3, 3, 1, 1, InferGroupNormalization, true, true},
      {kOnnx, "DepthToSpace", {1, 11, 13}, 1, 1, 1, 1, 1, InferDepthSpace, true, true},
      {kOnnx, "SpaceToDepth", {1, 13}, 1, 1, 1, 1, 1, InferDepthSpace, true, true},
      {kOnnx, "OneHot", {9, 11}, 9, 3, 3, 1, 1, InferOneHot, false, true},
      {kOnnx, "Hardmax", {1, 11, 13}, 1, 1, 1, 1, 1, InferFloatSameShape, false, true},
      {kOnnx, "Shrink", {9}, 9, 1, 1, 1, 1, InferFloatSameShape, true, true},
      {kOnnx, "EyeLike", {9, 22}, 9, 1, 1, 1, 1, InferEyeLike, false, true},
      {kOnnx, "LRN", {1, 13}, 1, 1, 1, 1, 1, InferFloatSameShape, true, true},
      {kOnnx, "MeanVarianceNormalization", {9, 13}, 9, 1, 1, 1, 1, InferNormalizeAlong, true, true},
      {kOnnx, "LpNormalization", {1, 22}, 1, 1, 1, 1, 1, InferNormalizeAlong, true, true},
      {kOnnx, "QuantizeLinear", {10, 13, 19, 21, 23}, 10, 2, 3, 1, 1, InferQuantize, false, true},
      {kOnnx, "DequantizeLinear", {10, 13, 19, 21, 23}, 10, 2, 3, 1, 1, InferQuantize, false, true},
      {kOnnx, "DynamicQuantizeLinear", {11}, 11, 1, 1, 3, 3, InferDynamicQuantize, false, true},
      {kOnnx, "HannWindow", {17}, 17, 1, 1, 1, 1, InferWindow, false, true},
      {kOnnx, "HammingWindow", {17}, 17, 1, 1, 1, 1, InferWindow, false, true},
      {kOnnx, "BlackmanWindow", {17}, 17, 1, 1, 1, 1, InferWindow, false, true},
      {kOnnx, "CenterCropPad", {18}, 18, 2, 2, 1, 1, InferCenterCropPad, true, true},
      {kOnnx, "ReverseSequence", {10}, 10, 2, 2, 1, 1, InferReverseSequence, true, true},
      {kOnnx, "MaxUnpool", {9, 11, 22}, 9, 2, 3, 1, 1, InferMaxUnpool, true, true},
      {kOnnx, "LpPool", {1, 2, 11, 18, 22}, 1, 1, 1, 1, 1, InferLpPool, true, true},
      {kOnnx, "GlobalLpPool", {1, 2, 22}, 1, 1, 1, 1, 1, InferLpPool, true, true},
      {kOnnx, "RNN", {1, 7, 14, 22}, 7, 3, 6, 0, 2, InferRecurrent, true, true},
      {kOnnx, "GRU", {1, 3, 7, 14, 22}, 7, 3, 6, 0, 2, InferRecurrent, true, true},
      {kOnnx, "LSTM", {1, 7, 14, 22}, 7, 3, 8, 0, 3, InferRecurrent, true, true},
      {C, "ResizeGrad", {1}, 1, 2, 5, 1, 1, InferResizeGrad, false},
      {kOnnx, "GridSample", {16, 20, 22}, 16, 2, 2, 1, 1, InferGridSample, true},
      {C, "GridSampleGrad", {1}, 1, 3, 3, 1, 2, InferGridSampleGrad, false},
      {kOnnx, "AffineGrid", {20}, 20, 2, 2, 1, 1, InferAffineGrid, true, true},
      {kOnnx, "Col2Im", {18}, 18, 3, 3, 1, 1, InferCol2Im, true, true},
      // Random numbers: the Like forms and Bernoulli read only their input's shape (and
      // Bernoulli its probabilities), so their gradient rules pass nothing back.
      {kOnnx, "RandomNormal", {1, 22}, 1, 0, 0, 1, 1, InferRandom, false},
      {kOnnx, "RandomUniform", {1, 22}, 1, 0, 0, 1, 1, InferRandom, false},
      {kOnnx, "RandomNormalLike", {1, 22}, 1, 1, 1, 1, 1, InferRandom, true},
      {kOnnx, "RandomUniformLike", {1, 22}, 1, 1, 1, 1, 1, InferRandom, true},
      {kOnnx, "Bernoulli", {15, 22}, 15, 1, 1, 1, 1, InferRandom, true},
      {kOnnx, "Multinomial", {7, 22}, 7, 1, 1, 1, 1, InferRandom, false},
      {kOnnx, "DFT", {17, 20}, 17, 1, 3, 1, 1, InferDft, false},
      {kOnnx, "STFT", {17}, 17, 2, 4, 1, 1, InferStft, false},
      {kOnnx, "MelWeightMatrix", {17}, 17, 5, 5, 1, 1, InferMelWeightMatrix, false},
      {kOnnx, "RoiAlign", {10, 16, 22}, 10, 3, 3, 1, 1, InferRoiAlign, false},
      {kOnnx, "NegativeLogLikelihoodLoss", {12, 13, 22}, 12, 2, 3, 1, 1, InferSoftmaxCrossEntropyLoss, true},
      {C, "NegativeLogLikelihoodLossGrad", {1}, 1, 3, 4, 1, 1, InferSoftmaxCrossEntropyLossGrad, false},
      {kOnnx, "SoftmaxCrossEntropyLoss", {12, 13}, 12, 2, 3, 1, 2, InferSoftmaxCrossEntropyLoss,
       true},
      {kOnnx, "Dropout", {1, 6, 7, 10, 12, 13, 22}, 7, 1, 3, 1, 2, InferDropout, true},
      {kOnnx, "Trilu", {14}, 14, 1, 2, 1, 1, InferTrilu, true},
      {kOnnx, "Det", {11, 22}, 11, 1, 1, 1, 1, InferDet, false},
      // Shape and data movement.
      {kOnnx, "Reshape", {1, 5, 13, 14, 19, 21}, 5, 2, 2, 1, 1, InferReshape, true},
      {kOnnx, "Transpose", {1, 13, 21}, 1, 1, 1, 1, 1, InferTranspose, true},
      {kOnnx, "Concat", {1, 4, 11, 13}, 4, 1, kVar, 1, 1, InferConcat, true},
      {kOnnx, "Split", {1, 2, 11, 13, 18}, 2, 1, 2, 1, kVar, InferSplit, true},
      {kOnnx, "Slice", {1, 10, 11, 13}, 1, 1, 5, 1, 1, InferSlice, true},
      {kOnnx, "Squeeze", {1, 11, 13, 21}, 1, 1, 2, 1, 1, InferSqueeze, true},
      {kOnnx, "Unsqueeze", {1, 11, 13, 21}, 1, 1, 2, 1, 1, InferUnsqueeze, true},
      {kOnnx, "Flatten", {1, 9, 11, 13, 21}, 1, 1, 1, 1, 1, InferFlatten, true},
      {kOnnx, "Expand", {8, 13}, 8, 2, 2, 1, 1, InferExpand, true},
      {kOnnx, "Gather", {1, 11, 13}, 1, 2, 2, 1, 1, InferGather, true},
      {kOnnx, "Shape", {1, 13, 15, 19, 21}, 1, 1, 1, 1, 1, InferShape, false},
      {kOnnx, "Size", {1, 13, 19, 21}, 1, 1, 1, 1, 1, InferSize, false},
      {kOnnx, "CumSum", {11, 14}, 11, 2, 2, 1, 1, InferCumSum, true},
      {kOnnx, "Pad", {1, 2, 11, 13, 18, 19, 21}, 11, 2, 4, 1, 1, InferPad, true},
      {C, "PadGrad", {1}, 1, 2, 2, 1, 1, InferPadGrad, false},
      {kOnnx, "Tile", {1, 6, 13}, 6, 2, 2, 1, 1, InferTile, true},
      {kOnnx, "GatherElements", {11, 13}, 11, 2, 2, 1, 1, InferGatherElements, true},
      {kOnnx, "ScatterElements", {11, 13, 16, 18}, 11, 3, 3, 1, 1, InferScatterElements, true},
      // ScatterElements' first name (deprecated since opset 11); no gradient rule, since the ops
      // a gradient would emit need opset 11.
      {kOnnx, "Scatter", {9, 11}, 9, 3, 3, 1, 1, InferScatterElements, false},
      {kOnnx, "ArgMax", {1, 11, 12, 13}, 1, 1, 1, 1, 1, InferArgExtreme, false},
      {kOnnx, "ArgMin", {1, 11, 12, 13}, 1, 1, 1, 1, 1, InferArgExtreme, false},
      {kOnnx, "TopK", {1, 10, 11}, 1, 1, 2, 2, 2, InferTopK, true},
      {kOnnx, "GatherND", {11, 12, 13}, 11, 2, 2, 1, 1, InferGatherND, true},
      {kOnnx, "ScatterND", {11, 13, 16, 18}, 11, 3, 3, 1, 1, InferScatterND, true},
      {kOnnx, "NonZero", {9, 13}, 9, 1, 1, 1, 1, InferNonZero, false},
      {kOnnx, "Compress", {9, 11}, 9, 2, 2, 1, 1, InferCompress, false},
      {kOnnx, "NonMaxSuppression", {10, 11}, 10, 2, 5, 1, 1, InferNonMaxSuppression, false},
      {kOnnx, "Unique", {11}, 11, 1, 1, 1, 4, InferUnique, false},
      {kOnnx, "ConstantOfShape", {9, 20, 21}, 9, 1, 1, 1, 1, InferConstantOfShape, false},
      {kOnnx, "Range", {11}, 11, 3, 3, 1, 1, InferRange, false},
      {kOnnx, "Identity", {1, 13, 14, 16, 19, 21}, 1, 1, 1, 1, 1, InferIdentity, true},
      {kOnnx, "Constant", {1, 9, 11, 12, 13, 19, 21}, 1, 0, 0, 1, 1, InferConstant, false},
      // Gradient ops that the backward graph emits (Gather, Slice, the loss, Softmax,
      // LogSoftmax, LayerNormalization, Gelu).
      {C, "GatherGrad", {1}, 1, 3, 5, 1, 1, InferGatherGrad, false},
      {C, "SliceGrad", {1}, 1, 4, 6, 1, 1, InferSliceGrad, false},
      {C, "SoftmaxCrossEntropyLossGrad", {1}, 1, 3, 4, 1, 2, InferSoftmaxCrossEntropyLossGrad,
       false},
      {C, "SoftmaxGrad", {1}, 1, 2, 2, 1, 1, InferSoftmaxGrad, false},
      {C, "LogSoftmaxGrad", {1}, 1, 2, 2, 1, 1, InferSoftmaxGrad, false},
      {C, "LayerNormalizationGrad", {1}, 1, 5, 6, 1, 4, InferLayerNormGrad, false},
      {C, "RMSNormalizationGrad", {1}, 1, 4, 5, 1, 3, InferLayerNormGrad, false},
      {C, "GeluGrad", {1}, 1, 2, 2, 1, 1, InferGeluGrad, false},
      {C, "SwiGLUGrad", {1}, 1, 3, 3, 1, 2, InferSwiGlu, false},
      {C, "RotaryEmbeddingGrad", {1}, 1, 3, 3, 1, 1, InferRotary, false},
      {C, "Attention", {1}, 1, 1, 4, 1, 2, InferAttention, true},
      {C, "SkipLayerNormalization", {1}, 1, 3, 4, 1, 4, InferSkipLayerNorm, false},
      {C, "SkipRMSNormalization", {1}, 1, 3, 3, 1, 3, InferSkipLayerNorm, false},
      {C, "AttentionGrad", {1}, 1, 6, 7, 1, 4, InferAttentionGrad, false},
      // Training ops: gradient accumulation and the optimizer graph.
      {C, "InPlaceAccumulator", {1}, 1, 3, 3, 1, 1, InferInPlaceAccumulator, false},
      {C, "SquaredNorm", {1}, 1, 1, kVar, 1, 1, InferSquaredNorm, false},
      {C, "IsAllFinite", {1}, 1, 1, kVar, 1, 1, InferIsAllFinite, false},
      {C, "AdamW", {1}, 1, 7, 7, 3, 3, InferAdamW, false},
      {C, "MultiTensorAdamW", {1}, 1, 7, kVar, 3, kVar, InferMultiTensorAdamW, false},
      {C, "SGD", {1}, 1, 5, 6, 1, 2, InferSGD, false},
      {C, "MultiTensorSGD", {1}, 1, 5, kVar, 1, kVar, InferMultiTensorSGD, false},
      // Collectives of partitioned graphs.
      {C, "AllReduce", {1}, 1, 1, 1, 1, 1, InferAllReduce, false},
      {C, "AllGather", {1}, 1, 1, 1, 1, 1, InferAllGather, false},
      {C, "ReduceScatter", {1}, 1, 1, 1, 1, 1, InferReduceScatter, false},
      {C, "AllToAll", {1}, 1, 1, 1, 1, 1, InferAllReduce, false},
      {C, "Send", {1}, 1, 1, 1, 1, 1, InferSend, false},
      {C, "Recv", {1}, 1, 0, 1, 1, 1, InferRecv, false},
  };
}

}  // namespace

ActivationAttrs ActivationAttrsOf(const Node& n) {
  ActivationAttrs a;
  const std::string& op = n.op_type();
  if (op == "LeakyRelu") a.alpha = n.AttrFloat("alpha", 0.01f);
  if (op == "Elu" || op == "Celu" || op == "ThresholdedRelu") a.alpha = n.AttrFloat("alpha", 1.f);
  if (op == "Selu") {
    a.alpha = n.AttrFloat("alpha", 1.67326319217681884765625f);
    a.gamma = n.AttrFloat("gamma", 1.05070102214813232421875f);
  }
  if (op == "HardSigmoid") {
    a.alpha = n.AttrFloat("alpha", 0.2f);
    a.beta = n.AttrFloat("beta", 0.5f);
  }
  return a;
}

const Tensor* ConstantInput(const Node& n, int i) {
  const Value* v = n.input(i);
  if (!v) return nullptr;
  if (v->initializer()) return v->initializer();
  const Node* p = v->producer();
  if (!p || p->op_type() != "Constant" || !p->domain().empty()) return nullptr;
  const Attribute* a = p->FindAttr("value");
  return a && a->type == AttrType::kTensor ? &a->t : nullptr;
}

const std::vector<OpDef>& AllOps() {
  static const std::vector<OpDef>* table = new std::vector<OpDef>(BuildTable());
  return *table;
}

const OpDef* FindOp(const std::string& domain_in, const std::string& name) {
  static const auto* index = [] {
    auto* m = new std::unordered_map<std::string, const OpDef*>();
    for (const OpDef& d : AllOps()) (*m)[absl::StrCat(d.domain, "::", d.name)] = &d;
    return m;
  }();
  const std::string& domain = domain_in == "ai.onnx" ? std::string() : domain_in;
  auto it = index->find(absl::StrCat(domain, "::", name));
  return it == index->end() ? nullptr : it->second;
}

absl::StatusOr<int> ResolveVersion(const OpDef& def, int64_t opset) {
  auto it = std::upper_bound(def.versions.begin(), def.versions.end(), opset);
  if (it == def.versions.begin())
    return Unimplemented(def.name, " does not exist at opset ", opset, " (first defined at ",
                         def.versions.front(), ")");
  int version = *std::prev(it);
  if (version < def.first_supported)
    return Unimplemented(def.name, " version ", version, " (opset ", opset,
                         ") is not supported; cleave implements versions ",
                         def.first_supported, " and later");
  if (def.domain.empty() && opset > kMaxKnownOpset)
    return Unimplemented("opset ", opset, " is newer than the newest cleave knows (",
                         kMaxKnownOpset, ")");
  return version;
}

absl::StatusOr<ResolvedOp> ResolveNode(const Graph& g, const Node& n) {
  const OpDef* def = FindOp(n.domain(), n.op_type());
  if (!def)
    return Unimplemented(n.Describe(), ": unsupported op ",
                         n.domain().empty() ? "" : n.domain() + ".", n.op_type());
  int64_t opset = g.OpsetFor(n.domain());
  if (opset < 0) {
    if (!n.domain().empty() && n.domain() == kCleaveDomain) opset = 1;
    else return InvalidArgument(n.Describe(), ": the model imports no opset for domain '",
                                n.domain(), "'");
  }
  auto version = ResolveVersion(*def, opset);
  if (!version.ok()) return Unimplemented(n.Describe(), ": ", version.status().message());
  int ni = n.num_inputs(), no = n.num_outputs();
  // Trailing omitted optional inputs do not count towards arity.
  while (ni > 0 && n.input(ni - 1) == nullptr) --ni;
  if (ni < def->min_inputs || (def->max_inputs != kVar && ni > def->max_inputs))
    return InvalidArgument(n.Describe(), ": has ", ni, " inputs, expected ", def->min_inputs,
                           def->max_inputs == kVar ? " or more"
                                                   : absl::StrCat(" to ", def->max_inputs));
  if (no < def->min_outputs || (def->max_outputs != kVar && no > def->max_outputs))
    return InvalidArgument(n.Describe(), ": has ", no, " outputs, expected ", def->min_outputs,
                           def->max_outputs == kVar ? " or more"
                                                    : absl::StrCat(" to ", def->max_outputs));
  return ResolvedOp{def, *version};
}

absl::Status InferNode(const Graph& g, Node& n) {
  ASSIGN_OR_RETURN(ResolvedOp op, ResolveNode(g, n));
  for (int i = 0; i < n.num_inputs(); ++i) {
    Value* v = n.input(i);
    if (v && v->dtype() == DataType::kUndefined && !v->producer() && !v->is_initializer() &&
        !v->is_graph_input())
      return InvalidArgument(n.Describe(), ": input ", i, " '", v->name(),
                             "' is not a graph input, an initializer or any node's output");
  }
  for (Value* o : n.outputs())
    if (o) o->set_dims_value(std::nullopt);
  InferContext ctx(n, op.version);
  RETURN_IF_ERROR(op.def->infer(ctx));
  PropagateDimsValues(n, op.version);
  return absl::OkStatus();
}

absl::Status InferShapes(Graph& g) {
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  for (Node* n : order) RETURN_IF_ERROR(InferNode(g, *n));
  return absl::OkStatus();
}

}  // namespace cleave::graph
