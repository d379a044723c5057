// Classification and formatting of CUDA errors (no CUDA headers; see cuda_errors.h).
#include "device/cuda/cuda_errors.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

constexpr std::string_view kCodePayload = "type.expertd/cuda-error";

}  // namespace

CudaErrorClass ClassifyCudaError(int e) {
  switch (e) {
    case code::kSuccess:
      return CudaErrorClass::kOk;
    case code::kIllegalAddress:
    case code::kLaunchTimeout:
    case code::kAssert:
    case code::kHardwareStackError:
    case code::kIllegalInstruction:
    case code::kMisalignedAddress:
    case code::kInvalidAddressSpace:
    case code::kInvalidPc:
    case code::kLaunchFailure:
    case code::kTensorMemoryLeak:
    case code::kContained:
    case code::kMpsClientTerminated:
    case code::kExternalDevice:
    case code::kEccUncorrectable:
    case code::kNvlinkUncorrectable:
    case code::kContextIsDestroyed:
    case code::kUnknown:
      return CudaErrorClass::kSticky;
    case code::kInitializationError:
    case code::kStubLibrary:
    case code::kInsufficientDriver:
    case code::kCallRequiresNewerDriver:
    case code::kDevicesUnavailable:
    case code::kNoDevice:
    case code::kSystemNotReady:
    case code::kSystemDriverMismatch:
    case code::kCudartUnloading:
      return CudaErrorClass::kDeviceUnavailable;
    case code::kMemoryAllocation:
      return CudaErrorClass::kOutOfMemory;
    case code::kNotSupported:
    case code::kNotPermitted:
    case code::kOperatingSystem:
    case code::kMapBufferObjectFailed:
      return CudaErrorClass::kUnsupported;
    case code::kInvalidValue:
    case code::kInvalidHostPointer:
    case code::kInvalidDevicePointer:
    case code::kInvalidDevice:
    case code::kInvalidResourceHandle:
      return CudaErrorClass::kInvalidArgument;
    case code::kHostMemoryAlreadyRegistered:
    case code::kAlreadyMapped:
      return CudaErrorClass::kAlreadyRegistered;
    case code::kNotReady:
      return CudaErrorClass::kNotReady;
    default:
      return CudaErrorClass::kOther;
  }
}

absl::StatusCode StatusCodeForCudaError(int e) {
  switch (ClassifyCudaError(e)) {
    case CudaErrorClass::kOk:
      return absl::StatusCode::kOk;
    case CudaErrorClass::kOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    case CudaErrorClass::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case CudaErrorClass::kDeviceUnavailable:
    case CudaErrorClass::kNotReady:
      return absl::StatusCode::kUnavailable;
    case CudaErrorClass::kUnsupported:
      return e == code::kNotPermitted ? absl::StatusCode::kPermissionDenied
                                      : absl::StatusCode::kUnimplemented;
    case CudaErrorClass::kAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case CudaErrorClass::kSticky:
    case CudaErrorClass::kOther:
      return absl::StatusCode::kInternal;
  }
  return absl::StatusCode::kInternal;
}

absl::Status MakeCudaError(int e, std::string_view name, std::string_view text,
                           std::string_view expr, std::string_view file, int line) {
  std::string message = absl::StrCat(AV(expr), " failed at ", AV(file), ":", line, ": ", AV(name),
                                     " (", AV(text), ")");
  if (IsStickyCudaError(e)) {
    absl::StrAppend(&message, "; the CUDA context is unusable, the process must restart");
  }
  absl::Status status(StatusCodeForCudaError(e), message);
  status.SetPayload(AV(kCodePayload), absl::Cord(absl::StrCat(e)));
  return status;
}

std::optional<int> CudaErrorCodeOf(const absl::Status& status) {
  const auto payload = status.GetPayload(AV(kCodePayload));
  int value = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &value)) return std::nullopt;
  return value;
}

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(AV(context), ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status StickyErrorLatch::Observe(absl::Status status) {
  if (!status.ok() && IsStickyCudaStatus(status) && !tripped_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    if (first_.ok()) {
      first_ = status;
      tripped_.store(true, std::memory_order_release);
    }
  }
  return status;
}

absl::Status StickyErrorLatch::Get() const {
  if (!tripped_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard lock(mu_);
  return first_;
}

}  // namespace expertd::cuda
