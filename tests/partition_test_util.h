// Helpers shared by the training tests: training artifacts of a bundled model, a batch of its
// tokens, deep copies of artifacts (each simulated rank gets its own), each rank's artifacts
// under plain data parallelism, and row slices of a batch.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "partition/lower.h"
#include "runtime/inference_session.h"
#include "trainer/partition_plan.h"
#include "trainer/autodiff.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave::testing {

// The source tree: $CLEAVE_SOURCE_DIR when set (a test binary built elsewhere and run from
// another checkout), else where it was built from.
inline std::string SourceDir() {
  const char* env = std::getenv("CLEAVE_SOURCE_DIR");
  return env && *env ? env : CLEAVE_SOURCE_DIR;
}

// Session options of one intra-op thread (the reference runs and each simulated rank), over
// `communicator` when there is one.
inline trainer::TrainingSessionOptions OneThread(Communicator* communicator = nullptr) {
  trainer::TrainingSessionOptions o;
  o.intra_op_threads = 1;
  o.communicator = communicator;
  return o;
}

// models/<model_dir>/model.onnx built for training at batch x seq with `spec`.
inline trainer::TrainingArtifacts BuildArtifacts(const std::string& model_dir, int64_t batch, int64_t seq,
                                                 trainer::TrainingSpec spec) {
  auto model = onnx_ext::LoadModel(SourceDir() + "/models/" + model_dir + "/model.onnx");
  EXPECT_TRUE(model.ok()) << model.status();
  spec.dims = {{"batch", batch}, {"seq", seq}};
  auto a = trainer::BuildTrainingArtifacts(**model, spec);
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

// A [2, seq] batch for the bundled language models: input_ids (7 i + 3) % vocab and labels
// (5 i + 1) % vocab over the flat positions i.
inline std::vector<std::pair<std::string, Tensor>> TokenBatch(int64_t seq, int64_t vocab) {
  Tensor ids(DataType::kInt64, {2, seq}), labels(DataType::kInt64, {2, seq});
  for (int64_t i = 0; i < 2 * seq; ++i) {
    ids.data<int64_t>()[i] = (i * 7 + 3) % vocab;
    labels.data<int64_t>()[i] = (i * 5 + 1) % vocab;
  }
  return {{"input_ids", std::move(ids)}, {"labels", std::move(labels)}};
}

inline trainer::TrainingArtifacts CopyArtifacts(const trainer::TrainingArtifacts& a) {
  trainer::TrainingArtifacts c;
  c.training = a.training->Clone();
  c.eval = a.eval->Clone();
  c.optimizer = a.optimizer->Clone();
  c.forward = a.forward->Clone();
  c.params = a.params;
  c.unreached = a.unreached;
  c.state_suffixes = a.state_suffixes;
  c.data_inputs = a.data_inputs;
  c.initial = a.initial;
  return c;
}

// Each rank's artifacts for data parallelism over `dp` ranks (the batch split over dp): ZeRO
// stage `zero` (0 or 1), data-parallel gradients in buckets of `bucket` bytes (0: one
// AllReduce per gradient).
inline std::vector<trainer::TrainingArtifacts> DataParallelArtifacts(const trainer::TrainingArtifacts& a, int dp,
                                                                     int zero, int64_t bucket) {
  std::vector<trainer::TrainingArtifacts> out;
  auto mesh = *partition::Mesh::Parse("dp=" + std::to_string(dp));
  partition::Sharding batch = partition::Sharding::Replicated(2);
  batch.dims[0] = {"dp"};
  auto train_p = partition::Propagate(*a.training, mesh, {{"input_ids", batch}, {"labels", batch}});
  EXPECT_TRUE(train_p.ok()) << train_p.status();
  std::map<std::string, partition::Sharding> grad_seeds, output_wants;
  if (zero == 1) {
    auto seeds = partition::PrepareZero1(*a.optimizer, a.params, a.state_suffixes, mesh, &output_wants);
    EXPECT_TRUE(seeds.ok()) << seeds.status();
    grad_seeds = *seeds;
  } else {
    for (const std::string& p : a.params) {
      partition::Sharding s = partition::Sharding::Replicated(a.optimizer->FindValue(p)->shape().rank());
      s.partial = {"dp"};
      grad_seeds[trainer::GradName(p)] = s;
    }
  }
  auto opt_p = partition::Propagate(*a.optimizer, mesh, grad_seeds);
  EXPECT_TRUE(opt_p.ok()) << opt_p.status();
  for (int r = 0; r < dp; ++r) {
    auto train = partition::LowerForRank(*a.training, mesh, *train_p, r, "loss");
    auto opt = partition::LowerForRank(*a.optimizer, mesh, *opt_p, r, "", output_wants, bucket);
    EXPECT_TRUE(train.ok() && opt.ok());
    trainer::TrainingArtifacts mine = CopyArtifacts(a);
    mine.training = std::move(train->graph);
    mine.optimizer = std::move(opt->graph);
    mine.eval = mine.training->Clone();
    mine.eval->SetOutputs({mine.eval->FindValue("loss")});
    out.push_back(std::move(mine));
  }
  return out;
}

// Rows [r0, r0 + rows) of a batch-major tensor.
inline Tensor Rows(const Tensor& t, int64_t r0, int64_t rows) {
  std::vector<int64_t> dims = t.dims();
  dims[0] = rows;
  Tensor out(t.dtype(), dims);
  const size_t row = t.nbytes() / t.dims()[0];
  std::memcpy(out.data<char>(), t.data<char>() + r0 * row, rows * row);
  return out;
}

// The tiny GPT planned for `mesh` at batch 2 x seq 16 with global-norm clipping, in two
// micro-batches where the mesh has a pipeline.
inline trainer::PlanConfig TinyGptPlanConfig(const std::string& mesh) {
  trainer::PlanConfig c;
  c.model = SourceDir() + "/models/tiny_gpt/model.onnx";
  c.mesh = mesh;
  c.batch = 2;
  c.seq = 16;
  c.microbatches = mesh.find("pp") != std::string::npos ? 2 : 1;
  c.spec.optimizer.max_grad_norm = 1.0f;
  return c;
}

// One training step's `count` micro-batches of [rows, seq] language-model tokens, varying with
// the step, the micro-batch and `salt` (a rank's own data; 0 gives every rank the same).
inline std::vector<Feeds> MicroBatches(int64_t count, int64_t rows, int64_t seq, int step, int salt) {
  std::vector<Feeds> micro;
  for (int64_t m = 0; m < count; ++m) {
    Tensor ids(DataType::kInt64, {rows, seq}), labels(DataType::kInt64, {rows, seq});
    for (int64_t i = 0; i < rows * seq; ++i) {
      ids.data<int64_t>()[i] = (i * 7 + 3 + step + m * 5 + salt * 11) % 256;
      labels.data<int64_t>()[i] = (i * 5 + 1 + step + m * 3 + salt * 13) % 256;
    }
    micro.push_back({{"input_ids", ids}, {"labels", labels}});
  }
  return micro;
}

}  // namespace cleave::testing
