// The CUDA simulator against the CUDA semantics the backend relies on (label cudasim): stream
// order, events (the never-recorded trap included), cross-process IPC memory and events, the
// legacy stream's implicit synchronisation, device memory that host code cannot touch, pinned
// and registered host memory (read-only memory included), contexts and devices seen in different
// orders, reference-counted IPC memory opens and once-only IPC event opens, a record of a
// destroyed context, and the injected sticky error. Cross-process cases re-run this
// binary as a child (`cudasim_test --child MODE ...`): a fork would lose the stream threads.
#include "cudasim.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string g_self;  // this executable, for child processes

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A host function that blocks its stream until opened.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> ran{false};
  static void Wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    g->ran.store(true);
  }
};

void Mark(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

std::string Hex(const void* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", static_cast<const unsigned char*>(p)[i]);
    s += b;
  }
  return s;
}

std::vector<unsigned char> Unhex(const std::string& s) {
  std::vector<unsigned char> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

// Runs `cudasim_test --child args...` with `env` added; returns its exit status (or 128+signal).
int RunChild(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(g_self.c_str()), const_cast<char*>("--child")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(g_self.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(CudaSim, NeverRecordedEventCountsAsComplete) {
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(s, Gate::Wait, &gate));
  CUDA_OK(cudaEventRecord(e, s));
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  gate.open = true;
  CUDA_OK(cudaEventSynchronize(e));
  EXPECT_TRUE(gate.ran.load());
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaEventDestroy(e));
  EXPECT_EQ(cudaEventQuery(e), cudaErrorInvalidResourceHandle);  // destroyed: not a live event
  (void)cudaGetLastError();
}

TEST(CudaSim, StreamWaitEventOrdersAnotherStream) {
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  Gate gate;
  std::atomic<int> after{0};
  CUDA_OK(cudaLaunchHostFunc(a, Gate::Wait, &gate));
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  CUDA_OK(cudaLaunchHostFunc(b, Mark, &after));
  // A later record, on a third stream held behind its own gate, does not change what b waits
  // for: the record that was latest when the wait was enqueued.
  cudaStream_t c = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  Gate later;
  CUDA_OK(cudaLaunchHostFunc(c, Gate::Wait, &later));
  CUDA_OK(cudaEventRecord(e, c));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(after.load(), 0) << "b ran past its wait before a's record completed";
  gate.open = true;
  // b goes on although the later record is still pending (10 s only bound the wait; a
  // simulator that made b wait for c's record would hold b until `later` opens below).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (after.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(after.load(), 1) << "b waited for a record made after its wait was enqueued";
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady) << "the event now stands for c's record";
  later.open = true;
  CUDA_OK(cudaStreamSynchronize(b));
  CUDA_OK(cudaEventSynchronize(e));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CUDA_OK(cudaStreamDestroy(c));
  CUDA_OK(cudaEventDestroy(e));
}

TEST(CudaSim, LegacyStreamWaitsForBlockingStreamsNotNonBlockingOnes) {
  cudaStream_t blocking = nullptr;
  cudaStream_t non_blocking = nullptr;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking));
  Gate g1;
  Gate g2;
  std::atomic<int> legacy_ran{0};
  CUDA_OK(cudaLaunchHostFunc(non_blocking, Gate::Wait, &g1));
  CUDA_OK(cudaLaunchHostFunc(blocking, Gate::Wait, &g2));
  CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, Mark, &legacy_ran));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(legacy_ran.load(), 0) << "the legacy stream ran before a blocking stream's work";
  g2.open = true;
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  EXPECT_EQ(legacy_ran.load(), 1) << "the legacy stream waited for a non-blocking stream";
  g1.open = true;
  CUDA_OK(cudaStreamSynchronize(non_blocking));
  CUDA_OK(cudaStreamDestroy(blocking));
  CUDA_OK(cudaStreamDestroy(non_blocking));
}

