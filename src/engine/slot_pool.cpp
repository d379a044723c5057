#include "engine/slot_pool.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd {

SlotPool::SlotPool(uint32_t capacity, std::unique_ptr<EvictionPolicy> policy,
                   uint64_t prefetch_protect)
    : capacity_(capacity), prefetch_protect_(prefetch_protect), policy_(std::move(policy)) {
  slots_.resize(capacity);
  free_.reserve(capacity);
  // Hand out low slot numbers first: tests and dumps read more easily.
  for (uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
}

std::optional<SlotId> SlotPool::TakeSlot(bool for_prefetch) {
  if (!free_.empty()) {
    const SlotId s = free_.back();
    free_.pop_back();
    return s;
  }
  const uint64_t now = now_;
  absl::flat_hash_set<SlotId> pinned;  // victims a client pins right now
  for (;;) {
    const std::optional<SlotId> victim = policy_->ChooseVictim(
        [&](SlotId s) {
          const Slot& slot = slots_[s];
          if (slot.leases != 0 || slot.state != SlotState::kResident) return false;
          if (pinned.contains(s)) return false;
          return !for_prefetch || slot.last_access + prefetch_protect_ <= now;
        },
        now_);
    if (!victim) return std::nullopt;
    if (board_ != nullptr && !board_->TryRetire(*victim)) {
      pinned.insert(*victim);
      ++stats_.pinned_skips;
      continue;
    }
    Evict(*victim);
    return victim;
  }
}

void SlotPool::Evict(SlotId s) {
  Slot& slot = slots_[s];
  if (board_ != nullptr) board_->Unpublish(s, slot.key);
  where_.erase(slot.key);
  policy_->OnRemove(s);
  if (slot.prefetched_unused) ++stats_.prefetch_wasted;
  slot.prefetched_unused = false;
  slot.state = SlotState::kEmpty;
  ++stats_.evictions;
}

absl::StatusOr<std::vector<SlotGrant>> SlotPool::Acquire(uint32_t layer,
                                                         std::span<const BundleKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::flat_hash_set<BundleKey> distinct(keys.begin(), keys.end());
  if (distinct.size() > capacity_) {
    return MakeError(absl::StatusCode::kResourceExhausted, ErrorKind::kBadValue,
                     absl::StrCat("an acquire of ", distinct.size(),
                                  " distinct bundles cannot fit a pool of ", capacity_, " slots"));
  }
  policy_->OnLayer(layer, now_);
  std::vector<SlotGrant> grants;
  grants.reserve(keys.size());
  SlotPoolStats delta;
  for (const BundleKey& key : keys) {
    ++now_;
    ++delta.accesses;
    SlotGrant g{.key = key};
    if (const auto it = where_.find(key); it != where_.end()) {
      Slot& slot = slots_[it->second];
      g.slot = it->second;
      g.hit = slot.state == SlotState::kResident;
      ++(g.hit ? delta.hits : delta.joins);
      if (slot.prefetched_unused) {
        ++delta.prefetch_used;
        slot.prefetched_unused = false;
      }
    } else {
      const std::optional<SlotId> s = TakeSlot(/*for_prefetch=*/false);
      if (!s) {
        // Roll back: drop the leases this call took, then free the slots it started filling
        // (after all leases are dropped, so a key repeated in this call is freed too).
        for (const SlotGrant& done : grants) --slots_[done.slot].leases;
        for (const SlotGrant& done : grants) {
          Slot& slot = slots_[done.slot];
          if (done.needs_fill && slot.leases == 0 && slot.state == SlotState::kFilling) {
            where_.erase(slot.key);
            policy_->OnRemove(done.slot);
            slot.state = SlotState::kEmpty;
            free_.push_back(done.slot);
          }
        }
        return MakeError(
            absl::StatusCode::kUnavailable, ErrorKind::kBadValue,
            absl::StrCat("all ", capacity_, " slots are leased or filling; retry after releases"));
      }
      Slot& slot = slots_[*s];
      slot.key = key;
      slot.state = SlotState::kFilling;
      ++slot.generation;
      where_[key] = *s;
      policy_->OnInsert(*s, key, now_);
      g.slot = *s;
      g.needs_fill = true;
      g.wait_done = slot.last_granted;
      ++delta.misses;
    }
    Slot& slot = slots_[g.slot];
    ++slot.leases;
    slot.last_access = now_;
    g.generation = slot.generation;
    policy_->OnAccess(g.slot, key, now_);
    grants.push_back(g);
  }
  stats_.accesses += delta.accesses;
  stats_.hits += delta.hits;
  stats_.joins += delta.joins;
  stats_.misses += delta.misses;
  stats_.prefetch_used += delta.prefetch_used;
  return grants;
}

std::optional<SlotGrant> SlotPool::Prefetch(const BundleKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (where_.contains(key)) return std::nullopt;
  const std::optional<SlotId> s = TakeSlot(/*for_prefetch=*/true);
  if (!s) {
    ++stats_.prefetch_dropped;
    return std::nullopt;
  }
  Slot& slot = slots_[*s];
  slot.key = key;
  slot.state = SlotState::kFilling;
  ++slot.generation;
  slot.prefetched_unused = true;
  slot.last_access = now_;
  where_[key] = *s;
  policy_->OnPrefetch(*s, key, now_);
  ++stats_.prefetch_issued;
  return SlotGrant{.key = key,
                   .slot = *s,
                   .generation = slot.generation,
                   .needs_fill = true,
                   .wait_done = slot.last_granted};
}

FillOutcome SlotPool::FillDone(SlotId s, uint64_t generation, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[s];
  if (slot.generation != generation || slot.state != SlotState::kFilling) {
    return FillOutcome::kStale;
  }
  if (slot.cancelled) {
    // Already out of the residency map and the policy (CancelPrefetch); nobody holds a lease.
    slot.cancelled = false;
    slot.prefetched_unused = false;
    slot.state = SlotState::kEmpty;
    if (slot.leases == 0) free_.push_back(s);
    return FillOutcome::kCancelled;
  }
  if (ok) {
    slot.state = SlotState::kResident;
    if (board_ != nullptr) board_->Publish(s, slot.key, slot.generation);
    return FillOutcome::kResident;
  }
  ++stats_.fill_errors;
  // Nobody can read a failed occupant, and no grant of it was committed: the next copy waits
  // only for the readers of the occupants before it.
  where_.erase(slot.key);
  policy_->OnRemove(s);
  if (slot.prefetched_unused) ++stats_.prefetch_wasted;
  slot.prefetched_unused = false;
  slot.state = SlotState::kEmpty;
  if (slot.leases == 0) free_.push_back(s);  // else freed by the last Release
  return FillOutcome::kFailed;
}

bool SlotPool::CancelPrefetch(SlotId s, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[s];
  if (slot.generation != generation || slot.state != SlotState::kFilling || slot.cancelled ||
      slot.leases != 0 || !slot.prefetched_unused) {
    return false;
  }
  where_.erase(slot.key);
  policy_->OnRemove(s);
  slot.cancelled = true;
  ++stats_.prefetch_cancelled;
  return true;
}

void SlotPool::RestorePrefetch(SlotId s, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[s];
  if (slot.generation != generation || slot.state != SlotState::kFilling || !slot.cancelled ||
      where_.contains(slot.key)) {
    return;
  }
  slot.cancelled = false;
  --stats_.prefetch_cancelled;
  where_[slot.key] = s;
  policy_->OnPrefetch(s, slot.key, now_);
}

bool SlotPool::cancelled(SlotId s, uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[s].generation == generation && slots_[s].cancelled;
}

void SlotPool::Commit(std::span<const SlotGrant> grants) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SlotGrant& g : grants) {
    Slot& slot = slots_[g.slot];
    // A leased slot keeps its occupant, so the generation still matches; the check only guards
    // against a commit after release.
    if (slot.generation == g.generation) {
      slot.last_granted = std::max(slot.last_granted, g.generation);
    }
  }
}

