// Backward kernels of the training ops on the CPU (kernels/cpu/); see grad.h. Scatters zero
// their output first and then add or write into it; work is split only over output regions
// that no two tasks share, so results do not depend on the thread count.
#include "kernels/cpu/grad.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/thread_buffer.h"

namespace cleave::kernels::cpu {

namespace {

int64_t IndexAt(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kInt32 ? v.as<const int32_t>()[i] : v.as<const int64_t>()[i];
}

// dx viewed as [outer, d, inner] around the axis, dy as [outer, n_idx, inner].
template <typename T>
void ScatterAdd(const T* dy, const TensorView& indices, int64_t outer, int64_t d, int64_t inner,
                T* dx, ThreadPool* pool) {
  const int64_t n_idx = indices.numel();
  // Tasks own (outer row, block of inner columns) pairs: disjoint parts of dx, each summed
  // over the indices in order.
  constexpr int64_t kBlock = 512;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  ParallelFor(pool, outer * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / blocks, c0 = (t % blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
      T* out = dx + o * d * inner;
      const T* in = dy + o * n_idx * inner;
      for (int64_t j = 0; j < n_idx; ++j) {
        int64_t k = IndexAt(indices, j);
        if (k < 0) k += d;
        T* dst = out + k * inner;
        const T* src = in + j * inner;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  });
}

}  // namespace

absl::Status GatherGrad(const TensorView& dy, const TensorView& indices, int axis, TensorView& dx,
                        ThreadPool* pool, const void* base) {
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; ++k) outer *= dx.dims[k];
  for (int k = axis + 1; k < dx.rank; ++k) inner *= dx.dims[k];
  const int64_t d = dx.dims[axis];
  for (int64_t j = 0; j < indices.numel(); ++j) {
    const int64_t k = IndexAt(indices, j);
    if (k < -d || k >= d)
      return InvalidArgument("index ", k, " at position ", j, " is out of range for axis ", axis,
                             " of size ", d, ": expected [", -d, ", ", d - 1, "]");
  }
  if (!base) {
    std::memset(dx.data, 0, dx.nbytes());
  } else if (base != dx.data) {
    const char* src = static_cast<const char*>(base);
    char* dst = static_cast<char*>(dx.data);
    ParallelFor(pool, static_cast<int64_t>(dx.nbytes()), int64_t{1} << 20, [&](int64_t b0, int64_t b1) {
      std::memcpy(dst + b0, src + b0, static_cast<size_t>(b1 - b0));
    });
  }
  if (dx.dtype == DataType::kFloat64)
    ScatterAdd(dy.as<const double>(), indices, outer, d, inner, dx.as<double>(), pool);
  else
    ScatterAdd(dy.as<const float>(), indices, outer, d, inner, dx.as<float>(), pool);
  return absl::OkStatus();
}

void SliceGrad(const TensorView& dy, const SliceParams& p, TensorView& dx, ThreadPool* pool) {
  (void)pool;  // a strided write of dy's size: cheap next to the zero fill
  std::memset(dx.data, 0, dx.nbytes());
  const int r = dx.rank;
  const int64_t n = dy.numel();
  if (n == 0) return;
  int64_t strides[kMaxRank];
  DenseStrides(dx.dim_span(), strides);
  // dy element at multi-index i lands at dx offset sum_k (starts[k] + i_k steps[k]) strides[k].
  int64_t base = 0, step[kMaxRank];
  for (int k = 0; k < r; ++k) {
    base += p.starts[k] * strides[k];
    step[k] = p.steps[k] * strides[k];
  }
  ForElementSize(ElementSize(dx.dtype), [&](auto tag) {
    using U = decltype(tag);
    const U* src = dy.as<const U>();
    U* dst = dx.as<U>();
    int64_t idx[kMaxRank] = {};
    int64_t off = base;
    for (int64_t e = 0; e < n; ++e) {
      dst[off] = src[e];
      // Odometer step over dy's dims, moving the dx offset along.
      for (int k = r - 1; k >= 0; --k) {
        off += step[k];
        if (++idx[k] < dy.dims[k]) break;
        off -= step[k] * idx[k];
        idx[k] = 0;
      }
    }
  });
}

namespace {

// Checks each label that is not ignore_index against [0, classes) and returns the sum of their
// class weights (1 each without weights), summed in position order as the forward sums it.
template <typename T, typename L>
absl::StatusOr<double> LabelWeightSum(const SceParams& p, const L* labels, const T* weights, int64_t classes) {
  double sum = 0;
  for (int64_t i = 0; i < p.N * p.D; ++i) {
    const int64_t l = static_cast<int64_t>(labels[i]);
    if (p.ignore_index && l == *p.ignore_index) continue;
    if (l < 0 || l >= classes)
      return InvalidArgument("label ", l, " at position ", i, " is outside [0, ", classes, ")",
                             p.ignore_index ? absl::StrCat(" and is not ignore_index ", *p.ignore_index)
                                            : std::string());
    sum += weights ? static_cast<double>(weights[l]) : 1.0;
  }
  return sum;
}

}  // namespace

template <typename T, typename L>
absl::Status SoftmaxCrossEntropyGrad(const SceParams& p, const T* dy, const T* log_prob,
                                     const L* labels, const T* weights, T* dx, ThreadPool* pool) {
  const int64_t N = p.N, C = p.C, D = p.D, positions = N * D;
  const int64_t all_classes = p.num_classes > 0 ? p.num_classes : C, offset = p.class_offset;
  if (weights && (offset != 0 || all_classes != C))
    return InvalidArgument("class weights are not supported over a slice of the classes");
  auto ignored = [&](int64_t label) { return p.ignore_index && label == *p.ignore_index; };
  ASSIGN_OR_RETURN(const double weight_sum, LabelWeightSum(p, labels, weights, all_classes));
  double scale = 1.0;  // what dy is multiplied by for the reduced forms
  if (p.reduction == LossReduction::kMean)
    scale = 1.0 / ((weights || p.ignore_index) ? weight_sum : static_cast<double>(positions));
  const bool per_position = p.reduction == LossReduction::kNone;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C));
  ParallelFor(pool, positions, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / D, d = i % D;
      const T* lp = log_prob + n * C * D + d;  // lp[c * D] is class c at this position
      T* out = dx + n * C * D + d;
      const int64_t label = static_cast<int64_t>(labels[i]);
      if (ignored(label)) {
        for (int64_t c = 0; c < C; ++c) out[c * D] = T(0);
        continue;
      }
      const double w = weights ? static_cast<double>(weights[label]) : 1.0;
      const int64_t l = label - offset;  // the label's column in this slice (may be outside it)
      const double g = w * (per_position ? static_cast<double>(dy[i]) : static_cast<double>(dy[0]) * scale);
      // d(-log_softmax(x)[l]) / dx_c = softmax(x)_c - [c == l], softmax = exp(log_prob); the
      // negative log-likelihood of log-probabilities has only the -[c == l].
      for (int64_t c = 0; c < C; ++c) {
        const double softmax = p.nll ? 0.0 : std::exp(static_cast<double>(lp[c * D]));
        out[c * D] = static_cast<T>(g * (softmax - (c == l ? 1.0 : 0.0)));
      }
    }
  });
  return absl::OkStatus();
}

