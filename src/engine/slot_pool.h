// SlotPool: the cache of one slot class. `capacity` slots; a residency map (layer, expert) ->
// slot; per slot the bundle it holds, its state, a generation number and a lease count.
//
// Rules the pool guarantees (and the tests check):
//  - A leased slot (lease count > 0) is never chosen as a victim, so its bytes are never
//    overwritten while a client may read them.
//  - A bundle is in at most one slot. A second acquire of a bundle that is resident or being
//    filled shares that slot (lease count + 1) and causes no second read.
//  - Every new occupant of a slot gets a new generation (strictly increasing per slot), so ready
//    fences and stale grants can be told apart.
//  - Within one acquire, slots granted to earlier keys are leased before later keys are looked
//    up, so one acquire never evicts its own bundles.
//  - A generation counts as handed out (so that the next occupant's fill waits for its done
//    fence) only once the caller commits the grant (Commit), i.e. when the grant reached the
//    client. A grant that fails after Acquire (a read error, a joined read that failed) is
//    released without a commit: no later fill waits for a done fence nobody will signal.
//
// Prefetch rule: a prefetch never evicts a leased or filling slot, and it may evict a resident
// bundle only when that bundle is colder than the sweep: it was not accessed within the last
// `prefetch_protect` accesses (default: one full token sweep of the pool's layers times top-k),
// so a prefetch cannot push out what the current token is likely to reuse. Prefetched bundles
// are not leased; the first acquire that hits one counts as a used prefetch, and evicting one
// that was never acquired counts as a wasted prefetch.
//
// Client-side hits (engine/residency.h): with a ResidencyBoard, a slot is published when it
// becomes resident and retired before it is evicted; a victim that a client pinned is skipped
// like a leased one. RecordHits counts the hits clients report afterwards as accesses.
//
// Thread-safe: every method takes the pool's mutex; no method blocks on I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/bundle.h"
#include "engine/eviction_policy.h"
#include "engine/residency.h"

namespace expertd {

enum class SlotState : uint8_t { kEmpty, kFilling, kResident };

// What an acquire got for one key.
struct SlotGrant {
  BundleKey key;
  SlotId slot = kNoSlot;
  uint64_t generation = 0;
  // True when the caller must read the bundle into the slot and then call FillDone; false when
  // the bundle is resident (a hit) or already being filled by someone else (wait for its fill).
  bool needs_fill = false;
  bool hit = false;  // resident when looked up
  // With needs_fill: the newest generation of this slot's earlier occupants that any acquire
  // was granted (0: none). The copy into the slot must wait until the slot's done fence reached
  // it — the last reader of what is being overwritten has finished.
  uint64_t wait_done = 0;
};

struct SlotPoolStats {
  uint64_t accesses = 0;
  uint64_t hits = 0;    // resident at acquire
  uint64_t joins = 0;   // being filled by an earlier request: shared the in-flight read
  uint64_t misses = 0;  // needed a fill
  uint64_t evictions = 0;
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;     // prefetched bundles later acquired
  uint64_t prefetch_wasted = 0;   // prefetched bundles evicted or failed before any acquire
  uint64_t prefetch_dropped = 0;  // prefetches refused: no slot allowed by the prefetch rule
  uint64_t fill_errors = 0;
  uint64_t prefetch_cancelled = 0;  // superseded and given up (CancelPrefetch, not restored)
  uint64_t client_hits = 0;  // of hits: made by clients on their own and reported (RecordHits)
  uint64_t pinned_skips = 0;  // victims skipped because a client pinned them
};

// How a fill ended, as FillDone saw it.
enum class FillOutcome : uint8_t {
  kResident,   // the bundle is resident
  kFailed,     // the slot was emptied; its waiters fail
  kCancelled,  // a cancelled prefetch: the slot was emptied, nobody waited for it
  kStale,      // not the slot's current fill (ignored)
};

class SlotPool {
 public:
  // `policy` must have been made for `capacity` slots. `prefetch_protect` in accesses (see above).
  SlotPool(uint32_t capacity, std::unique_ptr<EvictionPolicy> policy, uint64_t prefetch_protect);

  uint32_t capacity() const { return capacity_; }

