// Route predictors: which experts a layer is likely to need next, so they can be staged before
// an acquire asks for them. Predictions become low-priority prefetches; they never take leased
// slots and are dropped when the pool's prefetch rule allows no slot (see slot_pool.h).
//
// Chosen once from config by name:
//   none     — predicts nothing; only acquires (and client prefetch hints) move bytes.
//   history  — the origin's rule: for the layer `lookahead` MoE layers ahead in sweep order, the
//              recency-ordered union of the experts its last tokens routed to, up to `max_experts`
//              (12), most recent first.
//   hints    — predicts nothing itself; the client sends its own predictions (e.g. the next
//              layer's gate applied to the current hidden state) as prefetch requests.
// Client hints are accepted with every predictor; `hints` only says the engine adds none.
//
// Not thread-safe: one predictor per session, driven by that session's acquires.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace expertd {

struct Prediction {
  uint32_t layer = 0;
  std::vector<uint32_t> experts;  // most likely first
};

struct PredictorOptions {
  std::vector<uint32_t> layers;  // MoE block numbers in sweep order
  uint32_t lookahead = 4;        // predict this many MoE layers ahead (the origin: N+4)
  uint32_t max_experts = 12;     // the origin's OPTANE_MOE_PREDICT_EXPERTS
  uint32_t history_tokens = 4;   // routes remembered per layer
};

class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual std::string_view name() const = 0;
  // Observes that `layer` routed to `experts` for the current token; returns what to prefetch
  // now (possibly nothing).
  virtual std::vector<Prediction> Step(uint32_t layer, std::span<const uint32_t> experts) = 0;
};

std::span<const std::string_view> PredictorNames();
absl::StatusOr<std::unique_ptr<Predictor>> MakePredictor(std::string_view name,
                                                         const PredictorOptions& options);

}  // namespace expertd