TEST(CudaSim, DeviceMemoryRoundTripsAndFaultsOnHostAccess) {
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 1 << 20));
  std::vector<unsigned char> in(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 3);
  CUDA_OK(cudaMemcpy(d, in.data(), in.size(), cudaMemcpyHostToDevice));
  std::vector<unsigned char> out(in.size());
  CUDA_OK(cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(in, out);
  // A kind that contradicts the pointers is refused.
  EXPECT_EQ(cudaMemcpy(d, in.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // Host code reading device memory faults, as on a GPU (checked in a forked child: no CUDA
  // call after the fork).
  const pid_t pid = ::fork();
  if (pid == 0) {
    volatile unsigned char c = *static_cast<volatile unsigned char*>(d);
    (void)c;
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The child reaches _exit(0) only if the read went through. (It dies of SIGSEGV; under a
  // sanitizer, its handler reports the fault and exits non-zero or aborts instead.)
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child read device memory from the host and went on (status " << status << ")";
  CUDA_OK(cudaFree(d));
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST(CudaSim, PageableSourceIsStagedAtTheCall) {
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 4096));
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(s, Gate::Wait, &gate));
  std::vector<unsigned char> src(4096, 0xAB);
  CUDA_OK(cudaMemcpyAsync(d, src.data(), src.size(), cudaMemcpyHostToDevice, s));
  std::fill(src.begin(), src.end(), 0x11);  // after the call: must not reach the device
  gate.open = true;
  std::vector<unsigned char> back(4096);
  CUDA_OK(cudaMemcpyAsync(back.data(), d, back.size(), cudaMemcpyDeviceToHost, s));
  // Into pageable memory the call returned only once the copy was done.
  EXPECT_EQ(back, std::vector<unsigned char>(4096, 0xAB));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
}

TEST(CudaSim, HostRegistrationRules) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 8 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<unsigned char*>(m);
  // By default read-only registration is unsupported, and read-only memory cannot be
  // registered without it: CUDA pins for write where it does not use the host's page tables.
  int ro = -1;
  CUDA_OK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0));
  EXPECT_EQ(ro, 0);
  EXPECT_EQ(cudaHostRegister(p, 4 * page, cudaHostRegisterReadOnly), cudaErrorNotSupported);
  EXPECT_EQ(cudaHostRegister(p, 4 * page, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  ASSERT_EQ(::mprotect(m, 8 * page, PROT_READ | PROT_WRITE), 0);
  CUDA_OK(cudaHostRegister(p, 4 * page, 0));
  EXPECT_EQ(cudaHostRegister(p + 2 * page, 4 * page, 0), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaHostUnregister(p + page), cudaErrorHostMemoryNotRegistered);
  CUDA_OK(cudaHostUnregister(p));
  ::munmap(m, 8 * page);
  // An unmapped range cannot be registered.
  EXPECT_EQ(cudaHostRegister(p, page, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST(CudaSim, IpcMemoryAndEventsAcrossProcesses) {
  constexpr size_t kBytes = 3 << 20;
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, kBytes));
  std::vector<unsigned char> in(kBytes);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i ^ (i >> 11));
  CUDA_OK(cudaMemcpy(d, in.data(), kBytes, cudaMemcpyHostToDevice));
  cudaIpcMemHandle_t mh{};
  CUDA_OK(cudaIpcGetMemHandle(&mh, d));
  void* same = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&same, mh, cudaIpcMemLazyEnablePeerAccess),
            cudaErrorDeviceUninitialized)
      << "CUDA refuses to open a memory handle in the exporting process";
  (void)cudaGetLastError();
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh{};
  CUDA_OK(cudaIpcGetEventHandle(&eh, done));
  // The child checks the bytes through its own mapping, writes a marker, and records `done`
  // on its stream after a 300 ms host function: this process must see the record pending, then
  // complete, and the marker only after it.
  std::thread child([&] {
    EXPECT_EQ(RunChild({"ipc", Hex(&mh, sizeof mh), Hex(&eh, sizeof eh), std::to_string(kBytes)}),
              0);
  });
  bool saw_pending = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaErrorNotReady) saw_pending = true;
    if (q == cudaSuccess && saw_pending) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  child.join();
  EXPECT_TRUE(saw_pending) << "the child's record never showed as pending here";
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  unsigned char marker = 0;
  CUDA_OK(cudaMemcpy(&marker, d, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(marker, 0x5A) << "the child's write through its IPC mapping is not visible here";
  CUDA_OK(cudaEventDestroy(done));
  CUDA_OK(cudaFree(d));
}

TEST(CudaSim, ReadOnlyRegistrationWhereSupported) {
  EXPECT_EQ(RunChild({"read-only"}, {"EXPERTD_CUDASIM_READ_ONLY_REGISTER=1"}), 0);
}

TEST(CudaSim, IpcEventHandleOpensOncePerProcess) {
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh{};
  CUDA_OK(cudaIpcGetEventHandle(&eh, e));
  EXPECT_EQ(RunChild({"event-twice", Hex(&eh, sizeof eh)}), 0);
  CUDA_OK(cudaEventDestroy(e));
}

TEST(CudaSim, AThreadThatNeverChoseADeviceCreatesNoContextByAsking) {
  // A fresh process: this test binary made device 0's context long ago.
  EXPECT_EQ(RunChild({"contexts"}, {"EXPERTD_CUDASIM_DEVICES=2"}), 0);
}

TEST(CudaSim, VisibleOrderingsUuidsAndPeerMappings) {
  // This process's device 0 is physical device 1 in the child, which sees "1,0".
  cudaDeviceProp props{};
  CUDA_OK(cudaGetDeviceProperties(&props, 0));
  cudaIpcMemHandle_t mh{};
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 1 << 20));
  CUDA_OK(cudaIpcGetMemHandle(&mh, d));
  cudaEvent_t e = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh{};
  CUDA_OK(cudaIpcGetEventHandle(&eh, e));
  EXPECT_EQ(RunChild({"devices", Hex(props.uuid.bytes, sizeof props.uuid.bytes),
                      Hex(&mh, sizeof mh), Hex(&eh, sizeof eh)},
                     {"EXPERTD_CUDASIM_DEVICES=2", "EXPERTD_CUDASIM_VISIBLE_DEVICES=1,0"}),
            0);
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaFree(d));
}

