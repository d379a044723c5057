// CUDA resource owners, arenas, staging and IPC event fence tables (see cuda_objects.h).
#include "device/cuda/cuda_objects.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "util/process.h"
#include "util/status.h"

namespace expertd::cuda {

DeviceMemory::~DeviceMemory() {
  if (ptr_ == nullptr) return;
  // cudaFree needs the owning device current on this thread.
  (void)cudaSetDevice(ordinal_);
  (void)cudaFree(ptr_);
}

absl::StatusOr<EventOwner> CreateEvent(StickyErrorLatch& latch, unsigned flags) {
  cudaEvent_t event = nullptr;
  EXPERTD_CUDA_RETURN_IF_ERROR(latch, cudaEventCreateWithFlags(&event, flags));
  return EventOwner(event);
}

absl::StatusOr<ArenaExport> CudaArena::Export() const {
  std::lock_guard lock(export_mu_);
  if (!handle_) {
    RETURN_IF_ERROR(ctx_->Use());
    cudaIpcMemHandle_t h{};
    if (absl::Status st = EXPERTD_CUDA_STATUS(cudaIpcGetMemHandle(&h, device_data())); !st.ok()) {
      return Annotate(ctx_->latch.Observe(st), absl::StrCat("exporting arena '", label(), "'"));
    }
    IpcHandleBytes bytes{};
    std::memcpy(bytes.data(), &h, sizeof(h));
    handle_ = bytes;
  }
  return MakeArenaExport(*handle_, this->bytes(), reserved_bytes(), label(), CurrentProcessId());
}

CudaStaging::~CudaStaging() {
  (void)cudaFreeHost(data().data());
  ctx_->pinned.Release(bytes());
}

CudaRegisteredStaging::~CudaRegisteredStaging() {
  for (const HostRange& c : chunks_) {
    (void)cudaHostUnregister(HostPointer(c.address));
  }
  ctx_->pinned.Release(pinned_bytes_);
}

bool CudaRegisteredStaging::OneRegion(std::span<const uint8_t> range) const {
  const auto begin = reinterpret_cast<uintptr_t>(range.data());
  const uint64_t end = begin + range.size();
  for (const HostRange& c : chunks_) {
    if (begin >= c.address && end <= c.address + c.bytes) return true;
  }
  return false;
}

absl::StatusOr<IpcEventBudget::Reservation> IpcEventBudget::Reserve(uint32_t n,
                                                                    std::string_view what) {
  std::lock_guard lock(mu_);
  if (n > limit_ - in_use_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        AV(what), ": ", n, " IPC events needed (one per slot), but ", in_use_, " of the ",
        limit_, " this process may have are in use (the CUDA driver refuses more: 4096 on an "
        "H200 with CUDA 13). A slot class of N slots takes 2N for its table and N per session: "
        "fewer slots, or fewer sessions at once"));
  }
  in_use_ += n;
  return Reservation(this, n);
}

IpcEventBudget& ProcessIpcEventBudget(uint32_t limit) {
  static auto* budget = new IpcEventBudget(limit);  // never destroyed: objects may outlive main
  return *budget;
}

uint32_t IpcEventBudget::in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

void IpcEventBudget::Give(uint32_t n) {
  std::lock_guard lock(mu_);
  in_use_ -= std::min(n, in_use_);
}

absl::StatusOr<IpcEventSet> CreateIpcEvents(DeviceContext* ctx, uint32_t n,
                                            std::string_view what) {
  IpcEventSet set;
  ASSIGN_OR_RETURN(set.reservation, ctx->ipc_events.Reserve(n, what));
  RETURN_IF_ERROR(ctx->Use());
  constexpr unsigned kFlags = cudaEventInterprocess | cudaEventDisableTiming;
  set.events.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    absl::StatusOr<EventOwner> e = CreateEvent(ctx->latch, kFlags);
    if (!e.ok()) return Annotate(e.status(), absl::StrCat(AV(what), " event of slot ", i));
    set.events.push_back(*std::move(e));
  }
  return set;
}

