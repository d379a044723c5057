// Which CUDA features this host really has (scripts/gpu-check runs it first): GPU machines may
// sit in a sandbox (gVisor, Firecracker) where some are missing, above all CUDA IPC between
// processes. Each feature is tried, not only asked for, and reported on one line:
//
//   FEATURE <name> supported|unsupported|broken <detail>
//
// unsupported: the attempt failed with one of the codes CUDA documents for "not here"
// (kUnsupportedCodes), or the device attribute that advertises the feature is 0 and the attempt
// failed. broken: the feature claims to work but fails otherwise, or gives wrong data. A feature
// whose attribute is 0 but which works end to end is supported (the detail says so).
//
// Features: ipc_memory (cudaIpcGetMemHandle here, open in a second process, read a pattern
// back), ipc_events (export here, open in a second process, a record there seen pending and then
// complete by cudaEventQuery here), host_register and host_register_read_only (cudaHostRegister
// of anonymous memory, read-write / PROT_READ with cudaHostRegisterReadOnly, and a copy from it
// checked), stream_priorities (cudaDeviceGetStreamPriorityRange, a stream of the greatest one),
// stream_mem_ops (64-bit cuStreamWaitValue64/cuStreamWriteValue64 on a shared memory word that
// both processes registered: a second process's stream waits until this one's stream writes;
// the second process then writes a word back, which this process reads on the CPU).
//
// Usage: cuda_feature_probe [--require-supported]
// Exit 0: nothing broken; 3: with --require-supported, something unsupported (nothing broken);
// 1: something broken; 77: no GPU. The second process is this executable (--child-*), started
// with fork + exec.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_test_util.h"

