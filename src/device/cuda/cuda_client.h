// Client side of the CUDA backend, for the engine process (through the client library): opens
// the daemon's arena IPC memory handles and a session's IPC events, waits for ready and records
// done on the engine's own CUDA streams. No CUDA types (streams are void*). The rest of the
// program reaches these through device/cuda_factory.h (OpenCudaArenaIfBuilt,
// OpenCudaEventsIfBuilt), whose comments state the contracts.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "device/cuda_factory.h"
#include "device/device.h"

namespace expertd::cuda {

// The UUID of this process's GPU `ordinal` ("GPU-" and the 16 bytes as nvidia-smi prints them).
absl::StatusOr<std::string> DeviceUuid(int ordinal);
// See ResolveCudaDeviceIfBuilt (cuda_factory.h).
absl::StatusOr<int> ResolveDevice(std::string_view uuid, int requested);

// cudaIpcOpenMemHandle once per process per (handle, ordinal): a process-wide cache of weak
// references returns the open view while anyone holds it; the last reference closes it.
absl::StatusOr<std::shared_ptr<const CudaArenaView>> OpenArena(const ArenaExport& descriptor,
                                                               int device_ordinal);

// cudaIpcOpenEventHandle for every ready and done event of the table, cached the same way; each
// event handle is opened once per process however many descriptors name it.
absl::StatusOr<std::shared_ptr<CudaSessionEvents>> OpenEvents(const FenceExport& descriptor,
                                                              int device_ordinal);

// See CheckCudaStreamIfBuilt and MakeCudaStreamMarkIfBuilt (cuda_factory.h).
absl::Status CheckStream(void* cuda_stream, int device_ordinal);
absl::StatusOr<std::unique_ptr<CudaStreamMark>> MakeStreamMark(int device_ordinal);

}  // namespace expertd::cuda
