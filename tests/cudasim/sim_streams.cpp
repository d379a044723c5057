// The CUDA simulator's streams, copies and events (the C functions; see sim_api.cpp).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "sim_runtime.h"

using expertd::cudasim::Cfg;
using expertd::cudasim::CurrentOrdinal;
using expertd::cudasim::CurrentPhysical;
using expertd::cudasim::Event;
using expertd::cudasim::EventState;
using expertd::cudasim::Fail;
using expertd::cudasim::g_sticky;
using expertd::cudasim::HandleBytes;
using expertd::cudasim::kEventMagic;
using expertd::cudasim::kIpcEventLimit;
using expertd::cudasim::kPoolEvents;
using expertd::cudasim::OpenPeerFd;
using expertd::cudasim::R;
using expertd::cudasim::Stream;
using expertd::cudasim::t_device;

namespace {

Event* LiveEvent(cudaEvent_t e) {
  auto* ev = reinterpret_cast<Event*>(e);
  std::lock_guard lock(R().mu);
  return R().events.contains(ev) ? ev : nullptr;
}

bool EventComplete(const EventState* st) {
  return st->completed.load(std::memory_order_acquire) >=
         st->recorded.load(std::memory_order_acquire);
}

void MarkComplete(EventState* st, uint64_t seq) {
  uint64_t c = st->completed.load(std::memory_order_acquire);
  while (c < seq && !st->completed.compare_exchange_weak(c, seq)) {
  }
}

// A copy's or memset's two sides: device ranges resolved to the shadow, host ranges as given.
cudaError_t Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream,
                 bool synchronous) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  uint8_t* d_shadow = nullptr;
  const uint8_t* s_shadow = nullptr;
  bool src_pinned = false;
  bool dst_pinned = false;
  {
    std::lock_guard lock(R().mu);
    d_shadow = R().Shadow(dst, n);
    s_shadow = R().Shadow(src, n);
    src_pinned = R().Pinned(src, n);
    dst_pinned = R().Pinned(dst, n);
  }
  const bool dst_dev = d_shadow != nullptr;
  const bool src_dev = s_shadow != nullptr;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dst_dev && !src_dev;
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_dev && !dst_dev;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = src_dev && dst_dev;
      break;
    case cudaMemcpyHostToHost:
      ok = !src_dev && !dst_dev;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      ok = false;
  }
  if (!ok) {
    std::fprintf(stderr, "expertd cudasim: memcpy kind %d does not match %p -> %p (%zu bytes)\n",
                 static_cast<int>(kind), src, dst, n);
    return Fail(cudaErrorInvalidValue);
  }
  uint8_t* to = dst_dev ? d_shadow : static_cast<uint8_t*>(dst);
  const uint8_t* from = src_dev ? s_shadow : static_cast<const uint8_t*>(src);
  // Pageable host source: CUDA stages it before returning, so the caller may reuse
  // it at once.
  std::shared_ptr<std::vector<uint8_t>> staged;
  if (!src_dev && dst_dev && !src_pinned && !synchronous) {
    if (Cfg().pageable_h2d_is_error) {
      std::fprintf(stderr,
                   "expertd cudasim: async host-to-device copy from pageable "
                   "memory %p (%zu "
                   "bytes): neither cudaHostAlloc'd nor cudaHostRegister'd\n",
                   src, n);
      return Fail(cudaErrorInvalidValue);
    }
    staged = std::make_shared<std::vector<uint8_t>>(from, from + n);
    from = staged->data();
  }
  const uint64_t position = R().Enqueue(s, [to, from, n, staged] {
    expertd::cudasim::OperationDelay(0);
    if (expertd::cudasim::CountCopy()) std::memcpy(to, from, n);
  });
  // Synchronous copies, and async ones into pageable host memory, return once
  // done.
  if (synchronous || (src_dev && !dst_dev && !dst_pinned)) {
    s->WaitFor(position);
    if (const int sticky = g_sticky.load(); sticky != 0)
      return Fail(static_cast<cudaError_t>(sticky));
  }
  return cudaSuccess;
}

cudaError_t Memset(void* dst, int value, size_t n, cudaStream_t stream) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  uint8_t* to = nullptr;
  {
    std::lock_guard lock(R().mu);
    to = R().Shadow(dst, n);
  }
  if (to == nullptr) return Fail(cudaErrorInvalidValue);
  R().Enqueue(s, [to, value, n] { std::memset(to, value, n); });
  return cudaSuccess;
}
}  // namespace

