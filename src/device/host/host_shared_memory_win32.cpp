// The host device's shared-memory objects on Windows: pagefile-backed file mappings
// (CreateFileMapping), named "Local\<prefix>-<pid>-<n>-<random>" or anonymous, each with a
// security descriptor that says who may open it for what; clients open them by name, by a handle
// duplicated into them, or by duplicating the daemon's exported handle out of its process. See
// host_shared_memory.h and docs/windows.md.
#include <windows.h>
// After windows.h:
#include <aclapi.h>
#include <bcrypt.h>
#include <sddl.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "device/host/host_shared_memory.h"
#include "util/process.h"
#include "util/status.h"
#include "util/win32_text.h"

namespace expertd {
namespace host_device_internal {
namespace {

std::atomic<uint64_t> g_shm_serial{0};

HANDLE H(intptr_t h) { return reinterpret_cast<HANDLE>(h); }
HANDLE H(const NativeHandle& h) { return H(h.get()); }
intptr_t I(HANDLE h) { return h == nullptr ? NativeHandle::kNone : reinterpret_cast<intptr_t>(h); }

// What a client may do with a section: map it for reading (and writing), query it, read its
// security descriptor.
constexpr DWORD kReadAccess = SECTION_QUERY | SECTION_MAP_READ | READ_CONTROL;
constexpr DWORD kWriteAccess = kReadAccess | SECTION_MAP_WRITE;

absl::Status LastError(std::string_view call, std::string_view object) {
  return SysError(call, object, static_cast<int>(GetLastError()));
}

// The calling process's user, as an SDDL SID string.
absl::StatusOr<std::string> CurrentUserSid() {
  HANDLE token = nullptr;
  if (!OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &token)) {
    return LastError("OpenProcessToken", "this process");
  }
  alignas(8) char buf[256];
  DWORD n = 0;
  const BOOL ok = GetTokenInformation(token, TokenUser, buf, sizeof buf, &n);
  CloseHandle(token);
  if (!ok) return LastError("GetTokenInformation(TokenUser)", "this process");
  char* text = nullptr;
  if (!ConvertSidToStringSidA(reinterpret_cast<TOKEN_USER*>(buf)->User.Sid, &text)) {
    return LastError("ConvertSidToStringSid", "this process's user");
  }
  std::string sid(text);
  LocalFree(text);
  return sid;
}

// The access a mode's read and write bits (of one class: 04, 02) give a client.
DWORD AccessOf(uint32_t bits, bool write_allowed) {
  if ((bits & 04) == 0) return 0;
  return write_allowed && (bits & 02) != 0 ? kWriteAccess : kReadAccess;
}

// The security descriptor of a new object, as SDDL: a protected DACL (nothing inherited) that
// gives the daemon's user the mode's owner access and `client_sid` its group access, the group
// without write access unless clients write the object (as POSIX strips the group's write bit
// from arenas). The OWNER RIGHTS entry keeps the owner's implicit right to rewrite the DACL
// from letting the user widen it. The daemon's own handle has full access whatever it says.
//
// An anonymous object is reached only through a duplicated handle, and a duplicate may ask for
// more access than its source has when the DACL grants it: so where clients only read, the
// user gets no write access either (the daemon's handle needs none), as a memfd is sealed.
absl::StatusOr<std::string> SecurityFor(const HostDeviceOptions& options, bool clients_write) {
  ASSIGN_OR_RETURN(const std::string user, CurrentUserSid());
  std::string sddl = "D:P";
  const auto ace = [&](DWORD access, const std::string& sid) {
    if (access != 0) absl::StrAppend(&sddl, "(A;;0x", absl::Hex(access), ";;;", sid, ")");
  };
  const bool named = options.backing == HostDeviceOptions::Backing::kShmOpen;
  ace(AccessOf(options.shm_mode >> 6, named || clients_write), user);
  if (!options.client_sid.empty()) {
    ace(AccessOf(options.shm_mode >> 3, clients_write), options.client_sid);
  }
  absl::StrAppend(&sddl, "(A;;RC;;;OW)");
  return sddl;
}

struct LocalFreeDeleter {
  void operator()(void* p) const { LocalFree(p); }
};

// Whether the object behind `name` exists but was removed by its owner (an empty DACL: see
// SharedMemory::Unlink), which the owner's user can still see through its implicit
// READ_CONTROL.
bool RemovedByOwner(const std::wstring& name) {
  HANDLE h = OpenFileMappingW(READ_CONTROL, FALSE, name.c_str());
  if (h == nullptr) return false;
  PACL dacl = nullptr;
  PSECURITY_DESCRIPTOR sd = nullptr;
  const DWORD err = GetSecurityInfo(h, SE_KERNEL_OBJECT, DACL_SECURITY_INFORMATION, nullptr,
                                    nullptr, &dacl, nullptr, &sd);
  CloseHandle(h);
  const bool empty = err == ERROR_SUCCESS && dacl != nullptr && dacl->AceCount == 0;
  if (sd != nullptr) LocalFree(sd);
  return empty;
}

}  // namespace

absl::Status SysError(std::string_view call, std::string_view object, int err) {
  const auto code32 = static_cast<DWORD>(err);
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  // A handle value the owner has closed (Linux: no /proc/<pid>/fd/<fd>).
  if (code32 == ERROR_FILE_NOT_FOUND || code32 == ERROR_PATH_NOT_FOUND ||
      code32 == ERROR_INVALID_HANDLE) {
    code = absl::StatusCode::kNotFound;
  }
  if (code32 == ERROR_ACCESS_DENIED || code32 == ERROR_PRIVILEGE_NOT_HELD) {
    code = absl::StatusCode::kPermissionDenied;
  }
  if (code32 == ERROR_NOT_ENOUGH_MEMORY || code32 == ERROR_OUTOFMEMORY ||
      code32 == ERROR_COMMITMENT_LIMIT || code32 == ERROR_DISK_FULL ||
      code32 == ERROR_NO_SYSTEM_RESOURCES) {
    code = absl::StatusCode::kResourceExhausted;
  }
  char buf[256] = {};
  DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr,
                           code32, 0, buf, sizeof buf, nullptr);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.')) buf[--n] = 0;
  return MakeError(code, ErrorKind::kIo,
                   absl::StrCat(AV(call), "(", AV(object), "): ", n > 0 ? buf : "error",
                                " (Windows error ", code32, ")"));
}

