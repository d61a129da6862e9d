// SoftmaxCrossEntropyLoss on the CPU (kernels/cpu/), following the ONNX reference
// (onnx/reference/ops/op_softmax_cross_entropy_loss.py): per position, loss = -w[label] *
// log_softmax(scores)[label], 0 where label == ignore_index; "mean" divides by the sum of
// the weights actually applied (by N*D when there are neither weights nor ignore_index).
// log-sum-exp runs in double after subtracting the max, so large logits do not overflow.
#include <algorithm>
#include <cmath>

#include "base/status.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

namespace {

constexpr int64_t kChunk = 256;

// log(sum_c exp(x[c * stride])) over C entries, shifted by their max.
double LogSumExp(const float* x, int64_t C, int64_t stride) {
  float m = -INFINITY;
  if (stride == 1) m = LaneMax(x, C, m);  // the common [N, C] case: contiguous classes
  else for (int64_t c = 0; c < C; ++c) m = MaxNan(m, x[c * stride]);
  float buf[kChunk];
  double sum = 0;
  for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
    const int64_t len = std::min(kChunk, C - c0);
    for (int64_t j = 0; j < len; ++j) buf[j] = x[(c0 + j) * stride] - m;
    ExpF32(buf, buf, len);
    sum += LaneSum<double>(buf, len);
  }
  return static_cast<double>(m) + std::log(sum);
}

double LogSumExp(const double* x, int64_t C, int64_t stride) {
  double m = -INFINITY;
  for (int64_t c = 0; c < C; ++c) m = MaxNan(m, x[c * stride]);
  double sum = 0;
  for (int64_t c = 0; c < C; ++c) sum += std::exp(x[c * stride] - m);
  return m + std::log(sum);
}

}  // namespace

template <typename T, typename L>
absl::Status SoftmaxCrossEntropy(const SceParams& p, const T* scores, const L* labels,
                                 const T* weights, T* loss, T* log_prob, double* scratch,
                                 ThreadPool* pool) {
  const int64_t N = p.N, C = p.C, D = p.D, positions = N * D;
  auto ignored = [&](int64_t label) { return p.ignore_index && label == *p.ignore_index; };
  // Check every label before writing anything.
  for (int64_t i = 0; i < positions; ++i) {
    const int64_t l = static_cast<int64_t>(labels[i]);
    if (!ignored(l) && (l < 0 || l >= C))
      return InvalidArgument("label ", l, " at position ", i, " is outside [0, ", C, ")",
                             p.ignore_index ? absl::StrCat(" and is not ignore_index ", *p.ignore_index)
                                            : std::string());
  }
  const bool reduce = p.reduction != LossReduction::kNone;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C));
  ParallelFor(pool, positions, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / D, d = i % D;
      const T* x = scores + n * C * D + d;  // x[c * D] is class c at this position
      const double lse = p.nll ? 0.0 : LogSumExp(x, C, D);
      if (log_prob && !p.nll) {
        T* lp = log_prob + n * C * D + d;
        for (int64_t c = 0; c < C; ++c) lp[c * D] = static_cast<T>(static_cast<double>(x[c * D]) - lse);
      }
      const int64_t l = static_cast<int64_t>(labels[i]);
      double w = 0, li = 0;
      if (!ignored(l)) {
        w = weights ? static_cast<double>(weights[l]) : 1.0;
        li = -(static_cast<double>(x[l * D]) - lse);
      }
      if (reduce) {
        scratch[i] = w * li;
        scratch[positions + i] = w;
      } else {
        loss[i] = static_cast<T>(w * li);
      }
    }
  });
  if (!reduce) return absl::OkStatus();
  // Summed serially in position order so the result does not depend on the thread count.
  double total = 0, weight_sum = 0;
  for (int64_t i = 0; i < positions; ++i) total += scratch[i];
  for (int64_t i = 0; i < positions; ++i) weight_sum += scratch[positions + i];
  if (p.reduction == LossReduction::kMean)
    total /= (weights || p.ignore_index) ? weight_sum : static_cast<double>(positions);
  loss[0] = static_cast<T>(total);
  return absl::OkStatus();
}

#define CLEAVE_INSTANTIATE_SCE(T, L)                                                        \
  template absl::Status SoftmaxCrossEntropy<T, L>(const SceParams&, const T*, const L*,     \
                                                  const T*, T*, T*, double*, ThreadPool*);
CLEAVE_INSTANTIATE_SCE(float, int32_t)
CLEAVE_INSTANTIATE_SCE(float, int64_t)
CLEAVE_INSTANTIATE_SCE(double, int32_t)
CLEAVE_INSTANTIATE_SCE(double, int64_t)
#undef CLEAVE_INSTANTIATE_SCE

}  // namespace cleave::kernels::cpu
