#include "engine/eviction_policy.h"

#include <cmath>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::string_view kNames[] = {"cycle", "lru", "lfu"};

// Least recently used: a recency list, victims taken from its cold end.
class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(uint32_t capacity) : where_(capacity) {}
  std::string_view name() const override { return "lru"; }
  void OnInsert(SlotId slot, const BundleKey&, uint64_t) override { Touch(slot); }
  void OnAccess(SlotId slot, const BundleKey&, uint64_t) override { Touch(slot); }
  void OnRemove(SlotId slot) override {
    if (where_[slot].second) order_.erase(where_[slot].first);
    where_[slot].second = false;
  }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (evictable(*it)) return *it;
    }
    return std::nullopt;
  }

 private:
  void Touch(SlotId slot) {
    OnRemove(slot);
    order_.push_front(slot);
    where_[slot] = {order_.begin(), true};
  }
  std::list<SlotId> order_;  // most recent first
  std::vector<std::pair<std::list<SlotId>::iterator, bool>> where_;
};

// Least frequently used with decay: every access adds 1, and all counts halve every
// `half_life` accesses (applied lazily), so old popularity fades. O(capacity) per victim.
class LfuPolicy final : public EvictionPolicy {
 public:
  explicit LfuPolicy(uint32_t capacity)
      : half_life_(std::max<uint64_t>(uint64_t{8} * capacity, 64)), slots_(capacity) {}
  std::string_view name() const override { return "lfu"; }
  void OnInsert(SlotId slot, const BundleKey&, uint64_t now) override {
    slots_[slot] = {0.0, now, true};
  }
  void OnAccess(SlotId slot, const BundleKey&, uint64_t now) override {
    Entry& e = slots_[slot];
    e.count = Decayed(e, now) + 1.0;
    e.at = now;
  }
  void OnRemove(SlotId slot) override { slots_[slot].live = false; }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t now) override {
    std::optional<SlotId> best;
    double best_count = 0;
    uint64_t best_at = 0;
    for (SlotId s = 0; s < slots_.size(); ++s) {
      const Entry& e = slots_[s];
      if (!e.live || !evictable(s)) continue;
      const double c = Decayed(e, now);
      if (!best || c < best_count || (c == best_count && e.at < best_at)) {
        best = s;
        best_count = c;
        best_at = e.at;
      }
    }
    return best;
  }

 private:
  struct Entry {
    double count = 0;
    uint64_t at = 0;
    bool live = false;
  };
  double Decayed(const Entry& e, uint64_t now) const {
    const double halvings = static_cast<double>(now - e.at) / static_cast<double>(half_life_);
    return e.count * std::exp2(-halvings);
  }
  uint64_t half_life_;
  std::vector<Entry> slots_;
};

// Layer-cycle aware: every token sweeps the MoE layers in order, so a bundle of layer L is next
// needed no sooner than when the sweep comes back to L. The victim is the bundle whose layer
// comes round last, counting one extra sweep for bundles its layer did not use on its latest
// visit (they are less likely to be reused next time); ties go to the least recently used.
class CyclePolicy final : public EvictionPolicy {
 public:
  CyclePolicy(const PolicyModel& model, uint32_t capacity) : slots_(capacity) {
    for (size_t i = 0; i < model.layers.size(); ++i) position_[model.layers[i]] = i;
    n_layers_ = std::max<size_t>(model.layers.size(), 1);
    visits_.assign(n_layers_, 0);
  }
  std::string_view name() const override { return "cycle"; }
  void OnLayer(uint32_t layer, uint64_t) override {
    current_ = Position(layer);
    ++visits_[current_];
  }
  void OnInsert(SlotId slot, const BundleKey& key, uint64_t now) override {
    slots_[slot] = {Position(key.layer), 0, now, true};
  }
  void OnAccess(SlotId slot, const BundleKey&, uint64_t now) override {
    Entry& e = slots_[slot];
    e.visit = visits_[e.pos];
    e.at = now;
  }
  void OnRemove(SlotId slot) override { slots_[slot].live = false; }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    std::optional<SlotId> best;
    uint64_t best_score = 0, best_at = 0;
    for (SlotId s = 0; s < slots_.size(); ++s) {
      const Entry& e = slots_[s];
      if (!e.live || !evictable(s)) continue;
      uint64_t distance = (e.pos + n_layers_ - current_) % n_layers_;
      if (distance == 0) distance = n_layers_;  // its layer is now: next use is a sweep away
      if (e.visit != visits_[e.pos]) distance += n_layers_;
      if (!best || distance > best_score || (distance == best_score && e.at < best_at)) {
        best = s;
        best_score = distance;
        best_at = e.at;
      }
    }
    return best;
  }

 private:
  struct Entry {
    size_t pos = 0;
    uint64_t visit = 0;
    uint64_t at = 0;
    bool live = false;
  };
  size_t Position(uint32_t layer) const {
    const auto it = position_.find(layer);
    return it == position_.end() ? 0 : it->second;
  }
  absl::flat_hash_map<uint32_t, size_t> position_;
  size_t n_layers_ = 1;
  size_t current_ = 0;
  std::vector<uint64_t> visits_;
  std::vector<Entry> slots_;
};

}  // namespace

std::span<const std::string_view> EvictionPolicyNames() { return kNames; }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                                   const PolicyModel& model,
                                                                   uint32_t capacity) {
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  if (name == "lfu") return std::make_unique<LfuPolicy>(capacity);
  if (name == "cycle") return std::make_unique<CyclePolicy>(model, capacity);
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  return absl::InvalidArgumentError(absl::StrCat("unknown eviction policy '", AV(name),
                                                 "'; choose one of ", absl::StrJoin(names, ", ")));
}

}  // namespace expertd
