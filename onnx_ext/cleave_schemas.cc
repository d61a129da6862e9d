// ai.cleave schemas for ONNX's registry and the checker bridge (onnx_ext/).
#include "onnx_ext/cleave_schemas.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "onnx/checker.h"
#include "onnx/defs/schema.h"
#include "onnx/onnx_pb.h"
#include "onnx_ext/onnx_io.h"

namespace cleave::onnx_ext {

namespace {

using onnx::AttributeProto;
using onnx::OpSchema;

const std::vector<std::string> kFloatTypes = {"tensor(float)", "tensor(double)",
                                              "tensor(float16)", "tensor(bfloat16)"};

OpSchema FusedMatMulSchema() {
  OpSchema s;
  s.SetName("FusedMatMul").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Y = activation(A @ B + bias); see docs/ops.md.")
      .Input(0, "A", "[..., M, K]", "T")
      .Input(1, "B", "[K, N], or [N, K] with transB", "T")
      .Input(2, "bias", "[N]", "T", OpSchema::Optional)
      .Output(0, "Y", "[..., M, N]", "T")
      .Attr("activation", "'' (none), 'gelu' or 'gelu_tanh'", AttributeProto::STRING, std::string(""))
      .Attr("transA", "1: A's last two axes are stored transposed", AttributeProto::INT,
            static_cast<int64_t>(0))
      .Attr("transB", "B is given transposed", AttributeProto::INT, static_cast<int64_t>(0))
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

OpSchema MatMulLowpSchema(const char* name, const char* type) {
  OpSchema s;
  s.SetName(name).SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Y = A @ B with low-precision A and B and float32 accumulation; Y in float32, or rounded to A's "
              "type with `to`; see docs/ops.md.")
      .Input(0, "A", "[..., M, K], or [..., K, M] with transA", type)
      .Input(1, "B", "[K, N] or [..., K, N]; [N, K] with transB", type)
      .Input(2, "bias", "[N] of Y's type, added to every row", "Y", OpSchema::Optional)
      .Input(3, "accumulate", "float32 buffer of Y's shape that Y adds (a gradient accumulation)", "tensor(float)",
             OpSchema::Optional)
      .Input(4, "reset", "bool scalar: Y is the product alone", "tensor(bool)", OpSchema::Optional)
      .Input(5, "gelu_input", "with activation_grad: Y is the product times GELU' at it (Y's shape)", "Y",
             OpSchema::Optional)
      .Output(0, "Y", "[..., M, N]", "Y")
      .Output(1, "dbias", "float32 sums over K of the operand dbias_operand names (a bias gradient)",
              "tensor(float)", OpSchema::Optional)
      .Output(2, "pre", "with activation: the GELU's input, the product plus the bias", "Y", OpSchema::Optional)
      .Attr("transA", "A's last two axes are stored transposed", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("transB", "B's last two axes are stored transposed", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("to", "Y's type: 1 (float32) or A's type", AttributeProto::INT, static_cast<int64_t>(1))
      .Attr("dbias_operand", "0: dbias [M] sums A [K, M] (transA) over K; 1: dbias [N] sums B [K, N] over K",
            AttributeProto::INT, static_cast<int64_t>(1))
      .Attr("rows", "Y keeps only op(A)'s first `rows` rows (2-D A; all of them when absent)", AttributeProto::INT,
            onnx::OPTIONAL_VALUE)
      .Attr("activation", "'gelu' or 'gelu_tanh': the GELU of the product plus the bias", AttributeProto::STRING,
            onnx::OPTIONAL_VALUE)
      .Attr("activation_grad", "'gelu' or 'gelu_tanh': Y is the product times that GELU's derivative at gelu_input",
            AttributeProto::STRING, onnx::OPTIONAL_VALUE)
      .TypeConstraint("Y", {"tensor(float)", type}, "float32, or A's type");
  return s;
}

OpSchema GeluSchema() {
  OpSchema s;
  s.SetName("Gelu").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("GELU as ONNX Gelu-20, for models of any opset; see docs/ops.md.")
      .Input(0, "X", "input", "T")
      .Output(0, "Y", "output", "T")
      .Attr("approximate", "'none' or 'tanh'", AttributeProto::STRING, std::string("none"))
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// LayerNormalization as ONNX LayerNormalization-17, or (rms) RMSNormalization as ONNX
// RMSNormalization-23 with the saved InvStdDev (no bias, no mean).
OpSchema NormSchema(bool rms) {
  OpSchema s;
  s.SetName(rms ? "RMSNormalization" : "LayerNormalization").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(rms ? "Y = X / sqrt(mean(X^2 over axis..) + epsilon) * Scale, as ONNX RMSNormalization-23, "
                    "with the saved InvStdDev; see docs/ops.md."
                  : "LayerNormalization as ONNX LayerNormalization-17, for models of any opset.")
      .Input(0, "X", "input", "T")
      .Input(1, "Scale", "scale", "T");
  if (!rms) s.Input(2, "B", "bias", "T", OpSchema::Optional);
  s.Output(0, "Y", "normalised", "T");
  if (!rms) s.Output(1, "Mean", "saved mean", "U", OpSchema::Optional);
  s.Output(rms ? 1 : 2, "InvStdDev", rms ? "saved 1 / sqrt(mean(X^2) + epsilon)" : "saved inverse standard deviation",
           "U", OpSchema::Optional)
      .Attr("axis", "first normalised axis", AttributeProto::INT, static_cast<int64_t>(-1))
      .Attr("epsilon", rms ? "added to the mean square" : "added to the variance", AttributeProto::FLOAT, 1e-5f)
      .Attr("stash_type", rms ? "type of InvStdDev" : "type of Mean and InvStdDev", AttributeProto::INT,
            static_cast<int64_t>(1))
      .TypeConstraint("T", kFloatTypes, "float tensors")
      .TypeConstraint("U", {"tensor(float)", "tensor(double)"}, "statistics type");
  return s;
}


const std::vector<std::string> kIndexTypes = {"tensor(int32)", "tensor(int64)"};
const std::vector<std::string> kGradTypes = {"tensor(float)", "tensor(double)"};

OpSchema GatherGradSchema() {
  OpSchema s;
  s.SetName("GatherGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("dX = zeros(shape) (or base) with dY scatter-added at indices along axis; see docs/ops.md.")
      .Input(0, "shape", "the shape of Gather's data", "tensor(int64)")
      .Input(1, "indices", "Gather's indices", "Tind")
      .Input(2, "dY", "gradient of Gather's output", "T")
      .Input(3, "base", "of dX's shape: what dX starts from instead of zeros (an accumulated gradient)", "T",
             OpSchema::Optional)
      .Input(4, "reset", "bool scalar: dX starts from zeros after all", "tensor(bool)", OpSchema::Optional)
      .Output(0, "dX", "gradient of Gather's data", "T")
      .Attr("axis", "Gather's axis", AttributeProto::INT, static_cast<int64_t>(0))
      .TypeConstraint("T", kGradTypes, "float tensors")
      .TypeConstraint("Tind", kIndexTypes, "index tensors");
  return s;
}

OpSchema SliceGradSchema() {
  OpSchema s;
  s.SetName("SliceGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("dX = zeros(shape) with dY written into the Slice-13 positions; see docs/ops.md.")
      .Input(0, "dY", "gradient of Slice's output", "T")
      .Input(1, "shape", "the shape of Slice's data", "tensor(int64)")
      .Input(2, "starts", "Slice's starts", "Tind")
      .Input(3, "ends", "Slice's ends", "Tind")
      .Input(4, "axes", "Slice's axes", "Tind", OpSchema::Optional)
      .Input(5, "steps", "Slice's steps", "Tind", OpSchema::Optional)
      .Output(0, "dX", "gradient of Slice's data", "T")
      .TypeConstraint("T", kGradTypes, "float tensors")
      .TypeConstraint("Tind", kIndexTypes, "index tensors");
  return s;
}

OpSchema SoftmaxCrossEntropyLossGradSchema() {
  OpSchema s;
  s.SetName("SoftmaxCrossEntropyLossGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Gradient of SoftmaxCrossEntropyLoss with respect to the scores; see docs/ops.md.")
      .Input(0, "dY", "gradient of the loss", "T")
      .Input(1, "log_prob", "the forward log_prob [N, C, ...], or the scores with from_scores", "T")
      .Input(2, "label", "labels [N, ...]", "Tind")
      .Input(3, "weight", "class weights [C]", "T", OpSchema::Optional)
      .Output(0, "d_scores", "gradient of the scores (of type T, or `to`)", "TOut")
      .Output(1, "loss", "with from_scores: the forward's loss, computed on the way", "T", OpSchema::Optional)
      .Attr("reduction", "'none', 'sum' or 'mean'", AttributeProto::STRING, std::string("mean"))
      .Attr("ignore_index", "label whose positions get no gradient", AttributeProto::INT,
            false)
      .Attr("class_offset", "the first class log_prob holds (a slice of the classes)", AttributeProto::INT,
            static_cast<int64_t>(0))
      .Attr("num_classes", "all classes, when log_prob holds a slice of them (0: C)", AttributeProto::INT,
            static_cast<int64_t>(0))
      .Attr("from_scores", "input 1 holds the scores, whose log-softmax is log_prob", AttributeProto::INT,
            static_cast<int64_t>(0))
      .Attr("to", "the gradient's type (bfloat16 or float16); T when absent", AttributeProto::INT, false)
      .TypeConstraint("T", kGradTypes, "float tensors")
      .TypeConstraint("TOut", {"tensor(float)", "tensor(double)", "tensor(bfloat16)", "tensor(float16)"},
                      "the gradient's type")
      .TypeConstraint("Tind", kIndexTypes, "label tensors");
  return s;
}

OpSchema NegativeLogLikelihoodLossGradSchema() {
  OpSchema s;
  s.SetName("NegativeLogLikelihoodLossGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Gradient of NegativeLogLikelihoodLoss with respect to its input; see docs/ops.md.")
      .Input(0, "dY", "gradient of the loss", "T")
      .Input(1, "input", "the forward's input [N, C, ...], log-probabilities", "T")
      .Input(2, "target", "targets [N, ...]", "Tind")
      .Input(3, "weight", "class weights [C]", "T", OpSchema::Optional)
      .Output(0, "d_input", "gradient of the input", "T")
      .Attr("reduction", "'none', 'sum' or 'mean'", AttributeProto::STRING, std::string("mean"))
      .Attr("ignore_index", "target whose positions get no gradient", AttributeProto::INT, false)
      .TypeConstraint("T", kGradTypes, "float tensors")
      .TypeConstraint("Tind", kIndexTypes, "target tensors");
  return s;
}

// ConvGrad, or ConvTransposeGrad (with output_padding and output_shape): (dY, X, W) -> dX, dW, dB.
OpSchema ConvGradSchema(bool transposed) {
  OpSchema s;
  const char* fwd = transposed ? "ConvTranspose's" : "Conv's";
  s.SetName(transposed ? "ConvTransposeGrad" : "ConvGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(transposed ? "Gradients of ConvTranspose from dY; see docs/ops.md."
                         : "Gradients of Conv from dY; see docs/ops.md.")
      .Input(0, "dY", std::string("gradient of ") + fwd + " output", "T")
      .Input(1, "X", std::string(fwd) + " input", "T")
      .Input(2, "W", std::string(fwd) + " weights", "T")
      .Output(0, "dX", "gradient of X", "T")
      .Output(1, "dW", "gradient of W", "T", OpSchema::Optional)
      .Output(2, "dB", "gradient of the bias [M]", "T", OpSchema::Optional)
      .Attr("auto_pad", "as the forward's", AttributeProto::STRING, std::string("NOTSET"))
      .Attr("dilations", "as the forward's", AttributeProto::INTS, false)
      .Attr("group", "as the forward's", AttributeProto::INT, static_cast<int64_t>(1))
      .Attr("kernel_shape", "as the forward's", AttributeProto::INTS, false)
      .Attr("pads", "as the forward's", AttributeProto::INTS, false)
      .Attr("strides", "as the forward's", AttributeProto::INTS, false);
  if (transposed)
    s.Attr("output_padding", "as the forward's", AttributeProto::INTS, false)
        .Attr("output_shape", "as the forward's", AttributeProto::INTS, false);
  s.TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// MaxPoolGrad (dY, X) and AveragePoolGrad (dY, X's shape), with the forward pool's attributes.
OpSchema PoolGradSchema(bool max) {
  OpSchema s;
  s.SetName(max ? "MaxPoolGrad" : "AveragePoolGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(max ? "Gradient of MaxPool (or GlobalMaxPool, with global = 1): each window's dY goes to the "
                    "tap it chose, found again from X; see docs/ops.md."
                  : "Gradient of AveragePool (or GlobalAveragePool, with global = 1): each window's dY spread "
                    "over the taps its divisor counted; see docs/ops.md.")
      .Input(0, "dY", "gradient of the pool's output", "T");
  if (max) s.Input(1, "X", "the pool's input", "T");
  else s.Input(1, "shape", "the pool input's shape", "tensor(int64)");
  s.Output(0, "dX", "gradient of the pool's input", "T")
      .Attr("auto_pad", "as the pool's", AttributeProto::STRING, std::string("NOTSET"))
      .Attr("ceil_mode", "as the pool's", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("dilations", "as the pool's", AttributeProto::INTS, false)
      .Attr("kernel_shape", "as the pool's", AttributeProto::INTS, false)
      .Attr("pads", "as the pool's", AttributeProto::INTS, false)
      .Attr("strides", "as the pool's", AttributeProto::INTS, false)
      .Attr("global", "1: the forward was the global pool", AttributeProto::INT, static_cast<int64_t>(0));
  if (!max)
    s.Attr("count_include_pad", "as AveragePool's", AttributeProto::INT, static_cast<int64_t>(0));
  s.TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// GridSampleGrad (dY, X, grid) -> dX, dGrid, with the forward GridSample's attributes.
OpSchema GridSampleGradSchema() {
  OpSchema s;
  s.SetName("GridSampleGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Gradient of GridSample: dX gathers each output's gradient into the elements it sampled, times "
              "their weights; dGrid is the sampled value's slope along each coordinate; see docs/ops.md.")
      .Input(0, "dY", "gradient of Y", "T")
      .Input(1, "X", "the forward's X", "T")
      .Input(2, "grid", "the forward's grid", "T")
      .Output(0, "dX", "gradient of X", "T")
      .Output(1, "dGrid", "gradient of the grid", "T", OpSchema::Optional)
      .Attr("mode", "as the forward's", AttributeProto::STRING, std::string("linear"))
      .Attr("padding_mode", "as the forward's", AttributeProto::STRING, std::string("zeros"))
      .Attr("align_corners", "as the forward's", AttributeProto::INT, static_cast<int64_t>(0))
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// ResizeGrad (dY, X's shape[, roi, scales, sizes]) -> dX, with the forward Resize's attributes.
OpSchema ResizeGradSchema() {
  OpSchema s;
  s.SetName("ResizeGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Gradient of Resize (nearest, linear): each output's gradient goes back to the input elements it "
              "sampled, times their weights; see docs/ops.md.")
      .Input(0, "dY", "gradient of Y", "T")
      .Input(1, "shape", "X's shape", "tensor(int64)")
      .Input(2, "roi", "the forward's roi", "tensor(float)", OpSchema::Optional)
      .Input(3, "scales", "the forward's scales", "tensor(float)", OpSchema::Optional)
      .Input(4, "sizes", "the forward's sizes", "tensor(int64)", OpSchema::Optional)
      .Output(0, "dX", "gradient of X", "T")
      .Attr("mode", "as the forward's", AttributeProto::STRING, std::string("nearest"))
      .Attr("coordinate_transformation_mode", "as the forward's", AttributeProto::STRING, std::string("half_pixel"))
      .Attr("nearest_mode", "as the forward's", AttributeProto::STRING, std::string("round_prefer_floor"))
      .Attr("extrapolation_value", "as the forward's", AttributeProto::FLOAT, 0.f)
      .Attr("cubic_coeff_a", "as the forward's", AttributeProto::FLOAT, -0.75f)
      .Attr("exclude_outside", "as the forward's", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("antialias", "as the forward's", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("axes", "as the forward's", AttributeProto::INTS, false)
      .Attr("keep_aspect_ratio_policy", "as the forward's", AttributeProto::STRING, std::string("stretch"))
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// BatchNormalizationGrad (dY, X, scale, mean, var) -> dX, dScale, dB, or (instance)
// InstanceNormalizationGrad (dY, X, scale) -> dX, dScale, dB.
OpSchema NormalizationGradSchema(bool instance) {
  OpSchema s;
  s.SetName(instance ? "InstanceNormalizationGrad" : "BatchNormalizationGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(instance ? "Gradients of InstanceNormalization through each image's channel statistics, recomputed "
                         "from X; see docs/ops.md."
                       : "Gradients of BatchNormalization; in training mode through the batch's statistics, "
                         "recomputed from X; see docs/ops.md.")
      .Input(0, "dY", "gradient of Y", "T")
      .Input(1, "X", "the forward input [N, C, ...]", "T")
      .Input(2, "scale", "the forward scale [C]", "U");
  if (!instance)
    s.Input(3, "input_mean", "the forward input_mean [C] (read in inference mode)", "V")
        .Input(4, "input_var", "the forward input_var [C] (read in inference mode)", "V")
        .Attr("training_mode", "1: the forward normalised by the batch's statistics", AttributeProto::INT,
              static_cast<int64_t>(0))
        .TypeConstraint("V", kFloatTypes, "the statistics' type: X's, or float32 beside a bf16 / fp16 X");
  s.Output(0, "dX", "gradient of X", "T")
      .Output(1, "dScale", "gradient of scale", "U", OpSchema::Optional)
      .Output(2, "dB", "gradient of B", "U", OpSchema::Optional)
      .Attr("epsilon", "as the forward's", AttributeProto::FLOAT, 1e-5f)
      .TypeConstraint("T", kFloatTypes, "float tensors")
      .TypeConstraint("U", kFloatTypes, "scale's type: X's, or float32 beside a bf16 / fp16 X");
  return s;
}

// SoftmaxGrad and LogSoftmaxGrad: (dY, Y) {axis} -> dX.
OpSchema SoftmaxGradSchema(const char* name, const char* doc) {
  OpSchema s;
  s.SetName(name).SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(doc)
      .Input(0, "dY", "gradient of the forward output", "T")
      .Input(1, "Y", "the forward output", "T")
      .Output(0, "dX", "gradient of the forward input", "T")
      .Attr("axis", "the forward's axis (opset-13 semantics: one axis)", AttributeProto::INT,
            static_cast<int64_t>(-1))
      .TypeConstraint("T", kGradTypes, "float tensors");
  return s;
}

// LayerNormalizationGrad, or (rms) RMSNormalizationGrad, which has no mean input and no dBias
// output.
OpSchema NormGradSchema(bool rms) {
  OpSchema s;
  const int stats = rms ? 3 : 4;  // index of inv_std_dev
  s.SetName(rms ? "RMSNormalizationGrad" : "LayerNormalizationGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(rms ? "Gradients of RMSNormalization from its saved InvStdDev; see docs/ops.md."
                  : "Gradients of LayerNormalization from its saved Mean and InvStdDev; see docs/ops.md.")
      .Input(0, "dY", "gradient of Y; or bf16 / fp16 with a float32 X", "D")
      .Input(1, "X", "the forward input", "T")
      .Input(2, "scale", "the forward Scale", "T");
  if (!rms) s.Input(3, "mean", "the forward Mean output", "U");
  s.Input(stats, "inv_std_dev", "the forward InvStdDev output", "U")
      .Input(stats + 1, "dX_add", "a gradient of X added to dX (the residual stream's)", "T", OpSchema::Optional)
      .Output(0, "dX", "gradient of X", "T")
      .Output(1, "dScale", "gradient of Scale", "T", OpSchema::Optional);
  if (!rms) s.Output(2, "dBias", "gradient of B (of Scale's shape)", "T", OpSchema::Optional);
  s.Output(rms ? 2 : 3, "dX_low", "dX (float32) rounded to the type low_to names, as a Cast of it would be", "L",
           OpSchema::Optional)
      .Attr("axis", "the forward's first normalised axis", AttributeProto::INT,
            static_cast<int64_t>(-1))
      .Attr("low_to", "dX_low's type: 16 (bfloat16) or 10 (float16)", AttributeProto::INT, static_cast<int64_t>(16))
      .TypeConstraint("T", kGradTypes, "float tensors")
      .TypeConstraint("D", {"tensor(float)", "tensor(double)", "tensor(bfloat16)", "tensor(float16)"},
                      "X's type, or bf16 / fp16 with a float32 X")
      .TypeConstraint("U", kGradTypes, "statistics type")
      .TypeConstraint("L", {"tensor(bfloat16)", "tensor(float16)"}, "dX_low's type");
  return s;
}

OpSchema GeluGradSchema() {
  OpSchema s;
  s.SetName("GeluGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("dX = dY * gelu'(X), erf or tanh form; see docs/ops.md.")
      .Input(0, "dY", "gradient of Gelu's output", "T")
      .Input(1, "X", "Gelu's input", "T")
      .Output(0, "dX", "gradient of Gelu's input", "T")
      .Attr("approximate", "'none' or 'tanh'", AttributeProto::STRING, std::string("none"))
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

OpSchema SwiGluSchema() {
  OpSchema s;
  s.SetName("SwiGLU").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("y = gate * sigmoid(gate) * up (silu(gate) * up, LLaMA's gated MLP); see docs/ops.md.")
      .Input(0, "gate", "the gate product", "T")
      .Input(1, "up", "the up product, of gate's shape", "T")
      .Output(0, "y", "silu(gate) * up", "T")
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

OpSchema SwiGluGradSchema() {
  OpSchema s;
  s.SetName("SwiGLUGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("dGate = dY * up * silu'(gate), dUp = dY * silu(gate); see docs/ops.md.")
      .Input(0, "dY", "gradient of SwiGLU's output", "T")
      .Input(1, "gate", "SwiGLU's gate", "T")
      .Input(2, "up", "SwiGLU's up", "T")
      .Output(0, "dGate", "gradient of gate", "T", OpSchema::Optional)
      .Output(1, "dUp", "gradient of up", "T", OpSchema::Optional)
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

// RotaryEmbedding, or (grad) its gradient with respect to x.
OpSchema RotarySchema(bool grad) {
  OpSchema s;
  s.SetName(grad ? "RotaryEmbeddingGrad" : "RotaryEmbedding").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(grad ? "dX = dY * cos + rotate_half transposed of dY * sin; see docs/ops.md."
                   : "y = x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) over the last axis; "
                     "see docs/ops.md.")
      .Input(0, grad ? "dY" : "x", grad ? "gradient of y" : "[..., D], D even", "T")
      .Input(1, "cos", "broadcasting to x, last dim D or 1", "T")
      .Input(2, "sin", "cos's shape", "T")
      .Output(0, grad ? "dX" : "y", "x's shape", "T")
      .TypeConstraint("T", kFloatTypes, "float tensors");
  return s;
}

OpSchema MultiTensorAdamWSchema() {
  OpSchema s;
  s.SetName("MultiTensorAdamW").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("AdamW over n parameters in one op; see docs/ops.md.")
      .Input(0, "lr", "learning rate (scalar)", "tensor(float)")
      .Input(1, "step", "1-based step number (scalar)", "tensor(int64)")
      .Input(2, "grad_scale", "factor applied to every grad (scalar)", "tensor(float)")
      .Input(3, "tensors", "param, grad, exp_avg, exp_avg_sq of each parameter", "tensor(float)", OpSchema::Variadic)
      .Output(0, "updated", "param, exp_avg, exp_avg_sq of each parameter", "tensor(float)", OpSchema::Variadic)
      .Attr("beta1", "first-moment decay", AttributeProto::FLOAT, 0.9f)
      .Attr("beta2", "second-moment decay", AttributeProto::FLOAT, 0.999f)
      .Attr("epsilon", "denominator term", AttributeProto::FLOAT, 1e-8f)
      .Attr("weight_decay", "decoupled weight decay", AttributeProto::FLOAT, 0.0f);
  return s;
}

OpSchema AttentionSchema() {
  OpSchema s;
  s.SetName("Attention").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("out = softmax(scale * q k^T (+ bias) (+ causal mask)) v over the last two axes; see docs/ops.md.")
      .Input(0, "q", "queries [..., T, D] (layout bs3hd: q, k and v packed [B, T, 3, H, D])", "T")
      .Input(1, "k", "keys [..., S, D] (omitted under bs3hd)", "T", OpSchema::Optional)
      .Input(2, "v", "values [..., S, Dv] (omitted under bs3hd)", "T", OpSchema::Optional)
      .Input(3, "bias", "added to the scaled scores, broadcasting to [..., T, S]: float32 or T", "B",
             OpSchema::Optional)
      .Output(0, "out", "[..., T, Dv]", "T")
      .Output(1, "lse", "log-sum-exp of each row of scaled scores [..., T]", "tensor(float)", OpSchema::Optional)
      .Attr("scale", "multiplies q k^T", AttributeProto::FLOAT, 1.0f)
      .Attr("causal", "1: query i sees keys j <= i + S - T", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("layout",
            "\"bhsd\": [..., T, D]; \"bshd\": [B, T, H, D] operands and output, lse [B, H, T]; \"bs3hd\": "
            "input 0 packs q, k and v [B, T, 3, H, D], output as bshd",
            AttributeProto::STRING, std::string("bhsd"))
      .TypeConstraint("T", kFloatTypes, "float tensors")
      .TypeConstraint("B", kFloatTypes, "float32 or q's type");
  return s;
}

// SkipLayerNormalization, or (rms) SkipRMSNormalization, which has no bias and no mean.
OpSchema SkipNormSchema(bool rms) {
  OpSchema s;
  s.SetName(rms ? "SkipRMSNormalization" : "SkipLayerNormalization").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc(rms ? "y = RMSNormalization(x + skip) over the last axis, and the sum; see docs/ops.md."
                  : "y = LayerNormalization(x + skip) over the last axis, and the sum; see docs/ops.md.")
      .Input(0, "x", "[..., C]", "T")
      .Input(1, "skip", "like x; or bf16 / fp16 with a float32 x", "S")
      .Input(2, "scale", "[C]", "T");
  if (!rms) s.Input(3, "bias", "[C]", "T", OpSchema::Optional);
  s.Output(0, "y", "like x, in x's type or the type `to` names", "V");
  if (!rms) s.Output(1, "mean", "[..., 1]", "tensor(float)", OpSchema::Optional);
  s.Output(rms ? 1 : 2, "inv_std_dev", "[..., 1]", "tensor(float)", OpSchema::Optional)
      .Output(rms ? 2 : 3, "sum", "x + skip", "T", OpSchema::Optional)
      .Attr("epsilon", rms ? "added to the mean square" : "added to the variance", AttributeProto::FLOAT, 1e-5f)
      .Attr("to", "y's type when not x's: 16 (bfloat16) or 10 (float16)", AttributeProto::INT, onnx::OPTIONAL_VALUE)
      .TypeConstraint("T", kFloatTypes, "float tensors")
      .TypeConstraint("S", kFloatTypes, "x's type, or bf16 / fp16 with a float32 x")
      .TypeConstraint("V", kFloatTypes, "float tensors");
  return s;
}

OpSchema AttentionGradSchema() {
  OpSchema s;
  s.SetName("AttentionGrad").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Gradients of Attention with respect to q, k, v and the scores; see docs/ops.md.")
      .Input(0, "dOut", "gradient of out", "T")
      .Input(1, "q", "queries (bs3hd: the packed q, k, v)", "T")
      .Input(2, "k", "keys (omitted under bs3hd)", "T", OpSchema::Optional)
      .Input(3, "v", "values (omitted under bs3hd)", "T", OpSchema::Optional)
      .Input(4, "out", "the forward output", "T")
      .Input(5, "lse", "the forward log-sum-exp", "tensor(float)")
      .Input(6, "bias", "the forward's bias", "B", OpSchema::Optional)
      .Output(0, "dq", "like q (bs3hd: the packed dq, dk, dv)", "T")
      .Output(1, "dk", "like k (omitted under bs3hd)", "T", OpSchema::Optional)
      .Output(2, "dv", "like v (omitted under bs3hd)", "T", OpSchema::Optional)
      .Output(3, "dbias", "the scores' gradient before the scale, [..., T, S] ([B, H, T, S] under bshd and bs3hd)",
              "tensor(float)", OpSchema::Optional)
      .Attr("scale", "as the forward", AttributeProto::FLOAT, 1.0f)
      .Attr("causal", "as the forward", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("layout", "as the forward", AttributeProto::STRING, std::string("bhsd"))
      .TypeConstraint("T", kFloatTypes, "float tensors")
      .TypeConstraint("B", kFloatTypes, "float32 or q's type");
  return s;
}

OpSchema InPlaceAccumulatorSchema() {
  OpSchema s;
  s.SetName("InPlaceAccumulator").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("out = reset ? grad : buffer + grad; the runtime binds out to buffer's memory.")
      .Input(0, "buffer", "the accumulation buffer", "tensor(float)")
      .Input(1, "grad", "this micro-batch's gradient", "tensor(float)")
      .Input(2, "reset", "true on the first micro-batch after an optimizer step", "tensor(bool)")
      .Output(0, "out", "the updated buffer", "tensor(float)");
  return s;
}

OpSchema SquaredNormSchema() {
  OpSchema s;
  s.SetName("SquaredNorm").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Sum of the squares of every element of every input, accumulated in double.")
      .Input(0, "x", "tensors", "tensor(float)", OpSchema::Variadic)
      .Output(0, "y", "float scalar", "tensor(float)");
  return s;
}

OpSchema IsAllFiniteSchema() {
  OpSchema s;
  s.SetName("IsAllFinite").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("True when no element of any input is infinite or NaN (the loss scaler's overflow test).")
      .Input(0, "x", "tensors", "tensor(float)", OpSchema::Variadic)
      .Output(0, "y", "bool scalar", "tensor(bool)");
  return s;
}

OpSchema AdamWSchema() {
  OpSchema s;
  s.SetName("AdamW").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("One AdamW step with PyTorch semantics (decoupled weight decay, bias correction); "
              "grad is multiplied by grad_scale first. See docs/ops.md.")
      .Input(0, "lr", "learning rate (scalar)", "tensor(float)")
      .Input(1, "step", "1-based step number (scalar)", "tensor(int64)")
      .Input(2, "grad_scale", "factor applied to grad (scalar)", "tensor(float)")
      .Input(3, "param", "parameter", "tensor(float)")
      .Input(4, "grad", "gradient", "tensor(float)")
      .Input(5, "exp_avg", "first moment", "tensor(float)")
      .Input(6, "exp_avg_sq", "second moment", "tensor(float)")
      .Output(0, "param_out", "updated parameter", "tensor(float)")
      .Output(1, "exp_avg_out", "updated first moment", "tensor(float)")
      .Output(2, "exp_avg_sq_out", "updated second moment", "tensor(float)")
      .Attr("beta1", "first-moment decay", AttributeProto::FLOAT, 0.9f)
      .Attr("beta2", "second-moment decay", AttributeProto::FLOAT, 0.999f)
      .Attr("epsilon", "denominator term", AttributeProto::FLOAT, 1e-8f)
      .Attr("weight_decay", "decoupled weight decay", AttributeProto::FLOAT, 0.0f);
  return s;
}

OpSchema SGDSchema() {
  OpSchema s;
  s.SetName("SGD").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("One SGD step with PyTorch semantics (L2 weight decay, momentum, dampening, "
              "Nesterov); grad is multiplied by grad_scale first. See docs/ops.md.")
      .Input(0, "lr", "learning rate (scalar)", "tensor(float)")
      .Input(1, "step", "1-based step number (scalar)", "tensor(int64)")
      .Input(2, "grad_scale", "factor applied to grad (scalar)", "tensor(float)")
      .Input(3, "param", "parameter", "tensor(float)")
      .Input(4, "grad", "gradient", "tensor(float)")
      .Input(5, "momentum_buffer", "momentum buffer", "tensor(float)", OpSchema::Optional)
      .Output(0, "param_out", "updated parameter", "tensor(float)")
      .Output(1, "momentum_buffer_out", "updated momentum buffer", "tensor(float)",
              OpSchema::Optional)
      .Attr("momentum", "momentum factor", AttributeProto::FLOAT, 0.0f)
      .Attr("dampening", "dampening for momentum", AttributeProto::FLOAT, 0.0f)
      .Attr("weight_decay", "L2 penalty added to the gradient", AttributeProto::FLOAT, 0.0f)
      .Attr("nesterov", "Nesterov momentum", AttributeProto::INT, static_cast<int64_t>(0));
  return s;
}

// The collectives: `group` lists the global ranks (in group order) and `mesh_axis` names the
// mesh axis the group spans.
OpSchema CollectiveSchema(const char* name, const char* doc, bool reduces, bool has_axis) {
  OpSchema s;
  s.SetName(name).SetDomain("ai.cleave").SinceVersion(1).SetDoc(doc)
      .Input(0, "input", "this rank's tensor", "T")
      .Output(0, "output", "the collective's result on this rank", "T")
      .Attr("group", "global ranks of the group, in group order", AttributeProto::INTS)
      .Attr("mesh_axis", "the mesh axis the group spans", AttributeProto::STRING, std::string(""))
      .TypeConstraint("T", {"tensor(float)", "tensor(double)", "tensor(int64)", "tensor(int32)"}, "numeric tensors");
  if (reduces) s.Attr("reduction", "'sum' or 'max'", AttributeProto::STRING, std::string("sum"));
  if (has_axis) s.Attr("axis", "the tensor axis gathered or scattered", AttributeProto::INT, static_cast<int64_t>(0));
  return s;
}

OpSchema SendSchema() {
  OpSchema s;
  s.SetName("Send").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Sends the input to rank `peer` with `tag`; the output is a bool scalar set once sent.")
      .Input(0, "input", "tensor to send", "T")
      .Output(0, "done", "true once sent", "tensor(bool)")
      .Attr("peer", "destination rank", AttributeProto::INT)
      .Attr("tag", "message tag", AttributeProto::INT, static_cast<int64_t>(0))
      .TypeConstraint("T", {"tensor(float)", "tensor(double)", "tensor(int64)", "tensor(int32)", "tensor(bool)",
                            "tensor(bfloat16)", "tensor(float16)"},
                      "numeric or bool tensors");
  return s;
}

OpSchema RecvSchema() {
  OpSchema s;
  s.SetName("Recv").SetDomain("ai.cleave").SinceVersion(1)
      .SetDoc("Receives a tensor of `shape` and `dtype` from rank `peer` with `tag`.")
      .Input(0, "after", "optional value to order the receive after", "tensor(bool)", OpSchema::Optional)
      .Output(0, "output", "the received tensor", "T")
      .Attr("peer", "source rank", AttributeProto::INT)
      .Attr("tag", "message tag", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr("shape", "dims of the received tensor", AttributeProto::INTS)
      .Attr("dtype", "ONNX element type of the received tensor", AttributeProto::INT)
      .TypeConstraint("T", {"tensor(float)", "tensor(double)", "tensor(int64)", "tensor(int32)", "tensor(bool)",
                            "tensor(bfloat16)", "tensor(float16)"},
                      "numeric or bool tensors");
  return s;
}

}  // namespace


void RegisterCleaveSchemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    onnx::OpSchemaRegistry::DomainToVersionRange::Instance().AddDomainToVersion("ai.cleave", 1, 1);
    onnx::RegisterSchema(FusedMatMulSchema());
    onnx::RegisterSchema(MatMulLowpSchema("MatMulBf16", "tensor(bfloat16)"));
    onnx::RegisterSchema(MatMulLowpSchema("MatMulF16", "tensor(float16)"));
    onnx::RegisterSchema(GeluSchema());
    onnx::RegisterSchema(NormSchema(false));
    onnx::RegisterSchema(NormSchema(true));
    onnx::RegisterSchema(GatherGradSchema());
    onnx::RegisterSchema(SliceGradSchema());
    onnx::RegisterSchema(SoftmaxCrossEntropyLossGradSchema());
    onnx::RegisterSchema(NegativeLogLikelihoodLossGradSchema());
    onnx::RegisterSchema(ConvGradSchema(false));
    onnx::RegisterSchema(ConvGradSchema(true));
    onnx::RegisterSchema(PoolGradSchema(true));
    onnx::RegisterSchema(PoolGradSchema(false));
    onnx::RegisterSchema(NormalizationGradSchema(false));
    onnx::RegisterSchema(NormalizationGradSchema(true));
    onnx::RegisterSchema(ResizeGradSchema());
    onnx::RegisterSchema(GridSampleGradSchema());
    onnx::RegisterSchema(SoftmaxGradSchema(
        "SoftmaxGrad", "dX = Y * (dY - sum(dY * Y, axis)); see docs/ops.md."));
    onnx::RegisterSchema(SoftmaxGradSchema(
        "LogSoftmaxGrad", "dX = dY - exp(Y) * sum(dY, axis); see docs/ops.md."));
    onnx::RegisterSchema(NormGradSchema(false));
    onnx::RegisterSchema(NormGradSchema(true));
    onnx::RegisterSchema(GeluGradSchema());
    onnx::RegisterSchema(SwiGluSchema());
    onnx::RegisterSchema(SwiGluGradSchema());
    onnx::RegisterSchema(RotarySchema(false));
    onnx::RegisterSchema(RotarySchema(true));
    onnx::RegisterSchema(AttentionSchema());
    onnx::RegisterSchema(AttentionGradSchema());
    onnx::RegisterSchema(SkipNormSchema(false));
    onnx::RegisterSchema(SkipNormSchema(true));
    onnx::RegisterSchema(MultiTensorAdamWSchema());
    onnx::RegisterSchema(InPlaceAccumulatorSchema());
    onnx::RegisterSchema(SquaredNormSchema());
    onnx::RegisterSchema(IsAllFiniteSchema());
    onnx::RegisterSchema(AdamWSchema());
    onnx::RegisterSchema(SGDSchema());
    onnx::RegisterSchema(CollectiveSchema("AllReduce", "Every member gets the reduction of all members' inputs.", true, false));
    onnx::RegisterSchema(CollectiveSchema("AllGather", "Concatenates every member's input along `axis`, in group order.", false, true));
    onnx::RegisterSchema(CollectiveSchema("ReduceScatter", "Reduces the inputs and keeps this member's slice of `axis`.", true, true));
    onnx::RegisterSchema(CollectiveSchema("AllToAll", "Chunk j of the flat input goes to member j; chunk i of the output comes from member i.", false, false));
    onnx::RegisterSchema(SendSchema());
    onnx::RegisterSchema(RecvSchema());
  });
}

absl::Status CheckModel(const graph::Graph& g) {
  RegisterCleaveSchemas();
  auto bytes = SerializeModel(g);
  if (!bytes.ok()) return bytes.status();
  onnx::ModelProto m;
  if (!m.ParseFromString(*bytes)) return absl::InternalError("cannot reparse the serialised model");
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("ONNX checker: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace cleave::onnx_ext
