// Attention through cuDNN's fused flash attention (providers/cuda/): see cudnn_attention.h.
#include "providers/cuda/cudnn_attention.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/status.h"

#if CLEAVE_HAVE_CUDNN_SDPA
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

// The frontend, loading cuDNN at run time, calls through this library handle (set in Create).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace cleave::providers {

namespace {
std::atomic<int64_t> biased_runs[2];
}  // namespace

int64_t CudnnAttention::BiasedRuns(bool backward) { return biased_runs[backward ? 1 : 0].load(); }

bool CudnnAttention::Eligible(const SdpaShape& s) {
  const bool bias_ok = !s.bias || (s.bias_heads > 0 && s.batch % s.bias_heads == 0 &&
                                    (s.heads == 0 || s.bias_heads == s.heads) && (!s.causal || s.T == s.S));
  return (s.dtype == DataType::kBFloat16 || s.dtype == DataType::kFloat16) && s.D == s.Dv && s.D % 8 == 0 &&
         s.D <= 128 && s.T > 0 && s.S > 0 && s.batch > 0 && (s.heads == 0 || s.batch % s.heads == 0) &&
         (!s.packed || (s.heads > 0 && s.T == s.S)) && bias_ok;
}

#if CLEAVE_HAVE_CUDNN_SDPA

namespace fe = cudnn_frontend;

namespace {

// Tensor ids in the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias };

using Key = std::tuple<bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool, int64_t, bool,
                       std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t>>;

Key KeyOf(const SdpaShape& s, bool backward) {
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &s.scale, sizeof(scale_bits));
  const int64_t* b = s.bias_strides;
  return {backward, static_cast<int>(s.dtype), s.batch, s.T, s.S, s.D, s.Dv, scale_bits, s.causal, s.heads, s.packed,
          {s.bias, s.bias ? s.bias_heads : 0, b[0], b[1], b[2], b[3]}};
}

// How many slices cuDNN's h dim holds with s.heads = 0: the bias's heads (the slices split
// [batch / bias_heads, bias_heads], memory as [1, batch]) or all of them.
int64_t FlatHeads(const SdpaShape& s) { return s.bias ? s.bias_heads : s.batch; }

absl::Status Check(fe::error_t e, const char* what) {
  if (e.is_good()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("cuDNN attention ", what, ": ", e.get_message()));
}

// cuDNN's [b, h, rows, d] view of a q/k/v-like tensor: [1, batch, rows, d] over memory laid out
// [batch, rows, d] (the heads among the batch), or with s.heads > 0 [batch / heads, heads, rows,
// d] over memory laid out [batch / heads, rows, heads, d], whose rows are 3 heads d apart for q,
// k, v and their gradients when s.packed (`qkv`).
void SetBhsd(fe::graph::Tensor_attributes& t, const SdpaShape& s, int64_t rows, int64_t d, bool qkv) {
  if (s.heads > 0) {
    const int64_t h = s.heads, row = (s.packed && qkv ? 3 : 1) * h * d;
    t.set_dim({s.batch / h, h, rows, d}).set_stride({rows * row, d, row, 1});
  } else {
    const int64_t g = FlatHeads(s);
    t.set_dim({s.batch / g, g, rows, d}).set_stride({g * rows * d, rows * d, d, 1});
  }
}

std::shared_ptr<fe::graph::Tensor_attributes> Bhsd(fe::graph::Graph& g, const char* name, int64_t uid,
                                                   const SdpaShape& s, int64_t rows, int64_t d, bool qkv) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  SetBhsd(t, s, rows, d, qkv);
  return g.tensor(t);
}

void AsBhsd(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, const SdpaShape& s, int64_t rows,
            int64_t d, bool qkv) {
  t->set_output(true).set_uid(uid);
  SetBhsd(*t, s, rows, d, qkv);
}

// The saved log-sum-exp, [batch, T] in memory, as cuDNN's [b, h, T, 1].
void SetStats(fe::graph::Tensor_attributes& t, const SdpaShape& s) {
  const int64_t h = s.heads > 0 ? s.heads : FlatHeads(s), b = s.batch / h;
  t.set_dim({b, h, s.T, 1}).set_stride({h * s.T, s.T, 1, 1});
}

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  absl::Status status;  // not OK: cuDNN refused this shape
};

