// CUDA GridSample (kernels/cuda/) over the taps of kernels/grid_sample.h: one thread per output
// point of an image, its taps found once and then applied to every channel. The gradient's dX
// scatters into a float32 accumulator with atomics (each element's sum in no fixed order, as
// PyTorch's); dGrid is each point's own sum over its channels, in order. bf16 and fp16 are read
// and written in their storage type and computed in float32.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/grid_sample.h"

namespace cleave::kernels::cuda {
namespace {

// The taps of output point p (of every image's points) in float32.
template <typename T>
__device__ inline void PointTaps(const GridSampleLayout& l, const T* grid, int64_t p, GridAxisTaps<float>* taps) {
  float g[kMaxGridAxes];
  for (int k = 0; k < l.axes; ++k) g[k] = ToFloat(grid[p * l.axes + k]);
  GridPointTaps(l, g, taps);
}

template <typename T>
__global__ void GridSampleKernel(GridSampleLayout l, const T* x, const T* grid, T* y) {
  const int64_t total = l.batch * l.out_points, plane = GridInPoints(l);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = p / l.out_points, o = p % l.out_points;
    GridAxisTaps<float> taps[kMaxGridAxes];
    PointTaps(l, grid, p, taps);
    for (int64_t c = 0; c < l.channels; ++c) {
      const T* xc = x + (b * l.channels + c) * plane;
      float acc = 0.f;
      ForEachGridTap(l, taps, [&](int64_t at, float w, const float*) { acc += w * ToFloat(xc[at]); });
      y[(b * l.channels + c) * l.out_points + o] = FromFloat<T>(acc);
    }
  }
}

template <typename T>
__global__ void GridSampleGradKernel(GridSampleLayout l, const T* dy, const T* x, const T* grid, float* dx, T* dgrid) {
  const int64_t total = l.batch * l.out_points, plane = GridInPoints(l);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = p / l.out_points, o = p % l.out_points;
    GridAxisTaps<float> taps[kMaxGridAxes];
    PointTaps(l, grid, p, taps);
    float acc[kMaxGridAxes] = {0.f, 0.f, 0.f};
    for (int64_t c = 0; c < l.channels; ++c) {
      const float g = ToFloat(dy[(b * l.channels + c) * l.out_points + o]);
      const T* xc = x + (b * l.channels + c) * plane;
      float* dxc = dx + (b * l.channels + c) * plane;
      ForEachGridTap(l, taps, [&](int64_t at, float w, const float* dw) {
        atomicAdd(dxc + at, w * g);
        const float v = g * ToFloat(xc[at]);
        for (int d = 0; d < l.axes; ++d) acc[d] += dw[d] * v;
      });
    }
    if (dgrid)
      for (int d = 0; d < l.axes; ++d) dgrid[p * l.axes + (l.axes - 1 - d)] = FromFloat<T>(acc[d]);
  }
}

}  // namespace

int GridSample(Dt dt, const GridSampleLayout& l, const void* x, const void* grid, void* y, void* stream) {
  const int64_t total = l.batch * l.out_points;
  if (total == 0 || l.channels == 0) return 0;
  DISPATCH_DT(dt, T, {
    GridSampleKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(x),
                                                                        static_cast<const T*>(grid),
                                                                        static_cast<T*>(y));
  });
  return static_cast<int>(cudaGetLastError());
}

int GridSampleGrad(Dt dt, const GridSampleLayout& l, const void* dy, const void* x, const void* grid, float* dx,
                   void* dgrid, void* stream) {
  const int64_t total = l.batch * l.out_points;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    GridSampleGradKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
        l, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(grid), dx,
        static_cast<T*>(dgrid));
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
