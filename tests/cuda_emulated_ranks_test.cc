// Partitioned training on CUDA providers over the emulated device (built with
// CLEAVE_CUDA_EMULATION only): two or four ranks in one process, each a training session on
// its own CUDA provider with the NCCL communicator on its stream, as `cleave train --device
// cuda` sets them up. NCCL is the emulation's (tests/cuda_emu/nccl.cc): the ranks' collectives
// and messages meet when their streams reach them, and every stream runs apart from the host
// and from the others, so what the provider, the NCCL communicator's events and the
// asynchronous collectives leave unordered races here as on GPUs.
// After two steps every rank's parameters equal the same plan's on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/simulated_communicator.h"
#include "providers/cuda/cuda_provider.h"
#include "runtime/inference_session.h"
#include "runtime/nccl_communicator.h"
#include "runtime/profiler.h"
#include "tests/partition_test_util.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

struct TrainedRanks {
  std::vector<std::vector<Tensor>> params;  // [rank]
  std::vector<std::vector<float>> losses;   // [rank][step]
  size_t async_collectives = 0;              // rank 0's
  std::string warnings;                      // rank 0's session's (nodes that fell back)
  // Rank 0's profile (CUDA: every rank profiles its steps, communication timed on the device).
  std::vector<runtime::Profiler::Event> events;
  std::vector<std::string> tracks;
  // Per rank, what its second step's TrainStep or PipelineStep asked of the device (CUDA).
  std::vector<cuda_emu::HostCalls> step_calls;
};