  // Leases one slot per key, in order. Errors: more distinct keys than the pool has slots
  // (ResourceExhausted: can never succeed), or not enough slots that may be evicted right now
  // because too many are leased (Unavailable: retry after releases). On error nothing is leased
  // and nothing is recorded as granted. Duplicate keys in one call share one slot and one lease
  // each. On success the caller either commits the grants (Commit) before the client can see
  // them, or releases them without a commit when the acquire fails later.
  absl::StatusOr<std::vector<SlotGrant>> Acquire(uint32_t layer, std::span<const BundleKey> keys);

  // Records that these grants (from one successful Acquire, still leased) reached the client:
  // a later fill of one of these slots waits until its done fence reached the granted
  // generation (SlotGrant::wait_done). Must be called before the leases are released.
  void Commit(std::span<const SlotGrant> grants);

  // Reserves a slot for a predicted bundle without leasing it. Returns the grant (needs_fill
  // true) when the caller should read it, nullopt when it is already resident or filling, or
  // when the prefetch rule allows no slot (counted as dropped).
  std::optional<SlotGrant> Prefetch(const BundleKey& key);

  // The read for `slot` at `generation` finished. On error the slot is emptied (its waiters
  // should fail their acquires) and the bundle is no longer resident. A cancelled prefetch's
  // slot is emptied whatever `ok` says (its bytes are not wanted any more).
  FillOutcome FillDone(SlotId slot, uint64_t generation, bool ok);

  // Cancelling a superseded prefetch, in two steps. CancelPrefetch succeeds only for a prefetch
  // fill that nobody acquired yet (no lease joined it): the bundle stops being resident-or-
  // filling at once (a later acquire misses and reads it again), while the slot stays reserved
  // until FillDone (its read may still be running). If the caller then cannot stop the read
  // after all, RestorePrefetch puts the bundle back — unless an acquire already took the key
  // for another slot, in which case the fill stays cancelled and its bytes are discarded.
  bool CancelPrefetch(SlotId slot, uint64_t generation);
  void RestorePrefetch(SlotId slot, uint64_t generation);
  // True while the fill (slot, generation) is cancelled: its bytes must not become resident.
  bool cancelled(SlotId slot, uint64_t generation) const;

  // Publishes residency to clients from now on (`board` outlives the pool; set before use).
  void SetResidency(ResidencyBoard* board);
  // Hits a client made on its own (client-side hits), reported after the fact: each key counts
  // as an access and a hit, and a key still resident is touched for the eviction policy.
  void RecordHits(uint32_t layer, std::span<const BundleKey> keys);

  // Drops one lease per slot; slots are given as granted (duplicates release twice).
  void Release(std::span<const SlotId> slots);

  // Swaps the eviction policy (made for capacity() slots). The new policy learns every occupied
  // slot, oldest access first, so its first victims are what the old one would have chosen
  // among recency ties.
  void ReplacePolicy(std::unique_ptr<EvictionPolicy> policy);
  std::string_view policy_name() const;

  // For tests and statistics.
  SlotState state(SlotId slot) const;
  uint32_t leases(SlotId slot) const;
  std::optional<SlotId> Find(const BundleKey& key) const;
  SlotPoolStats stats() const;
  uint32_t resident() const;

 private:
  struct Slot {
    BundleKey key;
    SlotState state = SlotState::kEmpty;
    uint64_t generation = 0;
    uint32_t leases = 0;
    uint64_t last_access = 0;
    bool prefetched_unused = false;
    bool cancelled = false;     // a cancelled prefetch fill, waiting for its FillDone
    uint64_t last_granted = 0;  // newest committed generation of this slot (see Commit)
  };

  // A slot for a new occupant: a free one, else the policy's victim among evictable slots.
  std::optional<SlotId> TakeSlot(bool for_prefetch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict(SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t capacity_;
  const uint64_t prefetch_protect_;
  // std::mutex rather than absl::Mutex: the distribution's Abseil is not built for
  // ThreadSanitizer, which then cannot see its locking.
  mutable std::mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<SlotId> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BundleKey, SlotId> where_ ABSL_GUARDED_BY(mu_);
  uint64_t now_ ABSL_GUARDED_BY(mu_) = 0;
  SlotPoolStats stats_ ABSL_GUARDED_BY(mu_);
  ResidencyBoard* board_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace expertd
