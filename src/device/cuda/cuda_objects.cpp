// CUDA resource owners, arenas, staging and IPC event fence tables (see cuda_objects.h).
#include "device/cuda/cuda_objects.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
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
  return MakeArenaExport(*handle_, this->bytes(), reserved_bytes(), label(), ::getpid());
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

absl::StatusOr<std::unique_ptr<CudaFenceTable>> CudaFenceTable::Create(
    DeviceContext* ctx, uint32_t n_slots, std::function<void()> on_declared) {
  if (n_slots == 0 || n_slots > kMaxCudaFenceSlots) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("fence table of ", n_slots,
                                                           " slots (1..", kMaxCudaFenceSlots, ")"));
  }
  RETURN_IF_ERROR(ctx->Use());
  constexpr unsigned kFlags = cudaEventInterprocess | cudaEventDisableTiming;
  std::vector<EventOwner> ready;
  std::vector<EventOwner> done;
  ready.reserve(n_slots);
  done.reserve(n_slots);
  for (uint32_t i = 0; i < n_slots; ++i) {
    absl::StatusOr<EventOwner> r = CreateEvent(ctx->latch, kFlags);
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("ready event of slot ", i));
    ready.push_back(*std::move(r));
    absl::StatusOr<EventOwner> d = CreateEvent(ctx->latch, kFlags);
    if (!d.ok()) return Annotate(d.status(), absl::StrCat("done event of slot ", i));
    done.push_back(*std::move(d));
  }
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

absl::Status CudaFenceTable::RecordReady(SlotId slot, uint64_t generation, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  if (slot >= size() || generation < gens_.ready(slot)) {
    return gens_.BeginReadyRecord(slot, generation);  // the error, nothing recorded
  }
  EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaEventRecord(ready_[slot].get(), stream));
  return gens_.BeginReadyRecord(slot, generation);
}

absl::Status CudaFenceTable::DeclareDone(SlotId slot, uint64_t generation, bool recorded) {
  {
    std::lock_guard lock(mu_);
    RETURN_IF_ERROR(recorded ? gens_.DeclareDoneRecorded(slot, generation)
                             : gens_.DeclareDoneForced(slot, generation));
  }
  if (on_declared_) on_declared_();
  return absl::OkStatus();
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
      const cudaError_t e = cudaEventQuery(done_[slot].get());
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        return ctx_->latch.Observe(EXPERTD_CUDA_ERROR(e, "cudaEventQuery(done event)"));
      }
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

absl::StatusOr<FenceExport> CudaFenceTable::Export() const {
  std::lock_guard lock(mu_);
  if (!export_) {
    RETURN_IF_ERROR(ctx_->Use());
    std::vector<IpcHandleBytes> ready(size());
    std::vector<IpcHandleBytes> done(size());
    for (uint32_t i = 0; i < size(); ++i) {
      cudaIpcEventHandle_t h{};
      EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaIpcGetEventHandle(&h, ready_[i].get()));
      std::memcpy(ready[i].data(), &h, sizeof(h));
      EXPERTD_CUDA_RETURN_IF_ERROR(ctx_->latch, cudaIpcGetEventHandle(&h, done_[i].get()));
      std::memcpy(done[i].data(), &h, sizeof(h));
    }
    ASSIGN_OR_RETURN(FenceExport e, MakeFenceExport(ready, done, ::getpid()));
    export_ = std::move(e);
  }
  return *export_;
}

}  // namespace expertd::cuda