TrainedRanks Train(const trainer::PlanConfig& c, DeviceChoice device) {
  TrainedRanks out;
  auto plan = trainer::BuildPlan(c);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return out;
  const int world_size = plan->mesh.world_size();
  const int64_t data_parallel = c.mesh.find("dp=2") != std::string::npos ? 2 : 1;  // the batch is split over dp
  out.params.resize(static_cast<size_t>(world_size));
  out.losses.resize(static_cast<size_t>(world_size));
  out.step_calls.resize(static_cast<size_t>(world_size));
  runtime::SimulatedWorld world(world_size);
  std::vector<absl::Status> status(static_cast<size_t>(world_size));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world_size; ++r)
    ranks.emplace_back([&, r] {
      absl::Status& st = status[static_cast<size_t>(r)];
      trainer::TrainingSessionOptions o;
      o.intra_op_threads = 1;
      o.device = device;
      o.communicator = world.rank(r);
      std::unique_ptr<runtime::NcclCommunicator> nccl;
      if (device == DeviceChoice::kCuda) {
        // As `cleave train --device cuda`: the rank's provider, and NCCL on its stream,
        // bootstrapped over the host communicator.
        std::string warning;
        auto provider = InferenceSession::MakeDeviceProvider(device, 0, &warning);
        if (!provider.ok() || !*provider) {
          st = provider.ok() ? absl::InternalError("no CUDA provider: " + warning) : provider.status();
          return;
        }
        o.device_provider = *provider;
        // The communicator's streams (its collectives' and its message channels') fall behind
        // the compute stream and the host: what their events do not order reads stale data.
        cuda_emu::SetNewStreamLag(std::chrono::microseconds(300));
        auto made = runtime::NcclCommunicator::Create(
            world.rank(r), 0, static_cast<providers::CudaExecutionProvider*>(provider->get())->stream(),
            std::chrono::seconds(60));
        if (!made.ok()) {
          st = made.status();
          return;
        }
        nccl = std::move(*made);
        o.device_communicator = nccl.get();
      }
      const std::vector<trainer::TrainingSession::PipelineWork> work = trainer::PipelineWorkFor(*plan, r);
      auto s = trainer::TrainingSession::Create(std::move(plan->ranks[static_cast<size_t>(r)].artifacts), o);
      if (!s.ok()) {
        st = s.status();
        return;
      }
      if (r == 0) out.warnings = (*s)->warnings();
      runtime::Profiler profiler(absl::StrCat("rank ", r), r);
      if (device == DeviceChoice::kCuda) (*s)->set_profiler(&profiler);
      for (int step = 0; step < 2 && st.ok(); ++step) {
        const std::vector<Feeds> micro =
            testing::MicroBatches(c.microbatches, c.batch / c.microbatches / data_parallel, c.seq, step, r);
        cuda_emu::ThisThreadCalls() = {};
        auto loss = (*s)->pipelined() ? (*s)->PipelineStep(work, micro) : (*s)->TrainStep(micro[0]);
        out.step_calls[static_cast<size_t>(r)] = cuda_emu::ThisThreadCalls();
        if (!loss.ok()) {
          st = loss.status();
          break;
        }
        out.losses[static_cast<size_t>(r)].push_back(*loss);
        st = (*s)->OptimizerStep().status();
      }
      if (r == 0) {
        out.async_collectives = (*s)->async_collectives().size();
        out.events = profiler.events();
        out.tracks = profiler.tracks();
      }
      (*s)->set_profiler(nullptr);
      for (const std::string& p : (*s)->parameter_names())
        out.params[static_cast<size_t>(r)].push_back(*(*s)->GetState(p));
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world_size; ++r)
    EXPECT_TRUE(status[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << status[static_cast<size_t>(r)];
  return out;
}

class CudaEmulatedRanks : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaEmulatedRanks, PartitionedTrainingOnCudaProvidersEqualsTheCpu) {
  trainer::PlanConfig c = testing::TinyGptPlanConfig(GetParam());
  c.bucket_bytes = 16 << 10;  // several buckets: the first reduce while the backward goes on
  const TrainedRanks cpu = Train(c, DeviceChoice::kCpu);
  const TrainedRanks cuda = Train(c, DeviceChoice::kCuda);
  ASSERT_EQ(cuda.params.size(), cpu.params.size());
  ASSERT_GE(cpu.params.size(), 2u);
  EXPECT_GT(cuda.async_collectives, 0u) << "the collectives or messages ran asynchronously on the device";
  double worst = 0;
  for (size_t r = 0; r < cpu.params.size(); ++r) {
    ASSERT_EQ(cuda.params[r].size(), cpu.params[r].size()) << "rank " << r;
    ASSERT_FALSE(cpu.params[r].empty());
    for (size_t i = 0; i < cpu.params[r].size(); ++i) {
      const Tensor& a = cuda.params[r][i];
      const Tensor& b = cpu.params[r][i];
      ASSERT_EQ(a.dims(), b.dims()) << "rank " << r << " parameter " << i;
      ASSERT_EQ(a.dtype(), DataType::kFloat32);
      for (int64_t k = 0; k < b.numel(); ++k) {
        const double d = std::abs(static_cast<double>(a.data<float>()[k]) - b.data<float>()[k]);
        worst = std::max(worst, d);
        // AdamW moves a weight by about lr (1e-3) whatever the gradient's size, so a weight whose
        // gradient is near zero takes rounding differences into its update: 1e-4 is a tenth of a step.
        ASSERT_LE(d, 1e-4 + 1e-4 * std::abs(b.data<float>()[k])) << "rank " << r << " parameter " << i << " [" << k
                                                                  << "]";
      }
    }
    // The step's work stays on the device (activations a pipeline stage keeps for its backward
    // among it): the host reads back at most each micro-batch's loss.
    EXPECT_LE(cuda.step_calls[r].copies_to_host, std::max<int64_t>(c.microbatches, 1))
        << "rank " << r << " brought tensors to the host";
    ASSERT_EQ(cuda.losses[r].size(), 2u);
    for (size_t step = 0; step < 2; ++step) {
      if (std::isnan(cpu.losses[r][step])) {  // a first pipeline stage has no loss
        EXPECT_TRUE(std::isnan(cuda.losses[r][step])) << "rank " << r << " step " << step;
        continue;
      }
      EXPECT_NEAR(cuda.losses[r][step], cpu.losses[r][step], 1e-4 * std::abs(cpu.losses[r][step]))
          << "rank " << r << " step " << step;
    }
  }
  std::printf("%s: largest parameter difference from the CPU after 2 steps: %.2e\n", GetParam(), worst);
  // The communication is on the profile with its time on the device: data parallelism's
  // gradient reductions, tensor parallelism's collectives, the pipeline's messages, each
  // beside the CUDA stream's kernels, and (dp) some of them while the stream computes.
  auto track = [&](const std::string& name) {
    return static_cast<int>(std::find(cuda.tracks.begin(), cuda.tracks.end(), name) - cuda.tracks.begin());
  };
  const int stream = track("CUDAExecutionProvider stream");
  const std::string mesh = GetParam();
  const int comm = track(mesh == "dp=2" ? "gradient reduction" : "collectives");
  std::vector<const runtime::Profiler::Event*> comm_events, kernels;
  for (const auto& e : cuda.events) {
    if (e.track == comm) comm_events.push_back(&e);
    if (e.track == stream) kernels.push_back(&e);
  }
  ASSERT_FALSE(kernels.empty()) << "kernels timed on the stream";
  ASSERT_FALSE(comm_events.empty()) << "communication on the profile";
  int64_t overlap_us = 0;
  for (const auto* e : comm_events) {
    EXPECT_NE(std::find(e->args.begin(), e->args.end(), std::make_pair(std::string("timed"), std::string("on the device"))),
              e->args.end())
        << e->name;
    for (const auto* k : kernels)
      overlap_us += std::max<int64_t>(0, std::min(e->start_us + e->duration_us, k->start_us + k->duration_us) -
                                             std::max(e->start_us, k->start_us));
  }
  std::printf("%s: %zu communication events on the profile, %lld us of them beside kernels\n", GetParam(),
              comm_events.size(), static_cast<long long>(overlap_us));
  if (mesh == "dp=2") {
    EXPECT_GT(overlap_us, 0) << "a gradient reduction overlapped the backward's kernels";
  }
  EXPECT_EQ(cuda.warnings, "") << "every node runs on the device";
}

INSTANTIATE_TEST_SUITE_P(Meshes, CudaEmulatedRanks, ::testing::Values("dp=2", "tp=2", "pp=2", "dp=2,tp=2", "tp=2,pp=2"),
                         [](const auto& info) {
                           std::string name;
                           for (char ch : std::string(info.param))
                             if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
                           return name;
                         });

// The NCCL communicator's messages between two ranks in a 1F1B order (stage 0 sends two
// activations before it receives the first gradient; stage 1 sends that gradient before it
// receives the second activation), each rank's compute stream writing the next message over
// the last one's memory at once. Over one blocking stream per rank this deadlocks: stage 0's
// second send waits for a receive stage 1 queues behind its own send. Every message arrives
// intact, and nothing times out.
TEST(CudaEmulatedRanks, OneFOneBMessagesNeitherDeadlockNorReadReusedMemory) {
  constexpr int kN = 1024;
  runtime::SimulatedWorld world(2);
  std::vector<absl::Status> status(2);
  std::vector<std::vector<float>> received(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      absl::Status& st = status[static_cast<size_t>(r)];
      cudaStream_t compute = nullptr;
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
      cuda_emu::SetNewStreamLag(std::chrono::microseconds(2000));  // the channels fall behind
      auto nccl = runtime::NcclCommunicator::Create(world.rank(r), 0, compute, std::chrono::seconds(10));
      if (!nccl.ok()) {
        st = nccl.status();
        return;
      }
      float *buf = nullptr, *in = nullptr;
      cudaMalloc(&buf, kN * 4);
      cudaMalloc(&in, 2 * kN * 4);
      const int64_t dims[1] = {kN};
      auto message = [&](float v) {  // the compute stream fills `buf` with v
        std::vector<float> h(kN, v);
        cudaMemcpyAsync(buf, h.data(), kN * 4, cudaMemcpyHostToDevice, compute);
        return TensorView(buf, DataType::kFloat32, dims);
      };
      auto into = [&](int i) { return TensorView(in + i * kN, DataType::kFloat32, dims); };
      Communicator& c = **nccl;
      if (r == 0) {  // F0 F1 B0 B1
        st.Update(c.Send(message(1), 1, 0));
        st.Update(c.Send(message(2), 1, 1));
        st.Update(c.Recv(into(0), 1, 2));
        st.Update(c.Recv(into(1), 1, 3));
      } else {  // F0 B0 F1 B1
        st.Update(c.Recv(into(0), 0, 0));
        st.Update(c.Send(message(10), 0, 2));
        st.Update(c.Recv(into(1), 0, 1));
        st.Update(c.Send(message(20), 0, 3));
      }
      st.Update(c.Synchronize());
      std::vector<float>& back = received[static_cast<size_t>(r)];
      back.resize(2 * kN);
      cudaStreamSynchronize(compute);
      cudaMemcpy(back.data(), in, 2 * kN * 4, cudaMemcpyDeviceToHost);
      nccl->reset();
      cudaFree(buf);
      cudaFree(in);
      cudaStreamDestroy(compute);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << status[r];
  const float expect[2][2] = {{10, 20}, {1, 2}};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < kN; ++k)
        ASSERT_EQ(received[static_cast<size_t>(r)][static_cast<size_t>(i * kN + k)], expect[r][i])
            << "rank " << r << " message " << i << " [" << k << "]";
}

// A peer that stops taking part (it leaves after the first all-reduce, as a dead process
// does): the other rank's next all-reduce ends with an error naming the rank and the operation
// within the timeout, and the compute stream that waited on it drains.
TEST(CudaEmulatedRanks, DeadPeerEndsTheCollectiveWithAnError) {
  runtime::SimulatedWorld world(2);
  absl::Status survivor;
  std::vector<std::thread> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      cudaStream_t compute = nullptr;
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
      auto nccl = runtime::NcclCommunicator::Create(world.rank(r), 0, compute, std::chrono::seconds(2));
      ASSERT_TRUE(nccl.ok()) << nccl.status();
      float* buf = nullptr;
      cudaMalloc(&buf, 64);
      const int64_t dims[1] = {16};
      const int group[2] = {0, 1};
      TensorView v(buf, DataType::kFloat32, dims);
      absl::Status first = (*nccl)->AllReduce(v, v, ReduceOp::kSum, group);  // both: the communicator is made
      if (first.ok()) first = (*nccl)->Synchronize();
      ASSERT_TRUE(first.ok()) << first;
      if (r == 0) {
        absl::Status s = (*nccl)->AllReduce(v, v, ReduceOp::kSum, group);
        if (s.ok()) s = (*nccl)->Synchronize();
        survivor = s;
        EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      }
      nccl->reset();  // rank 1 never joins the second all-reduce: its communicator ends unfinished
      cudaFree(buf);
      cudaStreamDestroy(compute);
    });
  for (auto& t : ranks) t.join();
  EXPECT_FALSE(survivor.ok());
  EXPECT_NE(survivor.message().find("rank 0"), std::string::npos) << survivor;
  EXPECT_NE(survivor.message().find("ranks [0,1]"), std::string::npos) << survivor;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace cleave
