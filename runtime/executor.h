// The executor (runtime/): runs a verified graph's nodes in a run order fixed at load.
// Every value has a slot; initializers are bound to their slots once. The first run for a
// given set of input shapes records each activation's size and plans one arena from
// liveness (memory_plan.h); later runs with the same shapes place every activation in the
// arena. Outputs the graph returns are written straight into caller-visible tensors.
//
// With a device provider (CUDA) ahead of the CPU one, each node runs on the first provider
// that claims it. Where a value crosses between host and device the executor inserts an
// ai.cleave.MemcpyFromHost or MemcpyToHost node (run by the device provider's CopyTensor);
// initializers a device node reads are uploaded once at load, and graph outputs made on the
// device are copied back under their own names. Device values live in the device
// provider's allocator (a caching arena), released at their last use; device kernels get
// device scratch.
//
// With a communication queue (ExecutorOptions::collectives), the collectives (AllReduce,
// AllGather, ReduceScatter, AllToAll) of the provider whose memory that queue moves, and on a
// device also Send and Recv, run asynchronously: each is launched on the queue where the run
// order puts it and waited for just before the first step that needs its result, the order
// placing independent work in between (async_schedule.h). Its inputs and outputs stay alive
// until that wait.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "providers/execution_provider.h"
#include "providers/kernel.h"
#include "runtime/comm_queue.h"

namespace cleave::runtime {

class Profiler;

// ai.cleave.MemcpyFromHost / MemcpyToHost, inserted at host/device boundaries. The executor
// skips such a copy of a feed already in the device's memory, or into a device tensor the
// caller bound to an output.
bool IsBoundaryCopy(const graph::Node& n);
// Reshape, Flatten, Squeeze, Unsqueeze and Identity: the executor makes their result a view of
// their input's bytes where it can (see MakeViews).
bool IsViewOp(const graph::Node& n);

struct ExecutorOptions {
  // Runs the collectives asynchronously on this queue (not owned; null: all run in line).
  CommQueue* collectives = nullptr;
  int max_in_flight = 2;  // collectives pending at once
  int lookahead = 64;     // nodes that may run ahead of one that waits for a collective
};

// What a run reports as it goes: each node's time to a profiler (on `track`), and each graph
// output to `output_ready` once it is final: after the step that writes it (a device output is
// then queued on the device's stream), or at the end of the run for outputs no step writes.
struct RunObservers {
  Profiler* profiler = nullptr;
  int track = 0;
  std::function<void(int output)> output_ready;
};

struct ExecutorStats {
  int64_t runs = 0;
  int64_t plans = 0;
  int64_t arena_bytes = 0;
  int64_t heap_allocations = 0;
  int64_t bases_in_place = 0;  // values written where the output that updates them lies
};

class Executor {
 public:
  // Takes the graph (shapes inferred) and the providers in priority order. Fails listing
  // every node no provider can run.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(
      std::unique_ptr<graph::Graph> graph,
      std::vector<std::shared_ptr<providers::ExecutionProvider>> providers, ExecutorOptions options = {});
  ~Executor();

  // inputs: one view per graph input, in graph order (already validated by the caller).
  // Runs are serialised: concurrent callers wait for each other (activations share one arena).
  // outputs: one tensor per graph output; undefined tensors are allocated here, defined ones
  // (RunInto) must have the produced dtype and shape.
  // run_seed: what KernelContext::run_seed() returns to every kernel of this run.
  absl::Status Run(const std::vector<TensorView>& inputs, std::vector<Tensor>& outputs,
                   uint64_t run_seed = providers::KernelContext::kNoRunSeed, const RunObservers* observers = nullptr);

  // The step (index in run order) that writes each graph output, -1 where none does: the
  // order in which a run makes its outputs final. (An asynchronous collective's output is
  // final at the step that waits for it.)
  std::vector<int> OutputSteps() const;

  // The collectives that run asynchronously.
  std::vector<AsyncCollective> async_collectives() const;

  const graph::Graph& graph() const { return *graph_; }
  const ExecutorStats& stats() const { return stats_; }
  // Nodes per provider name (copies included), and a warning listing the ops that fell back
  // from the first provider to a later one ("" when none did or there is one provider).
  const std::map<std::string, int>& placement() const { return placement_; }
  const std::string& fallback_warning() const { return fallback_warning_; }

