// The CUDA simulator's C functions: the subset of the CUDA runtime API that expertd, its client
// library and its GPU tests call, with the same names and signatures (cuda_runtime_api.h), so
// linking the simulator in place of libcudart runs them without a GPU (see cudasim.h). This file:
// errors, devices, device memory and IPC memory handles, pinned and registered host memory;
// sim_streams.cpp: streams, copies and events.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cudasim.h"
#include "sim_runtime.h"

using expertd::cudasim::Allocation;
using expertd::cudasim::Cfg;
using expertd::cudasim::CurrentOrdinal;
using expertd::cudasim::CurrentPhysical;
using expertd::cudasim::NoteContext;
using expertd::cudasim::Physical;
using expertd::cudasim::Event;
using expertd::cudasim::Fail;
using expertd::cudasim::g_sticky;
using expertd::cudasim::HandleBytes;
using expertd::cudasim::HostRange;
using expertd::cudasim::kHeaderBytes;
using expertd::cudasim::kMemoryMagic;
using expertd::cudasim::OpenPeerFd;
using expertd::cudasim::R;
using expertd::cudasim::t_device;
using expertd::cudasim::t_last_error;

namespace {

bool ValidDevice(int d) { return d >= 0 && static_cast<size_t>(d) < Cfg().visible.size(); }

// Whether every page of [begin, end) is mapped writable in this process (/proc/self/maps).
bool Writable(uintptr_t begin, uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t covered = begin;
  while (covered < end && std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    const size_t dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (hi <= covered || lo > covered) continue;
    if (perms.size() < 2 || perms[1] != 'w') return false;
    covered = hi;
  }
  return covered >= end;
}

// The simulated driver entry points the backend asks for (cudaGetDriverEntryPointByVersion):
// the calling thread's current context, as a token per ordinal, or none.
char g_context_tokens[32];
CUresult SimCtxGetCurrent(CUcontext* ctx) {
  *ctx = expertd::cudasim::t_device < 0
             ? nullptr
             : reinterpret_cast<CUcontext>(&g_context_tokens[expertd::cudasim::t_device]);
  return CUDA_SUCCESS;
}
CUresult SimCtxSetCurrent(CUcontext ctx) {
  if (ctx == nullptr) {
    expertd::cudasim::t_device = -1;
    return CUDA_SUCCESS;
  }
  const auto* token = reinterpret_cast<const char*>(ctx);
  if (token < g_context_tokens || token >= g_context_tokens + sizeof g_context_tokens) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  expertd::cudasim::t_device = static_cast<int>(token - g_context_tokens);
  return CUDA_SUCCESS;
}
// Maps `bytes` of an allocation file twice: the PROT_NONE "device" view and the shadow.
cudaError_t MapAllocation(int fd, uint64_t bytes, void** device, uint8_t** shadow) {
  void* d = ::mmap(nullptr, bytes, PROT_NONE, MAP_SHARED, fd, kHeaderBytes);
  if (d == MAP_FAILED) return cudaErrorMemoryAllocation;
  void* s = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, kHeaderBytes);
  if (s == MAP_FAILED) {
    ::munmap(d, bytes);
    return cudaErrorMemoryAllocation;
  }
  *device = d;
  *shadow = static_cast<uint8_t*>(s);
  return cudaSuccess;
}
const char* ErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorAlreadyMapped:
      return "cudaErrorAlreadyMapped";
    case cudaErrorDeviceUninitialized:
      return "cudaErrorDeviceUninitialized";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorPeerAccessNotEnabled:
      return "cudaErrorPeerAccessNotEnabled";
    case cudaErrorContextIsDestroyed:
      return "cudaErrorContextIsDestroyed";
    default:
      return "cudaErrorUnknown";
  }
}

const char* ErrorText(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorAlreadyMapped:
      return "resource already mapped";
    case cudaErrorDeviceUninitialized:
      return "invalid device context";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorPeerAccessNotEnabled:
      return "peer access has not been enabled";
    case cudaErrorContextIsDestroyed:
      return "context is destroyed";
    default:
      return "unknown error (simulated runtime)";
  }
}
}  // namespace

extern "C" {

// nvcc's registration hooks for .cu files (no kernels of ours run in the simulator).
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}

void* expertd_cudasim_device_bytes(const void* device_ptr, size_t bytes) {
  std::lock_guard lock(R().mu);
  return R().Shadow(device_ptr, bytes);
}

