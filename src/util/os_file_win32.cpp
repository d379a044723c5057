// util/os_file.h on Windows: HANDLEs opened for overlapped I/O (positional reads from any thread,
// FILE_FLAG_NO_BUFFERING for direct reads), file mappings, and Win32 error codes mapped onto the
// errno values the readers' retry policy knows.
#include <malloc.h>
#include <windows.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/os_file.h"
#include "util/status.h"
#include "util/win32_text.h"

namespace expertd {
namespace {

using win32::Wide;

HANDLE H(intptr_t h) { return reinterpret_cast<HANDLE>(h); }
intptr_t I(HANDLE h) { return reinterpret_cast<intptr_t>(h); }
constexpr intptr_t kInvalid = -1;  // INVALID_HANDLE_VALUE as an integer

int ErrnoOf(DWORD code) {
  switch (code) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_NAME:
    case ERROR_INVALID_DRIVE:
      return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION:
      return EACCES;
    case ERROR_INVALID_PARAMETER:
    case ERROR_NOT_SUPPORTED:
    case ERROR_INVALID_FUNCTION:
      return EINVAL;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_NO_SYSTEM_RESOURCES:
      return ENOMEM;
    case ERROR_OPERATION_ABORTED:
      return EINTR;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
      return ENOSPC;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS:
      return EEXIST;
    case ERROR_USER_MAPPED_FILE:
      return EBUSY;
    default:
      return EIO;  // ERROR_CRC, ERROR_IO_DEVICE, ERROR_SECTOR_NOT_FOUND, ...
  }
}

// The event of one overlapped call: each call waits for its own completion. One per call, not a
// thread_local one: with mingw-w64's emulated TLS a thread_local's destructor can run after its
// storage was freed at thread exit (reader threads crashed there under wine), and an event costs
// a microsecond beside a read.
struct CallEvent {
  HANDLE h = CreateEventW(nullptr, TRUE, FALSE, nullptr);
  CallEvent() = default;
  CallEvent(const CallEvent&) = delete;
  CallEvent& operator=(const CallEvent&) = delete;
  ~CallEvent() {
    if (h != nullptr) CloseHandle(h);
  }
};

// ReadFile/WriteFile at `offset` on an overlapped handle, waiting for the result.
int64_t Transfer(HANDLE h, uint64_t offset, void* buf, uint64_t bytes, bool write, int* err) {
  const CallEvent event;
  if (event.h == nullptr) {
    *err = ErrnoOf(GetLastError());
    return -1;
  }
  OVERLAPPED ov{};
  ov.Offset = static_cast<DWORD>(offset);
  ov.OffsetHigh = static_cast<DWORD>(offset >> 32);
  ov.hEvent = event.h;
  const DWORD want = static_cast<DWORD>(std::min<uint64_t>(bytes, 1u << 30));
  DWORD got = 0;
  const BOOL ok =
      write ? WriteFile(h, buf, want, nullptr, &ov) : ReadFile(h, buf, want, nullptr, &ov);
  DWORD code = ok ? ERROR_SUCCESS : GetLastError();
  if (ok || code == ERROR_IO_PENDING) {
    code = GetOverlappedResult(h, &ov, &got, TRUE) ? ERROR_SUCCESS : GetLastError();
  }
  if (code == ERROR_SUCCESS) return got;
  if (code == ERROR_HANDLE_EOF) return 0;
  *err = ErrnoOf(code);
  return -1;
}

absl::StatusOr<FileInfo> InfoOf(HANDLE h) {
  BY_HANDLE_FILE_INFORMATION bhfi{};
  if (!GetFileInformationByHandle(h, &bhfi)) {
    return ErrnoError(ErrorKind::kIo, "GetFileInformationByHandle", ErrnoOf(GetLastError()));
  }
  FileInfo info;
  info.size = (uint64_t{bhfi.nFileSizeHigh} << 32) | bhfi.nFileSizeLow;
  info.regular =
      (bhfi.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) == 0 && GetFileType(h) == FILE_TYPE_DISK;
  info.id = {bhfi.dwVolumeSerialNumber, (uint64_t{bhfi.nFileIndexHigh} << 32) | bhfi.nFileIndexLow};
  char serial[16];
  snprintf(serial, sizeof serial, "%08lX", static_cast<unsigned long>(bhfi.dwVolumeSerialNumber));
  info.volume_group = absl::StrCat("vol:", serial);
  FILE_STORAGE_INFO storage{};
  info.block_size = GetFileInformationByHandleEx(h, FileStorageInfo, &storage, sizeof storage)
                        ? storage.PhysicalBytesPerSectorForPerformance
                        : 4096;
  return info;
}

}  // namespace

