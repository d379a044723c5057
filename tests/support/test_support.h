// Helpers shared by the unit tests: temporary directories, the shared data folder, and matchers
// for expertd errors.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "util/status.h"

namespace expertd::testing {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path()/name in the platform's separators ('\\' on Windows, as the code under test joins).
  std::string File(std::string_view name) const;

 private:
  std::string path_;
};

// tests/data: the real GGUF files and routing traces, or "" when it is absent.
std::string SharedDataDir();

void WriteFile(const std::string& path, std::string_view content);
std::string ReadWholeFile(const std::string& path);

// Asserts `status` failed with `code`, with ErrorKind `kind`, and a message containing every
// string of `needles` (the file name, the offset or line ...).
::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                   ErrorKind kind,
                                   std::initializer_list<std::string_view> needles);

}  // namespace expertd::testing