// ---- streams

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int) {
  SIM_ENTER();
  auto s = Stream::Start(CurrentPhysical(), (flags & cudaStreamNonBlocking) == 0,
                         /*legacy=*/false);
  std::lock_guard lock(R().mu);
  R().streams[s.get()] = s;
  *pStream = reinterpret_cast<cudaStream_t>(s.get());
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  SIM_ENTER();
  std::lock_guard lock(R().mu);
  auto it = R().streams.find(reinterpret_cast<Stream*>(stream));
  if (it == R().streams.end()) return Fail(cudaErrorInvalidResourceHandle);
  it->second->Close();  // queued work still runs, as in CUDA
  R().streams.erase(it);
  return cudaSuccess;
}

// The ordinal, in this process, of the device the stream belongs to.
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  const std::vector<int>& visible = Cfg().visible;
  for (size_t i = 0; i < visible.size(); ++i) {
    if (visible[i] == s->device()) {
      *device = static_cast<int>(i);
      return cudaSuccess;
    }
  }
  return Fail(cudaErrorInvalidDevice);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  s->WaitFor(s->enqueued());
  SIM_ENTER();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  return s->completed() >= s->enqueued() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  SIM_ENTER();
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  R().Enqueue(s, [fn, userData] { fn(userData); });
  return cudaSuccess;
}

// ---- copies

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return Copy(dst, src, count, kind, stream, /*synchronous=*/false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return Copy(dst, src, count, kind, cudaStreamLegacy, /*synchronous=*/true);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return Memset(devPtr, value, count, stream);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return Memset(devPtr, value, count, cudaStreamLegacy);
}

// ---- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  SIM_ENTER();
  if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) {
    return Fail(cudaErrorInvalidValue);
  }
  const int device = CurrentPhysical();
  std::lock_guard lock(R().mu);
  if ((flags & cudaEventInterprocess) != 0 && R().ipc_events_live >= kIpcEventLimit) {
    return Fail(cudaErrorMemoryAllocation);
  }
  auto* e = new Event();
  e->state = R().NewEventState(&e->index);
  if (e->state == nullptr) {
    delete e;
    return Fail(cudaErrorMemoryAllocation);
  }
  e->device = device;
  e->flags = flags;
  if ((flags & cudaEventInterprocess) != 0) ++R().ipc_events_live;
  R().events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  SIM_ENTER();
  auto* e = reinterpret_cast<Event*>(event);
  std::lock_guard lock(R().mu);
  if (R().events.erase(e) == 0) return Fail(cudaErrorInvalidResourceHandle);
  if (e->imported) R().imported_events.erase(e->origin);
  if (!e->imported && (e->flags & cudaEventInterprocess) != 0) --R().ipc_events_live;
  // An interprocess event may still be open, or recorded, in other processes, and
  // a pending record still writes its state: such slots are never reused.
  if (!e->imported && (e->flags & cudaEventInterprocess) == 0 && EventComplete(e->state)) {
    R().FreeEventState(e->index);
  }
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  SIM_ENTER();
  Event* e = LiveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  EventState* st = e->state;
  {
    std::lock_guard lock(R().mu);
    // CUDA: the event and the stream must belong to the same device (context).
    if (s->device() != e->device) {
      ++R().wrong_device_records;
      return Fail(cudaErrorInvalidResourceHandle);
    }
    R().recorded_here.insert(st);
  }
  const uint64_t seq = st->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  R().Enqueue(s, [st, seq] { MarkComplete(st, seq); });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  SIM_ENTER();
  Event* e = LiveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (EventComplete(e->state)) return cudaSuccess;
  // The process that made the pending record lost its context: that record never completes,
  // and queries here say so with that process's error (this context is fine).
  if (const int error = e->state->error.load(); error != 0) {
    return Fail(static_cast<cudaError_t>(error));
  }
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  SIM_ENTER();
  Event* e = LiveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  EventState* st = e->state;
  const uint64_t target = st->recorded.load(std::memory_order_acquire);
  expertd::cudasim::PollUntil([st, target] { return st->completed.load() >= target; });
  SIM_ENTER();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  SIM_ENTER();
  Event* e = LiveEvent(event);
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Stream> s = R().Resolve(stream);
  if (!s) return Fail(cudaErrorInvalidResourceHandle);
  EventState* st = e->state;
  // The wait is for the record that is latest now (never recorded: nothing to wait for).
  const uint64_t target = st->recorded.load(std::memory_order_acquire);
  if (st->completed.load(std::memory_order_acquire) >= target) return cudaSuccess;
  R().Enqueue(s, [st, target] {
    expertd::cudasim::PollUntil([st, target] { return st->completed.load() >= target; });
  });
  return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  SIM_ENTER();
  Event* e = LiveEvent(event);
  if (e == nullptr || (e->flags & cudaEventInterprocess) == 0 || e->imported) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  HandleBytes h{};
  std::memcpy(h.magic, kEventMagic, sizeof(h.magic));
  {
    std::lock_guard lock(R().mu);
    h.pid = ::getpid();
    h.fd = R().pool_fd;
  }
  h.key = e->index;
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

