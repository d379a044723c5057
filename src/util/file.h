// Whole-file reads and writes for the formats and tools, over the platform seam (util/os_file.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "util/os_file.h"

namespace expertd {

// A read-only file. Reads are positional, so one ReadFile may be shared by threads. Errors
// name the path.
class ReadFile {
 public:
  static absl::StatusOr<ReadFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads exactly out.size() bytes at `offset`; a short read (end of file) is kTruncated.
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;

 private:
  ReadFile(std::string path, OsFile file, uint64_t size);
  std::string path_;
  OsFile file_;
  uint64_t size_ = 0;
};

// A file being written: created (truncating) at `path`. Close() reports write-back errors;
// a WriteFile dropped without Close() closes silently.
class WriteFile {
 public:
  static absl::StatusOr<WriteFile> Create(const std::string& path);

  const std::string& path() const { return path_; }
  // Appends all bytes at the current end; the offset they landed at is `written()` before.
  absl::Status Append(std::span<const uint8_t> bytes);
  absl::Status WriteAt(uint64_t offset, std::span<const uint8_t> bytes);
  uint64_t written() const { return written_; }
  absl::Status Close();

 private:
  WriteFile(std::string path, OsFile file);
  std::string path_;
  OsFile file_;
  uint64_t written_ = 0;
};

// Reads a whole (text) file. Errors name the path and `what` ("the index", "the route trace"):
// a file that cannot be opened is kMissingFile with its open error's code.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, std::string_view what);

// Writes `text` to `path` atomically (temporary file + rename).
absl::Status WriteTextFileAtomic(const std::string& path, std::string_view text);

}  // namespace expertd