namespace expertd {
namespace {

using Clock = std::chrono::steady_clock;

enum class Verdict { kSupported, kUnsupported, kBroken };

// The codes CUDA documents for a feature that this platform, driver or configuration lacks.
// cudaErrorDevicesUnavailable: a second process cannot make a context (exclusive-process mode).
constexpr cudaError_t kUnsupportedCodes[] = {cudaErrorNotSupported, cudaErrorOperatingSystem,
                                             cudaErrorNotPermitted, cudaErrorInvalidDevice,
                                             cudaErrorDevicesUnavailable};

bool IsUnsupportedCode(int code) {
  for (cudaError_t c : kUnsupportedCodes) {
    if (code == static_cast<int>(c)) return true;
  }
  return false;
}

std::string Describe(const char* call, cudaError_t e) {
  return absl::StrCat(call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

struct Report {
  int supported = 0;
  int unsupported = 0;
  int broken = 0;

  void Feature(const char* name, Verdict v, const std::string& detail) {
    const char* word = v == Verdict::kSupported     ? "supported"
                       : v == Verdict::kUnsupported ? "unsupported"
                                                    : "broken";
    (v == Verdict::kSupported ? supported : v == Verdict::kUnsupported ? unsupported : broken)++;
    std::printf("FEATURE %s %s %s\n", name, word, detail.c_str());
    std::fflush(stdout);
  }
  // A failed call: unsupported for the documented codes or when `advertised` is false.
  void Failed(const char* name, bool advertised, int code, const std::string& detail) {
    Feature(name, IsUnsupportedCode(code) || !advertised ? Verdict::kUnsupported : Verdict::kBroken,
            detail);
  }
};

int Attribute(cudaDeviceAttr attr) {
  int v = -1;
  if (cudaDeviceGetAttribute(&v, attr, 0) != cudaSuccess) return -1;
  return v;
}

uint8_t ProbeByte(uint64_t i) { return gpu_test::PatternByte(7, 3, i); }

// One line from the child within `timeout`; false on timeout or end of file.
bool ReadLineWithin(FILE* f, std::chrono::seconds timeout, std::string* line) {
  line->clear();
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{::fileno(f), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char c = 0;
    const ssize_t n = ::read(::fileno(f), &c, 1);  // unbuffered: poll must see what is left
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("cuda_feature_probe");
}

// Starts this executable with `args`; its first line is the answer. Kills it after `timeout`.
struct ChildRun {
  gpu_test::Child child;
  bool started = false;
  std::string error;

  explicit ChildRun(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SelfPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    const absl::Status st = gpu_test::Spawn(argv, /*pipes=*/true, &child);
    started = st.ok();
    if (!started) error = st.ToString();
  }
  bool Line(std::chrono::seconds timeout, std::string* line) {
    return started && ReadLineWithin(child.from, timeout, line);
  }
  void Send(const std::string& line) {
    std::fprintf(child.to, "%s\n", line.c_str());
    std::fflush(child.to);
  }
  // Closes its stdin, gives it 5 s to exit, then kills it.
  ~ChildRun() {
    if (child.to != nullptr) std::fclose(child.to);
    child.to = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    int status = 0;
    while (child.pid > 0 && ::waitpid(child.pid, &status, WNOHANG) == 0 &&
           Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (child.pid > 0 && ::waitpid(child.pid, &status, WNOHANG) == 0) ::kill(child.pid, SIGKILL);
    child.Wait();
  }
};

// A child's answer "ERR <code> <text>": the code, or -1 for another answer.
int ChildErrorCode(const std::string& line) {
  if (line.rfind("ERR ", 0) != 0) return -1;
  return std::atoi(line.c_str() + 4);
}

void ProbeIpcMemory(Report& report) {
  const char* kName = "ipc_memory";
  const int unified = Attribute(cudaDevAttrUnifiedAddressing);
  const std::string attrs = absl::StrCat("(cudaDevAttrUnifiedAddressing=", unified, ")");
  constexpr uint64_t kBytes = uint64_t{4} << 20;
  void* dev = nullptr;
  if (const cudaError_t e = cudaMalloc(&dev, kBytes); e != cudaSuccess) {
    report.Feature(kName, Verdict::kBroken, Describe("cudaMalloc", e));
    return;
  }
  std::vector<uint8_t> host(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) host[i] = ProbeByte(i);
  cudaIpcMemHandle_t handle{};
  cudaError_t e = cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    report.Feature(kName, Verdict::kBroken, Describe("cudaMemcpy", e));
  } else if (e = cudaIpcGetMemHandle(&handle, dev); e != cudaSuccess) {
    report.Failed(kName, unified == 1, e,
                  absl::StrCat(Describe("cudaIpcGetMemHandle", e), " ", attrs));
  } else {
    ChildRun run({"--child-memory",
                  gpu_test::Hex({reinterpret_cast<const char*>(&handle), sizeof(handle)}),
                  std::to_string(kBytes)});
    std::string line;
    if (!run.Line(std::chrono::seconds(30), &line)) {
      report.Feature(kName, Verdict::kBroken,
                     absl::StrCat("the second process did not answer within 30 s ", run.error));
    } else if (line == "OK") {
      report.Feature(kName, Verdict::kSupported,
                     absl::StrCat("4 MiB read back by a second process ", attrs));
    } else if (const int code = ChildErrorCode(line); code >= 0) {
      report.Failed(kName, unified == 1, code,
                    absl::StrCat("second process: ", line.substr(4), " ", attrs));
    } else {
      report.Feature(kName, Verdict::kBroken, absl::StrCat("second process: ", line));
    }
  }
  (void)cudaFree(dev);
}

void ProbeIpcEvents(Report& report) {
  const char* kName = "ipc_events";
  const int attr = Attribute(cudaDevAttrIpcEventSupport);
  const std::string attrs = absl::StrCat("(cudaDevAttrIpcEventSupport=", attr, ")");
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess);
  if (e != cudaSuccess) {
    report.Failed(kName, attr == 1, e,
                  absl::StrCat(Describe("cudaEventCreateWithFlags(Interprocess)", e), " ", attrs));
    return;
  }
  cudaIpcEventHandle_t handle{};
  if (e = cudaIpcGetEventHandle(&handle, event); e != cudaSuccess) {
    report.Failed(kName, attr == 1, e,
                  absl::StrCat(Describe("cudaIpcGetEventHandle", e), " ", attrs));
    (void)cudaEventDestroy(event);
    return;
  }
  // The child records on a stream held by a host function until we say GO: the record must be
  // seen pending here, then complete.
  ChildRun run(
      {"--child-event", gpu_test::Hex({reinterpret_cast<const char*>(&handle), sizeof(handle)})});
  std::string line;
  std::string verdict_detail;
  Verdict verdict = Verdict::kBroken;
  int failed_code = -1;
  if (!run.Line(std::chrono::seconds(30), &line)) {
    verdict_detail = absl::StrCat("the second process did not answer within 30 s ", run.error);
  } else if (const int code = ChildErrorCode(line); code >= 0) {
    failed_code = code;
    verdict_detail = absl::StrCat("second process: ", line.substr(4), " ", attrs);
  } else if (line != "RECORDED") {
    verdict_detail = absl::StrCat("second process: ", line);
  } else if (e = cudaEventQuery(event); e != cudaErrorNotReady) {
    verdict_detail = absl::StrCat("a record pending in the second process reads ",
                                  cudaGetErrorName(e), " here, not cudaErrorNotReady");
    run.Send("GO");
  } else {
    const auto t0 = Clock::now();
    run.Send("GO");
    while ((e = cudaEventQuery(event)) == cudaErrorNotReady &&
           Clock::now() - t0 < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (e != cudaSuccess) {
      verdict_detail =
          absl::StrCat("the second process's record never completed here: ", cudaGetErrorName(e));
    } else if (!run.Line(std::chrono::seconds(10), &line) || line != "DONE") {
      verdict_detail = absl::StrCat("second process after GO: ", line);
    } else {
      verdict = Verdict::kSupported;
      verdict_detail =
          absl::StrCat("a record in a second process seen pending, then complete ",
                       static_cast<int64_t>(us), " us after its stream went on ", attrs);
    }
  }
  if (failed_code >= 0) {
    report.Failed(kName, attr == 1, failed_code, verdict_detail);
  } else {
    report.Feature(kName, verdict, verdict_detail);
  }
  (void)cudaEventDestroy(event);
}

// ---- stream memory operations on a shared, registered host word

struct MemOps {
  PFN_cuStreamWaitValue64_v11070 wait = nullptr;
  PFN_cuStreamWriteValue64_v11070 write = nullptr;
  std::string error;
};

MemOps LoadMemOps() {
  MemOps m;
  cudaDriverEntryPointQueryResult q1{}, q2{};
  const cudaError_t e1 = cudaGetDriverEntryPointByVersion(
      "cuStreamWaitValue64", reinterpret_cast<void**>(&m.wait), 11070, cudaEnableDefault, &q1);
  const cudaError_t e2 = cudaGetDriverEntryPointByVersion(
      "cuStreamWriteValue64", reinterpret_cast<void**>(&m.write), 11070, cudaEnableDefault, &q2);
  if (e1 != cudaSuccess || e2 != cudaSuccess || q1 != cudaDriverEntryPointSuccess ||
      q2 != cudaDriverEntryPointSuccess || m.wait == nullptr || m.write == nullptr) {
    m.error = absl::StrCat("the driver has no cuStreamWaitValue64/cuStreamWriteValue64 (",
                           cudaGetErrorName(e1), ", ", cudaGetErrorName(e2), ")");
    m.wait = nullptr;
    m.write = nullptr;
  }
  return m;
}

constexpr size_t kWordBytes = 4096;

// Maps and registers the shared memory of `fd`; the device address of its first byte.
std::string MapWords(int fd, volatile uint64_t** host, CUdeviceptr* dev) {
  void* p = ::mmap(nullptr, kWordBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return "mmap of the shared words failed";
  if (const cudaError_t e =
          cudaHostRegister(p, kWordBytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      e != cudaSuccess) {
    return absl::StrCat("ERR ", static_cast<int>(e), " ", Describe("cudaHostRegister(shared)", e));
  }
  void* d = nullptr;
  if (const cudaError_t e = cudaHostGetDevicePointer(&d, p, 0); e != cudaSuccess) {
    return absl::StrCat("ERR ", static_cast<int>(e), " ", Describe("cudaHostGetDevicePointer", e));
  }
  *host = static_cast<volatile uint64_t*>(p);
  *dev = reinterpret_cast<CUdeviceptr>(d);
  return "";
}

void ProbeStreamMemOps(Report& report) {
  const char* kName = "stream_mem_ops";
  const MemOps ops = LoadMemOps();
  if (ops.wait == nullptr) {
    report.Feature(kName, Verdict::kUnsupported, ops.error);
    return;
  }
  const int fd = ::memfd_create("expertd-probe-words", 0);
  if (fd < 0 || ::ftruncate(fd, kWordBytes) != 0) {
    report.Feature(kName, Verdict::kBroken, "memfd_create/ftruncate failed");
    return;
  }
  volatile uint64_t* words = nullptr;
  CUdeviceptr dev = 0;
  if (std::string err = MapWords(fd, &words, &dev); !err.empty()) {
    report.Feature(kName, Verdict::kUnsupported, err);
    ::close(fd);
    return;
  }
  cudaStream_t stream = nullptr;
  (void)cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  // words[0]: this process's stream writes 1; the second process's stream waits for it, then
  // writes words[1] = 1.
  ChildRun run({"--child-memops", absl::StrCat("/proc/", ::getpid(), "/fd/", fd)});
  std::string line;
  Verdict verdict = Verdict::kBroken;
  std::string detail;
  if (!run.Line(std::chrono::seconds(30), &line)) {
    detail = absl::StrCat("the second process did not answer within 30 s ", run.error);
  } else if (ChildErrorCode(line) >= 0) {
    verdict = IsUnsupportedCode(ChildErrorCode(line)) ? Verdict::kUnsupported : Verdict::kBroken;
    detail = absl::StrCat("second process: ", line.substr(4));
  } else if (line != "QUEUED") {
    detail = absl::StrCat("second process: ", line);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (words[1] != 0) {
      detail = "the second process's stream went past its wait before the word was written";
    } else {
      const auto t0 = Clock::now();
      const CUresult r = ops.write(reinterpret_cast<CUstream>(stream), dev, 1, 0);
      while (r == CUDA_SUCCESS && words[1] != 1 && Clock::now() - t0 < std::chrono::seconds(10)) {
        std::atomic_thread_fence(std::memory_order_acquire);
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (r != CUDA_SUCCESS) {
        verdict = Verdict::kUnsupported;
        detail = absl::StrCat("cuStreamWriteValue64 here: CUresult ", static_cast<int>(r));
      } else if (words[1] != 1) {
        detail = "the second process's stream never passed its wait (10 s)";
      } else if (!run.Line(std::chrono::seconds(10), &line) || line != "DONE") {
        detail = absl::StrCat("second process after the write: ", line);
      } else {
        verdict = Verdict::kSupported;
        detail = absl::StrCat(
            "a wait in a second process held 50 ms, then passed; its write back seen here ",
            static_cast<int64_t>(us), " us after this stream's write");
      }
    }
  }
  report.Feature(kName, verdict, detail);
  (void)cudaStreamDestroy(stream);
  (void)cudaHostUnregister(const_cast<uint64_t*>(words));
  ::munmap(const_cast<uint64_t*>(words), kWordBytes);
  ::close(fd);
}

// cudaHostRegister of `bytes` of anonymous memory (PROT_READ only when `read_only`), then a copy
// from it to the GPU and back, compared.
void ProbeHostRegister(Report& report, bool read_only) {
  const char* name = read_only ? "host_register_read_only" : "host_register";
  const int attr = Attribute(read_only ? cudaDevAttrHostRegisterReadOnlySupported
                                       : cudaDevAttrHostRegisterSupported);
  const std::string attrs = absl::StrCat(read_only ? "(cudaDevAttrHostRegisterReadOnlySupported="
                                                   : "(cudaDevAttrHostRegisterSupported=",
                                         attr, ")");
  constexpr size_t kBytes = size_t{8} << 20;
  void* mem = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    report.Feature(name, Verdict::kBroken, absl::StrCat("mmap: ", std::strerror(errno)));
    return;
  }
  auto* bytes = static_cast<uint8_t*>(mem);
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = ProbeByte(i);
  if (read_only) ::mprotect(mem, kBytes, PROT_READ);
  const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
  cudaError_t e = cudaHostRegister(mem, kBytes, flags);
  if (e != cudaSuccess) {
    report.Failed(name, attr == 1, e, absl::StrCat(Describe("cudaHostRegister", e), " ", attrs));
    ::munmap(mem, kBytes);
    return;
  }
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<uint8_t> back(kBytes);
  std::string failure;
  if (e = cudaMalloc(&dev, kBytes); e != cudaSuccess) {
    failure = Describe("cudaMalloc", e);
  } else if (e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    failure = Describe("cudaStreamCreateWithFlags", e);
  } else if (e = cudaMemcpyAsync(dev, mem, kBytes, cudaMemcpyHostToDevice, stream);
             e != cudaSuccess) {
    failure = Describe("cudaMemcpyAsync from registered memory", e);
  } else if (e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    failure = Describe("cudaStreamSynchronize", e);
  } else if (e = cudaMemcpy(back.data(), dev, kBytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
    failure = Describe("cudaMemcpy back", e);
  } else if (std::memcmp(back.data(), mem, kBytes) != 0) {
    failure = "the bytes copied from registered memory differ";
  }
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  if (dev != nullptr) (void)cudaFree(dev);
  const cudaError_t unreg = cudaHostUnregister(mem);
  if (failure.empty() && unreg != cudaSuccess) failure = Describe("cudaHostUnregister", unreg);
  ::munmap(mem, kBytes);
  report.Feature(name, failure.empty() ? Verdict::kSupported : Verdict::kBroken,
                 failure.empty() ? absl::StrCat("8 MiB registered, copied and checked ", attrs)
                                 : absl::StrCat(failure, " ", attrs));
}

void ProbeStreamPriorities(Report& report) {
  const char* kName = "stream_priorities";
  int least = 0;
  int greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (e != cudaSuccess) {
    report.Failed(kName, true, e, Describe("cudaDeviceGetStreamPriorityRange", e));
    return;
  }
  const std::string range = absl::StrCat("least ", least, ", greatest ", greatest);
  if (greatest >= least) {
    report.Feature(kName, Verdict::kUnsupported,
                   absl::StrCat("one level (", range, "): demand copies are not favoured"));
    return;
  }
  cudaStream_t stream = nullptr;
  if (e = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
      e != cudaSuccess) {
    report.Failed(kName, true, e, Describe("cudaStreamCreateWithPriority", e));
    return;
  }
  (void)cudaStreamDestroy(stream);
  report.Feature(kName, Verdict::kSupported, range);
}

// ---- the second process

// The child's answer is its first line; it exits 0 whatever the answer (1: bad arguments).
int ChildAnswer(const std::string& line, int rc = 0) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return rc;
}

int ChildError(const char* call, cudaError_t e) {
  return ChildAnswer(absl::StrCat("ERR ", static_cast<int>(e), " ", Describe(call, e)));
}

template <typename T>
bool HandleFromHex(const std::string& hex, T* handle) {
  std::string raw;
  if (!gpu_test::Unhex(hex, &raw) || raw.size() != sizeof(T)) return false;
  std::memcpy(handle, raw.data(), sizeof(T));
  return true;
}

int ChildMemory(const std::string& hex, uint64_t bytes) {
  cudaIpcMemHandle_t handle{};
  if (!HandleFromHex(hex, &handle)) return ChildAnswer("bad handle", 1);
  if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess)
    return ChildError("cudaSetDevice", e);
  void* dev = nullptr;
  if (const cudaError_t e = cudaIpcOpenMemHandle(&dev, handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    return ChildError("cudaIpcOpenMemHandle", e);
  }
  std::vector<uint8_t> host(bytes);
  if (const cudaError_t e = cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return ChildError("cudaMemcpy from the opened memory", e);
  }
  for (uint64_t i = 0; i < bytes; ++i) {
    if (host[i] != ProbeByte(i)) {
      return ChildAnswer(absl::StrCat("MISMATCH at byte ", i, " of the opened memory"));
    }
  }
  if (const cudaError_t e = cudaIpcCloseMemHandle(dev); e != cudaSuccess) {
    return ChildAnswer(absl::StrCat("bytes right, but ", Describe("cudaIpcCloseMemHandle", e)));
  }
  return ChildAnswer("OK");
}

// Runs on the stream: holds it until the parent says GO on our stdin.
void CUDART_CB HoldUntilGo(void*) {
  std::string line;
  gpu_test::ReadLine(stdin, &line);
}

int ChildEvent(const std::string& hex) {
  cudaIpcEventHandle_t handle{};
  if (!HandleFromHex(hex, &handle)) return ChildAnswer("bad handle", 1);
  if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess)
    return ChildError("cudaSetDevice", e);
  cudaEvent_t event = nullptr;
  if (const cudaError_t e = cudaIpcOpenEventHandle(&event, handle); e != cudaSuccess) {
    return ChildError("cudaIpcOpenEventHandle", e);
  }
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return ChildError("cudaStreamCreateWithFlags", e);
  }
  if (const cudaError_t e = cudaLaunchHostFunc(stream, HoldUntilGo, nullptr); e != cudaSuccess) {
    return ChildError("cudaLaunchHostFunc", e);
  }
  if (const cudaError_t e = cudaEventRecord(event, stream); e != cudaSuccess) {
    return ChildError("cudaEventRecord of the opened event", e);
  }
  ChildAnswer("RECORDED");
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return ChildError("cudaStreamSynchronize", e);
  }
  (void)cudaStreamDestroy(stream);
  (void)cudaEventDestroy(event);
  return ChildAnswer("DONE");
}

int ChildMemOps(const std::string& path) {
  const MemOps ops = LoadMemOps();
  if (ops.wait == nullptr) return ChildAnswer(absl::StrCat("NOOPS ", ops.error));
  if (const cudaError_t e = cudaSetDevice(0); e != cudaSuccess)
    return ChildError("cudaSetDevice", e);
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return ChildAnswer(absl::StrCat("cannot open ", path));
  volatile uint64_t* words = nullptr;
  CUdeviceptr dev = 0;
  if (std::string err = MapWords(fd, &words, &dev); !err.empty()) return ChildAnswer(err);
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return ChildError("cudaStreamCreateWithFlags", e);
  }
  const auto s = reinterpret_cast<CUstream>(stream);
  if (CUresult r = ops.wait(s, dev, 1, CU_STREAM_WAIT_VALUE_GEQ); r != CUDA_SUCCESS) {
    return ChildAnswer(absl::StrCat("cuStreamWaitValue64: CUresult ", static_cast<int>(r)));
  }
  if (CUresult r = ops.write(s, dev + sizeof(uint64_t), 1, 0); r != CUDA_SUCCESS) {
    return ChildAnswer(absl::StrCat("cuStreamWriteValue64: CUresult ", static_cast<int>(r)));
  }
  ChildAnswer("QUEUED");
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return ChildError("cudaStreamSynchronize", e);
  }
  return ChildAnswer("DONE");
}

int Run(bool require_supported) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA GPU here (%s)\n",
                e != cudaSuccess ? Describe("cudaGetDeviceCount", e).c_str() : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t pe = cudaGetDeviceProperties(&prop, 0); pe != cudaSuccess) {
    std::printf("FAIL: %s\n", Describe("cudaGetDeviceProperties", pe).c_str());
    return 1;
  }
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("device 0 of %d: %s, compute %d.%d, compute mode %d; runtime %d\n", count, prop.name,
              prop.major, prop.minor, Attribute(cudaDevAttrComputeMode), runtime);
  if (const cudaError_t se = cudaSetDevice(0); se != cudaSuccess) {
    std::printf("FAIL: %s\n", Describe("cudaSetDevice", se).c_str());
    return 1;
  }
  Report report;
  ProbeIpcMemory(report);
  ProbeIpcEvents(report);
  ProbeHostRegister(report, /*read_only=*/false);
  ProbeHostRegister(report, /*read_only=*/true);
  ProbeStreamPriorities(report);
  ProbeStreamMemOps(report);
  std::printf("cuda_feature_probe: %d supported, %d unsupported, %d broken\n", report.supported,
              report.unsupported, report.broken);
  if (report.broken > 0) return 1;
  return require_supported && report.unsupported > 0 ? 3 : 0;
}

}  // namespace
}  // namespace expertd

int main(int argc, char** argv) {
  ::alarm(120);  // a hung CUDA call ends the probe
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--child-memory" && argc == 4) {
    return expertd::ChildMemory(argv[2], std::strtoull(argv[3], nullptr, 10));
  }
  if (mode == "--child-event" && argc == 3) return expertd::ChildEvent(argv[2]);
  if (mode == "--child-memops" && argc == 3) return expertd::ChildMemOps(argv[2]);
  if (argc > 2 || (argc == 2 && mode != "--require-supported")) {
    std::fprintf(stderr, "usage: cuda_feature_probe [--require-supported]\n");
    return 2;
  }
  return expertd::Run(mode == "--require-supported");
}
