// Executor: kernel creation, slot binding, planned allocation, the step loop (runtime/).
#include "runtime/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "runtime/async_schedule.h"
#include "runtime/comm_queue.h"
#include "runtime/executor_step.h"
#include "runtime/memory_plan.h"
#include "runtime/placement.h"
#include "runtime/profiler.h"

#if CLEAVE_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace cleave::runtime {

using graph::Node;
using graph::Value;

bool IsBoundaryCopy(const graph::Node& n) {
  return n.domain() == graph::kCleaveDomain && (n.op_type() == "MemcpyFromHost" || n.op_type() == "MemcpyToHost");
}

bool IsViewOp(const graph::Node& n) {
  static const std::set<std::string> view_ops = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  return n.domain().empty() && view_ops.count(n.op_type()) > 0;
}

std::shared_ptr<void> HeapBuffer(size_t bytes) {
  std::shared_ptr<void> p = TryAllocateAligned(bytes, /*zero=*/false);
  CLEAVE_CHECK(p != nullptr);
  return p;
}

absl::Status HostOutputError(const graph::Node& n, int i, DataType dtype, std::span<const int64_t> dims) {
  const std::string name = n.output(i) ? n.output(i)->name() : "";
  const int64_t bytes = DenseBytes(dtype, dims);
  if (bytes < 0)
    return InvalidArgument("output ", i, " '", name, "' of dims ", DimsToString(dims.data(), static_cast<int>(dims.size())),
                           ": expected non-negative dims whose byte size fits int64");
  return absl::ResourceExhaustedError(
      absl::StrCat("output ", i, " '", name, "' needs ", bytes, " bytes: the host allocation failed"));
}

namespace {

// A step's error, named after its node unless the kernel's message already starts with it or
// names another node (NamingItsNode).
absl::Status AtNode(const graph::Node& n, const absl::Status& s) {
  if (s.ok() || NamesItsNode(s)) return s;
  const std::string what = n.Describe();
  if (absl::StartsWith(s.message(), what)) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// ai.cleave.MemcpyFromHost / MemcpyToHost, inserted at host/device boundaries: the device
// provider's CopyTensor in either direction.
class CopyKernel : public providers::OpKernel {
 public:
  explicit CopyKernel(const providers::ExecutionProvider* device) : device_(device) {}
  absl::Status Compute(providers::KernelContext& ctx) const override {
    const TensorView* in = ctx.input(0);
    TensorView* out = ctx.Output(0, in->dim_span());
    if (!out) return absl::OkStatus();
    return device_->CopyTensor(*in, *out);
  }

 private:
  const providers::ExecutionProvider* device_;
};

// The memory of a host graph output: the caller's tensor when it already has this dtype and
// these dims (no allocation), else a new one in its place; null when that cannot be had.
void* HostOutputMemory(Tensor& t, DataType dtype, std::span<const int64_t> dims) {
  if (!t.defined() || t.dtype() != dtype || !std::equal(t.dims().begin(), t.dims().end(), dims.begin(), dims.end()))
    t = Tensor::TryAllocate(dtype, std::vector<int64_t>(dims.begin(), dims.end()), /*zero=*/false);
  return t.raw();
}
}  // namespace

// The KernelContext of one step of one run.
class Executor::Context : public providers::KernelContext {
 public:
  // `area`: the scratch this step uses; `comm`: the communicator it uses instead of its
  // provider's (an asynchronous collective's queue). An asynchronous step's context lives, and
  // is used on the queue's thread, until the step is waited for: it touches only its own slots
  // and keeps its counts until Settle().
  Context(Executor& ex, const Step& step, std::vector<Tensor>& outputs, ScratchArea& area, Communicator* comm = nullptr)
      : ex_(ex), step_(step), outputs_(outputs), area_(area), comm_(comm), planned_(ex.planned_) {}
  int num_inputs() const override { return static_cast<int>(step_.inputs.size()); }
  int num_outputs() const override { return static_cast<int>(step_.outputs.size()); }
  const TensorView* input(int i) const override {
    if (i >= static_cast<int>(step_.inputs.size()) || step_.inputs[i] < 0) return nullptr;
    return &ex_.views_[step_.inputs[i]];
  }
  ThreadPool* thread_pool() const override { return step_.provider->thread_pool(); }
  uint64_t run_seed() const override { return ex_.run_seed_; }
  Communicator* communicator() const override { return comm_ ? comm_ : step_.provider->communicator(); }

