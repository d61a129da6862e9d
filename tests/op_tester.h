// OpTester: one harness for every op (tests/). Builds a one-node graph, runs it through an
// InferenceSession on the CPU provider and compares each output with the expected values
// under a per-dtype tolerance. Fluent, after ONNX Runtime's OpTester:
//
//   OpTester("Add", 14).Input<float>("A", {2, 3}, a).Input<float>("B", {3}, b)
//       .Output<float>("C", {2, 3}, expected).Run();
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/tensor.h"
#include "graph/attribute.h"

namespace cleave::testing {

class OpTester {
 public:
  explicit OpTester(std::string op, int opset = 17, std::string domain = "");
  // A tester that was set up but never run is a test failure: its checks would silently not happen.
  ~OpTester();

  OpTester& Attr(const std::string& name, graph::Attribute a);
  OpTester& Attr(const std::string& name, int64_t v) { return Attr(name, graph::Attribute::Int(v)); }
  OpTester& Attr(const std::string& name, float v) { return Attr(name, graph::Attribute::Float(v)); }
  OpTester& Attr(const std::string& name, std::vector<int64_t> v) {
    return Attr(name, graph::Attribute::Ints(std::move(v)));
  }
  OpTester& Attr(const std::string& name, std::string v) {
    return Attr(name, graph::Attribute::String(std::move(v)));
  }

  template <typename T>
  OpTester& Input(const std::string& name, std::vector<int64_t> dims, const std::vector<T>& v) {
    return InputTensor(name, Tensor::FromVector<T>(v, std::move(dims)));
  }
  OpTester& InputTensor(const std::string& name, Tensor t, bool as_initializer = false);
  // Makes the last added input an initializer (a constant the graph knows at load).
  OpTester& AsInitializer();
  OpTester& OmittedInput();  // an omitted optional input ("" in ONNX)

  template <typename T>
  OpTester& Output(const std::string& name, std::vector<int64_t> dims, const std::vector<T>& v) {
    return OutputTensor(name, Tensor::FromVector<T>(v, std::move(dims)));
  }
  OpTester& OutputTensor(const std::string& name, Tensor expected);
  // An output that is produced but not compared (e.g. a Dropout mask checked separately).
  OpTester& UncheckedOutput(const std::string& name);
  OpTester& OmittedOutput();

  // Tolerance for float outputs: |got - want| <= abs + rel * |want|.
  OpTester& Tolerance(double abs, double rel);
  // Expects loading or running to fail with a message containing `substring`.
  OpTester& ExpectFailure(const std::string& substring);

  // Runs and records gtest failures. Returns the outputs (empty on failure).
  std::vector<Tensor> Run();

 private:
  struct In {
    std::string name;
    Tensor value;
    bool initializer = false;
    bool omitted = false;
  };
  struct Out {
    std::string name;
    std::optional<Tensor> expected;
    bool omitted = false;
  };
  std::string op_, domain_;
  int opset_;
  std::vector<std::pair<std::string, graph::Attribute>> attrs_;
  std::vector<In> inputs_;
  std::vector<Out> outputs_;
  double abs_tol_ = 1e-5, rel_tol_ = 1e-4;
  std::optional<std::string> expect_failure_;
  bool ran_ = false;
};

// Compares two tensors: dtype, shape, then values (floats under tolerance, NaN == NaN).
// Returns "" when equal, else a description with the worst element.
std::string CompareTensors(const Tensor& got, const Tensor& want, double abs_tol, double rel_tol);

}  // namespace cleave::testing
