// libFuzzer target for training (tests/fuzz/): a model that loads and whose shapes infer
// within a small budget gets its training artifacts built (the loss, autodiff with every
// gradient rule, the fusions before and after it, the optimizer graph), a training session, and
// one training and optimizer step on deterministic small inputs. The input's last byte picks
// the loss (cross-entropy, mean squared error, or the model's own scalar output), the optimizer
// and its clipping, whether attention is fused, the activation recompute (none, selective or
// full), and whether the model's float inputs become parameters (so that a model of one op,
// such as ONNX's node tests, trains through that op's gradient rule). Each step either succeeds
// or returns a Status; nothing may crash, hang or abort.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "onnx_ext/onnx_io.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/recompute.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  if (size == 0) return 0;
  auto g = onnx_ext::LoadModelFromBytes(std::string(reinterpret_cast<const char*>(data), size), "", "fuzz input");
  if (!g.ok()) return 0;
  const uint8_t choice = data[size - 1];
  if (choice & 128) {
    const std::vector<graph::Value*> inputs = (*g)->inputs();
    for (graph::Value* in : inputs) {
      Tensor t;
      if (in->dtype() != DataType::kFloat32 || !fuzz::MakeInput(in->dtype(), fuzz::Fixed(in->shape()), &t)) continue;
      (*g)->RemoveInput(in);
      (*g)->SetInitializer(in, std::move(t));
    }
  }
  trainer::TrainingSpec spec;
  spec.dims = fuzz::FreeDims(**g);
  if (!fuzz::WithinBudget(**g)) return 0;
  spec.loss.kind = choice % 3 == 0   ? trainer::LossKind::kCrossEntropy
                   : choice % 3 == 1 ? trainer::LossKind::kMse
                                     : trainer::LossKind::kModelOutput;
  spec.optimizer.kind = choice & 4 ? trainer::OptimizerConfig::Kind::kSgd : trainer::OptimizerConfig::Kind::kAdamW;
  spec.optimizer.max_grad_norm = choice & 8 ? 1.0f : 0.0f;
  spec.fuse_attention = (choice & 16) != 0;
  spec.recompute = static_cast<trainer::RecomputeMode>((choice >> 5) % 3);
  auto artifacts = trainer::BuildTrainingArtifacts(**g, spec);
  if (!artifacts.ok()) return 0;
  Feeds feeds;
  for (const std::string& name : artifacts->data_inputs) {
    const graph::Value* v = artifacts->training->FindValue(name);
    Tensor t;
    if (!v || !fuzz::MakeInput(v->dtype(), v->shape(), &t)) return 0;
    feeds.emplace_back(name, std::move(t));
  }
  trainer::TrainingSessionOptions options;
  options.intra_op_threads = 1;
  auto session = trainer::TrainingSession::Create(std::move(*artifacts), options);
  if (!session.ok()) return 0;
  if (!(*session)->TrainStep(feeds).ok()) return 0;
  (void)(*session)->OptimizerStep();
  return 0;
}