absl::Status BuildGraph(cudnnHandle_t handle, const SdpaShape& s, bool backward, Plan* plan) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.dtype == DataType::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Bhsd(*g, "q", kQ, s, s.T, s.D, true);
  auto k = Bhsd(*g, "k", kK, s, s.S, s.D, true);
  auto v = Bhsd(*g, "v", kV, s, s.S, s.Dv, true);
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (s.bias) {
    fe::graph::Tensor_attributes b;
    const int64_t h = s.heads > 0 ? s.heads : FlatHeads(s);
    b.set_name("bias").set_uid(kBias).set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.batch / h, h, s.T, s.S})
        .set_stride({s.bias_strides[0], s.bias_strides[1], s.bias_strides[2], s.bias_strides[3]});
    bias = g->tensor(b);
  }
  // Causal with a bias only for T = S (Eligible), where the top-left alignment cuDNN then takes
  // is the bottom-right one.
  const auto mask = [&](auto& options) {
    if (!s.causal) return;
    if (s.bias) options.set_causal_mask(true);
    else options.set_causal_mask_bottom_right(true);
  };
  if (!backward) {
    auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(s.scale);
    mask(options);
    if (bias) options.set_bias(bias);
    auto [o, stats] = g->sdpa(q, k, v, options);
    AsBhsd(o, kO, s, s.T, s.Dv, false);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    SetStats(*stats, s);
  } else {
    auto o = Bhsd(*g, "o", kO, s, s.T, s.Dv, false);
    auto dout = Bhsd(*g, "dout", kDO, s, s.T, s.Dv, false);
    fe::graph::Tensor_attributes stats_attrs;
    stats_attrs.set_name("stats").set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    SetStats(stats_attrs, s);
    auto stats = g->tensor(stats_attrs);
    auto options = fe::graph::SDPA_backward_attributes().set_name("attention_grad").set_attn_scale(s.scale);
    mask(options);
    if (bias) options.set_bias(bias);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
    AsBhsd(dq, kDQ, s, s.T, s.D, true);
    AsBhsd(dk, kDK, s, s.S, s.D, true);
    AsBhsd(dv, kDV, s, s.S, s.Dv, true);
  }
  RETURN_IF_ERROR(Check(g->validate(), "validate"));
  RETURN_IF_ERROR(Check(g->build_operation_graph(handle), "operation graph"));
  RETURN_IF_ERROR(Check(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans"));
  RETURN_IF_ERROR(Check(g->check_support(handle), "support"));
  RETURN_IF_ERROR(Check(g->build_plans(handle), "plan build"));
  RETURN_IF_ERROR(Check(g->get_workspace_size(plan->workspace), "workspace size"));
  plan->graph = std::move(g);
  return absl::OkStatus();
}

}  // namespace

struct CudnnAttention::Impl {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::map<Key, Plan> plans;

  // The graph for `s`, built on first use; a refusal stays refused.
  absl::StatusOr<const Plan*> PlanFor(const SdpaShape& s, bool backward) {
    if (!Eligible(s)) return absl::UnimplementedError("not a case cuDNN's fused attention takes");
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = plans.try_emplace(KeyOf(s, backward));
    if (fresh) {
      try {
        it->second.status = BuildGraph(handle, s, backward, &it->second);
      } catch (const std::exception& e) {
        it->second.status = absl::UnimplementedError(absl::StrCat("cuDNN attention: ", e.what()));
      }
    }
    if (!it->second.status.ok()) return it->second.status;
    return &it->second;
  }

