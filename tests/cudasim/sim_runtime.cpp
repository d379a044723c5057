// The CUDA simulator's state: configuration, streams, memory lookup, the event pool.
#include "sim_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace expertd::cudasim {
namespace {

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "expertd cudasim: %s=%s is not a number; using %llu\n", name, v,
                 static_cast<unsigned long long>(fallback));
    return fallback;
  }
  return n;
}

}  // namespace

const Config& Cfg() {
  static const Config config = [] {
    Config c;
    c.devices = static_cast<int>(EnvNumber("EXPERTD_CUDASIM_DEVICES", 1));
    c.memory_bytes = EnvNumber("EXPERTD_CUDASIM_MEMORY_MIB", 8192) << 20;
    c.copy_delay_us = EnvNumber("EXPERTD_CUDASIM_COPY_DELAY_US", 0);
    const char* fail = std::getenv("EXPERTD_CUDASIM_FAIL_AFTER_COPIES");
    c.fail_after_copies =
        fail != nullptr && *fail != '\0'
            ? static_cast<int64_t>(EnvNumber("EXPERTD_CUDASIM_FAIL_AFTER_COPIES", 0))
            : -1;
    const char* pageable = std::getenv("EXPERTD_CUDASIM_PAGEABLE");
    c.pageable_h2d_is_error = pageable != nullptr && std::string(pageable) == "error";
    c.read_only_register = EnvNumber("EXPERTD_CUDASIM_READ_ONLY_REGISTER", 0) != 0;
    // Like CUDA_VISIBLE_DEVICES: the physical devices this process sees, in ordinal order.
    if (const char* v = std::getenv("EXPERTD_CUDASIM_VISIBLE_DEVICES"); v != nullptr && *v) {
      std::string list = v;
      size_t at = 0;
      while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        char* end = nullptr;
        const long d = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || d < 0 || d >= c.devices) break;  // CUDA stops there
        c.visible.push_back(static_cast<int>(d));
        at = comma + 1;
      }
    } else {
      for (int d = 0; d < c.devices; ++d) c.visible.push_back(d);
    }
    std::fprintf(stderr,
                 "expertd cudasim: simulated CUDA runtime, not a GPU (pid %d: %zu of %d device(s) "
                 "visible, %llu MiB each, copy delay %llu us%s)\n",
                 static_cast<int>(::getpid()), c.visible.size(), c.devices,
                 static_cast<unsigned long long>(c.memory_bytes >> 20),
                 static_cast<unsigned long long>(c.copy_delay_us),
                 c.fail_after_copies >= 0 ? ", sticky failure injected" : "");
    return c;
  }();
  return config;
}

int Physical(int ordinal) { return Cfg().visible.at(static_cast<size_t>(ordinal)); }

void NoteContext(int ordinal) {
  std::lock_guard lock(R().mu);
  R().contexts |= 1u << Physical(ordinal);
}

int CurrentOrdinal() {
  if (t_device < 0) {
    t_device = 0;
    if (!Cfg().visible.empty()) NoteContext(0);
  }
  return t_device;
}

int OpenPeerFd(pid_t pid, int fd) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  return ::open(path.c_str(), O_RDWR | O_CLOEXEC);
}

void PollUntil(const std::function<bool()>& done) {
  auto pause = std::chrono::microseconds(1);
  while (!done()) {
    if (g_sticky.load(std::memory_order_acquire) != 0) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

void OperationDelay(uint64_t extra_ns) {
  const uint64_t ns = Cfg().copy_delay_us * 1000 + extra_ns;
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

bool CountCopy() {
  const uint64_t n = g_copies.fetch_add(1) + 1;
  const int64_t limit = Cfg().fail_after_copies;
  if (limit < 0 || n <= static_cast<uint64_t>(limit)) return true;
  int expected = 0;
  if (g_sticky.compare_exchange_strong(expected, cudaErrorIllegalAddress)) {
    std::fprintf(stderr,
                 "expertd cudasim: injected sticky cudaErrorIllegalAddress at copy %llu "
                 "(EXPERTD_CUDASIM_FAIL_AFTER_COPIES=%lld)\n",
                 static_cast<unsigned long long>(n), static_cast<long long>(limit));
  }
  return false;
}

std::shared_ptr<Stream> Stream::Start(int device, bool blocking, bool legacy) {
  auto s = std::make_shared<Stream>(device, blocking, legacy);
  std::thread([s] { s->Run(); }).detach();
  return s;
}

uint64_t Stream::enqueued() const {
  std::lock_guard lock(mu_);
  return enqueued_;
}

uint64_t Stream::Push(std::function<void()> op) {
  std::lock_guard lock(mu_);
  ops_.push_back(std::move(op));
  work_cv_.notify_one();
  return ++enqueued_;
}

void Stream::WaitFor(uint64_t position) {
  std::unique_lock lock(mu_);
  while (completed() < position && g_sticky.load(std::memory_order_acquire) == 0) {
    done_cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void Stream::Close() {
  std::lock_guard lock(mu_);
  closing_ = true;
  work_cv_.notify_one();
}

void Stream::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return !ops_.empty() || closing_; });
    if (ops_.empty()) return;  // closing, and everything queued ran
    std::function<void()> op = std::move(ops_.front());
    ops_.pop_front();
    lock.unlock();
    // After a sticky error nothing runs any more; the operations still "finish" so waiters
    // return (with the error, from the API calls).
    if (g_sticky.load(std::memory_order_acquire) == 0) op();
    op = nullptr;
    lock.lock();
    completed_.fetch_add(1, std::memory_order_release);
    done_cv_.notify_all();
  }
}

Runtime& Runtime::Get() {
  static auto* runtime = [] {
    auto* r = new Runtime();  // never destroyed: detached stream threads may outlive main()
    r->legacy.resize(static_cast<size_t>(std::max(Cfg().devices, 0)));
    r->device_used.resize(r->legacy.size());
    return r;
  }();
  return *runtime;
}

std::shared_ptr<Stream> Runtime::Legacy(int device) {
  auto& s = legacy.at(static_cast<size_t>(device));
  if (!s) s = Stream::Start(device, /*blocking=*/true, /*legacy=*/true);
  return s;
}

std::shared_ptr<Stream> Runtime::Resolve(cudaStream_t handle) {
  std::lock_guard lock(mu);
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    if (t_device < 0) {  // the implicit primary context of device 0 (mu is held here)
      if (Cfg().visible.empty()) return nullptr;
      t_device = 0;
      contexts |= 1u << Physical(0);
    }
    return Legacy(Physical(t_device));
  }
  auto it = streams.find(reinterpret_cast<Stream*>(handle));
  return it == streams.end() ? nullptr : it->second;
}

