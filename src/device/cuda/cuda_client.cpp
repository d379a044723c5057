// Client side of the CUDA backend: IPC-opened arenas and session events (see cuda_client.h and
// device/cuda_factory.h for the contracts).
#include "device/cuda/cuda_client.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_objects.h"
#include "device/cuda/event_generations.h"
#include "device/cuda/ipc_layout.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

// Runs `f` with `ordinal` as the calling thread's current device, then restores the caller's:
// the engine's threads have their own current device and must not find it changed.
absl::Status WithDevice(int ordinal, absl::FunctionRef<absl::Status()> f) {
  int previous = 0;
  RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaGetDevice(&previous)));
  if (previous != ordinal) RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaSetDevice(ordinal)));
  absl::Status st = f();
  if (previous != ordinal) st.Update(EXPERTD_CUDA_STATUS(cudaSetDevice(previous)));
  return st;
}

// Open objects by key, shared while anyone holds them. The opener runs under the lock, so two
// threads never open one handle twice; the deleter closes under the lock, and an opener that
// finds an entry whose last reference just went waits for that close (reopening a handle whose
// mapping is still open would fail with cudaErrorAlreadyMapped or alias it).
template <typename T>
class OpenCache {
 public:
  absl::StatusOr<std::shared_ptr<T>> Get(
      const std::string& key, absl::FunctionRef<absl::StatusOr<std::unique_ptr<T>>()> open) {
    std::unique_lock lock(mu_);
    while (true) {
      const auto it = live_.find(key);
      if (it == live_.end()) break;
      if (std::shared_ptr<T> existing = it->second.lock()) return existing;
      closed_cv_.wait(lock);  // being closed right now
    }
    ASSIGN_OR_RETURN(std::unique_ptr<T> opened, open());
    std::shared_ptr<T> shared(opened.release(), [this, key](T* p) {
      std::lock_guard close_lock(mu_);
      delete p;
      live_.erase(key);
      closed_cv_.notify_all();
    });
    live_[key] = shared;
    return shared;
  }

 private:
  std::mutex mu_;
  std::condition_variable closed_cv_;
  std::map<std::string, std::weak_ptr<T>> live_;
};

class OpenedArena final : public CudaArenaView {
 public:
  OpenedArena(void* ptr, int ordinal, uint64_t bytes, uint64_t reserved)
      : ptr_(ptr), ordinal_(ordinal), bytes_(bytes), reserved_(reserved) {}
  ~OpenedArena() override {
    (void)WithDevice(ordinal_, [this] { return EXPERTD_CUDA_STATUS(cudaIpcCloseMemHandle(ptr_)); });
  }
  const void* device_ptr() const override { return ptr_; }
  uint64_t bytes() const override { return bytes_; }
  uint64_t reserved_bytes() const override { return reserved_; }
  absl::Status CopyToHost(uint64_t offset, std::span<uint8_t> out,
                          void* cuda_stream) const override {
    if (offset > reserved_ || out.size() > reserved_ - offset) {
      return InvalidError(ErrorKind::kOutOfBounds,
                          absl::StrCat("copy of ", out.size(), " bytes at ", offset,
                                       " outside an arena of ", reserved_, " bytes"));
    }
    if (out.empty()) return absl::OkStatus();
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    return WithDevice(ordinal_, [&] {
      RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(
          cudaMemcpyAsync(out.data(), static_cast<const uint8_t*>(ptr_) + offset, out.size(),
                          cudaMemcpyDeviceToHost, stream)));
      return EXPERTD_CUDA_STATUS(cudaStreamSynchronize(stream));
    });
  }

 private:
  void* ptr_;
  int ordinal_;
  uint64_t bytes_;
  uint64_t reserved_;
};

class OpenedEvents final : public CudaSessionEvents {
 public:
  OpenedEvents(int ordinal, std::vector<EventOwner> ready, std::vector<EventOwner> done)
      : ordinal_(ordinal),
        ready_(std::move(ready)),
        done_(std::move(done)),
        recorded_(done_.size(), false),
        gens_(static_cast<uint32_t>(ready_.size())) {}
  ~OpenedEvents() override {
    // IPC-opened events are released with cudaEventDestroy, on their device. A done event whose
    // latest record is still pending is waited for first: destroying the event that made the
    // latest record can leave the daemon's view of it pending for good.
    (void)WithDevice(ordinal_, [this] {
      for (size_t i = 0; i < done_.size(); ++i) {
        if (recorded_[i]) (void)cudaEventSynchronize(done_[i].get());
      }
      ready_.clear();
      done_.clear();
      return absl::OkStatus();
    });
  }

  uint32_t size() const override { return static_cast<uint32_t>(ready_.size()); }