absl::StatusOr<OsFile> OsFile::Open(const std::string& path, Access access, int* errno_out) {
  DWORD desired = GENERIC_READ;
  DWORD disposition = OPEN_EXISTING;
  DWORD flags = FILE_FLAG_OVERLAPPED;
  switch (access) {
    case Access::kRead:
      // Lets a directory open as it does on POSIX, so the caller's Info() check reports "not a
      // regular file" instead of an access error.
      flags |= FILE_FLAG_BACKUP_SEMANTICS;
      break;
    case Access::kReadDirect:
      flags |= FILE_FLAG_NO_BUFFERING;
      break;
    case Access::kWrite:
      desired = GENERIC_WRITE;
      disposition = CREATE_ALWAYS;
      break;
  }
  // Sharing delete and write as POSIX does: a pack may be renamed, replaced or truncated while
  // open, which PackSet::CheckFiles then reports.
  const HANDLE h = CreateFileW(Wide(path).c_str(), desired,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                               disposition, flags | FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) {
    const DWORD code = GetLastError();
    const int err = ErrnoOf(code);
    if (errno_out != nullptr) *errno_out = err;
    const std::string what =
        absl::StrCat(access == Access::kWrite ? "cannot create " : "cannot open ", path,
                     " (Windows error ", code, ")");
    return ErrnoError(access == Access::kWrite ? ErrorKind::kIo : ErrorKind::kMissingFile, what,
                      err);
  }
  return OsFile(I(h));
}

OsFile::OsFile(OsFile&& other) noexcept
    : handle_(other.handle_.exchange(kInvalid)), retired_(std::move(other.retired_)) {}

OsFile& OsFile::operator=(OsFile&& other) noexcept {
  if (this != &other) {
    Close();
    handle_ = other.handle_.exchange(kInvalid);
    retired_ = std::move(other.retired_);
  }
  return *this;
}

OsFile::~OsFile() { Close(); }

bool OsFile::valid() const { return native() != kInvalid; }

int64_t OsFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes, int* err) const {
  return Transfer(H(native()), offset, dst, bytes, false, err);
}

int64_t OsFile::WriteAt(uint64_t offset, const void* src, uint64_t bytes, int* err) const {
  return Transfer(H(native()), offset, const_cast<void*>(src), bytes, true, err);
}

int64_t OsFile::Size(int* err) const {
  LARGE_INTEGER size{};
  if (!GetFileSizeEx(H(native()), &size)) {
    *err = ErrnoOf(GetLastError());
    return -1;
  }
  return size.QuadPart;
}

absl::StatusOr<FileInfo> OsFile::Info() const { return InfoOf(H(native())); }

DirectAlignment OsFile::QueryDirectAlignment() const {
  DirectAlignment out;
  FILE_STORAGE_INFO storage{};
  if (GetFileInformationByHandleEx(H(native()), FileStorageInfo, &storage, sizeof storage)) {
    // Unbuffered I/O: offsets, lengths and buffer addresses in whole sectors.
    out.known = true;
    out.offset = storage.PhysicalBytesPerSectorForPerformance;
    out.mem = storage.PhysicalBytesPerSectorForPerformance;
  }
  return out;
}

int OsFile::Sync() const { return FlushFileBuffers(H(native())) ? 0 : ErrnoOf(GetLastError()); }

