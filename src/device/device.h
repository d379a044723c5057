// The device interface: where slots live and how expert bytes get there. A Device allocates
// arenas (device memory holding n_slots experts of one projection back to back), staging buffers
// (host memory the readers fill), fence tables (per-slot ready/done generations shared with a
// client process) and runs asynchronous staging → arena copies with two priorities.
//
// Backends: the host device (shared memory, copy threads; device/host/host_device.h) and the
// CUDA device (device/cuda_factory.h: cudaMalloc arenas with IPC handles, cudaHostAlloc staging,
// copy streams with priorities, IPC events, per-session done events). The engine talks to
// Device only; it never sees #ifdef. What a backend can do is stated by caps(); optional
// operations default to Unimplemented in exactly one place
// (device.cpp). See docs/device.md.
//
// Lifetimes: arenas, staging buffers and fence tables are owned by the caller (unique_ptr) and
// must be destroyed before the Device that made them (the CUDA backend needs its context to free
// them). Anything a pending copy references must stay alive until its completion callback ran.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/bundle.h"

namespace expertd {

// Arena sizes are rounded up to this (the CUDA allocation granularity); the tail after the
// requested bytes stays zero so kernels may read past the last slot.
inline constexpr uint64_t kArenaAlignment = uint64_t{2} << 20;
// The tail is at least this long: ggml's CUDA kernels read up to one padded row past the last
// row of a quantized tensor (512 values, under 2.2 KiB for any ggml type).
inline constexpr uint64_t kArenaMinTail = uint64_t{64} << 10;

// Rounds a requested arena size plus kArenaMinTail up to kArenaAlignment: InvalidArgument for
// 0, ResourceExhausted when the rounded size would exceed `max_bytes` (or overflow). Shared by
// every backend.
absl::StatusOr<uint64_t> ArenaReservedBytes(uint64_t requested, uint64_t max_bytes);

// What a backend can do. Every field defaults to "not supported" / 0; a backend sets what it has.
struct Capabilities {
  bool arenas_host_visible = false;         // Arena::host_data() points at the bytes (host: yes)
  bool arenas_host_writable = false;        // Arena::host_write_data() too: fill slots in place
  bool exports_to_other_processes = false;  // Arena/FenceTable::Export() work
  bool async_copies = false;                // SubmitCopy returns before the bytes moved
  bool copy_priorities = false;             // demand copies overtake queued prefetch copies
  bool fences_host_visible = false;         // FenceTable::ready()/done() read the real counters
  bool staging_pinned = false;              // staging is page-locked (DMA-able)
  bool registers_host_memory = false;       // RegisterHostMemory() is supported
  // RegisterHostMemory() also takes memory the process may only read (a PROT_READ pack
  // mapping). Without it only writable memory can be registered (CUDA without
  // cudaDevAttrHostRegisterReadOnlySupported, as on x86 hosts with discrete GPUs).
  bool registers_read_only_memory = false;
  // CreateSessionFences() is supported: each client session gets its own done fences (CUDA
  // events: two processes must never record one event). Without it, sessions share the slot
  // class's table and store done themselves (host counters).
  bool session_fences = false;
  uint32_t copy_engines = 0;                // copies that can run at once (threads / streams)
  uint64_t max_arena_bytes = 0;             // largest AllocateArena() request accepted
  uint64_t max_staging_bytes = 0;           // largest AllocateStaging() request accepted
  // Fence objects (one per slot: CreateFences takes 2 per slot, CreateSessionFences 1) this
  // process may hold at once; 0 = no such bound (host). CUDA: IPC events, which the driver
  // bounds per process (device/cuda_factory.h, CudaDeviceOptions::max_ipc_events).
  uint32_t max_fence_objects = 0;
};

// How another process reaches an exported object. The host device fills `shm_*`; the CUDA
// device fills `ipc_handle` (the bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t).
// Plain data so the gRPC layer can serialize it without knowing the backend.
struct SharedHandle {
  enum class Kind { kHostShm, kCudaIpc };
  Kind kind = Kind::kHostShm;
  // shm_open name ("/expertd-<pid>-<n>-<random>"; Windows: "Local\expertd-..."), or empty
  // for an anonymous object (memfd; Windows: a mapping without a name).
  std::string shm_name;
  // The exporter's descriptor (Windows: a HANDLE value, with only the clients' access);
  // borrowed, valid while the object lives.
  int fd = -1;
  // The process holding `fd` (reachable as /proc/<pid>/fd/<fd>; Windows: duplicated out of it).
  int64_t owner_pid = 0;
  // The object's identity (fstat st_dev, st_ino): a client checks it, so a reused name or
  // descriptor number never maps someone else's memory. 0 on Windows, whose names end in 64
  // random bits.
  uint64_t dev = 0;
  uint64_t inode = 0;
  std::string ipc_handle;  // CUDA only
  // Client side: a descriptor (Windows: a handle) of this process for the object, received from
  // the daemon; opened instead of the name or the owner's descriptor when set.
  int passed_fd = -1;
};

// An arena as another process sees it: map `reserved_bytes` read-only; slots are in
// [0, bytes), the rest is zero padding.
struct ArenaExport {
  SharedHandle handle;
  uint64_t bytes = 0;           // requested (usable) size
  uint64_t reserved_bytes = 0;  // mapped size, a multiple of kArenaAlignment
  std::string label;
};

// A fence table as a client sees it. Host: one shared-memory segment; [0, done_offset) holds
// the header and the ready counters, [done_offset, segment_bytes) the waiter counts and the done
// counters. A session's export (SessionFences::Export) also names `session_done`, the session's
// own object laid out like that second part: the client maps the table's first part read-only
// and its own object read-write, and never writes the table. Without `session_done` (the
// daemon's own tests) both parts of the table are mapped, the second read-write.
struct FenceExport {
  SharedHandle handle;
  uint32_t n_slots = 0;
  uint64_t segment_bytes = 0;
  uint64_t done_offset = 0;
  std::optional<SharedHandle> session_done;
};

// Device memory of one slot class and one projection. Never resized; freed only when destroyed,
// so an export stays valid for the arena's lifetime. Thread-safe: all members are const.
class Arena {
 public:
  virtual ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  const std::string& label() const { return label_; }
  // Usable bytes (what was asked for). Copies must stay inside [0, bytes()).
  uint64_t bytes() const { return bytes_; }
  // Allocated bytes: bytes() rounded up to kArenaAlignment; [bytes(), reserved_bytes()) is zero.
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  // The bytes when caps().arenas_host_visible, else nullptr.
  virtual const uint8_t* host_data() const { return nullptr; }
  // The same bytes for writing when caps().arenas_host_writable, else nullptr: a reader may fill
  // a slot in place, without a staging copy. Whoever does must keep the fence protocol itself:
  // write a slot only after done(slot) reached the previous occupant's last granted generation,
  // and advance ready(slot) after the last byte landed.
  virtual uint8_t* host_write_data() const { return nullptr; }

