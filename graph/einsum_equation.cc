// Einsum's equation parser (graph/einsum_equation.h).
#include "graph/einsum_equation.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace cleave::graph {

namespace {

constexpr int kEllipsisBase = EinsumEquation::kEllipsisBase;

int LetterLabel(char c) { return c <= 'Z' ? c - 'A' : 26 + (c - 'a'); }

bool IsLetter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// One term: its letters' labels before and after the ellipsis.
struct Term {
  std::vector<int> before, after;
  bool ellipsis = false;
  int letters() const { return static_cast<int>(before.size() + after.size()); }
};

absl::StatusOr<Term> ParseTerm(const std::string& text, const std::string& what, bool repeats_allowed) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      if (t.ellipsis || text.compare(i, 3, "...") != 0)
        return InvalidArgument(what, " '", text, "': expected letters and at most one '...'");
      t.ellipsis = true;
      i += 2;
      continue;
    }
    if (!IsLetter(c)) return InvalidArgument(what, " '", text, "': '", std::string(1, c), "' is not a letter");
    (t.ellipsis ? t.after : t.before).push_back(LetterLabel(c));
  }
  if (repeats_allowed) return t;
  std::vector<int> all = t.before;
  all.insert(all.end(), t.after.begin(), t.after.end());
  std::sort(all.begin(), all.end());
  auto dup = std::adjacent_find(all.begin(), all.end());
  if (dup != all.end())
    return InvalidArgument(what, " '", text, "' repeats '", EinsumEquation::LabelName(*dup), "'");
  return t;
}

}  // namespace

std::string EinsumEquation::LabelName(int label) {
  if (label >= kEllipsisBase) return absl::StrCat("...", label - kEllipsisBase);
  return std::string(1, label < 26 ? static_cast<char>('A' + label) : static_cast<char>('a' + label - 26));
}

absl::StatusOr<EinsumEquation> ParseEinsumEquation(const std::string& equation, const std::vector<int>& ranks) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq.push_back(c);
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> texts = absl::StrSplit(lhs, ',');
  if (texts.size() != ranks.size())
    return InvalidArgument("equation '", equation, "' has ", texts.size(), " input term(s) for ", ranks.size(),
                           " input(s)");
  std::vector<Term> terms;
  int max_ellipsis = 0;
  std::vector<int> ellipsis_rank(texts.size(), 0);
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSIGN_OR_RETURN(Term t, ParseTerm(texts[i], absl::StrCat("input ", i, "'s term"), true));
    if (t.ellipsis) {
      if (ranks[i] < 0)
        return InvalidArgument("input ", i, "'s term '", texts[i], "' has an ellipsis and the input's rank is unknown");
      if (ranks[i] < t.letters())
        return InvalidArgument("input ", i, "'s term '", texts[i], "' names ", t.letters(), " axes; the input has rank ",
                               ranks[i]);
      ellipsis_rank[i] = ranks[i] - t.letters();
      max_ellipsis = std::max(max_ellipsis, ellipsis_rank[i]);
    } else if (ranks[i] >= 0 && ranks[i] != t.letters()) {
      return InvalidArgument("input ", i, "'s term '", texts[i], "' names ", t.letters(), " axes; the input has rank ",
                             ranks[i]);
    }
    terms.push_back(std::move(t));
  }
  EinsumEquation out;
  std::map<int, int> count;
  bool any_ellipsis = false;
  for (size_t i = 0; i < terms.size(); ++i) {
    std::vector<int> labels = terms[i].before;
    for (int j = 0; j < ellipsis_rank[i]; ++j) labels.push_back(kEllipsisBase + max_ellipsis - ellipsis_rank[i] + j);
    labels.insert(labels.end(), terms[i].after.begin(), terms[i].after.end());
    for (int l : labels) ++count[l];
    any_ellipsis |= terms[i].ellipsis;
    out.inputs.push_back(std::move(labels));
  }
  if (arrow == std::string::npos) {
    for (int j = 0; j < max_ellipsis; ++j) out.output.push_back(kEllipsisBase + j);
    for (const auto& [label, n] : count)
      if (label < kEllipsisBase && n == 1) out.output.push_back(label);
    return out;
  }
  ASSIGN_OR_RETURN(Term t, ParseTerm(eq.substr(arrow + 2), "the output term", false));
  if (t.ellipsis && !any_ellipsis)
    return InvalidArgument("the output term '", eq.substr(arrow + 2), "' has an ellipsis and no input term has one");
  out.output = t.before;
  if (t.ellipsis)
    for (int j = 0; j < max_ellipsis; ++j) out.output.push_back(kEllipsisBase + j);
  out.output.insert(out.output.end(), t.after.begin(), t.after.end());
  for (int l : out.output)
    if (!count.count(l))
      return InvalidArgument("the output term names '", EinsumEquation::LabelName(l), "', which no input term has");
  return out;
}

}  // namespace cleave::graph
