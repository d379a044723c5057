// Engine-level faults: a pack truncated while the engine runs, a grant that fails after some of
// its slots were filled or hit, staging exhausted by prefetches, staging smaller than a bundle,
// acquires the pool cannot hold. The rule everywhere: a clear error or a completed grant, never
// a hang (every acquire here gives up after a timeout and fails the test instead).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "unit/engine_test_fixture.h"

namespace expertd {
namespace {

using ::expertd::testing::IsError;

// Fails (as a short read: the file "ends" there) every read attempt that overlaps a bad range.
class BadRanges {
 public:
  void Add(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.insert(ranges_.end(), ranges.begin(), ranges.end());
  }
  PackReadHook Hook() {
    return [this](uint64_t offset, uint64_t bytes) -> int64_t {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [begin, end] : ranges_) {
        if (offset < end && begin < offset + bytes) return 0;
      }
      return static_cast<int64_t>(bytes);
    };
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
};

class EngineFaultTest : public testing::EngineFixture, public ::testing::WithParamInterface<bool> {
 protected:
  EngineOptions PathOptions(uint32_t slots) {
    EngineOptions o = Options(slots);
    o.fill_in_place = GetParam();
    return o;
  }
  BadRanges bad_;
};

class EngineLimitsTest : public testing::EngineFixture {};

INSTANTIATE_TEST_SUITE_P(Paths, EngineFaultTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("InPlace") : std::string("Staging");
                         });

// The regression: an acquire got a hit on a prefetched bundle, then failed on a read error.
// The client never saw the hit's generation, so it will never signal its done fence; if the
// pool had recorded that generation as granted, the next fill of the slot would wait for it
// forever.
TEST_P(EngineFaultTest, FailedGrantWithAHitDoesNotBlockTheSlot) {
  Open("mixtral-legacy-tiny", bad_.Hook());
  auto engine = MakeEngine(PathOptions(2));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<uint32_t> prefetch = {0};
  (*engine)->Prefetch(0, prefetch);
  ASSERT_TRUE(WaitFor([&] { return (*engine)->Stats().bytes_copied >= BundleBytes(0); }));
  bad_.Add(BundleRanges(0, 1));
  auto failed = AcquireWithin(**engine, 0, {0, 1});
  ASSERT_TRUE(failed.has_value()) << "the failing acquire hung";
  ASSERT_FALSE(failed->ok());
  EXPECT_TRUE(failed->status().message().find("layer 0 expert 1") != std::string::npos)
      << failed->status();
  // Layer 1 needs both slots: the one holding the never-delivered hit is overwritten.
  auto next = AcquireWithin(**engine, 1, {2, 3}, absl::Seconds(10));
  ASSERT_TRUE(next.has_value()) << "hang: a fill waits for a done fence nobody will signal";
  ASSERT_TRUE(next->ok()) << next->status();
  EXPECT_TRUE(Verify(**engine, **next));
  Done(**engine, **next);
}

// The same with a miss that was filled: the grant failed on its other bundle.
TEST_P(EngineFaultTest, FailedGrantWithAFilledMissDoesNotBlockTheSlot) {
  Open("mixtral-legacy-tiny", bad_.Hook());
  auto engine = MakeEngine(PathOptions(2));
  ASSERT_TRUE(engine.ok()) << engine.status();
  bad_.Add(BundleRanges(0, 5));
  auto failed = AcquireWithin(**engine, 0, {4, 5});
  ASSERT_TRUE(failed.has_value()) << "the failing acquire hung";
  ASSERT_FALSE(failed->ok());
  EXPECT_EQ((*engine)->Stats().pool.misses, 2u);
  auto next = AcquireWithin(**engine, 2, {0, 1}, absl::Seconds(10));
  ASSERT_TRUE(next.has_value()) << "hang: a fill waits for a done fence nobody will signal";
  ASSERT_TRUE(next->ok()) << next->status();
  EXPECT_TRUE(Verify(**engine, **next));
  Done(**engine, **next);
  EXPECT_EQ((*engine)->Stats().pool.evictions, 1u);  // the filled {0,4}; {0,5} was emptied
}

// A pack cut short while the engine runs: bundles beyond the new end fail with an error naming
// the pack, the bundle and the truncation; the engine keeps serving the rest.
TEST_P(EngineFaultTest, PackTruncatedWhileRunning) {
  Open("mixtral-legacy-tiny");
  auto engine = MakeEngine(PathOptions(8));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto before = AcquireWithin(**engine, 0, {0, 1});
  ASSERT_TRUE(before.has_value() && before->ok());
  Done(**engine, **before);

  // Cut the file at the last projection of the bundle that ends last.
  const MoeLayer& last_layer = catalog_->layers().back();
  uint32_t victim = 0;
  uint64_t victim_end = 0, cut = 0;
  for (uint32_t e = 0; e < last_layer.n_expert; ++e) {
    for (const auto& [begin, end] : BundleRanges(last_layer.block, e)) {
      if (end > victim_end) victim = e, victim_end = end, cut = begin;
    }
  }
  const std::string path = catalog_->packs()[0].path;
  std::filesystem::resize_file(path, cut);

  auto lost = AcquireWithin(**engine, last_layer.block, {victim});
  ASSERT_TRUE(lost.has_value()) << "an acquire beyond the new end hung";
  EXPECT_TRUE(IsError(
      lost->status(), absl::StatusCode::kDataLoss, ErrorKind::kTruncated,
      {path, "layer " + std::to_string(last_layer.block) + " expert " + std::to_string(victim)}));
  // Still served: a bundle that ends before the cut, read now (not resident before).
  auto fine = AcquireWithin(**engine, 0, {2, 3});
  ASSERT_TRUE(fine.has_value());
  ASSERT_TRUE(fine->ok()) << fine->status();
  EXPECT_FALSE((**fine).slots[0].hit);
  EXPECT_TRUE(Verify(**engine, **fine));
  Done(**engine, **fine);
  // The lost bundle keeps failing the same way, without hanging and without a stale slot.
  auto again = AcquireWithin(**engine, last_layer.block, {victim});
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(packs_->failed(0));  // a truncation is not a failing drive
}

// Prefetches take every staging segment but the demand reserve and queue up behind a slow
// drive; a demand acquire still gets a segment at once, overtakes the queued prefetch reads and
// completes long before they do.
TEST_F(EngineLimitsTest, StagingExhaustedByPrefetchesDemandStillCompletes) {
  std::atomic<bool> slow{true};
  Open("mixtral-legacy-tiny", [&](uint64_t, uint64_t bytes) -> int64_t {
    if (slow.load()) std::this_thread::sleep_for(std::chrono::milliseconds(15));
    return static_cast<int64_t>(bytes);
  });
  EngineOptions o = Options(32);
  o.fill_in_place = false;  // every fill needs a staging segment
  // Four segments: the demand reserve (2) and two that prefetches may take.
  o.staging_bytes = 4 * ((catalog_->max_bundle_bytes() + 4095) / 4096 * 4096);
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (uint32_t layer = 1; layer < 4; ++layer) {
    const std::vector<uint32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
    (*engine)->Prefetch(layer, all);
  }
  EXPECT_EQ((*engine)->Stats().pool.prefetch_issued, 24u);
  std::atomic<uint64_t> copied_at_grant{0};
  auto g = AcquireWithin(**engine, 0, {0, 1});
  copied_at_grant = (*engine)->Stats().bytes_copied;
  ASSERT_TRUE(g.has_value()) << "the demand acquire hung behind prefetches";
  ASSERT_TRUE(g->ok()) << g->status();
  EXPECT_TRUE(Verify(**engine, **g));
  Done(**engine, **g);
  const EngineStats st = (*engine)->Stats();
  EXPECT_GT(st.staging.prefetch_refused, 0u);  // prefetches did wait for segments
  // At most half of the 24 prefetches had landed when the demand was granted.
  EXPECT_LT(copied_at_grant.load(), 14 * BundleBytes(1));
  // The prefetches all land eventually.
  slow = false;
  EXPECT_TRUE(WaitFor([&] { return (*engine)->Stats().bytes_copied >= 26 * BundleBytes(1); }));
}

TEST_F(EngineLimitsTest, StagingSmallerThanABundleIsRefusedAtCreate) {
  Open("mixtral-legacy-tiny");
  EngineOptions o = Options(8);
  o.staging_bytes = catalog_->max_bundle_bytes() - 1;
  auto engine = MakeEngine(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine.status().message().find("cannot hold one bundle") != std::string::npos)
      << engine.status();
}

// More bundles than the pool can ever hold: ResourceExhausted at once. All slots leased by
// another session right now: Unavailable at once. Neither waits.
TEST_F(EngineLimitsTest, AcquiresThePoolCannotHoldFailAtOnce) {
  Open("mixtral-legacy-tiny");
  auto engine = MakeEngine(2);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto too_many = AcquireWithin(**engine, 0, {0, 1, 2}, absl::Seconds(10));
  ASSERT_TRUE(too_many.has_value());
  EXPECT_EQ(too_many->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(too_many->status().message().find("cannot fit a pool of 2 slots") !=
              std::string::npos)
      << too_many->status();
  auto held = AcquireWithin(**engine, 0, {0, 1});
  ASSERT_TRUE(held.has_value() && held->ok());
  auto busy = AcquireWithin(**engine, 1, {0}, absl::Seconds(10));
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->status().code(), absl::StatusCode::kUnavailable);
  Done(**engine, **held);
  auto after = AcquireWithin(**engine, 1, {0});
  ASSERT_TRUE(after.has_value() && after->ok());
  EXPECT_TRUE(Verify(**engine, **after));
}

}  // namespace
}  // namespace expertd
