// The host device's objects: shared-memory arenas and fence tables, staging, and the copy
// threads. Shared memory and fence words: host_shared_memory.h; the client side is there too.
#include "device/host/host_device.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/host/host_shared_memory.h"
#include "util/status.h"

namespace expertd {
namespace {

using host_device_internal::AdvanceCounter;
using host_device_internal::CheckSlot;
using host_device_internal::FenceHeader;
using host_device_internal::FenceLayout;
using host_device_internal::FenceWords;
using host_device_internal::kFenceMagic;
using host_device_internal::kFenceVersion;
using host_device_internal::kMaxFenceSlots;
using host_device_internal::LayoutFor;
using host_device_internal::LoadCounter;
using host_device_internal::MapPrivate;
using host_device_internal::PhysicalMemory;
using host_device_internal::SharedMemory;
using host_device_internal::WaitCounter;
using host_device_internal::WordsAt;

// ---- Device objects --------------------------------------------------------------------------

class HostArena final : public Arena {
 public:
  HostArena(const void* owner, std::string label, uint64_t bytes, uint64_t reserved,
            SharedMemory memory)
      : Arena(std::move(label), bytes, reserved), owner_(owner), memory_(std::move(memory)) {}
  const uint8_t* host_data() const override { return memory_.data(); }
  uint8_t* host_write_data() const override { return memory_.data(); }
  const void* owner() const { return owner_; }
  absl::StatusOr<ArenaExport> Export() const override {
    return ArenaExport{memory_.Handle(), bytes(), reserved_bytes(), label()};
  }

 private:
  const void* owner_;
  SharedMemory memory_;
};

class HostStaging final : public StagingBuffer {
 public:
  HostStaging(std::span<uint8_t> data, ShmMapping mapping)
      : StagingBuffer(data), mapping_(std::move(mapping)) {}

 private:
  ShmMapping mapping_;  // empty for registered (borrowed) memory
};

class HostFenceTable final : public FenceTable {
 public:
  HostFenceTable(const void* owner, uint32_t n_slots, FenceLayout layout, SharedMemory memory)
      : FenceTable(n_slots),
        owner_(owner),
        layout_(layout),
        memory_(std::move(memory)),
        words_(WordsAt(memory_.data(), memory_.data() + layout.done_offset, n_slots)) {}

  uint64_t ready(SlotId slot) const override { return LoadCounter(words_, words_.ready, slot); }
  uint64_t done(SlotId slot) const override { return LoadCounter(words_, words_.done, slot); }
  // Every advance wakes: the waiter count lives where clients cannot write (a client could
  // otherwise clear it and make other clients sleep through their fills), and an advance
  // happens once per fill, so the system call is cheap beside the copy.
  absl::Status AdvanceReady(SlotId slot, uint64_t generation) override {
    RETURN_IF_ERROR(CheckSlot(slot, size()));
    return AdvanceCounter(words_.ready, /*waiters=*/nullptr, slot, generation, "ready");
  }
  absl::Status WaitDone(SlotId slot, uint64_t generation, absl::Duration timeout) const override {
    RETURN_IF_ERROR(CheckSlot(slot, size()));
    return WaitCounter(words_.done, words_.done_waiters, slot, generation, timeout, "done");
  }
  // Raises done[slot] to `generation` on a session's behalf; an older generation changes nothing.
  void RaiseDone(SlotId slot, uint64_t generation) {
    if (done(slot) >= generation) return;
    (void)AdvanceCounter(words_.done, words_.done_waiters, slot, generation, "done");
  }
  absl::StatusOr<FenceExport> Export() const override {
    return FenceExport{memory_.Handle(), size(), layout_.segment_bytes, layout_.done_offset, {}};
  }
  const void* owner() const { return owner_; }
  const FenceLayout& layout() const { return layout_; }

 private:
  const void* owner_;
  FenceLayout layout_;
  SharedMemory memory_;
  FenceWords words_;
};

// One session's done words: a segment of its own, laid out like the table's second part, that
// only this session's client writes. The table's done counters, which copies wait on, are
// written by the daemon alone: raised when the daemon saw the client's word reach a generation
// (DeclareDone, at Release) or gave up on the client (ForceDone). So no copy ever waits on a
// word a client can write, and a client that lowers its own words only has its own releases
// refused.
class HostSessionFences final : public SessionFences {
 public:
  HostSessionFences(HostFenceTable& table, SharedMemory memory)
      : table_(table), memory_(std::move(memory)) {}

