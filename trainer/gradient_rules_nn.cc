// Gradient rules for Gemm, LayerNormalization, RMSNormalization, Dropout, Trilu, Concat,
// Split, Gather, Slice, SoftmaxCrossEntropyLoss and ai.cleave.Attention (trainer/). The two
// normalisations and the last four emit ai.cleave gradient ops.
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "trainer/gradient_rules.h"

namespace cleave::trainer {

namespace {

using graph::Attribute;
using graph::Value;

// Y = alpha op(A) op(B) + beta C: d op(A) = alpha dY op(B)^T, d op(B) = alpha op(A)^T dY,
// each transposed back when the input was given transposed; dC = beta dY summed to C.
absl::Status GemmGrad(GradBuilder& b) {
  const bool ta = b.fwd().AttrInt("transA", 0) != 0, tb = b.fwd().AttrInt("transB", 0) != 0;
  Attribute alpha = Attribute::Float(b.fwd().AttrFloat("alpha", 1.f));
  auto flag = [](bool v) { return Attribute::Int(v ? 1 : 0); };
  // dY op(B)^T is Gemm(dY, B) with B's transpose flag flipped; likewise for A.
  Value* dopa = b.Op("Gemm", {b.dy(), b.x(1)}, {{"transB", flag(!tb)}, {"alpha", alpha}});
  Value* dopb = b.Op("Gemm", {b.x(0), b.dy()}, {{"transA", flag(!ta)}, {"alpha", alpha}});
  auto t2 = [&](Value* v) { return b.Op("Transpose", {v}, {{"perm", Attribute::Ints({1, 0})}}); };
  b.SetGrad(0, ta ? t2(dopa) : dopa);
  b.SetGrad(1, tb ? t2(dopb) : dopb);
  if (b.x(2)) {
    Value* scaled = b.Op("Mul", {b.dy(), b.Const(b.fwd().AttrFloat("beta", 1.f), b.dy())});
    ASSIGN_OR_RETURN(Value * dc, b.ReduceTo(scaled, b.x(2)));
    b.SetGrad(2, dc);
  }
  return absl::OkStatus();
}

// LayerNormalization, by ai.cleave.LayerNormalizationGrad from the forward's saved Mean and
// InvStdDev (the rule makes the forward output them). With xhat = (x - mean) rstd over the
// normalised axes and g = dy scale: dx = rstd (g - mean(g) - xhat mean(g xhat)),
// dscale = sum dy xhat, dbias = sum dy. The op's dBias has scale's shape; a bias of another
// (broadcast) shape gets sum dy over its own broadcast axes instead.
absl::Status LayerNormGrad(GradBuilder& b) {
  Value* x = b.x(0);
  // ONNX computes the statistics in the stash type (float32 by default). The CPU kernel
  // computes them in double, so for a float64 X that did not choose a stash type, stashing
  // float64 makes the saved statistics exactly the ones the forward normalised with. Only
  // done when this rule adds the outputs, so nothing else sees the change.
  if (!b.y(1) && !b.y(2) && x->dtype() == DataType::kFloat64 && !b.fwd().HasAttr("stash_type"))
    b.fwd().SetAttr("stash_type", Attribute::Int(static_cast<int64_t>(DataType::kFloat64)));
  Value* mean = b.ForwardOutput(1, "mean");
  Value* inv_std = b.ForwardOutput(2, "inv_std_dev");
  Value* bias = b.x(2);
  const bool bias_like_scale = bias && bias->shape() == b.x(1)->shape();
  std::vector<Value*> d = b.OpN("ai.cleave.LayerNormalizationGrad", {b.dy(), x, b.x(1), mean, inv_std},
                                bias_like_scale ? 3 : 2,
                                {{"axis", Attribute::Int(b.fwd().AttrInt("axis", -1))}});
  b.SetGrad(0, d[0]);
  b.SetGrad(1, d[1]);
  if (bias) {
    Value* dbias = bias_like_scale ? d[2] : nullptr;
    if (!dbias) {
      ASSIGN_OR_RETURN(dbias, b.ReduceTo(b.dy(), bias));
    }
    b.SetGrad(2, dbias);
  }
  return absl::OkStatus();
}

// ai.cleave.RMSNormalization, by ai.cleave.RMSNormalizationGrad from the forward's saved
// InvStdDev: with xhat = x rstd and g = dy scale, dx = rstd (g - xhat mean(g xhat)) and
// dscale = sum dy xhat.
absl::Status RMSNormGrad(GradBuilder& b) {
  Value* x = b.x(0);
  // As for LayerNormalization: a float64 X without a stash type saves float64 statistics.
  if (!b.y(1) && x->dtype() == DataType::kFloat64 && !b.fwd().HasAttr("stash_type"))
    b.fwd().SetAttr("stash_type", Attribute::Int(static_cast<int64_t>(DataType::kFloat64)));
  Value* inv_std = b.ForwardOutput(1, "inv_std_dev");
  std::vector<Value*> d = b.OpN("ai.cleave.RMSNormalizationGrad", {b.dy(), x, b.x(1), inv_std}, 2,
                                {{"axis", Attribute::Int(b.fwd().AttrInt("axis", -1))}});
  b.SetGrad(0, d[0]);
  b.SetGrad(1, d[1]);
  return absl::OkStatus();
}

// Dropout: the identity at inference; in training dx = dy mask / (1 - ratio), read from the
// mask output, which the forward node must produce.
absl::Status DropoutGrad(GradBuilder& b) {
  const Value* mode = b.x(2);
  bool training = mode != nullptr;
  if (mode && mode->initializer()) training = mode->initializer()->IntAt(0) != 0;
  if (b.fwd_version() < 12 || !training) {
    b.SetGrad(0, b.dy());
    return absl::OkStatus();
  }
  const Value* ratio = b.x(1);
  double p = 0.5;
  if (ratio) {
    if (!ratio->initializer()) return b.Error("the gradient of Dropout needs a constant ratio");
    p = ratio->initializer()->DoubleAt(0);
  }
  if (!b.y(1)) return b.Error("the gradient of Dropout in training mode needs its mask output");
  Value* mask = b.Op("Cast", {b.y(1)}, {{"to", Attribute::Int(static_cast<int64_t>(b.dy()->dtype()))}});
  b.SetGrad(0, b.Op("Mul", {b.Op("Mul", {b.dy(), mask}), b.Const(1.0 / (1.0 - p), b.dy())}));
  return absl::OkStatus();
}

absl::Status TriluGrad(GradBuilder& b) {  // the same triangle of dy
  std::vector<Value*> ins = {b.dy()};
  if (b.x(1)) ins.push_back(b.x(1));
  b.SetGrad(0, b.Op("Trilu", ins, {{"upper", Attribute::Int(b.fwd().AttrInt("upper", 1))}}));
  return absl::OkStatus();
}

// Concat: dy split back into the inputs' extents along the axis.
absl::Status ConcatGrad(GradBuilder& b) {
  const int r = b.y(0)->shape().rank();
  int64_t axis = b.fwd().AttrInt("axis", 0);
  if (axis < 0) axis += r;
  std::vector<int64_t> sizes;
  for (int i = 0; i < b.fwd().num_inputs(); ++i) {
    const Shape& s = b.x(i)->shape();
    if (!s.has_rank() || !s[static_cast<int>(axis)].is_static())
      return b.Error("the gradient of Concat needs static extents along the axis");
    sizes.push_back(s[static_cast<int>(axis)].value);
  }
  std::vector<std::pair<std::string, Attribute>> attrs = {{"axis", Attribute::Int(axis)}};
  std::vector<Value*> ins = {b.dy()};
  if (b.g_opset13()) ins.push_back(b.Ints(sizes));
  else attrs.emplace_back("split", Attribute::Ints(sizes));
  std::vector<Value*> parts = b.OpN("Split", ins, static_cast<int>(sizes.size()), attrs);
  for (size_t i = 0; i < parts.size(); ++i) b.SetGrad(static_cast<int>(i), parts[i]);
  return absl::OkStatus();
}

// Split: the outputs' gradients concatenated (zeros for outputs no gradient reached).
absl::Status SplitGrad(GradBuilder& b) {
  std::vector<Value*> parts;
  for (int i = 0; i < b.fwd().num_outputs(); ++i) {
    Value* d = b.dy(i);
    if (!d) {
      const Shape& s = b.y(i)->shape();
      if (!s.is_static()) return b.Error("the gradient of Split needs static output shapes");
      d = b.Zeros(b.y(i));
    }
    parts.push_back(d);
  }
  b.SetGrad(0, b.Op("Concat", parts, {{"axis", Attribute::Int(b.fwd().AttrInt("axis", 0))}}));
  return absl::OkStatus();
}

// Gather: dy scatter-added into zeros of x's shape along the axis (repeated indices, as in a
// tied embedding, accumulate); the indices get no gradient.
absl::Status GatherGrad(GradBuilder& b) {
  Value* shape = b.Op("Shape", {b.x(0)});
  b.SetGrad(0, b.Op("ai.cleave.GatherGrad", {shape, b.x(1), b.dy()},
                    {{"axis", Attribute::Int(b.fwd().AttrInt("axis", 0))}}));
  return absl::OkStatus();
}

// Slice: dy written into zeros of x's shape at the sliced positions. Version 1 takes its
// arguments as attributes; they become constants here.
absl::Status SliceGrad(GradBuilder& b) {
  std::vector<Value*> ins = {b.dy(), b.Op("Shape", {b.x(0)})};
  if (b.fwd_version() < 10) {
    ins.push_back(b.Ints(b.fwd().AttrInts("starts")));
    ins.push_back(b.Ints(b.fwd().AttrInts("ends")));
    if (b.fwd().HasAttr("axes")) ins.push_back(b.Ints(b.fwd().AttrInts("axes")));
  } else {
    for (int i = 1; i < b.fwd().num_inputs(); ++i) ins.push_back(b.x(i));  // omitted stay null
    while (ins.back() == nullptr) ins.pop_back();
  }
  b.SetGrad(0, b.Op("ai.cleave.SliceGrad", ins));
  return absl::OkStatus();
}

// SoftmaxCrossEntropyLoss: d loss / d scores = (softmax - onehot(label)) w[label] scaled as
// the reduction scales, computed by SoftmaxCrossEntropyLossGrad from the forward log_prob.
// A gradient that reaches log_prob directly adds the LogSoftmax gradient along the class
// axis, dlp - exp(lp) sum_c dlp (LogSoftmaxGrad). Labels and weights get no gradient.
absl::Status SoftmaxCrossEntropyLossGrad(GradBuilder& b) {
  Value* lp = b.y(1);
  if (!lp)
    return b.Error("the gradient of SoftmaxCrossEntropyLoss needs the log_prob output: the "
                   "forward SoftmaxCrossEntropyLoss must output log_prob (the training-graph "
                   "builder adds it)");
  Value* dx = nullptr;
  if (b.dy(0)) {
    std::vector<Value*> ins = {b.dy(0), lp, b.x(1)};
    if (b.x(2)) ins.push_back(b.x(2));
    std::vector<std::pair<std::string, Attribute>> attrs = {
        {"reduction", Attribute::String(b.fwd().AttrString("reduction", "mean"))}};
    if (b.fwd().HasAttr("ignore_index"))
      attrs.emplace_back("ignore_index", Attribute::Int(b.fwd().AttrInt("ignore_index", 0)));
    dx = b.Op("ai.cleave.SoftmaxCrossEntropyLossGrad", ins, attrs);
  }
  if (Value* dlp = b.dy(1)) {
    Value* d = b.Op("ai.cleave.LogSoftmaxGrad", {dlp, lp}, {{"axis", Attribute::Int(1)}});
    dx = dx ? b.Op("Add", {dx, d}) : d;
  }
  b.SetGrad(0, dx);
  return absl::OkStatus();
}

// Conv: dX, dW and dB from dY by ai.cleave.ConvGrad (im2col products, as the forward's), with
// the forward's attributes; the outputs not wanted are left off.
// ConvTranspose likewise by ai.cleave.ConvTransposeGrad, which also carries output_padding and
// output_shape.
absl::Status ConvGrad(GradBuilder& b) {
  const bool transposed = b.fwd().op_type() == "ConvTranspose";
  std::vector<std::pair<std::string, Attribute>> attrs;
  for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", "output_padding",
                        "output_shape"})
    if (const Attribute* v = b.fwd().FindAttr(a)) attrs.emplace_back(a, *v);
  const bool bias = b.fwd().num_inputs() > 2 && b.x(2) && b.NeedsGrad(2);
  const int outputs = bias ? 3 : b.NeedsGrad(1) ? 2 : 1;
  std::vector<Value*> d = b.OpN(transposed ? "ai.cleave.ConvTransposeGrad" : "ai.cleave.ConvGrad",
                                {b.dy(), b.x(0), b.x(1)}, outputs, attrs);
  if (b.NeedsGrad(0)) b.SetGrad(0, d[0]);
  if (outputs > 1 && b.NeedsGrad(1)) b.SetGrad(1, d[1]);
  if (bias) b.SetGrad(2, d[2]);
  return absl::OkStatus();
}

