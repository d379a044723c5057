// Client-side hits (engine/residency.h): the slot pool publishes resident slots, skips victims a
// client pinned, and RecordHits counts reported hits; a concurrent test pins and reads slots
// while another thread evicts and refills them, and checks that no pinned slot ever changes.
// Through the engine on the host device: pin rows are checked when registered, a pinned bundle
// keeps its bytes under eviction, and a row that was removed (its session ended, the client may
// have died with its pins set) pins nothing.
#include "engine/residency.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "engine/slot_pool.h"
#include "engine_test_fixture.h"

namespace expertd {
namespace {

constexpr uint32_t kExperts = 8;

// A pool of `capacity` slots over layers {3, 5} with a board, one session's pin row, and the
// client's view of the table.
struct Fixture {
  explicit Fixture(uint32_t capacity, const std::string& policy = "lru")
      : table(residency::TableBytes(capacity, 2, kExperts)), pins(capacity),
        board(table.data(), capacity, {3, 5}, kExperts) {
    PolicyModel model{{3, 5}, kExperts, 2};
    pool = std::make_unique<SlotPool>(capacity, *MakeEvictionPolicy(policy, model, capacity), 0);
    pool->SetResidency(&board);
    board.AddPins(1, pins.data());
    view = residency::Table::At(table.data(), capacity, 2, kExperts);
  }
  // Acquires, fills and releases (layer, expert): it becomes resident and unleased.
  SlotId Load(uint32_t layer, uint32_t expert) {
    const BundleKey key{layer, expert};
    auto g = pool->Acquire(layer, std::span<const BundleKey>(&key, 1));
    EXPECT_TRUE(g.ok()) << g.status();
    if ((*g)[0].needs_fill) pool->FillDone((*g)[0].slot, (*g)[0].generation, true);
    const SlotId s = (*g)[0].slot;
    pool->Release(std::span<const SlotId>(&s, 1));
    return s;
  }
  residency::Pinned Pin(uint32_t layer, uint32_t expert) {
    const uint32_t index = layer == 3 ? 0 : 1;
    return residency::TryPin(view, pins.data(), index, expert, residency::Key(layer, expert),
                             [](SlotId, uint64_t) { return false; });
  }

