// Pipeline stages (partition/): see pipeline.h.
#include "partition/pipeline.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::partition {

namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

std::string Role(const Node* n) {
  auto it = n->metadata().find("role");
  return it == n->metadata().end() ? "fwd" : it->second;
}

bool IsPlainMul(const Node* n) { return n && n->domain().empty() && n->op_type() == "Mul"; }

// The stream value a normalisation of the residual stream reads: LayerNormalization's or
// RMSNormalization's input, or for an RMSNorm as exported (weight * (x * rsqrt(...)), the
// weight a 1-D parameter) the larger operand of the inner product. Null for other nodes.
const Value* NormalizedStream(const Node* n, const std::set<std::string>& params) {
  if (n->op_type() == "LayerNormalization" || n->op_type() == "RMSNormalization") return n->input(0);
  if (!IsPlainMul(n) || n->num_inputs() != 2) return nullptr;
  const Value* inner = nullptr;
  bool weight = false;
  for (const Value* in : n->inputs()) {
    if (!in) return nullptr;
    if (params.count(in->name())) weight |= in->shape().has_rank() && in->shape().rank() == 1;
    else inner = in;
  }
  const Node* m = weight && inner ? inner->producer() : nullptr;
  if (!IsPlainMul(m) || m->num_inputs() != 2 || !m->input(0) || !m->input(1)) return nullptr;
  const Value *a = m->input(0), *b = m->input(1);
  if (!a->shape().is_static() || !b->shape().is_static()) return nullptr;
  return a->shape().NumElements() >= b->shape().NumElements() ? a : b;
}

double Flops(const Node* n) {
  const Value* out = n->output(0);
  if (!out || !out->shape().is_static()) return 0;
  const double numel = static_cast<double>(out->shape().NumElements());
  const bool mm = n->op_type() == "MatMul" || n->op_type() == "FusedMatMul" || n->op_type() == "Gemm";
  const Value* a = n->input(0);
  if (mm && a && a->shape().is_static() && a->shape().rank() >= 1) {
    const int r = a->shape().rank();
    const bool trans_a = n->AttrInt("transA", 0) != 0 && r >= 2;
    return 2.0 * numel * static_cast<double>(a->shape()[trans_a ? r - 2 : r - 1].value);
  }
  return numel;
}

int64_t Bytes(const Value* v) {
  if (!v || !v->shape().is_static()) return 0;
  return v->shape().NumElements() * static_cast<int64_t>(ElementSize(v->dtype()));
}

}  // namespace

absl::StatusOr<std::vector<const Value*>> FindLayerStarts(const Graph& g, const std::vector<std::string>& params) {
  const std::set<std::string> pset(params.begin(), params.end());
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  std::vector<const Value*> norms;
  for (const Node* n : order)
    if (Role(n) == "fwd")
      if (const Value* v = NormalizedStream(n, pset)) norms.push_back(v);
  if (norms.empty())
    return InvalidArgument("pipeline stages: found no normalisation of the residual stream (LayerNormalization or "
                           "an RMSNorm-style product with a 1-D parameter) to find the layers by");
  std::vector<const Value*> starts;
  const size_t layers = std::max<size_t>(1, norms.size() / 2);
  for (size_t k = 0; k < layers; ++k) starts.push_back(norms[2 * k]);
  return starts;
}

absl::StatusOr<std::vector<int>> ParseCuts(const std::string& spec) {
  if (spec.empty() || spec == "auto") return std::vector<int>{};
  std::vector<int> cuts;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int c;
    if (!absl::SimpleAtoi(part, &c))
      return InvalidArgument("--pp-cuts '", spec, "': expected 'auto' or layer numbers like 2,4; '", std::string(part),
                             "' is not a number");
    cuts.push_back(c);
  }
  return cuts;
}

