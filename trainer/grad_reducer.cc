// The gradient reducer (trainer/): see grad_reducer.h.
#include "trainer/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "providers/collective_attrs.h"
#include "runtime/profiler.h"

namespace cleave::trainer {

using graph::Node;
using graph::Value;

namespace {

// A candidate found by the analysis, before the graph changes.
struct Found {
  GradientReducer::Reduction r;
  Node* collective;
  std::vector<Node*> packing;  // a bucket's Reshapes and Concat
  Value* result;
};

bool IsGraphOutput(const graph::Graph& g, const Value* v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

}  // namespace

absl::StatusOr<std::vector<GradientReducer::Reduction>> GradientReducer::Extract(
    graph::Graph& g, const std::vector<std::string>& grad_inputs) {
  std::map<std::string, int> param_of;
  for (size_t i = 0; i < grad_inputs.size(); ++i) param_of[grad_inputs[i]] = static_cast<int>(i);
  auto grad_param = [&](const Value* v) {
    if (!v || !v->is_graph_input()) return -1;
    auto it = param_of.find(v->name());
    return it == param_of.end() ? -1 : it->second;
  };
  std::vector<Found> found;
  std::set<int> bucketed;  // a gradient can be a view of one flat buffer only
  for (size_t idx = 0; idx < g.nodes().size(); ++idx) {
    Node* n = g.nodes()[idx].get();
    const bool collective = n->op_type() == "AllReduce" || n->op_type() == "ReduceScatter";
    if (n->domain() != graph::kCleaveDomain || !collective) continue;
    auto attrs = providers::GroupAttrs::Read(*n);
    if (!attrs.ok() || attrs->op != ReduceOp::kSum || (n->op_type() == "ReduceScatter" && attrs->axis != 0)) continue;
    Value* x = n->input(0);
    Value* y = n->num_outputs() == 1 ? n->output(0) : nullptr;
    if (!x || !y || IsGraphOutput(g, y) || x->dtype() != DataType::kFloat32 || !x->shape().is_static() ||
        !y->shape().is_static())
      continue;
    Found f;
    f.collective = n;
    f.result = y;
    f.r.op = n->op_type();
    f.r.label = n->name();
    f.r.group = attrs->ranks;
    f.r.input_numel = x->shape().NumElements();
    f.r.result_dims = y->shape().StaticDims();
    f.r.node_index = static_cast<int>(idx);
    if (const int p = grad_param(x); p >= 0) {
      f.r.params = {p};
      f.r.offsets = {0};
    } else {
      // A bucket: Concat(axis 0) of Reshape(gradient) to 1-D, each used only there.
      Node* cat = x->producer();
      if (!cat || cat->op_type() != "Concat" || !cat->domain().empty() || cat->AttrInt("axis", -1) != 0 ||
          x->consumers().size() != 1 || n->op_type() != "AllReduce")
        continue;
      int64_t offset = 0;
      bool ok = true;
      for (Value* flat : cat->inputs()) {
        Node* rs = flat ? flat->producer() : nullptr;
        const int p = rs && rs->op_type() == "Reshape" && flat->consumers().size() == 1 ? grad_param(rs->input(0)) : -1;
        if (p < 0 || !rs->input(0)->shape().is_static() || bucketed.count(p)) {
          ok = false;
          break;
        }
        f.r.params.push_back(p);
        f.r.offsets.push_back(offset);
        offset += rs->input(0)->shape().NumElements();
        f.packing.push_back(rs);
      }
      if (!ok || offset != f.r.input_numel) continue;
      f.packing.push_back(cat);
      bucketed.insert(f.r.params.begin(), f.r.params.end());
    }
    found.push_back(std::move(f));
  }
  std::vector<Reduction> out;
  for (Found& f : found) {
    Value* in = g.AddInput(g.UniqueName(f.result->name() + ".reduced"), DataType::kFloat32, f.result->shape());
    f.r.result = in->name();
    g.RemoveNode(f.collective);
    for (Node* p : f.packing) g.RemoveNode(p);
    g.ReplaceAllUsesWith(f.result, in);
    out.push_back(std::move(f.r));
  }
  if (!out.empty()) g.RemoveUnusedValues();
  return out;
}

GradientReducer::GradientReducer(std::vector<Reduction> reductions, std::vector<Tensor> buffers,
                                 std::vector<Tensor> results, const std::vector<int>& ready_step,
                                 std::unique_ptr<Communicator> comm)
    : reductions_(std::move(reductions)),
      buffers_(std::move(buffers)),
      results_(std::move(results)),
      queue_(std::move(comm)) {
  of_param_.assign(ready_step.size(), {});
  for (size_t r = 0; r < reductions_.size(); ++r)
    for (int p : reductions_[r].params)
      if (p < static_cast<int>(of_param_.size())) of_param_[p].push_back(static_cast<int>(r));
  SetReadySteps(ready_step);
  waiting_.assign(reductions_.size(), 0);
  queued_us_.assign(reductions_.size(), 0);
}

void GradientReducer::SetReadySteps(const std::vector<int>& ready_step) {
  // Launch order: by when the last gradient of each reduction is final, then graph order.
  std::vector<int> key(reductions_.size(), 0);
  for (size_t r = 0; r < reductions_.size(); ++r)
    for (int p : reductions_[r].params) {
      const int at = p < static_cast<int>(ready_step.size()) && ready_step[p] >= 0 ? ready_step[p] : INT_MAX;
      key[r] = std::max(key[r], at);
    }
  order_.clear();
  for (size_t r = 0; r < reductions_.size(); ++r) order_.push_back(static_cast<int>(r));
  std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
    return std::make_pair(key[a], reductions_[a].node_index) < std::make_pair(key[b], reductions_[b].node_index);
  });
}

