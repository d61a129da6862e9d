// Rotary embedding fusions (graph/passes/): LLaMA / GPT-NeoX's exported rotate_half pattern ->
// ai.cleave.RotaryEmbedding, and the embedding moved ahead of the head swap before it. Called
// from TransformerFusion and ActivationNormFusion (fusion.cc).
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_table.h"
#include "graph/passes/fusion_match.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

bool Is(const Node* n, const char* op) { return IsOnnxOp(n, op); }

// The [start, end) a Slice (version >= 10, constant cut points, step 1) of `x` takes of x's last
// axis of static size D, clamped; nullopt for any other Slice or node.
std::optional<std::pair<int64_t, int64_t>> LastAxisCut(const Node* s, const Value* x, int64_t D) {
  if (!Is(s, "Slice") || s->input(0) != x || s->num_inputs() < 3) return std::nullopt;
  auto ints = [&](int i) -> std::optional<std::vector<int64_t>> {
    const Value* v = i < s->num_inputs() ? s->input(i) : nullptr;
    if (!v) return std::nullopt;
    if (!v->initializer() || !IsInteger(v->dtype())) return std::vector<int64_t>{};
    return v->initializer()->ToInt64Vector();
  };
  const int r = x->shape().rank();
  auto starts = ints(1), ends = ints(2), axes = ints(3), steps = ints(4);
  if (!starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
  if (axes ? (axes->size() != 1 || ((*axes)[0] != -1 && (*axes)[0] != r - 1)) : r != 1) return std::nullopt;
  if (steps && *steps != std::vector<int64_t>{1}) return std::nullopt;
  auto clamp = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + D : v, 0, D); };
  return std::make_pair(clamp((*starts)[0]), clamp((*ends)[0]));
}

}  // namespace

// x * cos + Concat(Neg(x[..., D/2:]), x[..., :D/2]) * sin over the last axis (rotate_half, as
// LLaMA and GPT-NeoX export rotary embeddings), either operand order in the Muls and the Add,
// cos and sin of x's type and one shape -> ai.cleave.RotaryEmbedding(x, cos, sin). Matched at
// the Concat.
bool FuseRotary(Graph* g, Node* concat) {
  if (!Is(concat, "Concat") || concat->num_inputs() != 2) return false;
  Node* neg = concat->input(0)->producer();
  Node* first = concat->input(1)->producer();
  if (!Is(neg, "Neg") || !SoleUse(concat->input(0)) || !SoleUse(concat->input(1)) || !first) return false;
  Node* second = neg->input(0)->producer();
  if (!second || !SoleUse(neg->input(0))) return false;
  Value* x = first->input(0);
  const Shape& xs = x->shape();
  if (!xs.has_rank() || xs.rank() < 1 || !xs[xs.rank() - 1].is_static() ||
      (x->dtype() != DataType::kFloat32 && x->dtype() != DataType::kFloat64))
    return false;
  const int64_t D = xs[xs.rank() - 1].value, h = D / 2;
  const int64_t axis = concat->AttrInt("axis", 0);
  if (D % 2 != 0 || D == 0 || (axis != -1 && axis != xs.rank() - 1)) return false;
  if (LastAxisCut(first, x, D) != std::make_pair(int64_t{0}, h) || LastAxisCut(second, x, D) != std::make_pair(h, D))
    return false;
  Node* rot_mul = SoleConsumer(concat->output(0));
  if (!Is(rot_mul, "Mul")) return false;
  Value* sin = Other(rot_mul, concat->output(0));
  Node* add = SoleConsumer(rot_mul->output(0));
  if (!sin || !Is(add, "Add")) return false;
  Value* m1 = Other(add, rot_mul->output(0));
  Node* cos_mul = m1 ? m1->producer() : nullptr;
  if (!Is(cos_mul, "Mul") || !SoleUse(m1)) return false;
  Value* cos = Other(cos_mul, x);
  if (!cos || cos == x || cos->dtype() != x->dtype() || sin->dtype() != x->dtype()) return false;
  // cos and sin of one shape, whose products with x (and their sum) keep x's shape: the tables
  // broadcast to x, not x to them (their dims against x's are checked again at run time).
  const Shape &cs = cos->shape(), &ss = sin->shape();
  if (!cs.has_rank() || !ss.has_rank() || cs.rank() != ss.rank() || cs.rank() > xs.rank()) return false;
  for (int k = 0; k < cs.rank(); ++k)
    if (!SameDim(cs[k], ss[k])) return false;
  for (const Value* v : {m1, rot_mul->output(0), add->output(0)}) {
    const Shape& vs = v->shape();
    if (!vs.has_rank() || vs.rank() != xs.rank()) return false;
    for (int k = 0; k < xs.rank(); ++k)
      if (!SameDim(vs[k], xs[k])) return false;
  }
  Replace(g, {first, second, neg, concat, rot_mul, cos_mul, add}, "RotaryEmbedding", {x, cos, sin}, add->output(0));
  return true;
}

