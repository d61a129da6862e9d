// Det (11, 22) on the CPU (providers/cpu/): each [M, M] matrix's determinant by LU
// factorisation with partial pivoting, in double.
#include <cmath>
#include <utility>
#include <vector>

#include "base/status.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

double Determinant(std::vector<double>& a, int64_t m) {
  double det = 1;
  for (int64_t c = 0; c < m; ++c) {
    int64_t pivot = c;
    for (int64_t r = c + 1; r < m; ++r)
      if (std::fabs(a[static_cast<size_t>(r * m + c)]) > std::fabs(a[static_cast<size_t>(pivot * m + c)])) pivot = r;
    const double p = a[static_cast<size_t>(pivot * m + c)];
    if (p == 0) return 0;
    if (pivot != c) {
      for (int64_t k = 0; k < m; ++k) std::swap(a[static_cast<size_t>(c * m + k)], a[static_cast<size_t>(pivot * m + k)]);
      det = -det;
    }
    det *= p;
    for (int64_t r = c + 1; r < m; ++r) {
      const double f = a[static_cast<size_t>(r * m + c)] / p;
      for (int64_t k = c + 1; k < m; ++k) a[static_cast<size_t>(r * m + k)] -= f * a[static_cast<size_t>(c * m + k)];
    }
  }
  return det;
}

class DetKernel : public OpKernel {
 public:
  DetKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank < 2 || x.dims[x.rank - 1] != x.dims[x.rank - 2])
      return InvalidArgument("expected square matrices [..., M, M], got ", DimsToString(x.dim_span()));
    const int64_t m = x.dims[x.rank - 1];
    TensorView* y = ctx.Output(0, std::span<const int64_t>(x.dims, static_cast<size_t>(x.rank - 2)));
    if (!y) return absl::OkStatus();
    const bool wide = x.dtype == DataType::kFloat64;
    ParallelFor(ctx.thread_pool(), y->numel(), 16, [&](int64_t b0, int64_t b1) {
      std::vector<double> a(static_cast<size_t>(m * m));
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t k = 0; k < m * m; ++k)
          a[static_cast<size_t>(k)] = wide ? x.as<double>()[b * m * m + k] : x.as<float>()[b * m * m + k];
        const double det = Determinant(a, m);
        if (wide) y->as<double>()[b] = det;
        else y->as<float>()[b] = static_cast<float>(det);
      }
    });
    return absl::OkStatus();
  }
};

}  // namespace

void RegisterLinalgKernels(KernelRegistry& r) {
  r.Register({"", "Det", 11, 1 << 30, InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
              MakeFactory<DetKernel>()});
}

}  // namespace cleave::providers