absl::StatusOr<StageAssignment> AssignStages(const Graph& g, const std::vector<std::string>& params, int num_stages,
                                             const std::vector<int>& cuts) {
  if (num_stages < 1) return InvalidArgument("pipeline stages: need at least one stage, got ", num_stages);
  ASSIGN_OR_RETURN(std::vector<const Value*> starts, FindLayerStarts(g, params));
  const int layers = static_cast<int>(starts.size());
  if (num_stages > layers)
    return InvalidArgument("pipeline: ", num_stages, " stages for a model of ", layers,
                           " layers (found by its normalisations); each stage needs at least one layer");
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  std::map<const Value*, int> start_of;
  for (int k = 0; k < layers; ++k) start_of[starts[k]] = k;

  // Layer of every forward node: the latest of its producers' and of the stream values it
  // reads.
  std::map<const Node*, int> layer;
  for (const Node* n : order) {
    if (Role(n) != "fwd") continue;
    int l = -1;
    for (const Value* in : n->inputs()) {
      if (!in) continue;
      if (in->producer())
        if (auto it = layer.find(in->producer()); it != layer.end()) l = std::max(l, it->second);
      if (auto s = start_of.find(in); s != start_of.end()) l = std::max(l, s->second);
    }
    layer[n] = l;
  }
  // Nodes that depend on no layer sink to the first layer that reads them.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node* n = *it;
    if (Role(n) != "fwd" || layer.at(n) >= 0) continue;
    int l = std::numeric_limits<int>::max();
    for (const Value* out : n->outputs())
      if (out)
        for (const auto& [c, idx] : out->consumers())
          if (auto f = layer.find(c); f != layer.end() && f->second >= 0) l = std::min(l, f->second);
    layer[n] = l == std::numeric_limits<int>::max() ? layers - 1 : l;
  }
  // Backward nodes follow the forward node whose output they differentiate.
  std::map<const Node*, int> bwd_layer;
  for (const Node* n : order) {
    if (Role(n) != "bwd" || n->metadata().count("grad_sum")) continue;
    auto of = n->metadata().find("grad_of");
    if (of == n->metadata().end()) continue;
    const Value* v = g.FindValue(of->second);
    if (!v || !v->producer()) continue;
    auto f = layer.find(v->producer());
    if (f != layer.end()) bwd_layer[n] = f->second;
  }

  std::vector<double> layer_flops(layers, 0.0);
  std::vector<int64_t> layer_bytes(layers, 0);
  for (const auto& [n, l] : layer) layer_flops[l] += Flops(n);
  for (const auto& [n, l] : bwd_layer) layer_flops[l] += Flops(n);
  std::map<std::string, std::set<int>> param_layers;
  for (const std::string& p : params) {
    const Value* v = g.FindValue(p);
    if (!v) continue;
    for (const auto& [c, idx] : v->consumers())
      if (auto f = layer.find(c); f != layer.end()) param_layers[p].insert(f->second);
    for (int l : param_layers[p]) layer_bytes[l] += Bytes(v);
  }

  // first[s]: the first layer of stage s.
  std::vector<int> first(num_stages, 0);
  if (!cuts.empty()) {
    if (static_cast<int>(cuts.size()) != num_stages - 1)
      return InvalidArgument("--pp-cuts lists ", cuts.size(), " cut(s) for ", num_stages, " stages; expected ",
                             num_stages - 1);
    for (int s = 1; s < num_stages; ++s) {
      const int c = cuts[s - 1];
      if (c < 1 || c >= layers)
        return InvalidArgument("--pp-cuts: cut ", c, " is outside the model's layers (1..", layers - 1,
                               " start a later stage; the model has ", layers, " layers)");
      if (c <= first[s - 1])
        return InvalidArgument("--pp-cuts: cut ", c, " leaves stage ", s - 1, " empty (cuts must increase)");
      first[s] = c;
    }
  } else {
    double total_flops = 0;
    int64_t total_bytes = 0;
    for (int l = 0; l < layers; ++l) {
      total_flops += layer_flops[l];
      total_bytes += layer_bytes[l];
    }
    auto cost = [&](int a, int b) {  // layers [a, b)
      double f = 0, m = 0;
      for (int l = a; l < b; ++l) {
        f += layer_flops[l];
        m += static_cast<double>(layer_bytes[l]);
      }
      return (total_flops > 0 ? f / total_flops : 0) + 0.5 * (total_bytes > 0 ? m / total_bytes : 0);
    };
    // best[s][j]: the least maximal stage cost for layers [0, j) on stages 0..s.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(num_stages, std::vector<double>(layers + 1, inf));
    std::vector<std::vector<int>> from(num_stages, std::vector<int>(layers + 1, 0));
    for (int j = 1; j <= layers; ++j) best[0][j] = cost(0, j);
    for (int s = 1; s < num_stages; ++s)
      for (int j = s + 1; j <= layers; ++j)
        for (int i = s; i < j; ++i) {
          const double c = std::max(best[s - 1][i], cost(i, j));
          if (c < best[s][j] - 1e-12) {
            best[s][j] = c;
            from[s][j] = i;
          }
        }
    int j = layers;
    for (int s = num_stages - 1; s >= 1; --s) {
      first[s] = from[s][j];
      j = first[s];
    }
  }
  std::vector<int> stage_of_layer(layers, 0);
  for (int s = 0; s < num_stages; ++s)
    for (int l = first[s]; l < (s + 1 < num_stages ? first[s + 1] : layers); ++l) stage_of_layer[l] = s;

  StageAssignment a;
  a.num_stages = num_stages;
  a.num_layers = layers;
  a.first_layer = first;
  a.stage_flops.assign(num_stages, 0.0);
  a.stage_param_bytes.assign(num_stages, 0);
  for (const auto& [n, l] : layer) a.node_stage[n->name()] = stage_of_layer[l];
  for (const auto& [n, l] : bwd_layer) a.node_stage[n->name()] = stage_of_layer[l];
  for (int l = 0; l < layers; ++l) a.stage_flops[stage_of_layer[l]] += layer_flops[l];
  for (const auto& [p, ls] : param_layers) {
    for (int l : ls) a.param_stages[p].insert(stage_of_layer[l]);
    for (int s : a.param_stages[p]) a.stage_param_bytes[s] += Bytes(g.FindValue(p));
  }
  return a;
}

