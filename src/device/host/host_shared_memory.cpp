// The host device's shared memory (shm_open / memfd objects, mappings), the fence word
// algorithms both ends use, and the client side: MapArena, MapFences, MappedFences.
#include "device/host/host_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/futex.h"
#include "util/status.h"

namespace expertd {
namespace host_device_internal {
namespace {

// Fences live in memory several processes map at different addresses: only lock-free atomics
// are address-free (they do not depend on a per-process lock table).
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

// Names are unique per process: "/<prefix>-<pid>-<n>".
std::atomic<uint64_t> g_shm_serial{0};

// Opens what a SharedHandle names, for a client: the shm name, else the exporter's descriptor
// through /proc (same user, or ptrace-read access).
absl::StatusOr<UniqueFd> OpenShared(const SharedHandle& h, bool writable, std::string* what) {
  if (h.kind != SharedHandle::Kind::kHostShm) {
    return InvalidError(ErrorKind::kBadValue, "not a host shared-memory handle");
  }
  const int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  UniqueFd fd;
  if (h.passed_fd >= 0) {
    // Received over the handle socket: this process's own descriptor for the object.
    *what = h.shm_name.empty() ? absl::StrCat("passed descriptor ", h.passed_fd) : h.shm_name;
    fd = UniqueFd(::fcntl(h.passed_fd, F_DUPFD_CLOEXEC, 0));
    if (fd.get() < 0) return SysError("fcntl(F_DUPFD_CLOEXEC)", *what, errno);
  } else if (!h.shm_name.empty()) {
    *what = h.shm_name;
    fd = UniqueFd(::shm_open(h.shm_name.c_str(), flags, 0));
    if (fd.get() < 0) return SysError("shm_open", *what, errno);
  } else if (h.fd >= 0 && h.owner_pid > 0) {
    *what = absl::StrCat("/proc/", h.owner_pid, "/fd/", h.fd);
    fd = UniqueFd(::open(what->c_str(), flags));
    if (fd.get() < 0) return SysError("open", *what, errno);
  } else {
    return InvalidError(ErrorKind::kBadValue, "shared handle has neither a name nor a descriptor");
  }
  return fd;
}

// Checks that `fd` is the object `h` describes and holds at least `need` bytes.
absl::Status CheckObject(int fd, const SharedHandle& h, uint64_t need, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SysError("fstat", what, errno);
  if ((h.inode != 0 || h.dev != 0) && (st.st_dev != h.dev || st.st_ino != h.inode)) {
    return MakeError(absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                     absl::StrCat("shared object ", what, " is no longer the one exported (inode ",
                                  st.st_ino, ", expected ", h.inode, ")"));
  }
  if (static_cast<uint64_t>(st.st_size) < need) {
    return InvalidError(ErrorKind::kOutOfBounds,
                        absl::StrCat("shared object ", what, " has ", st.st_size,
                                     " bytes; its descriptor says ", need));
  }
  return absl::OkStatus();
}

// The futex is the 32-bit half of a counter holding its low bits: it changes on every advance
// (until a 2^32 jump between a waiter's load and its sleep, which generations never make).
uint32_t* FutexWord(uint64_t* counter) {
  return reinterpret_cast<uint32_t*>(counter) + (std::endian::native == std::endian::big ? 1 : 0);
}
}  // namespace

// ---- Errors and OS resource owners ----------------------------------------------------------

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

absl::StatusOr<ShmMapping> MapFd(int fd, uint64_t offset, uint64_t bytes, int prot,
                                 std::string_view what) {
  void* addr = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (addr == MAP_FAILED) return SysError("mmap", what, errno);
  return ShmMapping(addr, bytes);
}

uint64_t PageSize() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

uint64_t PhysicalMemory() { return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * PageSize(); }

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
      what = absl::StrCat("/", options.shm_prefix, "-", ::getpid(), "-", g_shm_serial++, "-",
                          absl::Hex(nonce, absl::kZeroPad16));
      m.fd_ = UniqueFd(::shm_open(what.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (m.fd_.get() >= 0) break;
      if (errno != EEXIST || attempt == 7) return SysError("shm_open", what, errno);
    }
    m.name_ = ShmName(what);
    // shm_open's mode is filtered by the umask; the configured mode is what the operator wants.
    const uint32_t mode = clients_write ? options.shm_mode : options.shm_mode & ~0022u;
    if (::fchmod(m.fd_.get(), mode) != 0) return SysError("fchmod", what, errno);
  } else {
    const std::string name = absl::StrCat(options.shm_prefix, ":", AV(label)).substr(0, 240);
    what = absl::StrCat("memfd:", name);
    m.fd_ = UniqueFd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (m.fd_.get() < 0) return SysError("memfd_create", what, errno);
  }
  if (::ftruncate(m.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return SysError("ftruncate", absl::StrCat(what, ", ", bytes, " bytes"), errno);
  }
  // Reserve the pages now: tmpfs is sparse, and touching a page it cannot back later would be
  // SIGBUS in the copy thread (or in a client) instead of an error here.
  if (const int err = ::posix_fallocate(m.fd_.get(), 0, static_cast<off_t>(bytes));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return SysError("posix_fallocate", absl::StrCat(what, ", ", bytes, " bytes"), err);
  }
  struct stat st {};
  if (::fstat(m.fd_.get(), &st) != 0) return SysError("fstat", what, errno);
  m.dev_ = st.st_dev;
  m.inode_ = st.st_ino;
  ASSIGN_OR_RETURN(m.map_, MapFd(m.fd_.get(), 0, bytes, PROT_READ | PROT_WRITE, what));
  if (options.backing == HostDeviceOptions::Backing::kMemfd) {
    // A memfd has no mode that keeps a client from writing through the descriptor it is passed
    // (or from reopening it read-write through /proc): objects clients only read are sealed
    // against every write mapping made after the daemon's own.
    const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL |
                      (clients_write ? 0 : F_SEAL_FUTURE_WRITE);
    if (::fcntl(m.fd_.get(), F_ADD_SEALS, seals) != 0) {
      return SysError("fcntl(F_ADD_SEALS)", what, errno);
    }
  }
  return m;
}

// ---- Fence words -------------------------------------------------------------------------------

FenceLayout LayoutFor(uint32_t n_slots) {
  const uint64_t page = PageSize();
  const uint64_t part1 = *CheckedAlignUp(64 + uint64_t{8} * n_slots, page);
  const uint64_t part2 = *CheckedAlignUp(128 + uint64_t{8} * n_slots, page);
  return {part1, part1 + part2};
}
FenceWords WordsAt(uint8_t* part1, uint8_t* part2, uint32_t n_slots) {
  FenceWords w;
  w.ready = reinterpret_cast<uint64_t*>(part1 + 64);
  w.ready_waiters = reinterpret_cast<uint32_t*>(part2);
  w.done_waiters = reinterpret_cast<uint32_t*>(part2 + 64);
  w.done = reinterpret_cast<uint64_t*>(part2 + 128);
  w.n_slots = n_slots;
  return w;
}

uint64_t LoadCounter(const FenceWords& w, uint64_t* array, SlotId slot) {
  if (slot >= w.n_slots) return 0;
  return std::atomic_ref<uint64_t>(array[slot]).load(std::memory_order_acquire);
}

// Raises counter[slot] to `generation` (never lowers it) and wakes waiters if any (always when
// `waiters` is null: nobody counts them). The seq_cst
// store and the seq_cst load of the waiter count pair with WaitCounter's seq_cst increment and
// load: either the waiter sees the new value or the advancer sees the waiter.
absl::Status AdvanceCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                            std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  uint64_t current = counter.load(std::memory_order_relaxed);
  do {
    if (generation < current) {
      return absl::FailedPreconditionError(absl::StrCat(AV(what), "[", slot, "] is at ", current,
                                                        "; it cannot go back to ", generation));
    }
    if (generation == current) return absl::OkStatus();
  } while (!counter.compare_exchange_weak(current, generation, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  if (waiters == nullptr || std::atomic_ref<uint32_t>(*waiters).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(FutexWord(&array[slot]));
  }
  return absl::OkStatus();
}

// Spins up to 20 µs (a copy about to finish is cheaper to watch than to sleep on), then
// registers as a waiter and sleeps on the counter's futex until it reaches `generation`.
absl::Status WaitCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                         absl::Duration timeout, std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + std::min(timeout, absl::Microseconds(20));
  while (absl::Now() < spin_until) {
    for (int i = 0; i < 64; ++i) CpuRelax();
    if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  }
  const absl::Time deadline = start + timeout;
  std::atomic_ref<uint32_t> waiting(*waiters);
  waiting.fetch_add(1, std::memory_order_seq_cst);
  absl::Status result;
  for (;;) {
    const uint64_t value = counter.load(std::memory_order_seq_cst);
    if (value >= generation) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      result = absl::DeadlineExceededError(
          absl::StrCat(AV(what), "[", slot, "] is at ", value, " after waiting ",
                       absl::FormatDuration(timeout), " for generation ", generation));
      break;
    }
    FutexWait(FutexWord(&array[slot]), static_cast<uint32_t>(value), left);
  }
  waiting.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

absl::Status CheckSlot(SlotId slot, uint32_t n_slots) {
  if (slot < n_slots) return absl::OkStatus();
  return InvalidError(ErrorKind::kOutOfBounds,
                      absl::StrCat("slot ", slot, " outside a fence table of ", n_slots));
}

}  // namespace host_device_internal

// ---- Client side -------------------------------------------------------------------------------

using host_device_internal::AdvanceCounter;
using host_device_internal::CheckObject;
using host_device_internal::CheckSlot;
using host_device_internal::FenceHeader;
using host_device_internal::FenceLayout;
using host_device_internal::FenceWords;
using host_device_internal::kFenceMagic;
using host_device_internal::kFenceVersion;
using host_device_internal::kMaxFenceSlots;
using host_device_internal::LayoutFor;
using host_device_internal::LoadCounter;
using host_device_internal::MapFd;
using host_device_internal::OpenShared;
using host_device_internal::UniqueFd;
using host_device_internal::WaitCounter;
using host_device_internal::WordsAt;

ShmMapping::ShmMapping(ShmMapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& other) noexcept {
  std::swap(addr_, other.addr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

ShmMapping::~ShmMapping() {
  if (addr_ != nullptr) ::munmap(addr_, bytes_);
}

absl::StatusOr<MappedArena> MapArena(const ArenaExport& descriptor) {
  if (descriptor.reserved_bytes == 0 || descriptor.reserved_bytes % kArenaAlignment != 0 ||
      descriptor.bytes == 0 || descriptor.bytes > descriptor.reserved_bytes) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("arena descriptor '", descriptor.label,
                                                           "' with ", descriptor.bytes, " of ",
                                                           descriptor.reserved_bytes, " bytes"));
  }
  std::string what;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenShared(descriptor.handle, /*writable=*/false, &what));
  RETURN_IF_ERROR(CheckObject(fd.get(), descriptor.handle, descriptor.reserved_bytes, what));
  ASSIGN_OR_RETURN(ShmMapping map, MapFd(fd.get(), 0, descriptor.reserved_bytes, PROT_READ, what));
  return MappedArena(std::move(map), descriptor.bytes);
}