  // A descriptor another process maps (host: MapArena in host_device.h). Optional.
  virtual absl::StatusOr<ArenaExport> Export() const;

 protected:
  Arena(std::string label, uint64_t bytes, uint64_t reserved_bytes)
      : label_(std::move(label)), bytes_(bytes), reserved_bytes_(reserved_bytes) {}

 private:
  std::string label_;
  uint64_t bytes_;
  uint64_t reserved_bytes_;
};

// Host memory readers write into and copies read from (pinned for CUDA). Page-aligned, so
// O_DIRECT reads may target it. Threads may use disjoint ranges concurrently.
class StagingBuffer {
 public:
  virtual ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  std::span<uint8_t> data() const { return data_; }
  uint64_t bytes() const { return data_.size(); }
  // True when `range` (inside data()) may be the source of one copy segment. Memory registered
  // in chunks (RegisterHostMemory) answers whether it lies inside one chunk: a copy spanning
  // two registrations may be treated as pageable by the driver. Default: always.
  virtual bool OneRegion(std::span<const uint8_t> range) const {
    (void)range;
    return true;
  }

 protected:
  explicit StagingBuffer(std::span<uint8_t> data) : data_(data) {}

 private:
  std::span<uint8_t> data_;
};

// Per-slot generations shared between the daemon and one client (one table per session):
//   ready[slot] = g  the daemon finished copying generation g of the slot's occupant (or granted
//                    an already-resident occupant under generation g);
//   done[slot] = g   the client's kernels finished reading generation g.
// Both only grow; 0 means "never". A copy that overwrites a slot waits until done[slot] reached
// the generation of the previous occupant's last grant (CopyRequest::waits).
// Thread-safe: counters are lock-free atomics.
class FenceTable {
 public:
  virtual ~FenceTable();
  FenceTable(const FenceTable&) = delete;
  FenceTable& operator=(const FenceTable&) = delete;