namespace {

// Roles and stages of every node of a lowered graph, extending the training graph's
// assignment to the nodes lowering added.
struct LoweredStages {
  std::map<const Node*, bool> bwd;
  std::map<const Node*, int> stage;
  // Tied parameters: the accumulator and the gradient sum feeding it are rebuilt per stage
  // from the contributions each stage computes.
  struct Tied {
    const Node* accumulator = nullptr;
    std::map<int, std::vector<Value*>> contributions;  // stage -> values
  };
  std::map<std::string, Tied> tied;
  std::set<const Node*> tied_tail;
};

absl::StatusOr<LoweredStages> StagesOf(const Graph& g, const StageAssignment& a,
                                       const std::vector<Node*>& order) {
  LoweredStages ls;
  std::set<const Node*> mapped;
  for (const Node* n : order)
    if (a.node_stage.count(n->name())) {
      mapped.insert(n);
      ls.bwd[n] = Role(n) == "bwd";
      ls.stage[n] = a.node_stage.at(n->name());
    }
  // Roles of added nodes: backward when anything they read is; otherwise forward when a
  // forward node or a graph output reads them.
  for (const Node* n : order) {
    if (mapped.count(n)) continue;
    bool b = false;
    for (const Value* in : n->inputs())
      if (in && in->producer() && ls.bwd.count(in->producer())) b |= ls.bwd.at(in->producer());
    if (b) ls.bwd[n] = true;
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node* n = *it;
    if (ls.bwd.count(n)) continue;
    bool fwd_reader = false, any = false;
    for (const Value* out : n->outputs()) {
      if (!out) continue;
      fwd_reader |= out->is_graph_output();
      for (const auto& [c, idx] : out->consumers()) {
        any = true;
        fwd_reader |= ls.bwd.count(c) && !ls.bwd.at(c);
      }
    }
    ls.bwd[n] = any && !fwd_reader;
  }
  // Stages of added nodes. The stage its producers allow (forward: the latest producer's;
  // backward: the earliest backward producer's) and the one its readers allow (forward: the
  // first reader's; backward: the last reader's) bound it; a node whose output is larger than
  // its inputs (a gather) runs by its readers and one that is not (a reduction, a slice) by its
  // producers, so the smaller value is the one that crosses a boundary.
  const int none = -1;
  auto producer_bound = [&](const Node* n) {
    int s = none;
    for (const Value* in : n->inputs()) {
      const Node* p = in ? in->producer() : nullptr;
      if (!p || !ls.stage.count(p)) continue;
      if (!ls.bwd.at(n)) s = std::max(s, ls.stage.at(p));
      else if (ls.bwd.at(p)) s = s == none ? ls.stage.at(p) : std::min(s, ls.stage.at(p));
    }
    return s;
  };
  auto reader_bound = [&](const Node* n) {
    int s = none;
    for (const Value* out : n->outputs())
      if (out)
        for (const auto& [c, idx] : out->consumers()) {
          if (!ls.stage.count(c)) continue;
          const int w = ls.stage.at(c);
          s = s == none ? w : (ls.bwd.at(n) ? std::max(s, w) : std::min(s, w));
        }
    return s;
  };
  auto grows = [](const Node* n) {
    int64_t in = 0;
    for (const Value* v : n->inputs())
      if (v && !v->is_initializer()) in = std::max(in, Bytes(v));
    return n->output(0) && Bytes(n->output(0)) > in;
  };
  std::vector<const Node*> added;
  for (const Node* n : order)
    if (!mapped.count(n)) added.push_back(n);
  for (const Node* n : added)
    if (!grows(n))
      if (int s = producer_bound(n); s != none) ls.stage[n] = s;
  for (auto it = added.rbegin(); it != added.rend(); ++it) {
    const Node* n = *it;
    if (ls.stage.count(n)) continue;
    int s = reader_bound(n);
    if (s == none) continue;
    if (const int p = producer_bound(n); p != none) s = ls.bwd.at(n) ? std::min(s, p) : std::max(s, p);
    ls.stage[n] = s;
  }
  for (const Node* n : added)
    if (!ls.stage.count(n)) ls.stage[n] = std::max(0, producer_bound(n));
  // Gradient accumulators whose sum gathers contributions from several stages.
  for (const Node* acc : order) {
    if (acc->domain() != graph::kCleaveDomain || acc->op_type() != "InPlaceAccumulator") continue;
    auto of = acc->metadata().find("grad_of");
    if (of == acc->metadata().end()) continue;
    const std::string& param = of->second;
    // The sum of the contributions and the linear ops lowering put on the way (a Slice to the
    // gradient's sharding, views, a reduce-scatter, a constant factor): each stage applies them
    // to its own part.
    std::vector<const Node*> tail;
    std::vector<Value*> parts;
    std::vector<Value*> todo = {acc->input(1)};
    std::set<const Value*> seen;
    while (!todo.empty()) {
      Value* v = todo.back();
      todo.pop_back();
      if (!v || !seen.insert(v).second) continue;
      const Node* p = v->producer();
      // Sums of collectives (ZeRO-2's reduce-scatter into the gradient shard) are linear too.
      const bool collective_sum = p && !mapped.count(p) && p->domain() == graph::kCleaveDomain &&
                                  (p->op_type() == "ReduceScatter" || p->op_type() == "AllReduce") &&
                                  p->AttrString("reduction", "sum") == "sum";
      const bool linear = collective_sum ||
                          (p && !mapped.count(p) && p->domain().empty() &&
                           ((p->op_type() == "Add" && p->metadata().count("grad_of") &&
                             p->metadata().at("grad_of") == param) ||
                            p->op_type() == "Identity" || p->op_type() == "Slice" || p->op_type() == "Reshape" ||
                            // a constant factor (one rank's share of a Partial sum)
                            (p->op_type() == "Mul" && p->num_inputs() == 2 && p->input(1) &&
                             p->input(1)->is_initializer() && p->input(1)->shape().is_static() &&
                             p->input(1)->shape().NumElements() == 1)));
      if (linear) {
        tail.push_back(p);
        const int data_inputs = p->op_type() == "Add" ? 2 : 1;
        for (int i = data_inputs - 1; i >= 0; --i) todo.push_back(p->input(i));
      } else {
        parts.push_back(v);
      }
    }
    std::map<int, std::vector<Value*>> by_stage;
    for (Value* v : parts)
      if (v->producer()) by_stage[ls.stage.at(v->producer())].push_back(v);
    if (by_stage.size() <= 1) continue;
    LoweredStages::Tied& t = ls.tied[param];
    t.accumulator = acc;
    t.contributions = by_stage;
    ls.tied_tail.insert(acc);
    ls.tied_tail.insert(tail.begin(), tail.end());
  }
  return ls;
}

// Copies value `v` of `src` into `dst` (typed), as an input or initializer when `src` has it so.
Value* Import(Graph& dst, const Value* v) {
  if (Value* have = dst.FindValue(v->name())) return have;
  if (v->is_initializer()) return dst.AddInitializer(v->name(), CopyToTensor(v->initializer()->view()));
  if (v->is_graph_input()) return dst.AddInput(v->name(), v->dtype(), v->shape());
  Value* out = dst.GetOrCreateValue(v->name());
  out->set_dtype(v->dtype());
  out->set_shape(v->shape());
  return out;
}

Node* CopyNode(Graph& dst, const Node* n, const std::set<std::string>& available) {
  std::vector<Value*> ins, outs;
  for (const Value* in : n->inputs()) {
    if (!in) {
      ins.push_back(nullptr);
      continue;
    }
    if (!in->is_initializer() && !in->is_graph_input() && !available.count(in->name())) return nullptr;
    ins.push_back(Import(dst, in));
  }
  for (const Value* out : n->outputs()) outs.push_back(out ? Import(dst, out) : nullptr);
  Node* c = dst.AddNode(n->op_type(), ins, outs, n->name(), n->domain());
  for (const auto& [k, attr] : n->attributes()) c->SetAttr(k, attr);
  c->metadata() = n->metadata();
  return c;
}

constexpr int kMaxTag = 32767;  // the least MPI_TAG_UB an MPI implementation may have

}  // namespace

