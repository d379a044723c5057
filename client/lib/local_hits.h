// Client-side hits of one session (internal to client/lib; the contract is docs/protocol.md,
// "Client-side hits", and engine/residency.h): an acquire whose experts are all resident is
// served in this process by pinning their slots through the class's residency table, and
// released by unpinning them. Several leases of this process may pin one slot: the pin word is
// written by the first and cleared by the last (a count per slot). The session decides when it
// may serve from the table and reports each hit to the daemon; this class only pins.
//
// CUDA sessions: the kernels that read a lease run after its Release returns, so the pins of a
// lease recorded done (RecordDone) stay until a private event recorded after those kernels has
// completed; pending releases are looked at with every TryLease, Release and RecordDone, and
// Drain waits for them. A lease never recorded unpins at Release (nothing read it through the
// GPU). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client.h"
#include "client_handles.h"
#include "device/cuda_factory.h"

namespace expertd::client::internal {

class LocalHits {
 public:
  // Leases served here have this bit set in their id; the daemon's never do.
  static constexpr uint64_t kLeaseBit = uint64_t{1} << 63;
  static bool IsLocal(uint64_t lease) { return (lease & kLeaseBit) != 0; }

  // The session's hits, or nullptr where it cannot serve any: a class without a residency
  // table, or a pin row too short for the classes' slots. `cuda_device` is this process's
  // ordinal of a CUDA session's GPU (-1 on the host device). `classes` and `pins` (the
  // session's whole pin row) must outlive the result.
  static std::unique_ptr<LocalHits> Make(const v1::OpenSessionResponse& info,
                                         const std::vector<SlotClassView>& classes,
                                         std::span<uint64_t> pins, int cuda_device);

  // A lease of every expert of `layer`, all pinned, when all are resident; nullopt with nothing
  // pinned when one is not, or when the acquire is one the daemon must judge (no experts, more
  // than the session's max_experts_per_acquire, a layer no class holds).
  std::optional<Lease> TryLease(uint32_t layer, std::span<const uint32_t> experts);
  // CUDA: marks the work queued on `cuda_stream` so far (the kernels that read `lease`); its
  // Release then unpins once that work finished. Several streams: each is marked. An error for a
  // lease not served here, or released already.
  absl::Status RecordDone(const Lease& lease, void* cuda_stream);
  // Unpins a lease TryLease returned (CUDA, recorded: once its marks completed); an error, with
  // nothing unpinned, for one it did not (or one released already).
  absl::Status Release(const Lease& lease);
  // Waits until every pending release unpinned, up to `timeout`; the number still pending.
  size_t Drain(absl::Duration timeout);

 private:
  struct Class {
    const SlotClassView* view = nullptr;
    residency::Table table;
    uint64_t* pins = nullptr;             // this class's part of the pin row
    std::vector<uint32_t> counts;         // per slot: this process's pins (guarded by mu_)
    std::vector<uint64_t> generations;    // the generation each count pins (guarded by mu_)
  };

  // A released lease whose kernels may still read its slots (CUDA).
  struct Pending {
    Lease lease;
    std::vector<std::unique_ptr<CudaStreamMark>> marks;
  };

  LocalHits() = default;
  void Undo(const Lease& partial);  // mu_ held
  // Unpins the pending releases whose marks all completed (a mark that answers an error
  // counts: the work behind it will never read again); mu_ held.
  void Reap();
  absl::StatusOr<std::unique_ptr<CudaStreamMark>> TakeMark();  // mu_ held

  int cuda_device_ = -1;  // >= 0: a CUDA session
  uint32_t max_experts_ = 0;
  std::vector<Class> classes_;
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, uint32_t>> layer_class_;  // → class, index
  std::mutex mu_;
  uint64_t next_ = 1;  // guarded by mu_
  absl::flat_hash_set<uint64_t> live_;  // leases served and not released (guarded by mu_)
  // CUDA (guarded by mu_): the marks of leases not released yet, releases waiting on their
  // marks, and completed marks kept for reuse.
  absl::flat_hash_map<uint64_t, std::vector<std::unique_ptr<CudaStreamMark>>> marks_;
  std::vector<Pending> pending_;
  std::vector<std::unique_ptr<CudaStreamMark>> spare_;
};

}  // namespace expertd::client::internal
