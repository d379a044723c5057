// Trace-driven simulation of one slot pool: a global pool of `capacity` bundles, demand fills
// only, replaying a route trace's accesses through an EvictionPolicy or through Belady's MIN.
// Used by `expertctl replay` (without a model) and by the policy tests; deterministic.
//
// Access order: records sorted stably by (problem_id, token, layer) — records without a
// problem_id sort as -1 — and, within one record, its experts in the order listed. One record is
// one access group (an acquire): all its experts are needed at the same time, so while a group is
// being served no bundle it already touched may be evicted. Every policy, Belady included, sees
// that rule through the `evictable` predicate, as a pool sees leased slots.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/eviction_policy.h"
#include "format/route_trace.h"

namespace expertd {

// A trace ready to replay: its records in access order and what can be known of the model.
struct AccessTrace {
  std::vector<RouteRecord> groups;  // access order
  PolicyModel model;                // layers seen (ascending), max expert + 1, max group size
  uint64_t accesses = 0;            // bundle accesses (sum of group sizes)
  uint64_t distinct_bundles = 0;    // distinct (layer, expert) pairs
  uint32_t max_group = 0;           // the most experts one record lists (top-k)
};

// Sorts `records` into access order and derives the model. Empty traces are InvalidArgument.
absl::StatusOr<AccessTrace> MakeAccessTrace(std::vector<RouteRecord> records);

struct LayerHits {
  uint32_t layer = 0;
  uint64_t accesses = 0;
  uint64_t hits = 0;
  double hit_rate() const { return accesses ? double(hits) / double(accesses) : 0; }
};

struct SimResult {
  std::string policy;
  uint32_t capacity = 0;
  uint64_t accesses = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  double hit_rate = 0;
  std::vector<LayerHits> per_layer;  // ascending layer
};

// Policies SimulatePolicy accepts: EvictionPolicyNames() plus "belady" (offline MIN).
std::vector<std::string_view> SimPolicyNames();

// Replays `trace` through a pool of `capacity` bundles managed by `policy`. `model` is what the
// policy is told (trace.model when the caller has nothing better). A capacity smaller than the
// largest group cannot hold one acquire: InvalidArgument. Unknown policies: InvalidArgument.
absl::StatusOr<SimResult> SimulatePolicy(const AccessTrace& trace, const PolicyModel& model,
                                         std::string_view policy, uint32_t capacity);

}  // namespace expertd