void expertd_cudasim_open_imports(int* memory_handles, int* events) {
  std::lock_guard lock(R().mu);
  *memory_handles = static_cast<int>(R().imported.size());
  *events = 0;
  for (const Event* e : R().events) *events += e->imported ? 1 : 0;
}

void expertd_cudasim_contexts(unsigned* physical_mask, int* peer_mappings,
                              int* wrong_device_records) {
  std::lock_guard lock(R().mu);
  *physical_mask = R().contexts;
  *peer_mappings = static_cast<int>(R().peer_mappings);
  *wrong_device_records = static_cast<int>(R().wrong_device_records);
}

void expertd_cudasim_destroy_context(int error) {
  std::lock_guard lock(R().mu);
  for (expertd::cudasim::EventState* st : R().recorded_here) {
    if (st->completed.load() < st->recorded.load()) st->error.store(error);
  }
  int expected = 0;
  g_sticky.compare_exchange_strong(expected, error);
  std::fprintf(stderr, "expertd cudasim: this process's context was destroyed (%s)\n",
               ErrorName(static_cast<cudaError_t>(error)));
}

void expertd_cudasim_kernel_delay(unsigned long long extra_ns) {
  expertd::cudasim::OperationDelay(extra_ns);
}

}  // extern "C"

// ---- errors, versions, devices

cudaError_t cudaGetLastError(void) {
  if (const int s = g_sticky.load(); s != 0) return static_cast<cudaError_t>(s);
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t error) { return ErrorName(error); }
const char* cudaGetErrorString(cudaError_t error) { return ErrorText(error); }

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  SIM_ENTER();
  *count = static_cast<int>(Cfg().visible.size());
  return *count > 0 ? cudaSuccess : Fail(cudaErrorNoDevice);
}

// As since CUDA 12: makes the device's primary context current, creating it.
cudaError_t cudaSetDevice(int device) {
  SIM_ENTER();
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  t_device = device;
  NoteContext(device);
  return cudaSuccess;
}

