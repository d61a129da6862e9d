// Local lowering (partition/): see lower.h.
#include "partition/lower.h"

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::partition {

namespace {

using graph::Attribute;
using graph::Graph;
using graph::Node;
using graph::Value;

std::vector<int64_t> ToInts(const std::vector<int>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

int64_t Parts(const Mesh& mesh, const std::vector<std::string>& axes) {
  int64_t n = 1;
  for (const auto& a : axes) n *= mesh.size(a);
  return n;
}

}  // namespace

absl::StatusOr<Tensor> ShardTensor(const Tensor& t, const Mesh& mesh, const Sharding& s, int rank,
                                   const std::string& name) {
  Shape global = Shape::FromDims(t.dims());
  ASSIGN_OR_RETURN(Shape local, LocalShape(mesh, name, global, s));
  const std::vector<int64_t> ld = local.StaticDims();
  if (ld == t.dims()) return t;
  Tensor out = Tensor::Uninitialized(t.dtype(), ld);
  const int r = t.rank();
  const size_t es = ElementSize(t.dtype());
  std::vector<int64_t> offset(r);
  for (int d = 0; d < r; ++d) offset[d] = ShardOffset(mesh, rank, s, d, t.dims()[d]);
  // Copy the block row by row (the last dim contiguous).
  std::vector<int64_t> src_stride(r, 1);
  for (int d = r - 2; d >= 0; --d) src_stride[d] = src_stride[d + 1] * t.dims()[d + 1];
  const int64_t rows = r == 0 ? 1 : out.numel() / ld[r - 1];
  const size_t row_bytes = (r == 0 ? 1 : ld[r - 1]) * es;
  std::vector<int64_t> idx(r, 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t src = 0;
    for (int d = 0; d < r; ++d) src += (idx[d] + offset[d]) * src_stride[d];
    std::memcpy(out.data<char>() + row * row_bytes, t.data<char>() + src * es, row_bytes);
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[d] < ld[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, Sharding>> PrepareZero1(Graph& opt, const std::vector<std::string>& params,
                                                             const std::vector<std::string>& state_suffixes,
                                                             const Mesh& mesh,
                                                             std::map<std::string, Sharding>* output_wants) {
  std::map<std::string, Sharding> seeds;
  const int d = mesh.size("dp");
  for (const std::string& name : params) {
    Value* grad = opt.FindValue(name + "_grad");
    if (!grad || !grad->shape().is_static())
      return InvalidArgument("the optimizer graph has no static gradient '", name, "_grad'");
    const std::vector<int64_t> dims = grad->shape().StaticDims();
    Sharding partial = Sharding::Replicated(static_cast<int>(dims.size()));
    partial.partial = {"dp"};
    seeds[grad->name()] = partial;
    int split = -1;
    for (size_t k = 0; k < dims.size() && split < 0; ++k)
      if (dims[k] % d == 0) split = static_cast<int>(k);
    if (split < 0) continue;  // too small to shard: replicated update
    Sharding shard = Sharding::Replicated(static_cast<int>(dims.size()));
    shard.dims[split] = {"dp"};
    // The reduce-scatter point: every reader of the gradient reads its shard.
    Value* g_shard = opt.GetOrCreateValue(opt.UniqueName(name + "_grad.shard"));
    auto consumers = grad->consumers();
    Node* id = opt.AddNode("Identity", {grad}, {g_shard}, g_shard->name());
    id->metadata()["role"] = "opt";
    id->metadata()["param"] = name;
    for (auto [node, idx] : consumers) opt.SetNodeInput(node, idx, g_shard);
    g_shard->set_dtype(grad->dtype());
    g_shard->set_shape(grad->shape());
    seeds[g_shard->name()] = shard;
    // The parameter enters and leaves whole (the training graph reads it whole); the update
    // slices this rank's shard.
    seeds[name] = Sharding::Replicated(static_cast<int>(dims.size()));
    for (const std::string& suf : state_suffixes) seeds[name + suf] = shard;
    (*output_wants)[name + ".updated"] = Sharding::Replicated(static_cast<int>(dims.size()));
  }
  RETURN_IF_ERROR(opt.SortTopologically());
  return seeds;
}

absl::StatusOr<LoweredGraph> LowerForRank(const Graph& g, const Mesh& mesh, const Propagation& p, int rank,
                                          const std::string& loss,
                                          const std::map<std::string, Sharding>& output_wants) {
  LoweredGraph out;
  out.graph = g.Clone();
  Graph& lg = *out.graph;
  lg.opset_imports()[graph::kCleaveDomain] = 1;
  auto sharding_of = [&](const std::string& name) -> const Sharding& { return p.sharding.at(g.FindValue(name)); };

  // Reshards first, on the original graph's view of the nodes.
  std::vector<Reshard> reshards = Reshards(g, mesh, p);
  // Clone keeps the node order, and nodes added below go to the end: the i-th node of g is
  // the i-th node of lg.
  std::map<const Node*, Node*> twin;
  for (size_t i = 0; i < g.nodes().size(); ++i) twin[g.nodes()[i].get()] = lg.nodes()[i].get();
  std::map<std::pair<std::string, std::string>, Value*> made;  // (value, target sharding) -> converted value
  for (const Reshard& r : reshards) {
    const std::string key_to = r.to.ToString();
    Node* reader = twin.at(r.node);
    Value* src = lg.FindValue(r.value->name());
    auto key = std::make_pair(r.value->name(), key_to);
    Value* converted = made.count(key) ? made[key] : nullptr;
    if (!converted) {
      const std::string axis_name = absl::StrJoin(r.axes, "*");
      const std::vector<int> group = mesh.Group(rank, r.axes);
      auto collective = [&](const char* op, Value* in, const std::string& suffix) {
        Value* v = lg.GetOrCreateValue(lg.UniqueName(absl::StrCat(r.value->name(), ".", suffix)));
        Node* c = lg.AddNode(op, {in}, {v}, v->name(), graph::kCleaveDomain);
        c->SetAttr("group", Attribute::Ints(ToInts(group)));
        c->SetAttr("mesh_axis", Attribute::String(axis_name));
        c->metadata()["role"] = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
        out.collectives.push_back({op, r.value->name(), r.node->name(), axis_name, group, r.bytes});
        return std::make_pair(c, v);
      };
      switch (r.kind) {
        case ReshardKind::kAllReduce: {
          auto [c, v] = collective("AllReduce", src, "allreduce");
          converted = v;
          // A Partial mean: the sum over the group, divided by its size.
          bool avg = false;
          for (const auto& a : r.axes) avg |= r.from.partial_avg.count(a) > 0;
          if (avg) {
            Value* scale = lg.AddInitializer(lg.UniqueName(absl::StrCat(r.value->name(), ".mean_scale")),
                                             Tensor::Scalar<float>(1.0f / static_cast<float>(group.size())));
            Value* mean = lg.GetOrCreateValue(lg.UniqueName(absl::StrCat(r.value->name(), ".mean")));
            Node* m = lg.AddNode("Mul", {v, scale}, {mean}, mean->name());
            m->metadata() = c->metadata();
            converted = mean;
          }
          break;
        }
        case ReshardKind::kAllGather:
        case ReshardKind::kReduceScatter: {
          // One dim changes: find it.
          int dim = -1;
          for (size_t d = 0; d < r.from.dims.size(); ++d)
            if (r.from.dims[d] != r.to.dims[d]) dim = static_cast<int>(d);
          if (dim < 0 || r.axes.size() != 1)
            return Unimplemented("reshard of '", r.value->name(), "' from ", r.from.ToString(), " to ", r.to.ToString(),
                                 " for ", r.node->Describe(), " is not lowered yet");
          auto [c, v] = collective(r.kind == ReshardKind::kAllGather ? "AllGather" : "ReduceScatter", src,
                                   r.kind == ReshardKind::kAllGather ? "allgather" : "reducescatter");
          c->SetAttr("axis", Attribute::Int(dim));
          converted = v;
          break;
        }
        case ReshardKind::kSlice: {
          // Replicated here, sharded there: keep this rank's block with a Slice.
          std::vector<int64_t> starts, ends, axes;
          for (size_t d = 0; d < r.to.dims.size(); ++d) {
            if (r.to.dims[d].empty() || r.to.dims[d] == r.from.dims[d]) continue;
            const int64_t global = r.value->shape()[static_cast<int>(d)].value;
            const int64_t local = global / Parts(mesh, r.to.dims[d]);
            const int64_t off = ShardOffset(mesh, rank, r.to, static_cast<int>(d), global);
            starts.push_back(off);
            ends.push_back(off + local);
            axes.push_back(static_cast<int64_t>(d));
          }
          const int64_t n = static_cast<int64_t>(starts.size());
          Value* vs = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_starts"), Tensor::FromVector(starts, {n}));
          Value* ve = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_ends"), Tensor::FromVector(ends, {n}));
          Value* va = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_axes"), Tensor::FromVector(axes, {n}));
          Value* v = lg.GetOrCreateValue(lg.UniqueName(r.value->name() + ".slice"));
          Node* s = lg.AddNode("Slice", {src, vs, ve, va}, {v}, v->name());
          s->metadata()["role"] = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
          converted = v;
          break;
        }
        case ReshardKind::kAllToAll:
          return Unimplemented("reshard of '", r.value->name(), "' from ", r.from.ToString(), " to ", r.to.ToString(),
                               " (AllToAll) for ", r.node->Describe(), " is not lowered yet");
      }
      made[key] = converted;
    }
    lg.SetNodeInput(reader, r.input, converted);
  }

  // A sum of squares that becomes Partial over axes A adds its inputs' local sums over A. An
  // input replicated over A would be counted |A| times: its part is divided by |A| first.
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* on = g.nodes()[k].get();
    if (on->domain() != graph::kCleaveDomain || on->op_type() != "SquaredNorm") continue;
    const Sharding& out_s = p.sharding.at(on->output(0));
    if (out_s.partial.empty()) continue;
    std::vector<Value*> sharded, whole;
    Node* n = twin.at(on);
    for (int i = 0; i < n->num_inputs(); ++i) {
      std::set<std::string> axes;
      const Value* oin = on->input(i);
      for (const auto& d : p.sharding.at(oin).dims) axes.insert(d.begin(), d.end());
      bool covers = true;
      for (const auto& a : out_s.partial) covers &= axes.count(a) > 0;
      (covers ? sharded : whole).push_back(n->input(i));
    }
    if (whole.empty()) continue;
    const std::vector<std::string> axes(out_s.partial.begin(), out_s.partial.end());
    const float inv = 1.0f / static_cast<float>(mesh.Group(rank, axes).size());
    Value* out_v = n->output(0);
    auto md = n->metadata();
    const std::string base = n->name();
    lg.RemoveNode(n);
    twin[on] = nullptr;
    auto add_node = [&](const char* op, std::vector<Value*> in, Value* out, const char* domain) {
      Node* m = lg.AddNode(op, in, {out}, lg.UniqueName(base + "." + op), domain);
      m->metadata() = md;
      return m;
    };
    Value* whole_sq = lg.GetOrCreateValue(lg.UniqueName(base + ".replicated"));
    add_node("SquaredNorm", whole, whole_sq, graph::kCleaveDomain);
    Value* scale = lg.AddInitializer(lg.UniqueName(base + ".replica_scale"), Tensor::Scalar<float>(inv));
    Value* scaled = lg.GetOrCreateValue(lg.UniqueName(base + ".replicated_share"));
    add_node("Mul", {whole_sq, scale}, scaled, "");
    if (sharded.empty()) {
      add_node("Identity", {scaled}, out_v, "");
    } else {
      Value* shard_sq = lg.GetOrCreateValue(lg.UniqueName(base + ".sharded"));
      add_node("SquaredNorm", sharded, shard_sq, graph::kCleaveDomain);
      add_node("Add", {shard_sq, scaled}, out_v, "");
    }
  }

  // Local shapes of inputs and initializers; sharded initializers keep this rank's block.
  for (Value* v : lg.AllValues()) {
    const Value* orig = g.FindValue(v->name());
    if (!orig) continue;  // made above
    const Sharding& s = p.sharding.at(orig);
    if (s.IsReplicated() && !s.IsPartial()) continue;
    if (v->is_initializer()) {
      if (s.IsPartial())
        return Unimplemented("initializer '", v->name(), "' would be Partial (", s.ToString(), "); not lowered");
      ASSIGN_OR_RETURN(Tensor local, ShardTensor(*v->initializer(), mesh, s, rank, v->name()));
      lg.SetInitializer(v, std::move(local));
    } else if (v->is_graph_input()) {
      ASSIGN_OR_RETURN(Shape local, LocalShape(mesh, v->name(), orig->shape(), s));
      v->set_shape(local);
    }
  }

  // Shape constants follow the local shapes of what they describe.
  for (const auto& n : lg.nodes()) {
    const std::string& op = n->op_type();
    int shape_input = -1;
    const Value* described = nullptr;
    if (n->domain().empty() && (op == "Reshape" || op == "Expand")) {
      shape_input = 1;
      described = n->output(0);
    } else if (n->domain() == graph::kCleaveDomain && op == "GatherGrad") {
      shape_input = 0;
      described = n->output(0);
    } else if (n->domain() == graph::kCleaveDomain && op == "SliceGrad") {
      shape_input = 1;
      described = n->output(0);
    } else if (n->domain().empty() && op == "ConstantOfShape") {
      shape_input = 0;
      described = n->output(0);
    }
    if (shape_input < 0 || !described) continue;
    const Value* orig = g.FindValue(described->name());
    if (!orig) continue;
    const Sharding& s = p.sharding.at(orig);
    bool sharded = false;
    for (const auto& d : s.dims) sharded |= !d.empty();
    if (!sharded) continue;
    ASSIGN_OR_RETURN(Shape local, LocalShape(mesh, orig->name(), orig->shape(), s));
    const std::vector<int64_t> dims = local.StaticDims();
    Value* c = lg.AddInitializer(lg.UniqueName(absl::StrCat(n->name(), ".local_shape")),
                                 Tensor::FromVector(dims, {static_cast<int64_t>(dims.size())}));
    lg.SetNodeInput(n.get(), shape_input, c);
  }

  // An averaged loss: scale the backward seed and report the global value.
  if (!loss.empty()) {
    const Value* orig = g.FindValue(loss);
    if (!orig) return NotFound("loss '", loss, "' is not in the graph");
    const Sharding& s = p.sharding.at(orig);
    if (!s.partial.empty()) return Unimplemented("loss '", loss, "' is a partial sum (", s.ToString(), ")");
    if (!s.partial_avg.empty()) {
      const std::vector<std::string> axes(s.partial_avg.begin(), s.partial_avg.end());
      const std::vector<int> group = mesh.Group(rank, axes);
      const float inv = 1.0f / static_cast<float>(group.size());
      Value* seed = lg.FindValue(loss + "_grad");
      if (seed && seed->is_initializer()) {
        Tensor t = CopyToTensor(seed->initializer()->view());
        for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] *= inv;
        lg.SetInitializer(seed, std::move(t));
      }
      Value* global = lg.FindValue(loss);
      Node* producer = global->producer();
      if (!producer) return InvalidArgument("loss '", loss, "' has no producer");
      Value* local = lg.GetOrCreateValue(lg.UniqueName(loss + ".local"));
      int out_index = 0;
      for (int o = 0; o < producer->num_outputs(); ++o)
        if (producer->output(o) == global) out_index = o;
      lg.SetNodeOutput(producer, out_index, local);
      auto consumers = global->consumers();
      for (auto [node, idx] : consumers) lg.SetNodeInput(node, idx, local);
      Value* sum = lg.GetOrCreateValue(lg.UniqueName(loss + ".sum"));
      Node* ar = lg.AddNode("AllReduce", {local}, {sum}, sum->name(), graph::kCleaveDomain);
      ar->SetAttr("group", Attribute::Ints(ToInts(group)));
      ar->SetAttr("mesh_axis", Attribute::String(absl::StrJoin(axes, "*")));
      ar->metadata()["role"] = "fwd";
      out.collectives.push_back({"AllReduce", loss, "(loss report)", absl::StrJoin(axes, "*"), group, 4});
      Value* scale = lg.AddInitializer(lg.UniqueName(loss + ".mean_scale"), Tensor::Scalar<float>(inv));
      Node* m = lg.AddNode("Mul", {sum, scale}, {global}, global->name() + ".mean");
      m->metadata()["role"] = "fwd";
    }
  }
  // Graph outputs that must leave whole: gather them at the end under their own name.
  for (const auto& [name, want] : output_wants) {
    const Value* orig = g.FindValue(name);
    if (!orig) return NotFound("output '", name, "' is not in the graph");
    const Sharding& have = p.sharding.at(orig);
    if (have == want) continue;
    if (have.IsPartial() || !want.IsReplicated())
      return Unimplemented("output '", name, "' from ", have.ToString(), " to ", want.ToString(), " is not lowered");
    Value* full = lg.FindValue(name);
    Node* producer = full->producer();
    Value* part = lg.GetOrCreateValue(lg.UniqueName(name + ".shard"));
    for (int o = 0; o < producer->num_outputs(); ++o)
      if (producer->output(o) == full) lg.SetNodeOutput(producer, o, part);
    Value* cur = part;
    for (size_t dim = 0; dim < have.dims.size(); ++dim) {
      if (have.dims[dim].empty()) continue;
      if (have.dims[dim].size() != 1)
        return Unimplemented("output '", name, "' is sharded over several axes on one dim");
      const std::string axis = have.dims[dim][0];
      const std::vector<int> group = mesh.Group(rank, axis);
      bool last = true;
      for (size_t k = dim + 1; k < have.dims.size(); ++k) last &= have.dims[k].empty();
      Value* next = last ? full : lg.GetOrCreateValue(lg.UniqueName(name + ".gathered"));
      Node* ag = lg.AddNode("AllGather", {cur}, {next}, lg.UniqueName(name + ".allgather"), graph::kCleaveDomain);
      ag->SetAttr("group", Attribute::Ints(ToInts(group)));
      ag->SetAttr("mesh_axis", Attribute::String(axis));
      ag->SetAttr("axis", Attribute::Int(static_cast<int64_t>(dim)));
      ag->metadata() = producer->metadata();
      int64_t bytes = 1;
      for (const Dim& dd : orig->shape().dims()) bytes *= dd.value;
      bytes = bytes * static_cast<int64_t>(ElementSize(orig->dtype())) / static_cast<int64_t>(mesh.size(axis));
      out.collectives.push_back({"AllGather", name, producer->name(), axis, group, bytes});
      cur = next;
    }
  }
  RETURN_IF_ERROR(lg.SortTopologically());
  absl::Status inferred = graph::InferShapes(lg);
  if (!inferred.ok())
    return absl::Status(inferred.code(), absl::StrCat("rank ", rank, ": the lowered graph does not infer: ", inferred.message()));
  // Every value must have the shape its sharding implies.
  for (const Value* v : lg.AllValues()) {
    const Value* orig = g.FindValue(v->name());
    if (!orig || !orig->shape().is_static() || v->name() == loss || output_wants.count(v->name())) continue;
    ASSIGN_OR_RETURN(Shape want, LocalShape(mesh, v->name(), orig->shape(), p.sharding.at(orig)));
    if (!(v->shape() == want))
      return Internal("rank ", rank, ": '", v->name(), "' infers as ", v->shape().ToString(), " but its sharding ",
                      p.sharding.at(orig).ToString(), " implies ", want.ToString());
  }
  return out;
}

}  // namespace cleave::partition
