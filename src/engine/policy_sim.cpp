#include "engine/policy_sim.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint64_t kNoNextUse = std::numeric_limits<uint64_t>::max();

// Belady's MIN: evicts the resident bundle whose next use lies farthest in the future (never
// used again counts as infinitely far). Offline: it is given, for every access index, the index
// of the next access to the same bundle. Resident slots are kept in a set ordered by next use,
// so a victim costs O(log n) plus the slots skipped because they are not evictable (at most the
// group size).
class BeladyPolicy final : public EvictionPolicy {
 public:
  BeladyPolicy(std::vector<uint64_t> next_use, uint32_t capacity)
      : next_use_(std::move(next_use)), slot_next_(capacity, kNoNextUse) {}
  std::string_view name() const override { return "belady"; }
  void OnInsert(SlotId, const BundleKey&, uint64_t) override {}
  void OnAccess(SlotId slot, const BundleKey&, uint64_t now) override {
    OnRemove(slot);
    if (slot >= slot_next_.size()) slot_next_.resize(size_t{slot} + 1, kNoNextUse);
    slot_next_[slot] = next_use_[now];
    order_.emplace(slot_next_[slot], slot);
  }
  void OnRemove(SlotId slot) override {
    if (slot < slot_next_.size()) order_.erase({slot_next_[slot], slot});
  }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (evictable(it->second)) return it->second;
    }
    return std::nullopt;
  }

 private:
  std::vector<uint64_t> next_use_;
  std::vector<uint64_t> slot_next_;
  std::set<std::pair<uint64_t, SlotId>> order_;
};

std::vector<uint64_t> NextUses(const AccessTrace& trace) {
  std::vector<BundleKey> seq;
  seq.reserve(trace.accesses);
  for (const RouteRecord& r : trace.groups) {
    for (uint32_t e : r.experts) seq.push_back(BundleKey{r.layer, e});
  }
  std::vector<uint64_t> next(seq.size(), kNoNextUse);
  absl::flat_hash_map<BundleKey, uint64_t> later;
  for (size_t i = seq.size(); i-- > 0;) {
    const auto [it, inserted] = later.try_emplace(seq[i], i);
    if (!inserted) {
      next[i] = it->second;
      it->second = i;
    }
  }
  return next;
}

}  // namespace

absl::StatusOr<AccessTrace> MakeAccessTrace(std::vector<RouteRecord> records) {
  if (records.empty()) return absl::InvalidArgumentError("the trace has no records");
  std::stable_sort(records.begin(), records.end(), [](const RouteRecord& a, const RouteRecord& b) {
    return std::tie(a.problem_id, a.token, a.layer) < std::tie(b.problem_id, b.token, b.layer);
  });
  AccessTrace t;
  std::set<uint32_t> layers;
  absl::flat_hash_map<BundleKey, bool> seen;
  for (const RouteRecord& r : records) {
    layers.insert(r.layer);
    t.accesses += r.experts.size();
    t.max_group = std::max<uint32_t>(t.max_group, static_cast<uint32_t>(r.experts.size()));
    for (uint32_t e : r.experts) {
      seen.try_emplace(BundleKey{r.layer, e}, true);
      t.model.n_expert = std::max(t.model.n_expert, e + 1);
    }
  }
  t.model.layers.assign(layers.begin(), layers.end());
  t.model.n_expert_used = t.max_group;
  t.distinct_bundles = seen.size();
  t.groups = std::move(records);
  return t;
}

std::vector<std::string_view> SimPolicyNames() {
  std::vector<std::string_view> names(EvictionPolicyNames().begin(), EvictionPolicyNames().end());
  names.push_back("belady");
  return names;
}

absl::StatusOr<SimResult> SimulatePolicy(const AccessTrace& trace, const PolicyModel& model,
                                         std::string_view policy, uint32_t capacity) {
  if (capacity == 0 || capacity < trace.max_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", capacity, " is smaller than the ", trace.max_group,
        " experts one record needs at once (top-k): a pool must hold a whole acquire"));
  }
  const std::vector<std::string_view> names = SimPolicyNames();
  if (std::find(names.begin(), names.end(), policy) == names.end()) {
    std::string valid;
    for (std::string_view n : names) absl::StrAppend(&valid, valid.empty() ? "" : ", ", AV(n));
    return absl::InvalidArgumentError(
        absl::StrCat("unknown policy '", AV(policy), "': use one of ", valid));
  }
  std::unique_ptr<EvictionPolicy> p;
  if (policy == "belady") {
    p = std::make_unique<BeladyPolicy>(NextUses(trace), capacity);
  } else {
    ASSIGN_OR_RETURN(p, MakeEvictionPolicy(policy, model, capacity));
  }

  SimResult out;
  out.policy = std::string(policy);
  out.capacity = capacity;
  absl::flat_hash_map<BundleKey, SlotId> where;
  std::vector<BundleKey> holds(capacity);
  // A slot is touched by the group with this number; group numbers start at 1.
  std::vector<uint64_t> touched(capacity, 0);
  std::map<uint32_t, LayerHits> per_layer;
  SlotId next_free = 0;
  uint64_t now = 0, group = 0;
  const auto evictable = [&](SlotId s) { return touched[s] != group; };

  for (const RouteRecord& r : trace.groups) {
    ++group;
    p->OnLayer(r.layer, now);
    LayerHits& lh = per_layer[r.layer];
    lh.layer = r.layer;
    for (uint32_t e : r.experts) {
      const BundleKey key{r.layer, e};
      ++out.accesses;
      ++lh.accesses;
      SlotId slot;
      if (const auto it = where.find(key); it != where.end()) {
        slot = it->second;
        ++out.hits;
        ++lh.hits;
      } else {
        ++out.misses;
        if (next_free < capacity) {
          slot = next_free++;
        } else {
          const std::optional<SlotId> victim = p->ChooseVictim(evictable, now);
          if (!victim || *victim >= capacity || !evictable(*victim)) {
            return absl::InternalError(
                absl::StrCat("policy ", AV(policy), " found no evictable slot at access ", now));
          }
          slot = *victim;
          where.erase(holds[slot]);
          p->OnRemove(slot);
          ++out.evictions;
        }
        holds[slot] = key;
        where[key] = slot;
        p->OnInsert(slot, key, now);
      }
      touched[slot] = group;
      p->OnAccess(slot, key, now);
      ++now;
    }
  }
  out.hit_rate = out.accesses ? double(out.hits) / double(out.accesses) : 0;
  for (const auto& [layer, lh] : per_layer) out.per_layer.push_back(lh);
  return out;
}

}  // namespace expertd