TEST(CudaSim, ARecordOfADestroyedContextAnswersItsErrorElsewhere) {
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh{};
  CUDA_OK(cudaIpcGetEventHandle(&eh, done));
  EXPECT_EQ(RunChild({"destroyed", Hex(&eh, sizeof eh)}), 0);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorContextIsDestroyed);
  (void)cudaGetLastError();
  // This process's context is unaffected.
  cudaEvent_t mine = nullptr;
  CUDA_OK(cudaEventCreate(&mine));
  CUDA_OK(cudaEventDestroy(mine));
  CUDA_OK(cudaEventDestroy(done));
}

TEST(CudaSim, InjectedStickyErrorFailsEveryLaterCall) {
  EXPECT_EQ(RunChild({"sticky"}, {"EXPERTD_CUDASIM_FAIL_AFTER_COPIES=2"}), 0);
}

TEST(CudaSim, NoDeviceConfigured) {
  EXPECT_EQ(RunChild({"no-device"}, {"EXPERTD_CUDASIM_DEVICES=0"}), 0);
}

// ---- child modes: exit 0 when every check held, else print what failed and exit 1.

#define CHILD_CHECK(cond)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "child check failed: %s (line %d)\n", #cond, __LINE__); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int ChildIpc(const std::string& mem_hex, const std::string& event_hex, size_t bytes) {
  cudaIpcMemHandle_t mh{};
  cudaIpcEventHandle_t eh{};
  const std::vector<unsigned char> m = Unhex(mem_hex);
  const std::vector<unsigned char> e = Unhex(event_hex);
  std::memcpy(&mh, m.data(), sizeof mh);
  std::memcpy(&eh, e.data(), sizeof eh);
  void* d = nullptr;
  CHILD_CHECK(cudaIpcOpenMemHandle(&d, mh, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  // A second open returns the same pointer and counts: it needs its own close.
  void* again = nullptr;
  CHILD_CHECK(cudaIpcOpenMemHandle(&again, mh, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  CHILD_CHECK(again == d);
  CHILD_CHECK(cudaIpcCloseMemHandle(again) == cudaSuccess);
  int open_memory = 0, open_events = 0;
  expertd_cudasim_open_imports(&open_memory, &open_events);
  CHILD_CHECK(open_memory == 1);
  std::vector<unsigned char> back(bytes);
  CHILD_CHECK(cudaMemcpy(back.data(), d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (size_t i = 0; i < bytes; ++i) {
    CHILD_CHECK(back[i] == static_cast<unsigned char>(i ^ (i >> 11)));
  }
  cudaEvent_t done = nullptr;
  CHILD_CHECK(cudaIpcOpenEventHandle(&done, eh) == cudaSuccess);
  cudaStream_t s = nullptr;
  CHILD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  static std::atomic<int> slept{0};
  CHILD_CHECK(cudaLaunchHostFunc(
                  s,
                  [](void*) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(300));
                    slept = 1;
                  },
                  nullptr) == cudaSuccess);
  const unsigned char marker = 0x5A;
  CHILD_CHECK(cudaMemcpyAsync(d, &marker, 1, cudaMemcpyHostToDevice, s) == cudaSuccess);
  CHILD_CHECK(cudaEventRecord(done, s) == cudaSuccess);
  CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHILD_CHECK(slept.load() == 1);
  CHILD_CHECK(cudaEventDestroy(done) == cudaSuccess);
  CHILD_CHECK(cudaIpcCloseMemHandle(d) == cudaSuccess);
  return 0;
}

int ChildSticky() {
  void* d = nullptr;
  CHILD_CHECK(cudaMalloc(&d, 4096) == cudaSuccess);
  unsigned char b[16] = {};
  CHILD_CHECK(cudaMemcpy(d, b, sizeof b, cudaMemcpyHostToDevice) == cudaSuccess);
  CHILD_CHECK(cudaMemcpy(b, d, sizeof b, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHILD_CHECK(cudaMemcpy(d, b, sizeof b, cudaMemcpyHostToDevice) == cudaErrorIllegalAddress);
  cudaEvent_t e = nullptr;
  CHILD_CHECK(cudaEventCreate(&e) == cudaErrorIllegalAddress);
  CHILD_CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHILD_CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // sticky: not cleared
  CHILD_CHECK(std::string(cudaGetErrorName(cudaErrorIllegalAddress)) == "cudaErrorIllegalAddress");
  return 0;
}

int ChildReadOnly() {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHILD_CHECK(m != MAP_FAILED);
  int ro = 0;
  CHILD_CHECK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0) ==
              cudaSuccess);
  CHILD_CHECK(ro == 1);
  CHILD_CHECK(cudaHostRegister(m, 4 * page, cudaHostRegisterReadOnly) == cudaSuccess);
  CHILD_CHECK(cudaHostUnregister(m) == cudaSuccess);
  CHILD_CHECK(cudaHostRegister(m, 4 * page, 0) == cudaErrorInvalidValue);
  return 0;
}

int ChildEventTwice(const std::string& event_hex) {
  cudaIpcEventHandle_t eh{};
  std::memcpy(&eh, Unhex(event_hex).data(), sizeof eh);
  cudaEvent_t a = nullptr, b = nullptr;
  CHILD_CHECK(cudaIpcOpenEventHandle(&a, eh) == cudaSuccess);
  CHILD_CHECK(cudaIpcOpenEventHandle(&b, eh) == cudaErrorInvalidValue);
  CHILD_CHECK(cudaEventDestroy(a) == cudaSuccess);
  CHILD_CHECK(cudaIpcOpenEventHandle(&b, eh) == cudaSuccess);  // closed: may open again
  CHILD_CHECK(cudaEventDestroy(b) == cudaSuccess);
  return 0;
}

int ChildContexts() {
  unsigned mask = 99;
  int peer = -1, wrong = -1;
  int d = -1;
  CHILD_CHECK(cudaGetDevice(&d) == cudaSuccess && d == 0);
  cudaDeviceProp props{};
  CHILD_CHECK(cudaGetDeviceProperties(&props, 1) == cudaSuccess);
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(mask == 0);  // asking creates nothing
  CHILD_CHECK(cudaSetDevice(1) == cudaSuccess);
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(mask == 2u);
  // Another thread that never chose a device and allocates: device 0's primary context.
  std::thread([] {
    void* p = nullptr;
    if (cudaMalloc(&p, 4096) == cudaSuccess) (void)cudaFree(p);
  }).join();
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(mask == 3u);
  return 0;
}

int ChildDevices(const std::string& uuid_hex, const std::string& mem_hex,
                 const std::string& event_hex) {
  // Ordinal 1 here is the parent's device 0 (physical 0): same UUID.
  cudaDeviceProp p0{}, p1{};
  CHILD_CHECK(cudaGetDeviceProperties(&p0, 0) == cudaSuccess);
  CHILD_CHECK(cudaGetDeviceProperties(&p1, 1) == cudaSuccess);
  CHILD_CHECK(Hex(p1.uuid.bytes, sizeof p1.uuid.bytes) == uuid_hex);
  CHILD_CHECK(Hex(p0.uuid.bytes, sizeof p0.uuid.bytes) != uuid_hex);
  cudaIpcMemHandle_t mh{};
  cudaIpcEventHandle_t eh{};
  std::memcpy(&mh, Unhex(mem_hex).data(), sizeof mh);
  std::memcpy(&eh, Unhex(event_hex).data(), sizeof eh);
  unsigned mask = 0;
  int peer = 0, wrong = 0;
  // On ordinal 0 (another device): only over the peer link, with the lazy flag.
  CHILD_CHECK(cudaSetDevice(0) == cudaSuccess);
  void* d = nullptr;
  CHILD_CHECK(cudaIpcOpenMemHandle(&d, mh, 0) == cudaErrorPeerAccessNotEnabled);
  CHILD_CHECK(cudaIpcOpenMemHandle(&d, mh, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(peer == 1);
  CHILD_CHECK(cudaIpcCloseMemHandle(d) == cudaSuccess);
  // An event opened into device 0's context cannot be recorded on a stream of device 1.
  cudaEvent_t e = nullptr;
  CHILD_CHECK(cudaIpcOpenEventHandle(&e, eh) == cudaSuccess);
  CHILD_CHECK(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t s = nullptr;
  CHILD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  int sd = -1;
  CHILD_CHECK(cudaStreamGetDevice(s, &sd) == cudaSuccess && sd == 1);
  CHILD_CHECK(cudaEventRecord(e, s) == cudaErrorInvalidResourceHandle);
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(wrong == 1);
  CHILD_CHECK(cudaEventDestroy(e) == cudaSuccess);
  // Opened on the right device, nothing crosses the peer link.
  CHILD_CHECK(cudaIpcOpenMemHandle(&d, mh, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  expertd_cudasim_contexts(&mask, &peer, &wrong);
  CHILD_CHECK(peer == 1);
  CHILD_CHECK(cudaIpcCloseMemHandle(d) == cudaSuccess);
  return 0;
}

int ChildDestroyed(const std::string& event_hex) {
  cudaIpcEventHandle_t eh{};
  std::memcpy(&eh, Unhex(event_hex).data(), sizeof eh);
  cudaEvent_t e = nullptr;
  CHILD_CHECK(cudaIpcOpenEventHandle(&e, eh) == cudaSuccess);
  cudaStream_t s = nullptr;
  CHILD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  static Gate gate;  // never opened: the record stays pending
  CHILD_CHECK(cudaLaunchHostFunc(s, Gate::Wait, &gate) == cudaSuccess);
  CHILD_CHECK(cudaEventRecord(e, s) == cudaSuccess);
  expertd_cudasim_destroy_context(cudaErrorContextIsDestroyed);
  CHILD_CHECK(cudaEventQuery(e) == cudaErrorContextIsDestroyed);
  gate.open = true;
  return 0;
}

int ChildNoDevice() {
  int n = -1;
  CHILD_CHECK(cudaGetDeviceCount(&n) == cudaErrorNoDevice);
  CHILD_CHECK(n == 0);
  CHILD_CHECK(cudaSetDevice(0) == cudaErrorInvalidDevice);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  g_self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
  if (argc >= 3 && std::string(argv[1]) == "--child") {
    const std::string mode = argv[2];
    if (mode == "ipc" && argc == 6) return ChildIpc(argv[3], argv[4], std::stoull(argv[5]));
    if (mode == "sticky") return ChildSticky();
    if (mode == "read-only") return ChildReadOnly();
    if (mode == "event-twice" && argc == 4) return ChildEventTwice(argv[3]);
    if (mode == "contexts") return ChildContexts();
    if (mode == "devices" && argc == 6) return ChildDevices(argv[3], argv[4], argv[5]);
    if (mode == "destroyed" && argc == 4) return ChildDestroyed(argv[3]);
    if (mode == "no-device") return ChildNoDevice();
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
