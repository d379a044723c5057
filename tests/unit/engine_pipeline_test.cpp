// The engine end to end on the host device (fixture: engine_test_fixture.h): misses, hits,
// evictions, concurrent sessions, bad requests, read errors, the history predictor. Every
// granted slot's bytes are checked against the pack.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "unit/engine_test_fixture.h"

namespace expertd {
namespace {

class EnginePipelineTest : public testing::EngineFixture {};

// The same cases on both fill paths: through staging and a device copy, and in place.
class EngineFillPathTest : public testing::EngineFixture,
                           public ::testing::WithParamInterface<bool> {
 protected:
  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(uint32_t slots) {
    EngineOptions o = Options(slots);
    o.fill_in_place = GetParam();
    return EngineFixture::MakeEngine(o);
  }
  // Every byte took the path under test.
  void ExpectPath(const Engine& engine) {
    const EngineStats st = engine.Stats();
    if (GetParam()) {
      EXPECT_EQ(st.bytes_in_place, st.bytes_copied);
    } else {
      EXPECT_EQ(st.bytes_in_place, 0u);
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Paths, EngineFillPathTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("InPlace") : std::string("Staging");
                         });

TEST_P(EngineFillPathTest, MissThenHitWithCorrectBytes) {
  Open("mixtral-legacy-tiny");
  auto engine = MakeEngine(8);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<uint32_t> experts = {3, 5};
  auto first = (*engine)->Acquire(1, experts);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->slots[0].hit);
  EXPECT_TRUE(Verify(**engine, *first));
  Done(**engine, *first);
  auto second = (*engine)->Acquire(1, experts);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->slots[0].hit);
  EXPECT_TRUE(second->slots[1].hit);
  EXPECT_TRUE(Verify(**engine, *second));
  Done(**engine, *second);
  const EngineStats st = (*engine)->Stats();
  EXPECT_EQ(st.pool.hits, 2u);
  EXPECT_EQ(st.pool.misses, 2u);
  const uint64_t bundle = catalog_->FindLayer(1)->payload_bytes;
  EXPECT_EQ(st.bytes_copied, 2 * bundle);
  EXPECT_GE(st.bytes_read, 2 * bundle);
  ExpectPath(**engine);
}

TEST_P(EngineFillPathTest, EvictionRefillsWithTheRightBytes) {
  Open("deepseek-tiny");  // layers of two slot classes
  auto engine = MakeEngine(16);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 rng(3);
  for (int i = 0; i < 60; ++i) {
    const uint32_t layer = 1 + rng() % 3;
    std::vector<uint32_t> experts;
    while (experts.size() < 8) {
      const uint32_t e = rng() % 40;
      if (std::find(experts.begin(), experts.end(), e) == experts.end()) experts.push_back(e);
    }
    auto g = (*engine)->Acquire(layer, experts);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(Verify(**engine, *g)) << "acquire " << i;
    Done(**engine, *g);
  }
  EXPECT_GT((*engine)->Stats().pool.evictions, 0u);
  ExpectPath(**engine);
}

TEST_P(EngineFillPathTest, ConcurrentSessionsGetCorrectBytes) {
  Open("qwen3moe-tiny");
  auto engine = MakeEngine(24);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::atomic<int> bad{0}, ok{0}, unavailable{0};
  std::vector<std::thread> sessions;
  for (int t = 0; t < 3; ++t) {
    sessions.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 40; ++i) {
        const uint32_t layer = rng() % 4;
        std::vector<uint32_t> experts;
        while (experts.size() < 8) {
          const uint32_t e = rng() % 24;
          if (std::find(experts.begin(), experts.end(), e) == experts.end()) experts.push_back(e);
        }
        // Unavailable (every slot leased by the others right now) is retried, as a client
        // would; any other error fails the test.
        absl::StatusOr<Grant> g = absl::UnavailableError("not tried");
        for (int attempt = 0; attempt < 2000; ++attempt) {
          g = (*engine)->Acquire(layer, experts);
          if (!absl::IsUnavailable(g.status())) break;
          ++unavailable;
          std::this_thread::yield();
        }
        if (!g.ok()) {
          ADD_FAILURE() << "session " << t << " acquire " << i << ": " << g.status();
          continue;
        }
        ++ok;
        if (!Verify(**engine, *g)) ++bad;
        Done(**engine, *g);
      }
    });
  }
  for (auto& s : sessions) s.join();
  std::printf("120 acquires granted, %d Unavailable answers retried\n", unavailable.load());
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(ok.load(), 120);
  ExpectPath(**engine);
}

