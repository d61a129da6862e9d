// CPU kernels for the signal ops (providers/cpu/): DFT (17, 20), STFT (17) and
// MelWeightMatrix (17). The transforms sum each line directly against a table of the n-th roots
// of unity, in double: O(n * bins) per line, exact for any length (no power-of-two FFT).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "base/status.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

void Put(TensorView& t, int64_t i, double v) {
  if (t.dtype == DataType::kFloat64) t.as<double>()[i] = v;
  else t.as<float>()[i] = static_cast<float>(v);
}

// cos and sin of 2 pi j / n for j < n.
struct Roots {
  explicit Roots(int64_t n) : cos(static_cast<size_t>(n)), sin(static_cast<size_t>(n)) {
    for (int64_t j = 0; j < n; ++j) {
      const double a = 2 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
      cos[static_cast<size_t>(j)] = std::cos(a);
      sin[static_cast<size_t>(j)] = std::sin(a);
    }
  }
  std::vector<double> cos, sin;
};

// bins [0, out) of the length-n transform of the line (re, im) of `len` samples (zero past
// them, those past n dropped): X[k] = sum_t x[t] e^(-+2 pi i k t / n), the inverse divided by n.
void Transform(const Roots& w, int64_t n, bool inverse, const std::vector<double>& re, const std::vector<double>& im,
               int64_t out, std::vector<double>& yre, std::vector<double>& yim) {
  const int64_t len = std::min<int64_t>(static_cast<int64_t>(re.size()), n);
  const double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / static_cast<double>(n) : 1.0;
  for (int64_t k = 0; k < out; ++k) {
    double sr = 0, si = 0;
    for (int64_t t = 0, j = 0; t < len; ++t, j = (j + k) % n) {
      const double c = w.cos[static_cast<size_t>(j)], s = sign * w.sin[static_cast<size_t>(j)];
      sr += re[static_cast<size_t>(t)] * c - im[static_cast<size_t>(t)] * s;
      si += re[static_cast<size_t>(t)] * s + im[static_cast<size_t>(t)] * c;
    }
    yre[static_cast<size_t>(k)] = sr * scale;
    yim[static_cast<size_t>(k)] = si * scale;
  }
}

// Transforms `lines` lines of `len` samples in parallel: sample(line, t, &re, &im) reads a line's
// sample t; the first `bins` bins of its length-n transform go to y, bin k's real part at
// offset(line, k) and its imaginary part after it.
template <typename Sample, typename Offset>
void TransformLines(ThreadPool* pool, int64_t lines, int64_t len, int64_t n, bool inverse, int64_t bins,
                    TensorView& y, Sample sample, Offset offset) {
  const Roots w(n);
  ParallelFor(pool, lines, 1, [&](int64_t l0, int64_t l1) {
    std::vector<double> re(static_cast<size_t>(len)), im(re), yre(static_cast<size_t>(bins)), yim(yre);
    for (int64_t line = l0; line < l1; ++line) {
      for (int64_t t = 0; t < len; ++t) sample(line, t, &re[static_cast<size_t>(t)], &im[static_cast<size_t>(t)]);
      Transform(w, n, inverse, re, im, bins, yre, yim);
      for (int64_t k = 0; k < bins; ++k) {
        Put(y, offset(line, k), yre[static_cast<size_t>(k)]);
        Put(y, offset(line, k) + 1, yim[static_cast<size_t>(k)]);
      }
    }
  });
}

// A one-element integer input (host), or `fallback` when it is absent or empty.
absl::StatusOr<int64_t> ScalarInput(const KernelContext& ctx, int i, int64_t fallback, const char* what) {
  const TensorView* t = ctx.num_inputs() > i ? ctx.input(i) : nullptr;
  if (!t || t->numel() == 0) return fallback;
  if (t->numel() != 1) return InvalidArgument("expected a scalar ", what, ", got ", DimsToString(t->dim_span()));
  return IntAt(*t, 0);
}