  absl::Status WaitReady(SlotId slot, uint64_t generation, void* cuda_stream) override {
    {
      std::lock_guard lock(mu_);
      RETURN_IF_ERROR(gens_.OnWaitReady(slot, generation));
    }
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    return WithDevice(ordinal_, [&] {
      return EXPERTD_CUDA_STATUS(cudaStreamWaitEvent(stream, ready_[slot].get(), 0));
    });
  }

  absl::Status RecordDone(SlotId slot, uint64_t generation, void* cuda_stream) override {
    // Held across wait + record: two threads recording the same slot on different streams must
    // not both chain on the same older record.
    std::lock_guard lock(mu_);
    RETURN_IF_ERROR(gens_.OnRecordDone(slot, generation));
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    cudaEvent_t done = done_[slot].get();
    return WithDevice(ordinal_, [&] {
      RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaStreamWaitEvent(stream, done, 0)));
      RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaEventRecord(done, stream)));
      recorded_[slot] = true;
      return absl::OkStatus();
    });
  }

 private:
  const int ordinal_;
  std::vector<EventOwner> ready_;
  std::vector<EventOwner> done_;
  std::vector<bool> recorded_;  // done_[i] was recorded at least once (guarded by mu_)
  std::mutex mu_;
  ClientGenerations gens_;
};

// Never destroyed: a cache that outlived static destruction order would be worse than a leak of
// two maps at exit (the CUDA resources themselves are owned by the shared objects).
OpenCache<const CudaArenaView>& ArenaCache() {
  static auto* cache = new OpenCache<const CudaArenaView>();
  return *cache;
}
OpenCache<CudaSessionEvents>& EventCache() {
  static auto* cache = new OpenCache<CudaSessionEvents>();
  return *cache;
}

absl::StatusOr<EventOwner> OpenEvent(const IpcHandleBytes& bytes) {
  cudaIpcEventHandle_t h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaIpcOpenEventHandle(&event, h)));
  return EventOwner(event);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CudaArenaView>> OpenArena(const ArenaExport& descriptor,
                                                               int device_ordinal) {
  RETURN_IF_ERROR(CheckArenaExport(descriptor));
  const std::string key = absl::StrCat(device_ordinal, ":", descriptor.handle.ipc_handle);
  ASSIGN_OR_RETURN(
      std::shared_ptr<const CudaArenaView> view,
      ArenaCache().Get(key, [&]() -> absl::StatusOr<std::unique_ptr<const CudaArenaView>> {
        cudaIpcMemHandle_t h{};
        const IpcHandleBytes bytes = ArenaHandleOf(descriptor);
        std::memcpy(&h, bytes.data(), sizeof(h));
        void* ptr = nullptr;
        RETURN_IF_ERROR(Annotate(WithDevice(device_ordinal,
                                            [&] {
                                              return EXPERTD_CUDA_STATUS(cudaIpcOpenMemHandle(
                                                  &ptr, h, cudaIpcMemLazyEnablePeerAccess));
                                            }),
                                 absl::StrCat("opening arena '", descriptor.label,
                                              "' of daemon pid ", descriptor.handle.owner_pid)));
        return std::make_unique<OpenedArena>(ptr, device_ordinal, descriptor.bytes,
                                             descriptor.reserved_bytes);
      }));
  if (view->bytes() != descriptor.bytes || view->reserved_bytes() != descriptor.reserved_bytes) {
    return InvalidError(
        ErrorKind::kBadValue,
        absl::StrCat("arena '", descriptor.label, "' is open here with ", view->bytes(),
                     " bytes; the descriptor says ", descriptor.bytes));
  }
  return view;
}

absl::StatusOr<std::shared_ptr<CudaSessionEvents>> OpenEvents(const FenceExport& descriptor,
                                                              int device_ordinal) {
  RETURN_IF_ERROR(CheckFenceExport(descriptor));
  const std::string key = absl::StrCat(device_ordinal, ":", descriptor.handle.ipc_handle);
  return EventCache().Get(key, [&]() -> absl::StatusOr<std::unique_ptr<CudaSessionEvents>> {
    std::vector<EventOwner> ready;
    std::vector<EventOwner> done;
    const absl::Status st = WithDevice(device_ordinal, [&]() -> absl::Status {
      for (uint32_t i = 0; i < descriptor.n_slots; ++i) {
        ASSIGN_OR_RETURN(EventOwner r, OpenEvent(ReadyHandleOf(descriptor, i)));
        ready.push_back(std::move(r));
        ASSIGN_OR_RETURN(EventOwner d, OpenEvent(DoneHandleOf(descriptor, i)));
        done.push_back(std::move(d));
      }
      return absl::OkStatus();
    });
    if (!st.ok()) {
      (void)WithDevice(device_ordinal, [&] {
        ready.clear();
        done.clear();
        return absl::OkStatus();
      });
      return Annotate(
          st, absl::StrCat("opening the events of daemon pid ", descriptor.handle.owner_pid));
    }
    return std::make_unique<OpenedEvents>(device_ordinal, std::move(ready), std::move(done));
  });
}

}  // namespace expertd::cuda
