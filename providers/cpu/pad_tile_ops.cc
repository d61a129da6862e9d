// CPU kernels for Pad and Tile (providers/cpu/). Both write each output row (the last dim) from
// one input row found by mapping the output's leading coordinates back to the input's.
// Pad: modes constant (a negative pad crops), reflect (about the edge, not repeating it), edge
// and wrap; `axes` (version 18) names the padded dims. Tile: the input repeated along each dim.
#include <cstring>
#include <memory>
#include <string>

#include "base/status.h"
#include "providers/axis.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

// The input coordinate that output coordinate o (of a dim padded by `before`) reads, or -1 for
// the constant (outside the input in constant mode). len > 0.
int64_t SourceCoord(int64_t o, int64_t before, int64_t len, PadMode mode) {
  int64_t i = o - before;
  if (i >= 0 && i < len) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : len - 1;
    case PadMode::kWrap: return ((i % len) + len) % len;
    case PadMode::kReflect: {
      if (len == 1) return 0;
      const int64_t period = 2 * (len - 1);
      int64_t m = ((i % period) + period) % period;
      return m < len ? m : period - m;
    }
  }
  return -1;
}

class PadKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int version) {
    const std::string m = n.AttrString("mode", "constant");
    PadMode mode;
    if (m == "constant") mode = PadMode::kConstant;
    else if (m == "reflect") mode = PadMode::kReflect;
    else if (m == "edge") mode = PadMode::kEdge;
    else if (m == "wrap" && version >= 19) mode = PadMode::kWrap;
    else return InvalidArgument(n.Describe(), ": expected mode constant, reflect, edge", version >= 19 ? " or wrap" : "",
                                ", got '", m, "'");
    return std::unique_ptr<OpKernel>(new PadKernel(mode));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& pads_in = *ctx.input(1);
    const TensorView* value = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    const TensorView* axes_in = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    const int r = x.rank;
    // The dims padded: `axes` (negative ones from the end), or all.
    int axes[kMaxRank];
    int naxes = r;
    for (int k = 0; k < r; ++k) axes[k] = k;
    if (axes_in) {
      naxes = static_cast<int>(axes_in->numel());
      if (naxes > r) return InvalidArgument("expected at most ", r, " axes, got ", naxes);
      bool seen[kMaxRank] = {};
      for (int j = 0; j < naxes; ++j) {
        ASSIGN_OR_RETURN(const int a, ResolveAxis(IntAt(*axes_in, j), r));
        if (seen[a]) return InvalidArgument("axis ", a, " appears more than once");
        seen[a] = true;
        axes[j] = a;
      }
    }
    if (pads_in.numel() != 2 * naxes)
      return InvalidArgument("expected ", 2 * naxes, " pads (begins then ends of ", naxes, " dims), got ", pads_in.numel());
    int64_t before[kMaxRank] = {}, after[kMaxRank] = {};
    for (int j = 0; j < naxes; ++j) {
      before[axes[j]] = IntAt(pads_in, j);
      after[axes[j]] = IntAt(pads_in, naxes + j);
    }
    DimVector out;
    for (int k = 0; k < r; ++k) {
      int64_t d = 0;
      if (__builtin_add_overflow(x.dims[k], before[k], &d) || __builtin_add_overflow(d, after[k], &d))
        return InvalidArgument("pads ", before[k], " and ", after[k], " of dim ", k, " overflow int64");
      if (d < 0)
        return InvalidArgument("pads ", before[k], " and ", after[k], " crop dim ", k, " of ", x.dims[k], " below 0");
      if (mode_ != PadMode::kConstant && (before[k] < 0 || after[k] < 0))
        return InvalidArgument("negative pads crop only in constant mode");
      if (mode_ != PadMode::kConstant && x.dims[k] == 0 && d > 0)
        return InvalidArgument("dim ", k, " is empty: nothing to pad it with in this mode");
      out.push_back(d);
    }
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const size_t es = ElementSize(x.dtype);
    if (r == 0) {  // a scalar has nothing to pad
      std::memcpy(y->data, x.data, es);
      return absl::OkStatus();
    }
    // The constant, as bytes of x's type (0 when absent).
    char fill[16] = {};
    if (value && value->numel() > 0) {
      if (value->dtype != x.dtype)
        return InvalidArgument("expected a constant_value of the data's dtype ", DataTypeName(x.dtype), ", got ",
                               DataTypeName(value->dtype));
      std::memcpy(fill, value->data, es);
    }
    const int64_t cols = out[r - 1], rows = y->numel() / cols;
    int64_t in_stride[kMaxRank];
    int64_t s = 1;
    for (int k = r - 1; k >= 0; --k) {
      in_stride[k] = s;
      s *= x.dims[k];
    }
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        // The row's input offset over the leading dims, or -1 when it lies in the constant.
        int64_t rem = row, offset = 0;
        for (int k = r - 2; k >= 0 && offset >= 0; --k) {
          const int64_t o = rem % out[k];
          rem /= out[k];
          const int64_t i = SourceCoord(o, before[k], x.dims[k], mode_);
          offset = i < 0 ? -1 : offset + i * in_stride[k];
        }
        char* yr = dst + row * cols * es;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = offset < 0 ? -1 : SourceCoord(c, before[r - 1], x.dims[r - 1], mode_);
          std::memcpy(yr + c * es, i < 0 ? fill : src + (offset + i) * es, es);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit PadKernel(PadMode mode) : mode_(mode) {}
  PadMode mode_;
};

class TileKernel : public OpKernel {
 public:
  TileKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& rep = *ctx.input(1);
    const int r = x.rank;
    if (rep.numel() != r) return InvalidArgument("expected ", r, " repeats (one per dim), got ", rep.numel());
    if (r == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
    DimVector out;
    for (int k = 0; k < r; ++k) {
      const int64_t n = IntAt(rep, k);
      if (n < 0) return InvalidArgument("repeat ", n, " of dim ", k, " is negative");
      int64_t d = 0;
      if (__builtin_mul_overflow(x.dims[k], n, &d))
        return InvalidArgument("repeat ", n, " of dim ", k, " (", x.dims[k], ") overflows int64");
      out.push_back(d);
    }
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const size_t es = ElementSize(x.dtype);
    const int64_t in_cols = x.dims[r - 1], cols = out[r - 1], rows = y->numel() / cols;
    const size_t row_bytes = static_cast<size_t>(in_cols) * es;
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        int64_t rem = row, in_row = 0, scale = 1;
        for (int k = r - 2; k >= 0; --k) {
          in_row += (rem % out[k]) % x.dims[k] * scale;
          rem /= out[k];
          scale *= x.dims[k];
        }
        char* yr = dst + row * cols * es;
        for (int64_t c = 0; c < cols; c += in_cols) std::memcpy(yr + c * es, src + in_row * row_bytes, row_bytes);
      }
    });
    return absl::OkStatus();
  }
};

}  // namespace

void RegisterPadTileKernels(KernelRegistry& r) {
  const SupportsFn int64_arg = InputTypeIn(1, {DataType::kInt64});
  r.Register({"", "Pad", 11, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int64_arg}),
              MakeCheckedFactory<PadKernel>()});
  r.Register({"", "Tile", 6, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int64_arg}),
              MakeFactory<TileKernel>()});
}

}  // namespace cleave::providers
