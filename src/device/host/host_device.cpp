// The host device (shared-memory arenas and fences, copy threads) and its client-side mapping.
#include "device/host/host_device.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {
namespace {

using host_device_internal::FenceWords;

// Fences live in memory several processes map at different addresses: only lock-free atomics
// are address-free (they do not depend on a per-process lock table).
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

// ---- Errors and OS resource owners ----------------------------------------------------------

absl::Status SysError(std::string_view call, std::string_view object, int err) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (err == ENOENT) code = absl::StatusCode::kNotFound;
  if (err == EACCES || err == EPERM) code = absl::StatusCode::kPermissionDenied;
  if (err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE) {
    code = absl::StatusCode::kResourceExhausted;
  }
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof(buf));  // GNU: thread-safe, returns the text
  return MakeError(code, ErrorKind::kIo, absl::StrCat(AV(call), "(", AV(object), "): ", text));
}

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Unlinks a shm_open name when destroyed (clients that mapped it keep their pages).
class ShmName {
 public:
  explicit ShmName(std::string name = {}) : name_(std::move(name)) {}
  ShmName(ShmName&& o) noexcept : name_(std::exchange(o.name_, {})) {}
  ShmName& operator=(ShmName&& o) noexcept {
    std::swap(name_, o.name_);
    return *this;
  }
  ~ShmName() {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
  }
  const std::string& get() const { return name_; }

 private:
  std::string name_;
};

absl::StatusOr<ShmMapping> MapFd(int fd, uint64_t offset, uint64_t bytes, int prot,
                                 std::string_view what) {
  void* addr = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (addr == MAP_FAILED) return SysError("mmap", what, errno);
  return ShmMapping(addr, bytes);
}

uint64_t PageSize() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

uint64_t PhysicalMemory() { return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * PageSize(); }

// Names are unique per process: "/<prefix>-<pid>-<n>".
std::atomic<uint64_t> g_shm_serial{0};

