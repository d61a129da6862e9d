// The CUDA provider's collective and point-to-point kernels (providers/cuda/): ai.cleave
// AllReduce, AllGather, ReduceScatter, AllToAll, Send and Recv over a communicator whose
// buffers are device memory (NCCL). The communicator orders its own stream after the
// provider's compute stream and the compute stream after the operation, so the kernels only
// arrange the data: a gather or scatter along an inner axis goes through device scratch with
// pitched copies.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "providers/collective_attrs.h"
#include "providers/communicator.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

class CollectiveKernel : public OpKernel {
 public:
  CollectiveKernel(const CudaExecutionProvider* p, const graph::Node& n, GroupAttrs g)
      : p_(p), name_(n.Describe()), op_(n.op_type()), g_(std::move(g)) {}

  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n) {
    ASSIGN_OR_RETURN(GroupAttrs g, GroupAttrs::Read(n));
    return std::unique_ptr<OpKernel>(new CollectiveKernel(p, n, std::move(g)));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    Communicator* c = ctx.communicator();
    if (!c || !c->device_memory())
      return absl::FailedPreconditionError(absl::StrCat(name_, ": the CUDA provider's collectives need a device "
                                                        "communicator (NCCL)"));
    const TensorView& x = *ctx.input(0);
    const int64_t n = static_cast<int64_t>(g_.ranks.size());
    if (op_ == "AllReduce") {
      TensorView* y = ctx.Output(0, x.dim_span());
      return y ? Named(c->AllReduce(x, *y, g_.op, g_.ranks)) : absl::OkStatus();
    }
    if (op_ == "AllToAll") {
      TensorView* y = ctx.Output(0, x.dim_span());
      return y ? Named(c->AllToAll(x, *y, g_.ranks)) : absl::OkStatus();
    }
    const int axis = static_cast<int>(g_.axis < 0 ? g_.axis + x.rank : g_.axis);
    if (axis < 0 || axis >= x.rank) return InvalidArgument(name_, ": axis ", g_.axis, " is out of range for rank ", x.rank);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.dims[d];
    for (int d = axis + 1; d < x.rank; ++d) inner *= x.dims[d];
    const size_t es = ElementSize(x.dtype);
    std::vector<int64_t> dims(x.dims, x.dims + x.rank);
    auto stream = static_cast<cudaStream_t>(p_->stream());
    if (op_ == "AllGather") {
      dims[axis] *= n;
      TensorView* y = ctx.Output(0, dims);
      if (!y) return absl::OkStatus();
      if (outer == 1) return Named(c->AllGather(x, *y, g_.ranks));
      // Gather rank-major into scratch, then put rank r's blocks at r along the axis.
      void* tmp = ctx.Scratch(y->nbytes());
      if (!tmp) return NoScratch();
      std::vector<int64_t> flat = {y->numel()};
      RETURN_IF_ERROR(Named(c->AllGather(x, TensorView(tmp, x.dtype, flat), g_.ranks)));
      // The copies below run on the compute stream: over a deferred communicator (an
      // asynchronous collective) it must first be ordered after the gather.
      RETURN_IF_ERROR(Named(c->JoinCompute()));
      const size_t block = static_cast<size_t>(x.dims[axis] * inner) * es;
      for (int64_t r = 0; r < n; ++r)
        RETURN_IF_ERROR(CudaStatus(cudaMemcpy2DAsync(static_cast<char*>(y->data) + r * block, n * block,
                                                     static_cast<char*>(tmp) + r * outer * block, block, block, outer,
                                                     cudaMemcpyDeviceToDevice, stream),
                                   name_));
      return absl::OkStatus();
    }
    // ReduceScatter.
    if (x.dims[axis] % n != 0)
      return InvalidArgument(name_, ": axis ", axis, " of ", DimsToString(x.dim_span()), " does not divide over ", n,
                             " ranks");
    dims[axis] /= n;
    TensorView* y = ctx.Output(0, dims);
    if (!y) return absl::OkStatus();
    if (outer == 1) return Named(c->ReduceScatter(x, *y, g_.op, g_.ranks));
    void* tmp = ctx.Scratch(x.nbytes());
    if (!tmp) return NoScratch();
    const size_t block = static_cast<size_t>(dims[axis] * inner) * es;
    for (int64_t r = 0; r < n; ++r)
      RETURN_IF_ERROR(CudaStatus(cudaMemcpy2DAsync(static_cast<char*>(tmp) + r * outer * block, block,
                                                   static_cast<const char*>(x.data) + r * block, n * block, block,
                                                   outer, cudaMemcpyDeviceToDevice, stream),
                                 name_));
    std::vector<int64_t> flat = {x.numel()};
    return Named(c->ReduceScatter(TensorView(tmp, x.dtype, flat), *y, g_.op, g_.ranks));
  }

 private:
  absl::Status Named(absl::Status s) const {
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
  }
  const CudaExecutionProvider* p_;
  std::string name_, op_;
  GroupAttrs g_;
};

// Send(x) -> done (a bool scalar set on the device); Recv([after]) -> y of the attribute shape.
class PointToPointKernel : public OpKernel {
 public:
  PointToPointKernel(const CudaExecutionProvider* p, const graph::Node& n)
      : p_(p), name_(n.Describe()), send_(n.op_type() == "Send"), peer_(static_cast<int>(n.AttrInt("peer", -1))),
        tag_(static_cast<int>(n.AttrInt("tag", 0))), dims_(n.AttrInts("shape")) {}
  absl::Status Compute(KernelContext& ctx) const override {
    Communicator* c = ctx.communicator();
    if (!c || !c->device_memory())
      return absl::FailedPreconditionError(absl::StrCat(name_, ": needs a device communicator (NCCL)"));
    if (send_) {
      absl::Status s = c->Send(*ctx.input(0), peer_, tag_);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
      TensorView* done = ctx.Output(0, std::span<const int64_t>());
      if (done)
        return CudaStatus(cudaMemsetAsync(done->data, 1, 1, static_cast<cudaStream_t>(p_->stream())), name_);
      return absl::OkStatus();
    }
    TensorView* y = ctx.Output(0, dims_);
    if (!y) return absl::OkStatus();
    absl::Status s = c->Recv(*y, peer_, tag_);
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
  }

 private:
  const CudaExecutionProvider* p_;
  std::string name_;
  bool send_;
  int peer_, tag_;
  std::vector<int64_t> dims_;
};

}  // namespace

void RegisterCudaCollectives(KernelRegistry& r, CudaExecutionProvider* p) {
  // Claimed only when this rank's communicator moves device memory; otherwise the CPU provider
  // runs them on host copies.
  auto device_comm = [p](const graph::Node&, int) -> std::string {
    return p->communicator() && p->communicator()->device_memory() ? "" : "no device communicator (NCCL)";
  };
  const std::string C(graph::kCleaveDomain);
  for (const char* op : {"AllReduce", "AllGather", "ReduceScatter", "AllToAll"}) {
    KernelDef d;
    d.domain = C;
    d.op = op;
    d.supports = device_comm;
    d.create = [p](const graph::Node& n, int) { return CollectiveKernel::Create(p, n); };
    r.Register(std::move(d));
  }
  for (const char* op : {"Send", "Recv"}) {
    KernelDef d;
    d.domain = C;
    d.op = op;
    d.supports = device_comm;
    d.create = [p](const graph::Node& n, int) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
      return std::unique_ptr<OpKernel>(new PointToPointKernel(p, n));
    };
    r.Register(std::move(d));
  }
}

}  // namespace cleave::providers
