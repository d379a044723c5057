// The defaults of the device interface's optional operations, and the checks every backend
// shares. Backends override only what they support.
#include "device/device.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {

absl::StatusOr<uint64_t> ArenaReservedBytes(uint64_t requested, uint64_t max_bytes) {
  if (requested == 0) {
    return InvalidError(ErrorKind::kBadValue, "arena of 0 bytes requested");
  }
  const std::optional<uint64_t> reserved =
      requested > UINT64_MAX - kArenaMinTail
          ? std::nullopt
          : CheckedAlignUp(requested + kArenaMinTail, kArenaAlignment);
  if (!reserved || *reserved > max_bytes) {
    return MakeError(absl::StatusCode::kResourceExhausted, ErrorKind::kAbsurdCount,
                     absl::StrCat("arena of ", requested,
                                  " bytes requested; the device allows at "
                                  "most ",
                                  max_bytes, " bytes per arena"));
  }
  return *reserved;
}

Arena::~Arena() = default;
StagingBuffer::~StagingBuffer() = default;
FenceTable::~FenceTable() = default;
SessionFences::~SessionFences() = default;
Device::~Device() = default;

absl::StatusOr<ArenaExport> Arena::Export() const {
  return absl::UnimplementedError(
      absl::StrCat("arena '", label_, "': this device cannot export arenas"));
}

absl::StatusOr<FenceExport> FenceTable::Export() const {
  return absl::UnimplementedError("this device cannot export fence tables");
}

absl::StatusOr<std::unique_ptr<StagingBuffer>> Device::RegisterHostMemory(
    std::span<uint8_t> /*memory*/) {
  return absl::UnimplementedError(
      absl::StrCat("device ", AV(name()), " cannot register host memory as staging"));
}

absl::StatusOr<std::unique_ptr<SessionFences>> Device::CreateSessionFences(
    FenceTable& /*shared*/) {
  return absl::UnimplementedError(absl::StrCat(
      "device ", AV(name()), " has no per-session done fences (sessions share the class table)"));
}

absl::Status Device::ReadArena(const Arena& arena, uint64_t offset, std::span<uint8_t> out) {
  const uint8_t* base = arena.host_data();
  if (base == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("device ", AV(name()), " cannot read arena '", arena.label(), "' back"));
  }
  if (!RangeInside(offset, out.size(), arena.reserved_bytes())) {
    return InvalidError(
        ErrorKind::kOutOfBounds,
        absl::StrCat("read of ", out.size(), " bytes at ", offset, " outside arena '",
                     arena.label(), "' of ", arena.reserved_bytes(), " bytes"));
  }
  if (!out.empty()) std::memcpy(out.data(), base + offset, out.size());
  return absl::OkStatus();
}

absl::Status ValidateCopyRequest(const CopyRequest& request) {
  if (request.segments.empty()) {
    return InvalidError(ErrorKind::kBadValue, "copy request without segments");
  }
  for (size_t i = 0; i < request.segments.size(); ++i) {
    const CopySegment& s = request.segments[i];
    if (s.arena == nullptr || s.source.empty() || s.source.data() == nullptr) {
      return InvalidError(ErrorKind::kBadValue,
                          absl::StrCat("copy segment ", i, ": no arena or an empty source"));
    }
    if (!RangeInside(s.arena_offset, s.source.size(), s.arena->bytes())) {
      return InvalidError(ErrorKind::kOutOfBounds,
                          absl::StrCat("copy segment ", i, ": ", s.source.size(),
                                       " bytes at offset ", s.arena_offset, " outside arena '",
                                       s.arena->label(), "' of ", s.arena->bytes(), " bytes"));
    }
  }
  for (size_t i = 0; i < request.waits.size(); ++i) {
    const FenceWait& w = request.waits[i];
    if (w.fences == nullptr || w.slot >= w.fences->size()) {
      return InvalidError(
          ErrorKind::kOutOfBounds,
          absl::StrCat("copy wait ", i, ": no fence table or slot ", w.slot, " outside it"));
    }
  }
  for (size_t i = 0; i < request.signals.size(); ++i) {
    const FenceSignal& s = request.signals[i];
    if (s.fences == nullptr || s.slot >= s.fences->size() || s.generation == 0) {
      return InvalidError(ErrorKind::kOutOfBounds,
                          absl::StrCat("copy signal ", i, ": no fence table, slot ", s.slot,
                                       " outside it, or generation 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace expertd
