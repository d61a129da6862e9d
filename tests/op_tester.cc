// OpTester implementation (tests/): one-node graph -> InferenceSession -> compare.
#include "tests/op_tester.h"


#include "absl/strings/str_cat.h"
#include "base/tensor_compare.h"
#include "graph/graph.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"

namespace cleave::testing {

OpTester::OpTester(std::string op, int opset, std::string domain)
    : op_(std::move(op)), domain_(std::move(domain)), opset_(opset) {}

OpTester::~OpTester() {
  if (!ran_) ADD_FAILURE() << op_ << ": this OpTester was set up but never Run()";
}

OpTester& OpTester::Attr(const std::string& name, graph::Attribute a) {
  attrs_.emplace_back(name, std::move(a));
  return *this;
}

OpTester& OpTester::InputTensor(const std::string& name, Tensor t, bool as_initializer) {
  inputs_.push_back({name, std::move(t), as_initializer, false});
  return *this;
}

OpTester& OpTester::AsInitializer() {
  inputs_.back().initializer = true;
  return *this;
}

OpTester& OpTester::OmittedInput() {
  inputs_.push_back({"", Tensor(), false, true});
  return *this;
}

OpTester& OpTester::OutputTensor(const std::string& name, Tensor expected) {
  outputs_.push_back({name, std::move(expected), false});
  return *this;
}

OpTester& OpTester::UncheckedOutput(const std::string& name) {
  outputs_.push_back({name, std::nullopt, false});
  return *this;
}

OpTester& OpTester::OmittedOutput() {
  outputs_.push_back({"", std::nullopt, true});
  return *this;
}

OpTester& OpTester::Tolerance(double abs, double rel) {
  abs_tol_ = abs;
  rel_tol_ = rel;
  return *this;
}

OpTester& OpTester::ExpectFailure(const std::string& substring) {
  expect_failure_ = substring;
  return *this;
}

std::string CompareTensors(const Tensor& got, const Tensor& want, double abs_tol, double rel_tol) {
  return DiffTensors(got, want, abs_tol, rel_tol).Describe(got, want);
}

std::vector<Tensor> OpTester::Run() {
  ran_ = true;
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = domain_.empty() ? opset_ : 17;
  if (!domain_.empty()) g->opset_imports()[domain_] = opset_;
  Feeds feeds;
  std::vector<graph::Value*> ins, outs;
  for (const In& in : inputs_) {
    if (in.omitted) {
      ins.push_back(nullptr);
    } else if (in.initializer) {
      ins.push_back(g->AddInitializer(in.name, in.value));
    } else {
      ins.push_back(g->AddInput(in.name, in.value.dtype(), Shape::FromDims(in.value.dims())));
      feeds.emplace_back(in.name, in.value);
    }
  }
  for (const Out& o : outputs_) outs.push_back(o.omitted ? nullptr : g->GetOrCreateValue(o.name));
  graph::Node* n = g->AddNode(op_, ins, outs, "node", domain_);
  for (auto& [name, a] : attrs_) n->SetAttr(name, a);
  for (graph::Value* v : outs)
    if (v) g->AddOutput(v);

  SessionOptions opts;
  opts.optimize = false;  // test the op itself, not a folded constant
  auto session = InferenceSession::FromGraph(std::move(g), opts);
  absl::StatusOr<std::vector<Tensor>> result =
      session.ok() ? (*session)->Run(feeds) : absl::StatusOr<std::vector<Tensor>>(session.status());
  if (expect_failure_) {
    EXPECT_FALSE(result.ok()) << op_ << ": expected failure containing '" << *expect_failure_ << "'";
    if (!result.ok()) {
      EXPECT_NE(std::string(result.status().message()).find(*expect_failure_), std::string::npos)
          << op_ << ": error '" << result.status().message() << "' lacks '" << *expect_failure_ << "'";
    }
    return {};
  }
  EXPECT_TRUE(result.ok()) << op_ << ": " << result.status().message();
  if (!result.ok()) return {};
  size_t k = 0;
  for (const Out& o : outputs_) {
    if (o.omitted) continue;
    if (o.expected) {
      std::string diff = CompareTensors((*result)[k], *o.expected, abs_tol_, rel_tol_);
      EXPECT_EQ(diff, "") << op_ << " output '" << o.name << "'";
    }
    ++k;
  }
  return std::move(*result);
}

}  // namespace cleave::testing