  absl::StatusOr<FenceExport> Export() const override {
    ASSIGN_OR_RETURN(FenceExport e, table_.Export());
    e.session_done = memory_.Handle();
    return e;
  }
  absl::Status DeclareDone(SlotId slot, uint64_t generation) override {
    RETURN_IF_ERROR(CheckDeclaration(slot, generation));
    const uint64_t client = ClientDone(slot);
    if (client < generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", slot, " has done ", client, " < generation ", generation,
                       "; signal done for every slot before releasing"));
    }
    table_.RaiseDone(slot, generation);
    return absl::OkStatus();
  }
  absl::Status ForceDone(SlotId slot, uint64_t generation) override {
    RETURN_IF_ERROR(CheckDeclaration(slot, generation));
    table_.RaiseDone(slot, generation);
    return absl::OkStatus();
  }
  void ClientGone() override {}  // the daemon forces done for each lease it takes back
  bool WaitsForClient() const override { return false; }
  bool Signalled(SlotId slot, uint64_t generation) const override {
    return slot < table_.size() && generation != 0 && ClientDone(slot) >= generation;
  }

 private:
  absl::Status CheckDeclaration(SlotId slot, uint64_t generation) const {
    RETURN_IF_ERROR(CheckSlot(slot, table_.size()));
    if (generation == 0) return InvalidError(ErrorKind::kBadValue, "done for generation 0");
    if (const uint64_t ready = table_.ready(slot); generation > ready) {
      return absl::FailedPreconditionError(absl::StrCat(
          "done[", slot, "] = ", generation, " declared but ready is only at ", ready));
    }
    return absl::OkStatus();
  }
  uint64_t ClientDone(SlotId slot) const {
    const FenceWords w = WordsAt(nullptr, memory_.data(), table_.size());
    return LoadCounter(w, w.done, slot);
  }

  HostFenceTable& table_;
  SharedMemory memory_;
};

class HostDevice final : public Device {
 public:
  HostDevice(HostDeviceOptions options, Capabilities caps)
      : options_(std::move(options)), caps_(caps) {
    for (uint32_t i = 0; i < options_.copy_threads; ++i) {
      threads_.emplace_back([this] { CopyLoop(); });
    }
  }
  ~HostDevice() override { Shutdown(); }

  std::string_view name() const override { return "host"; }
  const Capabilities& caps() const override { return caps_; }

  absl::StatusOr<std::unique_ptr<Arena>> AllocateArena(uint64_t bytes,
                                                       std::string_view label) override {
    ASSIGN_OR_RETURN(const uint64_t reserved, ArenaReservedBytes(bytes, caps_.max_arena_bytes));
    // Clients only read arenas: the object gives them no write access, whatever shm_mode says.
    ASSIGN_OR_RETURN(SharedMemory memory,
                     SharedMemory::Create(options_, label, reserved, /*clients_write=*/false));
    return std::make_unique<HostArena>(this, std::string(label), bytes, reserved,
                                       std::move(memory));
  }

  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(uint64_t bytes) override {
    if (bytes == 0) return InvalidError(ErrorKind::kBadValue, "staging of 0 bytes requested");
    if (bytes > caps_.max_staging_bytes) {
      return MakeError(absl::StatusCode::kResourceExhausted, ErrorKind::kAbsurdCount,
                       absl::StrCat("staging of ", bytes, " bytes requested; at most ",
                                    caps_.max_staging_bytes));
    }
    ASSIGN_OR_RETURN(ShmMapping mapping, MapPrivate(bytes));
    return std::make_unique<HostStaging>(std::span<uint8_t>(mapping.data(), bytes),
                                         std::move(mapping));
  }

  // Host copies read any host memory, so registering is just wrapping it (not owned).
  absl::StatusOr<std::unique_ptr<StagingBuffer>> RegisterHostMemory(
      std::span<uint8_t> memory) override {
    if (memory.empty()) return InvalidError(ErrorKind::kBadValue, "empty host memory range");
    return std::make_unique<HostStaging>(memory, ShmMapping());
  }