namespace {

absl::StatusOr<std::vector<IpcHandleBytes>> HandlesOf(DeviceContext* ctx,
                                                      const std::vector<EventOwner>& events) {
  RETURN_IF_ERROR(ctx->Use());
  std::vector<IpcHandleBytes> out(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    cudaIpcEventHandle_t h{};
    EXPERTD_CUDA_RETURN_IF_ERROR(ctx->latch, cudaIpcGetEventHandle(&h, events[i].get()));
    std::memcpy(out[i].data(), &h, sizeof(h));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaFenceTable>> CudaFenceTable::Create(
    DeviceContext* ctx, uint32_t n_slots, std::function<void()> on_declared) {
  if (n_slots == 0 || n_slots > kMaxCudaFenceSlots) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("fence table of ", n_slots,
                                                           " slots (1..", kMaxCudaFenceSlots, ")"));
  }
  ASSIGN_OR_RETURN(IpcEventSet ready,
                   CreateIpcEvents(ctx, n_slots, absl::StrCat("fence table of ", n_slots,
                                                              " slots: ready events")));
  ASSIGN_OR_RETURN(IpcEventSet table_done,
                   CreateIpcEvents(ctx, n_slots, absl::StrCat("fence table of ", n_slots,
                                                              " slots: done events")));
  auto done = std::make_shared<DoneEventSet>(std::move(table_done));
  return std::unique_ptr<CudaFenceTable>(
      new CudaFenceTable(ctx, n_slots, std::move(ready), std::move(done), std::move(on_declared)));
}

uint64_t CudaFenceTable::ready(SlotId slot) const {
  std::lock_guard lock(mu_);
  return gens_.ready(slot);
}

uint64_t CudaFenceTable::done(SlotId slot) const {
  std::lock_guard lock(mu_);
  return gens_.done(slot);
}

absl::Status CudaFenceTable::AdvanceReady(SlotId slot, uint64_t generation) {
  std::lock_guard lock(mu_);
  return gens_.AdvanceReady(slot, generation);
}

WaitAction CudaFenceTable::ForWait(SlotId slot, uint64_t generation) const {
  std::lock_guard lock(mu_);
  return gens_.ForWait(slot, generation);
}

std::vector<CudaFenceTable::DoneWait> CudaFenceTable::DoneWaits(SlotId slot) const {
  std::lock_guard lock(mu_);
  std::vector<DoneWait> out;
  for (const EventGenerations::SourceWait& w : gens_.WaitDeclarations(slot)) {
    auto it = sources_.find(w.source);
    if (it == sources_.end()) continue;  // cannot happen: declarations keep their source
    out.push_back(DoneWait{it->second.events, it->second.events->events[slot].get(), w.source,
                           std::chrono::steady_clock::time_point(
                               std::chrono::steady_clock::duration(w.declared_at))});
  }
  return out;
}

void CudaFenceTable::AbandonSource(uint64_t source, absl::Status why) {
  std::lock_guard lock(mu_);
  if (auto it = sources_.find(source); it != sources_.end() && it->second.failure.ok()) {
    it->second.failure = std::move(why);
  }
  gens_.DropSource(source);
  ForgetDetachedLocked();
}

absl::Status CudaFenceTable::SourceFailure(uint64_t source) const {
  std::lock_guard lock(mu_);
  auto it = sources_.find(source);
  return it == sources_.end() ? absl::OkStatus() : it->second.failure;
}

absl::Status CudaFenceTable::RecordReady(SlotId slot, uint64_t generation, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (slot >= size() || generation < gens_.ready(slot)) {
    return gens_.BeginReadyRecord(slot, generation);  // the error, nothing recorded
  }
  EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaEventRecord(ready_[slot].get(), stream));
  RETURN_IF_ERROR(gens_.BeginReadyRecord(slot, generation));
  ForgetDetachedLocked();  // the record cleared the declarations it covered
  return absl::OkStatus();
}

absl::Status CudaFenceTable::DeclareDone(SlotId slot, uint64_t generation, bool recorded,
                                         uint64_t source) {
  {
    std::lock_guard lock(mu_);
    if (!sources_.contains(source)) {
      return absl::FailedPreconditionError(
          absl::StrCat("done declared for an unknown source ", source));
    }
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    RETURN_IF_ERROR(recorded ? gens_.DeclareDoneRecorded(slot, generation, source, now)
                             : gens_.DeclareDoneForced(slot, generation, source));
    if (!recorded) ForgetDetachedLocked();
  }
  if (on_declared_) on_declared_();
  return absl::OkStatus();
}

uint64_t CudaFenceTable::AddSource(std::shared_ptr<const DoneEventSet> events) {
  std::lock_guard lock(mu_);
  const uint64_t source = next_source_++;
  sources_[source].events = std::move(events);
  return source;
}