  uint32_t size() const { return n_slots_; }
  // Current counters (meaningful when caps().fences_host_visible). `slot` < size().
  virtual uint64_t ready(SlotId slot) const = 0;
  virtual uint64_t done(SlotId slot) const = 0;
  // Sets ready[slot] to `generation` and wakes waiting clients. A generation below the current
  // one is FailedPrecondition (and changes nothing); an equal one is a no-op.
  virtual absl::Status AdvanceReady(SlotId slot, uint64_t generation) = 0;
  // Blocks until done[slot] >= generation: OK, or DeadlineExceeded after `timeout`.
  virtual absl::Status WaitDone(SlotId slot, uint64_t generation, absl::Duration timeout) const = 0;

  // A descriptor a client maps (host: MapFences in host_device.h). Optional.
  virtual absl::StatusOr<FenceExport> Export() const;

 protected:
  explicit FenceTable(uint32_t n_slots) : n_slots_(n_slots) {}

 private:
  uint32_t n_slots_;
};

// One client session's own done fences over a slot class's shared FenceTable (devices with
// caps().session_fences). Ready stays shared (only the daemon records it); done is per session,
// so two clients never signal through one object. The daemon declares on the session's behalf:
// a copy that overwrites a slot waits for every session that declared a read of it.
// Destroy it before the shared table; declarations already made stay valid (the device keeps
// what a pending wait needs). Thread-safe.
class SessionFences {
 public:
  virtual ~SessionFences();
  SessionFences(const SessionFences&) = delete;
  SessionFences& operator=(const SessionFences&) = delete;

  // What this session's client opens: the shared table's ready part and this session's done
  // part, in the FenceExport layout of the device.
  virtual absl::StatusOr<FenceExport> Export() const = 0;
  // On Release: the client signalled done[slot] after reading `generation`. Stale declarations
  // are ignored; FailedPrecondition above the slot's ready generation; InvalidArgument for
  // generation 0 or a slot outside the table.
  virtual absl::Status DeclareDone(SlotId slot, uint64_t generation) = 0;
  // The daemon gives up on the client's reads of `slot` up to `generation` (its lease was
  // reclaimed, or its process exited): a copy does not wait for this session there.
  virtual absl::Status ForceDone(SlotId slot, uint64_t generation) = 0;
  // The client process exited: nothing it signalled needs waiting for, on any slot.
  virtual void ClientGone() = 0;
  // True when copies may wait on what the client recorded after its leases are gone (CUDA: done
  // events on the client's stream); the daemon then watches the client process and calls
  // ClientGone() when it exits. False where done is settled at Release (host).
  virtual bool WaitsForClient() const { return true; }
  // OK, or why the device gave up on this session's done records (CUDA: one failed with an
  // error of the client's context, or stayed pending past the device's deadline): copies no
  // longer wait for them, so the session's slots may be overwritten — the daemon ends it.
  virtual absl::Status Failure() const { return absl::OkStatus(); }
  // True when the daemon can see that the client finished reading `slot` at `generation` (host:
  // the client's own done word); false where it cannot tell (CUDA: done is a GPU event).
  virtual bool Signalled(SlotId slot, uint64_t generation) const {
    (void)slot;
    (void)generation;
    return false;
  }