// A shared-memory object created by the daemon, mapped read-write, zero-filled.
class SharedMemory {
 public:
  static absl::StatusOr<SharedMemory> Create(const HostDeviceOptions& options,
                                             std::string_view label, uint64_t bytes) {
    SharedMemory m;
    std::string what;
    if (options.backing == HostDeviceOptions::Backing::kShmOpen) {
      what = absl::StrCat("/", options.shm_prefix, "-", ::getpid(), "-", g_shm_serial++);
      m.fd_ = UniqueFd(::shm_open(what.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (m.fd_.get() < 0) return SysError("shm_open", what, errno);
      m.name_ = ShmName(what);
      // shm_open's mode is filtered by the umask; the configured mode is what the operator wants.
      if (::fchmod(m.fd_.get(), options.shm_mode) != 0) return SysError("fchmod", what, errno);
    } else {
      const std::string name = absl::StrCat(options.shm_prefix, ":", AV(label)).substr(0, 240);
      what = absl::StrCat("memfd:", name);
      m.fd_ = UniqueFd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
      if (m.fd_.get() < 0) return SysError("memfd_create", what, errno);
    }
    if (::ftruncate(m.fd_.get(), static_cast<off_t>(bytes)) != 0) {
      return SysError("ftruncate", absl::StrCat(what, ", ", bytes, " bytes"), errno);
    }
    // Reserve the pages now: tmpfs is sparse, and touching a page it cannot back later would be
    // SIGBUS in the copy thread (or in a client) instead of an error here.
    if (const int err = ::posix_fallocate(m.fd_.get(), 0, static_cast<off_t>(bytes));
        err != 0 && err != EOPNOTSUPP && err != EINVAL) {
      return SysError("posix_fallocate", absl::StrCat(what, ", ", bytes, " bytes"), err);
    }
    if (options.backing == HostDeviceOptions::Backing::kMemfd &&
        ::fcntl(m.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return SysError("fcntl(F_ADD_SEALS)", what, errno);
    }
    struct stat st {};
    if (::fstat(m.fd_.get(), &st) != 0) return SysError("fstat", what, errno);
    m.dev_ = st.st_dev;
    m.inode_ = st.st_ino;
    ASSIGN_OR_RETURN(m.map_, MapFd(m.fd_.get(), 0, bytes, PROT_READ | PROT_WRITE, what));
    return m;
  }

  uint8_t* data() const { return map_.data(); }
  SharedHandle Handle() const {
    SharedHandle h;
    h.kind = SharedHandle::Kind::kHostShm;
    h.shm_name = name_.get();
    h.fd = fd_.get();
    h.owner_pid = ::getpid();
    h.dev = dev_;
    h.inode = inode_;
    return h;
  }

 private:
  SharedMemory() = default;
  // Destroyed in reverse: unmap, close, unlink.
  ShmName name_;
  UniqueFd fd_;
  ShmMapping map_;
  uint64_t dev_ = 0;
  uint64_t inode_ = 0;
};

// Opens what a SharedHandle names, for a client: the shm name, else the exporter's descriptor
// through /proc (same user, or ptrace-read access).
absl::StatusOr<UniqueFd> OpenShared(const SharedHandle& h, bool writable, std::string* what) {
  if (h.kind != SharedHandle::Kind::kHostShm) {
    return InvalidError(ErrorKind::kBadValue, "not a host shared-memory handle");
  }
  const int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  UniqueFd fd;
  if (!h.shm_name.empty()) {
    *what = h.shm_name;
    fd = UniqueFd(::shm_open(h.shm_name.c_str(), flags, 0));
    if (fd.get() < 0) return SysError("shm_open", *what, errno);
  } else if (h.fd >= 0 && h.owner_pid > 0) {
    *what = absl::StrCat("/proc/", h.owner_pid, "/fd/", h.fd);
    fd = UniqueFd(::open(what->c_str(), flags));
    if (fd.get() < 0) return SysError("open", *what, errno);
  } else {
    return InvalidError(ErrorKind::kBadValue, "shared handle has neither a name nor a descriptor");
  }
  return fd;
}

// Checks that `fd` is the object `h` describes and holds at least `need` bytes.
absl::Status CheckObject(int fd, const SharedHandle& h, uint64_t need, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SysError("fstat", what, errno);
  if ((h.inode != 0 || h.dev != 0) && (st.st_dev != h.dev || st.st_ino != h.inode)) {
    return MakeError(absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                     absl::StrCat("shared object ", what, " is no longer the one exported (inode ",
                                  st.st_ino, ", expected ", h.inode, ")"));
  }
  if (static_cast<uint64_t>(st.st_size) < need) {
    return InvalidError(ErrorKind::kOutOfBounds,
                        absl::StrCat("shared object ", what, " has ", st.st_size,
                                     " bytes; its descriptor says ", need));
  }
  return absl::OkStatus();
}

// ---- Fence words: layout, advancing, waiting -------------------------------------------------

// Segment layout. Part 1 [0, done_offset): header, ready[n] at 64 — written only by the daemon,
// mapped read-only by clients. Part 2 [done_offset, segment_bytes): ready_waiters at +0,
// done_waiters at +64 (own cache lines), done[n] at +128 — written by both.
constexpr uint64_t kFenceMagic = 0x31666e6564707865;  // "expdnf1" little-endian, a format tag
constexpr uint32_t kFenceVersion = 1;
constexpr uint32_t kMaxFenceSlots = 1u << 24;
struct FenceHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n_slots;
  uint64_t done_offset;
  uint64_t segment_bytes;
};
struct FenceLayout {
  uint64_t done_offset;
  uint64_t segment_bytes;
};
FenceLayout LayoutFor(uint32_t n_slots) {
  const uint64_t page = PageSize();
  const uint64_t part1 = *CheckedAlignUp(64 + uint64_t{8} * n_slots, page);
  const uint64_t part2 = *CheckedAlignUp(128 + uint64_t{8} * n_slots, page);
  return {part1, part1 + part2};
}
FenceWords WordsAt(uint8_t* part1, uint8_t* part2, uint32_t n_slots) {
  FenceWords w;
  w.ready = reinterpret_cast<uint64_t*>(part1 + 64);
  w.ready_waiters = reinterpret_cast<uint32_t*>(part2);
  w.done_waiters = reinterpret_cast<uint32_t*>(part2 + 64);
  w.done = reinterpret_cast<uint64_t*>(part2 + 128);
  w.n_slots = n_slots;
  return w;
}

// The futex is the 32-bit half of a counter holding its low bits: it changes on every advance
// (until a 2^32 jump between a waiter's load and its sleep, which generations never make).
uint32_t* FutexWord(uint64_t* counter) {
  return reinterpret_cast<uint32_t*>(counter) + (std::endian::native == std::endian::big ? 1 : 0);
}
// Shared (not FUTEX_PRIVATE) operations: the kernel keys them by the page, so a waiter and a
// waker in different processes meet.
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts = absl::ToTimespec(timeout);
  const bool infinite = timeout == absl::InfiniteDuration();
  if (::syscall(SYS_futex, word, FUTEX_WAIT, expected, infinite ? nullptr : &ts, nullptr, 0) != 0 &&
      errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // no futex: degrade to polling
  }
}
void FutexWakeAll(uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint64_t LoadCounter(const FenceWords& w, uint64_t* array, SlotId slot) {
  if (slot >= w.n_slots) return 0;
  return std::atomic_ref<uint64_t>(array[slot]).load(std::memory_order_acquire);
}

// Raises counter[slot] to `generation` (never lowers it) and wakes waiters if any. The seq_cst
// store and the seq_cst load of the waiter count pair with WaitCounter's seq_cst increment and
// load: either the waiter sees the new value or the advancer sees the waiter.
absl::Status AdvanceCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                            std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  uint64_t current = counter.load(std::memory_order_relaxed);
  do {
    if (generation < current) {
      return absl::FailedPreconditionError(absl::StrCat(AV(what), "[", slot, "] is at ", current,
                                                        "; it cannot go back to ", generation));
    }
    if (generation == current) return absl::OkStatus();
  } while (!counter.compare_exchange_weak(current, generation, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  if (std::atomic_ref<uint32_t>(*waiters).load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(FutexWord(&array[slot]));
  }
  return absl::OkStatus();
}

// Spins up to 20 µs (a copy about to finish is cheaper to watch than to sleep on), then
// registers as a waiter and sleeps on the counter's futex until it reaches `generation`.
absl::Status WaitCounter(uint64_t* array, uint32_t* waiters, SlotId slot, uint64_t generation,
                         absl::Duration timeout, std::string_view what) {
  std::atomic_ref<uint64_t> counter(array[slot]);
  if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + std::min(timeout, absl::Microseconds(20));
  while (absl::Now() < spin_until) {
    for (int i = 0; i < 64; ++i) CpuRelax();
    if (counter.load(std::memory_order_acquire) >= generation) return absl::OkStatus();
  }
  const absl::Time deadline = start + timeout;
  std::atomic_ref<uint32_t> waiting(*waiters);
  waiting.fetch_add(1, std::memory_order_seq_cst);
  absl::Status result;
  for (;;) {
    const uint64_t value = counter.load(std::memory_order_seq_cst);
    if (value >= generation) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      result = absl::DeadlineExceededError(
          absl::StrCat(AV(what), "[", slot, "] is at ", value, " after waiting ",
                       absl::FormatDuration(timeout), " for generation ", generation));
      break;
    }
    FutexWait(FutexWord(&array[slot]), static_cast<uint32_t>(value), left);
  }
  waiting.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

absl::Status CheckSlot(SlotId slot, uint32_t n_slots) {
  if (slot < n_slots) return absl::OkStatus();
  return InvalidError(ErrorKind::kOutOfBounds,
                      absl::StrCat("slot ", slot, " outside a fence table of ", n_slots));
}

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
  absl::Status AdvanceReady(SlotId slot, uint64_t generation) override {
    RETURN_IF_ERROR(CheckSlot(slot, size()));
    return AdvanceCounter(words_.ready, words_.ready_waiters, slot, generation, "ready");
  }
  absl::Status WaitDone(SlotId slot, uint64_t generation, absl::Duration timeout) const override {
    RETURN_IF_ERROR(CheckSlot(slot, size()));
    return WaitCounter(words_.done, words_.done_waiters, slot, generation, timeout, "done");
  }
  absl::StatusOr<FenceExport> Export() const override {
    return FenceExport{memory_.Handle(), size(), layout_.segment_bytes, layout_.done_offset};
  }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  FenceLayout layout_;
  SharedMemory memory_;
  FenceWords words_;
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
    ASSIGN_OR_RETURN(SharedMemory memory, SharedMemory::Create(options_, label, reserved));
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
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED)
      return SysError("mmap", absl::StrCat("staging, ", bytes, " bytes"), errno);
    ShmMapping mapping(addr, bytes);
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
    ASSIGN_OR_RETURN(SharedMemory memory,
                     SharedMemory::Create(options_, "fences", layout.segment_bytes));
    const FenceHeader header{kFenceMagic, kFenceVersion, n_slots, layout.done_offset,
                             layout.segment_bytes};
    std::memcpy(memory.data(), &header, sizeof(header));
    return std::make_unique<HostFenceTable>(this, n_slots, layout, std::move(memory));
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
  caps.registers_host_memory = true;
  caps.copy_engines = options.copy_threads;
  caps.max_arena_bytes = options.max_arena_bytes != 0 ? options.max_arena_bytes : PhysicalMemory();
  caps.max_staging_bytes =
      options.max_staging_bytes != 0 ? options.max_staging_bytes : PhysicalMemory();
  return std::make_unique<HostDevice>(std::move(options), caps);
}

ShmMapping::ShmMapping(ShmMapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& other) noexcept {
  std::swap(addr_, other.addr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

ShmMapping::~ShmMapping() {
  if (addr_ != nullptr) ::munmap(addr_, bytes_);
}

absl::StatusOr<MappedArena> MapArena(const ArenaExport& descriptor) {
  if (descriptor.reserved_bytes == 0 || descriptor.reserved_bytes % kArenaAlignment != 0 ||
      descriptor.bytes == 0 || descriptor.bytes > descriptor.reserved_bytes) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("arena descriptor '", descriptor.label,
                                                           "' with ", descriptor.bytes, " of ",
                                                           descriptor.reserved_bytes, " bytes"));
  }
  std::string what;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenShared(descriptor.handle, /*writable=*/false, &what));
  RETURN_IF_ERROR(CheckObject(fd.get(), descriptor.handle, descriptor.reserved_bytes, what));
  ASSIGN_OR_RETURN(ShmMapping map, MapFd(fd.get(), 0, descriptor.reserved_bytes, PROT_READ, what));
  return MappedArena(std::move(map), descriptor.bytes);
}

