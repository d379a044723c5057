// The oracle of `expertctl bench`: the XXH3-64 of every (layer, expert, projection) a trace
// touches, read straight from the GGUF the daemon serves with plain pread — independent of the
// daemon's readers, index and Q packs — in the order of the served model's slot class
// projections, so hash i is compared with SlotView::projections[i].
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "expertd/v1/models.pb.h"
#include "format/route_trace.h"

namespace expertd::ctl {

class ExpectedHashes {
 public:
  // Opens `gguf` (any shard), checks that it is the model `served` describes (MoE layers, expert
  // count, projections and their sizes: FailedPrecondition otherwise) and hashes the bundles
  // `groups` name. Progress on stderr unless `quiet`.
  static absl::StatusOr<ExpectedHashes> Build(const std::string& gguf, const v1::ModelInfo& served,
                                              const std::vector<RouteRecord>& groups, bool quiet);

  // Hashes of (layer, expert) in slot class projection order; nullptr when not hashed.
  // Immutable after Build: safe to call from many threads.
  const std::vector<uint64_t>* Find(uint32_t layer, uint32_t expert) const;
  uint64_t bytes_hashed() const { return bytes_hashed_; }

 private:
  static uint64_t Key(uint32_t layer, uint32_t expert) { return (uint64_t{layer} << 32) | expert; }
  std::unordered_map<uint64_t, std::vector<uint64_t>> hashes_;
  uint64_t bytes_hashed_ = 0;
};

}  // namespace expertd::ctl
