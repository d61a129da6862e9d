// Parser and printer of the IR's text form (graph/).
#include "graph/text_format.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status.h"

namespace cleave::graph {

namespace {

std::string Trim(absl::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Splits on commas that are not inside [] or "".
std::vector<std::string> SplitTop(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  bool quoted = false;
  std::string cur;
  for (char c : s) {
    if (c == '"') quoted = !quoted;
    if (!quoted && c == '[') ++depth;
    if (!quoted && c == ']') --depth;
    if (!quoted && depth == 0 && c == ',') {
      out.push_back(Trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!Trim(cur).empty()) out.push_back(Trim(cur));
  return out;
}

absl::StatusOr<DataType> ParseDtype(const std::string& s) {
  for (int v = 0; v <= 16; ++v) {
    DataType t = DataTypeFromInt(v);
    if (t != DataType::kUndefined && s == DataTypeName(t)) return t;
  }
  return InvalidArgument("unknown dtype '", s, "'");
}

// "float32[batch,4]" -> dtype and shape.
absl::StatusOr<std::pair<DataType, Shape>> ParseType(const std::string& s) {
  size_t lb = s.find('[');
  if (lb == std::string::npos || s.back() != ']')
    return InvalidArgument("expected a type like float32[2,3], got '", s, "'");
  ASSIGN_OR_RETURN(DataType t, ParseDtype(Trim(s.substr(0, lb))));
  std::vector<Dim> dims;
  std::string inner = s.substr(lb + 1, s.size() - lb - 2);
  for (const std::string& d : SplitTop(inner)) {
    int64_t v;
    if (absl::SimpleAtoi(d, &v)) dims.emplace_back(v);
    else if (d == "?") dims.emplace_back();
    else dims.push_back(Dim::Symbol(d));
  }
  return std::make_pair(t, Shape(std::move(dims)));
}

absl::StatusOr<Tensor> ParseValues(DataType t, const Shape& shape, const std::string& text) {
  if (!shape.is_static()) return InvalidArgument("an initializer needs static dims");
  Tensor out(t, shape.StaticDims());
  std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipWhitespace());
  bool fill = !words.empty() && words[0] == "fill";
  if (fill) words.erase(words.begin());
  if (fill ? words.size() != 1 : static_cast<int64_t>(words.size()) != out.numel())
    return InvalidArgument("expected ", fill ? 1 : out.numel(), " values, got ", words.size());
  for (int64_t i = 0; i < out.numel(); ++i) {
    const std::string& word = words[fill ? 0 : i];
    if (t == DataType::kInt64 || t == DataType::kInt32) {  // exactly, INT64_MAX included
      int64_t n;
      if (!absl::SimpleAtoi(word, &n)) return InvalidArgument("bad integer '", word, "'");
      if (t == DataType::kInt64) out.data<int64_t>()[i] = n;
      else out.data<int32_t>()[i] = static_cast<int32_t>(n);
      continue;
    }
    double v;
    if (!absl::SimpleAtod(word, &v)) return InvalidArgument("bad number '", word, "'");
    switch (t) {
      case DataType::kFloat32: out.data<float>()[i] = static_cast<float>(v); break;
      case DataType::kFloat64: out.data<double>()[i] = v; break;
      case DataType::kBool: out.data<bool>()[i] = v != 0; break;
      default: return Unimplemented("text initializers of dtype ", DataTypeName(t));
    }
  }
  return out;
}

absl::StatusOr<Attribute> ParseAttrValue(const std::string& v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"')
    return Attribute::String(v.substr(1, v.size() - 2));
  if (v.size() >= 2 && v.front() == '[' && v.back() == ']') {
    std::vector<std::string> items = SplitTop(v.substr(1, v.size() - 2));
    if (!items.empty() && !items[0].empty() && items[0].front() == '"') {  // ["Sigmoid", "Tanh"]
      std::vector<std::string> strings;
      for (const std::string& it : items) {
        if (it.size() < 2 || it.front() != '"' || it.back() != '"') return InvalidArgument("bad string item '", it, "'");
        strings.push_back(it.substr(1, it.size() - 2));
      }
      return Attribute::Strings(strings);
    }
    bool floats = false;
    for (const std::string& it : items) floats |= it.find_first_of(".eE") != std::string::npos;
    std::vector<int64_t> ints;
    std::vector<float> fl;
    for (const std::string& it : items) {
      double d;
      if (!absl::SimpleAtod(it, &d)) return InvalidArgument("bad list item '", it, "'");
      ints.push_back(static_cast<int64_t>(d));
      fl.push_back(static_cast<float>(d));
    }
    return floats ? Attribute::Floats(fl) : Attribute::Ints(ints);
  }
  int64_t i;
  if (v.find_first_of(".eE") == std::string::npos && absl::SimpleAtoi(v, &i)) return Attribute::Int(i);
  double d;
  if (absl::SimpleAtod(v, &d)) return Attribute::Float(static_cast<float>(d));
  return InvalidArgument("bad attribute value '", v, "'");
}

absl::Status ParseNode(Graph& g, const std::string& line) {
  size_t eq = line.find('=');
  size_t lp = line.find('(');
  size_t rp = line.find(')', lp == std::string::npos ? 0 : lp);
  if (eq == std::string::npos || lp == std::string::npos || rp == std::string::npos || eq > lp)
    return InvalidArgument("expected 'outputs = Op(inputs)', got '", line, "'");
  std::string lhs = Trim(line.substr(0, eq)), name;
  if (size_t colon = lhs.find(':'); colon != std::string::npos) {
    name = Trim(lhs.substr(0, colon));
    lhs = Trim(lhs.substr(colon + 1));
  }
  std::string op = Trim(line.substr(eq + 1, lp - eq - 1)), domain;
  if (size_t dot = op.rfind('.'); dot != std::string::npos) {
    domain = op.substr(0, dot);
    op = op.substr(dot + 1);
  }
  std::vector<Value*> ins, outs;
  for (const std::string& in : SplitTop(line.substr(lp + 1, rp - lp - 1))) {
    if (in == "_") ins.push_back(nullptr);
    else if (Value* v = g.FindValue(in)) ins.push_back(v);
    else return InvalidArgument("node input '", in, "' is not defined above");
  }
  for (const std::string& o : SplitTop(lhs)) outs.push_back(o == "_" ? nullptr : g.GetOrCreateValue(o));
  if (name.empty()) name = outs.empty() || !outs[0] ? op : outs[0]->name();
  Node* n = g.AddNode(op, ins, outs, name, domain);
  std::string rest = Trim(line.substr(rp + 1));
  if (rest.empty()) return absl::OkStatus();
  if (rest.front() != '{' || rest.back() != '}')
    return InvalidArgument("expected {attributes} after the inputs, got '", rest, "'");
  for (const std::string& kv : SplitTop(rest.substr(1, rest.size() - 2))) {
    size_t e = kv.find('=');
    if (e == std::string::npos) return InvalidArgument("expected name = value, got '", kv, "'");
    ASSIGN_OR_RETURN(Attribute a, ParseAttrValue(Trim(kv.substr(e + 1))));
    n->SetAttr(Trim(kv.substr(0, e)), std::move(a));
  }
  return absl::OkStatus();
}

absl::Status ParseLine(Graph& g, std::string line) {
  if (size_t hash = line.find('#'); hash != std::string::npos) line = line.substr(0, hash);
  line = Trim(line);
  if (line.empty()) return absl::OkStatus();
  absl::string_view rest = line;
  if (absl::ConsumePrefix(&rest, "opset ")) {
    int64_t v;
    if (!absl::SimpleAtoi(Trim(rest), &v)) return InvalidArgument("bad opset '", Trim(rest), "'");
    g.opset_imports()[""] = v;
    return absl::OkStatus();
  }
  if (absl::ConsumePrefix(&rest, "output ")) {
    for (const std::string& o : SplitTop(std::string(rest))) {
      Value* v = g.FindValue(o);
      if (!v) return InvalidArgument("output '", o, "' is not defined");
      g.AddOutput(v);
    }
    return absl::OkStatus();
  }
  bool is_input = absl::ConsumePrefix(&rest, "input ");
  bool is_init = !is_input && absl::ConsumePrefix(&rest, "init ");
  if (!is_input && !is_init) return ParseNode(g, line);
  std::string decl(rest), values;
  if (is_init) {
    size_t eq = decl.find('=');
    if (eq == std::string::npos) return InvalidArgument("init needs '= values'");
    values = decl.substr(eq + 1);
    decl = decl.substr(0, eq);
  }
  size_t colon = decl.find(':');
  if (colon == std::string::npos) return InvalidArgument("expected 'name: type', got '", decl, "'");
  ASSIGN_OR_RETURN(auto type, ParseType(Trim(decl.substr(colon + 1))));
  std::string name = Trim(decl.substr(0, colon));
  if (is_input) {
    g.AddInput(name, type.first, type.second);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Tensor t, ParseValues(type.first, type.second, values));
  g.AddInitializer(name, std::move(t));
  return absl::OkStatus();
}

std::string TypeString(const Value* v) {
  return absl::StrCat(DataTypeName(v->dtype()), v->shape().ToString());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(const std::string& text) {
  auto g = std::make_unique<Graph>();
  g->opset_imports()[""] = 17;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::Status s = ParseLine(*g, std::string(line));
    if (!s.ok()) return InvalidArgument("line ", line_no, ": ", s.message());
  }
  for (const auto& n : g->nodes())
    if (n->domain() == "ai.cleave") g->opset_imports()["ai.cleave"] = 1;
  return g;
}

std::string PrintGraph(const Graph& g) {
  std::string out = absl::StrCat("opset ", g.OpsetFor(""), "\n");
  for (const Value* v : g.inputs()) absl::StrAppend(&out, "input ", v->name(), ": ", TypeString(v), "\n");
  for (const Value* v : g.Initializers())
    absl::StrAppend(&out, "init ", v->name(), ": ", TypeString(v), " = ...\n");
  auto order = g.TopologicalOrder();
  if (!order.ok()) return out + "# " + std::string(order.status().message()) + "\n";
  for (const Node* n : *order) {
    std::vector<std::string> outs, ins, attrs;
    for (const Value* v : n->outputs()) outs.push_back(v ? v->name() : "_");
    for (const Value* v : n->inputs()) ins.push_back(v ? v->name() : "_");
    for (const auto& [k, a] : n->attributes()) {
      std::string val;
      switch (a.type) {
        case AttrType::kInt: val = absl::StrCat(a.i); break;
        case AttrType::kFloat: val = absl::StrCat(a.f); break;
        case AttrType::kString: val = absl::StrCat("\"", a.s, "\""); break;
        case AttrType::kInts: val = absl::StrCat("[", absl::StrJoin(a.ints, ","), "]"); break;
        case AttrType::kFloats: val = absl::StrCat("[", absl::StrJoin(a.floats, ","), "]"); break;
        default: val = "..."; break;
      }
      attrs.push_back(absl::StrCat(k, " = ", val));
    }
    absl::StrAppend(&out, absl::StrJoin(outs, ", "), " = ",
                    n->domain().empty() ? "" : n->domain() + ".", n->op_type(), "(",
                    absl::StrJoin(ins, ", "), ")",
                    attrs.empty() ? "" : absl::StrCat(" {", absl::StrJoin(attrs, ", "), "}"), "\n");
  }
  std::vector<std::string> outs;
  for (const Value* v : g.outputs()) outs.push_back(v->name());
  absl::StrAppend(&out, "output ", absl::StrJoin(outs, ", "), "\n");
  return out;
}

}  // namespace cleave::graph
