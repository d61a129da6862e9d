// Kernel lookup by (domain, op, version, dtypes) (providers/).
#include "providers/kernel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave::providers {

absl::Status NoScratch() { return absl::ResourceExhaustedError("the kernel's scratch memory could not be had"); }

void KernelRegistry::Register(KernelDef def) { defs_.push_back(std::move(def)); }

const KernelDef* KernelRegistry::Find(const graph::Node& node, int version, std::string* why) const {
  std::string reason;
  bool op_known = false;
  for (const KernelDef& d : defs_) {
    if (d.op != node.op_type() || d.domain != node.domain()) continue;
    op_known = true;
    if (version < d.min_version || version > d.max_version) {
      if (reason.empty()) reason = absl::StrCat("no kernel for version ", version);
      continue;
    }
    std::string r = d.supports ? d.supports(node, version) : "";
    if (r.empty()) return &d;
    reason = r;
  }
  if (why) *why = op_known ? reason : "no kernel for this op";
  return nullptr;
}

bool KernelRegistry::HasOp(const std::string& domain, const std::string& op) const {
  for (const KernelDef& d : defs_)
    if (d.op == op && d.domain == domain) return true;
  return false;
}

SupportsFn InputTypeIn(int i, std::vector<DataType> types) {
  return [i, types](const graph::Node& n, int) -> std::string {
    graph::Value* v = i >= 0 ? n.input(i) : n.output(-i - 1);
    if (!v) return "";
    for (DataType t : types)
      if (v->dtype() == t) return "";
    std::vector<std::string> names;
    for (DataType t : types) names.emplace_back(DataTypeName(t));
    return absl::StrCat(i >= 0 ? "input " : "output ", i >= 0 ? i : -i - 1, " '", v->name(),
                        "' has dtype ", DataTypeName(v->dtype()), "; the kernel takes ",
                        absl::StrJoin(names, ", "));
  };
}

SupportsFn AllOf(std::vector<SupportsFn> fns) {
  return [fns](const graph::Node& n, int v) -> std::string {
    for (const auto& f : fns) {
      std::string r = f(n, v);
      if (!r.empty()) return r;
    }
    return "";
  };
}

}  // namespace cleave::providers
