// LayerNormalization's and RMSNormalization's gradients on the CPU (kernels/cpu/); see grad.h.
// dx needs two sums per row, taken in double like the forward's statistics; they use the
// forward's saved mean and inv_std rather than recomputing them, so the backward
// differentiates exactly the normalisation the forward applied. dscale and dbias are sums
// over all rows: each fixed block of rows sums into its own workspace slice, and the slices
// are added in block order, so the result is bitwise the same for any thread count.
#include <algorithm>

#include "kernels/cpu/grad.h"
#include "kernels/cpu/lanes.h"

namespace cleave::kernels::cpu {

namespace {

// At most this many row blocks: enough to spread over the cores, few enough that the
// workspace (2 * blocks * cols doubles) stays small.
constexpr int64_t kMaxBlocks = 64;

int64_t RowsPerBlock(int64_t rows) { return std::max<int64_t>(1, (rows + kMaxBlocks - 1) / kMaxBlocks); }

// sum_i g[i] and sum_i g[i] xhat[i] for g = dy scale, xhat = (x - m) s, in four double lanes.
template <typename T>
CLEAVE_ALWAYS_INLINE void RowSums(const T* dy, const T* x, const T* scale, double m, double s,
                                  int64_t n, double* sum_g, double* sum_gx) {
  lanes::D4 ag = {}, agx = {}, vdy, vx, vs, cm, cs;
  lanes::Splat(&cm, m);
  lanes::Splat(&cs, s);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    lanes::LoadD4(&vdy, dy + i);
    lanes::LoadD4(&vx, x + i);
    lanes::LoadD4(&vs, scale + i);
    const lanes::D4 g = vdy * vs;
    ag += g;
    agx += g * ((vx - cm) * cs);
  }
  double sg = (ag[0] + ag[1]) + (ag[2] + ag[3]);
  double sgx = (agx[0] + agx[1]) + (agx[2] + agx[3]);
  for (; i < n; ++i) {
    const double g = static_cast<double>(dy[i]) * static_cast<double>(scale[i]);
    sg += g;
    sgx += g * ((static_cast<double>(x[i]) - m) * s);
  }
  *sum_g = sg;
  *sum_gx = sgx;
}

// One row: writes dx and adds this row's dscale / dbias terms to ps / pb (either may be null).
// RMSNorm passes m = 0 and centred = false: no mean(g) term.
template <typename T>
CLEAVE_ALWAYS_INLINE void LayerNormGradRowImpl(const T* dy, const T* x, const T* scale, double m,
                                               double s, bool centred, int64_t n, T* dx,
                                               double* ps, double* pb) {
  double sg, sgx;
  RowSums(dy, x, scale, m, s, n, &sg, &sgx);
  const double mg = centred ? sg / static_cast<double>(n) : 0.0, mgx = sgx / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double xh = (static_cast<double>(x[i]) - m) * s;
    const double g = static_cast<double>(dy[i]) * static_cast<double>(scale[i]);
    dx[i] = static_cast<T>(s * (g - mg - xh * mgx));
  }
  if (ps)
    for (int64_t i = 0; i < n; ++i)
      ps[i] += static_cast<double>(dy[i]) * ((static_cast<double>(x[i]) - m) * s);
  if (pb)
    for (int64_t i = 0; i < n; ++i) pb[i] += static_cast<double>(dy[i]);
}

CLEAVE_SIMD_CLONES void LayerNormGradRowF32(const float* dy, const float* x, const float* scale,
                                            double m, double s, bool centred, int64_t n, float* dx,
                                            double* ps, double* pb) {
  LayerNormGradRowImpl(dy, x, scale, m, s, centred, n, dx, ps, pb);
}
void LayerNormGradRow(const float* dy, const float* x, const float* scale, double m, double s,
                      bool centred, int64_t n, float* dx, double* ps, double* pb) {
  LayerNormGradRowF32(dy, x, scale, m, s, centred, n, dx, ps, pb);
}
void LayerNormGradRow(const double* dy, const double* x, const double* scale, double m, double s,
                      bool centred, int64_t n, double* dx, double* ps, double* pb) {
  LayerNormGradRowImpl(dy, x, scale, m, s, centred, n, dx, ps, pb);
}

}  // namespace

int64_t LayerNormGradBlocks(int64_t rows) {
  const int64_t per = RowsPerBlock(rows);
  return (rows + per - 1) / per;
}

int64_t LayerNormGradWorkspace(const LayerNormGradParams& p) {
  return 2 * LayerNormGradBlocks(p.rows) * p.cols;
}

template <typename T, typename U>
void LayerNormGrad(const LayerNormGradParams& p, const T* dy, const T* x, const T* scale,
                   const U* mean, const U* inv_std, T* dx, T* dscale, T* dbias,
                   double* workspace, ThreadPool* pool) {
  const int64_t n = p.cols;
  if (n == 0) return;
  const int64_t per = RowsPerBlock(p.rows), blocks = LayerNormGradBlocks(p.rows);
  const bool sums = dscale || dbias;
  // Block b owns workspace[2 b n, 2 (b + 1) n): its dscale sums, then its dbias sums.
  ParallelFor(pool, blocks, std::max<int64_t>(1, 16384 / (per * n)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double* ps = dscale ? workspace + 2 * b * n : nullptr;
      double* pb = dbias ? workspace + (2 * b + 1) * n : nullptr;
      if (ps) std::fill(ps, ps + n, 0.0);
      if (pb) std::fill(pb, pb + n, 0.0);
      for (int64_t r = b * per; r < std::min(p.rows, (b + 1) * per); ++r)
        LayerNormGradRow(dy + r * n, x + r * n, scale, p.rms ? 0.0 : static_cast<double>(mean[r]),
                         static_cast<double>(inv_std[r]), !p.rms, n, dx + r * n, ps, pb);
    }
  });
  if (!sums) return;
  ParallelFor(pool, n, 1024, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s = 0, t = 0;
      for (int64_t b = 0; b < blocks; ++b) {  // block order: fixed for any thread count
        if (dscale) s += workspace[2 * b * n + c];
        if (dbias) t += workspace[(2 * b + 1) * n + c];
      }
      if (dscale) dscale[c] = static_cast<T>(s);
      if (dbias) dbias[c] = static_cast<T>(t);
    }
  });
}

#define CLEAVE_INSTANTIATE_LAYER_NORM_GRAD(T, U)                                            \
  template void LayerNormGrad<T, U>(const LayerNormGradParams&, const T*, const T*, const T*, \
                                    const U*, const U*, T*, T*, T*, double*, ThreadPool*);
CLEAVE_INSTANTIATE_LAYER_NORM_GRAD(float, float)
CLEAVE_INSTANTIATE_LAYER_NORM_GRAD(float, double)
CLEAVE_INSTANTIATE_LAYER_NORM_GRAD(double, float)
CLEAVE_INSTANTIATE_LAYER_NORM_GRAD(double, double)
#undef CLEAVE_INSTANTIATE_LAYER_NORM_GRAD

}  // namespace cleave::kernels::cpu
