// The engine end to end on the host device, shared by the engine_*_test.cpp files: a
// synthesized model, real packs and reader pools, slots in shared memory. Verify() checks every
// granted slot's bytes against the pack file, as a client would see them through the arena. Its
// oracle is a plain ifstream read of the catalog's location: not the PackSet, its read method or
// its test hook, which the engine reads through.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/host/host_device.h"
#include "engine/engine.h"
#include "format/gguf_model.h"
#include "support/test_support.h"
#include "synth/synth.h"

namespace expertd::testing {

class EngineFixture : public ::testing::Test {
 protected:
  void Open(const std::string& preset, PackReadHook hook = nullptr, uint32_t scale = 1,
            ReadMethod method = ReadMethod::kPread) {
    SynthOptions so;
    so.preset = preset;
    so.out_dir = dir_.File("m");
    so.seed = 5;
    so.scale = scale;
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
    PackSetOptions po;
    po.method = method;
    auto packs = PackSet::Open(std::move(specs), po);
    ASSERT_TRUE(packs.ok()) << packs.status();
    packs_ = *std::move(packs);
    auto device = MakeHostDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
  }

  static EngineOptions Options(uint32_t slots, std::string policy = "lru",
                               std::string predictor = "none") {
    EngineOptions o;
    o.slots_per_class = slots;
    o.policy = std::move(policy);
    o.predictor = std::move(predictor);
    o.staging_bytes = 4 << 20;
    return o;
  }

  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const EngineOptions& o) {
    return Engine::Create(*catalog_, *packs_, *device_, o);
  }
  absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(uint32_t slots, std::string policy = "lru",
                                                     std::string predictor = "none") {
    return MakeEngine(Options(slots, std::move(policy), std::move(predictor)));
  }

  // Compares every projection of every granted slot with the pack's bytes.
  ::testing::AssertionResult Verify(const Engine& engine, const Grant& grant) {
    const MoeLayer& layer = *catalog_->FindLayer(grant.layer);
    for (const GrantedSlot& s : grant.slots) {
      for (size_t p = 0; p < layer.projections.size(); ++p) {
        const uint64_t bytes = layer.projections[p].expert_bytes;
        const auto loc = catalog_->Locate(grant.layer, s.expert, p);
        std::vector<uint8_t> want(bytes);
        if (!loc.ok() || loc->bytes != bytes || !OracleRead(loc->pack, loc->offset, want)) {
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

  // The oracle: the pack file read with an ifstream, whole or not at all.
  bool OracleRead(uint32_t pack, uint64_t offset, std::span<uint8_t> out) {
    std::ifstream in(catalog_->packs().at(pack).path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
    return in.good() && static_cast<size_t>(in.gcount()) == out.size();
  }

  // What a client does after its kernels read the grant: signal done, release.
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

  // An acquire that gives up after `timeout` instead of hanging the test: nullopt then. After a
  // timeout the device is shut down, which cancels the stuck copies so that the engine can be
  // destroyed; the test has failed by then.
  std::optional<absl::StatusOr<Grant>> AcquireWithin(Engine& engine, uint32_t layer,
                                                     std::vector<uint32_t> experts,
                                                     absl::Duration timeout = absl::Seconds(20)) {
    struct Result {
      std::mutex mu;
      std::condition_variable cv;
      std::optional<absl::StatusOr<Grant>> value;
    };
    auto r = std::make_shared<Result>();
    engine.AcquireAsync(layer, experts, [r](absl::StatusOr<Grant> g) {
      std::lock_guard<std::mutex> lock(r->mu);
      r->value = std::move(g);
      r->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(r->mu);
    if (!r->cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return r->value.has_value(); })) {
      lock.unlock();
      device_->Shutdown();
      return std::nullopt;
    }
    return std::move(r->value);
  }

  // Polls `condition` every millisecond up to `timeout`.
  template <typename F>
  static bool WaitFor(F condition, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!condition()) {
      if (absl::Now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // The pack byte ranges [offset, end) of one bundle.
  std::vector<std::pair<uint64_t, uint64_t>> BundleRanges(uint32_t layer, uint32_t expert) const {
    std::vector<std::pair<uint64_t, uint64_t>> out;
    const MoeLayer& l = *catalog_->FindLayer(layer);
    for (size_t p = 0; p < l.projections.size(); ++p) {
      const auto loc = catalog_->Locate(layer, expert, p);
      if (loc.ok()) out.emplace_back(loc->offset, loc->offset + loc->bytes);
    }
    return out;
  }

  uint64_t BundleBytes(uint32_t layer) const { return catalog_->FindLayer(layer)->payload_bytes; }

  TempDir dir_;
  std::unique_ptr<GgufModel> model_;
  std::unique_ptr<ModelCatalog> catalog_;
  std::unique_ptr<PackSet> packs_;
  std::unique_ptr<Device> device_;
};

}  // namespace expertd::testing
