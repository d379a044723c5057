#include "util/status.h"

#include <cstring>

#include "absl/strings/cord.h"

namespace expertd {
namespace {
constexpr std::string_view kKindUrl = "type.expertd/ErrorKind";

constexpr std::string_view kNames[] = {
    "truncated",  "bad_magic",    "bad_version", "absurd_count",    "overflow",
    "misaligned", "unknown_type", "bad_value",   "duplicate",       "out_of_bounds",
    "bad_row",    "undeclared_pack", "missing_file", "missing_q_pack", "io",
    "split",
};
}  // namespace

std::string_view ErrorKindName(ErrorKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

absl::Status MakeError(absl::StatusCode code, ErrorKind kind, std::string_view message) {
  absl::Status status(code, AV(message));
  status.SetPayload(AV(kKindUrl), absl::Cord(AV(ErrorKindName(kind))));
  return status;
}

std::optional<ErrorKind> ErrorKindOf(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(AV(kKindUrl));
  if (!payload) return std::nullopt;
  const std::string name(*payload);
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (kNames[i] == name) return static_cast<ErrorKind>(i);
  }
  return std::nullopt;
}

absl::Status ErrnoError(ErrorKind kind, std::string_view what, int err) {
  const absl::StatusCode code =
      err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable;
  return MakeError(code, kind, absl::StrCat(AV(what), ": ", std::strerror(err)));
}

}  // namespace expertd
