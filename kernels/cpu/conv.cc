// Convolution on the CPU through im2col and GEMM (kernels/).
#include "kernels/cpu/conv.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/gemm.h"

namespace cleave::kernels::cpu {

namespace {

int64_t Product(const int64_t* d, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= d[i];
  return p;
}

// C = op(A) op(B) (+ C when accumulate), densely packed.
template <typename T>
void Gemm(int64_t M, int64_t N, int64_t K, bool ta, bool tb, const T* A, const T* B, T* C, bool accumulate,
          ThreadPool* pool) {
  GemmOf<T>({.M = M, .N = N, .K = K, .trans_a = ta, .trans_b = tb, .beta = accumulate ? 1.f : 0.f}, A, B, C, pool);
}

// For each column row r = (c, k) and output position o: the input offset (within one channel)
// that the patch element reads, or -1 in the padding. `visit(r, o, offset)` over all of them,
// rows split over the pool.
template <typename F>
void ForEachPatchElement(const ConvParams& p, int64_t rows, ThreadPool* pool, F visit) {
  const int64_t K = p.KernelSize(), O = p.OutSize();
  const int s = p.spatial;
  ParallelFor(pool, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(O, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t kidx[kMaxRank];
      for (int64_t rem = r % K, d = s - 1; d >= 0; --d) {
        kidx[d] = rem % p.kernel[d];
        rem /= p.kernel[d];
      }
      int64_t oidx[kMaxRank] = {};
      for (int64_t o = 0; o < O; ++o) {
        int64_t offset = 0;
        for (int d = 0; d < s && offset >= 0; ++d) {
          const int64_t i = oidx[d] * p.stride[d] - p.pad_begin[d] + kidx[d] * p.dilation[d];
          offset = (i < 0 || i >= p.in[d]) ? -1 : offset * p.in[d] + i;
        }
        visit(r, o, offset);
        for (int d = s - 1; d >= 0; --d) {
          if (++oidx[d] < p.out[d]) break;
          oidx[d] = 0;
        }
      }
    }
  });
}

// col[(c, k), o] = x[c, patch element] for channels [0, Cg) of `x` (one image, one group).
template <typename T>
void Im2Col(const ConvParams& p, const T* x, T* col, ThreadPool* pool) {
  const int64_t K = p.KernelSize(), O = p.OutSize(), I = p.InSize();
  const int64_t rows = p.C / p.group * K;
  ForEachPatchElement(p, rows, pool, [&](int64_t r, int64_t o, int64_t offset) {
    col[r * O + o] = offset < 0 ? T(0) : x[(r / K) * I + offset];
  });
}

// x[c, patch element] += col[(c, k), o]: rows of one channel share input elements, so the
// channels (not the rows) are what is split over the pool.
template <typename T>
void Col2ImAdd(const ConvParams& p, const T* col, T* x, ThreadPool* pool) {
  const int64_t K = p.KernelSize(), O = p.OutSize(), I = p.InSize();
  const int64_t channels = p.C / p.group;
  ParallelFor(pool, channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      ForEachPatchElement(p, K, nullptr, [&](int64_t r, int64_t o, int64_t offset) {
        if (offset >= 0) x[c * I + offset] += col[(c * K + r) * O + o];
      });
    }
  });
}

}  // namespace

int64_t ConvParams::InSize() const { return Product(in, spatial); }
int64_t ConvParams::KernelSize() const { return Product(kernel, spatial); }
int64_t ConvParams::OutSize() const { return Product(out, spatial); }
int64_t ConvParams::ColumnElements() const {
  int64_t n = C / group;
  for (int d = 0; d < spatial; ++d)
    if (__builtin_mul_overflow(n, kernel[d], &n) || __builtin_mul_overflow(n, out[d], &n)) return -1;
  return n;
}