void NativeHandle::Close(intptr_t value) { CloseHandle(H(value)); }

uint64_t PageSize() {
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  return info.dwAllocationGranularity;
}

uint64_t PhysicalMemory() {
  MEMORYSTATUSEX status{};
  status.dwLength = sizeof status;
  return GlobalMemoryStatusEx(&status) ? status.ullTotalPhys : 0;
}

absl::StatusOr<ShmMapping> MapPrivate(uint64_t bytes) {
  const std::string what = absl::StrCat("staging, ", bytes, " bytes");
  const NativeHandle section(
      I(CreateFileMappingW(INVALID_HANDLE_VALUE, nullptr, PAGE_READWRITE,
                           static_cast<DWORD>(bytes >> 32), static_cast<DWORD>(bytes), nullptr)));
  if (!section.valid()) return LastError("CreateFileMapping", what);
  void* view = MapViewOfFile(H(section), FILE_MAP_WRITE, 0, 0, bytes);
  if (view == nullptr) return LastError("MapViewOfFile", what);
  return ShmMapping(view, bytes);  // the view keeps the section
}

absl::StatusOr<ShmMapping> OpenedShared::Map(uint64_t offset, uint64_t bytes, bool writable) const {
  void* view = MapViewOfFile(H(handle_), writable ? FILE_MAP_WRITE : FILE_MAP_READ,
                             static_cast<DWORD>(offset >> 32), static_cast<DWORD>(offset), bytes);
  if (view == nullptr) return LastError("MapViewOfFile", what_);
  return ShmMapping(view, bytes);
}

absl::StatusOr<OpenedShared> OpenShared(const SharedHandle& h, bool writable, uint64_t need) {
  if (h.kind != SharedHandle::Kind::kHostShm) {
    return InvalidError(ErrorKind::kBadValue, "not a host shared-memory handle");
  }
  const DWORD access = writable ? kWriteAccess : kReadAccess;
  OpenedShared o;
  std::string& what = o.what_;
  HANDLE out = nullptr;
  if (h.passed_fd >= 0) {
    // Duplicated into this process by the daemon: a handle of our own.
    what = h.shm_name.empty() ? absl::StrCat("passed handle ", h.passed_fd) : h.shm_name;
    if (!DuplicateHandle(GetCurrentProcess(), H(h.passed_fd), GetCurrentProcess(), &out, access,
                         FALSE, 0)) {
      return LastError("DuplicateHandle", what);
    }
  } else if (!h.shm_name.empty()) {
    what = h.shm_name;
    const std::wstring name = win32::Wide(h.shm_name);
    out = OpenFileMappingW(access, FALSE, name.c_str());
    if (out == nullptr) {
      const DWORD err = GetLastError();
      if (err == ERROR_ACCESS_DENIED && RemovedByOwner(name)) {
        return MakeError(absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                         absl::StrCat("shared object ", what, " was removed by its owner"));
      }
      return SysError("OpenFileMapping", what, static_cast<int>(err));
    }
  } else if (h.fd >= 0 && h.owner_pid > 0) {
    what = absl::StrCat("handle ", h.fd, " of process ", h.owner_pid);
    const NativeHandle owner(
        I(OpenProcess(PROCESS_DUP_HANDLE, FALSE, static_cast<DWORD>(h.owner_pid))));
    if (!owner.valid()) return LastError("OpenProcess(PROCESS_DUP_HANDLE)", what);
    if (!DuplicateHandle(H(owner), H(h.fd), GetCurrentProcess(), &out, access, FALSE, 0)) {
      return LastError("DuplicateHandle", what);
    }
  } else {
    return InvalidError(ErrorKind::kBadValue, "shared handle has neither a name nor a handle");
  }
  o.handle_ = NativeHandle(I(out));
  // The object's size: a view of all of it spans the section, rounded up to whole pages.
  void* whole = MapViewOfFile(out, FILE_MAP_READ, 0, 0, 0);
  if (whole == nullptr) return LastError("MapViewOfFile", what);
  MEMORY_BASIC_INFORMATION info{};
  const SIZE_T got = VirtualQuery(whole, &info, sizeof info);
  UnmapViewOfFile(whole);
  if (got == 0) return LastError("VirtualQuery", what);
  RETURN_IF_ERROR(CheckObjectSize(what, info.RegionSize, need));
  return o;
}