  TensorView* Output(int i, std::span<const int64_t> dims) override {
    if (i >= static_cast<int>(step_.outputs.size()) || step_.outputs[i] < 0) return nullptr;
    int slot = step_.outputs[i];
    DataType dtype = step_.node->output(i)->dtype();
    CheckAgainstInference(i, dims);
    const int64_t bytes = DenseBytes(dtype, dims);
    if (bytes < 0) return HostAllocationFailed(i, dims);
    void* p = nullptr;
    if (const int o = ex_.write_into_[slot]; o >= 0) {
      // A base that the step reading it updates in place into an output whose memory is
      // already fixed: written there now, so that the update touches only what it changes.
      void* q = ex_.FixedOutputMemory(o, dtype, dims, outputs_);
      const char* lo = static_cast<const char*>(q);
      for (int s : ex_.late_inputs_[slot]) {
        const TensorView& in = ex_.views_[s];
        const char* at = static_cast<const char*>(in.data);
        if (q && at && at < lo + bytes && lo < at + in.nbytes()) q = nullptr;  // read later: not overwritten
      }
      if (q) {
        ex_.views_[slot] = TensorView(q, dtype, dims);
        ++ex_.stats_.bases_in_place;
        return &ex_.views_[slot];
      }
    }
    if (const int in = ex_.view_of_[slot];
        in >= 0 && !ex_.bound_[slot] && bytes == static_cast<int64_t>(ex_.views_[in].nbytes())) {
      // A view op's output: the input's bytes under the new dims (kept alive as long as this);
      // one the caller bound a device tensor to is written there instead (the kernel copies).
      ex_.views_[slot] = TensorView(ex_.views_[in].data, dtype, dims);
      return &ex_.views_[slot];
    }
    if (void* bound = ex_.bound_[slot]) {
      // A device value the caller bound a device-resident output tensor to.
      if (bytes != ex_.bound_bytes_[slot]) {
        if (error_.ok())
          error_ = Internal("output ", i, " '", step_.node->output(i)->name(), "' has ", bytes,
                            " bytes and the device tensor bound to it ", ex_.bound_bytes_[slot]);
        return nullptr;
      }
      p = bound;
    } else if (int oi = ex_.output_index_[slot]; oi >= 0 && !ex_.output_to_device_[oi]) {
      p = HostOutputMemory(outputs_[oi], dtype, dims);
      if (!p) return HostAllocationFailed(i, dims);
    } else if (providers::ExecutionProvider* dev = ex_.slot_device_[slot]) {
      // A device value: back to the device's caching allocator at its last use.
      ex_.slot_heap_[slot] = DeviceBuffer(*dev, static_cast<size_t>(bytes), [&] {
        return absl::StrCat("output ", i, " '", step_.node->output(i)->name(), "' (", bytes, " bytes)");
      });
      p = ex_.slot_heap_[slot].get();
      if (!p) return nullptr;
    } else if (planned_ && bytes <= ex_.plan_bytes_[slot]) {
      p = static_cast<char*>(ex_.arena_.get()) + ex_.plan_offsets_[slot];
    } else {
      ex_.slot_heap_[slot] = TryAllocateAligned(static_cast<size_t>(bytes), /*zero=*/false);
      p = ex_.slot_heap_[slot].get();
      if (!p) return HostAllocationFailed(i, dims);
      ex_.recorded_bytes_[slot] = std::max(ex_.recorded_bytes_[slot], bytes);
      ++heap_allocations_;
      // Sizes changed under us: replan after the run (outputs on their way to a device are
      // never planned).
      if (planned_ && ex_.output_index_[slot] < 0) replan_ = true;
    }
    ex_.views_[slot] = TensorView(p, dtype, dims);
    return &ex_.views_[slot];
  }

  void* Scratch(size_t bytes) override {
    if (bytes > static_cast<size_t>(PTRDIFF_MAX) / 2) {  // no memory has it (and rounding up would wrap)
      if (error_.ok())
        error_ = absl::ResourceExhaustedError(absl::StrCat("scratch of ", bytes, " bytes: more than any memory holds"));
      return nullptr;
    }
    if (step_.provider->device() != providers::DeviceKind::kCpu) {
      // Device scratch, returned when the step ends.
      device_scratch_.push_back(
          DeviceBuffer(*step_.provider, bytes, [&] { return absl::StrCat("scratch of ", bytes, " bytes"); }));
      return device_scratch_.back().get();
    }
    size_t aligned = (bytes + 63) / 64 * 64;
    if (area_.used + aligned <= area_.bytes.size()) {
      void* p = area_.bytes.data() + area_.used;
      area_.used += aligned;
      return p;
    }
    // Does not fit this run: take a heap block and grow the scratch area for the next.
    std::shared_ptr<void> block = TryAllocateAligned(aligned, /*zero=*/false);
    if (!block) {
      if (error_.ok())
        error_ = absl::ResourceExhaustedError(absl::StrCat("scratch of ", bytes, " bytes: the host allocation failed"));
      return nullptr;
    }
    extra_.push_back(std::move(block));
    extra_bytes_ += aligned;
    ++heap_allocations_;
    return extra_.back().get();
  }
  size_t wanted_scratch() const { return area_.used + extra_bytes_; }
  // On the run's thread once the step is done: what it counted becomes the executor's.
  void Settle() {
    ex_.stats_.heap_allocations += heap_allocations_;
    heap_allocations_ = 0;
    if (replan_) ex_.planned_ = false;
  }

  // A buffer from the device's caching allocator, freed back to it; null with the allocation
  // error recorded (naming what() and the allocator's reason) when the device is full.
  template <typename What>
  std::shared_ptr<void> DeviceBuffer(providers::ExecutionProvider& device, size_t bytes, What what) {
    providers::Allocator* a = device.allocator();
    void* p = a->Allocate(std::max<size_t>(bytes, 1));
    if (!p) {
      if (error_.ok()) error_ = absl::ResourceExhaustedError(absl::StrCat(what(), ": ", a->last_error()));
      return nullptr;
    }
    return std::shared_ptr<void>(p, [a](void* q) { a->Free(q); });
  }
  const absl::Status& shape_error() const { return shape_error_; }
  const absl::Status& allocation_error() const { return error_; }

 private:
  Executor& ex_;
  const Step& step_;
  std::vector<Tensor>& outputs_;
  ScratchArea& area_;
  Communicator* comm_;
  const bool planned_;  // the plan as it stood when the step began
  bool replan_ = false;
  int64_t heap_allocations_ = 0;
  std::vector<std::shared_ptr<void>> extra_;  // scratch that did not fit (first runs only)
  std::vector<std::shared_ptr<void>> device_scratch_;
  absl::Status shape_error_, error_;

  // Records that output i, of `dims`, could not be had on the host; returns null for Output.
  TensorView* HostAllocationFailed(int i, std::span<const int64_t> dims) {
    if (error_.ok()) error_ = HostOutputError(*step_.node, i, step_.node->output(i)->dtype(), dims);
    return nullptr;
  }

