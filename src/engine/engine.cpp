#include "engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "util/checked.h"
#include "util/status.h"

namespace expertd {
namespace {

constexpr uint64_t kSegmentAlignment = 4096;  // O_DIRECT-friendly staging segments

struct PendingAcquire {
  Grant grant;
  int pending = 0;
  absl::Status status;
  Engine::GrantCallback done;
  absl::Time start;
};

struct Fill {
  uint32_t cls = 0;
  SlotId slot = kNoSlot;
  uint64_t generation = 0;
  uint64_t wait_done = 0;  // the previous occupant's last granted generation (0: none)
  BundleKey key;
  bool demand = true;
};

}  // namespace

struct Engine::Impl {
  struct ClassState {
    const MoeLayer* layout = nullptr;  // the class's first layer: projections and sizes
    std::unique_ptr<SlotPool> pool;
    std::vector<std::unique_ptr<Arena>> arenas;  // by projection
    std::unique_ptr<FenceTable> fences;
  };

  const ModelCatalog& catalog;
  const PackSet& packs;
  Device& device;
  EngineOptions options;
  std::vector<ClassState> classes;
  std::unique_ptr<StagingBuffer> staging_memory;
  std::unique_ptr<StagingRing> ring;
  std::unique_ptr<ReaderPools> readers;

  std::mutex mu;  // std primitives: visible to ThreadSanitizer
  std::condition_variable fills_settled;
  std::unique_ptr<Predictor> predictor ABSL_GUARDED_BY(mu);
  std::deque<Fill> demand_q ABSL_GUARDED_BY(mu);
  std::deque<Fill> prefetch_q ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::tuple<uint32_t, SlotId, uint64_t>,
                      std::vector<std::shared_ptr<PendingAcquire>>>
      waiters ABSL_GUARDED_BY(mu);
  std::vector<double> stalls_us ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint32_t, std::pair<uint64_t, uint64_t>> layer_hits ABSL_GUARDED_BY(mu);
  uint64_t bytes_copied ABSL_GUARDED_BY(mu) = 0;
  uint64_t fills_failed ABSL_GUARDED_BY(mu) = 0;
  int fills_in_flight ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;

  Impl(const ModelCatalog& c, const PackSet& p, Device& d, const EngineOptions& o)
      : catalog(c), packs(p), device(d), options(o) {}

  // Queues the fill of a slot the pool just handed out, remembering what its copy must wait for.
  void Enqueue(uint32_t cls, const SlotGrant& g, bool demand) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Fill f{cls, g.slot, g.generation, g.wait_done, g.key, demand};
    (demand ? demand_q : prefetch_q).push_back(f);
  }

