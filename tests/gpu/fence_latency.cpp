// GPU measurement (label gpu): how fast a signal from one process's CUDA stream reaches work on
// another process's stream, for the two ways the fences could carry it:
//
//   ipc_event   this process records an IPC event; the other's stream waits on it
//               (cudaStreamWaitEvent), as the fences do today;
//   mem_word    this process's stream writes a 64-bit word of a shared memfd both processes
//               registered (cuStreamWriteValue64); the other's stream waits until the word
//               reaches the value (cuStreamWaitValue64, GEQ): no IPC event at all.
//
// Each round: this process's stream is held by a host function; the other process queues its
// wait and then a write of an answer word on its stream; the host function notes the time and
// returns, the signal goes out, and this process spins on the answer word on the CPU. The
// figure is from the release to the answer seen here: both GPU hops and one host-memory round
// trip, the same for both ways. Prints per way:
//
//   RESULT fence_latency way=ipc_event rounds=N median_us=... p90_us=... p99_us=...
//   RESULT fence_latency way=mem_word  rounds=N median_us=... p90_us=... p99_us=...
//
// Nothing is asserted about the figures, only that every answer came after its signal (the wait
// held); exit 0 when both ways ran so, 1 otherwise, 77 with no GPU. Usage: fence_latency [--rounds N]   (default 300)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

PFN_cuStreamWaitValue64_v11070 g_wait = nullptr;
PFN_cuStreamWriteValue64_v11070 g_write = nullptr;

bool LoadMemOps() {
  cudaDriverEntryPointQueryResult q1{}, q2{};
  return cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", reinterpret_cast<void**>(&g_wait),
                                          11070, cudaEnableDefault, &q1) == cudaSuccess &&
         cudaGetDriverEntryPointByVersion("cuStreamWriteValue64",
                                          reinterpret_cast<void**>(&g_write), 11070,
                                          cudaEnableDefault, &q2) == cudaSuccess &&
         q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess && g_wait &&
         g_write;
}

// The shared words: [0] the signal (mem_word way), [8] the answer, [16] the round the other
// process has queued its wait for (its CPU writes it), [24] the event handle's bytes follow at 64.
struct Shared {
  volatile uint64_t* host = nullptr;
  CUdeviceptr dev = 0;
};
constexpr size_t kBytes = 4096;

bool MapShared(int fd, Shared* s) {
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  if (cudaHostRegister(p, kBytes, cudaHostRegisterMapped | cudaHostRegisterPortable) !=
      cudaSuccess) {
    return false;
  }
  void* d = nullptr;
  if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) return false;
  s->host = static_cast<volatile uint64_t*>(p);
  s->dev = reinterpret_cast<CUdeviceptr>(d);
  return true;
}

std::atomic<int64_t> g_released_ns{0};
void CUDART_CB Hold(void*) {
  const auto until = Clock::now() + std::chrono::microseconds(2000);
  while (Clock::now() < until) {
  }
  g_released_ns.store(Clock::now().time_since_epoch().count());
}

// The other process: for each round r, waits (its way) and then writes answer = r.
int Child(const char* path, const char* way, int rounds) {
  if (cudaSetDevice(0) != cudaSuccess || !LoadMemOps()) return 1;
  const int fd = ::open(path, O_RDWR);
  Shared sh;
  if (fd < 0 || !MapShared(fd, &sh)) return 1;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  const auto cs = reinterpret_cast<CUstream>(stream);
  cudaEvent_t event = nullptr;
  const bool events = std::strcmp(way, "ipc_event") == 0;
  if (events) {
    cudaIpcEventHandle_t h;
    std::memcpy(&h, const_cast<const uint64_t*>(sh.host + 8), sizeof(h));
    if (cudaIpcOpenEventHandle(&event, h) != cudaSuccess) return 1;
  }
  for (int r = 1; r <= rounds; ++r) {
    // An IPC event wait takes the record that is latest now: wait until this round's is made.
    if (events) {
      while (sh.host[3] < static_cast<uint64_t>(r)) {
      }
      if (cudaStreamWaitEvent(stream, event, 0) != cudaSuccess) return 1;
    } else if (g_wait(cs, sh.dev, static_cast<uint64_t>(r), CU_STREAM_WAIT_VALUE_GEQ) !=
               CUDA_SUCCESS) {
      return 1;
    }
    if (g_write(cs, sh.dev + 8, static_cast<uint64_t>(r), 0) != CUDA_SUCCESS) return 1;
    sh.host[2] = static_cast<uint64_t>(r);  // queued
  }
  return cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 1;
}

