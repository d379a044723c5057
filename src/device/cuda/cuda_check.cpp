// CUDA error statuses; also pins cuda_errors.h's codes and ipc_layout.h's sizes to the toolkit.
#include "device/cuda/cuda_check.h"

#include "device/cuda/ipc_layout.h"

namespace expertd::cuda {

static_assert(code::kInvalidValue == cudaErrorInvalidValue);
static_assert(code::kMemoryAllocation == cudaErrorMemoryAllocation);
static_assert(code::kInitializationError == cudaErrorInitializationError);
static_assert(code::kCudartUnloading == cudaErrorCudartUnloading);
static_assert(code::kInvalidHostPointer == cudaErrorInvalidHostPointer);
static_assert(code::kInvalidDevicePointer == cudaErrorInvalidDevicePointer);
static_assert(code::kStubLibrary == cudaErrorStubLibrary);
static_assert(code::kInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(code::kCallRequiresNewerDriver == cudaErrorCallRequiresNewerDriver);
static_assert(code::kDevicesUnavailable == cudaErrorDevicesUnavailable);
static_assert(code::kNoDevice == cudaErrorNoDevice);
static_assert(code::kInvalidDevice == cudaErrorInvalidDevice);
static_assert(code::kMapBufferObjectFailed == cudaErrorMapBufferObjectFailed);
static_assert(code::kAlreadyMapped == cudaErrorAlreadyMapped);
static_assert(code::kEccUncorrectable == cudaErrorECCUncorrectable);
static_assert(code::kNvlinkUncorrectable == cudaErrorNvlinkUncorrectable);
static_assert(code::kContained == cudaErrorContained);
static_assert(code::kOperatingSystem == cudaErrorOperatingSystem);
static_assert(code::kInvalidResourceHandle == cudaErrorInvalidResourceHandle);
static_assert(code::kNotReady == cudaErrorNotReady);
static_assert(code::kIllegalAddress == cudaErrorIllegalAddress);
static_assert(code::kLaunchTimeout == cudaErrorLaunchTimeout);
static_assert(code::kContextIsDestroyed == cudaErrorContextIsDestroyed);
static_assert(code::kAssert == cudaErrorAssert);
static_assert(code::kHostMemoryAlreadyRegistered == cudaErrorHostMemoryAlreadyRegistered);
static_assert(code::kHostMemoryNotRegistered == cudaErrorHostMemoryNotRegistered);
static_assert(code::kHardwareStackError == cudaErrorHardwareStackError);
static_assert(code::kIllegalInstruction == cudaErrorIllegalInstruction);
static_assert(code::kMisalignedAddress == cudaErrorMisalignedAddress);
static_assert(code::kInvalidAddressSpace == cudaErrorInvalidAddressSpace);
static_assert(code::kInvalidPc == cudaErrorInvalidPc);
static_assert(code::kLaunchFailure == cudaErrorLaunchFailure);
static_assert(code::kTensorMemoryLeak == cudaErrorTensorMemoryLeak);
static_assert(code::kNotPermitted == cudaErrorNotPermitted);
static_assert(code::kNotSupported == cudaErrorNotSupported);
static_assert(code::kSystemNotReady == cudaErrorSystemNotReady);
static_assert(code::kSystemDriverMismatch == cudaErrorSystemDriverMismatch);
static_assert(code::kMpsClientTerminated == cudaErrorMpsClientTerminated);
static_assert(code::kExternalDevice == cudaErrorExternalDevice);
static_assert(code::kUnknown == cudaErrorUnknown);
static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

absl::Status CudaCallStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  const int e = static_cast<int>(err);
  if (!IsStickyCudaError(e)) (void)cudaGetLastError();
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  return MakeCudaError(e, name != nullptr ? name : "cudaError?", text != nullptr ? text : "", expr,
                       file, line);
}

}  // namespace expertd::cuda
