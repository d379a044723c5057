// A fixed-size latency histogram for long-running counters: log-linear buckets (8 per power of
// two) from 1 ns up to ~10^5 s, so quantiles are within ~9% of the true value and memory never
// grows. Not thread-safe: guard it with the owner's lock. Used for acquire stalls (engine,
// sessions) and exported as a Prometheus histogram by the daemon.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace expertd {

class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 8;
  static constexpr int kOctaves = 48;  // 2^47 ns ≈ 39 hours
  static constexpr int kBuckets = kSubBuckets * kOctaves;

  void Add(uint64_t nanoseconds);
  void Merge(const LatencyHistogram& other);
  uint64_t count() const { return count_; }
  uint64_t sum_ns() const { return sum_ns_; }
  // The q-quantile (0 <= q <= 1) in nanoseconds: the upper edge of the bucket holding it, clamped
  // to the largest sample seen; 0 when empty.
  double Quantile(double q) const;
  // Cumulative counts at the given upper bounds (ns), for a Prometheus histogram: samples in
  // buckets whose upper edge is <= bound. `bounds_ns` ascending.
  std::vector<uint64_t> CumulativeAt(const std::vector<uint64_t>& bounds_ns) const;

  static int BucketOf(uint64_t nanoseconds);
  static uint64_t UpperEdge(int bucket);  // largest value that falls into `bucket`

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
  uint64_t max_ns_ = 0;
};

}  // namespace expertd
