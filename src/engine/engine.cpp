#include "engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "engine/engine_impl.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint64_t kSegmentAlignment = 4096;  // O_DIRECT-friendly staging segments

}  // namespace

using engine_internal::PendingAcquire;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelCatalog& catalog,
                                                       const PackSet& packs, Device& device,
                                                       const EngineOptions& options) {
  if (catalog.layers().empty()) {
    return absl::InvalidArgumentError("the model has no MoE layers to stream");
  }
  auto impl = std::make_unique<Impl>(catalog, packs, device, options);
  PolicyModel model{{}, catalog.n_expert(), catalog.n_expert_used()};
  for (const MoeLayer& l : catalog.layers()) model.layers.push_back(l.block);
  const uint32_t min_slots = std::max<uint32_t>(catalog.n_expert_used(), 1);
  for (const SlotClass& sc : catalog.slot_classes()) {
    Impl::ClassState c;
    c.layout = catalog.FindLayer(sc.layers.front());
    uint64_t slots = options.slots_per_class;
    if (slots == 0) {
      const uint64_t share = options.slot_budget_bytes / catalog.layers().size() * sc.layers.size();
      slots = share / std::max<uint64_t>(c.layout->payload_bytes, 1);
    }
    if (slots < min_slots) {
      return MakeError(
          absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
          absl::StrCat("slot class ", sc.id, " would get ", slots, " slots; an acquire of top-",
                       min_slots, " needs at least that many (raise the slot budget)"));
    }
    slots = std::min<uint64_t>(slots, uint64_t{c.layout->n_expert} * sc.layers.size());
    ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> policy,
                     MakeEvictionPolicy(options.policy, model, static_cast<uint32_t>(slots)));
    // A prefetch may evict only what the current sweep has not touched.
    const uint64_t protect = uint64_t{catalog.n_expert_used()} * catalog.layers().size();
    c.pool = std::make_unique<SlotPool>(static_cast<uint32_t>(slots), std::move(policy), protect);
    for (const Projection& p : c.layout->projections) {
      ASSIGN_OR_RETURN(std::unique_ptr<Arena> arena,
                       device.AllocateArena(slots * p.expert_bytes,
                                            absl::StrCat("class ", sc.id, " ", p.tensor)));
      c.arenas.push_back(std::move(arena));
    }
    ASSIGN_OR_RETURN(c.fences, device.CreateFences(static_cast<uint32_t>(slots)));
    Device* tables = device.caps().arenas_host_writable ? &device : options.table_device;
    if (options.client_hits && tables != nullptr && tables->caps().arenas_host_writable) {
      const uint32_t n_expert = c.layout->n_expert;
      ASSIGN_OR_RETURN(c.residency,
                       tables->AllocateArena(residency::TableBytes(static_cast<uint32_t>(slots),
                                                                  static_cast<uint32_t>(
                                                                      sc.layers.size()),
                                                                  n_expert),
                                            absl::StrCat("class ", sc.id, " residency")));
      c.board = std::make_unique<ResidencyBoard>(c.residency->host_write_data(),
                                                 static_cast<uint32_t>(slots), sc.layers,
                                                 n_expert);
      c.pool->SetResidency(c.board.get());
    }
    impl->classes.push_back(std::move(c));
  }
  const uint64_t segment = *CheckedAlignUp(catalog.max_bundle_bytes(), kSegmentAlignment);
  if (options.staging_bytes < segment) {
    return MakeError(absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                     absl::StrCat("staging of ", options.staging_bytes,
                                  " bytes cannot hold one bundle: the largest needs ", segment,
                                  " (raise staging_bytes)"));
  }
  const uint64_t staging =
      std::max(options.staging_bytes, segment * (options.staging_demand_reserve + 2));
  ASSIGN_OR_RETURN(impl->staging_memory, device.AllocateStaging(staging));
  ASSIGN_OR_RETURN(impl->ring, StagingRing::Create(impl->staging_memory->data(), segment,
                                                   options.staging_demand_reserve));
  PredictorOptions po = options.predictor_options;
  po.layers = model.layers;
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    ASSIGN_OR_RETURN(impl->predictor, MakePredictor(options.predictor, po));
  }
  impl->readers = std::make_unique<ReaderPools>(packs, options.readers);
  impl->in_place_ok = options.fill_in_place && device.caps().arenas_host_writable &&
                      device.caps().fences_host_visible;
  impl->RegisterPacks();
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

