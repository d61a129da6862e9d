// Default capability query: a node is claimed when the op table resolves its version and the
// kernel table has a row for (op, version, dtypes) (providers/).
#include "providers/execution_provider.h"

#include <vector>

#include "graph/op_table.h"

namespace cleave::providers {

absl::Status ExecutionProvider::Zero(TensorView& dst) const {
  std::vector<char> zeros(dst.nbytes(), 0);
  TensorView src(zeros.data(), dst.dtype, dst.dim_span());
  return CopyTensor(src, dst);
}

Capability ExecutionProvider::GetCapability(const graph::Graph& graph) const {
  Capability cap;
  for (const auto& n : graph.nodes()) {
    auto op = graph::ResolveNode(graph, *n);
    if (!op.ok()) {
      cap.rejected.push_back({n.get(), std::string(op.status().message())});
      continue;
    }
    std::string why;
    const KernelDef* k = registry_.Find(*n, op->version, &why);
    if (k) cap.claimed.push_back({n.get(), op->version, k});
    else cap.rejected.push_back({n.get(), absl::StrCat(n->Describe(), ": ", why)});
  }
  return cap;
}

absl::StatusOr<std::unique_ptr<OpKernel>> ExecutionProvider::CreateKernel(
    const NodeCapability& c) const {
  return c.kernel->create(*c.node, c.version);
}

}  // namespace cleave::providers