  // Shape inference and kernels must agree: every static dim inference derived has to be
  // what the kernel produces. A disagreement is a bug in one of them, reported rather than
  // trusted, since passes (and the partitioner) plan with the inferred shapes.
  void CheckAgainstInference(int i, std::span<const int64_t> dims) {
    const Shape& want = step_.node->output(i)->shape();
    if (!want.has_rank() || !shape_error_.ok()) return;
    bool agree = want.rank() == static_cast<int>(dims.size());
    for (int k = 0; agree && k < want.rank(); ++k) {
      if (want[k].is_static()) agree = want[k].value == dims[k];
      else if (!want[k].symbol.empty()) agree = ex_.SymbolMatches(want[k].symbol, dims[k]);
    }
    if (!agree)
      shape_error_ = Internal("output ", i, " '", step_.node->output(i)->name(), "': the kernel made ",
                              DimsToString(dims.data(), static_cast<int>(dims.size())),
                              " but shape inference gave ", want.ToString());
  }
  size_t extra_bytes_ = 0;
};

// An asynchronous step: its context (alive until the wait), its own scratch, its ticket.
struct Executor::Pending {
  std::optional<Context> ctx;
  ScratchArea area;
  CommQueue::Ticket ticket = 0;
  bool in_flight = false;
};

Executor::~Executor() = default;  // a run waits for everything it launched

namespace {

// Nodes that only make graph outputs run as soon as their inputs are ready, not where the
// insertion order puts them: autodiff appends the gradient accumulations after the whole
// backward, and run there every gradient would be final only at the very end. Run early, a
// gradient is final (and its data-parallel reduction can start) while the rest of the backward
// runs, and its temporary is released sooner. A node that may write in place over a graph
// input that other nodes also read (same dtype and shape as one of its outputs) stays put, and
// so do messages and collectives: NCCL matches a pair's point-to-point messages by their order.
bool Communicates(const Node* n) {
  static const std::set<std::string> ops = {"Send", "Recv", "AllReduce", "AllGather", "ReduceScatter", "AllToAll",
                                            "Broadcast"};
  return n->domain() == graph::kCleaveDomain && ops.count(n->op_type());
}

// The collectives that can run asynchronously (a Broadcast is a start-up affair), and the
// messages, which can on a device.
bool IsCollective(const Node* n) {
  static const std::set<std::string> ops = {"AllReduce", "AllGather", "ReduceScatter", "AllToAll"};
  return n->domain() == graph::kCleaveDomain && ops.count(n->op_type());
}
bool IsMessage(const Node* n) {
  return n->domain() == graph::kCleaveDomain && (n->op_type() == "Send" || n->op_type() == "Recv");
}

// Whether `n` may write in place over a graph input that other nodes also read (an output of
// its dtype and shape): such a node must not run ahead of those readers.
bool MayOverwriteSharedInput(const Node* n) {
  for (const graph::Value* v : n->inputs()) {
    if (!v || !v->is_graph_input() || v->consumers().size() <= 1) continue;
    for (const graph::Value* o : n->outputs())
      if (o && o->dtype() == v->dtype() && o->shape().ToString() == v->shape().ToString()) return true;
  }
  return false;
}

std::vector<Node*> OutputsEarly(const std::vector<Node*>& order, const graph::Graph& g) {
  std::unordered_set<const graph::Value*> outs(g.outputs().begin(), g.outputs().end());
  std::unordered_map<const Node*, int> pos;
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int>(i);
  std::vector<std::vector<Node*>> after(order.size() + 1);  // [k + 1]: right after order[k]
  std::vector<char> moved(order.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    bool sink = n->num_outputs() > 0 && !Communicates(n);
    for (const graph::Value* o : n->outputs()) sink = sink && o && outs.count(o) && o->consumers().empty();
    sink = sink && !MayOverwriteSharedInput(n);
    int last = -1;
    for (const graph::Value* v : n->inputs())
      if (v && v->producer()) last = std::max(last, pos.at(v->producer()));
    if (!sink || last + 1 >= static_cast<int>(i)) continue;
    after[last + 1].push_back(order[i]);
    moved[i] = 1;
  }
  std::vector<Node*> out(after[0]);
  out.reserve(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    if (!moved[i]) out.push_back(order[i]);
    out.insert(out.end(), after[i + 1].begin(), after[i + 1].end());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    std::unique_ptr<graph::Graph> graph,
    std::vector<std::shared_ptr<providers::ExecutionProvider>> providers, ExecutorOptions options) {
  std::unique_ptr<Executor> ex(new Executor());
  ex->graph_ = std::move(graph);
  ex->providers_ = std::move(providers);
  ex->options_ = options;
  RETURN_IF_ERROR(ex->Build());
  return ex;
}

absl::Status Executor::Build() {
  ASSIGN_OR_RETURN(std::vector<Node*> order, graph_->TopologicalOrder());
  // Assign nodes greedily in provider priority order.
  Owners owner;
  std::unordered_map<const Node*, std::string> why;
  for (auto& p : providers_) has_device_ |= p->device() != providers::DeviceKind::kCpu;
  // With a device, the host provider's claims too (it comes last), for nodes better run there.
  std::unordered_map<const Node*, providers::NodeCapability> host_claim;
  for (auto& p : providers_) {
    providers::Capability cap = p->GetCapability(*graph_);
    for (auto& c : cap.claimed) {
      if (!owner.count(c.node)) owner.emplace(c.node, std::make_pair(p.get(), c));
      if (has_device_ && p->device() == providers::DeviceKind::kCpu) host_claim.emplace(c.node, c);
    }
    for (auto& r : cap.rejected)
      if (!why.count(r.node)) why[r.node] = r.reason;
  }
  std::vector<std::string> unsupported;
  for (Node* n : order)
    if (!owner.count(n)) unsupported.push_back(why.count(n) ? why[n] : n->Describe());
  if (!unsupported.empty())
    return Unimplemented(unsupported.size(), " node(s) cannot run on any provider:\n  ",
                         absl::StrJoin(unsupported, "\n  "));
  // Nodes on the host by design (placement.h): the shape arithmetic between host ends, and
  // kernels that read only the dims of their inputs (Shape), which read device values in place.
  std::unordered_set<const Node*> host_by_design;
  if (has_device_) host_by_design = PlaceOnHostByDesign(order, host_claim, providers_.back().get(), &owner);
  std::unordered_map<const Node*, providers::ExecutionProvider*> placed;
  for (const auto& [n, o] : owner) placed[n] = o.first;
  // Per node, the inputs its kernel reads on the host if it runs on a device (host_inputs),
  // or reads only the dims of if it runs on the host (shape_only_inputs); with a device only.
  std::unordered_map<const Node*, std::vector<int>> host_inputs;
  if (has_device_) {
    // Which ops fell back from the first provider, by op type.
    // Which ops fell back from the first provider, by op type, with the first node's reason.
    std::map<std::string, std::pair<int, std::string>> fell_back;
    for (Node* n : order) {
      if (placed[n] == providers_[0].get() || host_by_design.count(n)) continue;
      auto& [k, reason] = fell_back[(n->domain().empty() ? "" : n->domain() + ".") + n->op_type()];
      if (k++ == 0 && why.count(n)) reason = why[n];
    }
    if (!fell_back.empty()) {
      std::vector<std::string> ops, reasons;
      int count = 0;
      for (const auto& [op, kr] : fell_back) {
        ops.push_back(kr.first > 1 ? absl::StrCat(op, " x", kr.first) : op);
        if (!kr.second.empty()) reasons.push_back(kr.second);
        count += kr.first;
      }
      fallback_warning_ = absl::StrCat(count, " node(s) have no ", providers_[0]->name(), " kernel and run on ",
                                       providers_.back()->name(), " (copies inserted at the boundaries): ",
                                       absl::StrJoin(ops, ", "));
      for (const std::string& r : reasons) absl::StrAppend(&fallback_warning_, "\n  ", r);
    }
    for (const auto& [n, o] : owner) {
      const bool device = o.first->device() != providers::DeviceKind::kCpu;
      const std::vector<int>& read_on_host = device ? o.second.kernel->host_inputs : o.second.kernel->shape_only_inputs;
      if (!read_on_host.empty()) host_inputs[n] = read_on_host;
    }
    RETURN_IF_ERROR(PlaceOnDevices(placed, host_inputs));
    ASSIGN_OR_RETURN(order, graph_->TopologicalOrder());
  }
  order = OutputsEarly(order, *graph_);
  std::unordered_map<const Node*, int> wait_before;  // asynchronous node -> position in `order`
  if (options_.collectives) order = ScheduleCollectives(order, placed, &wait_before);
  for (Node* n : order) ++placement_[placed.at(n)->name()];

  std::unordered_map<const Value*, int> slot;
  auto slot_of = [&](const Value* v) {
    auto [it, inserted] = slot.emplace(v, num_slots_);
    if (inserted) ++num_slots_;
    return it->second;
  };
  for (Value* v : graph_->inputs()) input_slots_.push_back(slot_of(v));
  for (Value* v : graph_->Initializers()) slot_of(v);
  for (size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    Step s;
    s.node = n;
    s.provider = placed.at(n);
    s.order_pos = static_cast<int>(i);
    if (IsBoundaryCopy(*n)) {
      s.kernel = std::make_unique<CopyKernel>(s.provider);
    } else {
      ASSIGN_OR_RETURN(s.kernel, s.provider->CreateKernel(owner.at(n).second));
    }
    for (Value* v : n->inputs()) s.inputs.push_back(v ? slot_of(v) : -1);
    for (Value* v : n->outputs()) s.outputs.push_back(v ? slot_of(v) : -1);
    steps_.push_back(std::move(s));
  }
  for (Value* v : graph_->outputs()) output_slots_.push_back(slot_of(v));

  views_.assign(num_slots_, TensorView());
  is_constant_.assign(num_slots_, 0);
  output_index_.assign(num_slots_, -1);
  last_use_.assign(num_slots_, -1);
  def_step_.assign(num_slots_, -1);
  for (Value* v : graph_->Initializers()) {
    int s = slot.at(v);
    views_[s] = v->initializer()->view();
    is_constant_[s] = 1;
  }
  // Where each value lives: the device of its producer (a copy to the host makes a host value).
  slot_device_.assign(num_slots_, nullptr);
  for (const Step& st : steps_) {
    if (st.provider->device() == providers::DeviceKind::kCpu || st.node->op_type() == "MemcpyToHost") continue;
    for (int o : st.outputs)
      if (o >= 0) slot_device_[o] = st.provider;
  }
  // Initializers a device reads are uploaded once, here, instead of copied every run.
  std::vector<Step> kept;
  for (Step& st : steps_) {
    if (IsBoundaryCopy(*st.node) && st.node->op_type() == "MemcpyFromHost" && is_constant_[st.inputs[0]] &&
        st.outputs[0] >= 0) {
      const TensorView& src = views_[st.inputs[0]];
      providers::Allocator* a = st.provider->allocator();
      void* q = a->Allocate(std::max<size_t>(src.nbytes(), 1));
      if (!q)
        return absl::ResourceExhaustedError(absl::StrCat("uploading initializer '", st.node->input(0)->name(), "' (",
                                                         src.nbytes(), " bytes) to ", st.provider->name(), ": ",
                                                         a->last_error()));
      device_constants_.emplace_back(q, [a](void* x) { a->Free(x); });
      TensorView dst(q, src.dtype, src.dim_span());
      RETURN_IF_ERROR(st.provider->CopyTensor(src, dst));
      views_[st.outputs[0]] = dst;
      is_constant_[st.outputs[0]] = 1;
      continue;
    }
    kept.push_back(std::move(st));
  }
  steps_ = std::move(kept);
  const int num_steps = static_cast<int>(steps_.size());
  for (size_t i = 0; i < output_slots_.size(); ++i)
    if (output_index_[output_slots_[i]] < 0) output_index_[output_slots_[i]] = static_cast<int>(i);
  for (int st = 0; st < num_steps; ++st) {
    for (int s : steps_[st].inputs)
      if (s >= 0) last_use_[s] = st;
    for (int s : steps_[st].outputs)
      if (s >= 0) def_step_[s] = st, last_use_[s] = std::max(last_use_[s], st);
  }
  if (has_device_) FindHostReadFeeds(host_inputs);
  // Asynchronous steps: waited for before the first step at or after their wait position; what
  // they read and write stays alive until then.
  async_.assign(num_steps, 0);
  wait_step_.assign(num_steps, -1);
  waits_before_.assign(num_steps + 1, {});
  pending_.resize(num_steps);
  for (int st = 0; st < num_steps; ++st) {
    const auto it = wait_before.find(steps_[st].node);
    if (it == wait_before.end()) continue;
    const int w = static_cast<int>(
        std::lower_bound(steps_.begin(), steps_.end(), it->second,
                         [](const Step& step, int pos) { return step.order_pos < pos; }) - steps_.begin());
    async_[st] = 1;
    wait_step_[st] = w;
    waits_before_[w].push_back(st);
    pending_[st] = std::make_unique<Pending>();
    for (const std::vector<int>* slots : {&steps_[st].inputs, &steps_[st].outputs})
      for (int s : *slots)
        if (s >= 0) last_use_[s] = std::max(last_use_[s], std::min(w, num_steps - 1));
  }
  MakeViews();
  MakeBasesInPlace();
  release_after_.assign(num_steps, {});
  for (int s = 0; s < num_slots_; ++s)
    if (last_use_[s] >= 0 && output_index_[s] < 0 && !is_constant_[s]) release_after_[last_use_[s]].push_back(s);
  step_outputs_.assign(steps_.size(), {});
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    const int s = output_slots_[i];
    if (def_step_[s] >= 0 && output_index_[s] == static_cast<int>(i)) step_outputs_[def_step_[s]].push_back(static_cast<int>(i));
  }
  recorded_bytes_.assign(num_slots_, 0);
  slot_heap_.resize(num_slots_);
  skip_.assign(steps_.size(), 0);
  bound_.assign(num_slots_, nullptr);
  bound_bytes_.assign(num_slots_, 0);
  output_to_device_.assign(output_slots_.size(), nullptr);
  for (int st = 0; st < static_cast<int>(steps_.size()); ++st)
    if (IsBoundaryCopy(*steps_[st].node)) device_copy_steps_.push_back(st);
  size_t symbol_dims = 0;
  for (Value* v : graph_->inputs()) symbol_dims += v->shape().has_rank() ? v->shape().rank() : 0;
  symbol_values_.reserve(symbol_dims);
  return absl::OkStatus();
}

absl::Status Executor::PlaceOnDevices(std::unordered_map<const Node*, providers::ExecutionProvider*>& owner,
                                      const std::unordered_map<const Node*, std::vector<int>>& host_inputs) {
  ASSIGN_OR_RETURN(std::vector<Node*> order, graph_->TopologicalOrder());
  auto device_of = [&](const Node* n) -> providers::ExecutionProvider* {
    providers::ExecutionProvider* p = owner.at(n);
    if (p->device() == providers::DeviceKind::kCpu || n->op_type() == "MemcpyToHost") return nullptr;
    return p;
  };
  auto host_input = [&](const Node* n, int i) {
    const auto it = host_inputs.find(n);
    return it != host_inputs.end() && std::find(it->second.begin(), it->second.end(), i) != it->second.end();
  };
  auto add_copy = [&](const char* op, Value* in, Value* out, providers::ExecutionProvider* device) {
    Node* m = graph_->AddNode(op, {in}, {out}, graph_->UniqueName(out->name() + "/" + op), graph::kCleaveDomain);
    owner[m] = device;
    return m;
  };
  // A graph output made on a device: the producer writes a device value, a copy the output.
  std::set<const Value*> outputs(graph_->outputs().begin(), graph_->outputs().end());
  for (Node* n : order) {
    providers::ExecutionProvider* d = device_of(n);
    if (!d) continue;
    for (int o = 0; o < n->num_outputs(); ++o) {
      Value* v = n->output(o);
      if (!v || !outputs.count(v)) continue;
      Value* dv = graph_->GetOrCreateValue(graph_->UniqueName(v->name() + ".device"));
      dv->set_dtype(v->dtype());
      dv->set_shape(v->shape());
      auto readers = v->consumers();
      graph_->SetNodeOutput(n, o, dv);
      // Readers on the device read the device value; host readers share the output's copy.
      for (auto [reader, idx] : readers)
        if (device_of(reader) == d && !host_input(reader, idx)) graph_->SetNodeInput(reader, idx, dv);
      add_copy("MemcpyToHost", dv, v, d);
    }
  }
  // Every read across host and device: one copy per value and direction, shared by readers.
  std::map<std::pair<const Value*, providers::ExecutionProvider*>, Value*> copies;
  for (Node* n : order) {
    providers::ExecutionProvider* node_device = device_of(n);
    for (int i = 0; i < n->num_inputs(); ++i) {
      Value* v = n->input(i);
      if (!v) continue;
      // A host kernel that reads only the input's dims reads it where it is.
      if (!node_device && host_input(n, i)) continue;
      // Where the kernel wants this input.
      providers::ExecutionProvider* d = host_input(n, i) ? nullptr : node_device;
      providers::ExecutionProvider* home = v->producer() ? device_of(v->producer()) : nullptr;
      if (home == d) continue;
      if (home && d)
        return Unimplemented(n->Describe(), " on ", d->name(), " reads '", v->name(), "' made on ", home->name(),
                             ": copies between two devices are not supported");
      Value*& c = copies[{v, d}];
      if (!c) {
        c = graph_->GetOrCreateValue(graph_->UniqueName(v->name() + (d ? ".device" : ".host")));
        c->set_dtype(v->dtype());
        c->set_shape(v->shape());
        add_copy(d ? "MemcpyFromHost" : "MemcpyToHost", v, c, d ? d : home);
      }
      graph_->SetNodeInput(n, i, c);
    }
  }
  return absl::OkStatus();
}

void Executor::BindSymbols(const std::vector<TensorView>& inputs) {
  symbol_values_.clear();  // capacity reserved at load: no allocation
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Shape& s = graph_->inputs()[i]->shape();
    for (int k = 0; s.has_rank() && k < s.rank() && k < inputs[i].rank; ++k)
      if (!s[k].symbol.empty()) symbol_values_.emplace_back(&s[k].symbol, inputs[i].dims[k]);
  }
}

bool Executor::SymbolMatches(const std::string& symbol, int64_t value) const {
  for (const auto& [name, bound] : symbol_values_)
    if (*name == symbol) return bound == value;
  return true;  // a symbol no input carries (made up by an exporter) constrains nothing
}

std::vector<char> Executor::FeedSlots() const {
  std::vector<char> feed(num_slots_, 0);
  for (int s : input_slots_) feed[s] = !is_constant_[s];
  // A feed's device copy may be the caller's device tensor itself (a device-resident feed
  // skips the copy), so it counts as that feed. Steps run in order: a copy's source is marked
  // before it.
  for (const Step& st : steps_)
    if (IsBoundaryCopy(*st.node) && st.node->op_type() == "MemcpyFromHost" && st.inputs[0] >= 0 && st.outputs[0] >= 0 &&
        feed[st.inputs[0]])
      feed[st.outputs[0]] = 1;
  return feed;
}

// Reshape, Flatten, Squeeze, Unsqueeze and Identity outputs become views of their input's
// bytes (ONNX Runtime's Reshape does the same), whose buffer then lives until the view's last
// use. Not for graph outputs (the caller's tensors), nor over a graph input other than a
// constant: the caller may bind an input and an output to one tensor that a later step
// updates in place, while the copy would have kept the values it was made with.
void Executor::MakeViews() {
  view_of_.assign(num_slots_, -1);
  std::vector<int> root(num_slots_);
  for (int s = 0; s < num_slots_; ++s) root[s] = s;
  const std::vector<char> is_feed = FeedSlots();
  for (const Step& st : steps_) {
    if (!IsViewOp(*st.node) || st.inputs.empty()) continue;
    const int in = st.inputs[0], out = st.outputs.empty() ? -1 : st.outputs[0];
    if (in < 0 || out < 0 || output_index_[out] >= 0) continue;
    const int r = root[in];
    if (output_index_[r] >= 0 || is_feed[r]) continue;
    if (slot_device_[out] != slot_device_[in]) continue;
    view_of_[out] = in;
    root[out] = r;
  }
  // Steps run in order, so a view's root was defined before it: one pass extends each root.
  for (int s = 0; s < num_slots_; ++s)
    if (view_of_[s] >= 0) last_use_[root[s]] = std::max(last_use_[root[s]], last_use_[s]);
}

// A GatherGrad's base (input 3; an accumulated gradient the scatter adds rows to) is written
// where the scatter's result will lie when that result is a graph output (or bound to a
// caller's device tensor through its copy to the host): the scatter then updates it in place
// and touches only the rows it adds to, instead of copying the whole table first. Only for a
// base that the scatter alone reads, made on the result's device by a step that is neither
// asynchronous nor a copy. Writing the base early must overwrite nothing still to be read:
// the graph inputs (and their device copies, which may be the caller's tensors themselves)
// that a step reads after the base's producer, the scatter aside, are kept per base, and a run
// writes the base in place only where none of them lies in the result's memory.
void Executor::MakeBasesInPlace() {
  write_into_.assign(num_slots_, -1);
  late_inputs_.assign(num_slots_, {});
  const std::vector<char> is_feed = FeedSlots();
  std::vector<std::vector<int>> readers(num_slots_);
  for (int st = 0; st < static_cast<int>(steps_.size()); ++st)
    for (int s : steps_[st].inputs)
      if (s >= 0) readers[s].push_back(st);
  for (int st = 0; st < static_cast<int>(steps_.size()); ++st) {
    const Step& step = steps_[st];
    const Node* n = step.node;
    if (n->domain() != graph::kCleaveDomain || n->op_type() != "GatherGrad" || step.inputs.size() < 4 ||
        step.outputs.empty())
      continue;
    const int b = step.inputs[3], o = step.outputs[0];
    if (b < 0 || o < 0 || readers[b].size() != 1 || def_step_[b] < 0 || async_[def_step_[b]] || async_[st] ||
        IsBoundaryCopy(*steps_[def_step_[b]].node) || output_index_[b] >= 0 || is_constant_[b] || view_of_[b] >= 0 ||
        slot_device_[b] != slot_device_[o])
      continue;
    const graph::Value* bv = n->input(3);
    const graph::Value* ov = n->output(0);
    if (bv->dtype() != ov->dtype() || !bv->shape().is_static() || bv->shape() != ov->shape()) continue;
    bool possible = true;
    std::vector<int> late;
    for (int s = 0; s < num_slots_ && possible; ++s) {
      if (!is_feed[s]) continue;
      bool read_late = false;
      for (int r : readers[s]) {
        possible = possible && !async_[r];  // an asynchronous reader's timing is not the step order's
        read_late = read_late || (r > def_step_[b] && r != st);
      }
      if (read_late) late.push_back(s);
    }
    if (!possible) continue;
    write_into_[b] = o;
    late_inputs_[b] = std::move(late);
  }
}

void* Executor::FixedOutputMemory(int o, DataType dtype, std::span<const int64_t> dims, std::vector<Tensor>& outputs) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(ElementSize(dtype));
  if (void* bound = bound_[o]) return bytes == bound_bytes_[o] ? bound : nullptr;
  const int oi = output_index_[o];
  if (oi < 0 || output_to_device_[oi] || slot_device_[o]) return nullptr;
  return HostOutputMemory(outputs[oi], dtype, dims);
}