// A thread that never chose a device is on device 0 (nothing is created by asking).
cudaError_t cudaGetDevice(int* device) {
  SIM_ENTER();
  *device = t_device < 0 ? 0 : t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  SIM_ENTER();
  void* f = nullptr;
  if (std::strcmp(symbol, "cuCtxGetCurrent") == 0) f = reinterpret_cast<void*>(&SimCtxGetCurrent);
  if (std::strcmp(symbol, "cuCtxSetCurrent") == 0) f = reinterpret_cast<void*>(&SimCtxSetCurrent);
  if (std::strcmp(symbol, "cuStreamWaitValue64") == 0) {
    f = reinterpret_cast<void*>(&expertd::cudasim::StreamWaitValue64);
  }
  if (std::strcmp(symbol, "cuStreamWriteValue64") == 0) {
    f = reinterpret_cast<void*>(&expertd::cudasim::StreamWriteValue64);
  }
  *funcPtr = f;
  if (driverStatus != nullptr) {
    *driverStatus = f != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  SIM_ENTER();
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  const int physical = Physical(device);
  std::snprintf(prop->name, sizeof(prop->name), "expertd cudasim device %d", physical);
  // A UUID per physical device, the same in every process whatever its visible ordering.
  std::snprintf(prop->uuid.bytes, sizeof(prop->uuid.bytes), "xdsim-gpu-%05d", physical);
  prop->pciBusID = physical + 1;
  prop->totalGlobalMem = Cfg().memory_bytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  SIM_ENTER();
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  *value = 0;
  if (attr == cudaDevAttrHostRegisterSupported || attr == cudaDevAttrIpcEventSupport ||
      attr == cudaDevAttrUnifiedAddressing) {
    *value = 1;  // what an H200 reports
  }
  if (attr == cudaDevAttrHostRegisterReadOnlySupported) *value = Cfg().read_only_register ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  SIM_ENTER();
  (void)CurrentOrdinal();
  *leastPriority = 0;
  *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  SIM_ENTER();
  const int device = CurrentPhysical();
  std::lock_guard lock(R().mu);
  *total = Cfg().memory_bytes;
  *free = Cfg().memory_bytes - R().device_used.at(static_cast<size_t>(device));
  return cudaSuccess;
}

// ---- device memory and IPC memory handles

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  SIM_ENTER();
  *devPtr = nullptr;
  if (size == 0) return cudaSuccess;
  const int device = CurrentPhysical();
  std::lock_guard lock(R().mu);
  uint64_t& used = R().device_used.at(static_cast<size_t>(device));
  if (size > Cfg().memory_bytes - used) return Fail(cudaErrorMemoryAllocation);
  const int fd = ::memfd_create("expertd-cudasim-memory", MFD_CLOEXEC);
  if (fd < 0) return Fail(cudaErrorMemoryAllocation);
  Allocation a;
  a.bytes = size;
  a.device = device;
  a.fd = fd;
  a.owner_pid = ::getpid();
  a.key = R().next_key++;
  HandleBytes header{};
  std::memcpy(header.magic, kMemoryMagic, sizeof(header.magic));
  header.pid = a.owner_pid;
  header.fd = fd;
  header.key = a.key;
  header.bytes = size;
  header.device = device;
  void* view = nullptr;
  if (::ftruncate(fd, static_cast<off_t>(kHeaderBytes + size)) != 0 ||
      ::pwrite(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header)) ||
      MapAllocation(fd, size, &view, &a.shadow) != cudaSuccess) {
    ::close(fd);
    return Fail(cudaErrorMemoryAllocation);
  }
  used += size;
  R().allocations[reinterpret_cast<uintptr_t>(view)] = a;
  *devPtr = view;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  SIM_ENTER();
  if (devPtr == nullptr) return cudaSuccess;
  int device = 0;
  {
    std::lock_guard lock(R().mu);
    auto it = R().allocations.find(reinterpret_cast<uintptr_t>(devPtr));
    if (it == R().allocations.end() || it->second.imported) return Fail(cudaErrorInvalidValue);
    device = it->second.device;
  }
  R().SyncDevice(device);  // cudaFree waits for the device's work, as CUDA's does
  std::lock_guard lock(R().mu);
  auto it = R().allocations.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == R().allocations.end()) return Fail(cudaErrorInvalidValue);
  ::munmap(devPtr, it->second.bytes);
  ::munmap(it->second.shadow, it->second.bytes);
  ::close(it->second.fd);
  R().device_used.at(static_cast<size_t>(device)) -= it->second.bytes;
  R().allocations.erase(it);
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  SIM_ENTER();
  (void)CurrentOrdinal();
  std::lock_guard lock(R().mu);
  auto it = R().allocations.upper_bound(reinterpret_cast<uintptr_t>(devPtr));
  if (it == R().allocations.begin()) return Fail(cudaErrorInvalidValue);
  --it;
  const Allocation& a = it->second;
  if (a.imported || reinterpret_cast<uintptr_t>(devPtr) - it->first >= a.bytes) {
    return Fail(cudaErrorInvalidValue);
  }
  HandleBytes h{};
  std::memcpy(h.magic, kMemoryMagic, sizeof(h.magic));
  h.pid = a.owner_pid;
  h.fd = a.fd;
  h.key = a.key;
  h.bytes = a.bytes;
  h.device = a.device;
  static_assert(sizeof(h) == sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

// Opening a handle this process has open already returns the same pointer and counts the open
// (CUDA: "the reference count on the handle is incremented by 1"); each open needs its close.
// Memory of another device than the current one is mapped over the peer link, which needs
// cudaIpcMemLazyEnablePeerAccess (else cudaErrorPeerAccessNotEnabled) and is counted.
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  SIM_ENTER();
  const int current = CurrentPhysical();
  HandleBytes h{};
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kMemoryMagic, sizeof(h.magic)) != 0) return Fail(cudaErrorInvalidValue);
  if ((flags & ~unsigned{cudaIpcMemLazyEnablePeerAccess}) != 0) return Fail(cudaErrorInvalidValue);
  // CUDA refuses to open a handle in the process that exported it.
  if (h.pid == ::getpid()) return Fail(cudaErrorDeviceUninitialized);
  const bool peer = h.device != current;
  if (peer && (flags & cudaIpcMemLazyEnablePeerAccess) == 0) {
    return Fail(cudaErrorPeerAccessNotEnabled);
  }
  std::lock_guard lock(R().mu);
  if (auto it = R().imported.find({h.pid, h.key}); it != R().imported.end()) {
    ++R().allocations.at(it->second).opens;
    *devPtr = reinterpret_cast<void*>(it->second);
    return cudaSuccess;
  }
  const int fd = OpenPeerFd(h.pid, h.fd);
  if (fd < 0) return Fail(cudaErrorInvalidValue);  // the exporter is gone
  HandleBytes header{};
  if (::pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header)) ||
      std::memcmp(&header, &h, 32) != 0) {
    ::close(fd);
    return Fail(cudaErrorInvalidValue);  // the fd now names something else: a stale handle
  }
  Allocation a;
  a.bytes = h.bytes;
  a.device = h.device;
  a.fd = fd;
  a.imported = true;
  a.opens = 1;
  a.owner_pid = h.pid;
  a.key = h.key;
  void* view = nullptr;
  if (MapAllocation(fd, h.bytes, &view, &a.shadow) != cudaSuccess) {
    ::close(fd);
    return Fail(cudaErrorMemoryAllocation);
  }
  R().allocations[reinterpret_cast<uintptr_t>(view)] = a;
  R().imported[{h.pid, h.key}] = reinterpret_cast<uintptr_t>(view);
  if (peer) ++R().peer_mappings;
  *devPtr = view;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  SIM_ENTER();
  std::lock_guard lock(R().mu);
  auto it = R().allocations.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == R().allocations.end() || !it->second.imported) return Fail(cudaErrorInvalidValue);
  if (--it->second.opens > 0) return cudaSuccess;
  ::munmap(devPtr, it->second.bytes);
  ::munmap(it->second.shadow, it->second.bytes);
  ::close(it->second.fd);
  R().imported.erase({it->second.owner_pid, it->second.key});
  R().allocations.erase(it);
  return cudaSuccess;
}