 protected:
  SessionFences() = default;
};

enum class CopyPriority { kDemand, kPrefetch };  // demand = an acquire waits for it

// One contiguous piece of a copy: `source` (inside a StagingBuffer of the same device) to
// arena bytes [arena_offset, arena_offset + source.size()).
struct CopySegment {
  std::span<const uint8_t> source;
  Arena* arena = nullptr;
  uint64_t arena_offset = 0;
};

// The copy must not start before fences->done(slot) >= generation: the client finished reading
// the slot's previous occupant.
struct FenceWait {
  const FenceTable* fences = nullptr;
  SlotId slot = 0;
  uint64_t generation = 0;
};

// After all segments landed, ready[slot] is advanced to `generation` (before the callback runs;
// on CUDA it is recorded on the copy stream, so a client can wait without the daemon's CPU).
struct FenceSignal {
  FenceTable* fences = nullptr;
  SlotId slot = 0;
  uint64_t generation = 0;
};

// One bundle's copy: all projections of one expert into their arenas, started once every wait
// is satisfied, then every signal is advanced. Copies of equal priority start in submission
// order unless an earlier one is still waiting on a fence.
struct CopyRequest {
  std::vector<CopySegment> segments;
  CopyPriority priority = CopyPriority::kPrefetch;
  std::vector<FenceWait> waits;
  std::vector<FenceSignal> signals;
};

// Called exactly once per accepted copy, on a copy thread (or on the thread running Shutdown()
// for cancelled copies): OK, Cancelled (shut down before it started), or the error that stopped
// it (a signal that would lower a ready counter is FailedPrecondition; the bytes were copied).
// It must not block for long and must not call Shutdown() or Drain(); it may call SubmitCopy().
using CopyCallback = absl::AnyInvocable<void(absl::Status)>;

class Device {
 public:
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual std::string_view name() const = 0;  // "host", "cuda:0"
  virtual const Capabilities& caps() const = 0;
  // The hardware's identity, the same in every process: a CUDA GPU's UUID ("GPU-…"), which a
  // client resolves to its own ordinal (its CUDA_VISIBLE_DEVICES may differ from the daemon's).
  // Empty for the host device.
  virtual std::string hardware_id() const { return {}; }
  // One line for the start-up log: choices the backend made that the operator should see (which
  // host registration mode, a capped copy stream count). Empty when there is nothing to say.
  virtual std::string notes() const { return {}; }
  // How many of caps().max_fence_objects this device's fence tables and session fences hold now
  // (0 where there is no bound).
  virtual uint32_t fence_objects_in_use() const { return 0; }

  // `bytes` > 0 usable bytes, rounded up (ArenaReservedBytes); the memory starts zeroed.
  // InvalidArgument for 0, ResourceExhausted above caps().max_arena_bytes or when the system has
  // no memory for it. `label` names it in errors and exports ("L3.ffn_up_exps class 0").
  virtual absl::StatusOr<std::unique_ptr<Arena>> AllocateArena(uint64_t bytes,
                                                               std::string_view label) = 0;
  // Page-aligned host memory (contents unspecified); same errors as AllocateArena against
  // max_staging_bytes.
  virtual absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(uint64_t bytes) = 0;
  // A table of n_slots ready and n_slots done counters, all 0. InvalidArgument for 0 slots.
  virtual absl::StatusOr<std::unique_ptr<FenceTable>> CreateFences(uint32_t n_slots) = 0;

  // Queues a copy. InvalidArgument when a segment, wait or signal is malformed (no segments,
  // an empty source, a range outside its arena, a slot outside its table, an object of another
  // device); FailedPrecondition after Shutdown(). On error `on_complete` is never called; on OK
  // it is called exactly once. Thread-safe.
  virtual absl::Status SubmitCopy(CopyRequest request, CopyCallback on_complete) = 0;
  // Waits until every accepted copy completed: OK, or DeadlineExceeded (copies keep running).
  virtual absl::Status Drain(absl::Duration timeout) = 0;
  // Cancels queued copies (their callbacks get Cancelled), lets running ones finish, stops the
  // copy engines. Idempotent; the destructor calls it. Not from a copy callback.
  virtual void Shutdown() = 0;

  // Optional operations: the defaults (device.cpp) say Unimplemented / use the host pointer.

  // Registers existing host memory (e.g. a mapped pack range) as staging: cudaHostRegister, the
  // origin's "direct DAX" path. Needs caps().registers_host_memory.
  virtual absl::StatusOr<std::unique_ptr<StagingBuffer>> RegisterHostMemory(
      std::span<uint8_t> memory);
  // A session's own done fences over `shared` (a table this device made). Needs
  // caps().session_fences.
  virtual absl::StatusOr<std::unique_ptr<SessionFences>> CreateSessionFences(FenceTable& shared);
  // Reads arena bytes back (tests, `expertctl` verification). Default: memcpy from host_data()
  // when the arena is host-visible, Unimplemented otherwise.
  virtual absl::Status ReadArena(const Arena& arena, uint64_t offset, std::span<uint8_t> out);

  // OK while the device can serve; the first sticky error (a CUDA context that is lost or
  // corrupted: illegal address, device lost) once it cannot. The daemon polls it, turns health
  // NOT_SERVING and exits non-zero so the service manager restarts it. Host device: always OK.
  virtual absl::Status Health() const { return absl::OkStatus(); }

 protected:
  Device() = default;
};

// Shape checks every backend applies before accepting a copy (sizes, ranges, slots); the
// backend adds its own ownership checks. InvalidArgument naming the bad part.
absl::Status ValidateCopyRequest(const CopyRequest& request);

}  // namespace expertd