void Executor::MakePlan() {
  std::vector<BufferRequest> req;
  std::vector<int> req_slot;
  for (int s = 0; s < num_slots_; ++s) {
    if (def_step_[s] < 0 || output_index_[s] >= 0 || is_constant_[s] || slot_device_[s]) continue;
    if (view_of_[s] >= 0) continue;  // the input's bytes
    req.push_back({recorded_bytes_[s], def_step_[s], last_use_[s]});
    req_slot.push_back(s);
  }
  MemoryPlan plan = PlanMemory(req);
  plan_offsets_.assign(num_slots_, 0);
  plan_bytes_.assign(num_slots_, -1);
  for (size_t i = 0; i < req.size(); ++i) {
    plan_offsets_[req_slot[i]] = plan.offsets[i];
    plan_bytes_[req_slot[i]] = req[i].bytes;
  }
  arena_ = TryAllocateAligned(static_cast<size_t>(plan.arena_bytes), /*zero=*/false);
  if (!arena_) return;  // runs keep taking heap buffers (each failing with its own error)
  stats_.arena_bytes = plan.arena_bytes;
  ++stats_.plans;
  planned_ = true;
}

std::vector<int> Executor::OutputSteps() const {
  std::vector<int> at(output_slots_.size(), -1);
  for (size_t st = 0; st < step_outputs_.size(); ++st)
    for (int oi : step_outputs_[st]) at[oi] = async_[st] ? wait_step_[st] : static_cast<int>(st);
  return at;
}

