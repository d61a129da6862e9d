// CPU kernels of the ai.cleave collectives (providers/cpu/): AllReduce, AllGather,
// ReduceScatter, AllToAll, Send and Recv. They call the Communicator the session gave the
// provider; a graph with collectives run without one fails with a clear error. Gathers and
// scatters along a tensor axis other than 0 rearrange through scratch around a flat call.
#include <cstring>

#include "absl/strings/str_join.h"
#include "base/fixed_vector.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "providers/collective_attrs.h"
#include "providers/communicator.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

absl::StatusOr<Communicator*> Comm(KernelContext& ctx, const GroupAttrs& g) {
  Communicator* c = ctx.communicator();
  if (!c)
    return absl::FailedPreconditionError(absl::StrCat("a collective over ranks [", absl::StrJoin(g.ranks, ","),
                                                      "] needs a communicator; run the graph from a distributed "
                                                      "session (one rank of a partitioned plan)"));
  return c;
}

// Element layout of x around `axis`: outer (dims before), mid (the axis), inner (after), in
// bytes for inner.
struct Split3 {
  int64_t outer = 1, mid = 1;
  size_t inner_bytes = 0;
};
absl::StatusOr<Split3> SplitAt(const TensorView& x, int64_t axis) {
  if (axis < 0) axis += x.rank;
  if (axis < 0 || axis >= x.rank) return InvalidArgument("axis ", axis, " is out of range for rank ", x.rank);
  Split3 s;
  int64_t inner = 1;
  for (int i = 0; i < x.rank; ++i) {
    if (i < axis) s.outer *= x.dims[i];
    else if (i == axis) s.mid = x.dims[i];
    else inner *= x.dims[i];
  }
  s.inner_bytes = static_cast<size_t>(inner) * ElementSize(x.dtype);
  return s;
}

class AllReduceKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(GroupAttrs g, GroupAttrs::Read(n));
    return std::unique_ptr<OpKernel>(new AllReduceKernel(std::move(g)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(Communicator * c, Comm(ctx, g_));
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return c->AllReduce(x, *y, g_.op, g_.ranks);
  }

 private:
  explicit AllReduceKernel(GroupAttrs g) : g_(std::move(g)) {}
  GroupAttrs g_;
};

class AllGatherKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(GroupAttrs g, GroupAttrs::Read(n));
    return std::unique_ptr<OpKernel>(new AllGatherKernel(std::move(g)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(Communicator * c, Comm(ctx, g_));
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(Split3 s, SplitAt(x, g_.axis));
    const int64_t n = static_cast<int64_t>(g_.ranks.size());
    DimVector dims(x.dim_span());
    const int axis = static_cast<int>(g_.axis < 0 ? g_.axis + x.rank : g_.axis);
    dims[axis] *= n;
    TensorView* y = ctx.Output(0, std::span<const int64_t>(dims.data(), dims.size()));
    if (!y) return absl::OkStatus();
    if (s.outer == 1) return c->AllGather(x, *y, g_.ranks);  // rank-major is already the layout
    // Gather rank-major into scratch, then interleave the ranks' blocks along the axis.
    char* tmp = static_cast<char*>(ctx.Scratch(y->nbytes()));
    if (!tmp) return NoScratch();
    std::vector<int64_t> flat = {y->numel()};
    RETURN_IF_ERROR(c->AllGather(x, TensorView(tmp, x.dtype, flat), g_.ranks));
    // A device communicator may still be gathering (host ones have finished): the blocks
    // are read only after it.
    RETURN_IF_ERROR(c->JoinCompute());
    const size_t block = static_cast<size_t>(s.mid) * s.inner_bytes;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < s.outer; ++o)
        std::memcpy(static_cast<char*>(y->data) + (o * n + r) * block, tmp + (r * s.outer + o) * block, block);
    return absl::OkStatus();
  }

 private:
  explicit AllGatherKernel(GroupAttrs g) : g_(std::move(g)) {}
  GroupAttrs g_;
};

class ReduceScatterKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(GroupAttrs g, GroupAttrs::Read(n));
    return std::unique_ptr<OpKernel>(new ReduceScatterKernel(std::move(g)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(Communicator * c, Comm(ctx, g_));
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(Split3 s, SplitAt(x, g_.axis));
    const int64_t n = static_cast<int64_t>(g_.ranks.size());
    const int axis = static_cast<int>(g_.axis < 0 ? g_.axis + x.rank : g_.axis);
    if (s.mid % n != 0)
      return InvalidArgument("ReduceScatter over ", n, " ranks: axis ", axis, " of ", DimsToString(x.dim_span()),
                             " does not divide");
    DimVector dims(x.dim_span());
    dims[axis] /= n;
    TensorView* y = ctx.Output(0, std::span<const int64_t>(dims.data(), dims.size()));
    if (!y) return absl::OkStatus();
    if (s.outer == 1) return c->ReduceScatter(x, *y, g_.op, g_.ranks);
    // Make the input rank-major (chunk r = every outer block's r-th slice), then scatter.
    char* tmp = static_cast<char*>(ctx.Scratch(x.nbytes()));
    if (!tmp) return NoScratch();
    const size_t block = static_cast<size_t>(s.mid / n) * s.inner_bytes;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < s.outer; ++o)
        std::memcpy(tmp + (r * s.outer + o) * block, static_cast<const char*>(x.data) + (o * n + r) * block, block);
    std::vector<int64_t> flat = {x.numel()};
    return c->ReduceScatter(TensorView(tmp, x.dtype, flat), *y, g_.op, g_.ranks);
  }

 private:
  explicit ReduceScatterKernel(GroupAttrs g) : g_(std::move(g)) {}
  GroupAttrs g_;
};

class AllToAllKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(GroupAttrs g, GroupAttrs::Read(n));
    return std::unique_ptr<OpKernel>(new AllToAllKernel(std::move(g)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(Communicator * c, Comm(ctx, g_));
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return c->AllToAll(x, *y, g_.ranks);
  }

 private:
  explicit AllToAllKernel(GroupAttrs g) : g_(std::move(g)) {}
  GroupAttrs g_;
};

// Send(x) -> done: a bool scalar the schedule can order later work on.
class SendKernel : public OpKernel {
 public:
  SendKernel(const graph::Node& n, int)
      : peer_(static_cast<int>(n.AttrInt("peer", -1))), tag_(static_cast<int>(n.AttrInt("tag", 0))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    Communicator* c = ctx.communicator();
    if (!c) return absl::FailedPreconditionError(absl::StrCat("Send to rank ", peer_, " needs a communicator"));
    RETURN_IF_ERROR(c->Send(*ctx.input(0), peer_, tag_));
    TensorView* done = ctx.Output(0, std::span<const int64_t>());
    if (done) *done->as<bool>() = true;
    return absl::OkStatus();
  }

 private:
  int peer_, tag_;
};

// Recv([after]) -> y of the attribute shape and dtype.
class RecvKernel : public OpKernel {
 public:
  RecvKernel(const graph::Node& n, int)
      : peer_(static_cast<int>(n.AttrInt("peer", -1))),
        tag_(static_cast<int>(n.AttrInt("tag", 0))),
        dims_(n.AttrInts("shape")) {}
  absl::Status Compute(KernelContext& ctx) const override {
    Communicator* c = ctx.communicator();
    if (!c) return absl::FailedPreconditionError(absl::StrCat("Recv from rank ", peer_, " needs a communicator"));
    TensorView* y = ctx.Output(0, dims_);
    if (!y) return absl::OkStatus();
    return c->Recv(*y, peer_, tag_);
  }

 private:
  int peer_, tag_;
  std::vector<int64_t> dims_;
};

}  // namespace

void RegisterCollectiveKernels(KernelRegistry& r) {
  const char* const c = graph::kCleaveDomain;
  const std::vector<DataType> numeric = {DataType::kFloat32, DataType::kFloat64, DataType::kInt64, DataType::kInt32};
  r.Register({c, "AllReduce", 1, 1, InputTypeIn(0, numeric), MakeCheckedFactory<AllReduceKernel>()});
  // Gathering moves bytes: bf16 / fp16 too (mixed precision gathers the next product's operands).
  std::vector<DataType> any_float = numeric;
  any_float.insert(any_float.end(), {DataType::kBFloat16, DataType::kFloat16});
  r.Register({c, "AllGather", 1, 1, InputTypeIn(0, any_float), MakeCheckedFactory<AllGatherKernel>()});
  r.Register({c, "ReduceScatter", 1, 1, InputTypeIn(0, numeric), MakeCheckedFactory<ReduceScatterKernel>()});
  r.Register({c, "AllToAll", 1, 1, InputTypeIn(0, numeric), MakeCheckedFactory<AllToAllKernel>()});
  r.Register({c, "Send", 1, 1, InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64, DataType::kInt64, DataType::kInt32,
                                                DataType::kBool, DataType::kBFloat16, DataType::kFloat16}),
              MakeFactory<SendKernel>()});
  r.Register({c, "Recv", 1, 1, nullptr, MakeFactory<RecvKernel>()});
}

}  // namespace cleave::providers
