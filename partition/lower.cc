// Local lowering (partition/): see lower.h.
#include "partition/lower.h"

#include <algorithm>
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

// A node the lowering adds in place of `prefix`'s node: `op` over `in` writing `out` (a new
// value named prefix + hint when null), with the replaced node's metadata (its role and stage).
Node* AddLowered(Graph& lg, const char* op, std::vector<Value*> in, const std::string& prefix, const std::string& hint,
                 const std::map<std::string, std::string>& metadata, Value* out = nullptr, const char* domain = "") {
  Node* m;
  if (out) {
    m = lg.AddNode(op, in, {out}, lg.UniqueName(prefix + hint), domain);
  } else {
    out = lg.GetOrCreateValue(lg.UniqueName(prefix + hint));
    m = lg.AddNode(op, in, {out}, out->name(), domain);  // the new value names its node
  }
  m->metadata() = metadata;
  return m;
}

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

absl::StatusOr<std::map<std::string, Sharding>> PrepareOptimizer(
    Graph& opt, const std::vector<std::string>& params, const std::vector<std::string>& state_suffixes,
    const Mesh& mesh, const std::map<std::string, Sharding>& param_shardings,
    const std::map<std::string, Sharding>& grad_shardings, int zero_stage,
    std::map<std::string, Sharding>* output_wants) {
  if (zero_stage < 0 || zero_stage > 2)
    return Unimplemented("ZeRO stage ", zero_stage, " is not supported (0, 1 or 2)");
  std::map<std::string, Sharding> seeds;
  const int d = mesh.size("dp");
  for (const std::string& name : params) {
    Value* grad = opt.FindValue(name + "_grad");
    if (!grad || !grad->shape().is_static())
      return InvalidArgument("the optimizer graph has no static gradient '", name, "_grad'");
    const std::vector<int64_t> dims = grad->shape().StaticDims();
    const int rank = static_cast<int>(dims.size());
    auto find = [&](const std::map<std::string, Sharding>& m, const std::string& k) {
      auto it = m.find(k);
      return it == m.end() ? Sharding::Replicated(rank) : it->second;
    };
    const Sharding param = find(param_shardings, name);
    Sharding grad_s = find(grad_shardings, name);
    seeds[name] = param;
    seeds[grad->name()] = grad_s;
    for (const std::string& suf : state_suffixes) seeds[name + suf] = param;
    if (zero_stage == 0 || d == 1) continue;
    // ZeRO-1 and 2: split the first dim whose local size dp divides, inside the parameter's
    // own sharding of that dim (under ZeRO-2 the gradient arrives so split already).
    std::optional<Sharding> zero = ZeroShard(param, dims, mesh);
    if (!zero) continue;  // too small to shard: replicated update
    const Sharding shard = *zero;
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
    for (const std::string& suf : state_suffixes) seeds[name + suf] = shard;
    // The parameter enters and leaves with its training sharding; the update slices the shard.
    (*output_wants)[name + ".updated"] = param;
  }
  RETURN_IF_ERROR(opt.SortTopologically());
  return seeds;
}

absl::StatusOr<std::map<std::string, Sharding>> PrepareZero1(Graph& opt, const std::vector<std::string>& params,
                                                             const std::vector<std::string>& state_suffixes,
                                                             const Mesh& mesh,
                                                             std::map<std::string, Sharding>* output_wants) {
  std::map<std::string, Sharding> grads;
  for (const std::string& name : params) {
    const Value* g = opt.FindValue(name + "_grad");
    if (!g) return InvalidArgument("the optimizer graph has no gradient '", name, "_grad'");
    Sharding s = Sharding::Replicated(g->shape().rank());
    s.partial = {"dp"};
    grads[name] = s;
  }
  return PrepareOptimizer(opt, params, state_suffixes, mesh, {}, grads, 1, output_wants);
}