absl::StatusOr<StagePart> SplitStage(const Graph& g, const StageAssignment& a, int stage, int prev_rank,
                                     int next_rank) {
  if (stage < 0 || stage >= a.num_stages)
    return InvalidArgument("stage ", stage, " is outside the ", a.num_stages, " pipeline stages");
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  ASSIGN_OR_RETURN(LoweredStages ls, StagesOf(g, a, order));
  const int S = a.num_stages;

  // Where each value is produced and needed.
  std::map<const Value*, int> need_fwd, need_bwd;           // latest / earliest reading stage
  std::map<int, std::set<std::string>> stash;                // stage -> forward values its backward reads
  auto stage_of = [&](const Node* n) { return ls.stage.at(n); };
  auto problem = [&](const Node* producer, const Value* v, const Node* reader) {
    return Internal("pipeline: ", ls.bwd.at(reader) ? "backward " : "forward ", reader->Describe(), " in stage ",
                    stage_of(reader), " reads '", v->name(), "' of ", ls.bwd.at(producer) ? "backward " : "forward ",
                    producer->Describe(), " in stage ", stage_of(producer), ", which it cannot receive");
  };
  for (const Node* n : order) {
    if (ls.tied_tail.count(n)) continue;
    const int u = stage_of(n);
    for (const Value* v : n->outputs()) {
      if (!v) continue;
      for (const auto& [c, idx] : v->consumers()) {
        if (ls.tied_tail.count(c)) continue;  // a contribution to a tied gradient: summed in its own stage
        const int w = stage_of(c);
        if (!ls.bwd.at(n)) {
          if (w < u) return problem(n, v, c);
          if (ls.bwd.at(c)) stash[w].insert(v->name());
          if (w > u) need_fwd[v] = std::max(need_fwd.count(v) ? need_fwd[v] : u, w);
        } else {
          if (!ls.bwd.at(c) || w > u) return problem(n, v, c);
          if (w < u) need_bwd[v] = std::min(need_bwd.count(v) ? need_bwd[v] : u, w);
        }
      }
    }
  }
  // Crossing values per boundary b (between stages b and b + 1), sorted by name.
  auto crossing = [&](int b, bool backward) {
    std::vector<const Value*> out;
    for (const auto& [v, w] : backward ? need_bwd : need_fwd) {
      const int u = stage_of(v->producer());
      if (!backward ? (u <= b && b < w) : (w <= b && b < u)) out.push_back(v);
    }
    std::sort(out.begin(), out.end(), [](const Value* x, const Value* y) { return x->name() < y->name(); });
    return out;
  };
  auto tag = [&](int b, bool backward, size_t index) -> absl::StatusOr<int> {
    const int64_t t = static_cast<int64_t>(index) * 2 * S + 2 * b + (backward ? 1 : 0);
    if (t > kMaxTag) return Unimplemented("pipeline: too many values cross boundary ", b, " for message tags");
    return static_cast<int>(t);
  };

  StagePart part;
  part.stage = stage;
  auto fresh = [&g](const std::string& name) {
    auto out = std::make_unique<Graph>();
    out->opset_imports() = g.opset_imports();
    out->info() = g.info();
    out->info().graph_name = name;
    return out;
  };
  auto add_recvs = [&](Graph& dst, int b, bool backward, int peer, std::set<std::string>& available) -> absl::Status {
    const std::vector<const Value*> in = crossing(b, backward);
    for (size_t i = 0; i < in.size(); ++i) {
      const Value* v = in[i];
      ASSIGN_OR_RETURN(int t, tag(b, backward, i));
      Value* out = Import(dst, v);
      Node* r = dst.AddNode("Recv", {}, {out}, v->name() + ".recv", graph::kCleaveDomain);
      r->SetAttr("peer", graph::Attribute::Int(peer));
      r->SetAttr("tag", graph::Attribute::Int(t));
      r->SetAttr("shape", graph::Attribute::Ints(v->shape().StaticDims()));
      r->SetAttr("dtype", graph::Attribute::Int(static_cast<int64_t>(v->dtype())));
      r->metadata()["role"] = backward ? "bwd" : "fwd";
      available.insert(v->name());
      part.p2p.push_back({"Recv", v->name(), peer, t, Bytes(v), backward});
    }
    return absl::OkStatus();
  };
  auto add_sends = [&](Graph& dst, int b, bool backward, int peer, std::vector<Value*>& outs) -> absl::Status {
    const std::vector<const Value*> in = crossing(b, backward);
    for (size_t i = 0; i < in.size(); ++i) {
      const Value* v = in[i];
      ASSIGN_OR_RETURN(int t, tag(b, backward, i));
      Value* src = dst.FindValue(v->name());
      if (!src) return Internal("pipeline: stage ", stage, " sends '", v->name(), "' it does not have");
      Value* done = dst.GetOrCreateValue(dst.UniqueName(v->name() + ".sent"));
      done->set_dtype(DataType::kBool);
      done->set_shape(Shape::Scalar());
      Node* s = dst.AddNode("Send", {src}, {done}, v->name() + ".send", graph::kCleaveDomain);
      s->SetAttr("peer", graph::Attribute::Int(peer));
      s->SetAttr("tag", graph::Attribute::Int(t));
      s->metadata()["role"] = backward ? "bwd" : "fwd";
      outs.push_back(done);
      part.p2p.push_back({"Send", v->name(), peer, t, Bytes(v), backward});
    }
    return absl::OkStatus();
  };
  auto missing = [&](const Node* n, const std::set<std::string>& available) {
    std::vector<std::string> names;
    for (const Value* in : n->inputs())
      if (in && !in->is_initializer() && !in->is_graph_input() && !available.count(in->name()))
        names.push_back(in->name());
    return Internal("pipeline: stage ", stage, ": ", n->Describe(), " reads [", absl::StrJoin(names, ", "),
                    "] which the stage neither computes nor receives");
  };

  // Forward part.
  {
    part.forward = fresh(absl::StrCat(g.info().graph_name, "_stage", stage, "_forward"));
    Graph& f = *part.forward;
    std::set<std::string> available;
    if (stage > 0) RETURN_IF_ERROR(add_recvs(f, stage - 1, false, prev_rank, available));
    std::vector<Value*> outs;
    for (const Node* n : order) {
      if (ls.bwd.at(n) || ls.tied_tail.count(n) || stage_of(n) != stage) continue;
      Node* c = CopyNode(f, n, available);
      if (!c) return missing(n, available);
      for (const Value* o : n->outputs()) {
        if (!o) continue;
        available.insert(o->name());
        if (o->is_graph_output()) outs.push_back(f.FindValue(o->name()));
      }
    }
    for (const std::string& s : stash[stage]) {
      part.stash.push_back(s);
      outs.push_back(f.FindValue(s));
    }
    if (stage + 1 < S) RETURN_IF_ERROR(add_sends(f, stage, false, next_rank, outs));
    f.SetOutputs(outs);
    RETURN_IF_ERROR(f.SortTopologically());
  }
  // Backward part, when the graph has one.
  bool has_backward = false;
  for (const auto& [n, b] : ls.bwd) has_backward |= b;
  if (has_backward) {
    part.backward = fresh(absl::StrCat(g.info().graph_name, "_stage", stage, "_backward"));
    Graph& bg = *part.backward;
    std::set<std::string> available;
    for (const std::string& s : part.stash) {
      const Value* v = g.FindValue(s);
      bg.AddInput(s, v->dtype(), v->shape());
      available.insert(s);
    }
    if (stage + 1 < S) RETURN_IF_ERROR(add_recvs(bg, stage, true, next_rank, available));
    std::vector<Value*> outs;
    for (const Node* n : order) {
      if (!ls.bwd.at(n) || ls.tied_tail.count(n) || stage_of(n) != stage) continue;
      Node* c = CopyNode(bg, n, available);
      if (!c) return missing(n, available);
      for (const Value* o : n->outputs()) {
        if (!o) continue;
        available.insert(o->name());
        if (o->is_graph_output()) outs.push_back(bg.FindValue(o->name()));
      }
    }
    for (const auto& [param, t] : ls.tied) {
      auto here = t.contributions.find(stage);
      if (here == t.contributions.end()) continue;
      // The tail again with only this stage's contributions: a sum drops the parts of other
      // stages, a view applies to what is left.
      const std::set<const Value*> mine(here->second.begin(), here->second.end());
      std::map<const Value*, Value*> memo;
      std::function<absl::StatusOr<Value*>(const Value*)> emit = [&](const Value* v) -> absl::StatusOr<Value*> {
        if (auto m = memo.find(v); m != memo.end()) return m->second;
        Value* out = nullptr;
        const Node* p = v->producer();
        if (mine.count(v)) {
          out = bg.FindValue(v->name());
        } else if (p && ls.tied_tail.count(p)) {
          const int data_inputs = p->op_type() == "Add" ? 2 : 1;
          std::vector<Value*> ins;
          for (int i = 0; i < data_inputs; ++i) {
            ASSIGN_OR_RETURN(Value * x, emit(p->input(i)));
            if (x) ins.push_back(x);
          }
          if (ins.size() == 1 && data_inputs == 2) {
            out = ins[0];
          } else if (!ins.empty()) {
            for (int i = data_inputs; i < p->num_inputs(); ++i) ins.push_back(p->input(i) ? Import(bg, p->input(i)) : nullptr);
            out = bg.GetOrCreateValue(bg.UniqueName(absl::StrCat(p->output(0)->name(), "/stage", stage)));
            out->set_dtype(p->output(0)->dtype());
            out->set_shape(p->output(0)->shape());
            Node* c = bg.AddNode(p->op_type(), ins, {out}, out->name(), p->domain());
            for (const auto& [k, attr] : p->attributes()) c->SetAttr(k, attr);
            c->metadata() = p->metadata();
          }
        }
        memo[v] = out;
        return out;
      };
      ASSIGN_OR_RETURN(Value * sum, emit(t.accumulator->input(1)));
      if (!sum) return Internal("pipeline: stage ", stage, " lost its part of the gradient of '", param, "'");
      const Node* acc = t.accumulator;
      std::vector<Value*> ins = {Import(bg, acc->input(0)), sum};
      for (int i = 2; i < acc->num_inputs(); ++i) ins.push_back(acc->input(i) ? Import(bg, acc->input(i)) : nullptr);
      Value* out = Import(bg, acc->output(0));
      Node* c = bg.AddNode(acc->op_type(), ins, {out}, acc->name(), acc->domain());
      for (const auto& [k, attr] : acc->attributes()) c->SetAttr(k, attr);
      c->metadata() = acc->metadata();
      outs.push_back(out);
    }
    if (stage > 0) RETURN_IF_ERROR(add_sends(bg, stage - 1, true, prev_rank, outs));
    bg.SetOutputs(outs);
    RETURN_IF_ERROR(bg.SortTopologically());
  }
  return part;
}

