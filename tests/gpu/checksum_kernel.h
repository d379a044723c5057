// The two-process test's consumer kernel, callable from host C++ without CUDA headers.
#pragma once

#include <cstdint>

// Queues on `stream` (a cudaStream_t) a kernel that waits `delay_ns`, then adds the checksum of
// the `bytes` (a multiple of 8) at device pointer `slot` to the device uint64 at `out`. Returns
// the launch's cudaError_t (0 = queued).
int LaunchSlotChecksum(const void* slot, uint64_t bytes, uint64_t delay_ns, void* out,
                       void* stream);

// Failures and counters only the CUDA simulator can produce or see; on a GPU they return false
// and the test skips that part, saying so.
// Destroys this process's CUDA context with its pending records never completing: other
// processes' queries of those events answer cudaErrorContextIsDestroyed.
bool DestroyContextForTest();
// The primary contexts this process created (bit per physical device), IPC memory mapped from
// another device over the peer link, and event records refused for a stream of another device.
bool ContextReportForTest(unsigned* physical_mask, int* peer_mappings, int* wrong_device_records);
