// The engine's direct path (EngineOptions::direct_copies) without a GPU: the host device behind
// a wrapper that registers host memory the way the CUDA device's cudaHostRegister does (within
// a byte budget), so bundles of mapped packs are copied straight from the pack mapping into the
// slots, with no read and no staging segment — or, where the device registers only writable
// memory, from a private writable mapping of the pack. The bytes are checked against the pack.
#include <string>

#include "engine_test_fixture.h"
#include "support/shm_platform.h"

namespace expertd::testing {
namespace {

// Registered in chunks of `chunk` bytes from its start (0: one region), like cudaHostRegister
// calls of the CUDA device.
class RegisteredMemory final : public StagingBuffer {
 public:
  RegisteredMemory(std::span<uint8_t> memory, uint64_t chunk)
      : StagingBuffer(memory), chunk_(chunk) {}
  bool OneRegion(std::span<const uint8_t> range) const override {
    if (chunk_ == 0 || range.empty()) return true;
    const uint64_t first = static_cast<uint64_t>(range.data() - data().data());
    return first / chunk_ == (first + range.size() - 1) / chunk_;
  }

 private:
  uint64_t chunk_;
};

// The host device, registering host memory up to `budget` bytes in all. Without
// `read_only_ok` it registers only writable memory, as CUDA does where the GPU lacks
// cudaHostRegisterReadOnly support.
class RegisteringDevice final : public Device {
 public:
  RegisteringDevice(std::unique_ptr<Device> inner, uint64_t budget, uint64_t chunk,
                    bool read_only_ok = true)
      : inner_(std::move(inner)), caps_(inner_->caps()), budget_(budget), chunk_(chunk) {
    caps_.registers_host_memory = true;
    caps_.registers_read_only_memory = read_only_ok;
    caps_.arenas_host_writable = false;  // as on a GPU: no in-place reads into slots
  }
  std::string_view name() const override { return "host+register"; }
  const Capabilities& caps() const override { return caps_; }
  absl::StatusOr<std::unique_ptr<Arena>> AllocateArena(uint64_t bytes,
                                                       std::string_view label) override {
    return inner_->AllocateArena(bytes, label);
  }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(uint64_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::StatusOr<std::unique_ptr<FenceTable>> CreateFences(uint32_t n_slots) override {
    return inner_->CreateFences(n_slots);
  }
  absl::Status SubmitCopy(CopyRequest request, CopyCallback on_complete) override {
    return inner_->SubmitCopy(std::move(request), std::move(on_complete));
  }
  absl::Status Drain(absl::Duration timeout) override { return inner_->Drain(timeout); }
  void Shutdown() override { inner_->Shutdown(); }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> RegisterHostMemory(
      std::span<uint8_t> memory) override {
    if (memory.size() > budget_ - used_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "host registration of ", memory.size(), " bytes exceeds the pinned budget"));
    }
    if (!caps_.registers_read_only_memory && !testing::MemoryWritable(memory.data(), memory.size())) {
      return absl::InvalidArgumentError("read-only memory cannot be registered here");
    }
    used_ += memory.size();
    registered_.push_back(memory.data());
    return std::make_unique<RegisteredMemory>(memory, chunk_);
  }
  uint64_t used() const { return used_; }
  const std::vector<const uint8_t*>& registered() const { return registered_; }