absl::Status PrepareStageOptimizer(Graph& o, const std::set<std::string>& keep,
                                   const std::map<std::string, int>& holders) {
  if (keep.empty()) return InvalidArgument("pipeline: a stage holds no trainable parameter");
  // Drop the updates of parameters other stages hold.
  std::vector<Node*> drop;
  for (const auto& n : o.nodes()) {
    auto it = n->metadata().find("param");
    if (it != n->metadata().end() && !keep.count(it->second)) drop.push_back(n.get());
  }
  for (Node* n : drop) o.RemoveNode(n);
  // The squared gradient norm: over the kept gradients only, a held-by-k one counted 1/k.
  Node* sq = nullptr;
  for (const auto& n : o.nodes())
    if (n->domain() == graph::kCleaveDomain && n->op_type() == "SquaredNorm") sq = n.get();
  if (!sq) return InvalidArgument("pipeline: the optimizer graph has no SquaredNorm of the gradients");
  std::map<int, std::vector<Value*>> by_copies;
  for (Value* in : sq->inputs()) {
    std::string param = in->name();
    if (param.size() > 5 && param.compare(param.size() - 5, 5, "_grad") == 0) param.resize(param.size() - 5);
    if (!keep.count(param)) continue;
    auto h = holders.find(param);
    by_copies[h == holders.end() ? 1 : std::max(1, h->second)].push_back(in);
  }
  Value* total = sq->output(0);
  const std::map<std::string, std::string> meta = sq->metadata();
  o.RemoveNode(sq);
  Value* acc = nullptr;
  for (const auto& [copies, inputs] : by_copies) {
    Value* part = o.GetOrCreateValue(o.UniqueName(absl::StrCat(total->name(), ".held_by_", copies)));
    part->set_dtype(DataType::kFloat32);
    part->set_shape(Shape::Scalar());
    Node* n = o.AddNode("SquaredNorm", inputs, {part}, part->name(), graph::kCleaveDomain);
    n->metadata() = meta;
    if (copies > 1) {
      Value* scale = o.AddInitializer(o.UniqueName(part->name() + ".scale"),
                                      Tensor::Scalar<float>(1.0f / static_cast<float>(copies)));
      Value* scaled = o.GetOrCreateValue(o.UniqueName(part->name() + ".scaled"));
      scaled->set_dtype(DataType::kFloat32);
      scaled->set_shape(Shape::Scalar());
      o.AddNode("Mul", {part, scale}, {scaled}, scaled->name())->metadata() = meta;
      part = scaled;
    }
    if (!acc) {
      acc = part;
      continue;
    }
    Value* sum = o.GetOrCreateValue(o.UniqueName(total->name() + ".sum"));
    sum->set_dtype(DataType::kFloat32);
    sum->set_shape(Shape::Scalar());
    o.AddNode("Add", {acc, part}, {sum}, sum->name())->metadata() = meta;
    acc = sum;
  }
  Node* id = o.AddNode("Identity", {acc}, {total}, total->name());
  id->metadata() = meta;
  // Inputs and outputs of the dropped parameters go.
  std::vector<Value*> outs;
  for (Value* v : o.outputs())
    if (v->producer()) outs.push_back(v);
  o.SetOutputs(outs);
  for (Value* v : std::vector<Value*>(o.inputs()))
    if (v->consumers().empty()) o.RemoveInput(v);
  o.RemoveUnusedValues();
  return o.SortTopologically();
}

