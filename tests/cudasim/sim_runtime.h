// The CUDA simulator's state (see cudasim.h): devices, memory, streams and events of one
// process. sim_api.cpp maps the CUDA runtime's C functions onto it.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

namespace expertd::cudasim {

struct Config {
  int devices = 1;           // physical devices
  std::vector<int> visible;  // this process's ordinal -> physical device (CUDA_VISIBLE_DEVICES)
  uint64_t memory_bytes = uint64_t{8} << 30;
  uint64_t copy_delay_us = 0;
  int64_t fail_after_copies = -1;  // < 0: never
  bool pageable_h2d_is_error = false;
  bool read_only_register = false;  // cudaDevAttrHostRegisterReadOnlySupported
};

// Read from the environment once, on first use (and announced on stderr).
const Config& Cfg();

// A stream: a worker thread running its operations in order.
class Stream {
 public:
  // Starts the worker thread, which holds the stream until Close() and an empty queue.
  static std::shared_ptr<Stream> Start(int device, bool blocking, bool legacy);
  // `device` is the physical device (as everywhere inside the simulator; ordinals are the
  // API's).
  Stream(int device, bool blocking, bool legacy)
      : device_(device), blocking_(blocking), legacy_(legacy) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  bool blocking() const { return blocking_; }
  bool legacy() const { return legacy_; }
  uint64_t enqueued() const;
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }

  // Queues `op` after everything queued before it; returns its position (1-based).
  uint64_t Push(std::function<void()> op);
  // Blocks until the operation at `position` finished (or the context failed).
  void WaitFor(uint64_t position);
  // Stops the worker once the queue is empty; the thread ends on its own.
  void Close();

 private:
  void Run();

  const int device_;
  const bool blocking_;
  const bool legacy_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> ops_;
  uint64_t enqueued_ = 0;
  std::atomic<uint64_t> completed_{0};
  bool closing_ = false;
};

// An event's state, in the process-shared pool: `recorded` counts cudaEventRecord calls (the
// sequence number of the latest), `completed` is the highest sequence whose stream reached it.
struct EventState {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
  uint64_t magic = 0;
  // Set by a recording process whose context was destroyed with this event's latest record
  // pending: queries answer it (a client-owned failure, not the querying process's).
  std::atomic<int32_t> error{0};
  int32_t unused = 0;
  uint64_t pad[4] = {};
};
static_assert(sizeof(EventState) == 64);

struct Event {
  EventState* state = nullptr;
  int device = 0;  // physical
  unsigned flags = 0;
  bool imported = false;
  uint32_t index = 0;  // in its pool
  std::tuple<pid_t, int, uint32_t> origin{};  // imported: (exporter pid, pool fd, index)
};

struct Allocation {
  uint64_t bytes = 0;
  uint8_t* shadow = nullptr;  // the simulator's read-write mapping
  int device = 0;             // physical: where the memory lives
  uint32_t opens = 0;         // imported: cudaIpcOpenMemHandle calls not yet closed
  int fd = -1;
  bool imported = false;
  pid_t owner_pid = 0;
  uint64_t key = 0;  // unique per exporter process
};

struct HostRange {
  uint64_t bytes = 0;
  bool allocated = false;  // cudaHostAlloc'd (else cudaHostRegister'd)
};

// Everything of this process, behind one mutex (never held while waiting on a stream).
class Runtime {
 public:
  static Runtime& Get();

  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;  // by device base address
  std::map<uintptr_t, HostRange> host;          // pinned host ranges by start
  std::map<Stream*, std::shared_ptr<Stream>> streams;
  std::set<Event*> events;
  uint32_t ipc_events_live = 0;  // created here with cudaEventInterprocess, not destroyed
  std::vector<std::shared_ptr<Stream>> legacy;               // per device, created on first use
  std::vector<uint64_t> device_used;                         // bytes allocated per device
  std::map<std::pair<pid_t, uint64_t>, uintptr_t> imported;  // (exporter, key) -> base
  std::set<std::tuple<pid_t, int, uint32_t>> imported_events;  // open IPC event handles
  std::set<EventState*> recorded_here;  // events this process recorded (for AbandonContext)
  uint32_t contexts = 0;        // bit per physical device: its primary context was created
  uint32_t peer_mappings = 0;   // IPC memory of another device mapped over the peer link
  uint32_t wrong_device_records = 0;  // cudaEventRecord refused: stream of another device
  std::map<std::pair<pid_t, int>, EventState*> peer_pools;
  int pool_fd = -1;
  EventState* pool = nullptr;
  uint32_t pool_next = 1;  // index 0 is the pool's header
  std::vector<uint32_t> pool_free;
  uint64_t next_key = 1;

