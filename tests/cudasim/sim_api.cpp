// The CUDA simulator's C functions: the subset of the CUDA runtime API that expertd, its client
// library and its GPU tests call, with the same names and signatures (cuda_runtime_api.h), so
// linking the simulator in place of libcudart runs them without a GPU (see cudasim.h). This file:
// errors, devices, device memory and IPC memory handles, pinned and registered host memory;
// sim_streams.cpp: streams, copies and events.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cudasim.h"
#include "sim_runtime.h"

using expertd::cudasim::Allocation;
using expertd::cudasim::Cfg;
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

bool ValidDevice(int d) { return d >= 0 && d < Cfg().devices; }
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
  *count = Cfg().devices;
  return Cfg().devices > 0 ? cudaSuccess : Fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  SIM_ENTER();
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  SIM_ENTER();
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  SIM_ENTER();
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "expertd cudasim device %d", device);
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
  if (attr == cudaDevAttrHostRegisterSupported) *value = 1;
  if (attr == cudaDevAttrHostRegisterReadOnlySupported) *value = Cfg().read_only_register ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  SIM_ENTER();
  *leastPriority = 0;
  *greatestPriority = -5;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  SIM_ENTER();
  std::lock_guard lock(R().mu);
  *total = Cfg().memory_bytes;
  *free = Cfg().memory_bytes - R().device_used.at(static_cast<size_t>(t_device));
  return cudaSuccess;
}

// ---- device memory and IPC memory handles

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  SIM_ENTER();
  *devPtr = nullptr;
  if (size == 0) return cudaSuccess;
  const int device = t_device;
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
  static_assert(sizeof(h) == sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int) {
  SIM_ENTER();
  HandleBytes h{};
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kMemoryMagic, sizeof(h.magic)) != 0) return Fail(cudaErrorInvalidValue);
  // CUDA refuses to open a handle in the process that exported it.
  if (h.pid == ::getpid()) return Fail(cudaErrorDeviceUninitialized);
  std::lock_guard lock(R().mu);
  if (R().imported.contains({h.pid, h.key})) return Fail(cudaErrorAlreadyMapped);
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
  a.device = t_device;
  a.fd = fd;
  a.imported = true;
  a.owner_pid = h.pid;
  a.key = h.key;
  void* view = nullptr;
  if (MapAllocation(fd, h.bytes, &view, &a.shadow) != cudaSuccess) {
    ::close(fd);
    return Fail(cudaErrorMemoryAllocation);
  }
  R().allocations[reinterpret_cast<uintptr_t>(view)] = a;
  R().imported[{h.pid, h.key}] = reinterpret_cast<uintptr_t>(view);
  *devPtr = view;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  SIM_ENTER();
  std::lock_guard lock(R().mu);
  auto it = R().allocations.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == R().allocations.end() || !it->second.imported) return Fail(cudaErrorInvalidValue);
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
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(R().mu);
  auto it = R().host.upper_bound(addr + size - 1);
  if (it != R().host.begin() && std::prev(it)->first + std::prev(it)->second.bytes > addr) {
    return Fail(cudaErrorHostMemoryAlreadyRegistered);
  }
  R().host[addr] = HostRange{size, false};
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