void CudaFenceTable::DetachSource(uint64_t source) {
  std::lock_guard lock(mu_);
  auto it = sources_.find(source);
  if (it == sources_.end() || source == 0) return;
  it->second.detached = true;
  ForgetDetachedLocked();
}

void CudaFenceTable::DropSource(uint64_t source) {
  {
    std::lock_guard lock(mu_);
    if (gens_.DropSource(source) == 0) return;
    ForgetDetachedLocked();
  }
  // Copies that held only for this source's events may go now.
  if (on_declared_) on_declared_();
}

void CudaFenceTable::ForgetDetachedLocked() {
  std::erase_if(sources_, [this](const auto& entry) {
    return entry.second.detached && gens_.DeclarationsOf(entry.first) == 0;
  });
}

absl::Status CudaFenceTable::WaitDone(SlotId slot, uint64_t generation,
                                      absl::Duration timeout) const {
  if (slot >= size()) {
    return InvalidError(ErrorKind::kOutOfBounds,
                        absl::StrCat("slot ", slot, " outside a fence table of ", size()));
  }
  RETURN_IF_ERROR(ctx_->Use());
  const bool forever = timeout == absl::InfiniteDuration();
  const auto deadline =
      std::chrono::steady_clock::now() +
      (forever ? std::chrono::nanoseconds(0) : absl::ToChronoNanoseconds(timeout));
  auto pause = std::chrono::microseconds(20);
  while (true) {
    const WaitAction action = ForWait(slot, generation);
    if (action == WaitAction::kNone) return absl::OkStatus();
    if (action == WaitAction::kWaitDoneEvent) {
      bool all = true;
      for (const DoneWait& w : DoneWaits(slot)) {
        const cudaError_t e = cudaEventQuery(w.event);
        if (e == cudaErrorNotReady) {
          all = false;
        } else if (e != cudaSuccess) {
          return ctx_->latch.Observe(EXPERTD_CUDA_ERROR(e, "cudaEventQuery(done event)"));
        }
      }
      if (all) return absl::OkStatus();
    }
    if (!forever && std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "done[", slot, "] did not reach ", generation, " within ", absl::FormatDuration(timeout),
          action == WaitAction::kNotDeclared ? " (not declared by the client)"
                                             : " (done event still pending)"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

absl::StatusOr<std::vector<IpcHandleBytes>> CudaFenceTable::ReadyHandles() const {
  std::lock_guard lock(mu_);
  if (!ready_handles_) {
    ASSIGN_OR_RETURN(std::vector<IpcHandleBytes> h, HandlesOf(ctx_, ready_));
    ready_handles_ = std::move(h);
  }
  return *ready_handles_;
}

absl::StatusOr<FenceExport> CudaFenceTable::Export() const {
  ASSIGN_OR_RETURN(std::vector<IpcHandleBytes> ready, ReadyHandles());
  std::lock_guard lock(mu_);
  if (!export_) {
    ASSIGN_OR_RETURN(std::vector<IpcHandleBytes> done,
                     HandlesOf(ctx_, sources_.at(0).events->events));
    ASSIGN_OR_RETURN(FenceExport e, MakeFenceExport(ready, done, CurrentProcessId()));
    export_ = std::move(e);
  }
  return *export_;
}

absl::StatusOr<std::unique_ptr<CudaSessionFences>> CudaSessionFences::Create(
    DeviceContext* ctx, CudaFenceTable& table) {
  ASSIGN_OR_RETURN(IpcEventSet made,
                   CreateIpcEvents(ctx, table.size(),
                                   absl::StrCat("a session's done events (", table.size(),
                                                " slots)")));
  auto events = std::make_shared<DoneEventSet>(std::move(made));
  const uint64_t source = table.AddSource(events);
  return std::unique_ptr<CudaSessionFences>(
      new CudaSessionFences(ctx, table, std::move(events), source));
}

absl::StatusOr<FenceExport> CudaSessionFences::Export() const {
  std::lock_guard lock(export_mu_);
  if (!export_) {
    ASSIGN_OR_RETURN(std::vector<IpcHandleBytes> ready, table_.ReadyHandles());
    ASSIGN_OR_RETURN(std::vector<IpcHandleBytes> done, HandlesOf(ctx_, events_->events));
    ASSIGN_OR_RETURN(FenceExport e, MakeFenceExport(ready, done, CurrentProcessId()));
    export_ = std::move(e);
  }
  return *export_;
}

}  // namespace expertd::cuda
