// A stand-in device provider for the device sessions' tests (device_placement_test.cc,
// device_bf16_test.cc): the CPU kernels on memory only its arena hands out, so a session runs
// its device placement, copies and device-only passes on any machine; and a bf16 training
// session over it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "providers/arena_allocator.h"
#include "providers/cpu/cpu_provider.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave::testing {

// A stand-in device whose kernels are the CPU's, run on memory that only its arena hands out:
// every input a kernel reads on the device must be in that arena. It claims every op the CPU
// provider has except `host_only`, so training graphs run on it nearly whole.
class CpuKernelDevice : public providers::ExecutionProvider {
 public:
  explicit CpuKernelDevice(std::set<std::string> host_only)
      : arena_(providers::HostArenaBackend(), {.min_region_bytes = 1 << 20}) {
    static const std::map<std::string, std::vector<int>> kHostInputs = {
        {"Reshape", {1}}, {"Unsqueeze", {1}}, {"Squeeze", {1}}, {"ReduceSum", {1}}, {"ReduceMean", {1}},
        {"ReduceMax", {1}}, {"Split", {1}}, {"Slice", {1, 2, 3, 4}}, {"Expand", {1}}, {"ConstantOfShape", {0}},
        {"AdamW", {0, 1, 2}}, {"MultiTensorAdamW", {0, 1, 2}}, {"SGD", {0, 1, 2}}, {"MultiTensorSGD", {0, 1, 2}}, {"InPlaceAccumulator", {2}}, {"Dropout", {1, 2}},
        {"GatherGrad", {0}}, {"SliceGrad", {1, 2, 3, 4, 5}}, {"Trilu", {1}}, {"Range", {0, 1, 2}}};
    for (const providers::KernelDef& cpu : cpu_.registry().defs()) {
      if (host_only.count(cpu.op)) continue;
      providers::KernelDef d = cpu;
      auto it = kHostInputs.find(cpu.op);
      if (it != kHostInputs.end()) d.host_inputs = it->second;
      d.create = [this, create = cpu.create, host = d.host_inputs](const graph::Node& n, int v)
          -> absl::StatusOr<std::unique_ptr<providers::OpKernel>> {
        ASSIGN_OR_RETURN(std::unique_ptr<providers::OpKernel> inner, create(n, v));
        return std::unique_ptr<providers::OpKernel>(new OnDevice(this, std::move(inner), host, n.Describe()));
      };
      registry_.Register(std::move(d));
    }
  }
  std::string name() const override { return "CpuKernelDevice"; }
  providers::DeviceKind device() const override { return providers::DeviceKind::kCuda; }
  providers::Allocator* allocator() override { return &arena_; }
  absl::Status CopyTensor(const TensorView& src, TensorView& dst) const override {
    const bool up = arena_.Owns(dst.data), down = arena_.Owns(src.data);
    if (up == down) return absl::InternalError("a copy that does not cross between host and device");
    std::memcpy(dst.data, src.data, src.nbytes());
    (up ? uploaded : downloaded) += static_cast<int64_t>(src.nbytes());
    return absl::OkStatus();
  }
  const providers::ArenaAllocator& arena() const { return arena_; }
  mutable std::atomic<int64_t> uploaded{0}, downloaded{0};

 private:
  class OnDevice : public providers::OpKernel {
   public:
    OnDevice(const CpuKernelDevice* d, std::unique_ptr<providers::OpKernel> inner, std::vector<int> host, std::string name)
        : d_(d), inner_(std::move(inner)), host_(std::move(host)), name_(std::move(name)) {}
    absl::Status Compute(providers::KernelContext& ctx) const override {
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const TensorView* in = ctx.input(i);
        if (!in || std::count(host_.begin(), host_.end(), i) || in->nbytes() == 0) continue;
        if (!d_->arena_.Owns(in->data))
          return absl::InternalError(absl::StrCat(name_, ": input ", i, " is not in device memory"));
      }
      return inner_->Compute(ctx);
    }

   private:
    const CpuKernelDevice* d_;
    std::unique_ptr<providers::OpKernel> inner_;
    std::vector<int> host_;
    std::string name_;
  };

  providers::CpuExecutionProvider cpu_{1};
  mutable providers::ArenaAllocator arena_;
};

// A bf16 training session of `model` (attention fused, as CUDA training runs it) on the CPU, or
// with `device` on the stand-in device, where the device sessions' fusions run.
inline absl::StatusOr<std::unique_ptr<trainer::TrainingSession>> Bf16Session(const graph::Graph& model,
                                                                      trainer::TrainingSpec spec,
                                                                      std::shared_ptr<CpuKernelDevice> device,
                                                                      std::set<std::string> disabled = {}) {
  spec.precision = trainer::Precision::kBf16;
  spec.fuse_attention = true;
  ASSIGN_OR_RETURN(trainer::TrainingArtifacts a, trainer::BuildTrainingArtifacts(model, spec));
  trainer::TrainingSessionOptions o;
  o.intra_op_threads = 1;
  o.device_provider = std::move(device);
  o.disabled_optimizers = std::move(disabled);
  return trainer::TrainingSession::Create(std::move(a), o);
}

}  // namespace cleave::testing