 private:
  std::unique_ptr<Device> inner_;
  Capabilities caps_;
  uint64_t budget_;
  uint64_t chunk_;
  uint64_t used_ = 0;
  std::vector<const uint8_t*> registered_;
};

class EngineDirectTest : public EngineFixture {
 protected:
  void OpenWith(ReadMethod method, uint64_t budget, uint64_t chunk = 0, bool read_only_ok = true) {
    Open("mixtral-tiny", nullptr, 1, method);
    auto* d = new RegisteringDevice(std::move(device_), budget, chunk, read_only_ok);
    registering_ = d;
    device_.reset(d);
  }
  // Acquires every expert of the first two layers through 4 slots, verifying each grant.
  void Sweep(Engine& engine) {
    for (size_t li = 0; li < 2; ++li) {
      const MoeLayer& layer = catalog_->layers()[li];
      for (uint32_t e = 0; e < layer.n_expert; ++e) {
        auto g = AcquireWithin(engine, layer.block, {e});
        ASSERT_TRUE(g.has_value() && g->ok());
        ASSERT_TRUE(Verify(engine, **g));
        Done(engine, **g);
      }
    }
  }
  RegisteringDevice* registering_ = nullptr;
};

TEST_F(EngineDirectTest, MappedPacksAreCopiedFromTheirRegisteredMapping) {
  OpenWith(ReadMethod::kMmap, uint64_t{1} << 40);
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<PackCopyPath> paths = (*engine)->CopyPaths();
  ASSERT_EQ(paths.size(), packs_->size());
  for (const PackCopyPath& p : paths) EXPECT_TRUE(p.direct) << p.pack << ": " << p.detail;
  EXPECT_GT(registering_->used(), 0u);
  Sweep(**engine);
  const EngineStats s = (*engine)->Stats();
  EXPECT_GT(s.bytes_copied, 0u);
  EXPECT_EQ(s.bytes_direct, s.bytes_copied);  // every bundle took the direct path
  EXPECT_EQ(s.bytes_read, 0u);  // the engine read nothing into staging
  EXPECT_GT(s.pool.evictions, 0u);            // slots were overwritten along the way
}

TEST_F(EngineDirectTest, WithoutReadOnlyRegistrationAPrivateWritableMappingIsRegistered) {
  OpenWith(ReadMethod::kMmap, uint64_t{1} << 40, 0, /*read_only_ok=*/false);
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<PackCopyPath> paths = (*engine)->CopyPaths();
  ASSERT_EQ(paths.size(), packs_->size());
  for (const PackCopyPath& p : paths) {
    EXPECT_TRUE(p.direct) << p.pack << ": " << p.detail;
    EXPECT_NE(p.detail.find("private writable mapping"), std::string::npos) << p.detail;
  }
  // Not the pack's own read-only mapping (which this device refuses), but another one.
  ASSERT_EQ(registering_->registered().size(), packs_->size());
  for (PackId id = 0; id < packs_->size(); ++id) {
    EXPECT_NE(registering_->registered()[id], packs_->mapping(id).data());
  }
  Sweep(**engine);  // every grant's bytes checked against the pack
  const EngineStats s = (*engine)->Stats();
  EXPECT_GT(s.bytes_copied, 0u);
  EXPECT_EQ(s.bytes_direct, s.bytes_copied);
  EXPECT_EQ(s.bytes_read, 0u);
  EXPECT_GT(s.pool.evictions, 0u);
}

TEST_F(EngineDirectTest, DirectPrefetchesAreQueuedBoundedAndCorrect) {
  OpenWith(ReadMethod::kMmap, uint64_t{1} << 40);
  EngineOptions o = Options(24, "cycle", "history");
  o.predictor_options.lookahead = 2;
  o.predictor_options.max_experts = 4;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Two token sweeps over every layer with top-2 routing: the history predictor prefetches the
  // second sweep's experts from the first, through the direct path.
  for (int token = 0; token < 3; ++token) {
    for (const MoeLayer& layer : catalog_->layers()) {
      const std::vector<uint32_t> experts = {static_cast<uint32_t>(token % layer.n_expert),
                                             static_cast<uint32_t>((token + 3) % layer.n_expert)};
      auto g = AcquireWithin(**engine, layer.block, experts);
      ASSERT_TRUE(g.has_value() && g->ok());
      ASSERT_TRUE(Verify(**engine, **g));
      Done(**engine, **g);
    }
  }
  const EngineStats s = (*engine)->Stats();
  EXPECT_GT(s.pool.prefetch_issued, 0u);
  EXPECT_GT(s.bytes_direct, 0u);
  EXPECT_EQ(s.bytes_read, 0u);  // nothing was read into staging, prefetches included
}

TEST_F(EngineDirectTest, BundlesAcrossTwoRegisteredChunksAreReadIntoStaging) {
  OpenWith(ReadMethod::kMmap, uint64_t{1} << 40, 256 << 10);  // a few times a projection
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Sweep(**engine);
  const EngineStats s = (*engine)->Stats();
  // Bundles inside one chunk went direct, the others through staging; every slot verified.
  EXPECT_GT(s.bytes_direct, 0u);
  EXPECT_LT(s.bytes_direct, s.bytes_copied);
  EXPECT_EQ(s.bytes_read, s.bytes_copied - s.bytes_direct);
}

TEST_F(EngineDirectTest, APackThatCannotBeRegisteredIsReadIntoStaging) {
  OpenWith(ReadMethod::kMmap, 4096);  // far below any pack's size
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const PackCopyPath& p : (*engine)->CopyPaths()) {
    EXPECT_FALSE(p.direct);
    EXPECT_NE(p.detail.find("registering the mapping failed"), std::string::npos) << p.detail;
    EXPECT_NE(p.detail.find("pinned budget"), std::string::npos) << p.detail;
  }
  Sweep(**engine);
  const EngineStats s = (*engine)->Stats();
  EXPECT_EQ(s.bytes_direct, 0u);
  EXPECT_GE(s.bytes_read, s.bytes_copied);
  EXPECT_GT(s.bytes_copied, 0u);
}

TEST_F(EngineDirectTest, PreadPacksAndDisabledDirectCopiesUseStaging) {
  OpenWith(ReadMethod::kPread, uint64_t{1} << 40);
  {
    auto engine = MakeEngine(4);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const PackCopyPath& p : (*engine)->CopyPaths()) {
      EXPECT_FALSE(p.direct);
      EXPECT_NE(p.detail.find("only mmap packs"), std::string::npos) << p.detail;
    }
  }
  EXPECT_EQ(registering_->used(), 0u);
}

TEST_F(EngineDirectTest, DirectCopiesCanBeTurnedOff) {
  OpenWith(ReadMethod::kMmap, uint64_t{1} << 40);
  EngineOptions o = Options(4);
  o.direct_copies = false;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const PackCopyPath& p : (*engine)->CopyPaths()) {
    EXPECT_FALSE(p.direct);
    EXPECT_NE(p.detail.find("off"), std::string::npos) << p.detail;
  }
  EXPECT_EQ(registering_->used(), 0u);
  Sweep(**engine);
  EXPECT_EQ((*engine)->Stats().bytes_direct, 0u);
}

}  // namespace
}  // namespace expertd::testing