GradientReducer::~GradientReducer() = default;  // the queue drops what has not started

void GradientReducer::set_profiler(runtime::Profiler* p) {
  profiler_ = p;
  if (p) track_ = p->Track("gradient reduction");
  if (queue_.device()) queue_.comm()->set_timing(p != nullptr);
}

absl::Status GradientReducer::AddDeviceTimes() {
  if (!profiler_ || !queue_.device()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<Communicator::TimedOperation> ops, queue_.comm()->TakeTimedOperations());
  std::vector<int> timed = std::exchange(timed_, {});
  if (ops.size() != timed.size())
    return Internal("gradient reductions: ", ops.size(), " timed on the device for ", timed.size(), " queued");
  for (size_t i = 0; i < ops.size(); ++i) Profile(timed[i], ops[i].start, ops[i].end, "on the device");
  return absl::OkStatus();
}

absl::Status GradientReducer::BeginBackward(bool final) {
  RETURN_IF_ERROR(WaitIdle());
  armed_ = final;
  current_ = final;
  next_ = 0;
  launched_in_backward_ = launched_after_ = 0;
  for (size_t r = 0; r < reductions_.size(); ++r) waiting_[r] = static_cast<int>(reductions_[r].params.size());
  return absl::OkStatus();
}

void GradientReducer::Ready(int param) {
  if (!armed_ || param < 0 || param >= static_cast<int>(of_param_.size())) return;
  for (int r : of_param_[param]) --waiting_[r];
  while (next_ < order_.size() && waiting_[order_[next_]] <= 0) {
    Launch(order_[next_++]);
    ++launched_in_backward_;
  }
}

absl::Status GradientReducer::Finish() {
  if (!current_) {
    // The gradients changed after the last launch (or nothing launched): start over.
    RETURN_IF_ERROR(WaitIdle());
    next_ = 0;
    current_ = true;
    launched_in_backward_ = 0;
  }
  armed_ = false;
  while (next_ < order_.size()) {
    Launch(order_[next_++]);
    ++launched_after_;
  }
  return WaitIdle();
}

void GradientReducer::Launch(int r) {
  queued_us_[r] = runtime::Profiler::Micros(runtime::Profiler::Clock::now());
  queue_.Submit([this, r] { return Run(r); });
}

absl::Status GradientReducer::Run(int r) {
  const Reduction& red = reductions_[r];
  const auto start = runtime::Profiler::Clock::now();
  const TensorView in = buffers_[r].view();
  const TensorView out = results_[r].view();
  Communicator* comm = queue_.comm();
  absl::Status s = red.op == "AllReduce" ? comm->AllReduce(in, out, ReduceOp::kSum, red.group)
                                         : comm->ReduceScatter(in, out, ReduceOp::kSum, red.group);
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("gradient reduction ", red.op, " '", red.label, "' of ",
                                               red.params.size(), " gradient(s): ", s.message()));
  if (profiler_ && queue_.device()) timed_.push_back(r);
  if (profiler_ && !queue_.device()) Profile(r, start, runtime::Profiler::Clock::now(), nullptr);
  return absl::OkStatus();
}

void GradientReducer::Profile(int r, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end,
                              const char* timed) {
  const Reduction& red = reductions_[r];
  std::vector<std::pair<std::string, std::string>> args = {
      {"bytes", absl::StrCat(buffers_[r].nbytes())},
      {"queued_us", absl::StrCat(queued_us_[r])},
      {"gradients", absl::StrCat(red.params.size())},
      {"group", absl::StrCat("[", absl::StrJoin(red.group, ","), "]")}};
  if (timed) args.emplace_back("timed", timed);
  profiler_->Add(absl::StrCat(red.op, " ", red.label), "comm", track_, start, end, std::move(args));
}

absl::Status GradientReducer::WaitIdle() {
  // On a device the host waits with the communicator's timeout (a dead peer ends in an error,
  // not a compute stream stuck behind the reductions), then the compute stream is ordered after.
  return queue_.WaitAll();
}

}  // namespace cleave::trainer
