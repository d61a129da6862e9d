// Small graph builders shared by tests (tests/).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace cleave::testing {

// y = Relu(MatMul(x, w) + b) with x [batch, 4], w [4, 3], b [3].
inline std::unique_ptr<graph::Graph> MakeMlp() {
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  auto* x = g->AddInput("x", DataType::kFloat32, Shape({Dim::Symbol("batch"), Dim(4)}));
  auto* w = g->AddInitializer("w", Tensor::FromVector<float>(
      {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, {4, 3}));
  auto* b = g->AddInitializer("b", Tensor::FromVector<float>({0.5f, -10.f, 0.f}, {3}));
  auto* mm = g->GetOrCreateValue("mm");
  auto* add = g->GetOrCreateValue("add");
  auto* y = g->GetOrCreateValue("y");
  g->AddNode("MatMul", {x, w}, {mm}, "matmul");
  g->AddNode("Add", {mm, b}, {add}, "bias");
  g->AddNode("Relu", {add}, {y}, "relu");
  g->AddOutput(y);
  return g;
}

}  // namespace cleave::testing