// BatchNormalization by ai.cleave.BatchNormalizationGrad(dY, X, scale, input_mean, input_var)
// {epsilon, training_mode} -> dX, dScale, dB (those not wanted left off). In training mode dX
// goes through the batch's statistics, recomputed from X; input_mean and input_var (statistics,
// not weights) get no gradient, and the running statistics pass none back.
absl::Status BatchNormGrad(GradBuilder& b) {
  if (!b.dy()) return absl::OkStatus();
  const graph::Node& f = b.fwd();
  std::vector<std::pair<std::string, Attribute>> attrs = {
      {"epsilon", Attribute::Float(f.AttrFloat("epsilon", 1e-5f))},
      {"training_mode", Attribute::Int(f.AttrInt("training_mode", 0))}};
  const int outputs = b.NeedsGrad(2) ? 3 : b.NeedsGrad(1) ? 2 : 1;
  std::vector<Value*> d =
      b.OpN("ai.cleave.BatchNormalizationGrad", {b.dy(), b.x(0), b.x(1), b.x(3), b.x(4)}, outputs, attrs);
  for (int i = 0; i < outputs; ++i)
    if (b.NeedsGrad(i)) b.SetGrad(i, d[static_cast<size_t>(i)]);
  return absl::OkStatus();
}

// InstanceNormalization by ai.cleave.InstanceNormalizationGrad(dY, X, scale) {epsilon} -> dX,
// dScale, dB (those not wanted left off), the statistics recomputed from X.
absl::Status InstanceNormGrad(GradBuilder& b) {
  if (!b.dy()) return absl::OkStatus();
  const int outputs = b.NeedsGrad(2) ? 3 : b.NeedsGrad(1) ? 2 : 1;
  std::vector<Value*> d =
      b.OpN("ai.cleave.InstanceNormalizationGrad", {b.dy(), b.x(0), b.x(1)}, outputs,
            {{"epsilon", Attribute::Float(b.fwd().AttrFloat("epsilon", 1e-5f))}});
  for (int i = 0; i < outputs; ++i)
    if (b.NeedsGrad(i)) b.SetGrad(i, d[static_cast<size_t>(i)]);
  return absl::OkStatus();
}

