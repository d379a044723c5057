// Shared memory and the fence words of the host device, used by both ends: the daemon's
// device objects (host_device.cpp) and the client-side mapping. The fence word algorithms and
// the client side are in host_shared_memory.cpp; the shared-memory objects, the only part that
// differs by platform, in host_shared_memory_posix.cpp (shm_open, memfd, mmap) and
// host_shared_memory_win32.cpp (file mappings with their security descriptors); src/device's
// CMakeLists.txt picks one. Internal to the host device.
#pragma once

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

// A failed system call on `object`: the status code follows the error (NotFound,
// PermissionDenied, ResourceExhausted, else Unavailable), kind kIo, message
// "call(object): text". `err` is an errno value (POSIX) or a Win32 error code (Windows).
absl::Status SysError(std::string_view call, std::string_view object, int err);

// A descriptor (POSIX) or a HANDLE (Win32), closed when destroyed; -1 is none.
class NativeHandle {
 public:
  static constexpr intptr_t kNone = -1;
  explicit NativeHandle(intptr_t value = kNone) : value_(value) {}
  NativeHandle(NativeHandle&& o) noexcept : value_(std::exchange(o.value_, kNone)) {}
  NativeHandle& operator=(NativeHandle&& o) noexcept {
    std::swap(value_, o.value_);
    return *this;
  }
  NativeHandle(const NativeHandle&) = delete;
  NativeHandle& operator=(const NativeHandle&) = delete;
  ~NativeHandle() {
    if (value_ != kNone) Close(value_);
  }
  intptr_t get() const { return value_; }
  bool valid() const { return value_ != kNone; }

 private:
  static void Close(intptr_t value);
  intptr_t value_;
};

// The unit of mapping offsets and of the fence layout: the page size (POSIX) or the allocation
// granularity, 64 KiB (Windows, where a view must start at a multiple of it).
uint64_t PageSize();
uint64_t PhysicalMemory();
// `bytes` of private read-write zeroed memory of this process (staging), page-aligned.
absl::StatusOr<ShmMapping> MapPrivate(uint64_t bytes);

// InvalidArgument (kOutOfBounds) when an object of `have` bytes is smaller than the `need` its
// descriptor says; both platforms' OpenShared use it.
absl::Status CheckObjectSize(const std::string& what, uint64_t have, uint64_t need);

// A shared-memory object a client opened from a SharedHandle, holding at least the bytes it
// asked for.
class OpenedShared {
 public:
  // Maps [offset, offset + bytes), offset a multiple of PageSize(); read-only unless writable
  // (which the object must have been opened for).
  absl::StatusOr<ShmMapping> Map(uint64_t offset, uint64_t bytes, bool writable) const;
  const std::string& what() const { return what_; }

 private:
  friend absl::StatusOr<OpenedShared> OpenShared(const SharedHandle& h, bool writable,
                                                 uint64_t need);
  OpenedShared() = default;
  NativeHandle handle_;
  std::string what_;  // the name, or how it was reached, for errors
};
// Opens what `h` names, for a client: a descriptor or handle this process received, else the
// name, else the exporter's own descriptor or handle (Linux: /proc/<pid>/fd/<fd>, same user or
// ptrace-read access; Windows: duplicated from the owner process, which needs
// PROCESS_DUP_HANDLE on it). Checks that it is the object `h` describes (identity where the
// handle carries one) and holds at least `need` bytes. The access asked for is the object's
// own check: an arena opened writable is refused.
absl::StatusOr<OpenedShared> OpenShared(const SharedHandle& h, bool writable, uint64_t need);

// A shared-memory object created by the daemon, mapped read-write, zero-filled.
class SharedMemory {
 public:
  // A new object of exactly `bytes` bytes, named or anonymous per `options.backing` (`label`
  // names a memfd). Access: see HostDeviceOptions (POSIX: the mode, memfd seals; Windows: the
  // security descriptor). Unless `clients_write`, nobody but the daemon's own mapping can write
  // it (arenas). A name ends in 64 random bits, so that nobody can create it first (a name taken
  // anyway is skipped). Errors carry the call, the name and the system's text.
  static absl::StatusOr<SharedMemory> Create(const HostDeviceOptions& options,
                                             std::string_view label, uint64_t bytes,
                                             bool clients_write = true);
  SharedMemory(SharedMemory&& o) noexcept;
  SharedMemory& operator=(SharedMemory&& o) noexcept;
  ~SharedMemory();

  uint8_t* data() const { return map_.data(); }
  uint64_t bytes() const { return map_.bytes(); }
  // Nobody can open the object by its name any more (POSIX: shm_unlink; Windows: its security
  // descriptor is emptied, the name goes with the last handle); mappings stay valid.
  void Unlink();
  SharedHandle Handle() const;

 private:
  SharedMemory() = default;
  // Destroyed in reverse: unmap, close (the destructor unlinks first).
  std::string name_;       // empty once unlinked, or for an anonymous object
  NativeHandle handle_;    // the daemon's own, full access
  NativeHandle exported_;  // Windows: what clients duplicate (no more access than they get)
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
