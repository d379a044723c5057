// Synthetic route traces for models that have no public traces here (fine-grained MoE: 256 or
// 128 experts, top-8). A trace is a pure function of (preset, options, seed). The generator
// models three properties seen in real routing:
//  * skewed popularity: each layer ranks its experts by a Zipf law (weight 1 / rank^zipf) under
//    its own random permutation, so every layer has different hot experts;
//  * temporal reuse: each of a token's k choices at a layer is, with probability `reuse`, one of
//    the previous token's experts at that layer;
//  * correlation across layers: otherwise, with probability `correlation`, choice j at layer L+1
//    is a fixed random function of choice j at layer L (the same function for every token);
// the remaining choices are drawn from the popularity law (without repeats).
// These numbers are modelled, not measured: documents must say which figures come from them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/route_trace.h"

namespace expertd {

struct TraceSynthPreset {
  std::string_view name;
  std::string_view description;
  uint32_t first_layer = 0;  // block number of the first MoE layer
  uint32_t layers = 0;       // MoE layers, consecutive blocks
  uint32_t n_expert = 0;
  uint32_t top_k = 0;
  double zipf = 0;  // default popularity exponent
  double reuse = 0;
  double correlation = 0;
};

// Real families (deepseek, qwen3moe, gptoss, mixtral) and the synth model presets
// (deepseek-tiny …, whose layer numbers match `expertctl synth` models).
std::span<const TraceSynthPreset> TraceSynthPresets();

struct TraceSynthOptions {
  std::string preset;
  uint32_t tokens = 256;
  uint64_t seed = 1;
  uint32_t layers = 0;      // 0: the preset's layer count
  double zipf = -1;         // < 0: the preset's
  double reuse = -1;        // < 0: the preset's; else a probability
  double correlation = -1;  // < 0: the preset's; else a probability
};

// One record per (token, layer), tokens 0..tokens-1, layers in order, experts listed by
// descending weight (weights sum to 1). Unknown presets and out-of-range options are
// InvalidArgument.
absl::StatusOr<std::vector<RouteRecord>> SynthesizeRouteTrace(const TraceSynthOptions& options);

// JSONL in the route trace format ({"token","layer","experts","weights"}, plus "problem_id" when
// it is not -1), one line per record.
std::string FormatRouteTrace(std::span<const RouteRecord> records);

}  // namespace expertd
