// Status plumbing for every layer of cleave (base/).
// User errors travel as absl::Status; internal invariants use CLEAVE_CHECK, which
// prints file:line and aborts, because a broken invariant is a bug, not bad input.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define CLEAVE_CONCAT_INNER(a, b) a##b
#define CLEAVE_CONCAT(a, b) CLEAVE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status _cleave_status = (expr);            \
    if (!_cleave_status.ok()) return _cleave_status;   \
  } while (0)

#define CLEAVE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)

#define ASSIGN_OR_RETURN(lhs, expr) \
  CLEAVE_ASSIGN_OR_RETURN_IMPL(CLEAVE_CONCAT(_cleave_statusor_, __LINE__), lhs, expr)

#define CLEAVE_CHECK(cond)                                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: internal check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                         \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

namespace cleave {

// "expected X, got Y" user errors, named after what the user can fix.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}
template <typename... Args>
absl::Status Unimplemented(const Args&... args) {
  return absl::UnimplementedError(absl::StrCat(args...));
}
template <typename... Args>
absl::Status NotFound(const Args&... args) {
  return absl::NotFoundError(absl::StrCat(args...));
}
template <typename... Args>
absl::Status Internal(const Args&... args) {
  return absl::InternalError(absl::StrCat(args...));
}

// An error that names the node it is about, which is not the step that reported it (a device
// error found at a later wait on the stream): the executor passes it on without naming that step.
inline constexpr char kNamesItsNodeUrl[] = "type.cleave/names-its-node";
inline absl::Status NamingItsNode(absl::Status s) {
  if (!s.ok()) s.SetPayload(kNamesItsNodeUrl, absl::Cord());
  return s;
}
inline bool NamesItsNode(const absl::Status& s) { return s.GetPayload(kNamesItsNodeUrl).has_value(); }

}  // namespace cleave
