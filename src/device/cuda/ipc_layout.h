// How the CUDA device's IPC handles travel in the backend-neutral export descriptors
// (device.h: SharedHandle, ArenaExport, FenceExport), so the gRPC layer ships them as bytes
// without knowing CUDA. Pure logic, no CUDA header; cuda_check.cpp static_asserts that
// kIpcHandleBytes is the size of cudaIpcMemHandle_t and cudaIpcEventHandle_t.
//
// Arena:  handle.kind = kCudaIpc, handle.ipc_handle = the 64 bytes of the arena's
//         cudaIpcMemHandle_t, handle.owner_pid = the daemon; bytes / reserved_bytes as usual.
// Fences: handle.kind = kCudaIpc, handle.ipc_handle = n_slots ready-event handles (slot 0 first)
//         followed by n_slots done-event handles, 64 bytes each (cudaIpcEventHandle_t);
//         n_slots; done_offset = 64 * n_slots (where the done handles start);
//         segment_bytes = 128 * n_slots (the whole blob). The same fields as the host layout,
//         read as "[0, done_offset) ready part, [done_offset, segment_bytes) done part".
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/device.h"

namespace expertd::cuda {

inline constexpr size_t kIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
using IpcHandleBytes = std::array<char, kIpcHandleBytes>;

// Fence tables beyond this many slots are refused: 2 IPC events per slot, 8 MiB of handles.
inline constexpr uint32_t kMaxCudaFenceSlots = uint32_t{1} << 16;

ArenaExport MakeArenaExport(const IpcHandleBytes& handle, uint64_t bytes, uint64_t reserved_bytes,
                            std::string label, int64_t owner_pid);
// InvalidArgument unless `e` is a CUDA arena descriptor: kind, 64 handle bytes, 0 < bytes <=
// reserved_bytes, reserved_bytes a multiple of kArenaAlignment.
absl::Status CheckArenaExport(const ArenaExport& e);
IpcHandleBytes ArenaHandleOf(const ArenaExport& e);  // after CheckArenaExport

// `ready` and `done` have one handle per slot (equal sizes, 1..kMaxCudaFenceSlots).
absl::StatusOr<FenceExport> MakeFenceExport(std::span<const IpcHandleBytes> ready,
                                            std::span<const IpcHandleBytes> done,
                                            int64_t owner_pid);
// InvalidArgument unless `e` is a CUDA fence descriptor whose fields match the layout above.
absl::Status CheckFenceExport(const FenceExport& e);
// The slot's handles; `slot` < n_slots of a descriptor that passed CheckFenceExport.
IpcHandleBytes ReadyHandleOf(const FenceExport& e, uint32_t slot);
IpcHandleBytes DoneHandleOf(const FenceExport& e, uint32_t slot);

// A GPU's 16-byte UUID as nvidia-smi prints it: "GPU-" then 8-4-4-4-12 lowercase hex digits.
// What the daemon sends with a session, so a client resolves its own ordinal of the GPU.
std::string FormatGpuUuid(const std::array<uint8_t, 16>& bytes);

}  // namespace expertd::cuda
