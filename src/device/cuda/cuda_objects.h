// Internal to the CUDA backend (includes CUDA headers; never include it outside src/device/cuda):
// move-only owners of CUDA resources, and the CUDA Arena, StagingBuffer and FenceTable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/event_generations.h"
#include "device/cuda/ipc_layout.h"
#include "device/cuda/registration_plan.h"
#include "device/device.h"

namespace expertd::cuda {

// The IPC events (cudaEventInterprocess) this device's objects hold, against the most a process
// may have: the driver refuses more with cudaErrorMemoryAllocation, at 4096 on an NVIDIA H200
// with CUDA 13 whatever other processes hold or how many events this one opened
// (tests/gpu/ipc_event_limit). Reserved before any event is made, so that a fence table or a
// session that would not fit is refused with a message that says why. One per process (the
// bound was measured per process; every GPU's device shares it: ProcessIpcEventBudget).
// Thread-safe.
class IpcEventBudget {
 public:
  explicit IpcEventBudget(uint32_t limit) : limit_(limit) {}
  IpcEventBudget(const IpcEventBudget&) = delete;
  IpcEventBudget& operator=(const IpcEventBudget&) = delete;

  // Gives its events back to the budget when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : budget_(std::exchange(o.budget_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    Reservation& operator=(Reservation&& o) noexcept {
      std::swap(budget_, o.budget_);
      std::swap(n_, o.n_);
      return *this;
    }
    ~Reservation() {
      if (budget_ != nullptr) budget_->Give(n_);
    }

   private:
    friend class IpcEventBudget;
    Reservation(IpcEventBudget* budget, uint32_t n) : budget_(budget), n_(n) {}
    IpcEventBudget* budget_ = nullptr;
    uint32_t n_ = 0;
  };

  // `n` more events for `what`: ResourceExhausted when they would not fit, naming the numbers.
  absl::StatusOr<Reservation> Reserve(uint32_t n, std::string_view what);
  uint32_t limit() const { return limit_; }
  uint32_t in_use() const;

 private:
  void Give(uint32_t n);
  const uint32_t limit_;
  mutable std::mutex mu_;
  uint32_t in_use_ = 0;
};

// The process's budget; its limit is the one the first caller asked for (later ones share it).
IpcEventBudget& ProcessIpcEventBudget(uint32_t limit);

// What a device shares with the objects it made: its GPU, its first sticky error, its pinned
// budget, the process's IPC event budget. Owned by the device; objects hold a pointer (they die
// before the device).
struct DeviceContext {
  DeviceContext(int ordinal_in, uint64_t pinned_limit, IpcEventBudget& ipc_event_budget)
      : ordinal(ordinal_in), pinned(pinned_limit), ipc_events(ipc_event_budget) {}
  // Makes the device current on the calling thread (each thread has its own current device).
  absl::Status Use() {
    EXPERTD_CUDA_RETURN_IF_ERROR(latch, cudaSetDevice(ordinal));
    return absl::OkStatus();
  }
  const int ordinal;
  StickyErrorLatch latch;
  PinnedBudget pinned;
  IpcEventBudget& ipc_events;
};

// ---- Owners. Destructors cannot report: a failure there is either harmless or sticky, and a
// sticky error shows again at the next checked call. ----

class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(void* ptr, int ordinal) : ptr_(ptr), ordinal_(ordinal) {}
  DeviceMemory(DeviceMemory&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), ordinal_(o.ordinal_) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(ordinal_, o.ordinal_);
    return *this;
  }
  ~DeviceMemory();
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  int ordinal_ = 0;
};