std::vector<AsyncCollective> Executor::async_collectives() const {
  std::vector<AsyncCollective> out;
  for (size_t st = 0; st < steps_.size(); ++st)
    if (async_[st])
      out.push_back({steps_[st].node->name(), steps_[st].node->op_type(), static_cast<int>(st), wait_step_[st]});
  return out;
}

std::vector<Node*> Executor::ScheduleCollectives(
    const std::vector<Node*>& order, const std::unordered_map<const Node*, providers::ExecutionProvider*>& placed,
    std::unordered_map<const Node*, int>* wait_before) const {
  // A collective runs on the queue when the queue moves the memory its provider keeps tensors
  // in. On a device, Send and Recv do too: deferred on the queue's stream behind the
  // collectives, in their order (every rank moves all its messages there, so pairs still meet
  // in order), the compute stream goes on while they travel. A host worker would stall every
  // collective behind a receive, and MPI sends already return at once.
  const bool device_queue = options_.collectives->device();
  auto is_async = [&](const Node* n) {
    if ((placed.at(n)->device() != providers::DeviceKind::kCpu) != device_queue) return false;
    return IsCollective(n) || (device_queue && IsMessage(n));
  };
  AsyncSchedule s = ScheduleAsync(*graph_, order, is_async, Communicates, MayOverwriteSharedInput,
                                  {options_.max_in_flight, options_.lookahead});
  *wait_before = std::move(s.wait_before);
  return std::move(s.order);
}

