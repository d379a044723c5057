// Move-only owners of file descriptors with the few operations the packs and tools need.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace expertd {

// A read-only file opened with O_CLOEXEC. Reads use pread, so one ReadFile may be shared by
// threads. Errors name the path.
class ReadFile {
 public:
  static absl::StatusOr<ReadFile> Open(const std::string& path);

  ReadFile(ReadFile&& other) noexcept;
  ReadFile& operator=(ReadFile&& other) noexcept;
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  ~ReadFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  // Reads exactly out.size() bytes at `offset`; a short read (end of file) is kTruncated.
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;

 private:
  ReadFile(std::string path, int fd, uint64_t size);
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A file being written: created (truncating) at `path`. Close() reports write-back errors;
// a WriteFile dropped without Close() closes silently.
class WriteFile {
 public:
  static absl::StatusOr<WriteFile> Create(const std::string& path);

  WriteFile(WriteFile&& other) noexcept;
  WriteFile& operator=(WriteFile&& other) noexcept;
  WriteFile(const WriteFile&) = delete;
  WriteFile& operator=(const WriteFile&) = delete;
  ~WriteFile();

  const std::string& path() const { return path_; }
  // Appends all bytes at the current end; the offset they landed at is `written()` before.
  absl::Status Append(std::span<const uint8_t> bytes);
  absl::Status WriteAt(uint64_t offset, std::span<const uint8_t> bytes);
  uint64_t written() const { return written_; }
  absl::Status Close();

 private:
  WriteFile(std::string path, int fd);
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// Reads a whole (text) file. Errors name the path and `what` ("the index", "the route trace"):
// a file that cannot be opened is kMissingFile with its open error's code.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, std::string_view what);

// Writes `text` to `path` atomically (temporary file + rename).
absl::Status WriteTextFileAtomic(const std::string& path, std::string_view text);

}  // namespace expertd
