// CUDA provider checks (label gpu). Without a usable device each test skips and says why.
#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/elementwise.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

TEST(CudaProvider, AddKernelMatchesHost) {
  auto devices = CudaDeviceCount();
  if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  const int64_t n = 1 << 20;
  std::vector<float> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) a[i] = 0.5f * i, b[i] = 1.0f - i;
  float *da, *db, *dc;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dc), n * 4), cudaSuccess);
  cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
  kernels::cuda::AddF32(da, db, dc, n, nullptr);
  ASSERT_EQ(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << i;
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

}  // namespace
}  // namespace cleave::providers
