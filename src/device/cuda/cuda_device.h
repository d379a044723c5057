// The CUDA device backend's entry points (no CUDA types: device_probe.cpp includes this under
// its one #if). Everything else of the backend is internal to src/device/cuda. The rest of the
// program reaches these through device/cuda_factory.h.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/cuda_factory.h"
#include "device/device.h"

namespace expertd::cuda {

// See MakeCudaDeviceIfBuilt (cuda_factory.h).
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(const CudaDeviceOptions& options);

// See DeclareCudaDoneRecorded (recorded = true) and DeclareCudaClientGone (false). OK and no
// change for a table that is not a CUDA device's.
absl::Status DeclareDone(FenceTable& fences, SlotId slot, uint64_t generation, bool recorded);

}  // namespace expertd::cuda
