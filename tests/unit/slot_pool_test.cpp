// SlotPool: residency, leases, sharing, generations, rollback, the prefetch rule, and a
// randomized concurrent test in which sessions acquire, fill, read and release bundles.
#include "engine/slot_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <random>
#include <thread>

#include "absl/algorithm/container.h"

namespace expertd {
namespace {

// First in, first out: the oldest insertion among evictable slots. Simple enough that every
// expectation below is computed by hand.
class FifoPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "fifo"; }
  void OnInsert(SlotId slot, const BundleKey&, uint64_t) override { order_.push_back(slot); }
  void OnAccess(SlotId, const BundleKey&, uint64_t) override {}
  void OnRemove(SlotId slot) override { std::erase(order_, slot); }
  std::optional<SlotId> ChooseVictim(const std::function<bool(SlotId)>& evictable,
                                     uint64_t) override {
    for (SlotId s : order_) {
      if (evictable(s)) return s;
    }
    return std::nullopt;
  }

 private:
  std::deque<SlotId> order_;
};

std::unique_ptr<SlotPool> Pool(uint32_t capacity, uint64_t protect = 0) {
  return std::make_unique<SlotPool>(capacity, std::make_unique<FifoPolicy>(), protect);
}

std::vector<BundleKey> Keys(uint32_t layer, std::initializer_list<uint32_t> experts) {
  std::vector<BundleKey> keys;
  for (uint32_t e : experts) keys.push_back({layer, e});
  return keys;
}

void FillAll(SlotPool& pool, const std::vector<SlotGrant>& grants) {
  for (const SlotGrant& g : grants) {
    if (g.needs_fill) pool.FillDone(g.slot, g.generation, true);
  }
}

std::vector<SlotId> Slots(const std::vector<SlotGrant>& grants) {
  std::vector<SlotId> s;
  for (const SlotGrant& g : grants) s.push_back(g.slot);
  return s;
}

TEST(SlotPool, MissThenHit) {
  auto pool = Pool(4);
  auto first = pool->Acquire(0, Keys(0, {1, 2}));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_TRUE((*first)[0].needs_fill);
  EXPECT_FALSE((*first)[0].hit);
  EXPECT_EQ(pool->state((*first)[0].slot), SlotState::kFilling);
  FillAll(*pool, *first);
  EXPECT_EQ(pool->state((*first)[0].slot), SlotState::kResident);
  pool->Release(Slots(*first));
  auto second = pool->Acquire(0, Keys(0, {2, 1}));
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE((*second)[0].hit);
  EXPECT_FALSE((*second)[0].needs_fill);
  EXPECT_EQ((*second)[0].slot, (*first)[1].slot);
  EXPECT_EQ((*second)[0].generation, (*first)[1].generation);
  const SlotPoolStats st = pool->stats();
  EXPECT_EQ(st.accesses, 4u);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 2u);
}

TEST(SlotPool, ConcurrentRequestsShareOneFill) {
  auto pool = Pool(4);
  auto a = pool->Acquire(3, Keys(3, {7}));
  auto b = pool->Acquire(3, Keys(3, {7}));  // before a's fill finished
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*a)[0].needs_fill);
  EXPECT_FALSE((*b)[0].needs_fill);  // joins the in-flight read
  EXPECT_FALSE((*b)[0].hit);
  EXPECT_EQ((*a)[0].slot, (*b)[0].slot);
  EXPECT_EQ(pool->leases((*a)[0].slot), 2u);
  EXPECT_EQ(pool->stats().joins, 1u);
  EXPECT_EQ(pool->stats().misses, 1u);
}

TEST(SlotPool, LeasedSlotsAreNeverEvicted) {
  auto pool = Pool(2);
  auto held = pool->Acquire(0, Keys(0, {0, 1}));
  ASSERT_TRUE(held.ok());
  FillAll(*pool, *held);
  // Both slots leased: a third bundle cannot get a slot; nothing changes.
  auto blocked = pool->Acquire(1, Keys(1, {0}));
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool->Find({0, 0}), (*held)[0].slot);
  EXPECT_EQ(pool->Find({0, 1}), (*held)[1].slot);
  EXPECT_EQ(pool->leases((*held)[0].slot), 1u);
  // After one release, the released slot (and only it) is reused, with a new generation.
  const std::vector<SlotId> first_slot = {(*held)[0].slot};
  pool->Release(first_slot);
  auto next = pool->Acquire(1, Keys(1, {0}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].slot, (*held)[0].slot);
  EXPECT_GT((*next)[0].generation, (*held)[0].generation);
  EXPECT_FALSE(pool->Find({0, 0}).has_value());
  EXPECT_EQ(pool->Find({0, 1}), (*held)[1].slot);
}