// Resize by ai.cleave.ResizeGrad(dY, X's shape[, roi, scales, sizes]) with the forward's
// attributes: each output's gradient goes back to the input elements it sampled, times their
// weights (X's shape a constant where it is static, so X need not be kept). roi, scales and sizes
// get none.
absl::Status ResizeGrad(GradBuilder& b) {
  if (!b.dy()) return absl::OkStatus();
  std::vector<Value*> ins = {b.dy(), b.ShapeOf(b.x(0))};
  for (int i = 1; i <= 3; ++i) ins.push_back(b.fwd().num_inputs() > i ? b.x(i) : nullptr);
  while (!ins.back()) ins.pop_back();
  std::vector<std::pair<std::string, Attribute>> attrs;
  for (const auto& [name, value] : b.fwd().attributes()) attrs.emplace_back(name, value);
  b.SetGrad(0, b.Op("ai.cleave.ResizeGrad", ins, attrs));
  return absl::OkStatus();
}

// GridSample by ai.cleave.GridSampleGrad(dY, X, grid) with the forward's attributes -> dX (each
// output's gradient back to the elements it sampled, times their weights) and dGrid (the sampled
// value's slope along each coordinate; zero in nearest mode, as in PyTorch).
absl::Status GridSampleGrad(GradBuilder& b) {
  if (!b.dy()) return absl::OkStatus();
  std::vector<std::pair<std::string, Attribute>> attrs;
  for (const auto& [name, value] : b.fwd().attributes()) attrs.emplace_back(name, value);
  const int outputs = b.NeedsGrad(1) ? 2 : 1;
  std::vector<Value*> d = b.OpN("ai.cleave.GridSampleGrad", {b.dy(), b.x(0), b.x(1)}, outputs, attrs);
  if (b.NeedsGrad(0)) b.SetGrad(0, d[0]);
  if (outputs > 1) b.SetGrad(1, d[1]);
  return absl::OkStatus();
}