void Engine::Impl::RegisterPacks() {
  const bool can = device.caps().registers_host_memory;
  bool any = false;
  for (PackId id = 0; id < packs.size(); ++id) {
    PackCopyPath path;
    path.pack = packs.pack(id).label;
    std::unique_ptr<StagingBuffer> registered;
    const std::span<const uint8_t> mapping = packs.mapping(id);
    if (!options.direct_copies) {
      path.detail = "staging (direct copies are off)";
    } else if (!can) {
      path.detail = absl::StrCat("staging (device ", AV(device.name()),
                                 " does not register host memory)");
    } else if (mapping.empty()) {
      path.detail = absl::StrCat("staging (read with ", AV(ReadMethodName(packs.pack(id).method)),
                                 "; only mmap packs can be registered)");
    } else if (device.caps().registers_read_only_memory) {
      // The pack's own read-only mapping: the device never writes through it.
      absl::StatusOr<std::unique_ptr<StagingBuffer>> r = device.RegisterHostMemory(
          std::span<uint8_t>(const_cast<uint8_t*>(mapping.data()), mapping.size()));
      if (r.ok()) {
        registered = *std::move(r);
        path.direct = true;
        path.detail = absl::StrCat("direct (", mapping.size(), " bytes registered read-only)");
      } else {
        path.detail = absl::StrCat("staging (registering the mapping failed: ",
                                   r.status().message(), ")");
      }
    } else {
      // Only writable memory can be registered: a private writable mapping of the pack, whose
      // pages registration copies into pinned memory; the file is never written.
      absl::StatusOr<std::unique_ptr<StagingBuffer>> r = RegisterPrivateCopy(id);
      if (r.ok()) {
        registered = *std::move(r);
        path.direct = true;
        path.detail = absl::StrCat("direct (", mapping.size(),
                                   " bytes registered through a private writable mapping: "
                                   "the device cannot register read-only memory)");
      } else {
        path.detail = absl::StrCat("staging (registering a private mapping failed: ",
                                   r.status().message(), ")");
      }
    }
    any = any || path.direct;
    direct.push_back(std::move(registered));
    copy_paths.push_back(std::move(path));
  }
  if (!any) direct.clear();  // Enqueue skips the per-bundle check
}

namespace {
// A registration of a private mapping that owns the mapping: unregistered, then unmapped.
class RegisteredPrivateMapping final : public StagingBuffer {
 public:
  RegisteredPrivateMapping(PrivateMapping mapping, std::unique_ptr<StagingBuffer> registered)
      : StagingBuffer(registered->data()),
        mapping_(std::move(mapping)),
        registered_(std::move(registered)) {}
  bool OneRegion(std::span<const uint8_t> range) const override {
    return registered_->OneRegion(range);
  }