void Executor::Launch(int st, std::vector<Tensor>& outputs, Profiler* profiler) {
  Pending& p = *pending_[st];
  CommQueue* queue = options_.collectives;
  p.area.used = 0;
  p.ctx.emplace(*this, steps_[st], outputs, p.area, queue->comm());
  p.in_flight = true;
  const int track = profiler ? profiler->Track("collectives") : 0;
  const int64_t queued_us = profiler ? Profiler::Micros(Profiler::Clock::now()) : 0;
  p.ticket = queue->Submit([this, st, profiler, track, queued_us, device = queue->device()] {
    const Step& step = steps_[st];
    const auto start = Profiler::Clock::now();
    absl::Status s = step.kernel->Compute(*pending_[st]->ctx);
    if (profiler && !device)  // device work is only queued here
      profiler->Add(step.node->name(), step.node->op_type(), track, start, Profiler::Clock::now(),
                    {{"queued_us", absl::StrCat(queued_us)}});
    return AtNode(*step.node, s);
  });
}

Executor::DeviceTimer& Executor::TimerOf(const providers::ExecutionProvider* p) {
  for (DeviceTimer& t : timers_)
    if (t.provider == p) return t;
  timers_.push_back({p, p->MakeStreamTimer()});
  return timers_.back();
}

