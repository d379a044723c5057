// Encoding of CUDA IPC handles in export descriptors (see ipc_layout.h).
#include "device/cuda/ipc_layout.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

IpcHandleBytes HandleAt(const std::string& blob, uint64_t offset) {
  IpcHandleBytes h{};
  std::memcpy(h.data(), blob.data() + offset, kIpcHandleBytes);
  return h;
}

}  // namespace

ArenaExport MakeArenaExport(const IpcHandleBytes& handle, uint64_t bytes, uint64_t reserved_bytes,
                            std::string label, int64_t owner_pid) {
  ArenaExport e;
  e.handle.kind = SharedHandle::Kind::kCudaIpc;
  e.handle.ipc_handle.assign(handle.data(), handle.size());
  e.handle.owner_pid = owner_pid;
  e.bytes = bytes;
  e.reserved_bytes = reserved_bytes;
  e.label = std::move(label);
  return e;
}

absl::Status CheckArenaExport(const ArenaExport& e) {
  if (e.handle.kind != SharedHandle::Kind::kCudaIpc ||
      e.handle.ipc_handle.size() != kIpcHandleBytes || e.bytes == 0 || e.bytes > e.reserved_bytes ||
      e.reserved_bytes % kArenaAlignment != 0) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("arena descriptor '", e.label, "' is not a CUDA IPC arena (",
                                     e.handle.ipc_handle.size(), " handle bytes, ", e.bytes, " of ",
                                     e.reserved_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

IpcHandleBytes ArenaHandleOf(const ArenaExport& e) { return HandleAt(e.handle.ipc_handle, 0); }

absl::StatusOr<FenceExport> MakeFenceExport(std::span<const IpcHandleBytes> ready,
                                            std::span<const IpcHandleBytes> done,
                                            int64_t owner_pid) {
  if (ready.size() != done.size() || ready.empty() || ready.size() > kMaxCudaFenceSlots) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("fence export of ", ready.size(), " ready and ", done.size(),
                                     " done handles (1..", kMaxCudaFenceSlots, " each)"));
  }
  const auto n = static_cast<uint32_t>(ready.size());
  FenceExport e;
  e.handle.kind = SharedHandle::Kind::kCudaIpc;
  e.handle.owner_pid = owner_pid;
  e.n_slots = n;
  e.done_offset = uint64_t{n} * kIpcHandleBytes;
  e.segment_bytes = 2 * e.done_offset;
  std::string& blob = e.handle.ipc_handle;
  blob.reserve(e.segment_bytes);
  for (const IpcHandleBytes& h : ready) blob.append(h.data(), h.size());
  for (const IpcHandleBytes& h : done) blob.append(h.data(), h.size());
  return e;
}

absl::Status CheckFenceExport(const FenceExport& e) {
  const uint64_t n = e.n_slots;
  if (e.handle.kind != SharedHandle::Kind::kCudaIpc || n == 0 || n > kMaxCudaFenceSlots ||
      e.done_offset != n * kIpcHandleBytes || e.segment_bytes != 2 * n * kIpcHandleBytes ||
      e.handle.ipc_handle.size() != e.segment_bytes) {
    return InvalidError(
        ErrorKind::kBadValue,
        absl::StrCat("fence descriptor is not a CUDA IPC event table: ", n, " slots, done_offset ",
                     e.done_offset, ", segment_bytes ", e.segment_bytes, ", ",
                     e.handle.ipc_handle.size(), " handle bytes"));
  }
  return absl::OkStatus();
}

IpcHandleBytes ReadyHandleOf(const FenceExport& e, uint32_t slot) {
  return HandleAt(e.handle.ipc_handle, uint64_t{slot} * kIpcHandleBytes);
}

IpcHandleBytes DoneHandleOf(const FenceExport& e, uint32_t slot) {
  return HandleAt(e.handle.ipc_handle, e.done_offset + uint64_t{slot} * kIpcHandleBytes);
}

std::string FormatGpuUuid(const std::array<uint8_t, 16>& bytes) {
  std::string out = "GPU-";
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(bytes[i], absl::kZeroPad2));
  }
  return out;
}

}  // namespace expertd::cuda
