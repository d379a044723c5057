// Shared memory and the fence words of the host device, used by both ends: the daemon's
// device objects (host_device.cpp) and the client-side mapping (host_shared_memory.cpp, which
// also defines everything declared here). Internal to the host device.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/host/host_device.h"

namespace expertd::host_device_internal {

// ---- Errors and OS resource owners ----------------------------------------------------------

// A failed system call on `object`: the status code follows errno (NotFound, PermissionDenied,
// ResourceExhausted, else Unavailable), kind kIo, message "call(object): strerror".
absl::Status SysError(std::string_view call, std::string_view object, int err);

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Unlinks a shm_open name when destroyed (clients that mapped it keep their pages).
class ShmName {
 public:
  explicit ShmName(std::string name = {}) : name_(std::move(name)) {}
  ShmName(ShmName&& o) noexcept : name_(std::exchange(o.name_, {})) {}
  ShmName& operator=(ShmName&& o) noexcept {
    std::swap(name_, o.name_);
    return *this;
  }
  ~ShmName() {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
  }
  const std::string& get() const { return name_; }

 private:
  std::string name_;
};

absl::StatusOr<ShmMapping> MapFd(int fd, uint64_t offset, uint64_t bytes, int prot,
                                 std::string_view what);
uint64_t PageSize();
uint64_t PhysicalMemory();

// A shared-memory object created by the daemon, mapped read-write, zero-filled.
class SharedMemory {
 public:
  // A new object of exactly `bytes` bytes, a named shm object or a memfd per `options.backing`
  // (`label` names a memfd). A named object has mode `options.shm_mode`, without the group's
  // and others' write bits unless `clients_write` (arenas: clients only read them); a memfd is
  // sealed against resizing and, unless `clients_write`, against write mappings other than the
  // daemon's own (F_SEAL_FUTURE_WRITE). Its name
  // ends in 64 random bits, so that nobody can create it first (a name taken anyway is
  // skipped). Errors carry the call, the name and strerror.
  static absl::StatusOr<SharedMemory> Create(const HostDeviceOptions& options,
                                             std::string_view label, uint64_t bytes,
                                             bool clients_write = true);

  uint8_t* data() const { return map_.data(); }
  uint64_t bytes() const { return map_.bytes(); }
  void Unlink() { name_ = ShmName(); }
  SharedHandle Handle() const {
    SharedHandle h;
    h.kind = SharedHandle::Kind::kHostShm;
    h.shm_name = name_.get();
    h.fd = fd_.get();
    h.owner_pid = ::getpid();
    h.dev = dev_;
    h.inode = inode_;
    return h;
  }

 private:
  SharedMemory() = default;
  // Destroyed in reverse: unmap, close, unlink.
  ShmName name_;
  UniqueFd fd_;
  ShmMapping map_;
  uint64_t dev_ = 0;
  uint64_t inode_ = 0;
};

// ---- Fence words: layout, advancing, waiting -------------------------------------------------

// Segment layout. Part 1 [0, done_offset): header, ready[n] at 64 — written only by the daemon,
// mapped read-only by clients. Part 2 [done_offset, segment_bytes): ready_waiters at +0,
// done_waiters at +64 (own cache lines), done[n] at +128 — written by both.
inline constexpr uint64_t kFenceMagic =
    0x31666e6564707865;  // "expdnf1" little-endian, a format tag
inline constexpr uint32_t kFenceVersion = 1;
inline constexpr uint32_t kMaxFenceSlots = 1u << 24;
struct FenceHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n_slots;
  uint64_t done_offset;
  uint64_t segment_bytes;
};
struct FenceLayout {
  uint64_t done_offset;
  uint64_t segment_bytes;
};
FenceLayout LayoutFor(uint32_t n_slots);
FenceWords WordsAt(uint8_t* part1, uint8_t* part2, uint32_t n_slots);

// counter[slot], or 0 for a slot outside the table.
uint64_t LoadCounter(const FenceWords& w, uint64_t* array, SlotId slot);
// Raises counter[slot] to `generation` (never lowers it: FailedPrecondition) and wakes waiters
// (when `waiters` is null, always).
absl::Status AdvanceCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                            std::string_view what);
// Waits until counter[slot] >= generation: OK, or DeadlineExceeded after `timeout`.
absl::Status WaitCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                         absl::Duration timeout, std::string_view what);
// InvalidArgument for a slot outside a table of n_slots.
absl::Status CheckSlot(SlotId slot, uint32_t n_slots);

}  // namespace expertd::host_device_internal