// CUDA documents reference-counted re-opening for memory handles only: a second open of an
// event handle that is open in this process is refused, so nothing relies on what CUDA does.
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  SIM_ENTER();
  const int device = CurrentPhysical();
  HandleBytes h{};
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kEventMagic, sizeof(h.magic)) != 0 || h.key == 0 ||
      h.key >= kPoolEvents) {
    return Fail(cudaErrorInvalidValue);
  }
  std::lock_guard lock(R().mu);
  const std::tuple<pid_t, int, uint32_t> origin{h.pid, h.fd, static_cast<uint32_t>(h.key)};
  if (R().imported_events.contains(origin)) {
    std::fprintf(stderr, "expertd cudasim: IPC event handle (pid %d, index %llu) opened twice "
                 "in one process\n", static_cast<int>(h.pid), static_cast<unsigned long long>(h.key));
    return Fail(cudaErrorInvalidValue);
  }
  EventState* pool = nullptr;
  if (h.pid == ::getpid()) {
    pool = R().pool;
  } else if (auto it = R().peer_pools.find({h.pid, h.fd}); it != R().peer_pools.end()) {
    pool = it->second;
  } else {
    const int fd = OpenPeerFd(h.pid, h.fd);
    if (fd < 0) return Fail(cudaErrorInvalidValue);  // the exporter is gone
    const uint64_t bytes = uint64_t{kPoolEvents} * sizeof(EventState);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return Fail(cudaErrorInvalidValue);
    pool = static_cast<EventState*>(p);
    if (std::memcmp(&pool[0].magic, kEventMagic, sizeof(pool[0].magic)) != 0) {
      ::munmap(p, bytes);
      return Fail(cudaErrorInvalidValue);
    }
    R().peer_pools[{h.pid, h.fd}] = pool;  // kept for the process's life
  }
  if (pool == nullptr) return Fail(cudaErrorInvalidValue);
  auto* e = new Event();
  e->state = &pool[h.key];
  e->device = device;  // opened into the current context
  e->flags = cudaEventInterprocess | cudaEventDisableTiming;
  e->imported = true;
  e->index = static_cast<uint32_t>(h.key);
  e->origin = origin;
  R().imported_events.insert(origin);
  R().events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

// ---- stream memory operations (driver entry points)

namespace expertd::cudasim {
namespace {

// The simulator's view of the 8 bytes at `addr`: registered or pinned host memory as it is,
// device memory through its shadow mapping; null when it is neither, or not 8-byte aligned.
std::atomic<uint64_t>* WordAt(CUdeviceptr addr) {
  if (addr % alignof(uint64_t) != 0) return nullptr;
  const auto a = static_cast<uintptr_t>(addr);
  std::lock_guard lock(R().mu);
  auto h = R().host.upper_bound(a);
  if (h != R().host.begin() && a + 8 <= std::prev(h)->first + std::prev(h)->second.bytes) {
    return reinterpret_cast<std::atomic<uint64_t>*>(a);  // NOLINT(performance-no-int-to-ptr)
  }
  auto d = R().allocations.upper_bound(a);
  if (d != R().allocations.begin() && a + 8 <= std::prev(d)->first + std::prev(d)->second.bytes) {
    return reinterpret_cast<std::atomic<uint64_t>*>(std::prev(d)->second.shadow +
                                                    (a - std::prev(d)->first));
  }
  return nullptr;
}

bool WaitHolds(uint64_t now, uint64_t value, unsigned flags) {
  switch (flags & 0x3u) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return static_cast<int64_t>(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return now == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (now & value) != 0;
    default:  // CU_STREAM_WAIT_VALUE_NOR
      return ~(now | value) != 0;
  }
}

}  // namespace

CUresult StreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned flags) {
  if (g_sticky.load() != 0) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::shared_ptr<Stream> s = R().Resolve(reinterpret_cast<cudaStream_t>(stream));
  std::atomic<uint64_t>* word = WordAt(addr);
  if (!s || word == nullptr) return CUDA_ERROR_INVALID_VALUE;
  R().Enqueue(s, [word, value, flags] {
    PollUntil([word, value, flags] { return WaitHolds(word->load(), value, flags); });
  });
  return CUDA_SUCCESS;
}

CUresult StreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned) {
  if (g_sticky.load() != 0) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::shared_ptr<Stream> s = R().Resolve(reinterpret_cast<cudaStream_t>(stream));
  std::atomic<uint64_t>* word = WordAt(addr);
  if (!s || word == nullptr) return CUDA_ERROR_INVALID_VALUE;
  R().Enqueue(s, [word, value] { word->store(value, std::memory_order_release); });
  return CUDA_SUCCESS;
}

}  // namespace expertd::cudasim