absl::StatusOr<MappedFences> MapFences(const FenceExport& descriptor) {
  if (descriptor.n_slots == 0 || descriptor.n_slots > kMaxFenceSlots) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor with ", descriptor.n_slots, " slots"));
  }
  const FenceLayout layout = LayoutFor(descriptor.n_slots);
  if (descriptor.done_offset != layout.done_offset ||
      descriptor.segment_bytes != layout.segment_bytes) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor layout ", descriptor.done_offset, "/",
                                     descriptor.segment_bytes, " differs from ", layout.done_offset,
                                     "/", layout.segment_bytes));
  }
  std::string what;
  ShmMapping part1;
  ShmMapping part2;
  const uint64_t part2_bytes = layout.segment_bytes - layout.done_offset;
  if (descriptor.session_done.has_value()) {
    // The table read-only; the session's own done words read-write.
    ASSIGN_OR_RETURN(UniqueFd table, OpenShared(descriptor.handle, /*writable=*/false, &what));
    RETURN_IF_ERROR(CheckObject(table.get(), descriptor.handle, layout.segment_bytes, what));
    ASSIGN_OR_RETURN(part1, MapFd(table.get(), 0, layout.done_offset, PROT_READ, what));
    std::string own;
    ASSIGN_OR_RETURN(UniqueFd done,
                     OpenShared(*descriptor.session_done, /*writable=*/true, &own));
    RETURN_IF_ERROR(CheckObject(done.get(), *descriptor.session_done, part2_bytes, own));
    ASSIGN_OR_RETURN(part2, MapFd(done.get(), 0, part2_bytes, PROT_READ | PROT_WRITE, own));
  } else {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenShared(descriptor.handle, /*writable=*/true, &what));
    RETURN_IF_ERROR(CheckObject(fd.get(), descriptor.handle, layout.segment_bytes, what));
    ASSIGN_OR_RETURN(part1, MapFd(fd.get(), 0, layout.done_offset, PROT_READ, what));
    ASSIGN_OR_RETURN(part2, MapFd(fd.get(), layout.done_offset, part2_bytes,
                                  PROT_READ | PROT_WRITE, what));
  }
  FenceHeader header;
  std::memcpy(&header, part1.data(), sizeof(header));
  if (header.magic != kFenceMagic || header.version != kFenceVersion ||
      header.n_slots != descriptor.n_slots || header.done_offset != layout.done_offset) {
    return InvalidError(ErrorKind::kBadMagic,
                        absl::StrCat("shared object ", what, " is not a fence table of ",
                                     descriptor.n_slots, " slots"));
  }
  const FenceWords words = WordsAt(part1.data(), part2.data(), descriptor.n_slots);
  return MappedFences(std::move(part1), std::move(part2), words);
}