  absl::StatusOr<std::unique_ptr<FenceTable>> CreateFences(uint32_t n_slots) override {
    if (n_slots == 0 || n_slots > kMaxFenceSlots) {
      return InvalidError(ErrorKind::kBadValue, absl::StrCat("fence table of ", n_slots,
                                                             " slots (1..", kMaxFenceSlots, ")"));
    }
    const FenceLayout layout = LayoutFor(n_slots);
    // Only the daemon writes the table: clients map the ready part read-only and write done
    // words in a segment of their own session (CreateSessionFences).
    ASSIGN_OR_RETURN(SharedMemory memory,
                     SharedMemory::Create(options_, "fences", layout.segment_bytes,
                                          /*clients_write=*/false));
    const FenceHeader header{kFenceMagic, kFenceVersion, n_slots, layout.done_offset,
                             layout.segment_bytes};
    std::memcpy(memory.data(), &header, sizeof(header));
    return std::make_unique<HostFenceTable>(this, n_slots, layout, std::move(memory));
  }

  absl::StatusOr<std::unique_ptr<SessionFences>> CreateSessionFences(
      FenceTable& shared) override {
    auto* table = dynamic_cast<HostFenceTable*>(&shared);
    if (table == nullptr || table->owner() != this) return Foreign("fence table");
    const FenceLayout& layout = table->layout();
    // Always a memfd: no name anyone could open; only the session's client gets a descriptor.
    HostDeviceOptions own = options_;
    own.backing = HostDeviceOptions::Backing::kMemfd;
    ASSIGN_OR_RETURN(SharedMemory memory,
                     SharedMemory::Create(own, "session done",
                                          layout.segment_bytes - layout.done_offset,
                                          /*clients_write=*/true));
    return std::make_unique<HostSessionFences>(*table, std::move(memory));
  }

  absl::Status SubmitCopy(CopyRequest request, CopyCallback on_complete) override {
    RETURN_IF_ERROR(ValidateCopyRequest(request));
    for (const CopySegment& s : request.segments) {
      const auto* arena = dynamic_cast<const HostArena*>(s.arena);
      if (arena == nullptr || arena->owner() != this) return Foreign("arena");
    }
    for (const FenceWait& w : request.waits) {
      const auto* fences = dynamic_cast<const HostFenceTable*>(w.fences);
      if (fences == nullptr || fences->owner() != this) return Foreign("fence table");
    }
    for (const FenceSignal& s : request.signals) {
      const auto* fences = dynamic_cast<const HostFenceTable*>(s.fences);
      if (fences == nullptr || fences->owner() != this) return Foreign("fence table");
    }
    {
      std::lock_guard lock(mu_);
      if (stopping_) return absl::FailedPreconditionError("host device is shut down");
      const size_t q = request.priority == CopyPriority::kDemand ? 0 : 1;
      queues_[q].push_back(Job{std::move(request), std::move(on_complete)});
    }
    work_cv_.notify_one();
    return absl::OkStatus();
  }