namespace {

// Bounds that keep every size below in int64 (no real convolution comes near them).
constexpr int64_t kLimit = int64_t{1} << 31;

// What Conv and ConvTranspose check alike: X [N, C, spatial...] and W of X's rank whose dims 0
// and 1 fit X's channels (Conv: [M, C / group], ConvTranspose: [C, M / group]), the group, strides, dilations,
// kernel_shape, pads and auto_pad. Fills p's spatial, N, group, stride, dilation and kernel.
absl::Status PlanCommon(std::span<const int64_t> x, std::span<const int64_t> w, const ConvAttrs& a, bool transposed,
                        ConvParams& p) {
  const int r = static_cast<int>(x.size());
  if (r < 3) return InvalidArgument("expected X [N, C, spatial...] of rank >= 3, got [", absl::StrJoin(x, ","), "]");
  if (static_cast<int>(w.size()) != r)
    return InvalidArgument("expected W of X's rank ", r, ", got [", absl::StrJoin(w, ","), "]");
  p.spatial = r - 2;
  p.N = x[0];
  p.group = a.group;
  const int64_t c = x[1];
  if (p.group < 1 || c % p.group != 0)
    return InvalidArgument("group ", p.group, " must divide X's ", c, " channels");
  if (!transposed && w[0] % p.group != 0)
    return InvalidArgument("group ", p.group, " must divide W's ", w[0], " output channels");
  if (transposed && w[0] != c)
    return InvalidArgument("expected W's dim 0 to be X's ", c, " channels, got ", w[0]);
  if (!transposed && w[1] != c / p.group)
    return InvalidArgument("expected W's dim 1 to be C / group = ", c / p.group, ", got ", w[1]);
  const int s = p.spatial;
  auto list = [&](const std::vector<int64_t>& v, int64_t dflt, const char* name, int64_t* out) -> absl::Status {
    if (!v.empty() && static_cast<int>(v.size()) != s)
      return InvalidArgument("expected ", s, " ", name, ", got ", v.size());
    for (int d = 0; d < s; ++d) {
      out[d] = v.empty() ? dflt : v[d];
      if (out[d] < 1) return InvalidArgument(name, " must be >= 1, got ", out[d]);
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(list(a.strides, 1, "strides", p.stride));
  RETURN_IF_ERROR(list(a.dilations, 1, "dilations", p.dilation));
  for (int d = 0; d < s; ++d)
    if (p.stride[d] >= kLimit || p.dilation[d] >= kLimit || x[2 + d] >= kLimit || w[2 + d] >= kLimit)
      return InvalidArgument("strides, dilations and spatial dims must be below 2^31");
  for (int64_t v : a.pads)
    if (v >= kLimit) return InvalidArgument("pads must be below 2^31, got ", v);
  for (int d = 0; d < s; ++d) {
    p.kernel[d] = w[2 + d];
    if (!a.kernel_shape.empty() &&
        (static_cast<int>(a.kernel_shape.size()) != s || a.kernel_shape[d] != p.kernel[d]))
      return InvalidArgument("kernel_shape [", absl::StrJoin(a.kernel_shape, ","), "] does not match W's [",
                             absl::StrJoin(w.subspan(2), ","), "]");
  }
  if (!a.pads.empty() && static_cast<int>(a.pads.size()) != 2 * s)
    return InvalidArgument("expected ", 2 * s, " pads, got ", a.pads.size());
  if (a.auto_pad != "NOTSET" && a.auto_pad != "VALID" && a.auto_pad != "SAME_UPPER" && a.auto_pad != "SAME_LOWER")
    return InvalidArgument("expected auto_pad NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '", a.auto_pad, "'");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvParams> PlanConv(std::span<const int64_t> x, std::span<const int64_t> w, const ConvAttrs& a) {
  ConvParams p;
  RETURN_IF_ERROR(PlanCommon(x, w, a, /*transposed=*/false, p));
  p.C = x[1];
  p.M = w[0];
  const int s = p.spatial;
  for (int d = 0; d < s; ++d) p.in[d] = x[2 + d];
  for (int d = 0; d < s; ++d) {
    const int64_t span = p.dilation[d] * (p.kernel[d] - 1) + 1;
    int64_t begin = 0, end = 0;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t want = (p.in[d] + p.stride[d] - 1) / p.stride[d];
      const int64_t total = std::max<int64_t>(0, (want - 1) * p.stride[d] + span - p.in[d]);
      begin = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end = total - begin;
    } else if (a.auto_pad == "NOTSET" && !a.pads.empty()) {
      begin = a.pads[d];
      end = a.pads[s + d];
      if (begin < 0 || end < 0) return InvalidArgument("pads must be >= 0, got [", absl::StrJoin(a.pads, ","), "]");
    }
    p.pad_begin[d] = begin;
    const int64_t padded = p.in[d] + begin + end;
    if (padded < span)
      return InvalidArgument("spatial dim ", d, " of ", p.in[d], " (padded to ", padded, ") is smaller than the ",
                             span, " the dilated kernel spans");
    p.out[d] = (padded - span) / p.stride[d] + 1;
  }
  return p;
}

absl::StatusOr<ConvParams> PlanConvTranspose(std::span<const int64_t> x, std::span<const int64_t> w,
                                             const ConvTransposeAttrs& a) {
  ConvParams p;
  RETURN_IF_ERROR(PlanCommon(x, w, a, /*transposed=*/true, p));
  const int s = p.spatial;
  p.M = x[1];
  if (__builtin_mul_overflow(w[1], p.group, &p.C)) return InvalidArgument("W's dim 1 times group overflows");
  if (!a.output_padding.empty() && static_cast<int>(a.output_padding.size()) != s)
    return InvalidArgument("expected ", s, " output_padding, got ", a.output_padding.size());
  const size_t shape_at = a.output_shape.size() == static_cast<size_t>(s) + 2 ? 2 : 0;
  if (!a.output_shape.empty() && a.output_shape.size() != static_cast<size_t>(s) + shape_at)
    return InvalidArgument("expected output_shape of ", s, " spatial dims (or ", s + 2, " dims), got ",
                           a.output_shape.size());
  for (int d = 0; d < s; ++d) {
    const int64_t in = x[2 + d], stride = p.stride[d];
    if (in < 1) return InvalidArgument("X's spatial dim ", d, " is ", in, "; ConvTranspose needs at least 1");
    const int64_t out_pad = a.output_padding.empty() ? 0 : a.output_padding[d];
    if (out_pad < 0 || out_pad >= std::max(stride, p.dilation[d]))
      return InvalidArgument("output_padding must be >= 0 and below the stride or the dilation, got ", out_pad,
                             " in spatial dim ", d, " (stride ", stride, ", dilation ", p.dilation[d], ")");
    // Y's extent before any padding is taken off (below 2^63 by PlanCommon's bounds), held to
    // the spatial dims' bound as X's are.
    const int64_t full = stride * (in - 1) + out_pad + p.dilation[d] * (p.kernel[d] - 1) + 1;
    if (full >= kLimit)
      return InvalidArgument("Y's spatial dim ", d, " would span ", full, " elements; spatial dims must be below 2^31");
    int64_t out = 0, begin = 0;
    const bool same = a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER";
    if (!a.output_shape.empty() || same) {
      out = a.output_shape.empty() ? in * stride : a.output_shape[shape_at + static_cast<size_t>(d)];
      if (out < 0 || out >= kLimit) return InvalidArgument("output_shape must be in [0, 2^31), got ", out);
      // An output_shape beyond `full` extends Y at the end, as PyTorch's output_size does (by
      // output_padding): the positions no tap reaches hold the bias alone.
      const int64_t total = std::max<int64_t>(full - out, 0);
      begin = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    } else if (a.auto_pad == "NOTSET" && !a.pads.empty()) {
      begin = a.pads[d];
      const int64_t end = a.pads[s + d];
      if (begin < 0 || end < 0) return InvalidArgument("pads must be >= 0, got [", absl::StrJoin(a.pads, ","), "]");
      out = full - begin - end;
      if (out < 0)
        return InvalidArgument("pads [", absl::StrJoin(a.pads, ","), "] take more than the ", full,
                               " elements of Y's spatial dim ", d);
    } else {
      out = full;
    }
    p.in[d] = out;
    p.out[d] = in;
    p.pad_begin[d] = begin;
  }
  return p;
}

template <typename T>
void ConvForward(const ConvParams& p, const T* x, const T* w, const T* b, T* y, T* col, ThreadPool* pool) {
  const int64_t Cg = p.C / p.group, Mg = p.M / p.group, K = p.KernelSize(), O = p.OutSize(), I = p.InSize();
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      Im2Col(p, x + (n * p.C + g * Cg) * I, col, pool);
      T* yg = y + (n * p.M + g * Mg) * O;
      Gemm<T>(Mg, O, Cg * K, false, false, w + g * Mg * Cg * K, col, yg, false, pool);
      if (b)
        for (int64_t m = 0; m < Mg; ++m)
          for (int64_t o = 0; o < O; ++o) yg[m * O + o] += b[g * Mg + m];
    }
}

template <typename T>
void ConvBackward(const ConvParams& p, const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, T* col,
                  ThreadPool* pool) {
  const int64_t Cg = p.C / p.group, Mg = p.M / p.group, K = p.KernelSize(), O = p.OutSize(), I = p.InSize();
  if (db) {
    for (int64_t m = 0; m < p.M; ++m) {
      double s = 0;
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t o = 0; o < O; ++o) s += static_cast<double>(dy[(n * p.M + m) * O + o]);
      db[m] = static_cast<T>(s);
    }
  }
  if (dx) std::fill(dx, dx + p.N * p.C * I, T(0));
  if (dw) std::fill(dw, dw + p.M * Cg * K, T(0));
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      const T* dyg = dy + (n * p.M + g * Mg) * O;
      if (dw) {  // dW_g += dY_g [Mg, O] cols^T [O, Cg K]
        Im2Col(p, x + (n * p.C + g * Cg) * I, col, pool);
        Gemm<T>(Mg, Cg * K, O, false, true, dyg, col, dw + g * Mg * Cg * K, true, pool);
      }
      if (dx) {  // cols = W_g^T [Cg K, Mg] dY_g [Mg, O], summed back into the image
        Gemm<T>(Cg * K, O, Mg, true, false, w + g * Mg * Cg * K, dyg, col, false, pool);
        Col2ImAdd(p, col, dx + (n * p.C + g * Cg) * I, pool);
      }
    }
}

template void ConvForward<float>(const ConvParams&, const float*, const float*, const float*, float*, float*,
                                 ThreadPool*);
template void ConvForward<double>(const ConvParams&, const double*, const double*, const double*, double*, double*,
                                  ThreadPool*);
template void ConvBackward<float>(const ConvParams&, const float*, const float*, const float*, float*, float*, float*,
                                  float*, ThreadPool*);
template void ConvBackward<double>(const ConvParams&, const double*, const double*, const double*, double*, double*,
                                   double*, double*, ThreadPool*);

}  // namespace cleave::kernels::cpu
