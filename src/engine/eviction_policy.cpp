// The eviction policies lru and lfu (exponentially decayed counts), and the factory; cycle
// (layer-aware, the default) is in cycle_policy.cpp. docs/policy.md explains each one and how
// cycle was measured against Belady's MIN.
#include "engine/eviction_policy.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/cycle_policy.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr std::array<std::string_view, 3> kPolicyNames = {"cycle", "lru", "lfu"};
constexpr uint64_t kNever = ~uint64_t{0};

void GrowTo(std::vector<uint64_t>& v, SlotId slot) {
  if (slot >= v.size()) v.resize(size_t{slot} + 1, kNever);
}

// Least recently used: an ordered set of (last access, slot); the victim is the first evictable
// entry from the old end. O(log n) per access; ChooseVictim skips only non-evictable slots.
class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(uint32_t capacity) : tick_(capacity, kNever) {}
  std::string_view name() const override { return "lru"; }
  void OnInsert(SlotId slot, const BundleKey&, uint64_t now) override { Touch(slot, now); }
  void OnAccess(SlotId slot, const BundleKey&, uint64_t now) override { Touch(slot, now); }
  void OnRemove(SlotId slot) override {
    if (slot < tick_.size() && tick_[slot] != kNever) order_.erase({tick_[slot], slot});
    if (slot < tick_.size()) tick_[slot] = kNever;
  }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    for (const auto& [tick, slot] : order_) {
      if (evictable(slot)) return slot;
    }
    return std::nullopt;
  }

 private:
  void Touch(SlotId slot, uint64_t now) {
    OnRemove(slot);
    GrowTo(tick_, slot);
    tick_[slot] = now;
    order_.emplace(now, slot);
  }
  std::vector<uint64_t> tick_;
  std::set<std::pair<uint64_t, SlotId>> order_;
};

// Least frequently used with exponential decay: a bundle's count halves every `half_life`
// accesses, c(now) = c(t) * 2^-((now - t) / half_life). Every count decays by the same factor,
// so ranking by c(now) equals ranking by the time-free key log2(c(t)) + t / half_life: victims
// come from an ordered set in O(log n). Counts are kept per bundle after eviction, so a bundle
// that comes back resumes its (decayed) history instead of starting at 1.
class LfuPolicy final : public EvictionPolicy {
 public:
  LfuPolicy(uint32_t capacity, double half_life) : half_life_(half_life), resident_(capacity) {}
  std::string_view name() const override { return "lfu"; }
  void OnInsert(SlotId slot, const BundleKey& key, uint64_t now) override {
    OnRemove(slot);
    if (slot >= resident_.size()) resident_.resize(size_t{slot} + 1);
    Count& c = history_[key];
    if (c.tick == kNever) c = Count{0, now};
    resident_[slot] = Resident{true, key, Key(c)};
    order_.emplace(resident_[slot].order_key, slot);
  }
  void OnAccess(SlotId slot, const BundleKey& key, uint64_t now) override {
    if (slot >= resident_.size() || !resident_[slot].present) OnInsert(slot, key, now);
    Count& c = history_[key];
    c.count = c.count * std::exp2(-static_cast<double>(now - c.tick) / half_life_) + 1.0;
    c.tick = now;
    order_.erase({resident_[slot].order_key, slot});
    resident_[slot].order_key = Key(c);
    order_.emplace(resident_[slot].order_key, slot);
  }
  void OnRemove(SlotId slot) override {
    if (slot >= resident_.size() || !resident_[slot].present) return;
    order_.erase({resident_[slot].order_key, slot});
    resident_[slot].present = false;
  }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    for (const auto& [key, slot] : order_) {
      if (evictable(slot)) return slot;
    }
    return std::nullopt;
  }

 private:
  struct Count {
    double count = 0;
    uint64_t tick = kNever;
  };
  struct Resident {
    bool present = false;
    BundleKey key;
    double order_key = 0;
  };
  double Key(const Count& c) const {
    // log2(0) for a bundle inserted but not yet accessed: rank it below everything.
    const double log_count = c.count > 0 ? std::log2(c.count) : -1e300;
    return log_count + static_cast<double>(c.tick) / half_life_;
  }
  double half_life_;
  absl::flat_hash_map<BundleKey, Count> history_;
  std::vector<Resident> resident_;
  std::set<std::pair<double, SlotId>> order_;
};

}  // namespace

std::span<const std::string_view> EvictionPolicyNames() { return kPolicyNames; }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                                   const PolicyModel& model,
                                                                   uint32_t capacity) {
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  if (name == "lfu") {
    // Half-life in accesses: long enough to tell hot from cold bundles (about four pool
    // turnovers), short enough to follow a change of workload.
    return std::make_unique<LfuPolicy>(capacity, 4.0 * std::max<uint32_t>(capacity, 1));
  }
  if (name == "cycle") return MakeCyclePolicy(model, capacity);
  std::string valid;
  for (std::string_view n : kPolicyNames) absl::StrAppend(&valid, valid.empty() ? "" : ", ", AV(n));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy '", AV(name), "': use one of ", valid));
}

}  // namespace expertd
