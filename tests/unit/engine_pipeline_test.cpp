// The engine end to end on the host device: a synthesized model, real packs and reader pools,
// slots in shared memory. Every granted slot's bytes are checked against the pack (the oracle is
// a plain pread of the catalog's location), as a client would see them through the arena.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "device/host/host_device.h"
#include "format/gguf_model.h"
#include "support/test_support.h"
#include "synth/synth.h"
#include "util/file.h"

namespace expertd {
namespace {

class EnginePipelineTest : public ::testing::Test {
 protected:
  void Open(const std::string& preset, PackReadHook hook = nullptr) {
    SynthOptions so;
    so.preset = preset;
    so.out_dir = dir_.File("m");
    so.seed = 5;
    ASSERT_TRUE(SynthesizeModel(so).ok());
    auto model = GgufModel::Open(dir_.File("m/model.gguf"));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::make_unique<GgufModel>(*std::move(model));
    auto catalog = ModelCatalog::Build(*model_, nullptr);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = std::make_unique<ModelCatalog>(*std::move(catalog));
    std::vector<PackSpec> specs;
    for (const PackInfo& p : catalog_->packs()) {
      PackSpec spec;
      spec.path = p.path;
      spec.label = p.label;
      spec.test_hook = hook;
      specs.push_back(std::move(spec));
    }
    auto packs = PackSet::Open(std::move(specs), PackSetOptions{});
    ASSERT_TRUE(packs.ok()) << packs.status();
    packs_ = *std::move(packs);
    auto device = MakeHostDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
  }

  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(uint32_t slots, std::string policy = "lru",
                                                     std::string predictor = "none") {
    EngineOptions o;
    o.slots_per_class = slots;
    o.policy = policy;
    o.predictor = predictor;
    o.staging_bytes = 4 << 20;
    return Engine::Create(*catalog_, *packs_, *device_, o);
  }

  // Compares every projection of every granted slot with the pack's bytes.
  ::testing::AssertionResult Verify(const Engine& engine, const Grant& grant) {
    const MoeLayer& layer = *catalog_->FindLayer(grant.layer);
    for (const GrantedSlot& s : grant.slots) {
      for (size_t p = 0; p < layer.projections.size(); ++p) {
        const uint64_t bytes = layer.projections[p].expert_bytes;
        const auto loc = catalog_->Locate(grant.layer, s.expert, p);
        std::vector<uint8_t> want(bytes);
        if (!loc.ok() || !packs_->Read(loc->pack, loc->offset, want).ok()) {
          return ::testing::AssertionFailure() << "oracle read failed";
        }
        const uint8_t* got = engine.arena(s.slot_class, p).host_data() + s.slot * bytes;
        if (std::memcmp(got, want.data(), bytes) != 0) {
          return ::testing::AssertionFailure()
                 << "layer " << grant.layer << " expert " << s.expert << " projection " << p
                 << " in slot " << s.slot << " differs from the pack";
        }
      }
      if (engine.fences(s.slot_class).ready(s.slot) < s.generation) {
        return ::testing::AssertionFailure() << "granted before its ready fence";
      }
    }
    return ::testing::AssertionSuccess();
  }

  void Done(Engine& engine, const Grant& g) {
    for (const GrantedSlot& s : g.slots) {
      auto exported = engine.fences(s.slot_class).Export();
      ASSERT_TRUE(exported.ok());
      auto mapped = MapFences(*exported);
      ASSERT_TRUE(mapped.ok());
      ASSERT_TRUE(mapped->SignalDone(s.slot, s.generation).ok());
    }
    engine.Release(g);
  }

  ::expertd::testing::TempDir dir_;
  std::unique_ptr<GgufModel> model_;
  std::unique_ptr<ModelCatalog> catalog_;
  std::unique_ptr<PackSet> packs_;
  std::unique_ptr<Device> device_;
};

TEST_F(EnginePipelineTest, MissThenHitWithCorrectBytes) {
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
}

TEST_F(EnginePipelineTest, EvictionRefillsWithTheRightBytes) {
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
}

TEST_F(EnginePipelineTest, ConcurrentSessionsGetCorrectBytes) {
  Open("qwen3moe-tiny");
  auto engine = MakeEngine(24);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::atomic<int> bad{0}, ok{0};
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
        auto g = (*engine)->Acquire(layer, experts);
        if (!g.ok()) continue;  // Unavailable: every slot leased by the others right now
        ++ok;
        if (!Verify(**engine, *g)) ++bad;
        Done(**engine, *g);
      }
    });
  }
  for (auto& s : sessions) s.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(ok.load(), 40);
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

TEST_F(EnginePipelineTest, HistoryPredictorPrefetches) {
  Open("mixtral-legacy-tiny");
  auto engine = MakeEngine(16, "lru", "history");
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<uint32_t> route = {1, 6};
  for (int token = 0; token < 3; ++token) {
    for (uint32_t layer = 0; layer < 4; ++layer) {
      auto g = (*engine)->Acquire(layer, route);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(Verify(**engine, *g));
      Done(**engine, *g);
    }
  }
  EXPECT_GT((*engine)->Stats().pool.prefetch_issued + (*engine)->Stats().pool.hits, 0u);
}

}  // namespace
}  // namespace expertd
