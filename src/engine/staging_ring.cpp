#include "engine/staging_ring.h"

#include "absl/strings/str_cat.h"

namespace expertd {

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::Create(std::span<uint8_t> memory,
                                                                 uint64_t segment_bytes,
                                                                 uint32_t demand_reserve) {
  if (segment_bytes == 0 || memory.size() / segment_bytes <= demand_reserve) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging: ", memory.size(), " bytes in segments of ", segment_bytes,
        " bytes leave no segment beyond the ", demand_reserve, " reserved for demand reads"));
  }
  return std::unique_ptr<StagingRing>(new StagingRing(memory, segment_bytes, demand_reserve));
}

StagingRing::StagingRing(std::span<uint8_t> memory, uint64_t segment_bytes,
                         uint32_t demand_reserve)
    : segment_bytes_(segment_bytes), demand_reserve_(demand_reserve) {
  const uint64_t n = memory.size() / segment_bytes;
  for (uint64_t i = 0; i < n; ++i) segments_.push_back(memory.subspan(i * segment_bytes, segment_bytes));
  for (uint64_t i = n; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
  in_use_.assign(n, false);
}

absl::StatusOr<uint32_t> StagingRing::ReserveDemand(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (free_.empty()) {
    ++stats_.demand_waited;
    if (!released_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                            [this] { return !free_.empty(); })) {
      ++stats_.demand_timeouts;
      return absl::DeadlineExceededError(
          absl::StrCat("no staging segment freed within ", absl::FormatDuration(timeout), " (all ",
                       segments_.size(), " in use)"));
    }
  }
  const uint32_t i = free_.back();
  free_.pop_back();
  in_use_[i] = true;
  ++stats_.demand_reserved;
  return i;
}

std::optional<uint32_t> StagingRing::TryReserveDemand() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return std::nullopt;
  const uint32_t i = free_.back();
  free_.pop_back();
  in_use_[i] = true;
  ++stats_.demand_reserved;
  return i;
}

std::optional<uint32_t> StagingRing::TryReservePrefetch() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() <= demand_reserve_) {
    ++stats_.prefetch_refused;
    return std::nullopt;
  }
  const uint32_t i = free_.back();
  free_.pop_back();
  in_use_[i] = true;
  ++stats_.prefetch_reserved;
  return i;
}

void StagingRing::Release(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= in_use_.size() || !in_use_[index]) return;  // double release: ignored
  in_use_[index] = false;
  free_.push_back(index);
  released_.notify_one();
}

uint32_t StagingRing::free_segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(free_.size());
}

StagingStats StagingRing::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace expertd