absl::StatusOr<LoweredGraph> LowerForRank(const Graph& g, const Mesh& mesh, const Propagation& p, int rank,
                                          const std::string& loss,
                                          const std::map<std::string, Sharding>& output_wants,
                                          int64_t bucket_bytes) {
  LoweredGraph out;
  out.graph = g.Clone();
  Graph& lg = *out.graph;
  lg.opset_imports()[graph::kCleaveDomain] = 1;

  // Reshards first, on the original graph's view of the nodes.
  std::vector<Reshard> reshards = Reshards(g, mesh, p);
  // Clone keeps the node order, and nodes added below go to the end: the i-th node of g is
  // the i-th node of lg.
  std::map<const Node*, Node*> twin;
  for (size_t i = 0; i < g.nodes().size(); ++i) twin[g.nodes()[i].get()] = lg.nodes()[i].get();
  std::map<std::pair<std::string, std::string>, Value*> made;  // (value, target sharding) -> converted value

  // Buckets: flat concatenations of the small same-axes AllReduces of fp32 graph inputs.
  if (bucket_bytes > 0) {
    std::map<std::vector<std::string>, std::vector<const Reshard*>> by_axes;
    std::set<std::pair<std::string, std::string>> seen;
    for (const Reshard& r : reshards) {
      if (r.kind != ReshardKind::kAllReduce || !r.from.partial_avg.empty() || !r.value->is_graph_input() ||
          r.value->dtype() != DataType::kFloat32 || !r.value->shape().is_static())
        continue;
      if (!seen.insert({r.value->name(), r.to.ToString()}).second) continue;
      by_axes[r.axes].push_back(&r);
    }
    for (const auto& [axes, all] : by_axes) {
      const std::vector<int> group = mesh.Group(rank, axes);
      const std::string axis_name = absl::StrJoin(axes, "*");
      // As PyTorch DDP packs them: in reverse input order, about the order in which the backward
      // makes gradients final, the first bucket capped at 1 MiB so that communication starts
      // early in the backward.
      const std::vector<const Reshard*> list(all.rbegin(), all.rend());
      size_t i = 0;
      while (i < list.size()) {
        // One bucket: tensors until it holds about its cap.
        const int64_t cap = i == 0 ? std::min<int64_t>(bucket_bytes, int64_t{1} << 20) : bucket_bytes;
        std::vector<const Reshard*> bucket;
        int64_t bytes = 0;
        while (i < list.size() && (bucket.empty() || bytes + list[i]->bytes <= cap)) {
          bytes += list[i]->bytes;
          bucket.push_back(list[i++]);
        }
        if (bucket.size() == 1) continue;  // a lone tensor keeps its own AllReduce below
        const std::string base = lg.UniqueName("grad_bucket");
        Value* flat_shape = lg.AddInitializer(lg.UniqueName(base + ".flat"), Tensor::FromVector<int64_t>({-1}, {1}));
        std::vector<Value*> flats;
        std::vector<int64_t> sizes;
        for (const Reshard* r : bucket) {
          Value* f = lg.GetOrCreateValue(lg.UniqueName(r->value->name() + ".flat"));
          Node* rs = lg.AddNode("Reshape", {lg.FindValue(r->value->name()), flat_shape}, {f}, f->name());
          rs->metadata()["role"] = "opt";
          flats.push_back(f);
          sizes.push_back(r->value->shape().NumElements() / [&] {
            int64_t parts = 1;
            for (const auto& d : r->from.dims)
              for (const auto& a : d) parts *= mesh.size(a);
            return parts;
          }());
        }
        Value* packed = lg.GetOrCreateValue(lg.UniqueName(base + ".packed"));
        Node* cat = lg.AddNode("Concat", flats, {packed}, packed->name());
        cat->SetAttr("axis", Attribute::Int(0));
        cat->metadata()["role"] = "opt";
        Value* reduced = lg.GetOrCreateValue(lg.UniqueName(base + ".allreduce"));
        Node* ar = lg.AddNode("AllReduce", {packed}, {reduced}, reduced->name(), graph::kCleaveDomain);
        ar->SetAttr("group", Attribute::Ints(ToInts(group)));
        ar->SetAttr("mesh_axis", Attribute::String(axis_name));
        ar->metadata()["role"] = "opt";
        out.collectives.push_back(
            {"AllReduce", base, absl::StrCat(bucket.size(), " tensors"), axis_name, group, bytes, ar->name()});
        Value* split_sizes = lg.AddInitializer(lg.UniqueName(base + ".sizes"),
                                               Tensor::FromVector<int64_t>(sizes, {static_cast<int64_t>(sizes.size())}));
        std::vector<Value*> parts;
        for (const Reshard* r : bucket) parts.push_back(lg.GetOrCreateValue(lg.UniqueName(r->value->name() + ".reduced_flat")));
        Node* split = lg.AddNode("Split", {reduced, split_sizes}, parts, lg.UniqueName(base + ".split"));
        split->SetAttr("axis", Attribute::Int(0));
        split->metadata()["role"] = "opt";
        for (size_t k = 0; k < bucket.size(); ++k) {
          const Reshard* r = bucket[k];
          ASSIGN_OR_RETURN(Shape local, LocalShape(mesh, r->value->name(), r->value->shape(), r->from));
          const std::vector<int64_t> dims = local.StaticDims();
          Value* shape = lg.AddInitializer(lg.UniqueName(r->value->name() + ".shape"),
                                           Tensor::FromVector<int64_t>(dims, {static_cast<int64_t>(dims.size())}));
          Value* back = lg.GetOrCreateValue(lg.UniqueName(r->value->name() + ".allreduce"));
          Node* rs = lg.AddNode("Reshape", {parts[k], shape}, {back}, back->name());
          rs->metadata()["role"] = "opt";
          made[{r->value->name(), r->to.ToString()}] = back;
        }
      }
    }
  }

  for (const Reshard& r : reshards) {
    const std::string key_to = r.to.ToString();
    Node* reader = twin.at(r.node);
    Value* src = lg.FindValue(r.value->name());
    auto key = std::make_pair(r.value->name(), key_to);
    Value* converted = made.count(key) ? made[key] : nullptr;
    if (!converted) {
      const std::string axis_name = absl::StrJoin(r.axes, "*");
      const std::vector<int> group = mesh.Group(rank, r.axes);
      // A collective over r.axes, or over `axes` when given (with its input's bytes).
      auto collective = [&](const char* op, Value* in, const std::string& suffix,
                            const std::vector<std::string>* axes = nullptr, int64_t bytes = -1) {
        const std::vector<int> members = axes ? mesh.Group(rank, *axes) : group;
        const std::string name = axes ? absl::StrJoin(*axes, "*") : axis_name;
        Value* v = lg.GetOrCreateValue(lg.UniqueName(absl::StrCat(r.value->name(), ".", suffix)));
        Node* c = lg.AddNode(op, {in}, {v}, v->name(), graph::kCleaveDomain);
        c->SetAttr("group", Attribute::Ints(ToInts(members)));
        c->SetAttr("mesh_axis", Attribute::String(name));
        c->metadata()["role"] = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
        out.collectives.push_back(
            {op, r.value->name(), r.node->name(), name, members, bytes < 0 ? r.bytes : bytes, c->name()});
        return std::make_pair(c, v);
      };
      // Replicated here, sharded there: keep this rank's block of `in` with a Slice.
      auto slice_to_target = [&](Value* in) {
        std::vector<int64_t> starts, ends, axes;
        for (size_t d = 0; d < r.to.dims.size(); ++d) {
          if (r.to.dims[d].empty() || r.to.dims[d] == r.from.dims[d]) continue;
          const int64_t global = r.value->shape()[static_cast<int>(d)].value;
          const int64_t local = global / Parts(mesh, r.to.dims[d]);
          // The offset inside the block this rank already holds.
          const int64_t off = ShardOffset(mesh, rank, r.to, static_cast<int>(d), global) -
                              ShardOffset(mesh, rank, r.from, static_cast<int>(d), global);
          starts.push_back(off);
          ends.push_back(off + local);
          axes.push_back(static_cast<int64_t>(d));
        }
        const int64_t n = static_cast<int64_t>(starts.size());
        Value* vs = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_starts"), Tensor::FromVector(starts, {n}));
        Value* ve = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_ends"), Tensor::FromVector(ends, {n}));
        Value* va = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_axes"), Tensor::FromVector(axes, {n}));
        Value* v = lg.GetOrCreateValue(lg.UniqueName(r.value->name() + ".slice"));
        Node* s = lg.AddNode("Slice", {in, vs, ve, va}, {v}, v->name());
        s->metadata()["role"] = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
        return v;
      };
      switch (r.kind) {
        case ReshardKind::kAllReduce: {
          // A reduction that also shards further (a summed gradient wanted sharded like its
          // weight) reduces the whole local block, then keeps the target's block. Moving a
          // shard to another dim as well is not chained.
          bool only_adds = true;
          for (size_t d = 0; d < r.to.dims.size(); ++d)
            only_adds &= r.to.dims[d].size() >= r.from.dims[d].size() &&
                         std::equal(r.from.dims[d].begin(), r.from.dims[d].end(), r.to.dims[d].begin());
          if (!only_adds || !r.value->shape().is_static())
            return Unimplemented("reshard of '", r.value->name(), "' from ", r.from.ToString(), " to ", r.to.ToString(),
                                 " for ", r.node->Describe(), " both reduces and moves shards; not lowered yet");
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
          if (r.from.dims != r.to.dims) converted = slice_to_target(converted);
          break;
        }
        case ReshardKind::kAllGather:
        case ReshardKind::kReduceScatter: {
          // One dim changes: find it.
          int dim = -1, changed = 0;
          for (size_t d = 0; d < r.from.dims.size(); ++d)
            if (r.from.dims[d] != r.to.dims[d]) {
              dim = static_cast<int>(d);
              ++changed;
            }
          if (r.kind == ReshardKind::kReduceScatter && dim >= 0 && changed == 1 && r.axes.size() > 1 &&
              r.from.partial_avg.empty() &&
              std::equal(r.from.dims[dim].begin(), r.from.dims[dim].end(), r.to.dims[dim].begin())) {
            // Partial over more axes than the dim is scattered over: reduce-scatter over the
            // scattering axes, then all-reduce the shard over the others.
            const std::vector<std::string> scatter(r.to.dims[dim].begin() + r.from.dims[dim].size(),
                                                   r.to.dims[dim].end());
            std::vector<std::string> rest;
            for (const auto& a : r.axes)
              if (std::find(scatter.begin(), scatter.end(), a) == scatter.end()) rest.push_back(a);
            const bool covered = rest.size() + scatter.size() == r.axes.size();
            if (covered && !rest.empty()) {
              auto [c, v] = collective("ReduceScatter", src, "reducescatter", &scatter);
              c->SetAttr("axis", Attribute::Int(dim));
              int64_t shard_bytes = r.bytes;
              for (const auto& a : scatter) shard_bytes /= mesh.size(a);
              auto [c2, v2] = collective("AllReduce", v, "allreduce", &rest, shard_bytes);
              converted = v2;
              break;
            }
          }
          if (dim < 0 || changed != 1 || r.axes.size() != 1)
            return Unimplemented("reshard of '", r.value->name(), "' from ", r.from.ToString(), " to ", r.to.ToString(),
                                 " for ", r.node->Describe(), " is not lowered yet");
          auto [c, v] = collective(r.kind == ReshardKind::kAllGather ? "AllGather" : "ReduceScatter", src,
                                   r.kind == ReshardKind::kAllGather ? "allgather" : "reducescatter");
          c->SetAttr("axis", Attribute::Int(dim));
          converted = v;
          break;
        }
        case ReshardKind::kSlice:
          converted = slice_to_target(src);
          break;
        case ReshardKind::kAllToAll: {
          // A shard moving from one dim to another.
          int from_dim = -1, to_dim = -1;
          for (size_t d = 0; d < r.from.dims.size(); ++d) {
            if (r.from.dims[d].size() > r.to.dims[d].size()) from_dim = static_cast<int>(d);
            if (r.to.dims[d].size() > r.from.dims[d].size()) to_dim = static_cast<int>(d);
          }
          if (from_dim < 0 || to_dim < 0 || r.axes.size() != 1 || r.from.dims[from_dim].size() != 1 ||
              !r.from.dims[to_dim].empty())
            return Unimplemented("reshard of '", r.value->name(), "' from ", r.from.ToString(), " to ",
                                 r.to.ToString(), " for ", r.node->Describe(), " is not lowered yet");
          if (r.to.dims[to_dim] == r.axes && r.to.dims[from_dim].empty() && r.value->shape().is_static()) {
            // One AllToAll over the flat buffer: split the new dim into its n parts and bring
            // that axis to the front (chunk j goes to member j), exchange, then put the received
            // parts (member i's block of the old dim) back in place of the old dim and merge.
            ASSIGN_OR_RETURN(Shape ls, LocalShape(mesh, r.value->name(), r.value->shape(), r.from));
            std::vector<int64_t> local = ls.StaticDims();
            const int rank_v = static_cast<int>(local.size());
            const int64_t n = static_cast<int64_t>(group.size());
            const std::string meta_role = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
            auto add = [&](const char* op, std::vector<Value*> ins, const std::string& suffix) {
              Value* out = lg.GetOrCreateValue(lg.UniqueName(r.value->name() + "." + suffix));
              Node* node = lg.AddNode(op, ins, {out}, out->name());
              node->metadata()["role"] = meta_role;
              return std::make_pair(node, out);
            };
            std::vector<int64_t> split = local;
            split[to_dim] = local[to_dim] / n;
            split.insert(split.begin() + to_dim, n);
            Value* split_shape = lg.AddInitializer(lg.UniqueName(r.value->name() + ".a2a_split"),
                                                   Tensor::FromVector(split, {static_cast<int64_t>(split.size())}));
            auto [rs1, v1] = add("Reshape", {src, split_shape}, "a2a_split");
            std::vector<int64_t> front = {to_dim};
            for (int d = 0; d <= rank_v; ++d)
              if (d != to_dim) front.push_back(d);
            auto [tr1, v2] = add("Transpose", {v1}, "a2a_front");
            tr1->SetAttr("perm", Attribute::Ints(front));
            auto [c, v3] = collective("AllToAll", v2, "alltoall");
            // v3: [n (the sender's block of the old dim), the local dims with the new one split].
            std::vector<int64_t> back;
            for (int d = 1; d <= from_dim; ++d) back.push_back(d);
            back.push_back(0);
            for (int d = from_dim + 1; d <= rank_v; ++d) back.push_back(d);
            auto [tr2, v4] = add("Transpose", {v3}, "a2a_back");
            tr2->SetAttr("perm", Attribute::Ints(back));
            std::vector<int64_t> merged = local;
            merged[from_dim] = local[from_dim] * n;
            merged[to_dim] = local[to_dim] / n;
            Value* merged_shape = lg.AddInitializer(lg.UniqueName(r.value->name() + ".a2a_merge"),
                                                    Tensor::FromVector(merged, {static_cast<int64_t>(merged.size())}));
            auto [rs2, v5] = add("Reshape", {v4, merged_shape}, "moved");
            (void)rs1;
            (void)rs2;
            converted = v5;
            break;
          }
          // Otherwise: gather the old dim and slice the new one.
          auto [c, gathered] = collective("AllGather", src, "allgather");
          c->SetAttr("axis", Attribute::Int(from_dim));
          const int64_t global = r.value->shape()[to_dim].value;
          const int64_t local = global / Parts(mesh, r.to.dims[to_dim]);
          const int64_t off = ShardOffset(mesh, rank, r.to, to_dim, global);
          Value* vs = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_starts"), Tensor::FromVector<int64_t>({off}, {1}));
          Value* ve = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_ends"), Tensor::FromVector<int64_t>({off + local}, {1}));
          Value* va = lg.AddInitializer(lg.UniqueName(r.value->name() + ".slice_axes"),
                                        Tensor::FromVector<int64_t>({static_cast<int64_t>(to_dim)}, {1}));
          Value* v = lg.GetOrCreateValue(lg.UniqueName(r.value->name() + ".moved"));
          Node* s = lg.AddNode("Slice", {gathered, vs, ve, va}, {v}, v->name());
          s->metadata() = c->metadata();
          converted = v;
          break;
        }
      }
      // A whole value that becomes a partial sum over axes it was not partial over (a
      // replicated gradient handed to a Partial(dp) one): every rank of those axes holds the
      // whole, so all but the first of each group contribute zero, or a later reduction would
      // count it once per rank.
      std::vector<std::string> added;
      for (const auto& a : r.to.partial)
        if (!r.from.partial.count(a) && !r.from.partial_avg.count(a)) added.push_back(a);
      if (!added.empty()) {
        bool keep = true;
        for (const auto& a : added) keep &= mesh.Coord(rank, a) == 0;
        if (r.value->dtype() != DataType::kFloat32 && r.value->dtype() != DataType::kFloat64)
          return Unimplemented("'", r.value->name(), "' of ", DataTypeName(r.value->dtype()),
                               " made a partial sum for ", r.node->Describe());
        Tensor k = r.value->dtype() == DataType::kFloat64 ? Tensor::Scalar<double>(keep ? 1.0 : 0.0)
                                                          : Tensor::Scalar<float>(keep ? 1.0f : 0.0f);
        Value* kv = lg.AddInitializer(lg.UniqueName(r.value->name() + ".partial_share"), std::move(k));
        Value* shared = lg.GetOrCreateValue(lg.UniqueName(r.value->name() + ".partial"));
        Node* m = lg.AddNode("Mul", {converted, kv}, {shared}, shared->name());
        m->metadata()["role"] = reader->metadata().count("role") ? reader->metadata().at("role") : "fwd";
        converted = shared;
      }
      made[key] = converted;
    }
    lg.SetNodeInput(reader, r.input, converted);
  }

  // A lookup into a table sharded along the gathered axis (a vocabulary-parallel embedding):
  // each rank looks up only the ids in its slice of the table, zeroes the rest, and the
  // output is Partial (the one rank holding a row contributes it).
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* on = g.nodes()[k].get();
    if (!on->domain().empty() || on->op_type() != "Gather") continue;
    const FactorRule& rule = p.rules.at(on);
    if (rule.gathered_factor < 0 || p.factor_axes.at(on)[rule.gathered_factor].empty()) continue;
    Node* n = twin.at(on);
    const Sharding& table = p.sharding.at(on->input(0));
    const int64_t rank_in = on->input(0)->shape().rank();
    int64_t axis = on->AttrInt("axis", 0);
    if (axis < 0) axis += rank_in;
    if (axis != 0 || rank_in != 2)
      return Unimplemented(on->Describe(), ": a sharded lookup along axis ", axis, " of a rank-", rank_in,
                           " table is not lowered");
    const int64_t rows = on->input(0)->shape()[0].value;
    const int64_t local = rows / Parts(mesh, table.dims[0]);
    const int64_t offset = ShardOffset(mesh, rank, table, 0, rows);
    Value* ids = n->input(1);
    const DataType it = ids->dtype();
    auto scalar = [&](const std::string& hint, int64_t v) {
      return lg.AddInitializer(lg.UniqueName(n->name() + hint),
                               it == DataType::kInt32 ? Tensor::Scalar<int32_t>(static_cast<int32_t>(v)) : Tensor::Scalar<int64_t>(v));
    };
    auto md = n->metadata();
    auto node = [&](const char* op, std::vector<Value*> in, const std::string& hint) {
      return AddLowered(lg, op, std::move(in), n->name(), hint, md)->output(0);
    };
    Value* shifted = node("Sub", {ids, scalar(".offset", offset)}, ".local_ids");
    Value* lo = node("GreaterOrEqual", {shifted, scalar(".zero", 0)}, ".at_or_above");
    Value* hi = node("Less", {shifted, scalar(".rows", local)}, ".below");
    Value* mine = node("And", {lo, hi}, ".in_slice");
    Value* safe = node("Where", {mine, shifted, scalar(".zero_id", 0)}, ".safe_ids");
    lg.SetNodeInput(n, 1, safe);
    // Zero the rows of ids held elsewhere: mask [.., 1] against the output [.., D].
    Value* out = n->output(0);
    Value* raw = lg.GetOrCreateValue(lg.UniqueName(n->name() + ".rows"));
    lg.SetNodeOutput(n, 0, raw);
    Value* mask;
    if (lg.OpsetFor("") >= 13) {
      Value* axes = lg.AddInitializer(lg.UniqueName(n->name() + ".mask_axes"), Tensor::FromVector<int64_t>({-1}, {1}));
      mask = node("Unsqueeze", {mine, axes}, ".mask");
    } else {
      mask = node("Unsqueeze", {mine}, ".mask");
      mask->producer()->SetAttr("axes", Attribute::Ints({-1}));
    }
    Value* zero = lg.AddInitializer(lg.UniqueName(n->name() + ".zero_row"), Tensor::Scalar<float>(0.0f));
    Node* w = lg.AddNode("Where", {mask, raw, zero}, {out}, lg.UniqueName(n->name() + ".masked"));
    w->metadata() = md;
  }

  // A vocabulary-parallel cross-entropy over class-sharded scores [N, C]: the row max and the
  // sum of exponentials are AllReduced (max, sum) over the class shards, each rank forms its
  // columns of log_prob, and the target's log-probability comes from the one rank holding the
  // label (a masked pick, then a sum). The scores are never gathered; what crosses ranks is
  // three [N] vectors.
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* on = g.nodes()[k].get();
    const bool fwd = on->domain().empty() && on->op_type() == "SoftmaxCrossEntropyLoss";
    const bool bwd = on->domain() == graph::kCleaveDomain && on->op_type() == "SoftmaxCrossEntropyLossGrad";
    if (!fwd && !bwd) continue;
    const Value* scores = on->input(fwd ? 0 : 1);
    // The class factor (the second, as the rules number them) as the node reads it: the
    // scores' own sharding may differ when they are resharded for it.
    if (!on->metadata().count(kVocabParallel) || scores->shape().rank() != 2) continue;
    const std::vector<std::string>& class_axes = p.factor_axes.at(on)[1];
    if (class_axes.empty()) continue;
    Sharding ss = Sharding::Replicated(2);
    ss.dims[0] = p.factor_axes.at(on)[0];
    ss.dims[1] = class_axes;
    Node* n = twin.at(on);
    const int64_t classes = scores->shape()[1].value;
    const int64_t offset = ShardOffset(mesh, rank, ss, 1, classes);
    const int64_t local = classes / Parts(mesh, ss.dims[1]);
    if (bwd) {
      n->SetAttr("class_offset", Attribute::Int(offset));
      n->SetAttr("num_classes", Attribute::Int(classes));
      continue;
    }
    const std::vector<int> group = mesh.Group(rank, ss.dims[1]);
    const std::string axis_name = absl::StrJoin(ss.dims[1], "*");
    ASSIGN_OR_RETURN(Shape local_scores, LocalShape(mesh, scores->name(), scores->shape(), ss));
    const int64_t rows = local_scores[0].value;
    const std::string base = n->name();
    const std::string reduction = n->AttrString("reduction", "mean");
    const bool has_ignore = n->HasAttr("ignore_index");
    const int64_t ignore_index = n->AttrInt("ignore_index", 0);
    Value* s_in = n->input(0);
    Value* labels = n->input(1);
    Value* loss_out = n->output(0);
    Value* log_prob_out = n->num_outputs() > 1 ? n->output(1) : nullptr;
    auto md = n->metadata();
    lg.RemoveNode(n);
    twin[on] = nullptr;
    const int opset = lg.OpsetFor("");
    auto add = [&](const char* op, std::vector<Value*> in, const std::string& hint, Value* dst = nullptr,
                   const char* domain = "") { return AddLowered(lg, op, std::move(in), base, hint, md, dst, domain); };
    // A reduction over the class axis (keepdims) or over everything (axis < 0).
    auto reduce = [&](const char* op, Value* x, int axis, bool keep, const std::string& hint, Value* dst = nullptr) {
      const bool axes_input = std::string(op) == "ReduceSum" ? opset >= 13 : opset >= 18;
      std::vector<Value*> in = {x};
      if (axis >= 0 && axes_input)
        in.push_back(lg.AddInitializer(lg.UniqueName(base + hint + ".axes"), Tensor::FromVector<int64_t>({axis}, {1})));
      Node* m = add(op, in, hint, dst);
      if (axis >= 0 && !axes_input) m->SetAttr("axes", Attribute::Ints({axis}));
      m->SetAttr("keepdims", Attribute::Int(keep ? 1 : 0));
      return m->output(0);
    };
    auto all_reduce = [&](Value* x, const char* how, int64_t elements) {
      Node* m = add("AllReduce", {x}, absl::StrCat(".", how), nullptr, graph::kCleaveDomain);
      m->SetAttr("group", Attribute::Ints(ToInts(group)));
      m->SetAttr("mesh_axis", Attribute::String(axis_name));
      if (std::string(how) == "max") m->SetAttr("reduction", Attribute::String("max"));
      out.collectives.push_back({"AllReduce", x->name(), on->name(), axis_name, group, elements * 4, m->name()});
      return m->output(0);
    };
    Value* row_max = all_reduce(reduce("ReduceMax", s_in, 1, true, ".local_max"), "max", rows);
    Value* shifted = add("Sub", {s_in, row_max}, ".shifted")->output(0);
    Value* exps = add("Exp", {shifted}, ".exp")->output(0);
    Value* sum_exp = all_reduce(reduce("ReduceSum", exps, 1, true, ".local_sum_exp"), "sum", rows);
    Value* lse = add("Log", {sum_exp}, ".log_sum_exp")->output(0);
    Value* log_prob = add("Sub", {shifted, lse}, ".log_prob", log_prob_out)->output(0);
    // This rank's class ids [1, C/shards] against the labels [N, 1]: at most one hit per row.
    std::vector<int64_t> ids(local);
    for (int64_t c = 0; c < local; ++c) ids[c] = offset + c;
    Tensor iota = labels->dtype() == DataType::kInt32
                      ? Tensor::FromVector<int32_t>(std::vector<int32_t>(ids.begin(), ids.end()), {1, local})
                      : Tensor::FromVector<int64_t>(ids, {1, local});
    Value* class_ids = lg.AddInitializer(lg.UniqueName(base + ".class_ids"), std::move(iota));
    Value* column;
    if (opset >= 13) {
      Value* axes = lg.AddInitializer(lg.UniqueName(base + ".label_axes"), Tensor::FromVector<int64_t>({1}, {1}));
      column = add("Unsqueeze", {labels, axes}, ".label_column")->output(0);
    } else {
      Node* u = add("Unsqueeze", {labels}, ".label_column");
      u->SetAttr("axes", Attribute::Ints({1}));
      column = u->output(0);
    }
    Value* hit = add("Equal", {class_ids, column}, ".hit")->output(0);
    Value* zero = lg.AddInitializer(lg.UniqueName(base + ".zero"), Tensor::Scalar<float>(0.0f));
    Value* picked = add("Where", {hit, log_prob, zero}, ".picked")->output(0);
    Value* target = all_reduce(reduce("ReduceSum", picked, 1, false, ".local_target"), "sum", rows);
    Value* nll = add("Neg", {target}, ".nll")->output(0);
    if (has_ignore) {
      Value* ign = lg.AddInitializer(lg.UniqueName(base + ".ignore_index"),
                                     labels->dtype() == DataType::kInt32
                                         ? Tensor::Scalar<int32_t>(static_cast<int32_t>(ignore_index))
                                         : Tensor::Scalar<int64_t>(ignore_index));
      Value* ignored = add("Equal", {labels, ign}, ".ignored")->output(0);
      Value* kept = add("Not", {ignored}, ".kept")->output(0);
      Node* cast = add("Cast", {kept}, ".weight");
      cast->SetAttr("to", Attribute::Int(1));  // float
      Value* weight = cast->output(0);
      if (reduction == "none") {
        add("Mul", {nll, weight}, ".loss", loss_out);
      } else {
        Value* weighted = add("Mul", {nll, weight}, ".weighted")->output(0);
        if (reduction == "sum") {
          reduce("ReduceSum", weighted, -1, false, ".loss", loss_out);
        } else {
          Value* total = reduce("ReduceSum", weighted, -1, false, ".total");
          Value* count = reduce("ReduceSum", weight, -1, false, ".count");
          add("Div", {total, count}, ".loss", loss_out);
        }
      }
    } else if (reduction == "none") {
      add("Identity", {nll}, ".loss", loss_out);
    } else {
      reduce(reduction == "sum" ? "ReduceSum" : "ReduceMean", nll, -1, false, ".loss", loss_out);
    }
  }

  // A sum of squares that becomes Partial over axes A adds its inputs' local sums over A. An
  // input not sharded over some of A is held whole by several of the ranks summed; its part
  // is divided by the number of those copies first.
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* on = g.nodes()[k].get();
    if (on->domain() != graph::kCleaveDomain || on->op_type() != "SquaredNorm") continue;
    const Sharding& out_s = p.sharding.at(on->output(0));
    if (out_s.partial.empty()) continue;
    std::map<int64_t, std::vector<Value*>> by_copies;
    Node* n = twin.at(on);
    for (int i = 0; i < n->num_inputs(); ++i) {
      std::set<std::string> axes;
      for (const auto& d : p.sharding.at(on->input(i)).dims) axes.insert(d.begin(), d.end());
      int64_t copies = 1;
      for (const auto& a : out_s.partial)
        if (!axes.count(a)) copies *= mesh.size(a);
      by_copies[copies].push_back(n->input(i));
    }
    if (by_copies.size() == 1 && by_copies.begin()->first == 1) continue;
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
    std::vector<Value*> parts;
    for (const auto& [copies, inputs] : by_copies) {
      Value* sq = lg.GetOrCreateValue(lg.UniqueName(base + ".group"));
      add_node("SquaredNorm", inputs, sq, graph::kCleaveDomain);
      if (copies > 1) {
        Value* scale = lg.AddInitializer(lg.UniqueName(base + ".copies_scale"),
                                         Tensor::Scalar<float>(1.0f / static_cast<float>(copies)));
        Value* scaled = lg.GetOrCreateValue(lg.UniqueName(base + ".share"));
        add_node("Mul", {sq, scale}, scaled, "");
        sq = scaled;
      }
      parts.push_back(sq);
    }
    Value* acc = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      Value* sum = i + 1 == parts.size() ? out_v : lg.GetOrCreateValue(lg.UniqueName(base + ".sum"));
      add_node("Add", {acc, parts[i]}, sum, "");
      acc = sum;
    }
    if (parts.size() == 1) add_node("Identity", {acc}, out_v, "");
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
    } else if (n->domain() == graph::kCleaveDomain &&
               (op == "SliceGrad" || op == "AveragePoolGrad" || op == "ResizeGrad")) {
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
      out.collectives.push_back({"AllReduce", loss, "(loss report)", absl::StrJoin(axes, "*"), group, 4, ar->name()});
      Value* scale = lg.AddInitializer(lg.UniqueName(loss + ".mean_scale"), Tensor::Scalar<float>(inv));
      Node* m = lg.AddNode("Mul", {sum, scale}, {global}, global->name() + ".mean");
      m->metadata()["role"] = "fwd";
    }
  }
  // Graph outputs with a wanted sharding: gather the extra (innermost) axes at the end,
  // under the output's own name.
  for (const auto& [name, want] : output_wants) {
    const Value* orig = g.FindValue(name);
    if (!orig) return NotFound("output '", name, "' is not in the graph");
    const Sharding& have = p.sharding.at(orig);
    if (have == want) continue;
    if (have.IsPartial() || want.IsPartial() || have.dims.size() != want.dims.size())
      return Unimplemented("output '", name, "' from ", have.ToString(), " to ", want.ToString(), " is not lowered");
    Value* full = lg.FindValue(name);
    Node* producer = full->producer();
    Value* part = lg.GetOrCreateValue(lg.UniqueName(name + ".shard"));
    for (int o = 0; o < producer->num_outputs(); ++o)
      if (producer->output(o) == full) lg.SetNodeOutput(producer, o, part);
    // The gathers, innermost axis of each dim first.
    std::vector<std::pair<int, std::string>> steps;
    for (size_t dim = 0; dim < have.dims.size(); ++dim) {
      const auto& h = have.dims[dim];
      const auto& w = want.dims[dim];
      if (h.size() < w.size() || !std::equal(w.begin(), w.end(), h.begin()))
        return Unimplemented("output '", name, "' from ", have.ToString(), " to ", want.ToString(), " is not lowered");
      for (size_t k = h.size(); k > w.size(); --k) steps.emplace_back(static_cast<int>(dim), h[k - 1]);
    }
    Sharding cur_s = have;
    Value* cur = part;
    int64_t bytes = 1;
    for (const Dim& dd : orig->shape().dims()) bytes *= dd.value;
    bytes *= static_cast<int64_t>(ElementSize(orig->dtype()));
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto [dim, axis] = steps[k];
      int64_t parts = 1;
      for (const auto& ds : cur_s.dims)
        for (const auto& a : ds) parts *= mesh.size(a);
      const std::vector<int> group = mesh.Group(rank, axis);
      Value* next = k + 1 == steps.size() ? full : lg.GetOrCreateValue(lg.UniqueName(name + ".gathered"));
      Node* ag = lg.AddNode("AllGather", {cur}, {next}, lg.UniqueName(name + ".allgather"), graph::kCleaveDomain);
      ag->SetAttr("group", Attribute::Ints(ToInts(group)));
      ag->SetAttr("mesh_axis", Attribute::String(axis));
      ag->SetAttr("axis", Attribute::Int(dim));
      ag->metadata() = producer->metadata();
      out.collectives.push_back({"AllGather", name, producer->name(), axis, group, bytes / parts, ag->name()});
      cur_s.dims[dim].pop_back();
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
