#include "engine/predictor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::string_view kNames[] = {"history", "none", "hints"};

class NoPredictor final : public Predictor {
 public:
  explicit NoPredictor(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  std::vector<Prediction> Step(uint32_t, std::span<const uint32_t>) override { return {}; }

 private:
  std::string_view name_;
};

class HistoryPredictor final : public Predictor {
 public:
  explicit HistoryPredictor(PredictorOptions o) : o_(std::move(o)) {
    for (size_t i = 0; i < o_.layers.size(); ++i) position_[o_.layers[i]] = i;
  }
  std::string_view name() const override { return "history"; }

  std::vector<Prediction> Step(uint32_t layer, std::span<const uint32_t> experts) override {
    std::deque<std::vector<uint32_t>>& h = history_[layer];
    h.emplace_front(experts.begin(), experts.end());
    if (h.size() > o_.history_tokens) h.pop_back();
    const auto pos = position_.find(layer);
    if (pos == position_.end() || o_.layers.empty()) return {};
    // The layer `lookahead` steps ahead in sweep order; past the last layer the next token's
    // sweep starts again at the first.
    const uint32_t target = o_.layers[(pos->second + o_.lookahead) % o_.layers.size()];
    const auto it = history_.find(target);
    if (it == history_.end()) return {};
    Prediction p;
    p.layer = target;
    for (const std::vector<uint32_t>& route : it->second) {
      for (uint32_t e : route) {
        if (p.experts.size() >= o_.max_experts) break;
        if (std::find(p.experts.begin(), p.experts.end(), e) == p.experts.end()) {
          p.experts.push_back(e);
        }
      }
    }
    if (p.experts.empty()) return {};
    return {std::move(p)};
  }

 private:
  PredictorOptions o_;
  absl::flat_hash_map<uint32_t, size_t> position_;
  absl::flat_hash_map<uint32_t, std::deque<std::vector<uint32_t>>> history_;
};

}  // namespace

std::span<const std::string_view> PredictorNames() { return kNames; }

absl::StatusOr<std::unique_ptr<Predictor>> MakePredictor(std::string_view name,
                                                         const PredictorOptions& options) {
  if (name == "history") {
    if (options.max_experts == 0 || options.history_tokens == 0) {
      return absl::InvalidArgumentError("history predictor: max_experts and history_tokens must be > 0");
    }
    return std::make_unique<HistoryPredictor>(options);
  }
  if (name == "none") return std::make_unique<NoPredictor>(kNames[1]);
  if (name == "hints") return std::make_unique<NoPredictor>(kNames[2]);
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  return absl::InvalidArgumentError(absl::StrCat("unknown predictor '", AV(name),
                                                 "'; choose one of ", absl::StrJoin(names, ", ")));
}

}  // namespace expertd
