#include "engine/staging_ring.h"

#include <gtest/gtest.h>

#include <thread>

namespace expertd {
namespace {

TEST(StagingRing, SegmentsCoverTheBudget) {
  std::vector<uint8_t> mem(10 * 1000);
  auto ring = StagingRing::Create(mem, 3000, 1);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ((*ring)->segments(), 3u);  // 10,000 / 3,000, the tail unused
  EXPECT_EQ((*ring)->segment(2).data(), mem.data() + 6000);
  EXPECT_EQ((*ring)->segment(2).size(), 3000u);
}

TEST(StagingRing, RejectsBudgetsWithoutRoomBeyondTheReserve) {
  std::vector<uint8_t> mem(4096);
  EXPECT_FALSE(StagingRing::Create(mem, 4096, 1).ok());
  EXPECT_FALSE(StagingRing::Create(mem, 0, 0).ok());
  EXPECT_TRUE(StagingRing::Create(mem, 2048, 1).ok());
}

TEST(StagingRing, PrefetchesNeverTakeTheDemandReserve) {
  std::vector<uint8_t> mem(4 * 64);
  auto ring = *StagingRing::Create(mem, 64, 2);
  const auto p1 = ring->TryReservePrefetch();
  const auto p2 = ring->TryReservePrefetch();
  ASSERT_TRUE(p1 && p2);
  EXPECT_FALSE(ring->TryReservePrefetch().has_value());  // only the reserve is left
  EXPECT_EQ(ring->stats().prefetch_refused, 1u);
  const auto d1 = ring->ReserveDemand(absl::Milliseconds(10));
  const auto d2 = ring->ReserveDemand(absl::Milliseconds(10));
  ASSERT_TRUE(d1.ok() && d2.ok());
  // Exhausted: a demand waits, then times out with a clear error instead of hanging.
  const auto d3 = ring->ReserveDemand(absl::Milliseconds(20));
  EXPECT_EQ(d3.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ring->stats().demand_timeouts, 1u);
}

TEST(StagingRing, DemandWaitsForARelease) {
  std::vector<uint8_t> mem(2 * 64);
  auto ring = *StagingRing::Create(mem, 64, 1);
  const auto a = ring->ReserveDemand(absl::Seconds(1));
  const auto b = ring->ReserveDemand(absl::Seconds(1));
  ASSERT_TRUE(a.ok() && b.ok());
  // The release comes once the demand is waiting (counted before it blocks), not after a fixed
  // time that a loaded machine may overrun; the 10 s only bound a hang.
  std::thread releaser([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ring->stats().demand_waited == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ring->Release(*a);
  });
  const auto c = ring->ReserveDemand(absl::Seconds(10));
  releaser.join();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(ring->stats().demand_waited, 1u);
  ring->Release(*b);
  ring->Release(*b);  // a double release changes nothing
  EXPECT_EQ(ring->free_segments(), 1u);
}

}  // namespace
}  // namespace expertd