  std::vector<uint8_t> table;
  std::vector<uint64_t> pins;
  ResidencyBoard board;
  std::unique_ptr<SlotPool> pool;
  residency::Table view;
};

TEST(Residency, ResidentBundlesArePublishedAndPinnedWithTheirGeneration) {
  Fixture f(4);
  EXPECT_EQ(f.Pin(3, 1).slot, kNoSlot) << "nothing is resident yet";
  const SlotId s = f.Load(3, 1);
  const residency::Pinned p = f.Pin(3, 1);
  ASSERT_EQ(p.slot, s);
  EXPECT_GT(p.generation, 0u);
  EXPECT_EQ(f.pins[s], p.generation) << "the pin word holds the pinned generation";
  EXPECT_EQ(f.Pin(5, 1).slot, kNoSlot) << "another layer's expert 1 is not resident";
  EXPECT_EQ(f.Pin(3, 2).slot, kNoSlot);
  residency::Unpin(f.pins.data(), s);
  EXPECT_EQ(f.pins[s], 0u);
}

TEST(Residency, APinnedSlotIsSkippedAsVictimAndEvictedOnceUnpinned) {
  Fixture f(2);
  const SlotId a = f.Load(3, 0);  // the least recently used: LRU's first victim
  const SlotId b = f.Load(3, 1);
  ASSERT_EQ(f.Pin(3, 0).slot, a);
  // A third bundle must evict: not the pinned LRU slot a, but b.
  EXPECT_EQ(f.Load(5, 2), b);
  EXPECT_EQ(f.pool->stats().pinned_skips, 1u);
  EXPECT_EQ(f.board.refusals(), 1u);
  EXPECT_TRUE(f.pool->Find({3, 0}).has_value()) << "the pinned bundle stayed resident";
  EXPECT_EQ(f.Pin(3, 1).slot, kNoSlot) << "an evicted bundle cannot be pinned";
  // With both slots pinned no acquire of a new bundle can get a slot.
  ASSERT_EQ(f.Pin(5, 2).slot, b);
  const BundleKey key{5, 3};
  auto refused = f.pool->Acquire(5, std::span<const BundleKey>(&key, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  residency::Unpin(f.pins.data(), a);
  EXPECT_EQ(f.Load(5, 3), a) << "unpinned, the oldest slot is the victim again";
  EXPECT_EQ(f.Pin(3, 0).slot, kNoSlot);
}

TEST(Residency, APinAfterTheTagWasClearedMisses) {
  Fixture f(1);
  const SlotId s = f.Load(3, 4);
  const uint64_t tag = f.view.tag(s).load();
  ASSERT_NE(tag, 0u);
  // The daemon's side of an eviction in progress: the tag is cleared before the scan.
  ASSERT_TRUE(f.board.TryRetire(s));
  EXPECT_EQ(f.Pin(3, 4).slot, kNoSlot);
  EXPECT_EQ(f.pins[s], 0u) << "a failed pin leaves nothing pinned";
}

TEST(Residency, ReportedHitsCountAndRefreshRecency) {
  Fixture f(2);
  const SlotId a = f.Load(3, 0);
  f.Load(3, 1);
  const BundleKey hit{3, 0};
  f.pool->RecordHits(3, std::span<const BundleKey>(&hit, 1));
  const SlotPoolStats st = f.pool->stats();
  EXPECT_EQ(st.client_hits, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.accesses, 3u);
  // (3, 0) is now the most recently used: the next miss evicts (3, 1), not slot a.
  EXPECT_NE(f.Load(5, 5), a);
  EXPECT_TRUE(f.pool->Find({3, 0}).has_value());
}

// One thread pins and reads slots (each slot's "bytes" are the key of its occupant), another
// acquires random bundles of a small pool, evicting and refilling constantly. Every successful
// pin must read the pinned key for as long as it holds the pin.
TEST(Residency, PinnedSlotsNeverChangeUnderConcurrentEviction) {
  constexpr uint32_t kSlots = 3;
  Fixture f(kSlots);
  std::vector<std::atomic<uint64_t>> bytes(kSlots);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pinned_reads{0}, bad{0};
  std::thread filler([&] {
    std::mt19937 rng(7);
    while (!stop.load()) {
      const BundleKey key{rng() % 2 ? 3u : 5u, static_cast<uint32_t>(rng() % kExperts)};
      auto g = f.pool->Acquire(key.layer, std::span<const BundleKey>(&key, 1));
      if (!g.ok()) continue;  // every slot pinned right now
      const SlotGrant& grant = (*g)[0];
      if (grant.needs_fill) {
        // Write the occupant's "bytes", then it becomes resident (published).
        bytes[grant.slot].store(residency::Key(key.layer, key.expert));
        f.pool->FillDone(grant.slot, grant.generation, true);
      }
      f.pool->Release(std::span<const SlotId>(&grant.slot, 1));
    }
  });
  // Runs for 1.5 s and until enough pins were read and enough victims were refused for a pin:
  // on a loaded machine (wine, the rest of the suite beside it) a yield can cost a whole time
  // slice, and 1.5 s alone then tests almost nothing.
  constexpr uint64_t kWantReads = 2000, kWantSkips = 200;
  std::mt19937 rng(11);
  const auto start = std::chrono::steady_clock::now();
  const auto enough = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now - start > std::chrono::seconds(120)) return true;  // the checks below then fail
    return now - start > std::chrono::milliseconds(1500) && pinned_reads.load() >= kWantReads &&
           f.pool->stats().pinned_skips >= kWantSkips;
  };
  while (!enough()) {
    const uint32_t layer = rng() % 2 ? 3u : 5u;
    const uint32_t expert = rng() % kExperts;
    const residency::Pinned p = f.Pin(layer, expert);
    if (p.slot == kNoSlot) continue;
    const uint64_t want = residency::Key(layer, expert);
    // Reads while pinned, giving the filler its turn once in the middle (on one core it runs
    // only then).
    for (int i = 0; i < 64; ++i) {
      if (bytes[p.slot].load() != want) ++bad;
      if (i == 32) std::this_thread::yield();
    }
    ++pinned_reads;
    residency::Unpin(f.pins.data(), p.slot);
  }
  stop = true;
  filler.join();
  EXPECT_EQ(bad.load(), 0u) << "a pinned slot was refilled while pinned";
  EXPECT_GE(pinned_reads.load(), kWantReads) << "too few pins succeeded in 120 s to test anything";
  EXPECT_GE(f.pool->stats().pinned_skips, kWantSkips)
      << "the filler met too few pinned victims in 120 s";
  std::printf("%llu pinned reads, %llu victims skipped for a pin, %llu evictions\n",
              static_cast<unsigned long long>(pinned_reads.load()),
              static_cast<unsigned long long>(f.pool->stats().pinned_skips),
              static_cast<unsigned long long>(f.pool->stats().evictions));
}

class EngineResidencyTest : public testing::EngineFixture {};

TEST_F(EngineResidencyTest, PinRowsAreCheckedAndAPinnedBundleOutlivesEvictionUntilItsRowGoes) {
  Open("mixtral-tiny");
  EngineOptions off = Options(2);
  off.client_hits = false;
  {
    auto plain = MakeEngine(off);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ((*plain)->PinWords(), 0u);
    std::vector<uint64_t> row(64);
    EXPECT_EQ((*plain)->AddPins(1, row).code(), absl::StatusCode::kFailedPrecondition)
        << "an engine without residency tables must refuse a pin row";
  }
  auto made = MakeEngine(2);
  ASSERT_TRUE(made.ok()) << made.status();
  Engine& engine = **made;
  const uint64_t words = engine.PinWords();
  ASSERT_GT(words, 0u);
  std::vector<uint64_t> short_row(words - 1);
  EXPECT_EQ(engine.AddPins(1, short_row).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> row(words, 0);
  ASSERT_TRUE(engine.AddPins(2, row).ok());

  const MoeLayer& layer = catalog_->layers()[0];
  const uint32_t cls = layer.slot_class;
  const std::vector<uint32_t>& class_layers = catalog_->slot_classes()[cls].layers;
  const uint32_t index = static_cast<uint32_t>(
      std::find(class_layers.begin(), class_layers.end(), layer.block) - class_layers.begin());
  uint64_t base = 0;  // this class's part of the row
  for (uint32_t c = 0; c < cls; ++c) base += engine.slots(c);
  ASSERT_NE(engine.residency(cls), nullptr);
  const residency::Table table = residency::Table::At(
      const_cast<uint8_t*>(engine.residency(cls)->host_data()), engine.slots(cls),
      static_cast<uint32_t>(class_layers.size()), layer.n_expert);
  const auto load = [&](uint32_t expert) {
    auto g = AcquireWithin(engine, layer.block, {expert});
    ASSERT_TRUE(g.has_value() && g->ok());
    Done(engine, **g);
  };
  const auto pin = [&](uint32_t expert) {
    return residency::TryPin(table, row.data() + base, index, expert,
                             residency::Key(layer.block, expert),
                             [](SlotId, uint64_t) { return false; });
  };

  load(0);
  const residency::Pinned p = pin(0);
  ASSERT_NE(p.slot, kNoSlot) << "a resident bundle must be pinnable through the table";
  // Two more bundles in a 2-slot pool: LRU's victim would be expert 0's slot, which is pinned.
  load(1);
  load(2);
  load(3);
  EXPECT_GE(engine.Stats().pool.pinned_skips, 1u);
  Grant pinned;
  pinned.layer = layer.block;
  pinned.slots.push_back({0, cls, p.slot, p.generation, true});
  EXPECT_TRUE(Verify(engine, pinned)) << "the pinned bundle's bytes changed under eviction";
  EXPECT_EQ(table.tag(p.slot).load(), p.generation);

  // The session ends with its pin still set (a client killed while reading): once its row is
  // removed the bundle is evictable again.
  engine.RemovePins(2);
  load(4);
  load(5);
  EXPECT_NE(table.tag(p.slot).load(), p.generation) << "a removed row still pinned the slot";
  EXPECT_EQ(pin(0).slot, kNoSlot);
}

}  // namespace
}  // namespace expertd
