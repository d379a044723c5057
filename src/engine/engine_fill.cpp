// The engine's fill pipeline: queues, staging, reads (into staging or in place), device copies,
// settling slots and completing acquires; prefetch promotion and cancellation.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/engine_impl.h"
#include "util/status.h"

namespace expertd {

using engine_internal::kNoSegment;
using Stage = engine_internal::PrefetchEntry::Stage;

void Engine::Impl::Enqueue(uint32_t cls, const SlotGrant& g, bool demand) {
  Fill f{cls, g.slot, g.generation, g.wait_done, g.key, demand, false};
  // In place only when nobody can still be reading the slot's previous occupant: the done fence
  // only grows, so what passed now stays passed.
  f.in_place = in_place_ok && classes[cls].fences->done(g.slot) >= g.wait_done;
  f.direct = !f.in_place && !direct.empty() && DirectOk(f.key);
  // Direct prefetches queue like the others (promotion and cancellation work on them, and only
  // a bounded number is handed to the device at once); direct demand fills start at once.
  const bool no_segment = f.in_place || (f.direct && demand);
  if (!demand) {
    prefetches[f.id()] =
        PrefetchEntry{f, no_segment ? Stage::kStarting : Stage::kQueued, ReadJobHandle()};
    prefetches_by_layer[f.key.layer].insert(f.id());
  }
  if (no_segment) {
    in_place_ready.push_back(f);
  } else {
    (demand ? demand_q : prefetch_q).push_back(f);
  }
}

void Engine::Impl::ForgetPrefetch(const FillId& id) {
  const auto it = prefetches.find(id);
  if (it == prefetches.end()) return;
  const uint32_t layer = it->second.fill.key.layer;
  prefetches.erase(it);
  const auto by = prefetches_by_layer.find(layer);
  if (by == prefetches_by_layer.end()) return;
  by->second.erase(id);
  if (by->second.empty()) prefetches_by_layer.erase(by);
}

void Engine::Impl::Promote(const FillId& id) {
  const auto it = prefetches.find(id);
  if (it == prefetches.end() || it->second.stage != Stage::kQueued) return;
  Fill f = it->second.fill;
  ForgetPrefetch(id);  // its prefetch_q entry is dropped when it reaches the front
  f.demand = true;
  demand_q.push_back(f);
  ++prefetch_promoted;
}

void Engine::Impl::CancelSuperseded(uint32_t layer, std::span<const uint32_t> keep) {
  if (!options.cancel_superseded_prefetches) return;
  const auto by = prefetches_by_layer.find(layer);
  if (by == prefetches_by_layer.end()) return;
  const std::vector<FillId> ids(by->second.begin(), by->second.end());
  for (const FillId& id : ids) {
    const auto it = prefetches.find(id);
    if (it == prefetches.end()) continue;
    PrefetchEntry& e = it->second;
    if (std::find(keep.begin(), keep.end(), e.fill.key.expert) != keep.end()) continue;
    if (e.stage != Stage::kQueued && e.stage != Stage::kReading) continue;
    SlotPool& pool = *classes[e.fill.cls].pool;
    // Refused when an acquire joined the fill meanwhile: then it is wanted after all.
    if (!pool.CancelPrefetch(e.fill.slot, e.fill.generation)) continue;
    if (e.stage == Stage::kQueued) {
      const Fill f = e.fill;
      ForgetPrefetch(id);  // dropped from prefetch_q when it reaches the front
      pool.FillDone(f.slot, f.generation, /*ok=*/false);  // frees the slot, counts it cancelled
    } else if (e.read.TryCancel()) {
      e.stage = Stage::kCancelling;  // its callback brings CancelledError; FinishFill frees it
    } else {
      pool.RestorePrefetch(e.fill.slot, e.fill.generation);  // a reader started it: let it be
    }
  }
}

std::vector<Engine::Impl::Start> Engine::Impl::TakeStartable() {
  std::vector<Start> out;
  for (const Fill& f : in_place_ready) out.push_back(Start{f, kNoSegment});
  in_place_ready.clear();
  while (!demand_q.empty()) {
    if (demand_q.front().direct) {  // a promoted direct prefetch: no segment needed
      out.push_back(Start{demand_q.front(), kNoSegment});
      demand_q.pop_front();
      continue;
    }
    const std::optional<uint32_t> seg = ring->TryReserveDemand();
    if (!seg) break;
    out.push_back(Start{demand_q.front(), *seg});
    demand_q.pop_front();
  }
  while (!prefetch_q.empty()) {
    const auto it = prefetches.find(prefetch_q.front().id());
    if (it == prefetches.end() || it->second.stage != Stage::kQueued) {
      prefetch_q.pop_front();  // cancelled or promoted while queued
      continue;
    }
    uint32_t seg = kNoSegment;
    if (prefetch_q.front().direct) {
      // As many direct prefetches at once as the ring has segments: the same bound as staged
      // ones, so a demand copy never waits behind an unbounded prefetch backlog in the device.
      if (direct_prefetches >= ring->segments()) break;
      ++direct_prefetches;
    } else {
      const std::optional<uint32_t> reserved = ring->TryReservePrefetch();
      if (!reserved) break;
      seg = *reserved;
    }
    it->second.stage = Stage::kStarting;
    out.push_back(Start{prefetch_q.front(), seg});
    prefetch_q.pop_front();
  }
  fills_in_flight += static_cast<int>(out.size());
  fills_starting += static_cast<int>(out.size());
  return out;
}

void Engine::Impl::StartFills(std::vector<Start> starts) {
  if (starts.empty()) return;
  for (const Start& s : starts) StartFill(s.fill, s.segment);
  // Shutdown waits for this before it destroys the reader pools these fills were submitted to.
  std::lock_guard<std::mutex> lock(mu);
  fills_starting -= static_cast<int>(starts.size());
  if (fills_starting == 0) fills_settled.notify_all();
}

bool Engine::Impl::DirectOk(const BundleKey& key) const {
  const MoeLayer& layer = *catalog.FindLayer(key.layer);
  for (size_t p = 0; p < layer.projections.size(); ++p) {
    const absl::StatusOr<ExpertLocation> loc = catalog.Locate(key.layer, key.expert, p);
    if (!loc.ok() || loc->pack >= direct.size() || direct[loc->pack] == nullptr) return false;
    const StagingBuffer& mapped = *direct[loc->pack];
    if (loc->offset + loc->bytes > mapped.bytes()) return false;
    // A projection across two registered chunks goes through staging.
    if (!mapped.OneRegion(mapped.data().subspan(loc->offset, loc->bytes))) return false;
  }
  return true;
}

void Engine::Impl::CopyDirect(const Fill& f) {
  ClassState& c = classes[f.cls];
  const MoeLayer& layer = *catalog.FindLayer(f.key.layer);
  CopyRequest req;
  req.priority = f.demand ? CopyPriority::kDemand : CopyPriority::kPrefetch;
  for (size_t p = 0; p < layer.projections.size(); ++p) {
    const Projection& proj = layer.projections[p];
    const absl::StatusOr<ExpertLocation> loc = catalog.Locate(f.key.layer, f.key.expert, p);
    if (!loc.ok()) return FinishFill(f, kNoSegment, loc.status());
    // Inside the mapping: ServedModel / the catalog checked every range against the pack size.
    const std::span<uint8_t> mapped = direct[loc->pack]->data();
    if (loc->bytes != proj.expert_bytes || loc->offset + loc->bytes > mapped.size()) {
      return FinishFill(f, kNoSegment,
                        absl::InternalError(absl::StrCat("layer ", f.key.layer, " expert ",
                                                         f.key.expert, " ", proj.tensor,
                                                         " lies outside its pack mapping")));
    }
    req.segments.push_back(CopySegment{mapped.subspan(loc->offset, loc->bytes),
                                       c.arenas[p].get(), uint64_t{f.slot} * proj.expert_bytes});
  }
  if (f.wait_done > 0) req.waits.push_back(FenceWait{c.fences.get(), f.slot, f.wait_done});
  req.signals.push_back(FenceSignal{c.fences.get(), f.slot, f.generation});
  const uint64_t bytes = layer.payload_bytes;
  const absl::Status submitted =
      device.SubmitCopy(std::move(req), [this, f, bytes](absl::Status st) {
        if (st.ok()) {
          bytes_copied.fetch_add(bytes, std::memory_order_relaxed);
          bytes_direct.fetch_add(bytes, std::memory_order_relaxed);
        }
        FinishFill(f, kNoSegment, std::move(st));
      });
  if (!submitted.ok()) FinishFill(f, kNoSegment, submitted);
}

void Engine::Impl::StartFill(const Fill& f, uint32_t seg) {
  if (f.direct) return CopyDirect(f);
  const MoeLayer& layer = *catalog.FindLayer(f.key.layer);
  const ClassState& c = classes[f.cls];
  ReadJob job;
  job.priority = f.demand ? ReadPriority::kDemand : ReadPriority::kPrefetch;
  for (size_t p = 0; p < layer.projections.size(); ++p) {
    const Projection& proj = layer.projections[p];
    const absl::StatusOr<ExpertLocation> loc = catalog.Locate(f.key.layer, f.key.expert, p);
    if (!loc.ok()) return FinishFill(f, seg, loc.status());
    if (loc->bytes != proj.expert_bytes) {
      return FinishFill(f, seg,
                        absl::InternalError(absl::StrCat(
                            "catalog places ", loc->bytes, " bytes of ", proj.tensor, " expert ",
                            f.key.expert, "; an expert has ", proj.expert_bytes)));
    }
    uint8_t* dst = seg == kNoSegment
                       ? c.arenas[p]->host_write_data() + uint64_t{f.slot} * proj.expert_bytes
                       : ring->segment(seg).data() + proj.bundle_offset;
    job.ranges.push_back(ReadRange{loc->pack, loc->offset, loc->bytes, dst});
  }
  job.done = [this, f, seg](absl::Status st) { AfterRead(f, seg, std::move(st)); };
  absl::StatusOr<ReadJobHandle> handle = readers->Submit(std::move(job));
  if (!handle.ok()) return FinishFill(f, seg, handle.status());
  if (!f.demand) {
    std::lock_guard<std::mutex> lock(mu);
    // Gone already when the read finished first.
    if (const auto it = prefetches.find(f.id()); it != prefetches.end()) {
      it->second.read = *std::move(handle);
      it->second.stage = Stage::kReading;
    }
  }
}

void Engine::Impl::AfterRead(const Fill& f, uint32_t seg, absl::Status st) {
  ClassState& c = classes[f.cls];
  // A read that completed goes on even when its prefetch was cancelled meanwhile: the
  // cancellation may still be undone (RestorePrefetch, when the reader had already started), and
  // FillDone settles a cancelled slot as cancelled whatever the copy did. Turning the read into
  // an error here raced with that undo and reported a good fill as failed.
  if (!st.ok()) return FinishFill(f, seg, std::move(st));
  if (seg != kNoSegment) return CopyFromStaging(f, seg);
  // In place: the bytes are in the slot; the last part's completion made them visible here.
  st = c.fences->AdvanceReady(f.slot, f.generation);
  if (st.ok()) {
    const uint64_t bytes = catalog.FindLayer(f.key.layer)->payload_bytes;
    bytes_copied.fetch_add(bytes, std::memory_order_relaxed);
    bytes_in_place.fetch_add(bytes, std::memory_order_relaxed);
  }
  FinishFill(f, seg, std::move(st));
}

void Engine::Impl::CopyFromStaging(const Fill& f, uint32_t seg) {
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
  const absl::Status submitted =
      device.SubmitCopy(std::move(req), [this, f, seg, bytes](absl::Status st) {
        if (st.ok()) bytes_copied.fetch_add(bytes, std::memory_order_relaxed);
        FinishFill(f, seg, std::move(st));
      });
  if (!submitted.ok()) FinishFill(f, seg, submitted);
}

void Engine::Impl::Settle(const Fill& f, const absl::Status& st,
                          std::vector<std::shared_ptr<PendingAcquire>>* ready) {
  const FillOutcome outcome = classes[f.cls].pool->FillDone(f.slot, f.generation, st.ok());
  if (!f.demand) ForgetPrefetch(f.id());
  if (outcome == FillOutcome::kFailed) ++fills_failed;
  const auto it = waiters.find(f.id());
  if (it == waiters.end()) return;
  for (auto& w : it->second) {
    if (outcome != FillOutcome::kResident && w->status.ok()) {
      const absl::Status cause =
          st.ok() ? absl::InternalError("the slot was taken from its fill") : st;
      w->status = MakeError(cause.code(), ErrorKindOf(cause).value_or(ErrorKind::kIo),
                            absl::StrCat("reading layer ", f.key.layer, " expert ", f.key.expert,
                                         ": ", cause.message()));
    }
    if (--w->pending == 0) ready->push_back(w);
  }
  waiters.erase(it);
}

void Engine::Impl::FinishFill(const Fill& f, uint32_t seg, absl::Status st) {
  if (seg != kNoSegment) ring->Release(seg);
  std::vector<std::shared_ptr<PendingAcquire>> ready;
  std::vector<Start> next;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (f.direct && !f.demand) --direct_prefetches;
    Settle(f, st, &ready);
    if (!stopping) next = TakeStartable();
  }
  for (auto& w : ready) Complete(w);
  StartFills(std::move(next));
  // Last: the destructor may go on (and free this) as soon as the count reaches zero.
  std::lock_guard<std::mutex> lock(mu);
  if (--fills_in_flight == 0) fills_settled.notify_all();
}