TEST(SlotPool, FillingSlotsAreNotEvicted) {
  auto pool = Pool(1);
  auto a = pool->Acquire(0, Keys(0, {0}));
  ASSERT_TRUE(a.ok());
  pool->Release(Slots(*a));  // released but its read has not finished
  EXPECT_EQ(pool->Acquire(0, Keys(0, {1})).status().code(), absl::StatusCode::kUnavailable);
  FillAll(*pool, *a);
  EXPECT_TRUE(pool->Acquire(0, Keys(0, {1})).ok());
}

// A fill must wait only for the readers of what it overwrites: the previous occupants' newest
// committed generation — never its own, even when another acquire joined it first.
TEST(SlotPool, WaitDoneNamesThePreviousOccupantsLastGrant) {
  auto pool = Pool(1);
  auto a = pool->Acquire(0, Keys(0, {0}));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0].wait_done, 0u);  // an empty slot: nothing to wait for
  auto join = pool->Acquire(0, Keys(0, {0}));
  ASSERT_TRUE(join.ok());
  FillAll(*pool, *a);
  pool->Commit(*a);
  pool->Commit(*join);
  pool->Release(Slots(*a));
  pool->Release(Slots(*join));
  auto b = pool->Acquire(0, Keys(0, {1}));  // evicts generation 1
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0].generation, 2u);
  EXPECT_EQ((*b)[0].wait_done, 1u);
  auto b2 = pool->Acquire(0, Keys(0, {1}));  // joins generation 2 before its fill started
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ((*b)[0].wait_done, 1u);
  // A failed fill is never read: the next occupant waits for generation 1 again, not 2.
  pool->FillDone((*b)[0].slot, (*b)[0].generation, false);
  pool->Release(Slots(*b));
  pool->Release(Slots(*b2));
  auto c = pool->Acquire(0, Keys(0, {2}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].wait_done, 1u);
  // The committed occupant generation is what the next fill waits for.
  FillAll(*pool, *c);
  pool->Commit(*c);
  pool->Release(Slots(*c));
  auto d = pool->Acquire(0, Keys(0, {3}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].wait_done, (*c)[0].generation);
}

// The bug this guards against: an acquire that got a hit and then failed (here: a later key
// found no slot) must not leave the hit's generation recorded as handed out, or the next fill
// of that slot would wait for a done fence the client never signals (it never saw the grant).
TEST(SlotPool, FailedAcquireLeavesNoGrantBehind) {
  auto pool = Pool(2);
  const auto p = pool->Prefetch({0, 0});  // resident, never granted to anyone
  ASSERT_TRUE(p.has_value());
  pool->FillDone(p->slot, p->generation, true);
  auto held = pool->Acquire(1, Keys(1, {0}));  // leases the other slot
  ASSERT_TRUE(held.ok());
  // A hit on {0,0}, then {0,1} finds no slot: the acquire fails.
  EXPECT_EQ(pool->Acquire(0, Keys(0, {0, 1})).status().code(), absl::StatusCode::kUnavailable);
  // A grant that succeeds in the pool but fails later (its read failed) is not committed.
  auto uncommitted = pool->Acquire(0, Keys(0, {0}));
  ASSERT_TRUE(uncommitted.ok());
  EXPECT_TRUE((*uncommitted)[0].hit);
  pool->Release(Slots(*uncommitted));
  // Evicting {0,0} now must not wait for any done fence: nobody was granted its generation.
  FillAll(*pool, *held);
  auto next = pool->Acquire(2, Keys(2, {0}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].slot, p->slot);
  EXPECT_EQ((*next)[0].wait_done, 0u);
}