absl::Status AddPipelineReductions(Graph& o, const std::map<std::string, std::vector<int>>& tied_groups,
                                   const std::vector<int>& pp_group) {
  auto insert = [&o](Value* v, const std::vector<int>& group, const std::string& axis) {
    std::vector<std::pair<Node*, int>> readers = v->consumers();
    Value* out = o.GetOrCreateValue(o.UniqueName(v->name() + "." + axis + "_allreduce"));
    out->set_dtype(v->dtype());
    out->set_shape(v->shape());
    Node* ar = o.AddNode("AllReduce", {v}, {out}, out->name(), graph::kCleaveDomain);
    ar->SetAttr("group", graph::Attribute::Ints(std::vector<int64_t>(group.begin(), group.end())));
    ar->SetAttr("mesh_axis", graph::Attribute::String(axis));
    ar->metadata()["role"] = "opt";
    for (auto [n, i] : readers) o.SetNodeInput(n, i, out);
  };
  for (const auto& [grad, group] : tied_groups) {
    if (group.size() < 2) continue;
    Value* v = o.FindValue(grad);
    if (!v || !v->is_graph_input()) return Internal("pipeline: the optimizer has no gradient input '", grad, "'");
    insert(v, group, "pp_tied");
  }
  if (pp_group.size() > 1) {
    Node* sqrt = nullptr;
    for (const auto& n : o.nodes())
      if (n->domain().empty() && n->op_type() == "Sqrt" && n->input(0) && n->input(0)->shape().rank() == 0 &&
          n->input(0)->dtype() == DataType::kFloat32)
        sqrt = n.get();
    if (!sqrt) return Internal("pipeline: the optimizer graph has no square root of the squared gradient norm");
    insert(sqrt->input(0), pp_group, "pp");
  }
  return o.SortTopologically();
}

}  // namespace cleave::partition
