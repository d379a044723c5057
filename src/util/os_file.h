// The platform seam for files: one move-only owner of an open file (a POSIX descriptor or a
// Win32 HANDLE), whole-file mappings, and the few process-level calls the readers need. The
// build picks one implementation (os_file_posix.cpp or os_file_win32.cpp, see
// src/CMakeLists.txt; os_file.cpp is shared); nothing else in the core includes a platform
// header for files.
//
// Primitive calls report failure the way the readers' retry policy expects: -1 with an errno
// value (EINTR, EAGAIN, EIO, EINVAL, ENOENT, ...). The Win32 side maps its error codes onto
// those, so both platforms share one policy (pack/pack_set.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace expertd {

// Which file an open handle or a path names: the same pair means the same file.
struct FileIdentity {
  uint64_t volume = 0;  // st_dev; the volume serial number on Windows
  uint64_t file = 0;    // st_ino; the file index on Windows
  bool operator==(const FileIdentity&) const = default;
};

struct FileInfo {
  uint64_t size = 0;
  bool regular = false;
  FileIdentity id;
  // The source group a file's drive gives: "dev:MAJ:MIN" (Linux), "vol:XXXXXXXX" (Windows).
  std::string volume_group;
  uint32_t block_size = 0;  // the preferred I/O size (st_blksize; the sector size on Windows)
};

// Alignment that unbuffered (direct) reads of one file need. `known`: the system reported it
// (statx STATX_DIOALIGN; FileStorageInfo on Windows); a zero alignment with `known` means the
// file cannot be read unbuffered.
struct DirectAlignment {
  bool known = false;
  uint32_t mem = 0;
  uint32_t offset = 0;
};

class OsFile {
 public:
  enum class Access {
    kRead,        // buffered, read-only (positional reads from any thread)
    kReadDirect,  // read-only bypassing the page cache: O_DIRECT; FILE_FLAG_NO_BUFFERING
    kWrite,       // created or truncated, write-only
  };
  // Errors are ErrnoError with the path (kMissingFile for reads, kIo for kWrite); `errno_out`,
  // when given, receives the errno value (EINVAL: the filesystem refuses direct access).
  static absl::StatusOr<OsFile> Open(const std::string& path, Access access,
                                     int* errno_out = nullptr);

  OsFile() = default;
  OsFile(OsFile&& other) noexcept;
  OsFile& operator=(OsFile&& other) noexcept;
  OsFile(const OsFile&) = delete;
  OsFile& operator=(const OsFile&) = delete;
  ~OsFile();

  bool valid() const;
  // Up to `bytes` at `offset` (one system call): the bytes moved, 0 at the end of the file, or
  // -1 with *err set. Thread-safe on one OsFile.
  int64_t ReadAt(uint64_t offset, void* dst, uint64_t bytes, int* err) const;
  int64_t WriteAt(uint64_t offset, const void* src, uint64_t bytes, int* err) const;
  // The file's size now, or -1 with *err (the mapped reads' truncation guard).
  int64_t Size(int* err) const;
  // fstat: size, type, identity, volume group; ErrnoError (kIo) on failure.
  absl::StatusOr<FileInfo> Info() const;
  DirectAlignment QueryDirectAlignment() const;
  // Flushes written data to the drive; 0 or an errno value (EINVAL: the file cannot be synced).
  int Sync() const;
  // Closes now; 0 or an errno value.
  int Close();
  // Makes this handle read `other`'s file, in place: reads running on another thread finish on
  // the old file or start on the new one, never on a closed handle (dup2 on POSIX; on Windows
  // the old HANDLE stays open until this object is destroyed). 0 or an errno value.
  int ReplaceWith(OsFile other);

  // The descriptor (POSIX) or HANDLE (Windows) as an integer, for the mapping code.
  intptr_t native() const { return handle_.load(std::memory_order_acquire); }

 private:
  explicit OsFile(intptr_t handle) : handle_(handle) {}
  // Atomic because ReplaceWith may swap it (Windows) while other threads read through it.
  std::atomic<intptr_t> handle_{-1};
  std::vector<intptr_t> retired_;  // Windows: handles replaced by ReplaceWith, closed with this
};

// Information about the file a path names now (stat), without opening it for reading. The
// error is ErrnoError (kMissingFile) naming the path; `errno_out` gets its errno value.
absl::StatusOr<FileInfo> StatPath(const std::string& path, int* errno_out = nullptr);
// rename(2) / MoveFileEx(REPLACE_EXISTING): `from` replaces `to` atomically.
absl::Status RenameReplacing(const std::string& from, const std::string& to);

// A whole-file mapping, unmapped when destroyed. Move-only.
class FileMapping {
 public:
  enum class Kind {
    kReadShared,    // read-only, sees the file (mmap MAP_SHARED; a FILE_MAP_READ view)
    kPrivateWrite,  // writable copy-on-write: nothing written reaches the file
  };
  // Maps the first `bytes` of `file` (bytes > 0). On failure the result is invalid and *err
  // holds an errno value (ENODEV: the filesystem cannot map files).
  static FileMapping Map(const OsFile& file, uint64_t bytes, Kind kind, int* err);

  FileMapping() = default;
  FileMapping(FileMapping&& other) noexcept;
  FileMapping& operator=(FileMapping&& other) noexcept;
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  ~FileMapping();

  bool valid() const { return data_ != nullptr; }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // Maps `file` at this mapping's address instead (kReadShared). POSIX replaces the pages in
  // one call (MAP_FIXED); Windows unmaps and maps the view at the same address, so a reader
  // copying from it at that instant would fault: callers replace only mappings nobody reads
  // (a failed pack). 0 or an errno value.
  int RemapInPlace(const OsFile& file);

 private:
  void Reset();
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  Kind kind_ = Kind::kReadShared;
};

// Memory aligned to `align` (a power of two), freed with AlignedFree; nullptr when out of memory.
void* AlignedAlloc(uint64_t align, uint64_t bytes);
void AlignedFree(void* p);
// Names the calling thread for debuggers and top (Linux keeps the first 15 characters).
void SetCurrentThreadName(std::string_view name);

}  // namespace expertd
