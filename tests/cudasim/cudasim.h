// The CUDA simulator (tests/cudasim): a stand-in for the CUDA runtime, linked into copies of the
// daemon, the CLI and the GPU tests so the CUDA backend's code runs end to end on machines
// without a GPU (CI). docs/device.md, "The CUDA simulator", says what it models and what not.
//
// Device memory is a memfd mapped twice: the address handed out as the "device pointer" is
// mapped PROT_NONE, so host code that dereferences device memory faults as it would on a GPU;
// the simulator copies through a second, private mapping. Streams are worker threads that run
// their operations in order; events are counters in a process-shared memfd, so IPC events and
// cudaStreamWaitEvent across processes behave like the real ones, including "an event never
// recorded counts as complete". A process may hold 4096 IPC events (cudaEventInterprocess),
// as on an H200 with CUDA 13: the next create fails with cudaErrorMemoryAllocation. IPC memory
// and event handles name the exporter's pid and fd and are opened through /proc/PID/fd. The
// driver's 64-bit stream memory operations (cuStreamWaitValue64 / cuStreamWriteValue64, through
// cudaGetDriverEntryPointByVersion) work on registered or pinned host memory and device memory;
// cudaHostGetDevicePointer returns the host address (unified addressing).
//
// Configuration, read once from the environment at the first call:
//   EXPERTD_CUDASIM_DEVICES=N          devices (default 1; 0 = no device)
//   EXPERTD_CUDASIM_VISIBLE_DEVICES=L  like CUDA_VISIBLE_DEVICES: the devices this process sees,
//                                      in ordinal order (e.g. "1,0"); default all, in order.
//                                      Each device has a UUID (cudaDeviceProp::uuid) that is the
//                                      same in every process
//   EXPERTD_CUDASIM_MEMORY_MIB=N       memory of each device (default 8192)
//   EXPERTD_CUDASIM_COPY_DELAY_US=N    each copy and simulated kernel first sleeps N µs on its
//                                      stream (default 0): widens the window in which a copy
//                                      racing a reader would be caught
//   EXPERTD_CUDASIM_FAIL_AFTER_COPIES=N after N copies in this process, the context fails with
//                                      the sticky cudaErrorIllegalAddress (default: never)
//   EXPERTD_CUDASIM_PAGEABLE=error     an async host-to-device copy from memory that is neither
//                                      cudaHostAlloc'd nor cudaHostRegister'd fails with
//                                      cudaErrorInvalidValue (default: allowed, as in CUDA)
//   EXPERTD_CUDASIM_READ_ONLY_REGISTER=1  devices report cudaHostRegisterReadOnly support
//                                      (default 0, as x86 hosts with discrete GPUs do: memory
//                                      the process may only read cannot be registered at all)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {

// For simulated kernels (queued with cudaLaunchHostFunc): the simulator's host view of `bytes`
// of device memory at `device_ptr`, or null when that range is not inside one allocation (an
// out-of-bounds "kernel" read). Only valid inside an operation running on a stream.
void* expertd_cudasim_device_bytes(const void* device_ptr, size_t bytes);

// Sleeps the configured EXPERTD_CUDASIM_COPY_DELAY_US plus `extra_ns`: what a simulated kernel
// calls first, so it takes time on its stream like a real one.
void expertd_cudasim_kernel_delay(unsigned long long extra_ns);

// What this process has open from other processes: IPC memory handles (cudaIpcOpenMemHandle
// not yet closed) and IPC events (cudaIpcOpenEventHandle not yet destroyed).
void expertd_cudasim_open_imports(int* memory_handles, int* events);

// Contexts and devices: a bit per physical device whose primary context this process created
// (cudaSetDevice, or any call that needs a context on a thread that never chose a device:
// device 0's), IPC memory mapped from another device over the peer link, and cudaEventRecord
// calls refused because the stream belongs to another device than the event.
void expertd_cudasim_contexts(unsigned* physical_mask, int* peer_mappings,
                              int* wrong_device_records);

// Destroys this process's context with `error` (say cudaErrorContextIsDestroyed): every later
// call here fails with it, and every event this process recorded whose latest record is still
// pending never completes — other processes' queries of it answer `error`.
void expertd_cudasim_destroy_context(int error);

}  // extern "C"