int OsFile::Close() {
  int err = 0;
  const intptr_t h = handle_.exchange(kInvalid);
  if (h != kInvalid && !CloseHandle(H(h))) err = ErrnoOf(GetLastError());
  for (intptr_t old : retired_) CloseHandle(H(old));
  retired_.clear();
  return err;
}

int OsFile::ReplaceWith(OsFile other) {
  // A reader may be inside ReadFile on the old HANDLE: it stays open until this OsFile closes.
  retired_.push_back(handle_.exchange(other.handle_.exchange(kInvalid)));
  for (intptr_t old : other.retired_) retired_.push_back(old);
  other.retired_.clear();
  return 0;
}

absl::StatusOr<FileInfo> StatPath(const std::string& path, int* errno_out) {
  const HANDLE h = CreateFileW(Wide(path).c_str(), FILE_READ_ATTRIBUTES,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                               OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) {
    const int err = ErrnoOf(GetLastError());
    if (errno_out != nullptr) *errno_out = err;
    return ErrnoError(ErrorKind::kMissingFile, absl::StrCat("cannot stat ", path), err);
  }
  absl::StatusOr<FileInfo> info = InfoOf(h);
  CloseHandle(h);
  return info;
}

absl::Status RenameReplacing(const std::string& from, const std::string& to) {
  if (!MoveFileExW(Wide(from).c_str(), Wide(to).c_str(),
                   MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("rename ", from, " to ", to),
                      ErrnoOf(GetLastError()));
  }
  return absl::OkStatus();
}

namespace {

// A view of `file` (at `at`, or anywhere when null); nullptr with *err on failure.
uint8_t* MapView(const OsFile& file, uint64_t bytes, FileMapping::Kind kind, void* at, int* err) {
  const bool shared = kind == FileMapping::Kind::kReadShared;
  const HANDLE section =
      CreateFileMappingW(H(file.native()), nullptr, shared ? PAGE_READONLY : PAGE_WRITECOPY,
                         static_cast<DWORD>(bytes >> 32), static_cast<DWORD>(bytes), nullptr);
  if (section == nullptr) {
    *err = ErrnoOf(GetLastError());
    return nullptr;
  }
  void* view = MapViewOfFileEx(section, shared ? FILE_MAP_READ : FILE_MAP_COPY, 0, 0, bytes, at);
  if (view == nullptr) *err = ErrnoOf(GetLastError());
  CloseHandle(section);  // the view keeps the section alive
  return static_cast<uint8_t*>(view);
}

}  // namespace

FileMapping FileMapping::Map(const OsFile& file, uint64_t bytes, Kind kind, int* err) {
  FileMapping out;
  out.data_ = MapView(file, bytes, kind, nullptr, err);
  if (out.data_ != nullptr) {
    out.bytes_ = bytes;
    out.kind_ = kind;
  }
  return out;
}

void FileMapping::Reset() {
  if (data_ != nullptr) UnmapViewOfFile(data_);
  data_ = nullptr;
  bytes_ = 0;
}

int FileMapping::RemapInPlace(const OsFile& file) {
  UnmapViewOfFile(data_);
  int err = 0;
  if (MapView(file, bytes_, kind_, data_, &err) == nullptr) {
    data_ = nullptr;  // the address was taken in between: the pack stays failed, unmapped
    bytes_ = 0;
    return err;
  }
  return 0;
}

void* AlignedAlloc(uint64_t align, uint64_t bytes) { return _aligned_malloc(bytes, align); }

void AlignedFree(void* p) { _aligned_free(p); }

void SetCurrentThreadName(std::string_view name) {
  // SetThreadDescription exists from Windows 10 1607; looked up so older systems still start.
  using SetDescription = HRESULT(WINAPI*)(HANDLE, PCWSTR);
  static const auto set = reinterpret_cast<SetDescription>(reinterpret_cast<void*>(
      GetProcAddress(GetModuleHandleW(L"kernel32.dll"), "SetThreadDescription")));
  if (set != nullptr) set(GetCurrentThread(), Wide(std::string(name)).c_str());
}

}  // namespace expertd