// A timer's round starts at the run's first mark on it, taken as the host time just before that
// mark (the stream is idle then, or nearly: the previous run waited for it).
absl::Status Executor::AddDeviceSpans(Profiler& profiler, const std::vector<DeviceSpan>& spans) {
  absl::Status first;
  for (DeviceTimer& t : timers_) {
    if (!t.timer) continue;
    absl::StatusOr<std::vector<double>> collected = t.timer->Collect();  // every timer's round ends
    if (!collected.ok()) {
      if (first.ok()) first = collected.status();
      continue;
    }
    const std::vector<double>& us = *collected;
    const int track = profiler.Track(absl::StrCat(t.provider->name(), " stream"));
    for (const DeviceSpan& d : spans) {
      if (d.timer != t.timer.get() || d.end >= static_cast<int>(us.size())) continue;
      const Step& step = steps_[d.step];
      const double device_us = us[d.end] - us[d.begin];
      Profiler::Event e;
      e.name = step.node->name();
      e.category = step.node->op_type();
      e.track = track;
      e.start_us = t.anchor_us + static_cast<int64_t>(us[d.begin]);
      e.duration_us = static_cast<int64_t>(device_us);
      e.args = {{"provider", t.provider->name()}, {"device_us", absl::StrFormat("%.1f", device_us)}};
      profiler.Add(std::move(e));
    }
  }
  return first;
}

// The graph outputs step `st` has made: those it writes (unless a host step makes them, to be
// copied to the caller's device tensor after the run), and those whose copy to the caller's
// device tensor it made unnecessary.
void Executor::Report(int st, const RunObservers* observers, std::vector<char>& reported) const {
  auto report = [&](int oi) {
    if (reported[oi]) return;
    reported[oi] = 1;
    observers->output_ready(oi);
  };
  for (int oi : step_outputs_[st])
    if (!output_to_device_[oi]) report(oi);
  if (static_cast<size_t>(st) < bound_reports_.size())
    for (int oi : bound_reports_[st]) report(oi);
}

absl::Status Executor::Finish(int st, const RunObservers* observers, std::vector<char>& reported) {
  Pending& p = *pending_[st];
  p.in_flight = false;
  absl::Status s = options_.collectives->Wait(p.ticket);  // names its node
  Context& ctx = *p.ctx;
  absl::Status mine = !ctx.allocation_error().ok() ? ctx.allocation_error() : ctx.shape_error();
  ctx.Settle();
  if (ctx.wanted_scratch() > p.area.bytes.size()) p.area.bytes.resize(ctx.wanted_scratch());
  p.ctx.reset();
  if (!mine.ok()) return absl::Status(mine.code(), absl::StrCat(steps_[st].node->Describe(), ": ", mine.message()));
  if (!s.ok()) return s;
  if (observers && observers->output_ready) Report(st, observers, reported);
  return absl::OkStatus();
}

