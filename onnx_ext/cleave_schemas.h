// The ai.cleave operator domain, registered with ONNX (onnx_ext/), so that models holding
// cleave's own ops (fusions now; collectives, gradient and optimizer ops later) pass the
// ONNX checker and open in ONNX tools. docs/ops.md documents every op listed here.
#pragma once

#include "absl/status/status.h"
#include "graph/graph.h"

namespace cleave::onnx_ext {

// Registers the ai.cleave schemas once per process; later calls do nothing.
void RegisterCleaveSchemas();

// Serialises the graph and runs onnx::checker::check_model on it (with the ai.cleave schemas
// registered). The error carries the checker's message.
absl::Status CheckModel(const graph::Graph& g);

}  // namespace cleave::onnx_ext