  absl::Status Drain(absl::Duration timeout) override {
    std::unique_lock lock(mu_);
    const auto idle = [this] { return running_ == 0 && queues_[0].empty() && queues_[1].empty(); };
    if (timeout == absl::InfiniteDuration()) {
      idle_cv_.wait(lock, idle);
    } else if (!idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), idle)) {
      return absl::DeadlineExceededError(
          absl::StrCat("host device: copies still pending after ", absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

  void Shutdown() override {
    std::lock_guard shutdown_lock(shutdown_mu_);  // two callers must not join the same threads
    std::vector<Job> cancelled;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (auto& queue : queues_) {
        for (Job& job : queue) cancelled.push_back(std::move(job));
        queue.clear();
      }
    }
    work_cv_.notify_all();
    for (Job& job : cancelled) {
      std::move(job.on_complete)(absl::CancelledError("host device shut down before the copy"));
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    idle_cv_.notify_all();
  }

 private:
  struct Job {
    CopyRequest request;
    CopyCallback on_complete;
  };

  static absl::Status Foreign(std::string_view what) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("copy names a ", AV(what), " of another device"));
  }

  static bool WaitsPassed(const CopyRequest& request) {
    for (const FenceWait& w : request.waits) {
      if (w.fences->done(w.slot) < w.generation) return false;
    }
    return true;
  }

  // Under mu_: the first copy, demand queue first, whose done fences have passed.
  bool TakeRunnable(Job* out) {
    for (auto& queue : queues_) {
      for (auto it = queue.begin(); it != queue.end(); ++it) {
        if (!WaitsPassed(it->request)) continue;
        *out = std::move(*it);
        queue.erase(it);
        return true;
      }
    }
    return false;
  }

  static absl::Status RunCopy(const CopyRequest& request) {
    for (const CopySegment& s : request.segments) {
      uint8_t* base = static_cast<const HostArena*>(s.arena)->host_write_data();
      std::memcpy(base + s.arena_offset, s.source.data(), s.source.size());
    }
    absl::Status status;
    for (const FenceSignal& s : request.signals)
      status.Update(s.fences->AdvanceReady(s.slot, s.generation));
    return status;
  }

  void CopyLoop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      Job job;
      if (!TakeRunnable(&job)) {
        if (queues_[0].empty() && queues_[1].empty()) {
          work_cv_.wait(lock);
        } else {  // every queued copy waits on a done fence another process will store
          work_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.fence_poll_interval));
        }
        continue;
      }
      ++running_;
      lock.unlock();
      absl::Status status = RunCopy(job.request);
      std::move(job.on_complete)(std::move(status));
      job = Job{};  // drop the callback's captures outside the lock
      lock.lock();
      --running_;
      if (running_ == 0 && queues_[0].empty() && queues_[1].empty()) idle_cv_.notify_all();
    }
  }

  const HostDeviceOptions options_;
  const Capabilities caps_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // a copy was queued, or shutting down
  std::condition_variable idle_cv_;  // nothing queued or running
  std::deque<Job> queues_[2];        // [0] demand, [1] prefetch; FIFO each
  size_t running_ = 0;
  bool stopping_ = false;

  std::mutex shutdown_mu_;
  std::vector<std::thread> threads_;
};

bool ValidPrefix(const std::string& p) {
  if (p.empty() || p.size() > 64) return false;
  for (const char c : p) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

// ---- Public functions ------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Device>> MakeHostDevice(HostDeviceOptions options) {
  if (options.copy_threads == 0 || options.copy_threads > 64) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("host device: copy_threads ",
                                                           options.copy_threads, " outside 1..64"));
  }
  if (!ValidPrefix(options.shm_prefix)) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("host device: shm_prefix '", options.shm_prefix,
                                     "' must be 1..64 of [A-Za-z0-9._-]"));
  }
  // It goes into an SDDL string (Windows): a SID ("S-1-5-32-545") or an alias ("BU"), nothing else.
  if (options.client_sid.size() > 184 ||
      options.client_sid.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") !=
          std::string::npos) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("host device: client_sid '", options.client_sid,
                                     "' is not a SID (S-1-...) or an SDDL alias"));
  }
  if ((options.shm_mode & ~0777u) != 0 || options.fence_poll_interval <= absl::ZeroDuration()) {
    return InvalidError(ErrorKind::kBadValue, "host device: bad shm_mode or fence_poll_interval");
  }
  Capabilities caps;
  caps.arenas_host_visible = true;
  caps.arenas_host_writable = true;
  caps.exports_to_other_processes = true;
  caps.async_copies = true;
  caps.copy_priorities = true;
  caps.fences_host_visible = true;
  caps.session_fences = true;
  caps.registers_host_memory = true;
  caps.registers_read_only_memory = true;
  caps.copy_engines = options.copy_threads;
  caps.max_arena_bytes = options.max_arena_bytes != 0 ? options.max_arena_bytes : PhysicalMemory();
  caps.max_staging_bytes =
      options.max_staging_bytes != 0 ? options.max_staging_bytes : PhysicalMemory();
  return std::make_unique<HostDevice>(std::move(options), caps);
}

}  // namespace expertd