 private:
  PrivateMapping mapping_;                    // destroyed last
  std::unique_ptr<StagingBuffer> registered_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<StagingBuffer>> Engine::Impl::RegisterPrivateCopy(PackId id) {
  ASSIGN_OR_RETURN(PrivateMapping mapping, packs.MapPrivate(id));
  ASSIGN_OR_RETURN(std::unique_ptr<StagingBuffer> registered,
                   device.RegisterHostMemory(mapping.data()));
  return std::make_unique<RegisteredPrivateMapping>(std::move(mapping), std::move(registered));
}

std::vector<PackCopyPath> Engine::CopyPaths() const { return impl_->copy_paths; }

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::Status Engine::Reconfigure(std::string_view policy, std::string_view predictor,
                                 const PredictorOptions& predictor_options) {
  const ModelCatalog& catalog = impl_->catalog;
  PolicyModel model{{}, catalog.n_expert(), catalog.n_expert_used()};
  for (const MoeLayer& l : catalog.layers()) model.layers.push_back(l.block);
  // Everything is made first, so a bad name changes nothing.
  std::vector<std::unique_ptr<EvictionPolicy>> policies;
  for (const Impl::ClassState& c : impl_->classes) {
    ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> p,
                     MakeEvictionPolicy(policy, model, c.pool->capacity()));
    policies.push_back(std::move(p));
  }
  PredictorOptions po = predictor_options;
  po.layers = model.layers;
  ASSIGN_OR_RETURN(std::unique_ptr<Predictor> next, MakePredictor(predictor, po));
  for (size_t i = 0; i < policies.size(); ++i) {
    impl_->classes[i].pool->ReplacePolicy(std::move(policies[i]));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->predictor = std::move(next);
  impl_->options.policy = std::string(policy);
  impl_->options.predictor = std::string(predictor);
  return absl::OkStatus();
}

Engine::~Engine() { impl_->Shutdown(); }

void Engine::AcquireAsync(uint32_t layer, std::span<const uint32_t> experts, GrantCallback done) {
  Impl& m = *impl_;
  const MoeLayer* l = m.catalog.FindLayer(layer);
  if (l == nullptr) {
    return done(absl::NotFoundError(absl::StrCat("layer ", layer, " is not an MoE layer")));
  }
  std::vector<BundleKey> keys;
  for (uint32_t e : experts) {
    if (e >= l->n_expert) {
      return done(absl::OutOfRangeError(
          absl::StrCat("expert ", e, " of layer ", layer, ": the layer has ", l->n_expert)));
    }
    keys.push_back({layer, e});
  }
  const absl::Time start = absl::Now();
  Impl::ClassState& c = m.classes[l->slot_class];
  absl::StatusOr<std::vector<SlotGrant>> grants = c.pool->Acquire(layer, keys);
  if (!grants.ok()) return done(grants.status());

  auto w = std::make_shared<PendingAcquire>();
  w->grant.layer = layer;
  w->done = std::move(done);
  w->start = start;
  std::vector<Impl::Start> startable;
  bool all_ready = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto& [hits, accesses] = m.layer_hits[layer];
    for (const SlotGrant& g : *grants) {
      w->grant.slots.push_back(
          GrantedSlot{g.key.expert, l->slot_class, g.slot, g.generation, g.hit});
      accesses += 1;
      hits += g.hit ? 1 : 0;
      if (g.needs_fill) {
        m.Enqueue(l->slot_class, g, /*demand=*/true);
      } else if (!g.hit) {
        m.Promote({l->slot_class, g.slot, g.generation});
      }
      const SlotState state = g.hit ? SlotState::kResident : c.pool->state(g.slot);
      if (state == SlotState::kFilling) {
        m.waiters[{l->slot_class, g.slot, g.generation}].push_back(w);
        ++w->pending;
      } else if (state == SlotState::kEmpty && w->status.ok()) {
        // Joined another request's read, which failed before this acquire registered.
        w->status = absl::UnavailableError(
            absl::StrCat("the read of layer ", layer, " expert ", g.key.expert, " failed; retry"));
      }
    }
    m.StepPredictor(layer, experts);
    // Fills finish under `mu`, so what is registered now is final: with nothing to wait for,
    // no fill will complete this acquire and it completes here.
    all_ready = w->pending == 0;
    startable = m.TakeStartable();
  }
  m.StartFills(std::move(startable));
  if (all_ready) m.Complete(w);
}

void Engine::Impl::StepPredictor(uint32_t layer, std::span<const uint32_t> experts) {
  // The sweep reached this layer: its other prefetches came too late to matter.
  CancelSuperseded(layer, experts);
  for (const Prediction& p : predictor->Step(layer, experts)) {
    const MoeLayer* pl = catalog.FindLayer(p.layer);
    if (pl == nullptr) continue;
    CancelSuperseded(p.layer, p.experts);
    for (uint32_t e : p.experts) {
      if (e >= pl->n_expert) continue;
      if (auto g = classes[pl->slot_class].pool->Prefetch({p.layer, e})) {
        Enqueue(pl->slot_class, *g, /*demand=*/false);
      }
    }
  }
}

const Arena* Engine::residency(uint32_t slot_class) const {
  if (slot_class >= impl_->classes.size()) return nullptr;
  return impl_->classes[slot_class].residency.get();
}

uint64_t Engine::PinWords() const {
  uint64_t words = 0;
  for (const Impl::ClassState& c : impl_->classes) {
    if (c.board == nullptr) return 0;
    words += c.pool->capacity();
  }
  return words;
}

absl::Status Engine::AddPins(uint64_t owner, std::span<uint64_t> row) {
  const uint64_t words = PinWords();
  if (words == 0) {
    return absl::FailedPreconditionError(
        "this model publishes no residency tables (client_hits is off, or its device keeps its "
        "arenas off the host and no host device holds the tables)");
  }
  if (row.size() < words) {
    return absl::InvalidArgumentError(absl::StrCat("a pin row of ", row.size(),
                                                   " words; this model's slots need ", words));
  }
  uint64_t base = 0;
  for (Impl::ClassState& c : impl_->classes) {
    c.board->AddPins(owner, row.data() + base);
    base += c.pool->capacity();
  }
  return absl::OkStatus();
}

void Engine::RemovePins(uint64_t owner) {
  for (Impl::ClassState& c : impl_->classes) {
    if (c.board != nullptr) c.board->RemovePins(owner);
  }
}

void Engine::RecordClientHits(uint32_t layer, std::span<const uint32_t> experts) {
  Impl& m = *impl_;
  const MoeLayer* l = m.catalog.FindLayer(layer);
  if (l == nullptr) return;
  std::vector<BundleKey> keys;
  std::vector<uint32_t> valid;
  for (uint32_t e : experts) {
    if (e >= l->n_expert) continue;
    keys.push_back({layer, e});
    valid.push_back(e);
  }
  if (keys.empty()) return;
  m.classes[l->slot_class].pool->RecordHits(layer, keys);
  std::vector<Impl::Start> startable;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto& [hits, accesses] = m.layer_hits[layer];
    hits += keys.size();
    accesses += keys.size();
    m.StepPredictor(layer, valid);
    startable = m.TakeStartable();
  }
  m.StartFills(std::move(startable));
}

