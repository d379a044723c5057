// StagingRing: a fixed budget of staging memory (pinned for the CUDA device) cut into equal
// segments, each holding one bundle between its read and its copy into a slot.
//
// Back-pressure without deadlock: `demand_reserve` segments are kept for demand reads, so
// prefetches can never take the last segments. A demand reservation waits (up to a deadline) for
// a segment to be released; a prefetch reservation never waits — under pressure it is refused and
// the caller drops the prefetch. Since every reserved segment is released when its copy
// completes (which needs no further segment), a demand read always makes progress.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace expertd {

struct StagingStats {
  uint64_t demand_reserved = 0;
  uint64_t demand_waited = 0;      // demand reservations that had to wait for a release
  uint64_t prefetch_reserved = 0;
  uint64_t prefetch_refused = 0;   // prefetches dropped under pressure
  uint64_t demand_timeouts = 0;
};

class StagingRing {
 public:
  // `memory` is owned by the caller and outlives the ring. segment_bytes > 0; the number of
  // segments is memory.size() / segment_bytes and must exceed demand_reserve.
  static absl::StatusOr<std::unique_ptr<StagingRing>> Create(std::span<uint8_t> memory,
                                                             uint64_t segment_bytes,
                                                             uint32_t demand_reserve);

  uint32_t segments() const { return static_cast<uint32_t>(segments_.size()); }
  uint64_t segment_bytes() const { return segment_bytes_; }
  std::span<uint8_t> segment(uint32_t index) const { return segments_[index]; }

  // A segment for a demand read; waits up to `timeout` for one (DeadlineExceeded after it).
  absl::StatusOr<uint32_t> ReserveDemand(absl::Duration timeout);
  // A segment for a demand read if one is free now (never waits); for callers that queue
  // demand work themselves and retry on Release.
  std::optional<uint32_t> TryReserveDemand();
  // A segment for a prefetch, or nullopt when only the demand reserve is left.
  std::optional<uint32_t> TryReservePrefetch();
  void Release(uint32_t index);

  uint32_t free_segments() const;
  StagingStats stats() const;

 private:
  StagingRing(std::span<uint8_t> memory, uint64_t segment_bytes, uint32_t demand_reserve);

  const uint64_t segment_bytes_;
  const uint32_t demand_reserve_;
  std::vector<std::span<uint8_t>> segments_;
  mutable std::mutex mu_;  // std primitives: visible to ThreadSanitizer
  std::condition_variable released_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> in_use_ ABSL_GUARDED_BY(mu_);
  StagingStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace expertd