uint8_t* Runtime::Shadow(const void* p, uint64_t n, int* device) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = allocations.upper_bound(addr);
  if (it == allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (addr - it->first > a.bytes || n > a.bytes - (addr - it->first)) return nullptr;
  if (device != nullptr) *device = a.device;
  return a.shadow + (addr - it->first);
}

bool Runtime::Pinned(const void* p, uint64_t n) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = host.upper_bound(addr);
  if (it == host.begin()) return false;
  --it;
  return addr - it->first <= it->second.bytes && n <= it->second.bytes - (addr - it->first);
}

uint64_t Runtime::Enqueue(const std::shared_ptr<Stream>& stream, std::function<void()> op) {
  // The legacy stream waits for every blocking stream of its device, and a blocking stream for
  // the legacy stream; non-blocking streams for neither.
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> after;
  {
    std::lock_guard lock(mu);
    if (stream->legacy()) {
      for (const auto& [raw, s] : streams) {
        if (s->device() != stream->device() || !s->blocking()) continue;
        const uint64_t target = s->enqueued();
        if (s->completed() < target) after.emplace_back(s, target);
      }
    } else if (stream->blocking()) {
      std::shared_ptr<Stream> l = Legacy(stream->device());
      const uint64_t target = l->enqueued();
      if (l->completed() < target) after.emplace_back(l, target);
    }
  }
  if (after.empty()) return stream->Push(std::move(op));
  return stream->Push([after = std::move(after), op = std::move(op)] {
    for (const auto& [s, target] : after) {
      PollUntil([&s, target = target] { return s->completed() >= target; });
    }
    op();
  });
}

void Runtime::SyncDevice(int device) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> all;
  {
    std::lock_guard lock(mu);
    if (static_cast<size_t>(device) < legacy.size() && legacy[device]) {
      all.emplace_back(legacy[device], legacy[device]->enqueued());
    }
    for (const auto& [raw, s] : streams) {
      if (s->device() == device) all.emplace_back(s, s->enqueued());
    }
  }
  for (const auto& [s, target] : all) s->WaitFor(target);
}

EventState* Runtime::NewEventState(uint32_t* index) {
  if (pool == nullptr) {
    pool_fd = ::memfd_create("expertd-cudasim-events", MFD_CLOEXEC);
    if (pool_fd < 0) return nullptr;
    const uint64_t bytes = uint64_t{kPoolEvents} * sizeof(EventState);
    if (::ftruncate(pool_fd, static_cast<off_t>(bytes)) != 0) return nullptr;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pool_fd, 0);
    if (p == MAP_FAILED) return nullptr;
    pool = static_cast<EventState*>(p);
    std::memcpy(&pool[0].magic, kEventMagic, sizeof(pool[0].magic));
  }
  uint32_t i = 0;
  if (!pool_free.empty()) {
    i = pool_free.back();
    pool_free.pop_back();
  } else if (pool_next < kPoolEvents) {
    i = pool_next++;
  } else {
    std::fprintf(stderr, "expertd cudasim: all %u events of this process are in use\n",
                 kPoolEvents - 1);
    return nullptr;
  }
  EventState* st = &pool[i];
  st->recorded.store(0);
  st->completed.store(0);
  *index = i;
  return st;
}

void Runtime::FreeEventState(uint32_t index) { pool_free.push_back(index); }

}  // namespace expertd::cudasim
