// The host device's shared-memory objects on POSIX: shm_open names or memfds, mapped with mmap;
// clients open them by name, by a descriptor received over the handle socket, or through
// /proc/<pid>/fd. See host_shared_memory.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "device/host/host_shared_memory.h"
#include "util/process.h"
#include "util/status.h"

namespace expertd {
namespace host_device_internal {
namespace {

// Names are unique per process: "/<prefix>-<pid>-<n>-<random>".
std::atomic<uint64_t> g_shm_serial{0};

absl::StatusOr<ShmMapping> MapFd(int fd, uint64_t offset, uint64_t bytes, int prot,
                                 std::string_view what) {
  void* addr = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (addr == MAP_FAILED) return SysError("mmap", what, errno);
  return ShmMapping(addr, bytes);
}

int Fd(const NativeHandle& h) { return static_cast<int>(h.get()); }

}  // namespace

absl::Status SysError(std::string_view call, std::string_view object, int err) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (err == ENOENT) code = absl::StatusCode::kNotFound;
  if (err == EACCES || err == EPERM) code = absl::StatusCode::kPermissionDenied;
  if (err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE) {
    code = absl::StatusCode::kResourceExhausted;
  }
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof(buf));  // GNU: thread-safe, returns the text
  return MakeError(code, ErrorKind::kIo, absl::StrCat(AV(call), "(", AV(object), "): ", text));
}

void NativeHandle::Close(intptr_t value) { ::close(static_cast<int>(value)); }

uint64_t PageSize() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

uint64_t PhysicalMemory() { return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * PageSize(); }

absl::StatusOr<ShmMapping> MapPrivate(uint64_t bytes) {
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED)
    return SysError("mmap", absl::StrCat("staging, ", bytes, " bytes"), errno);
  return ShmMapping(addr, bytes);
}

absl::StatusOr<ShmMapping> OpenedShared::Map(uint64_t offset, uint64_t bytes, bool writable) const {
  return MapFd(Fd(handle_), offset, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, what_);
}

absl::StatusOr<OpenedShared> OpenShared(const SharedHandle& h, bool writable, uint64_t need) {
  if (h.kind != SharedHandle::Kind::kHostShm) {
    return InvalidError(ErrorKind::kBadValue, "not a host shared-memory handle");
  }
  const int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  OpenedShared o;
  std::string& what = o.what_;
  if (h.passed_fd >= 0) {
    // Received over the handle socket: this process's own descriptor for the object.
    what = h.shm_name.empty() ? absl::StrCat("passed descriptor ", h.passed_fd) : h.shm_name;
    o.handle_ = NativeHandle(::fcntl(h.passed_fd, F_DUPFD_CLOEXEC, 0));
    if (Fd(o.handle_) < 0) return SysError("fcntl(F_DUPFD_CLOEXEC)", what, errno);
  } else if (!h.shm_name.empty()) {
    what = h.shm_name;
    o.handle_ = NativeHandle(::shm_open(h.shm_name.c_str(), flags, 0));
    if (Fd(o.handle_) < 0) return SysError("shm_open", what, errno);
  } else if (h.fd >= 0 && h.owner_pid > 0) {
    what = absl::StrCat("/proc/", h.owner_pid, "/fd/", h.fd);
    o.handle_ = NativeHandle(::open(what.c_str(), flags));
    if (Fd(o.handle_) < 0) return SysError("open", what, errno);
  } else {
    return InvalidError(ErrorKind::kBadValue, "shared handle has neither a name nor a descriptor");
  }
  struct stat st {};
  if (::fstat(Fd(o.handle_), &st) != 0) return SysError("fstat", what, errno);
  if ((h.inode != 0 || h.dev != 0) && (st.st_dev != h.dev || st.st_ino != h.inode)) {
    return MakeError(absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                     absl::StrCat("shared object ", what, " is no longer the one exported (inode ",
                                  st.st_ino, ", expected ", h.inode, ")"));
  }
  RETURN_IF_ERROR(CheckObjectSize(what, static_cast<uint64_t>(st.st_size), need));
  return o;
}

absl::StatusOr<SharedMemory> SharedMemory::Create(const HostDeviceOptions& options,
                                                  std::string_view label, uint64_t bytes,
                                                  bool clients_write) {
  SharedMemory m;
  std::string what;
  if (options.backing == HostDeviceOptions::Backing::kShmOpen) {
    for (int attempt = 0;; ++attempt) {
      uint64_t nonce = 0;
      if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) {
        return SysError("getrandom", "a shared-memory name", errno);
      }
      what = absl::StrCat("/", options.shm_prefix, "-", CurrentProcessId(), "-", g_shm_serial++,
                          "-", absl::Hex(nonce, absl::kZeroPad16));
      m.handle_ =
          NativeHandle(::shm_open(what.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (m.handle_.valid()) break;
      if (errno != EEXIST || attempt == 7) return SysError("shm_open", what, errno);
    }
    m.name_ = what;
    // shm_open's mode is filtered by the umask; the configured mode is what the operator wants.
    const uint32_t mode = clients_write ? options.shm_mode : options.shm_mode & ~0022u;
    if (::fchmod(Fd(m.handle_), mode) != 0) return SysError("fchmod", what, errno);
  } else {
    const std::string name = absl::StrCat(options.shm_prefix, ":", AV(label)).substr(0, 240);
    what = absl::StrCat("memfd:", name);
    m.handle_ = NativeHandle(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!m.handle_.valid()) return SysError("memfd_create", what, errno);
  }
  const int fd = Fd(m.handle_);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return SysError("ftruncate", absl::StrCat(what, ", ", bytes, " bytes"), errno);
  }
  // Reserve the pages now: tmpfs is sparse, and touching a page it cannot back later would be
  // SIGBUS in the copy thread (or in a client) instead of an error here.
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return SysError("posix_fallocate", absl::StrCat(what, ", ", bytes, " bytes"), err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SysError("fstat", what, errno);
  m.dev_ = st.st_dev;
  m.inode_ = st.st_ino;
  ASSIGN_OR_RETURN(m.map_, MapFd(fd, 0, bytes, PROT_READ | PROT_WRITE, what));
  if (options.backing == HostDeviceOptions::Backing::kMemfd) {
    // A memfd has no mode that keeps a client from writing through the descriptor it is passed
    // (or from reopening it read-write through /proc): objects clients only read are sealed
    // against every write mapping made after the daemon's own.
    const int seals =
        F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (clients_write ? 0 : F_SEAL_FUTURE_WRITE);
    if (::fcntl(fd, F_ADD_SEALS, seals) != 0) return SysError("fcntl(F_ADD_SEALS)", what, errno);
  }
  return m;
}

SharedMemory::~SharedMemory() { Unlink(); }

void SharedMemory::Unlink() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
}

SharedHandle SharedMemory::Handle() const {
  SharedHandle h;
  h.kind = SharedHandle::Kind::kHostShm;
  h.shm_name = name_;
  h.fd = Fd(handle_);
  h.owner_pid = CurrentProcessId();
  h.dev = dev_;
  h.inode = inode_;
  return h;
}

}  // namespace host_device_internal

ShmMapping::~ShmMapping() {
  if (addr_ != nullptr) ::munmap(addr_, bytes_);
}

}  // namespace expertd
