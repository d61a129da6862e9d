// Pass driver with verification after each pass (graph/passes/).
#include "graph/passes/pass.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/passes/rewrite.h"
#include "graph/verifier.h"

namespace cleave::graph {

absl::StatusOr<bool> RunPass(Pass& pass, Graph* g) {
  ASSIGN_OR_RETURN(bool changed, pass.Run(g));
#ifdef CLEAVE_VERIFY_PASSES
  if (changed) {
    absl::Status s = Verify(*g);
    if (!s.ok()) return Internal("after pass ", pass.name(), ": ", s.message());
  }
#endif
  return changed;
}

absl::StatusOr<bool> RewriteToFixedPoint(Graph* g, const std::function<bool(Graph*, Node*)>& rewrite) {
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    for (const auto& owned : g->nodes()) {
      if (rewrite(g, owned.get())) {
        changed = again = true;
        break;
      }
    }
  }
  if (changed) RETURN_IF_ERROR(g->SortTopologically());
  return changed;
}

absl::Status RunToFixedPoint(const std::vector<Pass*>& passes, Graph* g, int max_rounds) {
  for (int round = 0; round < max_rounds; ++round) {
    bool any = false;
    for (Pass* p : passes) {
      ASSIGN_OR_RETURN(bool changed, RunPass(*p, g));
      if (changed) {
        RETURN_IF_ERROR(InferShapes(*g));
        any = true;
      }
    }
    if (!any) break;
  }
  return absl::OkStatus();
}

}  // namespace cleave::graph