namespace {

// `table` (rank <= perm's, broadcasting against y = Transpose(x, perm) from the right) laid
// out to broadcast against x instead: its dim for y's axis i moves to x's axis perm[i]. Where
// its axes keep their order that only inserts unit axes (a [T, D] table against a [B, H, T, D]
// y becomes [T, 1, D] against x's [B, T, H, D]); otherwise its leading unit axes are made
// explicit and it is transposed. The nodes that do it are shared by the readers of one layer
// (`metadata`); constant folding turns them into constants where the table is one.
Value* TableForSource(Graph* g, Value* table, const std::vector<int64_t>& perm,
                      const std::map<std::string, std::string>& metadata) {
  const int r = static_cast<int>(perm.size()), tr = table->shape().rank();
  std::vector<int64_t> pos(tr);
  bool ordered = true;
  for (int a = 0; a < tr; ++a) {
    pos[a] = perm[r - tr + a];
    ordered &= a == 0 || pos[a] > pos[a - 1];
  }
  // The dims of the result and, for each, the table axis it holds (-1: a unit axis).
  const int64_t first = ordered && tr > 0 ? pos[0] : 0;
  std::vector<int> from(r - first, -1);
  for (int a = 0; a < tr; ++a) from[pos[a] - first] = a;
  std::vector<Dim> dims;
  for (int a : from) dims.push_back(a < 0 ? Dim(1) : table->shape()[a]);
  std::string suffix = "/perm";
  for (int64_t p : perm) absl::StrAppend(&suffix, p);
  // A node made earlier for a reader of the same layer.
  for (const auto& [reader, slot] : table->consumers())
    if (reader->name().starts_with(table->name() + suffix) && reader->metadata() == metadata &&
        reader->num_outputs() == 1) {
      Value* v = reader->output(0);
      Node* t = SoleConsumer(v);
      if (IsOnnxOp(t, "Transpose") && t->name().starts_with(table->name() + suffix)) v = t->output(0);
      if (v->shape() == Shape(dims)) return v;
    }
  auto add = [&](const char* op, Value* in, std::vector<Dim> out_dims) {
    Value* out = g->CreateUniqueValue(table->name() + suffix);
    out->set_dtype(table->dtype());
    out->set_shape(Shape(std::move(out_dims)));
    Node* n = g->AddNode(op, {in}, {out}, g->UniqueName(table->name() + suffix));
    n->metadata() = metadata;
    return n;
  };
  // Unsqueeze the unit axes in (an input from opset 13 on, an attribute before).
  std::vector<int64_t> axes;
  std::vector<Dim> unsqueezed;
  if (ordered) {
    for (size_t j = 0; j < from.size(); ++j)
      if (from[j] < 0) axes.push_back(static_cast<int64_t>(j));
    unsqueezed = dims;
  } else {
    for (int j = 0; j < r - tr; ++j) axes.push_back(j), unsqueezed.push_back(Dim(1));
    for (int a = 0; a < tr; ++a) unsqueezed.push_back(table->shape()[a]);
  }
  Value* v = table;
  if (!axes.empty()) {
    Node* u = add("Unsqueeze", v, unsqueezed);
    if (g->OpsetFor("") >= 13) {
      Tensor a(DataType::kInt64, {static_cast<int64_t>(axes.size())});
      for (size_t i = 0; i < axes.size(); ++i) a.data<int64_t>()[i] = axes[i];
      g->SetNodeInput(u, 1, g->AddInitializer(g->UniqueName(table->name() + suffix + "/axes"), std::move(a)));
    } else {
      u->SetAttr("axes", Attribute::Ints(axes));
    }
    v = u->output(0);
  }
  if (ordered) return v;
  std::vector<int64_t> inverse(r);
  for (int i = 0; i < r; ++i) inverse[perm[i]] = i;
  Node* t = add("Transpose", v, dims);
  t->SetAttr("perm", Attribute::Ints(inverse));
  return t->output(0);
}

}  // namespace

// RotaryEmbedding(Transpose(x, perm), cos, sin), perm keeping the last axis, that Transpose read
// by nothing else -> Transpose(RotaryEmbedding(x, cos', sin'), perm), the tables laid out
// against x (TableForSource). The same values: the embedding is elementwise but for its
// rotation within the last axis. LLaMA rotates q and k after swapping them into [B, H, T, D];
// moved ahead of the swap, the swap meets attention directly and folds into its layout
// (AttentionLayoutFusion), as v's does.
bool HoistRotaryOverHeadSwap(Graph* g, Node* rot) {
  if (!IsCleaveOp(rot, "RotaryEmbedding") || rot->num_inputs() != 3 || rot->num_outputs() != 1) return false;
  Value* x = rot->input(0);
  Node* t = x->producer();
  if (!Is(t, "Transpose") || !SoleUse(x) || !t->input(0)->shape().has_rank()) return false;
  Value* src = t->input(0);
  const int r = src->shape().rank();
  const std::vector<int64_t> perm = t->AttrInts("perm", {});
  if (static_cast<int>(perm.size()) != r || r < 2 || perm[r - 1] != r - 1) return false;
  for (Value* table : {rot->input(1), rot->input(2)})
    if (!table->shape().has_rank() || table->shape().rank() > r) return false;
  Value* cos = TableForSource(g, rot->input(1), perm, rot->metadata());
  Value* sin = rot->input(2) == rot->input(1) ? cos : TableForSource(g, rot->input(2), perm, rot->metadata());
  Value* rotated = g->CreateUniqueValue(rot->output(0)->name() + "/unswapped");
  rotated->set_dtype(src->dtype());
  rotated->set_shape(src->shape());
  Value* y = rot->output(0);
  g->RebuildNode(rot, {src, cos, sin}, {rotated});
  g->RebuildNode(t, {rotated}, {y});
  return true;
}

}  // namespace cleave::graph
