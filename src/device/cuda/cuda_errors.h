// CUDA runtime errors as absl::Status, and which of them leave the CUDA context unusable
// ("sticky"). Pure logic on integer codes: no CUDA header here, so it is unit-tested on machines
// without the toolkit. cuda_check.cpp static_asserts every code below against the toolkit's
// cudaError_t, so a renumbering breaks the build instead of the classification.
#pragma once

#include <atomic>
#include <mutex>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace expertd::cuda {

// cudaError_t values (CUDA 12 and 13 share them) that the backend treats specially.
namespace code {
inline constexpr int kSuccess = 0;
inline constexpr int kInvalidValue = 1;
inline constexpr int kMemoryAllocation = 2;
inline constexpr int kInitializationError = 3;
inline constexpr int kCudartUnloading = 4;
inline constexpr int kInvalidHostPointer = 16;
inline constexpr int kInvalidDevicePointer = 17;
inline constexpr int kStubLibrary = 34;
inline constexpr int kInsufficientDriver = 35;
inline constexpr int kCallRequiresNewerDriver = 36;
inline constexpr int kDevicesUnavailable = 46;
inline constexpr int kNoDevice = 100;
inline constexpr int kInvalidDevice = 101;
inline constexpr int kMapBufferObjectFailed = 205;
inline constexpr int kAlreadyMapped = 208;
inline constexpr int kEccUncorrectable = 214;
inline constexpr int kNvlinkUncorrectable = 220;
inline constexpr int kContained = 226;
inline constexpr int kOperatingSystem = 304;
inline constexpr int kInvalidResourceHandle = 400;
inline constexpr int kNotReady = 600;
inline constexpr int kIllegalAddress = 700;
inline constexpr int kLaunchTimeout = 702;
inline constexpr int kContextIsDestroyed = 709;
inline constexpr int kAssert = 710;
inline constexpr int kHostMemoryAlreadyRegistered = 712;
inline constexpr int kHostMemoryNotRegistered = 713;
inline constexpr int kHardwareStackError = 714;
inline constexpr int kIllegalInstruction = 715;
inline constexpr int kMisalignedAddress = 716;
inline constexpr int kInvalidAddressSpace = 717;
inline constexpr int kInvalidPc = 718;
inline constexpr int kLaunchFailure = 719;
inline constexpr int kTensorMemoryLeak = 721;
inline constexpr int kNotPermitted = 800;
inline constexpr int kNotSupported = 801;
inline constexpr int kSystemNotReady = 802;
inline constexpr int kSystemDriverMismatch = 803;
inline constexpr int kMpsClientTerminated = 810;
inline constexpr int kExternalDevice = 911;
inline constexpr int kUnknown = 999;
}  // namespace code

enum class CudaErrorClass {
  kOk,
  kSticky,             // the context is corrupted or the device lost: restart the process
  kDeviceUnavailable,  // no driver / no device / busy: fall back to the host device at start
  kOutOfMemory,        // device or pinned memory exhausted
  kUnsupported,        // the platform or device does not support the operation
  kInvalidArgument,    // a bad pointer, value or handle
  kAlreadyRegistered,  // cudaHostRegister on a page that is registered already
  kNotReady,           // cudaEventQuery / cudaStreamQuery: still running (not an error)
  kOther,
};

// Sticky: the CUDA 13 headers say "the process must be terminated and relaunched" (illegal
// address, launch failure/timeout, hardware stack error, illegal instruction, misaligned
// address, invalid address space, invalid PC, device assert, contained error, tensor-memory
// leak, MPS client terminated, external device) plus the device-lost class (uncorrectable ECC or
// NVLink error, a destroyed context, cudaErrorUnknown). cudaErrorDevicesUnavailable is *not*
// sticky: it refuses a new context (exclusive mode, busy) and corrupts nothing.
CudaErrorClass ClassifyCudaError(int cuda_error);
inline bool IsStickyCudaError(int cuda_error) {
  return ClassifyCudaError(cuda_error) == CudaErrorClass::kSticky;
}

// The absl code a CUDA error becomes: ResourceExhausted (out of memory), InvalidArgument,
// Unavailable (no driver/device), Unimplemented (not supported), PermissionDenied,
// AlreadyExists (already registered), Internal (sticky and everything else).
absl::StatusCode StatusCodeForCudaError(int cuda_error);

// "<expr> failed at <file>:<line>: <name> (<text>)", with the numeric code attached as a payload
// (CudaErrorCodeOf). Called only on failure: messages are built only when something failed.
absl::Status MakeCudaError(int cuda_error, std::string_view name, std::string_view text,
                           std::string_view expr, std::string_view file, int line);

// The CUDA error code a status was made from (MakeCudaError), or nullopt.
std::optional<int> CudaErrorCodeOf(const absl::Status& status);
inline bool IsStickyCudaStatus(const absl::Status& status) {
  const std::optional<int> c = CudaErrorCodeOf(status);
  return c.has_value() && IsStickyCudaError(*c);
}

// "context: message" with the code and every payload kept.
absl::Status Annotate(const absl::Status& status, std::string_view context);

// Remembers the first sticky CUDA error a device saw; later ones are dropped (the first is the
// cause, the rest are echoes). Thread-safe; Get() is cheap while nothing went wrong.
class StickyErrorLatch {
 public:
  // Returns `status` unchanged, keeping it first when it is a sticky CUDA error.
  absl::Status Observe(absl::Status status);
  // OK, or the first sticky error.
  absl::Status Get() const;
  bool tripped() const { return tripped_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  absl::Status first_;
  std::atomic<bool> tripped_{false};
};

}  // namespace expertd::cuda