absl::Status Executor::Run(const std::vector<TensorView>& inputs, std::vector<Tensor>& outputs,
                          uint64_t run_seed, const RunObservers* observers) {
  CLEAVE_CHECK(inputs.size() == input_slots_.size());
  std::lock_guard<std::mutex> lock(run_mu_);
  run_seed_ = run_seed;
  // The input-shape signature selects the memory plan; compared in place, no allocation.
  size_t k = 0;
  bool same = true;
  for (const TensorView& v : inputs) {
    same = same && k < signature_.size() && signature_[k] == v.rank;
    ++k;
    for (int d = 0; d < v.rank; ++d, ++k) same = same && k < signature_.size() && signature_[k] == v.dims[d];
  }
  if (!same || k != signature_.size()) {
    signature_.clear();
    for (const TensorView& v : inputs) {
      signature_.push_back(v.rank);
      signature_.insert(signature_.end(), v.dims, v.dims + v.rank);
    }
    planned_ = false;
    std::fill(recorded_bytes_.begin(), recorded_bytes_.end(), 0);
  }
  bool was_planned = planned_;
  for (size_t i = 0; i < inputs.size(); ++i) views_[input_slots_[i]] = inputs[i];
  BindSymbols(inputs);
  outputs.resize(output_slots_.size());
  if (absl::Status bound = BindDeviceResident(outputs); !bound.ok()) return bound;
  size_t scratch_wanted = scratch_.bytes.size();
  absl::Status status;
  Profiler* profiler = observers && observers->profiler && observers->profiler->enabled() ? observers->profiler : nullptr;
  const bool report = observers && observers->output_ready;
  std::vector<char> reported(report ? outputs.size() : 0, 0);
  std::vector<DeviceSpan> device_spans;
  for (int st = 0; st < static_cast<int>(steps_.size()) && status.ok(); ++st) {
    for (int a : waits_before_[st])
      if (absl::Status s = Finish(a, observers, reported); status.ok()) status = s;
    if (!status.ok()) break;
    if (skip_[st]) continue;
    if (async_[st]) {
      Launch(st, outputs, profiler);
      continue;
    }
    Step& step = steps_[st];
    DeviceTimer* timer = profiler && step.provider ? &TimerOf(step.provider) : nullptr;
    if (timer && !timer->timer) timer = nullptr;
    scratch_.used = 0;
    Context ctx(*this, step, outputs, scratch_);
    // The node's host event spans its stream marks, so that a stream span is never longer
    // than the launch that made it when the stream keeps up with the host.
    const auto started = profiler ? Profiler::Clock::now() : Profiler::Clock::time_point();
    int mark = -1;
    if (timer) {
      absl::StatusOr<int> m = timer->timer->Mark();
      if (!m.ok()) {
        status = m.status();
        break;
      }
      if ((mark = *m) == 0) timer->anchor_us = Profiler::Micros(started);
    }
#if CLEAVE_HAVE_CUDA
    // Device nodes are named ranges for Nsight Systems, beside the kernels they launch (and the
    // NCCL kernels of overlapped reductions on their own stream); a no-op without the tool.
    const bool named = step.provider && step.provider->device() != providers::DeviceKind::kCpu;
    if (named) nvtxRangePushA(step.node->name().c_str());
#endif
    status = step.kernel->Compute(ctx);
#if CLEAVE_HAVE_CUDA
    if (named) nvtxRangePop();
#endif
    if (timer && status.ok()) {
      absl::StatusOr<int> end = timer->timer->Mark();
      if (end.ok()) device_spans.push_back({st, timer->timer.get(), mark, *end});
      else status = end.status();
    }
    if (profiler)
      profiler->Add(step.node->name(), step.node->op_type(), observers->track, started, Profiler::Clock::now(),
                    {{"provider", step.provider ? step.provider->name() : "cpu"}});
    if (report && status.ok()) Report(st, observers, reported);
    // A failed allocation explains whatever the kernel then reported; a shape disagreement
    // only matters when the kernel itself succeeded.
    if (!ctx.allocation_error().ok()) status = ctx.allocation_error();
    else if (status.ok()) status = ctx.shape_error();
    ctx.Settle();
    scratch_wanted = std::max(scratch_wanted, ctx.wanted_scratch());
    for (int s : release_after_[st]) slot_heap_[s].reset();  // heap and device buffers at their last use
    status = AtNode(*step.node, status);
  }
  // The collectives waited for at the end of the run, and after an error whatever is still in
  // flight (its buffers must outlive it).
  for (size_t st = 0; st < pending_.size(); ++st)
    if (pending_[st] && pending_[st]->in_flight)
      if (absl::Status s = Finish(static_cast<int>(st), observers, reported); status.ok()) status = s;
  // Host-made outputs whose tensors are device-resident: copied there now.
  for (size_t oi = 0; oi < output_to_device_.size() && status.ok(); ++oi) {
    if (!output_to_device_[oi]) continue;
    TensorView dst = outputs[oi].view();
    status = output_to_device_[oi]->CopyTensor(views_[output_slots_[oi]], dst);
  }
  for (auto& buffer : slot_heap_) buffer.reset();
  if (profiler && !timers_.empty()) {
    // Collected even after an error, so that a timer's next round starts afresh.
    absl::Status timed = AddDeviceSpans(*profiler, device_spans);
    if (status.ok()) status = timed;
  }
  if (!status.ok()) return status;
  if (scratch_wanted > scratch_.bytes.size()) scratch_.bytes.resize(scratch_wanted);
  // Graph outputs that no step writes (inputs or initializers passed straight through).
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    int s = output_slots_[i];
    if (def_step_[s] >= 0 && output_index_[s] == static_cast<int>(i)) continue;
    outputs[i] = CopyToTensor(views_[s]);
  }
  if (report)
    for (size_t oi = 0; oi < outputs.size(); ++oi)
      if (!reported[oi]) observers->output_ready(static_cast<int>(oi));
  if (!planned_ || !was_planned) MakePlan();
  ++stats_.runs;
  return absl::OkStatus();
}

}  // namespace cleave::runtime
