#include "util/latency_histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace expertd {

// Values below kSubBuckets get one bucket each; above, octave o (values in [2^o, 2^(o+1)))
// is split into kSubBuckets equal parts.
int LatencyHistogram::BucketOf(uint64_t ns) {
  if (ns < kSubBuckets) return static_cast<int>(ns);
  const int octave = 63 - std::countl_zero(ns);  // >= 3
  const int shift = octave - 3;                  // log2(kSubBuckets) == 3
  const int sub = static_cast<int>((ns >> shift) & (kSubBuckets - 1));
  const int bucket = (octave - 2) * kSubBuckets + sub;
  return std::min(bucket, kBuckets - 1);
}

uint64_t LatencyHistogram::UpperEdge(int bucket) {
  if (bucket < kSubBuckets) return static_cast<uint64_t>(bucket);
  const int octave = bucket / kSubBuckets + 2;
  const int sub = bucket % kSubBuckets;
  const int shift = octave - 3;
  const uint64_t low = (uint64_t{kSubBuckets} + static_cast<uint64_t>(sub)) << shift;
  return low + (uint64_t{1} << shift) - 1;
}

void LatencyHistogram::Add(uint64_t ns) {
  ++counts_[static_cast<size_t>(BucketOf(ns))];
  ++count_;
  sum_ns_ += ns;
  max_ns_ = std::max(max_ns_, ns);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ns_ += other.sum_ns_;
  max_ns_ = std::max(max_ns_, other.max_ns_);
}

double LatencyHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // The rank of the sample wanted, 1-based: ceil(q * n), at least 1.
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[static_cast<size_t>(b)];
    if (seen >= rank) return static_cast<double>(std::min(UpperEdge(b), max_ns_));
  }
  return static_cast<double>(max_ns_);
}

std::vector<uint64_t> LatencyHistogram::CumulativeAt(const std::vector<uint64_t>& bounds) const {
  std::vector<uint64_t> out(bounds.size(), 0);
  uint64_t seen = 0;
  size_t i = 0;
  for (int b = 0; b < kBuckets && i < bounds.size(); ++b) {
    while (i < bounds.size() && UpperEdge(b) > bounds[i]) out[i++] = seen;
    seen += counts_[static_cast<size_t>(b)];
  }
  while (i < bounds.size()) out[i++] = seen;
  return out;
}

}  // namespace expertd