bool RunWay(const std::string& self, const char* way, int rounds) {
  const int fd = ::memfd_create("fence-latency", 0);
  if (fd < 0 || ::ftruncate(fd, kBytes) != 0) return false;
  Shared sh;
  if (!MapShared(fd, &sh)) return false;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return false;
  const auto cs = reinterpret_cast<CUstream>(stream);
  cudaEvent_t event = nullptr;
  const bool events = std::strcmp(way, "ipc_event") == 0;
  if (events) {
    if (cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming) !=
        cudaSuccess) {
      return false;
    }
    cudaIpcEventHandle_t h;
    if (cudaIpcGetEventHandle(&h, event) != cudaSuccess) return false;
    std::memcpy(const_cast<uint64_t*>(sh.host + 8), &h, sizeof(h));
  }
  const std::string path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd);
  const std::string n = std::to_string(rounds);
  char* argv[] = {const_cast<char*>(self.c_str()), const_cast<char*>("--child"),
                  const_cast<char*>(path.c_str()), const_cast<char*>(way),
                  const_cast<char*>(n.c_str()), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, environ) != 0) return false;
  std::vector<double> us;
  bool ok = true;
  for (int r = 1; r <= rounds && ok; ++r) {
    if (!events) {  // the wait may be queued before or after; wait for it to be, for fairness
      while (sh.host[2] < static_cast<uint64_t>(r - 1)) {
      }
    }
    ok = cudaLaunchHostFunc(stream, Hold, nullptr) == cudaSuccess;
    if (events) {
      ok = ok && cudaEventRecord(event, stream) == cudaSuccess;
      sh.host[3] = static_cast<uint64_t>(r);  // recorded: the other process may wait on it
    } else {
      ok = ok && g_write(cs, sh.dev, static_cast<uint64_t>(r), 0) == CUDA_SUCCESS;
    }
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (ok && sh.host[1] < static_cast<uint64_t>(r)) {
      if (Clock::now() > deadline) ok = false;
    }
    const int64_t seen = Clock::now().time_since_epoch().count();
    // The answer must come after the release: one seen before it means the wait did not hold.
    if (ok && seen <= g_released_ns.load()) {
      std::printf("FAIL: way %s, round %d: the other process answered before the signal\n", way, r);
      ok = false;
    }
    if (ok && r > 5) us.push_back((seen - g_released_ns.load()) / 1000.0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 && !us.empty();
  (void)cudaStreamSynchronize(stream);
  if (event != nullptr) (void)cudaEventDestroy(event);
  (void)cudaStreamDestroy(stream);
  if (!ok) {
    std::printf("FAIL: way %s did not complete its rounds\n", way);
    return false;
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * us.size()))]; };
  std::printf("RESULT fence_latency way=%s rounds=%zu median_us=%.1f p90_us=%.1f p99_us=%.1f\n",
              way, us.size(), at(0.5), at(0.9), at(0.99));
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--child") == 0) {
    return Child(argv[2], argv[3], std::atoi(argv[4]));
  }
  int rounds = 300;
  if (argc == 3 && std::strcmp(argv[1], "--rounds") == 0) {
    rounds = std::max(10, std::atoi(argv[2]));
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: fence_latency [--rounds N]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  if (cudaSetDevice(0) != cudaSuccess || !LoadMemOps()) {
    std::printf("FAIL: no device 0 or no stream memory operations\n");
    return 1;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  const bool a = RunWay(self, "ipc_event", rounds);
  const bool b = RunWay(self, "mem_word", rounds);
  return a && b ? 0 : 1;
}
