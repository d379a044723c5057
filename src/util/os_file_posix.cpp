// util/os_file.h on POSIX (Linux): descriptors, pread/pwrite, statx, mmap.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/os_file.h"
#include "util/status.h"

namespace expertd {
namespace {

int Fd(intptr_t h) { return static_cast<int>(h); }

FileInfo InfoOf(const struct stat& st) {
  FileInfo info;
  info.size = static_cast<uint64_t>(st.st_size);
  info.regular = S_ISREG(st.st_mode);
  info.id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  info.volume_group = absl::StrCat("dev:", major(st.st_dev), ":", minor(st.st_dev));
  info.block_size = static_cast<uint32_t>(st.st_blksize);
  return info;
}

}  // namespace

absl::StatusOr<OsFile> OsFile::Open(const std::string& path, Access access, int* errno_out) {
  int flags = O_CLOEXEC;
  switch (access) {
    case Access::kRead:
      flags |= O_RDONLY;
      break;
    case Access::kReadDirect:
      flags |= O_RDONLY | O_DIRECT;
      break;
    case Access::kWrite:
      flags |= O_WRONLY | O_CREAT | O_TRUNC;
      break;
  }
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int err = errno;
    if (errno_out != nullptr) *errno_out = err;
    if (access == Access::kWrite) {
      return ErrnoError(ErrorKind::kIo, absl::StrCat("cannot create ", path), err);
    }
    return ErrnoError(ErrorKind::kMissingFile, absl::StrCat("cannot open ", path), err);
  }
  return OsFile(fd);
}

OsFile::OsFile(OsFile&& other) noexcept : handle_(other.handle_.exchange(-1)) {}

OsFile& OsFile::operator=(OsFile&& other) noexcept {
  if (this != &other) {
    Close();
    handle_ = other.handle_.exchange(-1);
  }
  return *this;
}

OsFile::~OsFile() { Close(); }

bool OsFile::valid() const { return handle_ >= 0; }

int64_t OsFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes, int* err) const {
  const ssize_t n = ::pread(Fd(native()), dst, bytes, static_cast<off_t>(offset));
  if (n < 0) *err = errno;
  return n;
}

int64_t OsFile::WriteAt(uint64_t offset, const void* src, uint64_t bytes, int* err) const {
  const ssize_t n = ::pwrite(Fd(native()), src, bytes, static_cast<off_t>(offset));
  if (n < 0) *err = errno;
  return n;
}

int64_t OsFile::Size(int* err) const {
  struct stat st {};
  if (::fstat(Fd(native()), &st) != 0) {
    *err = errno;
    return -1;
  }
  return st.st_size;
}

absl::StatusOr<FileInfo> OsFile::Info() const {
  struct stat st {};
  if (::fstat(Fd(native()), &st) != 0) return ErrnoError(ErrorKind::kIo, "fstat", errno);
  return InfoOf(st);
}

DirectAlignment OsFile::QueryDirectAlignment() const {
  DirectAlignment out;
#ifdef STATX_DIOALIGN  // kernel headers >= 6.1; older builds use the block-size fallback
  struct statx stx {};
  if (::statx(Fd(native()), "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0) {
    out.known = true;
    out.mem = stx.stx_dio_mem_align;
    out.offset = stx.stx_dio_offset_align;
  }
#endif
  return out;
}

int OsFile::Sync() const { return ::fsync(Fd(native())) == 0 ? 0 : errno; }

int OsFile::Close() {
  if (handle_ < 0) return 0;
  return ::close(Fd(handle_.exchange(-1))) == 0 ? 0 : errno;
}

int OsFile::ReplaceWith(OsFile other) {
  return ::dup2(Fd(other.native()), Fd(native())) < 0 ? errno : 0;
}

absl::StatusOr<FileInfo> StatPath(const std::string& path, int* errno_out) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno_out != nullptr) *errno_out = errno;
    return ErrnoError(ErrorKind::kMissingFile, absl::StrCat("cannot stat ", path), errno);
  }
  return InfoOf(st);
}

absl::Status RenameReplacing(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("rename ", from, " to ", to), errno);
  }
  return absl::OkStatus();
}

FileMapping FileMapping::Map(const OsFile& file, uint64_t bytes, Kind kind, int* err) {
  const bool shared = kind == Kind::kReadShared;
  void* map = ::mmap(nullptr, bytes, shared ? PROT_READ : PROT_READ | PROT_WRITE,
                     shared ? MAP_SHARED : MAP_PRIVATE, Fd(file.native()), 0);
  FileMapping out;
  if (map == MAP_FAILED) {
    *err = errno;
    return out;
  }
  out.data_ = static_cast<uint8_t*>(map);
  out.bytes_ = bytes;
  out.kind_ = kind;
  return out;
}

void FileMapping::Reset() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

int FileMapping::RemapInPlace(const OsFile& file) {
  return ::mmap(data_, bytes_, PROT_READ, MAP_SHARED | MAP_FIXED, Fd(file.native()), 0) ==
                 MAP_FAILED
             ? errno
             : 0;
}

void* AlignedAlloc(uint64_t align, uint64_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, std::max<uint64_t>(align, sizeof(void*)), bytes) != 0) return nullptr;
  return p;
}

void AlignedFree(void* p) { std::free(p); }

void SetCurrentThreadName(std::string_view name) {
  pthread_setname_np(pthread_self(), std::string(name.substr(0, 15)).c_str());
}

}  // namespace expertd
