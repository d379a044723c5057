// Client side of the CUDA backend: IPC-opened arenas and session events (see cuda_client.h and
// device/cuda_factory.h for the contracts).
#include "device/cuda/cuda_client.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
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

// The driver's context calls, reached through the runtime (no link against libcuda): the only
// way to tell "this thread has no current context" from "its current device is 0".
struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get = nullptr;
  PFN_cuCtxSetCurrent_v4000 set = nullptr;
  absl::Status status;
};

const ContextCalls& Contexts() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found_get = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult found_set = cudaDriverEntryPointSymbolNotFound;
    c.status = EXPERTD_CUDA_STATUS(cudaGetDriverEntryPointByVersion(
        "cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found_get));
    c.status.Update(EXPERTD_CUDA_STATUS(cudaGetDriverEntryPointByVersion(
        "cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found_set)));
    if (c.status.ok() && (found_get != cudaDriverEntryPointSuccess ||
                          found_set != cudaDriverEntryPointSuccess)) {
      c.status = absl::UnavailableError("the CUDA driver has no cuCtxGetCurrent/cuCtxSetCurrent");
    }
    c.get = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
    c.set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
    return c;
  }();
  return calls;
}

// Runs `f` with `ordinal` as the calling thread's current device, then puts back exactly the
// context the thread had — none included: the engine's threads have their own current device
// and must not find it changed, and restoring "device 0" on a thread that never chose one
// would create a primary context on GPU 0 in every client (and fail on an exclusive-process
// GPU 0).
absl::Status WithDevice(int ordinal, absl::FunctionRef<absl::Status()> f) {
  const ContextCalls& calls = Contexts();
  RETURN_IF_ERROR(calls.status);
  CUcontext previous = nullptr;
  if (const CUresult r = calls.get(&previous); r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuCtxGetCurrent failed: CUresult ", r));
  }
  RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaSetDevice(ordinal)));
  absl::Status st = f();
  if (const CUresult r = calls.set(previous); r != CUDA_SUCCESS) {
    st.Update(absl::InternalError(absl::StrCat("cuCtxSetCurrent failed: CUresult ", r)));
  }
  return st;
}

// `stream` (nullptr: the legacy stream of the current device) must belong to `ordinal`: an
// event of one device cannot be recorded on another's stream, and a wait across devices would
// order nothing the caller meant.
absl::Status CheckStreamDevice(void* stream, int ordinal) {
  int device = -1;
  RETURN_IF_ERROR(
      EXPERTD_CUDA_STATUS(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device)));
  if (device == ordinal) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the stream belongs to cuda:", device, " in this process, but the session's "
                   "GPU is cuda:", ordinal, " here: queue the kernels that read its slots on a "
                   "stream of that GPU"));
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

// One IPC event opened in this process. CUDA documents reference-counted re-opening for memory
// handles only, so each event handle is opened once per process (SharedEvent) however many
// sessions name it — the ready events of a slot class are the same for every session — and
// destroyed, on its device, with the last reference.
class OpenedEvent {
 public:
  OpenedEvent(cudaEvent_t event, int ordinal) : event_(event), ordinal_(ordinal) {}
  ~OpenedEvent() {
    (void)WithDevice(ordinal_, [this] { return EXPERTD_CUDA_STATUS(cudaEventDestroy(event_)); });
  }
  OpenedEvent(const OpenedEvent&) = delete;
  OpenedEvent& operator=(const OpenedEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
  int ordinal_;
};
using SharedEvent = std::shared_ptr<const OpenedEvent>;

class OpenedEvents final : public CudaSessionEvents {
 public:
  OpenedEvents(int ordinal, std::vector<SharedEvent> ready, std::vector<SharedEvent> done)
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
        if (recorded_[i]) (void)cudaEventSynchronize(done_[i]->get());
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
      RETURN_IF_ERROR(CheckStreamDevice(cuda_stream, ordinal_));
      return EXPERTD_CUDA_STATUS(cudaStreamWaitEvent(stream, ready_[slot]->get(), 0));
    });
  }

  absl::Status WaitReadyOnHost(SlotId slot, uint64_t generation) override {
    {
      std::lock_guard lock(mu_);
      RETURN_IF_ERROR(gens_.OnWaitReady(slot, generation));
    }
    return WithDevice(ordinal_, [&] {
      return EXPERTD_CUDA_STATUS(cudaEventSynchronize(ready_[slot]->get()));
    });
  }

  absl::Status RecordDone(SlotId slot, uint64_t generation, void* cuda_stream) override {
    // Held across wait + record: two threads recording the same slot on different streams must
    // not both chain on the same older record.
    std::lock_guard lock(mu_);
    RETURN_IF_ERROR(gens_.OnRecordDone(slot, generation));
    auto stream = static_cast<cudaStream_t>(cuda_stream);
    cudaEvent_t done = done_[slot]->get();
    return WithDevice(ordinal_, [&] {
      RETURN_IF_ERROR(CheckStreamDevice(cuda_stream, ordinal_));
      RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaStreamWaitEvent(stream, done, 0)));
      RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaEventRecord(done, stream)));
      recorded_[slot] = true;
      return absl::OkStatus();
    });
  }

 private:
  const int ordinal_;
  std::vector<SharedEvent> ready_;
  std::vector<SharedEvent> done_;
  std::vector<bool> recorded_;  // done_[i] was recorded at least once (guarded by mu_)
  std::mutex mu_;
  ClientGenerations gens_;
};