TEST_F(EnginePipelineTest, BadRequests) {
  Open("mixtral-legacy-tiny");
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok());
  const std::vector<uint32_t> too_many = {0, 1, 2, 3, 4};
  EXPECT_EQ((*engine)->Acquire(0, too_many).status().code(), absl::StatusCode::kResourceExhausted);
  const std::vector<uint32_t> beyond = {8};
  EXPECT_EQ((*engine)->Acquire(0, beyond).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<uint32_t> one = {1};
  EXPECT_EQ((*engine)->Acquire(9, one).status().code(), absl::StatusCode::kNotFound);
  auto g = (*engine)->Acquire(0, one);  // the engine still serves
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Verify(**engine, *g));
}

// EIO: the acquire fails with the reader's error (after its bounded retries the pack is marked
// failed, so a later acquire touching it fails at once); nothing hangs, the slot is freed.
TEST_F(EnginePipelineTest, ReadErrorFailsTheAcquireWithoutHanging) {
  std::atomic<bool> fail{false};
  Open("mixtral-legacy-tiny", [&](uint64_t, uint64_t bytes) -> int64_t {
    return fail.load() ? -EIO : static_cast<int64_t>(bytes);
  });
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok());
  const std::vector<uint32_t> a = {2};
  fail = true;
  auto g = (*engine)->Acquire(0, a);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(std::string(g.status().message()).find("layer 0 expert 2"), std::string::npos)
      << g.status();
  EXPECT_FALSE((*engine)->Acquire(0, a).ok());
  const EngineStats st = (*engine)->Stats();
  EXPECT_GE(st.fills_failed, 1u);
  EXPECT_EQ(st.pool.fill_errors, st.fills_failed);
}

// Routes that alternate between two expert pairs from token to token: 16 bundles in a cycle on
// 12 slots, so LRU alone misses every time. The history predictor, looking one layer ahead,
// remembers both pairs of the next layer and must stage the one that was evicted before the
// acquire asks for it: prefetches issued and used, and fewer misses than without a predictor.
TEST_F(EnginePipelineTest, HistoryPredictorPrefetches) {
  Open("mixtral-legacy-tiny");
  auto run = [&](const std::string& predictor) -> std::optional<SlotPoolStats> {
    EngineOptions o = Options(12, "lru", predictor);
    o.predictor_options.lookahead = 1;
    auto engine = MakeEngine(o);
    if (!engine.ok()) {
      ADD_FAILURE() << engine.status();
      return std::nullopt;
    }
    for (uint32_t token = 0; token < 24; ++token) {
      for (uint32_t layer = 0; layer < 4; ++layer) {
        const std::vector<uint32_t> route =
            token % 2 == 0 ? std::vector<uint32_t>{layer, layer + 1}
                           : std::vector<uint32_t>{layer + 4, (layer + 5) % 8};
        auto g = AcquireWithin(**engine, layer, route);
        if (!g.has_value() || !g->ok()) {
          ADD_FAILURE() << "token " << token << " layer " << layer << ": "
                        << (g.has_value() ? g->status().ToString() : "no grant within 20 s");
          return std::nullopt;
        }
        if (!Verify(**engine, **g)) {
          ADD_FAILURE() << "token " << token << " layer " << layer << ": wrong bytes";
          return std::nullopt;
        }
        Done(**engine, **g);
      }
    }
    return (*engine)->Stats().pool;
  };
  const std::optional<SlotPoolStats> none = run("none");
  const std::optional<SlotPoolStats> history = run("history");
  ASSERT_TRUE(none.has_value() && history.has_value());
  std::printf("24 tokens x 4 layers on 12 slots: none %llu misses; history %llu misses, "
              "%llu prefetches issued, %llu used\n",
              static_cast<unsigned long long>(none->misses),
              static_cast<unsigned long long>(history->misses),
              static_cast<unsigned long long>(history->prefetch_issued),
              static_cast<unsigned long long>(history->prefetch_used));
  EXPECT_EQ(none->prefetch_issued, 0u);
  EXPECT_GT(history->prefetch_issued, 0u);
  EXPECT_GT(history->prefetch_used, 0u);
  EXPECT_LT(history->misses, none->misses);
}

}  // namespace
}  // namespace expertd
