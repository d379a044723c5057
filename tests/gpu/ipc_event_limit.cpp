// GPU measurement (label gpu): how many CUDA IPC events a process can have. The daemon's fence
// design needs interprocess events (cudaEventInterprocess | cudaEventDisableTiming) in numbers
// that grow with the slots and the sessions, and the driver bounds them below what its memory
// would allow. This finds the bound on this host, by trying:
//
//   RESULT ipc_event_limit created=N error=...        IPC events one process creates before a
//                                                     failure (stops at --cap)
//   RESULT plain_event_limit created=N error=...      the same for events without the IPC flag
//   RESULT ipc_event_recreate created=N               after destroying them all, created again
//   RESULT ipc_event_child_create created=N           a second process, while this one holds
//                                                     its N: per process, or shared by all?
//   RESULT ipc_event_child_open opened=N of=M         the second process opens this one's
//                                                     exported handles (M of them)
//   RESULT ipc_event_child_create_after_open created=N   and then creates its own: do opened
//                                                     events count against its bound?
//
// One check: the bound is at least the budget the CUDA device assumes by default
// (CudaDeviceOptions::max_ipc_events, 4096), else that default would let tables and sessions
// fail in the driver instead of being refused up front. Exit 0 measured and checked, 1 a step
// could not run or the bound is lower, 77 no GPU.
//
// Usage: ipc_event_limit [--cap N]   (default 65536 of each kind)
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Made {
  std::vector<cudaEvent_t> events;
  std::string error = "none";  // the failure that stopped the loop, or "none" at the cap
  double us_per_event = 0;
};

Made CreateUntilFailure(unsigned flags, size_t cap) {
  Made m;
  m.events.reserve(cap);
  const Clock::time_point t0 = Clock::now();
  while (m.events.size() < cap) {
    cudaEvent_t e = nullptr;
    const cudaError_t rc = cudaEventCreateWithFlags(&e, flags);
    if (rc != cudaSuccess) {
      m.error = cudaGetErrorName(rc);
      (void)cudaGetLastError();
      break;
    }
    m.events.push_back(e);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!m.events.empty()) m.us_per_event = us / static_cast<double>(m.events.size());
  return m;
}

void DestroyAll(Made& m) {
  for (cudaEvent_t e : m.events) (void)cudaEventDestroy(e);
  m.events.clear();
}

constexpr unsigned kIpcFlags = cudaEventInterprocess | cudaEventDisableTiming;

// The second process: opens every handle in the file, then creates its own IPC events.
int Child(const char* path, size_t cap) {
  if (cudaSetDevice(0) != cudaSuccess) return 1;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return 1;
  std::vector<cudaIpcEventHandle_t> handles;
  cudaIpcEventHandle_t h;
  while (std::fread(&h, sizeof(h), 1, f) == 1) handles.push_back(h);
  std::fclose(f);
  if (handles.empty()) {  // the first run: create only
    Made own = CreateUntilFailure(kIpcFlags, cap);
    std::printf("RESULT ipc_event_child_create created=%zu error=%s\n", own.events.size(),
                own.error.c_str());
    return 0;
  }
  std::vector<cudaEvent_t> opened;
  std::string error = "none";
  const Clock::time_point t0 = Clock::now();
  for (const cudaIpcEventHandle_t& handle : handles) {
    cudaEvent_t e = nullptr;
    const cudaError_t rc = cudaIpcOpenEventHandle(&e, handle);
    if (rc != cudaSuccess) {
      error = cudaGetErrorName(rc);
      (void)cudaGetLastError();
      break;
    }
    opened.push_back(e);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  std::printf("RESULT ipc_event_child_open opened=%zu of=%zu error=%s us_per_open=%.2f\n",
              opened.size(), handles.size(), error.c_str(),
              opened.empty() ? 0.0 : us / static_cast<double>(opened.size()));
  Made own = CreateUntilFailure(kIpcFlags, cap);
  std::printf("RESULT ipc_event_child_create_after_open created=%zu error=%s\n",
              own.events.size(), own.error.c_str());
  std::fflush(stdout);
  return 0;
}

bool RunChild(const std::string& self, const std::string& path, size_t cap) {
  std::fflush(stdout);
  const std::string cap_s = std::to_string(cap);
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), const_cast<char*>("--child"),
                             const_cast<char*>(path.c_str()), const_cast<char*>(cap_s.c_str()),
                             nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool WriteHandles(const std::string& path, const std::vector<cudaEvent_t>& events) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = true;
  for (cudaEvent_t e : events) {
    cudaIpcEventHandle_t h;
    if (cudaIpcGetEventHandle(&h, e) != cudaSuccess ||
        std::fwrite(&h, sizeof(h), 1, f) != 1) {
      ok = false;
      break;
    }
  }
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) {
    return Child(argv[2], std::strtoull(argv[3], nullptr, 10));
  }
  size_t cap = 65536;
  if (argc == 3 && std::strcmp(argv[1], "--cap") == 0) {
    cap = std::strtoull(argv[2], nullptr, 10);
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: ipc_event_limit [--cap N]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return 1;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  const std::string path = "/tmp/ipc_event_limit." + std::to_string(::getpid());

  Made ipc = CreateUntilFailure(kIpcFlags, cap);
  std::printf("RESULT ipc_event_limit created=%zu error=%s us_per_create=%.2f cap=%zu\n",
              ipc.events.size(), ipc.error.c_str(), ipc.us_per_event, cap);
  Made plain = CreateUntilFailure(cudaEventDisableTiming, cap);
  std::printf("RESULT plain_event_limit created=%zu error=%s (while holding the IPC ones)\n",
              plain.events.size(), plain.error.c_str());
  DestroyAll(plain);
  const size_t limit = ipc.events.size();
  DestroyAll(ipc);
  Made again = CreateUntilFailure(kIpcFlags, cap);
  std::printf("RESULT ipc_event_recreate created=%zu error=%s\n", again.events.size(),
              again.error.c_str());
  // Holding them all, a second process creates its own.
  if (!WriteHandles(path, {}) || !RunChild(self, path, cap)) {
    std::printf("FAIL: the second process (create) did not run\n");
    return 1;
  }
  // Half exported, half destroyed: the second process opens the exported ones, then creates.
  const size_t keep = again.events.size() / 2;
  for (size_t i = keep; i < again.events.size(); ++i) (void)cudaEventDestroy(again.events[i]);
  again.events.resize(keep);
  const bool ran = WriteHandles(path, again.events) && RunChild(self, path, cap);
  std::remove(path.c_str());
  DestroyAll(again);
  if (!ran) {
    std::printf("FAIL: the second process (open) did not run\n");
    return 1;
  }
  constexpr size_t kDeviceDefault = 4096;  // CudaDeviceOptions::max_ipc_events
  if (limit < kDeviceDefault && limit < cap) {
    std::printf("FAIL: this driver allows %zu IPC events per process, fewer than the %zu the CUDA "
                "device budgets by default (device.cuda_ipc_event_limit)\n", limit, kDeviceDefault);
    return 1;
  }
  std::printf("ipc_event_limit: measured (first limit %zu)\n", limit);
  return 0;
}
