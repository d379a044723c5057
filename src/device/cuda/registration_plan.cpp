// Registration chunking, mode choice, the pinned budget and the copy stream cap (see
// registration_plan.h).
#include "device/cuda/registration_plan.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "device/cuda/cuda_errors.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd::cuda {

absl::StatusOr<std::vector<HostRange>> PlanRegistration(uint64_t address, uint64_t bytes,
                                                        uint64_t page_bytes, uint64_t chunk_bytes,
                                                        uint64_t max_chunks) {
  if (bytes == 0) return InvalidError(ErrorKind::kBadValue, "registration of 0 bytes");
  if (!IsPowerOfTwo(page_bytes)) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("page size ", page_bytes, " is not a power of two"));
  }
  if (chunk_bytes == 0 || chunk_bytes % page_bytes != 0) {
    return InvalidError(
        ErrorKind::kBadValue,
        absl::StrCat("registration chunk of ", chunk_bytes,
                     " bytes is not a positive multiple of the page size ", page_bytes));
  }
  const std::optional<uint64_t> end = CheckedAdd(address, bytes);
  const std::optional<uint64_t> widened_end = end ? CheckedAlignUp(*end, page_bytes) : std::nullopt;
  if (!widened_end) {
    return InvalidError(ErrorKind::kOverflow,
                        absl::StrCat("registration of ", bytes, " bytes at 0x", absl::Hex(address),
                                     " overflows the address space"));
  }
  const uint64_t start = address & ~(page_bytes - 1);
  const uint64_t span = *widened_end - start;
  const uint64_t chunks = span / chunk_bytes + (span % chunk_bytes != 0 ? 1 : 0);
  if (chunks > max_chunks) {
    return InvalidError(ErrorKind::kAbsurdCount,
                        absl::StrCat("registration of ", bytes, " bytes needs ", chunks,
                                     " chunks of ", chunk_bytes, "; at most ", max_chunks));
  }
  std::vector<HostRange> plan;
  plan.reserve(chunks);
  for (uint64_t at = start; at < *widened_end; at += std::min(chunk_bytes, *widened_end - at)) {
    plan.push_back(HostRange{at, std::min(chunk_bytes, *widened_end - at)});
  }
  return plan;
}

RegistrationChoice ChooseRegistrationMode(const HostRegisterProbe& probe) {
  if (!probe.allowed) {
    return {RegistrationMode::kUnsupported,
            "host registration disabled by configuration; packs go through pinned staging"};
  }
  if (!probe.device_supports_register) {
    return {RegistrationMode::kUnsupported,
            "the device does not support cudaHostRegister; packs go through pinned staging"};
  }
  if (probe.device_supports_read_only) {
    return {RegistrationMode::kReadOnly,
            "mapped pack ranges are registered read-only (cudaHostRegisterReadOnly)"};
  }
  return {RegistrationMode::kReadWrite,
          "the device lacks read-only registration: only writable memory can be registered, so "
          "packs are registered through private writable mappings (their pages are copied "
          "into pinned memory; the files are never written)"};
}

std::string_view RegistrationModeName(RegistrationMode mode) {
  switch (mode) {
    case RegistrationMode::kUnsupported:
      return "staging";
    case RegistrationMode::kReadOnly:
      return "registered-read-only";
    case RegistrationMode::kReadWrite:
      return "registered";
  }
  return "staging";
}

RegistrationFailure ClassifyRegistrationFailure(int cuda_error) {
  return IsStickyCudaError(cuda_error) ? RegistrationFailure::kPropagate
                                       : RegistrationFailure::kFallBack;
}

absl::Status PinnedBudget::Reserve(uint64_t bytes, std::string_view what) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    const std::optional<uint64_t> after = CheckedAdd(used, bytes);
    if (!after || *after > limit_) {
      return MakeError(
          absl::StatusCode::kResourceExhausted, ErrorKind::kAbsurdCount,
          absl::StrCat(AV(what), ": ", bytes, " bytes of pinned host memory requested; ", used,
                       " of ", limit_, " are in use"));
    }
    if (used_.compare_exchange_weak(used, *after, std::memory_order_relaxed)) {
      return absl::OkStatus();
    }
  }
}

void PinnedBudget::Release(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

StreamCap CapCopyStreams(uint32_t requested, std::string_view max_connections) {
  uint32_t queues = kDefaultDeviceConnections;
  std::string from = "the default of CUDA_DEVICE_MAX_CONNECTIONS";
  uint32_t parsed = 0;
  if (!max_connections.empty() && absl::SimpleAtoi(AV(max_connections), &parsed) && parsed > 0) {
    queues = std::min<uint32_t>(parsed, 32);  // CUDA's own bound
    from = absl::StrCat("CUDA_DEVICE_MAX_CONNECTIONS=", AV(max_connections));
  }
  if (requested <= queues) return StreamCap{requested, ""};
  return StreamCap{queues, absl::StrCat("copy streams capped at ", queues, " (", from,
                                        "; ", requested, " asked for): more streams than "
                                        "hardware queues would share queues")};
}

}  // namespace expertd::cuda
