// The executor's binding of device-resident feeds and outputs for one run (runtime/): a feed
// already in a device's memory is read there by device steps and through one host copy by host
// steps; a graph output the caller gave device memory for is written there by its producer.
// Load time works out who reads what; a run only binds views and copies.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "runtime/executor.h"
#include "runtime/executor_step.h"

namespace cleave::runtime {

namespace {

// The device provider whose allocator holds p, or null (host memory, or no pointer).
providers::ExecutionProvider* DeviceHolding(const std::vector<std::shared_ptr<providers::ExecutionProvider>>& providers,
                                            const void* p) {
  for (const auto& d : providers)
    if (p && d->device() != providers::DeviceKind::kCpu && d->allocator()->Owns(p)) return d.get();
  return nullptr;
}

}  // namespace

void Executor::FindHostReadFeeds(const std::unordered_map<const graph::Node*, std::vector<int>>& host_inputs) {
  std::vector<char> host_read(num_slots_, 0);
  const std::vector<int> none;
  for (const Step& st : steps_) {
    if (IsBoundaryCopy(*st.node)) continue;
    const bool device = st.provider->device() != providers::DeviceKind::kCpu;
    const auto it = host_inputs.find(st.node);
    const std::vector<int>& listed = it == host_inputs.end() ? none : it->second;
    for (int i = 0; i < static_cast<int>(st.inputs.size()); ++i)
      if (st.inputs[i] >= 0 && device == (std::find(listed.begin(), listed.end(), i) != listed.end()))
        host_read[st.inputs[i]] = 1;
  }
  for (int s : output_slots_)
    if (def_step_[s] < 0) host_read[s] = 1;
  for (int i = 0; i < static_cast<int>(input_slots_.size()); ++i)
    if (!is_constant_[input_slots_[i]] && host_read[input_slots_[i]]) host_read_feeds_.push_back(i);
  feed_staging_.resize(host_read_feeds_.size());
}

absl::Status Executor::BindDeviceResident(const std::vector<Tensor>& outputs) {
  if (!has_device_) return absl::OkStatus();  // nothing can be device-resident
  std::fill(output_to_device_.begin(), output_to_device_.end(), nullptr);
  bound_reports_.assign(steps_.size(), {});
  for (int st : device_copy_steps_) {
    skip_[st] = 0;
    bound_[steps_[st].inputs[0]] = nullptr;
  }
  for (size_t oi = 0; oi < output_slots_.size() && oi < outputs.size(); ++oi) {
    const int slot = output_slots_[oi];
    if (!outputs[oi].defined() || def_step_[slot] < 0 || slot_device_[slot]) continue;
    output_to_device_[oi] = DeviceHolding(providers_, outputs[oi].raw());
  }
  for (int st : device_copy_steps_) {
    const Step& step = steps_[st];
    const providers::Allocator* a = step.provider->allocator();
    const int in = step.inputs[0], out = step.outputs[0];
    if (out < 0) continue;
    if (step.node->op_type() == "MemcpyFromHost") {
      // A feed already in this device's memory is read where it is.
      if (def_step_[in] < 0 && !is_constant_[in] && views_[in].data && a->Owns(views_[in].data)) {
        views_[out] = views_[in];
        skip_[st] = 1;
      }
      continue;
    }
    // A graph output the caller gave a device tensor for, read by no host step: its producer
    // writes there. (With host readers the copy runs into a host buffer, which is copied to
    // the caller's tensor after the run.)
    const int oi = output_index_[out];
    if (oi < 0 || oi >= static_cast<int>(outputs.size()) || !outputs[oi].defined() || !a->Owns(outputs[oi].raw()) ||
        last_use_[out] > st)
      continue;
    bound_[in] = outputs[oi].raw();
    bound_bytes_[in] = static_cast<int64_t>(outputs[oi].nbytes());
    output_to_device_[oi] = nullptr;
    skip_[st] = 1;
    if (def_step_[in] >= 0) bound_reports_[def_step_[in]].push_back(oi);
  }
  // A feed in a device's memory that the host reads: a host copy for this run's host readers
  // (device readers were given the device view above). The copy's buffer is kept for later runs.
  for (size_t k = 0; k < host_read_feeds_.size(); ++k) {
    const int feed = host_read_feeds_[k];
    TensorView& v = views_[input_slots_[feed]];
    providers::ExecutionProvider* d = DeviceHolding(providers_, v.data);
    if (!d) continue;
    auto& [buffer, capacity] = feed_staging_[k];
    if (capacity < v.nbytes()) {
      buffer = HeapBuffer(v.nbytes());
      capacity = v.nbytes();
      ++stats_.heap_allocations;
    }
    TensorView host(buffer.get(), v.dtype, v.dim_span());
    if (absl::Status s = d->CopyTensor(v, host); !s.ok())
      return absl::Status(s.code(), absl::StrCat("copying feed '", graph_->inputs()[feed]->name(), "' from ",
                                                 d->name(), " to the host for its host readers: ", s.message()));
    v = host;
  }
  return absl::OkStatus();
}

}  // namespace cleave::runtime