TEST(SlotPool, TooManyBundlesForThePool) {
  auto pool = Pool(3);
  const auto r = pool->Acquire(0, Keys(0, {0, 1, 2, 3}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(r.status().message()).find("4 distinct bundles"), std::string::npos);
  EXPECT_EQ(pool->resident(), 0u);
}

TEST(SlotPool, FailedAcquireRollsBackItsLeasesAndFills) {
  auto pool = Pool(3);
  auto held = pool->Acquire(0, Keys(0, {0, 1}));
  ASSERT_TRUE(held.ok());
  FillAll(*pool, *held);
  // Needs two new slots while two of the three are leased: only one is free.
  auto r = pool->Acquire(1, Keys(1, {5, 6}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(pool->Find({1, 5}).has_value());  // its partial fill was undone
  EXPECT_EQ(pool->leases((*held)[0].slot), 1u);
  // The slot it had taken is free again.
  auto ok = pool->Acquire(1, Keys(1, {5}));
  ASSERT_TRUE(ok.ok()) << ok.status();
}

TEST(SlotPool, DuplicateKeysInOneAcquire) {
  auto pool = Pool(2);
  auto r = pool->Acquire(0, Keys(0, {4, 4}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].slot, (*r)[1].slot);
  EXPECT_EQ(pool->leases((*r)[0].slot), 2u);
  pool->Release(Slots(*r));
  EXPECT_EQ(pool->leases((*r)[0].slot), 0u);
}

TEST(SlotPool, FailedFillEmptiesTheSlot) {
  auto pool = Pool(2);
  auto r = pool->Acquire(0, Keys(0, {1}));
  ASSERT_TRUE(r.ok());
  pool->FillDone((*r)[0].slot, (*r)[0].generation, false);
  EXPECT_FALSE(pool->Find({0, 1}).has_value());
  EXPECT_EQ(pool->stats().fill_errors, 1u);
  pool->Release(Slots(*r));
  // A stale completion for an older generation changes nothing.
  auto again = pool->Acquire(0, Keys(0, {1}));
  ASSERT_TRUE(again.ok());
  pool->FillDone((*again)[0].slot, (*r)[0].generation, true);
  EXPECT_EQ(pool->state((*again)[0].slot), SlotState::kFilling);
}

TEST(SlotPool, PrefetchRule) {
  auto pool = Pool(2, /*protect=*/3);
  auto a = pool->Acquire(0, Keys(0, {0, 1}));  // accesses 1, 2
  ASSERT_TRUE(a.ok());
  FillAll(*pool, *a);
  pool->Release(Slots(*a));
  // Both residents were used within the last 3 accesses: a prefetch may not evict them.
  EXPECT_FALSE(pool->Prefetch({1, 9}).has_value());
  EXPECT_EQ(pool->stats().prefetch_dropped, 1u);
  auto b = pool->Acquire(0, Keys(0, {1, 1, 1}));  // accesses 3..5: {0,0} last used at 1
  ASSERT_TRUE(b.ok());
  pool->Release(Slots(*b));
  const auto p = pool->Prefetch({1, 9});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->slot, (*a)[0].slot);                  // the cold one
  EXPECT_FALSE(pool->Prefetch({1, 9}).has_value());  // already filling: no second read
  pool->FillDone(p->slot, p->generation, true);
  auto c = pool->Acquire(1, Keys(1, {9}));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)[0].hit);
  EXPECT_EQ(pool->stats().prefetch_used, 1u);
  EXPECT_EQ(pool->stats().prefetch_issued, 1u);
}

TEST(SlotPool, UnusedPrefetchEvictedIsWasted) {
  auto pool = Pool(1);
  const auto p = pool->Prefetch({0, 3});
  ASSERT_TRUE(p.has_value());
  pool->FillDone(p->slot, p->generation, true);
  auto r = pool->Acquire(0, Keys(0, {4}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pool->stats().prefetch_wasted, 1u);
}

// Sessions on threads acquire random bundles of random layers from a small pool. Each fill
// writes the bundle's identity into a simulated slot; every granted slot must hold its bundle
// from the moment it is ready until it is released — a leased slot is never reused.
TEST(SlotPool, RandomizedConcurrentSessions) {
  constexpr uint32_t kCapacity = 12, kLayers = 4, kExperts = 8, kTopK = 3;
  constexpr int kThreads = 6, kIterations = 3000;
  SlotPool pool(kCapacity, std::make_unique<FifoPolicy>(), 0);
  std::vector<std::atomic<uint64_t>> content(kCapacity);
  std::atomic<int> violations{0}, unavailable{0}, granted{0};
  const auto id = [](const BundleKey& k) { return uint64_t{k.layer} << 32 | k.expert; };
  const auto wait_ready = [&](SlotId s) {
    while (pool.state(s) == SlotState::kFilling) std::this_thread::yield();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kIterations; ++i) {
        const uint32_t layer = rng() % kLayers;
        std::vector<BundleKey> keys;
        while (keys.size() < kTopK) {
          const BundleKey k{layer, static_cast<uint32_t>(rng() % kExperts)};
          if (absl::c_find(keys, k) == keys.end()) keys.push_back(k);
        }
        auto r = pool.Acquire(layer, keys);
        if (!r.ok()) {
          ++unavailable;
          continue;
        }
        ++granted;
        for (const SlotGrant& g : *r) {
          if (g.needs_fill) {
            content[g.slot].store(id(g.key));
            pool.FillDone(g.slot, g.generation, true);
          }
        }
        for (const SlotGrant& g : *r) {
          wait_ready(g.slot);
          if (content[g.slot].load() != id(g.key)) ++violations;
        }
        std::this_thread::yield();
        for (const SlotGrant& g : *r) {
          if (content[g.slot].load() != id(g.key)) ++violations;  // still ours while leased
        }
        pool.Release(Slots(*r));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  // 6 sessions x 3 bundles contend for 12 slots: some acquires must retry, most succeed.
  EXPECT_GT(granted.load(), kThreads * kIterations / 4);
  for (SlotId s = 0; s < kCapacity; ++s) EXPECT_EQ(pool.leases(s), 0u);
  const SlotPoolStats st = pool.stats();
  EXPECT_EQ(st.hits + st.joins + st.misses, st.accesses);
}

}  // namespace
}  // namespace expertd
