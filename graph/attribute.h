// Node attributes of the IR (graph/). Mirrors ONNX AttributeProto without protobuf:
// a tagged union of int, float, string, their lists, and a tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/tensor.h"

namespace cleave::graph {

enum class AttrType { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor, kGraph };

struct Attribute {
  AttrType type = AttrType::kInt;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  Tensor t;

  static Attribute Int(int64_t v) { Attribute a; a.type = AttrType::kInt; a.i = v; return a; }
  static Attribute Float(float v) { Attribute a; a.type = AttrType::kFloat; a.f = v; return a; }
  static Attribute String(std::string v) {
    Attribute a; a.type = AttrType::kString; a.s = std::move(v); return a;
  }
  static Attribute Ints(std::vector<int64_t> v) {
    Attribute a; a.type = AttrType::kInts; a.ints = std::move(v); return a;
  }
  static Attribute Floats(std::vector<float> v) {
    Attribute a; a.type = AttrType::kFloats; a.floats = std::move(v); return a;
  }
  static Attribute Strings(std::vector<std::string> v) {
    Attribute a; a.type = AttrType::kStrings; a.strings = std::move(v); return a;
  }
  static Attribute TensorValue(Tensor v) {
    Attribute a; a.type = AttrType::kTensor; a.t = std::move(v); return a;
  }
};

}  // namespace cleave::graph
