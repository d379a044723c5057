// Status helpers shared by every library: absl::Status inside, early-return macros, and a typed
// error kind attached to format errors so tests and callers can tell error classes apart without
// parsing messages.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace expertd {

// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), so
// std::string_view does not convert implicitly; pass views to absl::StrCat through this.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Why a file or request was rejected. Attached to an absl::Status as a payload; the status code
// stays the coarse gRPC-style class (InvalidArgument, DataLoss, NotFound, OutOfRange).
enum class ErrorKind {
  kTruncated,        // the file ends before a structure it declares
  kBadMagic,         // not a GGUF file
  kBadVersion,       // unsupported GGUF version (or wrong endianness)
  kAbsurdCount,      // a count larger than the file could hold
  kOverflow,         // arithmetic on declared sizes/offsets overflows
  kMisaligned,       // an offset breaks the alignment / packing rules
  kUnknownType,      // unknown ggml type or GGUF value type
  kBadValue,         // a field has an invalid value (name too long, n_dims > 4, bad alignment ...)
  kDuplicate,        // duplicate key, tensor name, pack id or expert row
  kOutOfBounds,      // a range lies outside its file
  kBadRow,           // an index row that does not parse
  kUndeclaredPack,   // an index row names a pack id with no earlier @pack line
  kMissingFile,      // a file that must exist does not, or cannot be opened
  kMissingQPack,     // a v1 index without its Q pack path
  kIo,               // a read/write system call failed
  kSplit,            // shards of a split model disagree or are missing
};

std::string_view ErrorKindName(ErrorKind kind);

// Builds a status with `code`, `message` and `kind` attached.
absl::Status MakeError(absl::StatusCode code, ErrorKind kind, std::string_view message);

// The kind attached by MakeError, or nullopt for other statuses.
std::optional<ErrorKind> ErrorKindOf(const absl::Status& status);

// Shorthands for the common classes. Messages must name the place (file and offset/line).
inline absl::Status InvalidError(ErrorKind kind, std::string_view message) {
  return MakeError(absl::StatusCode::kInvalidArgument, kind, message);
}
inline absl::Status DataError(ErrorKind kind, std::string_view message) {
  return MakeError(absl::StatusCode::kDataLoss, kind, message);
}

// Builds the message of a failed system call: "what: strerror(errno)".
absl::Status ErrnoError(ErrorKind kind, std::string_view what, int err);

}  // namespace expertd

#define EXPERTD_CONCAT_INNER(a, b) a##b
#define EXPERTD_CONCAT(a, b) EXPERTD_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    if (absl::Status _st = (expr); !_st.ok()) {      \
      return _st;                                    \
    }                                                \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())`: evaluates F(), returns its error or binds its value.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(EXPERTD_CONCAT(_status_or_, __LINE__), lhs, expr)
// NOLINTNEXTLINE(bugprone-macro-parentheses): `lhs` is a declaration and cannot be parenthesized.
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