class StreamMark final : public CudaStreamMark {
 public:
  StreamMark(cudaEvent_t event, int ordinal) : event_(event), ordinal_(ordinal) {}
  ~StreamMark() override {
    (void)WithDevice(ordinal_, [this] { return EXPERTD_CUDA_STATUS(cudaEventDestroy(event_)); });
  }
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;

  absl::Status Record(void* cuda_stream) override {
    return WithDevice(ordinal_, [&] {
      RETURN_IF_ERROR(CheckStreamDevice(cuda_stream, ordinal_));
      return EXPERTD_CUDA_STATUS(cudaEventRecord(event_, static_cast<cudaStream_t>(cuda_stream)));
    });
  }

  absl::StatusOr<bool> Done() override {
    bool done = false;
    RETURN_IF_ERROR(WithDevice(ordinal_, [&] {
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaErrorNotReady) return absl::OkStatus();
      done = true;
      return EXPERTD_CUDA_STATUS(q);
    }));
    return done;
  }

 private:
  cudaEvent_t event_;
  int ordinal_;
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
OpenCache<const OpenedEvent>& SingleEventCache() {
  static auto* cache = new OpenCache<const OpenedEvent>();
  return *cache;
}

// With `ordinal` current on the calling thread.
absl::StatusOr<SharedEvent> OpenEvent(const IpcHandleBytes& bytes, int ordinal) {
  const std::string key =
      absl::StrCat(ordinal, ":", absl::string_view(bytes.data(), bytes.size()));
  return SingleEventCache().Get(key, [&]() -> absl::StatusOr<std::unique_ptr<const OpenedEvent>> {
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, bytes.data(), sizeof(h));
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaIpcOpenEventHandle(&event, h)));
    return std::make_unique<const OpenedEvent>(event, ordinal);
  });
}

}  // namespace

absl::Status CheckStream(void* cuda_stream, int device_ordinal) {
  return WithDevice(device_ordinal, [&] { return CheckStreamDevice(cuda_stream, device_ordinal); });
}

absl::StatusOr<std::unique_ptr<CudaStreamMark>> MakeStreamMark(int device_ordinal) {
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(WithDevice(device_ordinal, [&] {
    return EXPERTD_CUDA_STATUS(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }));
  return std::make_unique<StreamMark>(event, device_ordinal);
}

absl::StatusOr<std::string> DeviceUuid(int ordinal) {
  cudaDeviceProp props{};
  RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaGetDeviceProperties(&props, ordinal)));
  std::array<uint8_t, 16> bytes{};
  std::memcpy(bytes.data(), props.uuid.bytes, bytes.size());
  return FormatGpuUuid(bytes);
}

absl::StatusOr<int> ResolveDevice(std::string_view uuid, int requested) {
  int count = 0;
  RETURN_IF_ERROR(EXPERTD_CUDA_STATUS(cudaGetDeviceCount(&count)));
  int found = -1;
  for (int i = 0; i < count && found < 0; ++i) {
    ASSIGN_OR_RETURN(const std::string id, DeviceUuid(i));
    if (id == uuid) found = i;
  }
  const std::string seen =
      absl::StrCat(count, " GPU(s) visible here; CUDA_VISIBLE_DEVICES decides which");
  if (found < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon's GPU ", AV(uuid), " is not visible to this process (", seen,
        "): the client must see the GPU whose memory it reads"));
  }
  if (requested >= 0 && requested != found) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda_device ", requested, " is not the daemon's GPU ", AV(uuid), ", which is cuda:",
        found, " in this process (", seen, ")"));
  }
  return found;
}

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
    std::vector<SharedEvent> ready;
    std::vector<SharedEvent> done;
    const absl::Status st = WithDevice(device_ordinal, [&]() -> absl::Status {
      for (uint32_t i = 0; i < descriptor.n_slots; ++i) {
        ASSIGN_OR_RETURN(SharedEvent r, OpenEvent(ReadyHandleOf(descriptor, i), device_ordinal));
        ready.push_back(std::move(r));
        ASSIGN_OR_RETURN(SharedEvent d, OpenEvent(DoneHandleOf(descriptor, i), device_ordinal));
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