// DFT(input [..., n, ..., 1 | 2][, dft_length][, axis (version 20)]) {axis (17), inverse, onesided}.
class DftKernel : public OpKernel {
 public:
  DftKernel(const graph::Node& n, int version)
      : axis_attr_(version < 20 ? n.AttrInt("axis", 1) : -2), axis_input_(version >= 20),
        inverse_(n.AttrInt("inverse", 0) != 0), onesided_(n.AttrInt("onesided", 0) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const int rank = x.rank;
    if (rank < 2 || (x.dims[rank - 1] != 1 && x.dims[rank - 1] != 2))
      return InvalidArgument("expected input [..., signal, 1 or 2], got ", DimsToString(x.dim_span()));
    int64_t axis = axis_attr_;
    if (axis_input_) {
      ASSIGN_OR_RETURN(axis, ScalarInput(ctx, 2, axis_attr_, "axis"));
    }
    if (axis < -rank || axis >= rank - 1 || axis == -1)
      return InvalidArgument("axis ", axis, " is not a signal dim of input ", DimsToString(x.dim_span()),
                             " (the last dim holds the real and imaginary parts)");
    if (axis < 0) axis += rank;
    const int64_t len = x.dims[axis];
    ASSIGN_OR_RETURN(const int64_t n, ScalarInput(ctx, 1, len, "dft_length"));
    if (n < 1) return InvalidArgument("dft_length is ", n, "; expected >= 1");
    const int64_t bins = onesided_ ? n / 2 + 1 : n;
    std::vector<int64_t> dims(x.dims, x.dims + rank);
    dims[static_cast<size_t>(axis)] = bins;
    dims.back() = 2;
    TensorView* y = ctx.Output(0, dims);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const int64_t parts = x.dims[rank - 1];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.dims[d];
    for (int d = static_cast<int>(axis) + 1; d < rank - 1; ++d) inner *= x.dims[d];
    TransformLines(ctx.thread_pool(), outer * inner, len, n, inverse_, bins, *y,
                   [&](int64_t line, int64_t t, double* re, double* im) {
                     const int64_t at = ((line / inner * len + t) * inner + line % inner) * parts;
                     *re = ElementAsDouble(x, at);
                     *im = parts == 2 ? ElementAsDouble(x, at + 1) : 0.0;
                   },
                   [&](int64_t line, int64_t k) { return ((line / inner * bins + k) * inner + line % inner) * 2; });
    return absl::OkStatus();
  }

 private:
  int64_t axis_attr_;
  bool axis_input_, inverse_, onesided_;
};

// STFT(signal [batch, len, 1 | 2], frame_step[, window [frame]][, frame_length]) {onesided} ->
// [batch, frames, bins, 2]: frame f is the signal from f * frame_step, times the window, then
// its DFT of frame_length points.
class StftKernel : public OpKernel {
 public:
  StftKernel(const graph::Node& n, int) : onesided_(n.AttrInt("onesided", 1) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank != 3 || (x.dims[2] != 1 && x.dims[2] != 2))
      return InvalidArgument("expected signal [batch, length, 1 or 2], got ", DimsToString(x.dim_span()));
    const TensorView* window = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (window && window->numel() == 0) window = nullptr;
    ASSIGN_OR_RETURN(const int64_t step, ScalarInput(ctx, 1, 0, "frame_step"));
    ASSIGN_OR_RETURN(const int64_t frame, ScalarInput(ctx, 3, window ? window->numel() : x.dims[1], "frame_length"));
    if (step < 1) return InvalidArgument("frame_step is ", step, "; expected >= 1");
    if (frame < 1 || frame > x.dims[1])
      return InvalidArgument("frame_length is ", frame, "; expected 1 to the signal's ", x.dims[1], " samples");
    if (window && (window->rank != 1 || window->numel() != frame))
      return InvalidArgument("window is ", DimsToString(window->dim_span()), "; expected [", frame, "] (frame_length)");
    if (window && window->dtype != x.dtype)
      return InvalidArgument("window is ", DataTypeName(window->dtype), "; expected the signal's ", DataTypeName(x.dtype));
    const int64_t batch = x.dims[0], len = x.dims[1], parts = x.dims[2];
    const int64_t frames = (len - frame) / step + 1, bins = onesided_ ? frame / 2 + 1 : frame;
    TensorView* y = ctx.Output(0, {batch, frames, bins, 2});
    if (!y || y->numel() == 0) return absl::OkStatus();
    TransformLines(ctx.thread_pool(), batch * frames, frame, frame, false, bins, *y,
                   [&](int64_t line, int64_t t, double* re, double* im) {
                     const int64_t at = (line / frames * len + line % frames * step + t) * parts;
                     const double g = window ? ElementAsDouble(*window, t) : 1.0;
                     *re = g * ElementAsDouble(x, at);
                     *im = parts == 2 ? g * ElementAsDouble(x, at + 1) : 0.0;
                   },
                   [&](int64_t line, int64_t k) { return (line * bins + k) * 2; });
    return absl::OkStatus();
  }

 private:
  bool onesided_;
};

// MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz)
// -> [dft_length / 2 + 1, num_mel_bins]: triangular filters between mel-spaced edges, as the
// ONNX definition places them (mel = 2595 log10(1 + hz / 700); edges at floor((dft_length + 1)
// * hz / sample_rate)).
class MelWeightMatrixKernel : public OpKernel {
 public:
  MelWeightMatrixKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(const int64_t mels, ScalarInput(ctx, 0, 0, "num_mel_bins"));
    ASSIGN_OR_RETURN(const int64_t dft, ScalarInput(ctx, 1, 0, "dft_length"));
    ASSIGN_OR_RETURN(const int64_t rate, ScalarInput(ctx, 2, 0, "sample_rate"));
    for (int i = 3; i < 5; ++i)
      if (ctx.input(i)->numel() != 1) return InvalidArgument("expected scalar edge frequencies");
    const double lo = ElementAsDouble(*ctx.input(3), 0), hi = ElementAsDouble(*ctx.input(4), 0);
    if (mels < 1 || dft < 1 || rate < 1)
      return InvalidArgument("num_mel_bins ", mels, ", dft_length ", dft, " and sample_rate ", rate,
                             " must each be >= 1");
    if (!(lo >= 0 && hi > lo)) return InvalidArgument("edge frequencies ", lo, " and ", hi, "; expected 0 <= lower < upper");
    const int64_t bins = dft / 2 + 1;
    TensorView* y = ctx.Output(0, {bins, mels});
    if (!y) return absl::OkStatus();
    std::vector<double> w(static_cast<size_t>(bins * mels), 0.0);
    auto mel = [](double hz) { return 2595 * std::log10(1 + hz / 700); };
    const double low = mel(lo), step = (mel(hi) - low) / static_cast<double>(mels + 2);
    std::vector<int64_t> edge(static_cast<size_t>(mels) + 2);
    for (int64_t i = 0; i < mels + 2; ++i) {
      const double hz = 700 * (std::pow(10.0, (static_cast<double>(i) * step + low) / 2595) - 1);
      edge[static_cast<size_t>(i)] = static_cast<int64_t>(std::floor(static_cast<double>(dft + 1) * hz / static_cast<double>(rate)));
    }
    auto set = [&](int64_t j, int64_t i, double v) -> absl::Status {
      if (j < 0 || j >= bins)
        return InvalidArgument("mel bin ", i, " reaches frequency bin ", j, ", past the ", bins,
                               " bins (upper_edge_hertz above sample_rate / 2?)");
      w[static_cast<size_t>(j * mels + i)] = v;
      return absl::OkStatus();
    };
    for (int64_t i = 0; i < mels; ++i) {
      const int64_t left = edge[static_cast<size_t>(i)], centre = edge[static_cast<size_t>(i) + 1],
                    right = edge[static_cast<size_t>(i) + 2];
      if (centre == left) {
        RETURN_IF_ERROR(set(centre, i, 1.0));
      } else {
        for (int64_t j = left; j <= centre; ++j)
          RETURN_IF_ERROR(set(j, i, static_cast<double>(j - left) / static_cast<double>(centre - left)));
      }
      for (int64_t j = centre; j < right; ++j)
        RETURN_IF_ERROR(set(j, i, static_cast<double>(right - j) / static_cast<double>(right - centre)));
    }
    for (int64_t k = 0; k < y->numel(); ++k) Put(*y, k, w[static_cast<size_t>(k)]);
    return absl::OkStatus();
  }
};

}  // namespace

void RegisterSpectralKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  auto out_float = [](const graph::Node& n, int) -> std::string {
    const DataType t = n.output(0)->dtype();
    return t == DataType::kFloat32 || t == DataType::kFloat64 ? "" : "an output of another type than float32 or float64";
  };
  r.Register({"", "DFT", 17, 1 << 30, InputTypeIn(0, floats), MakeFactory<DftKernel>()});
  r.Register({"", "STFT", 17, 1 << 30, InputTypeIn(0, floats), MakeFactory<StftKernel>()});
  r.Register({"", "MelWeightMatrix", 17, 1 << 30, out_float, MakeFactory<MelWeightMatrixKernel>()});
}

}  // namespace cleave::providers