absl::StatusOr<MappedFences> MapFences(const FenceExport& descriptor) {
  if (descriptor.n_slots == 0 || descriptor.n_slots > kMaxFenceSlots) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor with ", descriptor.n_slots, " slots"));
  }
  const FenceLayout layout = LayoutFor(descriptor.n_slots);
  if (descriptor.done_offset != layout.done_offset ||
      descriptor.segment_bytes != layout.segment_bytes) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence descriptor layout ", descriptor.done_offset, "/",
                                     descriptor.segment_bytes, " differs from ", layout.done_offset,
                                     "/", layout.segment_bytes));
  }
  std::string what;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenShared(descriptor.handle, /*writable=*/true, &what));
  RETURN_IF_ERROR(CheckObject(fd.get(), descriptor.handle, layout.segment_bytes, what));
  ASSIGN_OR_RETURN(ShmMapping part1, MapFd(fd.get(), 0, layout.done_offset, PROT_READ, what));
  ASSIGN_OR_RETURN(ShmMapping part2,
                   MapFd(fd.get(), layout.done_offset, layout.segment_bytes - layout.done_offset,
                         PROT_READ | PROT_WRITE, what));
  FenceHeader header;
  std::memcpy(&header, part1.data(), sizeof(header));
  if (header.magic != kFenceMagic || header.version != kFenceVersion ||
      header.n_slots != descriptor.n_slots || header.done_offset != layout.done_offset) {
    return InvalidError(ErrorKind::kBadMagic,
                        absl::StrCat("shared object ", what, " is not a fence table of ",
                                     descriptor.n_slots, " slots"));
  }
  const FenceWords words = WordsAt(part1.data(), part2.data(), descriptor.n_slots);
  return MappedFences(std::move(part1), std::move(part2), words);
}

uint64_t MappedFences::ready(SlotId slot) const { return LoadCounter(words_, words_.ready, slot); }
uint64_t MappedFences::done(SlotId slot) const { return LoadCounter(words_, words_.done, slot); }

absl::Status MappedFences::WaitReady(SlotId slot, uint64_t generation,
                                     absl::Duration timeout) const {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  return WaitCounter(words_.ready, words_.ready_waiters, slot, generation, timeout, "ready");
}

absl::Status MappedFences::SignalDone(SlotId slot, uint64_t generation) {
  RETURN_IF_ERROR(CheckSlot(slot, size()));
  if (const uint64_t ready_now = ready(slot); generation > ready_now) {
    return absl::FailedPreconditionError(
        absl::StrCat("done[", slot, "] = ", generation, " but ready is only at ", ready_now));
  }
  return AdvanceCounter(words_.done, words_.done_waiters, slot, generation, "done");
}

}  // namespace expertd
