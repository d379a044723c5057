// The two-process test's consumer kernel, callable from host C++ without CUDA headers.
#pragma once

#include <cstdint>

// Queues on `stream` (a cudaStream_t) a kernel that waits `delay_ns`, then adds the checksum of
// the `bytes` (a multiple of 8) at device pointer `slot` to the device uint64 at `out`. Returns
// the launch's cudaError_t (0 = queued).
int LaunchSlotChecksum(const void* slot, uint64_t bytes, uint64_t delay_ns, void* out,
                       void* stream);
