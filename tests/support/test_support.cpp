#include "support/test_support.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace expertd::testing {

TempDir::TempDir() {
  // A random name, created exclusively (create_directory is false when it already exists), so
  // parallel test processes never share one.
  std::random_device random;
  std::error_code error;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char name[32];
    std::snprintf(name, sizeof(name), "expertd-test-%08x%08x", random(), random());
    const std::filesystem::path candidate = std::filesystem::temp_directory_path() / name;
    if (std::filesystem::create_directory(candidate, error)) {
      path_ = candidate.string();
      return;
    }
    if (error) break;
  }
  ADD_FAILURE() << "cannot create a directory under " << std::filesystem::temp_directory_path()
                << ": " << error.message();
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::File(std::string_view name) const {
  return (std::filesystem::path(path_) / name).make_preferred().string();
}

std::string SharedDataDir() {
  const std::string configured = EXPERTD_TEST_DATA_DIR;
  if (!configured.empty() && std::filesystem::is_directory(configured)) return configured;
  return "";
}

void WriteFile(const std::string& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                   ErrorKind kind,
                                   std::initializer_list<std::string_view> needles) {
  if (status.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "code " << absl::StatusCodeToString(status.code()) << ", expected "
           << absl::StatusCodeToString(code) << ": " << status;
  }
  const std::optional<ErrorKind> got = ErrorKindOf(status);
  if (got != kind) {
    return ::testing::AssertionFailure()
           << "kind " << (got ? ErrorKindName(*got) : "none") << ", expected "
           << ErrorKindName(kind) << ": " << status;
  }
  for (std::string_view needle : needles) {
    if (std::string(status.message()).find(needle) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message does not mention '" << needle << "': " << status.message();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace expertd::testing
