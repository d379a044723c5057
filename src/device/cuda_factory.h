// What the daemon and the client library may ask of the CUDA backend whether or not it was
// built: every function here compiles and links everywhere and answers Unimplemented (or does
// nothing, where stated) when the backend is absent. The one #if lives in device_probe.cpp.
// No CUDA types: CUDA streams travel as void* (a cudaStream_t; nullptr = the legacy default
// stream). See docs/device.md, "The CUDA device".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"

namespace expertd {

struct CudaDeviceOptions {
  int ordinal = 0;               // the GPU (cudaSetDevice ordinal); one Device per GPU
  uint32_t copy_streams = 2;     // 1..16: one high-priority demand stream + copy_streams-1 prefetch
                                 // streams (1: everything on one stream, no priorities)
  // The value of CUDA_DEVICE_MAX_CONNECTIONS the process runs with (the daemon reads it at
  // start-up), or empty for CUDA's default of 8: copy_streams is capped at it.
  std::string max_connections;
  // IPC events this process may hold at once (fence tables: 2 per slot; sessions: 1 per slot).
  // The driver refuses more with cudaErrorMemoryAllocation: 4096 on an NVIDIA H200 with CUDA 13
  // (tests/gpu/ipc_event_limit). Tables and sessions beyond it are refused up front with
  // ResourceExhausted; caps().max_fence_objects reports it.
  uint32_t max_ipc_events = 4096;
  uint64_t max_arena_bytes = 0;  // largest arena; 0: the GPU's total memory
  uint64_t max_staging_bytes = 0;   // pinned host budget (staging + registered ranges), in
                                    // total; 0: half the machine's physical memory
  bool allow_host_register = true;  // RegisterHostMemory (the direct path)
  uint64_t register_chunk_bytes = uint64_t{1} << 30;  // bytes per cudaHostRegister call
  // Prefetch copies on the GPU at once per prefetch stream; the rest wait on the CPU, so demand
  // copies never queue behind a long prefetch backlog. 1..64.
  uint32_t prefetch_copies_in_flight = 4;
  // How often the completion thread polls copies in flight (cudaEventQuery) once a few quick
  // re-checks found nothing finished.
  absl::Duration completion_poll_interval = absl::Microseconds(50);
  // Shutdown() waits this long for copies already on the GPU (one may wait on a client's done
  // event); copies still running then complete with DeadlineExceeded.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // A client's done record still pending this long after its Release declared it is given up
  // on: its session's declarations are dropped, the slots it held may be overwritten, and its
  // SessionFences::Failure() says why (the daemon ends the session). The daemon passes
  // limits.lease_ttl.
  absl::Duration done_record_timeout = absl::Seconds(30);
};

// The CUDA device for options.ordinal. Unimplemented when the backend is not built; Unavailable
// when there is no driver or GPU; InvalidArgument for bad options or an ordinal out of range.
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDeviceIfBuilt(const CudaDeviceOptions& options);

// Daemon side, for fence tables made by a CUDA device; OK and nothing else for tables of other
// devices (their clients store done in shared memory) and when the backend is not built.
//
// On Release: the client says it recorded `slot`'s done event after its kernels read
// `generation`. Copies that overwrite the slot then wait on that event on the GPU; until this is
// declared they wait on the CPU, because an event's latest record may belong to an older grant
// (or to none: a never-recorded event counts as complete). Stale declarations are ignored;
// FailedPrecondition for a generation above the slot's ready generation.
absl::Status DeclareCudaDoneRecorded(FenceTable& fences, SlotId slot, uint64_t generation);
// When a session ends without releasing: the client is gone, generations up to `generation`
// need no wait (its last record may never complete). Same checks.
absl::Status DeclareCudaClientGone(FenceTable& fences, SlotId slot, uint64_t generation);

// ---- Client side (another process) ---------------------------------------------------------

// An arena the daemon exported, opened in this process with cudaIpcOpenMemHandle. Opened once
// per process per arena: opening the same descriptor again returns the same object while it
// lives; the memory is unmapped (cudaIpcCloseMemHandle) when the last reference goes.
// Thread-safe (immutable).
class CudaArenaView {
 public:
  virtual ~CudaArenaView() = default;
  // Device pointer valid in this process: slot i of a projection is at device_ptr() + i *
  // slot_stride; [bytes(), reserved_bytes()) is zero padding. Read-only by contract.
  virtual const void* device_ptr() const = 0;
  virtual uint64_t bytes() const = 0;
  virtual uint64_t reserved_bytes() const = 0;
  // Copies [offset, offset + out.size()) of the arena to host memory, ordered on `cuda_stream`
  // (after what the caller queued there, e.g. a WaitReady), and waits for it. For tools and
  // verification, not the hot path. InvalidArgument outside [0, reserved_bytes()).
  virtual absl::Status CopyToHost(uint64_t offset, std::span<uint8_t> out,
                                  void* cuda_stream) const = 0;
};

// A session's ready/done IPC events, opened in this process. Shared like CudaArenaView (keyed
// by the whole descriptor); events are destroyed with the last reference. Thread-safe.
class CudaSessionEvents {
 public:
  virtual ~CudaSessionEvents() = default;
  virtual uint32_t size() const = 0;
  // Makes `cuda_stream` wait (on the GPU) for the copy behind a grant of `slot` at
  // `generation`: cudaStreamWaitEvent on the slot's ready event. Call it after the grant
  // arrived (the daemon records before it grants). InvalidArgument for generation 0 or a slot
  // outside the table; FailedPrecondition for a stream of another GPU than the session's; CUDA
  // errors as statuses.
  virtual absl::Status WaitReady(SlotId slot, uint64_t generation, void* cuda_stream) = 0;
  // The same wait on the CPU: blocks until that copy landed (cudaEventSynchronize on the slot's
  // ready event). For engines whose kernels run on streams they cannot name to this library;
  // counts as a WaitReady for RecordDone. Same errors as WaitReady but the stream's.
  virtual absl::Status WaitReadyOnHost(SlotId slot, uint64_t generation) = 0;
  // After the kernels that read the slot were queued on `cuda_stream`: records the slot's done
  // event there, chained after its previous record (the stream first waits on the event), so
  // the latest record covers every lease of the slot this process finished, on any stream.
  // Then send Release. FailedPrecondition when this process never waited for `generation`.
  virtual absl::Status RecordDone(SlotId slot, uint64_t generation, void* cuda_stream) = 0;
};

// A private event of this process (not IPC, no timing) that says when the work a stream had
// queued before its record has finished. The client library holds a client-side hit's pins until
// the kernels that read it are done (docs/protocol.md, "Client-side hits"). Created, recorded
// and destroyed on `device_ordinal`; the calling thread's current context is left as it was.
// Not thread-safe: one owner at a time.
class CudaStreamMark {
 public:
  virtual ~CudaStreamMark() = default;
  // After what `cuda_stream` queued so far. FailedPrecondition for a stream of another GPU;
  // CUDA errors as statuses.
  virtual absl::Status Record(void* cuda_stream) = 0;
  // Whether the work before the latest record finished (true when never recorded). A CUDA
  // error (a failed kernel, the context's sticky error) is an error: the work never finishes.
  virtual absl::StatusOr<bool> Done() = 0;
};

// This process's ordinal of the GPU whose UUID is `uuid` (Device::hardware_id(), sent with every
// session: the daemon and a client may see different CUDA_VISIBLE_DEVICES, and the daemon's
// ordinal may name another GPU here). `requested` >= 0 is the caller's choice and must be that
// GPU. FailedPrecondition, naming what this process sees, when the GPU is not visible here or
// `requested` is another one; Unimplemented when the backend is not built. Creates no context.
absl::StatusOr<int> ResolveCudaDeviceIfBuilt(std::string_view uuid, int requested);

// `device_ordinal` is this process's ordinal of the daemon's GPU (ResolveCudaDeviceIfBuilt);
// the calling thread's current context is left as it was (none included: nothing is created on
// another GPU). IPC memory is opened with cudaIpcMemLazyEnablePeerAccess. Unimplemented when the backend is not built; InvalidArgument
// for a descriptor that is not a CUDA IPC one.
absl::StatusOr<std::shared_ptr<const CudaArenaView>> OpenCudaArenaIfBuilt(
    const ArenaExport& descriptor, int device_ordinal);
absl::StatusOr<std::shared_ptr<CudaSessionEvents>> OpenCudaEventsIfBuilt(
    const FenceExport& descriptor, int device_ordinal);

// OK when `cuda_stream` belongs to `device_ordinal`; FailedPrecondition naming both GPUs when
// not; CUDA errors as statuses. Unimplemented when the backend is not built.
absl::Status CheckCudaStreamIfBuilt(void* cuda_stream, int device_ordinal);
// A CudaStreamMark on `device_ordinal`. Unimplemented when the backend is not built.
absl::StatusOr<std::unique_ptr<CudaStreamMark>> MakeCudaStreamMarkIfBuilt(int device_ordinal);

}  // namespace expertd
