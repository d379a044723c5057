// Decisions behind the CUDA device's "direct" staging path (cudaHostRegister of mapped pack
// ranges, the origin's "direct DAX" path), its pinned-memory budget and its copy stream count.
// Pure logic, no CUDA header: unit-tested without a GPU (tests/unit/cuda_device_logic_test.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace expertd::cuda {

// One cudaHostRegister call: [address, address + bytes).
struct HostRange {
  uint64_t address = 0;
  uint64_t bytes = 0;
  friend bool operator==(const HostRange&, const HostRange&) = default;
};

// Upper bound on calls per registration (the origin stopped at 4096 registrations of 2 MiB).
inline constexpr uint64_t kMaxRegistrationChunks = uint64_t{1} << 16;

// Splits [address, address + bytes) into the calls that register it: the range is widened to
// whole pages (the driver pins pages; two registrations sharing a page collide with
// cudaErrorHostMemoryAlreadyRegistered), then cut into chunks of `chunk_bytes` starting at the
// widened start; the last chunk may be shorter. Bounded chunks keep each call's latency and
// failure small and let a failure be undone chunk by chunk.
// InvalidArgument: bytes == 0; page_bytes not a power of two; chunk_bytes 0 or not a multiple of
// page_bytes; the widened end overflows; more than `max_chunks` chunks.
absl::StatusOr<std::vector<HostRange>> PlanRegistration(
    uint64_t address, uint64_t bytes, uint64_t page_bytes, uint64_t chunk_bytes,
    uint64_t max_chunks = kMaxRegistrationChunks);

// What the device reports at start-up, and what the configuration allows.
struct HostRegisterProbe {
  bool allowed = true;                     // CudaDeviceOptions::allow_host_register
  bool device_supports_register = false;   // cudaDevAttrHostRegisterSupported
  bool device_supports_read_only = false;  // cudaDevAttrHostRegisterReadOnlySupported
};

enum class RegistrationMode {
  kUnsupported,  // RegisterHostMemory answers Unimplemented; packs go through pinned staging
  kReadOnly,     // cudaHostRegister(..., cudaHostRegisterReadOnly): works on PROT_READ mappings
                 // and never write-faults (no copy-on-write of private file pages)
  kReadWrite,    // plain cudaHostRegister: the memory must be writable, or the call fails
};

struct RegistrationChoice {
  RegistrationMode mode = RegistrationMode::kUnsupported;
  std::string reason;  // one line for the log: which path and why
};

// kReadOnly where the device supports it (the GPU only reads staging), else kReadWrite where
// registration is supported at all, else kUnsupported. `allowed == false` wins over everything.
RegistrationChoice ChooseRegistrationMode(const HostRegisterProbe& probe);
std::string_view RegistrationModeName(RegistrationMode mode);

// After a cudaHostRegister chunk failed with `cuda_error`: whether the range should simply use
// the staging path instead (the direct path does not work for it: not supported, read-only
// memory without read-only support, a page registered already, nothing left to pin) or the error
// must propagate (a sticky error: the device is broken, falling back would hide it).
enum class RegistrationFailure { kFallBack, kPropagate };
RegistrationFailure ClassifyRegistrationFailure(int cuda_error);

// Pinned host memory in use (staging buffers and registered ranges) against a byte limit.
// Thread-safe, lock-free.
class PinnedBudget {
 public:
  explicit PinnedBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  // Takes `bytes` when they fit: OK, or ResourceExhausted naming `what`, the request, the bytes
  // in use and the limit (and nothing taken).
  absl::Status Reserve(uint64_t bytes, std::string_view what);
  // Gives back what Reserve took.
  void Release(uint64_t bytes);
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// Copy streams beyond the GPU's hardware work queues share queues, so copies on "separate"
// streams order each other: the count is capped at CUDA_DEVICE_MAX_CONNECTIONS (`max_connections`,
// its value or empty; CUDA's default is 8, its bound 32). `note` says so when the cap applied.
inline constexpr uint32_t kDefaultDeviceConnections = 8;
struct StreamCap {
  uint32_t streams = 0;
  std::string note;
};
StreamCap CapCopyStreams(uint32_t requested, std::string_view max_connections);

}  // namespace expertd::cuda