// ---- pinned and registered host memory

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
  SIM_ENTER();
  (void)CurrentOrdinal();
  *pHost = nullptr;
  if (size == 0) return Fail(cudaErrorInvalidValue);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Fail(cudaErrorMemoryAllocation);
  std::lock_guard lock(R().mu);
  R().host[reinterpret_cast<uintptr_t>(p)] = HostRange{size, true};
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  SIM_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard lock(R().mu);
  auto it = R().host.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == R().host.end() || !it->second.allocated) return Fail(cudaErrorInvalidValue);
  ::munmap(ptr, it->second.bytes);
  R().host.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  SIM_ENTER();
  if (ptr == nullptr || size == 0) return Fail(cudaErrorInvalidValue);
  (void)CurrentOrdinal();
  if ((flags & cudaHostRegisterReadOnly) != 0 && !Cfg().read_only_register) {
    return Fail(cudaErrorNotSupported);
  }
  // The range must be mapped: mincore fails with ENOMEM on a hole.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(ptr) + size + page - 1) & ~(page - 1);
  std::vector<unsigned char> residency((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, residency.data()) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  // Memory the process may only read needs cudaHostRegisterReadOnly (where the platform does
  // not use the host's page tables, e.g. x86 with a discrete GPU): the driver pins for write.
  if ((flags & cudaHostRegisterReadOnly) == 0 && !Writable(begin, end)) {
    return Fail(cudaErrorInvalidValue);
  }
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(R().mu);
  auto it = R().host.upper_bound(addr + size - 1);
  if (it != R().host.begin() && std::prev(it)->first + std::prev(it)->second.bytes > addr) {
    return Fail(cudaErrorHostMemoryAlreadyRegistered);
  }
  R().host[addr] = HostRange{size, false};
  return cudaSuccess;
}

// With unified addressing (every simulated device has it) a registered or pinned host range has
// the same address on the device.
cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  SIM_ENTER();
  if (pDevice == nullptr || flags != 0) return Fail(cudaErrorInvalidValue);
  const auto a = reinterpret_cast<uintptr_t>(pHost);
  std::lock_guard lock(R().mu);
  auto it = R().host.upper_bound(a);
  if (it == R().host.begin() || a >= std::prev(it)->first + std::prev(it)->second.bytes) {
    return Fail(cudaErrorInvalidValue);
  }
  *pDevice = pHost;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  SIM_ENTER();
  std::lock_guard lock(R().mu);
  auto it = R().host.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == R().host.end() || it->second.allocated) {
    return Fail(cudaErrorHostMemoryNotRegistered);
  }
  R().host.erase(it);
  return cudaSuccess;
}
