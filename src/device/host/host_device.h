// The host device: arenas and fence tables in shared memory that other processes map, staging in
// ordinary page-aligned memory, copies done by a pool of copy threads with a demand queue that
// goes ahead of the prefetch queue. It lets the whole system run without a GPU and serves
// CPU-only engines. Also the client side: MapArena / MapFences, which a different process (the
// engine's client library) uses with the descriptors the daemon exported. See docs/device.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"

namespace expertd {

struct HostDeviceOptions {
  // How arenas and fence tables are created. kShmOpen: a named object, unlinked when it is
  // destroyed (a client maps it by name): on POSIX a shm object
  // "/<shm_prefix>-<pid>-<n>-<random hex>", arenas without write access for anyone but the
  // owner; on Windows a file mapping "Local\<shm_prefix>-<pid>-<n>-<random hex>".
  // kMemfd: an anonymous object. On POSIX a memfd, sealed against resizing, and against
  // clients' write mappings where clients only read (a client maps an fd received over the
  // daemon's handle socket, or /proc/<pid>/fd/<fd>); on Windows a file mapping without a name,
  // which a client duplicates out of the daemon's process (or is handed a duplicate of).
  // Either way the memory lives until the last mapping goes. A session's own done words
  // (CreateSessionFences) are always anonymous, whatever this says.
  //
  // Access on Windows, where there is no mode: each object's DACL gives the daemon's user the
  // owner bits of shm_mode and `client_sid` (when set) the group bits, without write access to
  // arenas and fence tables (as the group's write bit is dropped on POSIX); an anonymous
  // arena or table is exported through a handle with read access only (as a sealed memfd).
  enum class Backing { kShmOpen, kMemfd };
  Backing backing = Backing::kShmOpen;
  std::string shm_prefix = "expertd";  // [A-Za-z0-9._-]{1,64}
  uint32_t shm_mode = 0600;            // clients run as the daemon's user unless widened
  std::string client_sid = {};         // Windows: "S-1-..." or an SDDL alias; empty: none
  uint32_t copy_threads = 2;           // 1..64
  uint64_t max_arena_bytes = 0;        // 0: the machine's physical memory
  uint64_t max_staging_bytes = 0;      // 0: the machine's physical memory
  // How often copy threads look at done fences while every queued copy waits on one: a client in
  // another process stores done without a way to wake the daemon's threads (docs/device.md).
  absl::Duration fence_poll_interval = absl::Microseconds(100);
};

// InvalidArgument for bad options. The device starts its copy threads at once.
absl::StatusOr<std::unique_ptr<Device>> MakeHostDevice(HostDeviceOptions options = {});

// ---- Client side: what another process maps ------------------------------------------------

// A move-only owner of one mapped range (mmap; MapViewOfFile on Windows).
class ShmMapping {
 public:
  ShmMapping() = default;
  ShmMapping(void* addr, uint64_t bytes) : addr_(addr), bytes_(bytes) {}
  ShmMapping(ShmMapping&& other) noexcept;
  ShmMapping& operator=(ShmMapping&& other) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void* addr_ = nullptr;
  uint64_t bytes_ = 0;
};

// An exported arena mapped read-only: slots at data()[slot * stride ...], zero tail padding up
// to reserved_bytes(). Valid even after the daemon destroyed its arena (the pages live until
// this mapping goes). Thread-safe (immutable).
class MappedArena {
 public:
  std::span<const uint8_t> data() const { return {map_.data(), bytes_}; }
  uint64_t bytes() const { return bytes_; }
  uint64_t reserved_bytes() const { return map_.bytes(); }

 private:
  friend absl::StatusOr<MappedArena> MapArena(const ArenaExport& descriptor);
  MappedArena(ShmMapping map, uint64_t bytes) : map_(std::move(map)), bytes_(bytes) {}
  ShmMapping map_;
  uint64_t bytes_ = 0;
};

// Maps an arena the daemon exported: by a descriptor or handle received from the daemon, else
// by its name, else through the exporter's descriptor (/proc/<owner_pid>/fd/<fd>; Windows: its
// handle, duplicated out of the owner process). Errors carry the call, the name and the
// system's text; a descriptor that does not match the object (size, kind) is InvalidArgument,
// an object whose name was removed NotFound.
absl::StatusOr<MappedArena> MapArena(const ArenaExport& descriptor);

// A read-write shared-memory object the daemon creates for one client process (a session's
// request lane): the backing, naming and mode of HostDeviceOptions, like arenas. Zero-filled.
// The shm name (kShmOpen) goes with Unlink() or the owner; mappings stay valid either way.
class SharedSegment {
 public:
  virtual ~SharedSegment() = default;
  virtual uint8_t* data() const = 0;
  virtual uint64_t bytes() const = 0;
  virtual SharedHandle handle() const = 0;
  // Removes the name now (a client that mapped the object keeps it); no-op for a memfd.
  virtual void Unlink() = 0;
};
absl::StatusOr<std::unique_ptr<SharedSegment>> CreateSharedSegment(
    const HostDeviceOptions& options, std::string_view label, uint64_t bytes);
// Maps `bytes` of a segment another process exported, read-write (same lookup as MapArena).
absl::StatusOr<ShmMapping> MapSharedSegment(const SharedHandle& handle, uint64_t bytes);

namespace host_device_internal {
// The shared fence words; both ends use the same algorithms on them (host_device.cpp).
struct FenceWords {
  uint64_t* ready = nullptr;          // [n_slots], written by the daemon
  uint64_t* done = nullptr;           // [n_slots], written by the client
  uint32_t* ready_waiters = nullptr;  // clients blocked in WaitReady (so advances know to wake)
  uint32_t* done_waiters = nullptr;   // daemon threads blocked in WaitDone
  uint32_t n_slots = 0;
};
}  // namespace host_device_internal

// A client's view of one session's fence table: ready counters read-only, done counters
// read-write. Thread-safe (lock-free atomics in shared memory).
class MappedFences {
 public:
  uint32_t size() const { return words_.n_slots; }
  // 0 for a slot outside the table.
  uint64_t ready(SlotId slot) const;
  uint64_t done(SlotId slot) const;

  // Blocks until ready[slot] >= generation: spins ~20 µs, then sleeps on a futex the daemon
  // wakes when it advances a counter someone waits on. OK, DeadlineExceeded after `timeout`, or
  // InvalidArgument for a slot outside the table.
  absl::Status WaitReady(SlotId slot, uint64_t generation, absl::Duration timeout) const;
  // Stores done[slot] = generation after the client's kernels read the slot. FailedPrecondition
  // when generation is below the current done (counters only grow) or above ready[slot] (the
  // client cannot have read what was not copied yet); equal is a no-op.
  absl::Status SignalDone(SlotId slot, uint64_t generation);

 private:
  friend absl::StatusOr<MappedFences> MapFences(const FenceExport& descriptor);
  MappedFences(ShmMapping ready_part, ShmMapping done_part, host_device_internal::FenceWords w)
      : ready_part_(std::move(ready_part)), done_part_(std::move(done_part)), words_(w) {}
  ShmMapping ready_part_;
  ShmMapping done_part_;
  host_device_internal::FenceWords words_;
};

// Maps a fence table the daemon exported (same lookup as MapArena), checking its header.
absl::StatusOr<MappedFences> MapFences(const FenceExport& descriptor);

}  // namespace expertd
