// Helpers shared by the partitioned-training tests: training artifacts of a bundled model,
// deep copies of them (each simulated rank gets its own), and row slices of a batch.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "trainer/training_graph.h"

namespace cleave::testing {

// The source tree: $CLEAVE_SOURCE_DIR when set (a test binary built elsewhere and run from
// another checkout), else where it was built from.
inline std::string SourceDir() {
  const char* env = std::getenv("CLEAVE_SOURCE_DIR");
  return env && *env ? env : CLEAVE_SOURCE_DIR;
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

// Rows [r0, r0 + rows) of a batch-major tensor.
inline Tensor Rows(const Tensor& t, int64_t r0, int64_t rows) {
  std::vector<int64_t> dims = t.dims();
  dims[0] = rows;
  Tensor out(t.dtype(), dims);
  const size_t row = t.nbytes() / t.dims()[0];
  std::memcpy(out.data<char>(), t.data<char>() + r0 * row, rows * row);
  return out;
}

}  // namespace cleave::testing
