// The base of the CUDA provider's kernels (providers/cuda/): a kernel knows its provider (for
// the stream and scratch) and names its node in errors; Add registers a kernel class. Shared by
// the kernel table's files (cuda_kernels.cc, cuda_attention_kernels.cc, cuda_axis_kernels.cc,
// cuda_conv_kernels.cc, cuda_loss_kernels.cc, cuda_optimizer_kernels.cc); included by those only.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "kernels/cuda/kernels.h"
#include "providers/cuda/cuda_provider.h"
#include "providers/kernel.h"

namespace cleave::providers {

namespace kc = kernels::cuda;

inline const std::vector<DataType> kFloats = {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16};

inline kc::Dt DtOf(DataType t) {
  return t == DataType::kBFloat16 ? kc::Dt::kBf16 : t == DataType::kFloat16 ? kc::Dt::kF16 : kc::Dt::kF32;
}

// The kernels' element type of t (float32 for any type it does not name).
inline kc::Elem ElemOf(DataType t) {
  switch (t) {
    case DataType::kBFloat16: return kc::Elem::kBf16;
    case DataType::kFloat16: return kc::Elem::kF16;
    case DataType::kInt64: return kc::Elem::kI64;
    case DataType::kInt32: return kc::Elem::kI32;
    case DataType::kBool: return kc::Elem::kBool;
    case DataType::kFloat64: return kc::Elem::kF64;
    case DataType::kInt8: return kc::Elem::kI8;
    case DataType::kInt16: return kc::Elem::kI16;
    case DataType::kUInt8: return kc::Elem::kU8;
    case DataType::kUInt16: return kc::Elem::kU16;
    case DataType::kUInt32: return kc::Elem::kU32;
    case DataType::kUInt64: return kc::Elem::kU64;
    default: return kc::Elem::kF32;
  }
}

// A kernel of the provider: its stream and errors named after the node.
class CudaKernel : public OpKernel {
 public:
  CudaKernel(const CudaExecutionProvider* p, const graph::Node& n) : p_(p), name_(n.Describe()) {}
  const std::string& name() const { return name_; }
  absl::Status Check(int err) const { return CudaStatus(err, name_); }
  // st with the node's name before its message (its code kept); OK stays OK.
  absl::Status Named(const absl::Status& st) const {
    return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
  }

 protected:
  void* stream() const { return p_->stream(); }
  absl::Status Copy(void* dst, const void* src, size_t bytes) const {
    if (bytes == 0 || dst == src) return absl::OkStatus();
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream())));
  }
  const CudaExecutionProvider* p_;
  std::string name_;
};

// Registers a kernel class K(const CudaExecutionProvider*, const Node&, int version).
template <typename K>
void Add(KernelRegistry& r, CudaExecutionProvider* p, const std::string& domain, const std::string& op, int min_v,
         int max_v, SupportsFn supports, std::vector<int> host_inputs = {}) {
  KernelDef d;
  d.domain = domain;
  d.op = op;
  d.min_version = min_v;
  d.max_version = max_v;
  d.supports = std::move(supports);
  d.create = [p](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new K(p, n, v));
  };
  d.host_inputs = std::move(host_inputs);
  r.Register(std::move(d));
}

// Registers a kernel class made through its static Create(provider, node, version), which
// checks the node's attributes.
template <typename K>
void AddChecked(KernelRegistry& r, CudaExecutionProvider* p, const std::string& domain, const std::string& op,
                int min_v, SupportsFn supports, std::vector<int> host_inputs = {}) {
  KernelDef d;
  d.domain = domain;
  d.op = op;
  d.min_version = min_v;
  d.max_version = 1 << 30;
  d.supports = std::move(supports);
  d.create = [p](const graph::Node& n, int v) { return K::Create(p, n, v); };
  d.host_inputs = std::move(host_inputs);
  r.Register(std::move(d));
}

// Registers the data-movement kernels (cuda_layout_kernels.cc): Concat, Split, Gather, GatherGrad,
// Transpose, Slice, SliceGrad, Expand and the views.
void RegisterCudaLayoutKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers the optimizer kernels (cuda_optimizer_kernels.cc): InPlaceAccumulator, SquaredNorm,
// IsAllFinite, AdamW, SGD and their multi-tensor forms.
void RegisterCudaOptimizerKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers the attention kernels (cuda_attention_kernels.cc): Attention and AttentionGrad.
void RegisterCudaAttentionKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers Conv and ConvGrad, MaxPool, AveragePool, the global pools and their gradients
// (cuda_conv_kernels.cc).
void RegisterCudaConvKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers the kernels along an axis or over padded dims (cuda_axis_kernels.cc): Pad, Tile,
// CumSum, ArgMax, ArgMin, GatherElements and ScatterElements.
void RegisterCudaAxisKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers the kernels over rows (cuda_norm_kernels.cc): Softmax, LogSoftmax, the layer and RMS
// normalisations (with the residual add), their gradients, and the reductions.
void RegisterCudaNormKernels(KernelRegistry& r, CudaExecutionProvider* p);

// Registers the losses (cuda_loss_kernels.cc): SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss
// and their gradients.
void RegisterCudaLossKernels(KernelRegistry& r, CudaExecutionProvider* p);

}  // namespace cleave::providers
