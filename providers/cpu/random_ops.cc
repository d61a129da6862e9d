// CPU kernels for the random ops (providers/cpu/): RandomNormal, RandomUniform, their Like forms
// and Bernoulli draw element by element from Philox4x32-10 (kernels/random_draw.h) under the
// run's key (providers/random_key.h), in double, then stored in the output's type; Multinomial
// samples each row's classes by the inverse of its cumulative softmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/status.h"
#include "kernels/random_draw.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/random_key.h"

namespace cleave::providers {

namespace {

using kernels::RandomKind;

// Stores v at element i of t, in t's type (a float type, an integer type, or bool).
void StoreAt(TensorView& t, int64_t i, double v) {
  switch (t.dtype) {
    case DataType::kFloat32: t.as<float>()[i] = static_cast<float>(v); break;
    case DataType::kFloat64: t.as<double>()[i] = v; break;
    case DataType::kFloat16: t.as<uint16_t>()[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: t.as<uint16_t>()[i] = FloatToBFloat16(static_cast<float>(v)); break;
    case DataType::kBool: t.as<bool>()[i] = v != 0; break;
    case DataType::kInt8: t.as<int8_t>()[i] = static_cast<int8_t>(v); break;
    case DataType::kInt16: t.as<int16_t>()[i] = static_cast<int16_t>(v); break;
    case DataType::kInt32: t.as<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: t.as<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt8: t.as<uint8_t>()[i] = static_cast<uint8_t>(v); break;
    case DataType::kUInt16: t.as<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DataType::kUInt32: t.as<uint32_t>()[i] = static_cast<uint32_t>(v); break;
    case DataType::kUInt64: t.as<uint64_t>()[i] = static_cast<uint64_t>(v); break;
    default: break;
  }
}

// RandomNormal {mean, scale, shape}, RandomUniform {low, high, shape}, RandomNormalLike and
// RandomUniformLike (the input's shape), Bernoulli (the input's probabilities).
class RandomKernel : public OpKernel {
 public:
  RandomKernel(const graph::Node& n, int) : spec_(n), keys_(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = spec_.like ? ctx.input(0) : nullptr;
    TensorView* y = spec_.like ? ctx.Output(0, x->dim_span()) : ctx.Output(0, spec_.shape);
    if (!y) return absl::OkStatus();
    const uint64_t key = keys_.Next(ctx);
    ParallelFor(ctx.thread_pool(), y->numel(), 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double p = spec_.kind == RandomKind::kBernoulli ? ElementAsDouble(*x, i) : 0.0;
        StoreAt(*y, i, kernels::RandomDrawAt(spec_.kind, key, i, spec_.a, spec_.b, p));
      }
    });
    return absl::OkStatus();
  }

 private:
  RandomSpec spec_;
  RandomKeys keys_;
};

// Multinomial(input [batch, classes] of unnormalised log-probabilities) {sample_size} -> [batch,
// sample_size] class indices: sample s of row b takes the first class whose cumulative
// probability exceeds uniform b * sample_size + s.
class MultinomialKernel : public OpKernel {
 public:
  MultinomialKernel(const graph::Node& n, int) : keys_(n), samples_(n.AttrInt("sample_size", 1)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank != 2) return InvalidArgument("expected input [batch, classes], got ", DimsToString(x.dim_span()));
    const int64_t batch = x.dims[0], classes = x.dims[1];
    TensorView* y = ctx.Output(0, {batch, samples_});
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (classes == 0) return InvalidArgument("cannot sample from 0 classes");
    const uint64_t key = keys_.Next(ctx);
    std::vector<double> cumulative(static_cast<size_t>(classes));
    for (int64_t b = 0; b < batch; ++b) {
      double top = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) top = std::max(top, ElementAsDouble(x, b * classes + c));
      double total = 0;
      for (int64_t c = 0; c < classes; ++c) {
        total += std::exp(ElementAsDouble(x, b * classes + c) - top);
        cumulative[static_cast<size_t>(c)] = total;
      }
      if (!(total > 0) || !std::isfinite(total))
        return InvalidArgument("row ", b, " of the log-probabilities holds no finite class to sample");
      for (int64_t s = 0; s < samples_; ++s) {
        const double u = kernels::RandomUniformAt(key, b * samples_ + s) * total;
        const int64_t c = std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin();
        StoreAt(*y, b * samples_ + s, static_cast<double>(std::min(c, classes - 1)));
      }
    }
    return absl::OkStatus();
  }

 private:
  RandomKeys keys_;
  int64_t samples_;
};

}  // namespace

void RegisterRandomKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                        DataType::kBFloat16};
  auto any = [](const graph::Node&, int) -> std::string { return ""; };
  for (const char* op : {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"})
    r.Register({"", op, 1, 1 << 30, any, MakeFactory<RandomKernel>()});
  r.Register({"", "Bernoulli", 15, 1 << 30, InputTypeIn(0, floats), MakeFactory<RandomKernel>()});
  r.Register({"", "Multinomial", 7, 1 << 30, InputTypeIn(0, floats), MakeFactory<MultinomialKernel>()});
}

}  // namespace cleave::providers