class StreamOwner {
 public:
  explicit StreamOwner(cudaStream_t s = nullptr) : s_(s) {}
  StreamOwner(StreamOwner&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  StreamOwner& operator=(StreamOwner&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~StreamOwner() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_;
};

class EventOwner {
 public:
  explicit EventOwner(cudaEvent_t e = nullptr) : e_(e) {}
  EventOwner(EventOwner&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  EventOwner& operator=(EventOwner&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~EventOwner() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_;
};

absl::StatusOr<EventOwner> CreateEvent(StickyErrorLatch& latch, unsigned flags);

// A registration plan's address (registration_plan.h keeps addresses as integers) as a pointer.
inline void* HostPointer(uint64_t address) {
  const auto a = static_cast<uintptr_t>(address);
  return reinterpret_cast<void*>(a);  // NOLINT(performance-no-int-to-ptr)
}

// ---- Device objects ----

class CudaArena final : public Arena {
 public:
  CudaArena(DeviceContext* ctx, std::string label, uint64_t bytes, uint64_t reserved,
            DeviceMemory memory)
      : Arena(std::move(label), bytes, reserved), ctx_(ctx), memory_(std::move(memory)) {}
  uint8_t* device_data() const { return memory_.get(); }
  const DeviceContext* owner() const { return ctx_; }
  // cudaIpcGetMemHandle once, cached: every export of the arena carries the same handle.
  absl::StatusOr<ArenaExport> Export() const override;

 private:
  DeviceContext* ctx_;
  DeviceMemory memory_;
  mutable std::mutex export_mu_;
  mutable std::optional<IpcHandleBytes> handle_;
};

// cudaHostAlloc'd staging, counted against the pinned budget.
class CudaStaging final : public StagingBuffer {
 public:
  CudaStaging(DeviceContext* ctx, std::span<uint8_t> memory) : StagingBuffer(memory), ctx_(ctx) {}
  ~CudaStaging() override;

 private:
  DeviceContext* ctx_;
};

// Caller-owned host memory registered with cudaHostRegister in chunks; unregistered (not freed)
// when destroyed.
class CudaRegisteredStaging final : public StagingBuffer {
 public:
  CudaRegisteredStaging(DeviceContext* ctx, std::span<uint8_t> memory,
                        std::vector<HostRange> chunks, uint64_t pinned_bytes)
      : StagingBuffer(memory), ctx_(ctx), chunks_(std::move(chunks)), pinned_bytes_(pinned_bytes) {}
  ~CudaRegisteredStaging() override;
  bool OneRegion(std::span<const uint8_t> range) const override;

 private:
  DeviceContext* ctx_;
  std::vector<HostRange> chunks_;
  uint64_t pinned_bytes_;
};

// IPC events, one per slot (cudaEventInterprocess | cudaEventDisableTiming), with their share of
// the device's IPC event budget (given back after the events are destroyed). A source's done
// events (the table's own, or one session's) are shared: a copy about to wait on them keeps
// them alive even when the session ends meanwhile.
struct IpcEventSet {
  IpcEventBudget::Reservation reservation;  // first: destroyed last
  std::vector<EventOwner> events;
};
using DoneEventSet = IpcEventSet;

// Reserves `n` events of the device's budget, then creates them; errors name `what` and the
// slot.
absl::StatusOr<IpcEventSet> CreateIpcEvents(DeviceContext* ctx, uint32_t n,
                                            std::string_view what);

// Per slot an IPC ready event, and done events per source (event_generations.h: source 0 is the
// table's own set, what Export() hands out; sessions add theirs with AddSource), with their
// generations. ready()/done() report the bookkeeping (the GPU-side state is in the events:
// caps().fences_host_visible is false).
class CudaFenceTable final : public FenceTable {
 public:
  // `on_declared` runs (without the table's lock) after a done declaration: queued copies that
  // waited for it may start.
  static absl::StatusOr<std::unique_ptr<CudaFenceTable>> Create(DeviceContext* ctx,
                                                                uint32_t n_slots,
                                                                std::function<void()> on_declared);

  uint64_t ready(SlotId slot) const override;
  uint64_t done(SlotId slot) const override;
  absl::Status AdvanceReady(SlotId slot, uint64_t generation) override;
  // Not on the hot path: polls until done was declared for `generation`, then until every
  // declared done event completed (none when the clients are gone).
  absl::Status WaitDone(SlotId slot, uint64_t generation, absl::Duration timeout) const override;
  // Ready handles with the table's own done handles (source 0): for a single client.
  absl::StatusOr<FenceExport> Export() const override;
  // The ready events' IPC handles, slot 0 first (made once).
  absl::StatusOr<std::vector<IpcHandleBytes>> ReadyHandles() const;

  absl::Status DeclareDone(SlotId slot, uint64_t generation, bool recorded, uint64_t source = 0);
  const DeviceContext* owner() const { return ctx_; }

  // Sessions: a new source whose done events are `events` (one per slot); DetachSource when the
  // session object goes (its events are freed once no declaration refers to them); DropSource
  // when its process exited (its declarations are forgotten).
  uint64_t AddSource(std::shared_ptr<const DoneEventSet> events);
  void DetachSource(uint64_t source);
  void DropSource(uint64_t source);
  // The copy engine gives up on `source`'s done records: one answered an error of the client's
  // context (this device's own stream being fine), or one stayed pending longer than the
  // device's done_record_timeout after its declaration. Its declarations are dropped, as for
  // DropSource, and `why` is kept for its session (SourceFailure): the daemon ends that session.
  // Does not call on_declared (the engine calls this with its own lock held).
  void AbandonSource(uint64_t source, absl::Status why);
  // OK, or why the engine gave up on the source's records.
  absl::Status SourceFailure(uint64_t source) const;

  // For the copy engine.
  WaitAction ForWait(SlotId slot, uint64_t generation) const;
  // With kWaitDoneEvent: the done events to wait on for `slot` (one per declared source), kept
  // alive by `keep`, with their source and when it declared.
  struct DoneWait {
    std::shared_ptr<const DoneEventSet> keep;
    cudaEvent_t event = nullptr;
    uint64_t source = 0;
    std::chrono::steady_clock::time_point declared_at;
  };
  std::vector<DoneWait> DoneWaits(SlotId slot) const;
  // Checks `generation` against ready, records the slot's ready event on `stream` and raises
  // ready, all under the table's lock (so ready never names a record not yet made).
  absl::Status RecordReady(SlotId slot, uint64_t generation, cudaStream_t stream);

 private:
  struct Source {
    std::shared_ptr<const DoneEventSet> events;
    bool detached = false;
    absl::Status failure;  // AbandonSource
  };
  CudaFenceTable(DeviceContext* ctx, uint32_t n_slots, IpcEventSet ready,
                 std::shared_ptr<const DoneEventSet> done, std::function<void()> on_declared)
      : FenceTable(n_slots),
        ctx_(ctx),
        ready_reservation_(std::move(ready.reservation)),
        ready_(std::move(ready.events)),
        on_declared_(std::move(on_declared)),
        gens_(n_slots) {
    sources_[0].events = std::move(done);
  }
  void ForgetDetachedLocked();

  DeviceContext* ctx_;
  IpcEventBudget::Reservation ready_reservation_;  // before ready_: given back after
  const std::vector<EventOwner> ready_;
  const std::function<void()> on_declared_;
  mutable std::mutex mu_;
  EventGenerations gens_;
  std::map<uint64_t, Source> sources_;
  uint64_t next_source_ = 1;
  mutable std::optional<std::vector<IpcHandleBytes>> ready_handles_;
  mutable std::optional<FenceExport> export_;
};

// One session's done events over a CudaFenceTable (SessionFences in device.h).
class CudaSessionFences final : public SessionFences {
 public:
  static absl::StatusOr<std::unique_ptr<CudaSessionFences>> Create(DeviceContext* ctx,
                                                                   CudaFenceTable& table);
  ~CudaSessionFences() override { table_.DetachSource(source_); }

  absl::StatusOr<FenceExport> Export() const override;
  absl::Status DeclareDone(SlotId slot, uint64_t generation) override {
    return table_.DeclareDone(slot, generation, /*recorded=*/true, source_);
  }
  absl::Status ForceDone(SlotId slot, uint64_t generation) override {
    return table_.DeclareDone(slot, generation, /*recorded=*/false, source_);
  }
  absl::Status Failure() const override { return table_.SourceFailure(source_); }
  void ClientGone() override { table_.DropSource(source_); }
  uint64_t source() const { return source_; }

 private:
  CudaSessionFences(DeviceContext* ctx, CudaFenceTable& table,
                    std::shared_ptr<const DoneEventSet> events, uint64_t source)
      : ctx_(ctx), table_(table), events_(std::move(events)), source_(source) {}

  DeviceContext* ctx_;
  CudaFenceTable& table_;
  const std::shared_ptr<const DoneEventSet> events_;
  const uint64_t source_;
  mutable std::mutex export_mu_;
  mutable std::optional<FenceExport> export_;
};

}  // namespace expertd::cuda