absl::StatusOr<SharedMemory> SharedMemory::Create(const HostDeviceOptions& options,
                                                  std::string_view label, uint64_t bytes,
                                                  bool clients_write) {
  SharedMemory m;
  ASSIGN_OR_RETURN(const std::string sddl, SecurityFor(options, clients_write));
  PSECURITY_DESCRIPTOR sd_raw = nullptr;
  if (!ConvertStringSecurityDescriptorToSecurityDescriptorA(sddl.c_str(), SDDL_REVISION_1, &sd_raw,
                                                            nullptr)) {
    return LastError("ConvertStringSecurityDescriptorToSecurityDescriptor", sddl);
  }
  const std::unique_ptr<void, LocalFreeDeleter> sd(sd_raw);
  SECURITY_ATTRIBUTES attributes{sizeof attributes, sd.get(), FALSE};
  const auto high = static_cast<DWORD>(bytes >> 32);
  const auto low = static_cast<DWORD>(bytes);
  std::string what;
  if (options.backing == HostDeviceOptions::Backing::kShmOpen) {
    for (int attempt = 0;; ++attempt) {
      uint64_t nonce = 0;
      if (BCryptGenRandom(nullptr, reinterpret_cast<PUCHAR>(&nonce), sizeof nonce,
                          BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) {
        return MakeError(absl::StatusCode::kUnavailable, ErrorKind::kIo,
                         "BCryptGenRandom failed for a shared-memory name");
      }
      what = absl::StrCat("Local\\", options.shm_prefix, "-", CurrentProcessId(), "-",
                          g_shm_serial++, "-", absl::Hex(nonce, absl::kZeroPad16));
      HANDLE h = CreateFileMappingW(INVALID_HANDLE_VALUE, &attributes, PAGE_READWRITE | SEC_COMMIT,
                                    high, low, win32::Wide(what).c_str());
      const DWORD err = GetLastError();
      if (h != nullptr && err != ERROR_ALREADY_EXISTS) {
        m.handle_ = NativeHandle(I(h));
        break;
      }
      if (h != nullptr) CloseHandle(h);  // someone else's object: never use it
      if ((h == nullptr && err != ERROR_ACCESS_DENIED) || attempt == 7) {
        return SysError("CreateFileMapping", what, static_cast<int>(err));
      }
    }
    m.name_ = what;
  } else {
    what = absl::StrCat("anonymous mapping ", options.shm_prefix, ":", AV(label));
    m.handle_ = NativeHandle(I(CreateFileMappingW(
        INVALID_HANDLE_VALUE, &attributes, PAGE_READWRITE | SEC_COMMIT, high, low, nullptr)));
    if (!m.handle_.valid()) return LastError("CreateFileMapping", what);
  }
  // What clients duplicate out of this process: a handle with only their access, so that a
  // duplicate cannot ask for more (a duplicate of the full handle could).
  HANDLE exported = nullptr;
  if (!DuplicateHandle(GetCurrentProcess(), H(m.handle_), GetCurrentProcess(), &exported,
                       clients_write ? kWriteAccess : kReadAccess, FALSE, 0)) {
    return LastError("DuplicateHandle", what);
  }
  m.exported_ = NativeHandle(I(exported));
  void* view = MapViewOfFile(H(m.handle_), FILE_MAP_WRITE, 0, 0, bytes);
  if (view == nullptr) return LastError("MapViewOfFile", what);
  m.map_ = ShmMapping(view, bytes);
  return m;
}

SharedMemory::~SharedMemory() { Unlink(); }

// A name cannot be removed on Windows while handles or views of the object exist; emptying the
// DACL refuses every later open, which clients report as NotFound (RemovedByOwner).
void SharedMemory::Unlink() {
  if (name_.empty() || !handle_.valid()) return;
  ACL empty;
  if (InitializeAcl(&empty, sizeof empty, ACL_REVISION)) {
    SetSecurityInfo(H(handle_), SE_KERNEL_OBJECT,
                    DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION, nullptr,
                    nullptr, &empty, nullptr);
  }
  name_.clear();
}

SharedHandle SharedMemory::Handle() const {
  SharedHandle h;
  h.kind = SharedHandle::Kind::kHostShm;
  h.shm_name = name_;
  h.fd = static_cast<int>(exported_.get());
  h.owner_pid = CurrentProcessId();
  return h;
}

}  // namespace host_device_internal

ShmMapping::~ShmMapping() {
  if (addr_ != nullptr) UnmapViewOfFile(addr_);
}

}  // namespace expertd