uint64_t MappedFences::ready(SlotId slot) const { return LoadCounter(words_, words_.ready, slot); }
uint64_t MappedFences::done(SlotId slot) const { return LoadCounter(words_, words_.done, slot); }

absl::Status MappedFences::WaitReady(SlotId slot, uint64_t generation,
                                     absl::Duration timeout) const {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  return WaitCounter(words_.ready, words_.ready_waiters, slot, generation, timeout, "ready");
}

absl::Status MappedFences::SignalDone(SlotId slot, uint64_t generation) {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  if (const uint64_t ready_now = ready(slot); generation > ready_now) {
    return absl::FailedPreconditionError(
        absl::StrCat("done[", slot, "] = ", generation, " but ready is only at ", ready_now));
  }
  return AdvanceCounter(words_.done, words_.done_waiters, slot, generation, "done");
}

namespace {
class SegmentImpl final : public SharedSegment {
 public:
  explicit SegmentImpl(host_device_internal::SharedMemory memory) : memory_(std::move(memory)) {}
  uint8_t* data() const override { return memory_.data(); }
  uint64_t bytes() const override { return memory_.bytes(); }
  SharedHandle handle() const override { return memory_.Handle(); }
  void Unlink() override { memory_.Unlink(); }

 private:
  host_device_internal::SharedMemory memory_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<SharedSegment>> CreateSharedSegment(
    const HostDeviceOptions& options, std::string_view label, uint64_t bytes) {
  ASSIGN_OR_RETURN(host_device_internal::SharedMemory memory,
                   host_device_internal::SharedMemory::Create(options, label, bytes));
  return std::unique_ptr<SharedSegment>(new SegmentImpl(std::move(memory)));
}

absl::StatusOr<ShmMapping> MapSharedSegment(const SharedHandle& handle, uint64_t bytes) {
  std::string what;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenShared(handle, /*writable=*/true, &what));
  RETURN_IF_ERROR(CheckObject(fd.get(), handle, bytes, what));
  return MapFd(fd.get(), 0, bytes, PROT_READ | PROT_WRITE, what);
}

}  // namespace expertd
