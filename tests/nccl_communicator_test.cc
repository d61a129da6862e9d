// The NCCL communicator on one process (an MPI singleton): bootstrap, an all-reduce and a
// gather of device tensors over a group of one, and the stream ordering around them. Labelled
// gpu; skipped without a device.
#include <cuda_runtime.h>

#include <vector>

#include "gtest/gtest.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"

namespace cleave::runtime {
namespace {

TEST(NcclCommunicator, SingleRankCollectivesOnTheDevice) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  auto mpi = MpiCommunicator::Create(nullptr, nullptr, std::chrono::seconds(30));
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  auto nccl = NcclCommunicator::Create(mpi->get(), 0, nullptr, std::chrono::seconds(30));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  std::vector<float> host = {1, 2, 3, 4};
  float* dev = nullptr;
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gathered, 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  const int64_t dims[1] = {4};
  const int group[1] = {0};
  TensorView v(dev, DataType::kFloat32, dims), g(gathered, DataType::kFloat32, dims);
  ASSERT_TRUE((*nccl)->AllReduce(v, v, ReduceOp::kSum, group).ok());
  ASSERT_TRUE((*nccl)->AllGather(v, g, group).ok());
  ASSERT_TRUE((*nccl)->Synchronize().ok());
  std::vector<float> back(4);
  ASSERT_EQ(cudaMemcpy(back.data(), gathered, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(dev);
  cudaFree(gathered);
}

}  // namespace
}  // namespace cleave::runtime