  // Starts queued fills while staging segments are free: demand first, prefetches only while
  // more than the demand reserve is free.
  std::vector<std::pair<Fill, uint32_t>> TakeStartable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::pair<Fill, uint32_t>> out;
    while (!demand_q.empty()) {
      const std::optional<uint32_t> seg = ring->TryReserveDemand();
      if (!seg) return out;
      out.emplace_back(demand_q.front(), *seg);
      demand_q.pop_front();
    }
    while (!prefetch_q.empty()) {
      const std::optional<uint32_t> seg = ring->TryReservePrefetch();
      if (!seg) break;
      out.emplace_back(prefetch_q.front(), *seg);
      prefetch_q.pop_front();
    }
    fills_in_flight += static_cast<int>(out.size());
    return out;
  }

  void StartFills(std::vector<std::pair<Fill, uint32_t>> fills) {
    for (auto& [fill, seg] : fills) StartFill(fill, seg);
  }

  void StartFill(const Fill& f, uint32_t seg) {
    const MoeLayer& layer = *catalog.FindLayer(f.key.layer);
    const std::span<uint8_t> staging = ring->segment(seg);
    ReadJob job;
    job.priority = f.demand ? ReadPriority::kDemand : ReadPriority::kPrefetch;
    for (size_t p = 0; p < layer.projections.size(); ++p) {
      const absl::StatusOr<ExpertLocation> loc = catalog.Locate(f.key.layer, f.key.expert, p);
      if (!loc.ok()) return FinishFill(f, seg, loc.status());
      job.ranges.push_back(ReadRange{loc->pack, loc->offset, loc->bytes,
                                     staging.data() + layer.projections[p].bundle_offset});
    }
    job.done = [this, f, seg](absl::Status st) {
      if (!st.ok()) return FinishFill(f, seg, st);
      CopyAfterRead(f, seg);
    };
    const absl::StatusOr<ReadJobHandle> handle = readers->Submit(std::move(job));
    if (!handle.ok()) FinishFill(f, seg, handle.status());
  }

  void CopyAfterRead(const Fill& f, uint32_t seg) {
    ClassState& c = classes[f.cls];
    const MoeLayer& layer = *catalog.FindLayer(f.key.layer);
    const std::span<uint8_t> staging = ring->segment(seg);
    CopyRequest req;
    req.priority = f.demand ? CopyPriority::kDemand : CopyPriority::kPrefetch;
    for (size_t p = 0; p < layer.projections.size(); ++p) {
      const Projection& proj = layer.projections[p];
      req.segments.push_back(CopySegment{staging.subspan(proj.bundle_offset, proj.expert_bytes),
                                         c.arenas[p].get(), uint64_t{f.slot} * proj.expert_bytes});
    }
    if (f.wait_done > 0) req.waits.push_back(FenceWait{c.fences.get(), f.slot, f.wait_done});
    req.signals.push_back(FenceSignal{c.fences.get(), f.slot, f.generation});
    const uint64_t bytes = layer.payload_bytes;
    const absl::Status submitted = device.SubmitCopy(
        std::move(req), [this, f, seg, bytes](absl::Status st) {
          if (st.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            bytes_copied += bytes;
          }
          FinishFill(f, seg, st);
        });
    if (!submitted.ok()) FinishFill(f, seg, submitted);
  }

  // The end of a fill, successful or not: frees its staging segment, settles the slot, wakes
  // the acquires waiting for it and starts whatever the freed segment allows.
  void FinishFill(const Fill& f, uint32_t seg, const absl::Status& st) {
    ring->Release(seg);
    std::vector<std::shared_ptr<PendingAcquire>> ready;
    std::vector<std::pair<Fill, uint32_t>> next;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (--fills_in_flight == 0) fills_settled.notify_all();
      classes[f.cls].pool->FillDone(f.slot, f.generation, st.ok());
      if (!st.ok()) ++fills_failed;
      const auto it = waiters.find({f.cls, f.slot, f.generation});
      if (it != waiters.end()) {
        for (auto& w : it->second) {
          if (!st.ok() && w->status.ok()) {
            w->status = MakeError(st.code(), ErrorKindOf(st).value_or(ErrorKind::kIo),
                                  absl::StrCat("reading layer ", f.key.layer, " expert ",
                                               f.key.expert, ": ", st.message()));
          }
          if (--w->pending == 0) ready.push_back(w);
        }
        waiters.erase(it);
      }
      if (!stopping) next = TakeStartable();
    }
    for (auto& w : ready) Complete(w);
    StartFills(std::move(next));
  }

  void Complete(const std::shared_ptr<PendingAcquire>& w) {
    w->grant.stall = absl::Now() - w->start;
    {
      std::lock_guard<std::mutex> lock(mu);
      stalls_us.push_back(absl::ToDoubleMicroseconds(w->grant.stall));
    }
    if (!w->status.ok()) {
      // The grant failed: its leases go back now, the caller never sees them.
      ReleaseSlots(w->grant);
      w->done(w->status);
    } else {
      w->done(std::move(w->grant));
    }
  }

  void ReleaseSlots(const Grant& g) {
    std::vector<std::vector<SlotId>> by_class(classes.size());
    for (const GrantedSlot& s : g.slots) by_class[s.slot_class].push_back(s.slot);
    for (size_t c = 0; c < classes.size(); ++c) {
      if (!by_class[c].empty()) classes[c].pool->Release(by_class[c]);
    }
  }
};

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
      const uint64_t share =
          options.slot_budget_bytes / catalog.layers().size() * sc.layers.size();
      slots = share / std::max<uint64_t>(c.layout->payload_bytes, 1);
    }
    if (slots < min_slots) {
      return MakeError(absl::StatusCode::kInvalidArgument, ErrorKind::kBadValue,
                       absl::StrCat("slot class ", sc.id, " would get ", slots,
                                    " slots; an acquire of top-", min_slots,
                                    " needs at least that many (raise the slot budget)"));
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
    impl->classes.push_back(std::move(c));
  }
  const uint64_t segment = *CheckedAlignUp(catalog.max_bundle_bytes(), kSegmentAlignment);
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
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->demand_q.clear();
    impl_->prefetch_q.clear();
  }
  impl_->readers.reset();  // cancels queued reads; their fills finish with Cancelled
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->fills_settled.wait(lock, [this] { return impl_->fills_in_flight == 0; });
}

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
  std::vector<std::pair<Fill, uint32_t>> startable;
  bool all_ready = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto& [hits, accesses] = m.layer_hits[layer];
    for (const SlotGrant& g : *grants) {
      w->grant.slots.push_back(GrantedSlot{g.key.expert, l->slot_class, g.slot, g.generation, g.hit});
      accesses += 1;
      hits += g.hit ? 1 : 0;
      if (g.needs_fill) {
        m.Enqueue(l->slot_class, g, /*demand=*/true);
      }
      const SlotState state = g.hit ? SlotState::kResident : c.pool->state(g.slot);
      if (state == SlotState::kFilling) {
        m.waiters[{l->slot_class, g.slot, g.generation}].push_back(w);
        ++w->pending;
      } else if (state == SlotState::kEmpty && w->status.ok()) {
        // Joined another request's read, which failed before this acquire registered.
        w->status = absl::UnavailableError(absl::StrCat(
            "the read of layer ", layer, " expert ", g.key.expert, " failed; retry"));
      }
    }
    for (const Prediction& p : m.predictor->Step(layer, experts)) {
      const MoeLayer* pl = m.catalog.FindLayer(p.layer);
      if (pl == nullptr) continue;
      for (uint32_t e : p.experts) {
        if (e >= pl->n_expert) continue;
        if (auto g = m.classes[pl->slot_class].pool->Prefetch({p.layer, e})) {
          m.Enqueue(pl->slot_class, *g, /*demand=*/false);
        }
      }
    }
    // Fills finish under `mu`, so what is registered now is final: with nothing to wait for,
    // no fill will complete this acquire and it completes here.
    all_ready = w->pending == 0;
    startable = m.TakeStartable();
  }
  m.StartFills(std::move(startable));
  if (all_ready) m.Complete(w);
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
  std::vector<std::pair<Fill, uint32_t>> startable;
  {
    std::lock_guard<std::mutex> lock(m.mu);
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
FenceTable& Engine::fences(uint32_t slot_class) const {
  return *impl_->classes[slot_class].fences;
}

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
  }
  for (const PackStats& p : impl_->readers->Stats().packs) s.bytes_read += p.bytes_read;
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.bytes_copied = impl_->bytes_copied;
  s.fills_failed = impl_->fills_failed;
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