  // The stream a handle names (null and cudaStreamLegacy/PerThread: the current device's
  // legacy stream); null when it is not a live stream.
  std::shared_ptr<Stream> Resolve(cudaStream_t handle);
  std::shared_ptr<Stream> Legacy(int device);  // mu held
  // Device memory: the simulator's view of [p, p + n) when inside one allocation (mu held).
  uint8_t* Shadow(const void* p, uint64_t n, int* device = nullptr);
  bool Pinned(const void* p, uint64_t n);  // mu held
  // Queues `op` on `stream` after the legacy stream's implicit synchronisation.
  uint64_t Enqueue(const std::shared_ptr<Stream>& stream, std::function<void()> op);
  // Waits until every stream of `device` finished what was queued so far.
  void SyncDevice(int device);
  EventState* NewEventState(uint32_t* index);  // mu held; null when the pool is full
  void FreeEventState(uint32_t index);         // mu held
};

// The calling thread's current context: an ordinal, or -1 while the thread never chose one
// (cudaGetDevice then answers 0 without creating anything; a call that needs a context makes
// device 0's primary context current, as CUDA's runtime does).
thread_local inline int t_device = -1;
thread_local inline cudaError_t t_last_error = cudaSuccess;
inline std::atomic<int> g_sticky{0};  // a sticky error: every call returns it from then on
inline std::atomic<uint64_t> g_copies{0};

// Records `e` as the calling thread's last error and returns it.
inline cudaError_t Fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

// Every C function starts here: the configuration is read, and a failed context answers its
// sticky error.
#define SIM_ENTER()                                                                       \
  do {                                                                                    \
    (void)::expertd::cudasim::Cfg();                                                      \
    if (const int sticky_ = ::expertd::cudasim::g_sticky.load(std::memory_order_acquire); \
        sticky_ != 0)                                                                     \
      return ::expertd::cudasim::Fail(static_cast<cudaError_t>(sticky_));                 \
  } while (0)

inline Runtime& R() { return Runtime::Get(); }

// The physical device behind this process's `ordinal` (valid ordinals only).
int Physical(int ordinal);
// The ordinal of the calling thread's current context, creating device 0's primary context
// when the thread has none (counted in Runtime::contexts).
int CurrentOrdinal();
// Its physical device.
inline int CurrentPhysical() { return Physical(CurrentOrdinal()); }
// Marks the primary context of `ordinal` as created in this process.
void NoteContext(int ordinal);

// Opens another process's fd through /proc (IPC handles name the exporter's pid and fd); -1
// when that process or fd is gone.
int OpenPeerFd(pid_t pid, int fd);

// The driver's stream memory operations (cudaGetDriverEntryPointByVersion hands them out):
// 64-bit waits (CU_STREAM_WAIT_VALUE_GEQ/EQ/AND/NOR) and writes on a stream, at an address of
// registered (cudaHostRegister) or pinned host memory, or of device memory.
CUresult StreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned flags);
CUresult StreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned flags);

// Polls `done` with a growing pause (1 µs .. 200 µs) until it holds or the context failed.
void PollUntil(const std::function<bool()>& done);
// The configured delay of a copy or kernel, plus `extra_ns`.
void OperationDelay(uint64_t extra_ns);
// Counts a copy; false (and the context failed for good) when the configured failure is due.
bool CountCopy();
// The handle layout shared by memory and event handles (64 bytes).
struct HandleBytes {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t key;    // memory: allocation key; event: pool index
  uint64_t bytes;  // memory: allocation size
  int32_t device;  // memory: the physical device it lives on
  char unused[28];
};
static_assert(sizeof(HandleBytes) == 64);
constexpr char kMemoryMagic[8] = {'X', 'D', 'S', 'I', 'M', 'M', 'E', 'M'};
constexpr char kEventMagic[8] = {'X', 'D', 'S', 'I', 'M', 'E', 'V', 'T'};
constexpr uint32_t kPoolEvents = uint32_t{1} << 20;  // 64 MiB of address space, touched lazily
// IPC events one process may have at once: an NVIDIA H200 with CUDA 13 refuses the 4097th
// cudaEventCreateWithFlags(cudaEventInterprocess) with cudaErrorMemoryAllocation, whatever other
// processes hold and however many events this one opened (tests/gpu/ipc_event_limit).
constexpr uint32_t kIpcEventLimit = 4096;
constexpr uint64_t kHeaderBytes = 4096;              // before each allocation's bytes

}  // namespace expertd::cudasim