namespace {

// One row of the from-scores cross-entropy, in place over e (the row's scores in float32):
// e = g (softmax - onehot(l)), or zeros where the row is ignored. Returns the row's loss
// (lse - x[l]; 0 when ignored).
CLEAVE_SIMD_CLONES double SceRow(float* e, int64_t C, int64_t l, bool ignored, double g) {
  if (ignored) {
    std::fill(e, e + C, 0.f);
    return 0.0;
  }
  const float x_l = e[l];
  const float m = LaneMax(e, C, -std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < C; ++c) e[c] -= m;
  ExpF32(e, e, C);
  const double sum = LaneSum<double>(e, C);
  const float inv = static_cast<float>(g / sum);
  for (int64_t c = 0; c < C; ++c) e[c] *= inv;
  e[l] -= static_cast<float>(g);
  return static_cast<double>(m) + std::log(sum) - static_cast<double>(x_l);
}

}  // namespace

template <typename L>
absl::Status SoftmaxCrossEntropyFromScores(const SceParams& p, const float* dy, const TensorView& scores,
                                           const L* labels, TensorView& dx, float* loss, double* scratch,
                                           ThreadPool* pool) {
  const int64_t N = p.N, C = p.C;
  if (p.D != 1 || p.class_offset != 0 || (p.num_classes != 0 && p.num_classes != C))
    return InvalidArgument("the one-pass cross-entropy takes scores [N, C] over all the classes");
  auto ignored = [&](int64_t label) { return p.ignore_index && label == *p.ignore_index; };
  // The positions "mean" divides by: those not ignored (all N without ignore_index).
  ASSIGN_OR_RETURN(const double counted, LabelWeightSum(p, labels, static_cast<const float*>(nullptr), C));
  const bool per_position = p.reduction == LossReduction::kNone;
  const double scale = p.reduction == LossReduction::kMean ? 1.0 / counted : 1.0;
  const bool wide_in = scores.dtype == DataType::kFloat32, wide_out = dx.dtype == DataType::kFloat32;
  const size_t in_bytes = ElementSize(scores.dtype), out_bytes = ElementSize(dx.dtype);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C));
  const int64_t row_dims[1] = {C};
  ParallelFor(pool, N, grain, [&](int64_t i0, int64_t i1) {
    float* buffer = wide_out ? nullptr : ThreadBuffer(0, static_cast<size_t>(C));
    for (int64_t i = i0; i < i1; ++i) {
      // The row in float32 where its gradient goes: dx's own row, or the buffer.
      float* e = wide_out ? dx.as<float>() + i * C : buffer;
      const TensorView in(static_cast<char*>(scores.data) + i * C * in_bytes, scores.dtype, row_dims);
      if (wide_in) std::copy_n(in.as<const float>(), C, e);
      else Cast(in, TensorView(e, DataType::kFloat32, row_dims), nullptr);
      const int64_t l = static_cast<int64_t>(labels[i]);
      const double g = (per_position ? static_cast<double>(dy[i]) : static_cast<double>(dy[0])) * scale;
      const double li = SceRow(e, C, l, ignored(l), g);
      if (!wide_out)
        Cast(TensorView(e, DataType::kFloat32, row_dims),
             TensorView(static_cast<char*>(dx.data) + i * C * out_bytes, dx.dtype, row_dims), nullptr);
      if (per_position && loss) loss[i] = static_cast<float>(li);
      else scratch[i] = li;
    }
  });
  if (!loss || per_position) return absl::OkStatus();
  // Summed serially in position order so the result does not depend on the thread count.
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += scratch[i];
  if (p.reduction == LossReduction::kMean) total /= counted;
  loss[0] = static_cast<float>(total);
  return absl::OkStatus();
}

template absl::Status SoftmaxCrossEntropyFromScores<int32_t>(const SceParams&, const float*, const TensorView&,
                                                             const int32_t*, TensorView&, float*, double*,
                                                             ThreadPool*);
template absl::Status SoftmaxCrossEntropyFromScores<int64_t>(const SceParams&, const float*, const TensorView&,
                                                             const int64_t*, TensorView&, float*, double*,
                                                             ThreadPool*);

#define CLEAVE_INSTANTIATE_SCE_GRAD(T, L)                                                       \
  template absl::Status SoftmaxCrossEntropyGrad<T, L>(const SceParams&, const T*, const T*,     \
                                                      const L*, const T*, T*, ThreadPool*);
CLEAVE_INSTANTIATE_SCE_GRAD(float, int32_t)
CLEAVE_INSTANTIATE_SCE_GRAD(float, int64_t)
CLEAVE_INSTANTIATE_SCE_GRAD(double, int32_t)
CLEAVE_INSTANTIATE_SCE_GRAD(double, int64_t)
#undef CLEAVE_INSTANTIATE_SCE_GRAD

}  // namespace cleave::kernels::cpu