absl::StatusOr<Grant> Engine::Acquire(uint32_t layer, std::span<const uint32_t> experts) {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  absl::StatusOr<Grant> result;
  AcquireAsync(layer, experts, [&](absl::StatusOr<Grant> g) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(g);
    ready = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return ready; });
  return result;
}

void Engine::Release(const Grant& grant) { impl_->ReleaseSlots(grant); }

void Engine::Prefetch(uint32_t layer, std::span<const uint32_t> experts) {
  Impl& m = *impl_;
  const MoeLayer* l = m.catalog.FindLayer(layer);
  if (l == nullptr) return;
  std::vector<Impl::Start> startable;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.CancelSuperseded(layer, experts);  // a newer prediction for the layer replaces older ones
    for (uint32_t e : experts) {
      if (e >= l->n_expert) continue;
      if (auto g = m.classes[l->slot_class].pool->Prefetch({layer, e})) {
        m.Enqueue(l->slot_class, *g, /*demand=*/false);
      }
    }
    startable = m.TakeStartable();
  }
  m.StartFills(std::move(startable));
}

uint32_t Engine::slots(uint32_t slot_class) const {
  return impl_->classes[slot_class].pool->capacity();
}
const Arena& Engine::arena(uint32_t slot_class, size_t projection) const {
  return *impl_->classes[slot_class].arenas[projection];
}
FenceTable& Engine::fences(uint32_t slot_class) const { return *impl_->classes[slot_class].fences; }

EngineStats Engine::Stats() const {
  EngineStats s;
  for (const Impl::ClassState& c : impl_->classes) {
    const SlotPoolStats p = c.pool->stats();
    s.pool.accesses += p.accesses;
    s.pool.hits += p.hits;
    s.pool.joins += p.joins;
    s.pool.misses += p.misses;
    s.pool.evictions += p.evictions;
    s.pool.prefetch_issued += p.prefetch_issued;
    s.pool.prefetch_used += p.prefetch_used;
    s.pool.prefetch_wasted += p.prefetch_wasted;
    s.pool.prefetch_dropped += p.prefetch_dropped;
    s.pool.fill_errors += p.fill_errors;
    s.pool.prefetch_cancelled += p.prefetch_cancelled;
    s.pool.client_hits += p.client_hits;
    s.pool.pinned_skips += p.pinned_skips;
  }
  // Copies are counted before reads are, so the snapshot never shows more bytes copied than
  // read: a bundle's read is counted (PackSet::Read) before its copy can start.
  s.bytes_copied = impl_->bytes_copied.load(std::memory_order_seq_cst);
  s.bytes_in_place = impl_->bytes_in_place.load(std::memory_order_seq_cst);
  s.bytes_direct = impl_->bytes_direct.load(std::memory_order_seq_cst);
  for (const PackStats& p : impl_->readers->Stats().packs) s.bytes_read += p.bytes_read;
  s.staging = impl_->ring->stats();
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.fills_failed = impl_->fills_failed;
  s.prefetch_promoted = impl_->prefetch_promoted;
  std::vector<double> v = impl_->stalls_us;
  const auto pct = [&](double q) {
    if (v.empty()) return 0.0;
    const size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
    return v[k];
  };
  s.stall_p50_us = pct(0.50);
  s.stall_p99_us = pct(0.99);
  for (const auto& [block, hv] : impl_->layer_hits) {
    s.layer_hit_rate.emplace_back(block, hv.second ? double(hv.first) / double(hv.second) : 0.0);
  }
  std::sort(s.layer_hit_rate.begin(), s.layer_hit_rate.end());
  return s;
}

}  // namespace expertd