  absl::Status Execute(const Plan& plan, std::unordered_map<int64_t, void*>& pack, const Scratch& scratch) {
    void* workspace = nullptr;
    if (plan.workspace > 0) {
      workspace = scratch(static_cast<size_t>(plan.workspace));
      if (!workspace) return absl::ResourceExhaustedError("no device scratch for cuDNN attention's workspace");
    }
    try {
      fe::error_t e = plan.graph->execute(handle, pack, workspace);
      if (e.is_good()) return absl::OkStatus();
      return absl::InternalError(absl::StrCat("cuDNN attention: ", e.get_message()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("cuDNN attention: ", e.what()));
    }
  }
};

// The frontend loads libcudnn (and what it needs) when first called: a machine without cuDNN
// gets an exception here, and the own kernels.
std::unique_ptr<CudnnAttention> CudnnAttention::Create(void* stream, std::string* why) {
  auto impl = std::make_unique<Impl>();
  if (!fe::cudnn_dlhandle) {
    for (const char* lib : {"libcudnn.so.9", "libcudnn.so"})
      if (!fe::cudnn_dlhandle) fe::cudnn_dlhandle = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) {
      const char* error = dlerror();
      if (why) *why = absl::StrCat("libcudnn.so.9 cannot be loaded: ", error ? error : "not found");
      return nullptr;
    }
  }
  try {
    if (cudnnStatus_t st = fe::detail::create_handle(&impl->handle); st != CUDNN_STATUS_SUCCESS) {
      if (why) *why = absl::StrCat("cudnnCreate: ", fe::detail::get_error_string(st));
      return nullptr;
    }
    if (cudnnStatus_t st = fe::detail::set_stream(impl->handle, static_cast<cudaStream_t>(stream));
        st != CUDNN_STATUS_SUCCESS) {
      if (why) *why = absl::StrCat("cudnnSetStream: ", fe::detail::get_error_string(st));
      fe::detail::destroy_handle(impl->handle);
      return nullptr;
    }
  } catch (const std::exception& e) {
    if (why) *why = absl::StrCat("cuDNN cannot be loaded: ", e.what());
    return nullptr;
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

CudnnAttention::~CudnnAttention() {
  if (impl_ && impl_->handle) {
    impl_->plans.clear();
    fe::detail::destroy_handle(impl_->handle);
  }
}

absl::Status CudnnAttention::Forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* out,
                                     float* lse, const Scratch& scratch, const float* bias) {
  if (s.bias != (bias != nullptr))
    return absl::InvalidArgumentError("cuDNN attention: the bias and its shape disagree");
  ASSIGN_OR_RETURN(const Plan* plan, impl_->PlanFor(s, false));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)}, {kO, out}, {kStats, lse}};
  if (bias) pack[kBias] = const_cast<float*>(bias);
  RETURN_IF_ERROR(impl_->Execute(*plan, pack, scratch));
  if (bias) ++biased_runs[0];
  return absl::OkStatus();
}

absl::Status CudnnAttention::Backward(const SdpaShape& s, const void* dout, const void* q, const void* k,
                                      const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                                      const Scratch& scratch, const float* bias) {
  if (s.bias != (bias != nullptr))
    return absl::InvalidArgumentError("cuDNN attention: the bias and its shape disagree");
  ASSIGN_OR_RETURN(const Plan* plan, impl_->PlanFor(s, true));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)},     {kK, const_cast<void*>(k)},         {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(out)},   {kDO, const_cast<void*>(dout)},     {kStats, const_cast<float*>(lse)},
      {kDQ, dq},                      {kDK, dk},                          {kDV, dv}};
  if (bias) pack[kBias] = const_cast<float*>(bias);
  RETURN_IF_ERROR(impl_->Execute(*plan, pack, scratch));
  if (bias) ++biased_runs[1];
  return absl::OkStatus();
}

#else  // built without the cuDNN frontend

struct CudnnAttention::Impl {};

std::unique_ptr<CudnnAttention> CudnnAttention::Create(void*, std::string* why) {
  if (why) *why = "built without the cuDNN frontend headers (pip install nvidia-cudnn-frontend)";
  return nullptr;
}

CudnnAttention::~CudnnAttention() = default;

absl::Status CudnnAttention::Forward(const SdpaShape&, const void*, const void*, const void*, void*, float*,
                                     const Scratch&, const float*) {
  return absl::UnimplementedError("built without cuDNN attention");
}

absl::Status CudnnAttention::Backward(const SdpaShape&, const void*, const void*, const void*, const void*,
                                      const void*, const float*, void*, void*, void*, const Scratch&, const float*) {
  return absl::UnimplementedError("built without cuDNN attention");
}

#endif

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

}  // namespace cleave::providers
