// Route traces: JSONL, one object per (token, layer) with the experts the router chose.
//   {"token": T, "layer": L, "experts": [...], "weights": [...], "problem_id": P}
// "token_idx" / "token_pos" are accepted for "token" and "gating_probs" for "weights", so the
// real Mixtral traces (vLLM collector) are read as they are. Other keys are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace expertd {

struct RouteRecord {
  int64_t problem_id = -1;  // -1 when absent
  int64_t token = 0;
  uint32_t layer = 0;  // the block number N of blk.N
  std::vector<uint32_t> experts;  // in the order listed (by weight in the real traces)
  std::vector<float> weights;     // empty when absent
  int line = 0;                   // 1-based line in the file
};

// Parses JSONL text; `name` names the source in messages ("file:line: ...").
absl::StatusOr<std::vector<RouteRecord>> ParseRouteTrace(std::string_view text,
                                                        const std::string& name);
absl::StatusOr<std::vector<RouteRecord>> ReadRouteTrace(const std::string& path);

}  // namespace expertd
