// Checked CUDA runtime calls: a failing call becomes an absl::Status naming the expression,
// file:line and the runtime's error name and text (cuda_errors.h classifies it). Used only inside
// src/device/cuda and the GPU tests: it includes the CUDA runtime header. Nothing here aborts.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "device/cuda/cuda_errors.h"

namespace expertd::cuda {

// The status of a finished call (OK for cudaSuccess). On failure the runtime's per-thread "last
// error" is cleared for non-sticky errors, so a later unrelated check does not report it again.
absl::Status CudaCallStatus(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace expertd::cuda

// The status of `expr` (a cudaError_t expression).
#define EXPERTD_CUDA_STATUS(expr) ::expertd::cuda::CudaCallStatus((expr), #expr, __FILE__, __LINE__)

// The status of `err`, a code the call spelled `call_text` returned (when the caller must look at
// the code first, e.g. cudaErrorNotReady from a query).
#define EXPERTD_CUDA_ERROR(err, call_text) \
  ::expertd::cuda::CudaCallStatus((err), call_text, __FILE__, __LINE__)

// Returns the status of `expr` from the enclosing function when it failed, after showing it to
// `latch` (a StickyErrorLatch) so the device remembers a sticky error.
#define EXPERTD_CUDA_RETURN_IF_ERROR(latch, expr)                                 \
  do {                                                                            \
    if (const cudaError_t _cuda_err = (expr); _cuda_err != cudaSuccess) {         \
      return (latch).Observe(                                                     \
          ::expertd::cuda::CudaCallStatus(_cuda_err, #expr, __FILE__, __LINE__)); \
    }                                                                             \
  } while (0)
