// bf16 and fp16 forms of the CPU's float32 kernels for the ops a mixed-precision training graph
// runs in low precision between its products (providers/cpu/): the bias Add, Gelu, GeluGrad and
// the bias gradient's ReduceSum (ReduceMean and ReduceMax with it), and the convolutions (Conv,
// ConvTranspose and their gradients), which mixed precision runs in low precision as products;
// and Max, Min, Mod, IsInf and IsNaN, which are exact in any precision. Each widens its
// low-precision inputs to float32, runs the float32 kernel and rounds each result once, as the
// CUDA kernels compute (in float32 registers from low-precision storage). The CPU gains no speed
// from these; they make it the reference for the graphs the CUDA provider runs.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/elementwise.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

bool IsLowType(DataType t) { return t == DataType::kBFloat16 || t == DataType::kFloat16; }

// The inner kernel's view of a run: low-precision inputs widened into scratch, and float32
// scratch handed out for low-precision outputs, rounded into them by Finish.
class WideningContext : public KernelContext {
 public:
  explicit WideningContext(KernelContext& outer)
      : outer_(outer), in_(outer.num_inputs()), wide_(outer.num_outputs()), low_(outer.num_outputs(), nullptr) {
    for (int i = 0; i < outer.num_inputs(); ++i) {
      const TensorView* x = outer.input(i);
      if (!x) continue;
      in_[i] = *x;
      if (!IsLowType(x->dtype)) continue;
      in_[i].dtype = DataType::kFloat32;
      in_[i].data = outer.Scratch(in_[i].nbytes());
      if (!in_[i].data) {
        widened_ = false;
        return;
      }
      kernels::cpu::Cast(*x, in_[i], outer.thread_pool());
    }
  }

  int num_inputs() const override { return outer_.num_inputs(); }
  int num_outputs() const override { return outer_.num_outputs(); }
  const TensorView* input(int i) const override { return outer_.input(i) ? &in_[i] : nullptr; }
  TensorView* Output(int i, std::span<const int64_t> dims) override {
    TensorView* y = outer_.Output(i, dims);
    if (!y || !IsLowType(y->dtype)) return y;
    wide_[i] = *y;
    wide_[i].dtype = DataType::kFloat32;
    wide_[i].data = outer_.Scratch(wide_[i].nbytes());
    if (!wide_[i].data) return nullptr;  // the outer context has recorded why
    low_[i] = y;
    return &wide_[i];
  }
  void* Scratch(size_t bytes) override { return outer_.Scratch(bytes); }
  ThreadPool* thread_pool() const override { return outer_.thread_pool(); }
  uint64_t run_seed() const override { return outer_.run_seed(); }
  Communicator* communicator() const override { return outer_.communicator(); }

  // False when an input's float32 copy could not be had.
  bool widened() const { return widened_; }

  void Finish() {
    for (size_t i = 0; i < low_.size(); ++i)
      if (low_[i]) kernels::cpu::Cast(wide_[i], *low_[i], outer_.thread_pool());
  }

 private:
  KernelContext& outer_;
  std::vector<TensorView> in_;
  std::vector<TensorView> wide_;
  std::vector<TensorView*> low_;
  bool widened_ = true;
};

class WideningKernel : public OpKernel {
 public:
  explicit WideningKernel(std::unique_ptr<OpKernel> inner) : inner_(std::move(inner)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    WideningContext wide(ctx);
    if (!wide.widened()) return NoScratch();
    RETURN_IF_ERROR(inner_->Compute(wide));
    wide.Finish();
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<OpKernel> inner_;
};

// Input 0 in bf16 or fp16 and every other input and output of that same type, but a reduction's
// int64 axes and a predicate's (IsInf, IsNaN) bool output.
std::string LowPrecisionOperands(const graph::Node& n, int) {
  const graph::Value* x = n.input(0);
  if (!x || !IsLowType(x->dtype()))
    return absl::StrCat("input 0 '", x ? x->name() : "", "' has dtype ", x ? DataTypeName(x->dtype()) : "none",
                        "; the widening kernel takes bfloat16, float16");
  const bool axes = n.op_type().rfind("Reduce", 0) == 0;
  auto same = [&](const graph::Value* v, const char* kind, int i, bool int64_ok) -> std::string {
    if (!v || v->dtype() == x->dtype() || (int64_ok && v->dtype() == DataType::kInt64)) return "";
    return absl::StrCat(kind, " ", i, " '", v->name(), "' has dtype ", DataTypeName(v->dtype()), " where input 0 has ",
                        DataTypeName(x->dtype()));
  };
  for (int i = 1; i < n.num_inputs(); ++i)
    if (std::string r = same(n.input(i), "input", i, axes && i == 1); !r.empty()) return r;
  const bool predicate = n.op_type() == "IsInf" || n.op_type() == "IsNaN";
  for (int i = 0; i < n.num_outputs(); ++i) {
    if (predicate && n.output(i) && n.output(i)->dtype() == DataType::kBool) continue;
    if (std::string r = same(n.output(i), "output", i, false); !r.empty()) return r;
  }
  return "";
}

std::string GeluForm(const graph::Node& n, int) {
  const std::string a = n.AttrString("approximate", "none");
  return a == "none" || a == "tanh" ? "" : "approximate '" + a + "' is not 'none' or 'tanh'";
}

}  // namespace

void RegisterLowPrecisionKernels(KernelRegistry& r) {
  struct Op {
    const char* domain;
    const char* op;
    bool gelu;
  };
  std::vector<KernelDef> twins;
  for (const Op& o : {Op{"", "Add", false}, Op{"", "Gelu", true}, Op{graph::kCleaveDomain, "Gelu", true},
                      Op{graph::kCleaveDomain, "GeluGrad", true}, Op{"", "ReduceSum", false},
                      Op{"", "ReduceMean", false}, Op{"", "ReduceMax", false}, Op{"", "Conv", false},
                      Op{"", "ConvTranspose", false}, Op{graph::kCleaveDomain, "ConvGrad", false},
                      Op{graph::kCleaveDomain, "ConvTransposeGrad", false}, Op{"", "Max", false},
                      Op{"", "Min", false}, Op{"", "Mod", false}, Op{"", "IsInf", false}, Op{"", "IsNaN", false}}) {
    for (const KernelDef& d : r.defs()) {
      if (d.domain != o.domain || d.op != o.op) continue;
      KernelDef twin = d;
      // A node not in bf16 / fp16 gets the float32 kernel's reason, which names what that takes.
      SupportsFn low = o.gelu ? AllOf({LowPrecisionOperands, GeluForm}) : SupportsFn(LowPrecisionOperands);
      twin.supports = [low, fp32 = d.supports](const graph::Node& n, int v) -> std::string {
        const graph::Value* x = n.input(0);
        if (fp32 && (!x || !IsLowType(x->dtype()))) return fp32(n, v);
        return low(n, v);
      };
      KernelFactory inner = d.create;
      twin.create = [inner](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
        ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> k, inner(n, v));
        return std::unique_ptr<OpKernel>(new WideningKernel(std::move(k)));
      };
      twins.push_back(std::move(twin));
    }
  }
  for (KernelDef& d : twins) r.Register(std::move(d));
}

}  // namespace cleave::providers
