// Eviction policies of a slot pool. A policy ranks resident bundles; the pool asks it for a
// victim when it needs a free slot, and tells it about every access, insertion and eviction.
// Policies see logical time: `now` is the pool's access counter (one tick per bundle access),
// so the same trace gives the same decisions on any machine.
//
// Leased slots (and slots whose done fence has not passed) are never victims: the pool passes an
// `evictable` predicate and a policy must only return slots for which it is true.
//
// Not thread-safe: the owning pool serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/bundle.h"

namespace expertd {

// What a policy may know about the model: the MoE layers in the order a token visits them.
// Layer-aware policies use it to estimate how soon a layer comes round again.
struct PolicyModel {
  std::vector<uint32_t> layers;  // MoE block numbers in visiting order (ascending)
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // `key` now lives in `slot` (after a miss filled it).
  virtual void OnInsert(SlotId slot, const BundleKey& key, uint64_t now) = 0;
  // `key` now lives in `slot` because a predictor expects its layer's next visit to use it: an
  // insertion without an access. Default: OnInsert. A policy that ranks unused bundles low must
  // override it, or it evicts prefetched bundles before the visit they were fetched for.
  virtual void OnPrefetch(SlotId slot, const BundleKey& key, uint64_t now) {
    OnInsert(slot, key, now);
  }
  // A resident bundle was used by an acquire (a hit, or the access that inserted it, which is
  // reported as OnInsert followed by OnAccess).
  virtual void OnAccess(SlotId slot, const BundleKey& key, uint64_t now) = 0;
  // The slot was emptied (evicted or invalidated).
  virtual void OnRemove(SlotId slot) = 0;
  // An acquire for `layer` is starting (before its accesses): where the token is in its sweep.
  virtual void OnLayer(uint32_t layer, uint64_t now) { (void)layer, (void)now; }
  // A resident slot to evict, chosen among those for which `evictable(slot)` holds; nullopt when
  // none may be evicted.
  virtual std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                             uint64_t now) = 0;
};

// Names accepted by MakeEvictionPolicy, the default first.
std::span<const std::string_view> EvictionPolicyNames();
inline constexpr std::string_view kDefaultEvictionPolicy = "cycle";

// Creates a policy for a pool of `capacity` slots. Unknown names are InvalidArgument, listing
// the valid ones.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                                   const PolicyModel& model,
                                                                   uint32_t capacity);

}  // namespace expertd
