// What the transformer fusions (graph/passes/fusion.cc, attention_fusion.cc) share: matching a
// pattern's constants and operands, and replacing a matched pattern by one ai.cleave op.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace cleave::graph {

// The value of a scalar-like float constant (an initializer with one element).
std::optional<double> ScalarConst(const Value* v);

// v is within 1e-3 relative of want (exporters write sqrt(2) and 0.5 as rounded literals).
bool Near(std::optional<double> v, double want);

// For a binary node with one operand `x`, the other operand; null if x is neither.
Value* Other(const Node* n, const Value* x);

// Removes `pattern` and adds ai.cleave `op` (inputs -> output) named after its last node; the
// fused node keeps the metadata (role and the like) of the node that produced `output`.
Node* Replace(Graph* g, const std::vector<Node*>& pattern, const std::string& op,
              const std::vector<Value*>& inputs, Value* output);

// Whether t is a Transpose that swaps only the last two axes.
bool SwapsLastTwo(const Node* t);

// softmax(scale * q k^T [+ bias] [+ causal mask]) v at the Softmax -> ai.cleave.Attention
// (attention_fusion.cc); true when it rewrote the graph.
bool FuseAttention(Graph* g, Node* softmax);

// The rotary embedding rules (rotary_fusion.cc), true when they rewrote the graph:
// rotate_half's Concat of x's halves, with x * cos + it * sin, -> ai.cleave.RotaryEmbedding;
// and a RotaryEmbedding of a head swap (a Transpose keeping the last axis) moved ahead of it.
bool FuseRotary(Graph* g, Node* concat);
bool HoistRotaryOverHeadSwap(Graph* g, Node* rot);

}  // namespace cleave::graph