// MaxPool, AveragePool and the global pools, with the forward's attributes (and `global` for
// the global pools): ai.cleave.MaxPoolGrad(dY, X) gives each window's gradient to the tap it
// chose, found again from X; ai.cleave.AveragePoolGrad(dY, X's shape) spreads it over the taps
// its divisor counted, so X need not be kept (the shape a constant where it is static, which
// the partitioner makes each rank's own). MaxPool's Indices get no gradient.
absl::Status PoolGrad(GradBuilder& b) {
  if (!b.dy()) return absl::OkStatus();
  const std::string& op = b.fwd().op_type();
  std::vector<std::pair<std::string, Attribute>> attrs;
  for (const char* a : {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"})
    if (const Attribute* v = b.fwd().FindAttr(a)) attrs.emplace_back(a, *v);
  if (op.rfind("Global", 0) == 0) attrs.emplace_back("global", Attribute::Int(1));
  if (op == "MaxPool" || op == "GlobalMaxPool") b.SetGrad(0, b.Op("ai.cleave.MaxPoolGrad", {b.dy(), b.x(0)}, attrs));
  else b.SetGrad(0, b.Op("ai.cleave.AveragePoolGrad", {b.dy(), b.ShapeOf(b.x(0))}, attrs));
  return absl::OkStatus();
}

// NegativeLogLikelihoodLoss over log-probabilities: d loss / d input = -onehot(label)
// w[label] scaled as the reduction scales (ai.cleave.NegativeLogLikelihoodLossGrad). Labels
// and weights get no gradient.
absl::Status NegativeLogLikelihoodLossGrad(GradBuilder& b) {
  std::vector<Value*> ins = {b.dy(), b.x(0), b.x(1)};
  if (b.x(2)) ins.push_back(b.x(2));
  std::vector<std::pair<std::string, Attribute>> attrs = {
      {"reduction", Attribute::String(b.fwd().AttrString("reduction", "mean"))}};
  if (b.fwd().HasAttr("ignore_index"))
    attrs.emplace_back("ignore_index", Attribute::Int(b.fwd().AttrInt("ignore_index", 0)));
  b.SetGrad(0, b.Op("ai.cleave.NegativeLogLikelihoodLossGrad", ins, attrs));
  return absl::OkStatus();
}

// Attention, by ai.cleave.AttentionGrad: the probabilities are recomputed from q, k, the bias
// and the forward's saved log-sum-exp (the rule makes the forward output it) instead of being
// stored. A bias whose gradient is wanted (a learned position bias) gets the scores' gradient
// P * (dP - rowsum(dOut * out)), which AttentionGrad then also outputs (float32, the scores'
// full shape), summed over the axes the bias broadcasts along; a padding mask computed from
// the integer mask gets none, and the [T, S] gradient is never formed for it.
absl::Status AttentionGrad(GradBuilder& b) {
  Value* bias = b.fwd().num_inputs() > 3 ? b.x(3) : nullptr;
  const bool dbias = bias && b.NeedsGrad(3);
  Value* lse = b.ForwardOutput(1, "lse");
  std::vector<Value*> ins = {b.dy(), b.x(0), b.x(1), b.x(2), b.y(0), lse};
  if (bias) ins.push_back(bias);
  std::vector<Value*> d =
      b.OpN("ai.cleave.AttentionGrad", ins, dbias ? 4 : 3,
            {{"scale", Attribute::Float(b.fwd().AttrFloat("scale", 1.f))},
             {"causal", Attribute::Int(b.fwd().AttrInt("causal", 0))}});
  for (int i = 0; i < 3; ++i) b.SetGrad(i, d[i]);
  if (dbias) {
    ASSIGN_OR_RETURN(Value* g, b.ReduceTo(d[3], bias));
    if (bias->dtype() != DataType::kFloat32)
      g = b.Op("Cast", {g}, {{"to", Attribute::Int(static_cast<int64_t>(bias->dtype()))}});
    b.SetGrad(3, g);
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterNnRules(std::map<std::string, GradRule>& rules) {
  rules["ai.cleave::Attention"] = AttentionGrad;
  rules["::Gemm"] = GemmGrad;
  rules["::LayerNormalization"] = LayerNormGrad;
  rules["ai.cleave::LayerNormalization"] = LayerNormGrad;
  rules["ai.cleave::RMSNormalization"] = RMSNormGrad;
  rules["::Dropout"] = DropoutGrad;
  rules["::Trilu"] = TriluGrad;
  rules["::Concat"] = ConcatGrad;
  rules["::Split"] = SplitGrad;
  rules["::Gather"] = GatherGrad;
  rules["::Slice"] = SliceGrad;
  rules["::SoftmaxCrossEntropyLoss"] = SoftmaxCrossEntropyLossGrad;
  rules["::NegativeLogLikelihoodLoss"] = NegativeLogLikelihoodLossGrad;
  rules["::Conv"] = ConvGrad;
  rules["::ConvTranspose"] = ConvGrad;
  rules["::BatchNormalization"] = BatchNormGrad;
  rules["::InstanceNormalization"] = InstanceNormGrad;
  rules["::Resize"] = ResizeGrad;
  rules["::GridSample"] = GridSampleGrad;
  for (const char* op : {"::MaxPool", "::AveragePool", "::GlobalMaxPool", "::GlobalAveragePool"}) rules[op] = PoolGrad;
}

}  // namespace cleave::trainer