void Engine::Impl::RecordStall(absl::Duration stall) {
  const double us = absl::ToDoubleMicroseconds(stall);
  if (stalls_us.size() < kStallSamples) {
    stalls_us.push_back(us);
  } else {
    stalls_us[stall_next] = us;
  }
  stall_next = (stall_next + 1) % kStallSamples;
}

void Engine::Impl::Complete(const std::shared_ptr<PendingAcquire>& w) {
  w->grant.stall = absl::Now() - w->start;
  {
    std::lock_guard<std::mutex> lock(mu);
    RecordStall(w->grant.stall);
  }
  if (!w->status.ok()) {
    // The grant failed: its leases go back now, uncommitted — the caller never sees them, so
    // no later fill of these slots waits for a done fence the caller would have to signal.
    ReleaseSlots(w->grant);
    w->done(w->status);
    return;
  }
  std::vector<std::vector<SlotGrant>> by_class(classes.size());
  for (const GrantedSlot& s : w->grant.slots) {
    by_class[s.slot_class].push_back(
        SlotGrant{.key = {w->grant.layer, s.expert}, .slot = s.slot, .generation = s.generation});
  }
  for (size_t c = 0; c < classes.size(); ++c) {
    if (!by_class[c].empty()) classes[c].pool->Commit(by_class[c]);
  }
  w->done(std::move(w->grant));
}

