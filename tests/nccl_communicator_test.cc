// The NCCL communicator on one process (a world of one, no MPI): an all-reduce and a gather of
// device tensors over a group of one, the stream ordering around them, and a deferred
// duplicate (the asynchronous collectives' queue) that the compute stream joins through one
// operation's event, the compute stream's wait for each operation that is not deferred, and a
// message that never comes timed out by the watchdog. Labelled gpu;
// skipped without a device.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/nccl_communicator.h"

namespace cleave::runtime {
namespace {

bool HaveDevice() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

// Three device arrays of n floats: `a` holds `host` (i % period), `b` and `copy` are for the
// results. The caller frees them.
struct Buffers {
  std::vector<float> host;
  float *a = nullptr, *b = nullptr, *copy = nullptr;
};
::testing::AssertionResult MakeBuffers(int n, int period, Buffers* out) {
  out->host.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out->host[static_cast<size_t>(i)] = static_cast<float>(i % period);
  const size_t bytes = static_cast<size_t>(n) * 4;
  for (float** p : {&out->a, &out->b, &out->copy})
    if (cudaMalloc(p, bytes) != cudaSuccess) return ::testing::AssertionFailure() << "cudaMalloc of " << bytes;
  if (cudaMemcpy(out->a, out->host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaMemcpy";
  return ::testing::AssertionSuccess();
}

TEST(NcclCommunicator, SingleRankCollectivesOnTheDevice) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto nccl = NcclCommunicator::Create(nullptr, 0, nullptr, std::chrono::seconds(30));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ((*nccl)->world_size(), 1);
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

// Without deferral each operation orders the compute stream's later work after it: a copy
// queued on the compute stream right after an all-reduce reads the all-reduce's result. (Over
// the emulated device the communicator's stream lags behind, so a missing wait reads the
// output unwritten.)
TEST(NcclCommunicator, ComputeStreamWaitsForEachOperation) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
#ifdef CLEAVE_CUDA_EMULATED_DEVICE
  cuda_emu::SetNewStreamLag(std::chrono::milliseconds(20));
#endif
  auto nccl = NcclCommunicator::Create(nullptr, 0, compute, std::chrono::seconds(30));
#ifdef CLEAVE_CUDA_EMULATED_DEVICE
  cuda_emu::SetNewStreamLag(std::chrono::microseconds(0));
#endif
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  constexpr int kN = 4096;
  Buffers bufs;
  ASSERT_TRUE(MakeBuffers(kN, 97, &bufs));
  auto& [host, a, b, copy] = bufs;
  const int64_t dims[1] = {kN};
  const int group[1] = {0};
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemsetAsync(b, 0xff, kN * 4, compute), cudaSuccess);  // NaN until the all-reduce writes it
    ASSERT_TRUE((*nccl)->AllReduce(TensorView(a, DataType::kFloat32, dims), TensorView(b, DataType::kFloat32, dims),
                                   ReduceOp::kSum, group).ok());
    ASSERT_EQ(cudaMemcpyAsync(copy, b, kN * 4, cudaMemcpyDeviceToDevice, compute), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    std::vector<float> back(kN);
    ASSERT_EQ(cudaMemcpy(back.data(), copy, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(back, host) << "round " << round;
  }
  EXPECT_TRUE((*nccl)->Synchronize().ok());
  cudaFree(a);
  cudaFree(b);
  cudaFree(copy);
  nccl->reset();
  cudaStreamDestroy(compute);
}

TEST(NcclCommunicator, DeferredDuplicateJoinsThroughOneOperation) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  auto nccl = NcclCommunicator::Create(nullptr, 0, compute, std::chrono::seconds(30));
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  auto dup = (*nccl)->Duplicate();
  ASSERT_TRUE(dup.ok()) << dup.status();
  Communicator& q = **dup;
  q.set_deferred(true);
  constexpr int kN = 1 << 20;
  Buffers bufs;
  ASSERT_TRUE(MakeBuffers(kN, 1000, &bufs));
  auto& [host, a, b, copy] = bufs;
  const int64_t dims[1] = {kN};
  const int group[1] = {0};
  // Two gathers queued on the duplicate's stream (a group of one copies), then the compute
  // stream joins through the first only and copies its result.
  EXPECT_EQ(q.queued_operations(), 0);
  ASSERT_TRUE(q.AllGather(TensorView(a, DataType::kFloat32, dims), TensorView(b, DataType::kFloat32, dims), group).ok());
  ASSERT_TRUE(q.AllGather(TensorView(b, DataType::kFloat32, dims), TensorView(a, DataType::kFloat32, dims), group).ok());
  EXPECT_EQ(q.queued_operations(), 2);
  ASSERT_TRUE(q.JoinComputeThrough(1).ok());
  ASSERT_EQ(cudaMemcpyAsync(copy, b, kN * 4, cudaMemcpyDeviceToDevice, compute), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  ASSERT_TRUE(q.Synchronize().ok());
  std::vector<float> back(kN);
  ASSERT_EQ(cudaMemcpy(back.data(), copy, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  // Past the ring of marks a join covers everything queued.
  for (int i = 0; i < 70; ++i)
    ASSERT_TRUE(q.AllReduce(TensorView(a, DataType::kFloat32, dims), TensorView(a, DataType::kFloat32, dims),
                            ReduceOp::kSum, group).ok());
  EXPECT_TRUE(q.JoinComputeThrough(3).ok());
  EXPECT_TRUE(q.Synchronize().ok());
  cudaFree(a);
  cudaFree(b);
  cudaFree(copy);
  dup->reset();
  nccl->reset();
  cudaStreamDestroy(compute);
}

// A receive that no one sends (a world of one receiving from itself) stands for a dead peer:
// the watchdog times it out naming the message, aborts the communicator, the compute stream
// that waits on it drains, and every later call returns the same failure.
TEST(NcclCommunicator, MessageThatNeverComesTimesOutAndTheStreamsDrain) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  std::atomic<int> stuck{0};
  auto nccl = NcclCommunicator::Create(nullptr, 0, compute, std::chrono::seconds(1),
                                       [&](const absl::Status&) { ++stuck; });
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 16), cudaSuccess);
  const int64_t dims[1] = {4};
  const int group[1] = {0};
  TensorView v(dev, DataType::kFloat32, dims);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = (*nccl)->Recv(v, 0, 5);
  if (s.ok()) s = (*nccl)->Synchronize();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Recv from rank 0 (tag 5)"), std::string::npos) << s;
  EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);  // the aborted receive let it go
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  const absl::Status later = (*nccl)->AllReduce(v, v, ReduceOp::kSum, group);
  EXPECT_EQ(later, s);
  EXPECT_EQ(stuck, 0);
  cudaFree(dev);
  nccl->reset();
  cudaStreamDestroy(compute);
}

}  // namespace
}  // namespace cleave::runtime
