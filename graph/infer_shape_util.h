// Dim arithmetic shared by the shape-op inference files (graph/). A DimProduct is a product
// of dims kept as a static factor times a multiset of named symbols, so that reshapes can
// cancel symbols ([batch, seq, 64] / [batch, 64] = seq) instead of giving up on them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/shape.h"

namespace cleave::graph {

// A shape of `rank` dims that are all unknown.
inline Shape UnknownDims(int rank) { return Shape(std::vector<Dim>(std::max(rank, 0), Dim())); }

// The length of a 1-D value whose single dim is static (e.g. a shape input of length 3).
inline std::optional<int64_t> StaticLength(const Shape& s) {
  if (!s.has_rank() || s.rank() != 1 || !s[0].is_static()) return std::nullopt;
  return s[0].value;
}

// max(ceil(num / den), 0) in exact integer arithmetic, for either sign of den.
inline int64_t CeilDivNonNegative(int64_t num, int64_t den) {
  int64_t q = num / den;
  if (num % den != 0 && ((num < 0) == (den < 0))) ++q;  // division truncated toward zero
  return std::max<int64_t>(q, 0);
}

// min(s, bound) as a named dim: what a slice of a static axis of `bound` elements up to a
// symbolic end s keeps (a rotary table cut to the sequence length). It is spelled
// "min(s,bound)", so every rule that does not know it treats it as a symbol of its own.
inline Dim ClippedSymbol(const std::string& s, int64_t bound) {
  return Dim::Symbol("min(" + s + "," + std::to_string(bound) + ")");
}

// The symbol s of a ClippedSymbol(s, bound); empty for any other dim.
inline std::string ClippedOf(const Dim& d) {
  const std::string& s = d.symbol;
  const size_t comma = s.rfind(',');
  if (s.size() < 7 || s.compare(0, 4, "min(") != 0 || s.back() != ')' || comma == std::string::npos)
    return "";
  return s.substr(4, comma - 4);
}

struct DimProduct {
  int64_t value = 1;
  std::vector<std::string> symbols;  // sorted, with repeats
  bool unknown = false;              // an anonymous unknown dim is a factor

  static DimProduct Of(const std::vector<Dim>& dims, int begin, int end) {
    DimProduct p;
    for (int k = begin; k < end; ++k) p.Mul(dims[k]);
    return p;
  }
  void Mul(const Dim& d) {
    if (d.is_static()) {
      value *= d.value;
    } else if (!d.symbol.empty()) {
      symbols.insert(std::upper_bound(symbols.begin(), symbols.end(), d.symbol), d.symbol);
    } else {
      unknown = true;
    }
  }
  // As a single dim: static, one symbol times 1, or unknown. A static 0 factor wins over
  // any symbol, since the product is 0 whatever the symbol is.
  Dim ToDim() const {
    if (value == 0 && !unknown) return Dim(0);
    if (unknown) return Dim();
    if (symbols.empty()) return Dim(value);
    if (symbols.size() == 1 && value == 1) return Dim::Symbol(symbols[0]);
    return Dim();
  }
  // this / den as a single dim, when every symbol of den cancels one of this and the static
  // parts divide exactly; unknown otherwise.
  Dim DivideBy(const DimProduct& den) const {
    if (unknown || den.unknown || den.value == 0 || value % den.value != 0) return Dim();
    DimProduct q;
    q.value = value / den.value;
    std::vector<std::string> rest = symbols;
    for (const std::string& s : den.symbols) {
      auto it = std::find(rest.begin(), rest.end(), s);
      if (it == rest.end()) return Dim();
      rest.erase(it);
    }
    q.symbols = std::move(rest);
    return q.ToDim();
  }
};

}  // namespace cleave::graph