void Engine::Impl::ReleaseSlots(const Grant& g) {
  std::vector<std::vector<SlotId>> by_class(classes.size());
  for (const GrantedSlot& s : g.slots) by_class[s.slot_class].push_back(s.slot);
  for (size_t c = 0; c < classes.size(); ++c) {
    if (!by_class[c].empty()) classes[c].pool->Release(by_class[c]);
  }
}

void Engine::Impl::Shutdown() {
  std::vector<std::shared_ptr<PendingAcquire>> ready;
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
    const absl::Status cancelled = absl::CancelledError("the engine is shutting down");
    std::vector<Fill> queued(in_place_ready.begin(), in_place_ready.end());
    queued.insert(queued.end(), demand_q.begin(), demand_q.end());
    for (const Fill& f : prefetch_q) {
      const auto it = prefetches.find(f.id());
      if (it != prefetches.end() && it->second.stage == Stage::kQueued) queued.push_back(f);
    }
    in_place_ready.clear();
    demand_q.clear();
    prefetch_q.clear();
    for (const Fill& f : queued) Settle(f, cancelled, &ready);
  }
  for (auto& w : ready) Complete(w);
  {
    // Fills taken from the queues before `stopping` was set may still be submitting.
    std::unique_lock<std::mutex> lock(mu);
    fills_settled.wait(lock, [this] { return fills_starting == 0; });
  }
  readers.reset();  // cancels queued reads; their fills finish with Cancelled
  std::unique_lock<std::mutex> lock(mu);
  fills_settled.wait(lock, [this] { return fills_in_flight == 0; });
}

}  // namespace expertd
