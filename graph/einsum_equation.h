// Einsum's equation (graph/): the terms of "ij,jk->ik" as one label per axis of each input
// and of the output, shared by Einsum's shape inference and its decomposition into products
// (passes/decomposition.cc). Labels are small integers: a letter is its own label, and an
// ellipsis stands for broadcast labels aligned from the right, as numpy aligns them.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::graph {

struct EinsumEquation {
  // Letters take labels 0..51 in ASCII order; the ellipsis' axes the labels from 52 on.
  static constexpr int kEllipsisBase = 52;
  // labels[i][a]: the label of input i's axis a; output: the output's axes.
  std::vector<std::vector<int>> inputs;
  std::vector<int> output;
  // The label's letter, or "...k" for the ellipsis' k-th broadcast axis from the left.
  static std::string LabelName(int label);
  static bool IsEllipsis(int label) { return label >= kEllipsisBase; }
};

// Parses `equation` for inputs of the given ranks (ranks[i] < 0: unknown, allowed only where
// the term has no ellipsis). Without "->" the output holds the ellipsis axes, then the letters
// that occur once, in ASCII order (numpy's implicit mode). Errors say what is wrong with the
// equation: a term count that is not the input count, a term whose letters do not match its
// input's rank, a letter repeated in the output, an output letter that no input has. A letter
// repeated within an input term (its diagonal) keeps its label on each of those axes.
absl::StatusOr<EinsumEquation> ParseEinsumEquation(const std::string& equation, const std::vector<int>& ranks);

}  // namespace cleave::graph