void SlotPool::Release(std::span<const SlotId> slots) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SlotId s : slots) {
    Slot& slot = slots_[s];
    if (slot.leases == 0) continue;  // a double release is ignored, never underflows
    if (--slot.leases == 0 && slot.state == SlotState::kEmpty) free_.push_back(s);
  }
}

void SlotPool::SetResidency(ResidencyBoard* board) {
  std::lock_guard<std::mutex> lock(mu_);
  board_ = board;
}

void SlotPool::RecordHits(uint32_t layer, std::span<const BundleKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  policy_->OnLayer(layer, now_);
  for (const BundleKey& key : keys) {
    ++now_;
    ++stats_.accesses;
    ++stats_.hits;
    ++stats_.client_hits;
    const auto it = where_.find(key);
    if (it == where_.end()) continue;  // evicted since the client read it
    Slot& slot = slots_[it->second];
    if (slot.state != SlotState::kResident) continue;
    if (slot.prefetched_unused) {
      ++stats_.prefetch_used;
      slot.prefetched_unused = false;
    }
    slot.last_access = now_;
    policy_->OnAccess(it->second, key, now_);
  }
}

SlotState SlotPool::state(SlotId s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[s].state;
}

uint32_t SlotPool::leases(SlotId s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[s].leases;
}

std::optional<SlotId> SlotPool::Find(const BundleKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = where_.find(key);
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

SlotPoolStats SlotPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint32_t SlotPool::resident() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(where_.size());
}

void SlotPool::ReplacePolicy(std::unique_ptr<EvictionPolicy> policy) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SlotId> occupied;
  for (SlotId s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state != SlotState::kEmpty) occupied.push_back(s);
  }
  std::sort(occupied.begin(), occupied.end(),
            [&](SlotId a, SlotId b) { return slots_[a].last_access < slots_[b].last_access; });
  for (SlotId s : occupied) {
    const Slot& slot = slots_[s];
    if (slot.prefetched_unused) {
      policy->OnPrefetch(s, slot.key, slot.last_access);
    } else {
      policy->OnInsert(s, slot.key, slot.last_access);
      policy->OnAccess(s, slot.key, slot.last_access);
    }
  }
  policy_ = std::move(policy);
}

std::string_view SlotPool::policy_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_->name();
}

}  // namespace expertd