 private:
  struct Step;
  class Context;
  struct ScratchArea {
    std::vector<char> bytes;
    size_t used = 0;
  };
  struct Pending;  // an asynchronous step in flight
  Executor() = default;
  absl::Status Build();
  // Inserts the host/device copies for the nodes' owners; uploads device constants.
  // host_inputs: per device node, the inputs its kernel reads on the host; per host node, the
  // inputs it reads only the dims of, wherever they are (no copy).
  absl::Status PlaceOnDevices(std::unordered_map<const graph::Node*, providers::ExecutionProvider*>& owner,
                              const std::unordered_map<const graph::Node*, std::vector<int>>& host_inputs);
  // The run order with the asynchronous collectives placed (async_schedule.h).
  std::vector<graph::Node*> ScheduleCollectives(
      const std::vector<graph::Node*>& order,
      const std::unordered_map<const graph::Node*, providers::ExecutionProvider*>& placed,
      std::unordered_map<const graph::Node*, int>* wait_before) const;
  void Launch(int st, std::vector<Tensor>& outputs, Profiler* profiler);
  // Profiling a device node: stream marks around its kernels, turned into an event on the
  // stream's track once the run has collected the marks.
  struct DeviceTimer {
    const providers::ExecutionProvider* provider;
    std::unique_ptr<providers::StreamTimer> timer;  // null: the provider's kernels are synchronous
    int64_t anchor_us = 0;  // host time just before this run's first mark
  };
  struct DeviceSpan {
    int step;
    providers::StreamTimer* timer;
    int begin, end;
  };
  DeviceTimer& TimerOf(const providers::ExecutionProvider* p);
  absl::Status AddDeviceSpans(Profiler& profiler, const std::vector<DeviceSpan>& spans);
  // Waits for asynchronous step `st`: its error, if any, names the node.
  void Report(int st, const RunObservers* observers, std::vector<char>& reported) const;
  absl::Status Finish(int st, const RunObservers* observers, std::vector<char>& reported);
  void MakePlan();
  // This run's device-resident feeds (read in place by device steps, through a host copy by
  // host ones) and outputs (written in place).
  absl::Status BindDeviceResident(const std::vector<Tensor>& outputs);
  // The feeds the host reads (a host kernel beyond their dims, a device kernel's host input, or
  // an output passed straight through), given per node the inputs its kernel reads on the host
  // when placed on a device, or only the dims of when placed on the host: BindDeviceResident
  // stages those of a run's feeds that are in a device's memory in host buffers. Load time,
  // with a device provider.
  void FindHostReadFeeds(const std::unordered_map<const graph::Node*, std::vector<int>>& host_inputs);
  // Symbolic dims of the graph inputs bound to this run's sizes, for the shape checks.
  void BindSymbols(const std::vector<TensorView>& inputs);
  // Per slot: a graph input other than a constant, or its copy to a device.
  std::vector<char> FeedSlots() const;
  void MakeViews();
  void MakeBasesInPlace();
  // The memory output slot `o` is written in this run when it is fixed before its step runs (a
  // caller's device tensor bound to it, or the caller's host output tensor), else null.
  void* FixedOutputMemory(int o, DataType dtype, std::span<const int64_t> dims, std::vector<Tensor>& outputs);
  bool SymbolMatches(const std::string& symbol, int64_t value) const;

  std::unique_ptr<graph::Graph> graph_;
  std::vector<std::shared_ptr<providers::ExecutionProvider>> providers_;
  std::vector<Step> steps_;
  int num_slots_ = 0;
  std::vector<int> input_slots_, output_slots_;
  std::vector<TensorView> views_;      // per slot, current run
  std::vector<char> is_constant_;      // per slot: bound initializer
  std::vector<int> output_index_;      // per slot: graph output index or -1
  std::vector<int> last_use_;          // per slot: last step that reads it
  std::vector<int> def_step_;          // per slot: step that writes it, -1 for inputs
  std::vector<int> view_of_;           // per slot: the slot whose bytes it views (view ops), -1
  // Per slot: the output slot in whose memory it is written where that memory is fixed (a
  // scatter's base that its result then updates in place), -1.
  std::vector<int> write_into_;
  // Per such slot: the graph inputs (and feeds' device copies) read after it is made, which
  // must not lie in that output's memory for it to be written there.
  std::vector<std::vector<int>> late_inputs_;
  std::vector<std::vector<int>> step_outputs_;  // per step: the graph outputs it writes
  // Memory plan for the current input-shape signature.
  std::vector<int64_t> signature_;
  bool planned_ = false;
  std::vector<int64_t> recorded_bytes_, plan_offsets_, plan_bytes_;
  std::shared_ptr<void> arena_;
  std::vector<std::shared_ptr<void>> slot_heap_;  // buffers outside the arena, per slot, this run
  std::vector<providers::ExecutionProvider*> slot_device_;  // per slot: its device provider, null on the host
  // This run: copy steps skipped because the feed or the bound output is device-resident, and
  // device slots written straight into a caller's device tensor (with its bytes).
  std::vector<char> skip_;
  std::vector<void*> bound_;
  std::vector<int64_t> bound_bytes_;
  // Per step, this run: the graph outputs it writes straight into a caller's device tensor
  // (their copy step skipped), reported ready once the step has run rather than at the end.
  std::vector<std::vector<int>> bound_reports_;
  // Per graph output, this run: the device provider whose memory the caller's tensor is in,
  // when a host step makes the output (it is made on the host, then copied there).
  std::vector<providers::ExecutionProvider*> output_to_device_;
  bool has_device_ = false;             // a provider other than the CPU
  // The graph inputs read on the host (not just their dims), and per such input the host
  // buffer (and its bytes) that holds a device-resident feed's copy in a run.
  std::vector<int> host_read_feeds_;
  std::vector<std::pair<std::shared_ptr<void>, size_t>> feed_staging_;
  std::vector<int> device_copy_steps_;  // the MemcpyFromHost / MemcpyToHost steps
  std::vector<std::shared_ptr<void>> device_constants_;     // initializers uploaded at load
  std::map<std::string, int> placement_;
  std::string fallback_warning_;
  ScratchArea scratch_;
  // Asynchronous collectives: per step whether it is one, and the step it is waited for
  // before; per step the asynchronous steps waited for before it (index steps_.size(): at the
  // end of the run) and the heap buffers released after it; per step the one in flight.
  ExecutorOptions options_;
  std::vector<char> async_;
  std::vector<int> wait_step_;
  std::vector<std::vector<int>> waits_before_;
  std::vector<std::vector<int>> release_after_;
  std::vector<std::unique_ptr<Pending>> pending_;
  // Stream timers of the device providers, made when a run is first profiled.
  std::vector<DeviceTimer> timers_;
  ExecutorStats stats_;
  std::mutex run_mu_;
  uint64_t run_seed_ = providers::KernelContext::kNoRunSeed;
  std::vector<std::pair<const std::string*, int64_t>> symbol_values_;
};

}  // namespace cleave::runtime
