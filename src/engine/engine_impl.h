// Internals of Engine, shared by engine.cpp (creation and the public calls) and engine_fill.cpp
// (the fill pipeline). Not a public header.
//
// Locking: `mu` guards the queues, the prefetch registry, the waiters and the counters marked
// below. The slot pools, the staging ring, the reader pools and the device have their own
// locks; they may be called with `mu` held (never the other way round: none of them calls back
// into the engine while holding its lock). Callbacks to the client run without `mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "engine/engine.h"
#include "engine/residency.h"

namespace expertd {
namespace engine_internal {

// One fill of one slot: (slot class, slot, generation). A slot's generations never repeat, so
// this names a fill for its whole life.
using FillId = std::tuple<uint32_t, SlotId, uint64_t>;

// The segment of a fill that reads straight into its slot.
inline constexpr uint32_t kNoSegment = ~uint32_t{0};

struct PendingAcquire {
  Grant grant;
  int pending = 0;  // fills still to finish
  absl::Status status;
  Engine::GrantCallback done;
  absl::Time start;
};

struct Fill {
  uint32_t cls = 0;
  SlotId slot = kNoSlot;
  uint64_t generation = 0;
  uint64_t wait_done = 0;  // the previous occupant's last committed generation (0: none)
  BundleKey key;
  bool demand = true;
  bool in_place = false;  // decided when queued: the done fence had passed, the device allows it
  bool direct = false;    // every projection lies in a registered pack mapping: copy from there
  FillId id() const { return {cls, slot, generation}; }
};

// A prefetch fill from its creation to its end, so that a demand acquire can promote it and a
// superseding request can cancel it.
struct PrefetchEntry {
  enum class Stage : uint8_t {
    kQueued,      // in prefetch_q, waiting for a staging segment
    kStarting,    // taken from the queue, its read job not submitted yet (not cancellable)
    kReading,     // read job submitted (`read` valid): cancellable until a reader starts it
    kCancelling,  // TryCancel succeeded; its FinishFill will free the slot
  };
  Fill fill;
  Stage stage = Stage::kQueued;
  ReadJobHandle read;
};

}  // namespace engine_internal

struct Engine::Impl {
  using Fill = engine_internal::Fill;
  using FillId = engine_internal::FillId;
  using PendingAcquire = engine_internal::PendingAcquire;
  using PrefetchEntry = engine_internal::PrefetchEntry;

  struct ClassState {
    const MoeLayer* layout = nullptr;  // the class's first layer: projections and sizes
    std::unique_ptr<SlotPool> pool;
    std::vector<std::unique_ptr<Arena>> arenas;  // by projection
    std::unique_ptr<FenceTable> fences;
    std::unique_ptr<Arena> residency;          // client-side hits: the published table
    std::unique_ptr<ResidencyBoard> board;     // and the daemon's side of it
    uint64_t pin_base = 0;                     // this class's first word in a session's pin row
  };
  struct Start {
    Fill fill;
    uint32_t segment = engine_internal::kNoSegment;
  };

  const ModelCatalog& catalog;
  const PackSet& packs;
  Device& device;
  EngineOptions options;
  bool in_place_ok = false;  // options.fill_in_place and the device's arenas are host-writable
  std::vector<ClassState> classes;
  std::unique_ptr<StagingBuffer> staging_memory;
  std::unique_ptr<StagingRing> ring;
  std::unique_ptr<ReaderPools> readers;
  // Per pack: its registered mapping (the direct path), or nullptr; fixed after Create.
  std::vector<std::unique_ptr<StagingBuffer>> direct;
  std::vector<PackCopyPath> copy_paths;

  std::mutex mu;                          // std primitives: visible to ThreadSanitizer
  std::condition_variable fills_settled;  // fills_in_flight or fills_starting reached 0
  std::unique_ptr<Predictor> predictor ABSL_GUARDED_BY(mu);
  std::deque<Fill> demand_q ABSL_GUARDED_BY(mu);
  // Prefetch fills waiting for a staging segment. Cancelled or promoted ones stay here until
  // they reach the front, where TakeStartable drops them (their registry entry is gone).
  std::deque<Fill> prefetch_q ABSL_GUARDED_BY(mu);
  std::vector<Fill> in_place_ready ABSL_GUARDED_BY(mu);  // fills that need no segment (in
                                                        // place or direct)
  absl::flat_hash_map<FillId, PrefetchEntry> prefetches ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint32_t, absl::flat_hash_set<FillId>> prefetches_by_layer
      ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<FillId, std::vector<std::shared_ptr<PendingAcquire>>> waiters
      ABSL_GUARDED_BY(mu);
  std::vector<double> stalls_us ABSL_GUARDED_BY(mu);  // a ring of kStallSamples
  size_t stall_next ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint32_t, std::pair<uint64_t, uint64_t>> layer_hits ABSL_GUARDED_BY(mu);
  uint64_t fills_failed ABSL_GUARDED_BY(mu) = 0;
  uint64_t prefetch_promoted ABSL_GUARDED_BY(mu) = 0;
  int fills_in_flight ABSL_GUARDED_BY(mu) = 0;
  int fills_starting ABSL_GUARDED_BY(mu) = 0;  // taken by TakeStartable, not yet submitted
  uint32_t direct_prefetches ABSL_GUARDED_BY(mu) = 0;  // direct prefetch fills started, not done
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::atomic<uint64_t> bytes_copied{0};
  std::atomic<uint64_t> bytes_in_place{0};
  std::atomic<uint64_t> bytes_direct{0};

  Impl(const ModelCatalog& c, const PackSet& p, Device& d, const EngineOptions& o)
      : catalog(c), packs(p), device(d), options(o) {}

  // Registers the mapped packs with the device for direct copies (EngineOptions::direct_copies)
  // and fills copy_paths. Called once by Create.
  void RegisterPacks();
  // Registers a private writable mapping of pack `id` (devices that cannot register read-only
  // memory); the buffer owns the mapping.
  absl::StatusOr<std::unique_ptr<StagingBuffer>> RegisterPrivateCopy(PackId id);

  // ---- engine_fill.cpp: the pipeline ----

  // Queues the fill of a slot the pool just handed out.
  void Enqueue(uint32_t cls, const SlotGrant& g, bool demand) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A demand acquire joined fill `id`: if it is a prefetch still waiting for a segment, it
  // becomes a demand fill.
  void Promote(const FillId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Cancels the prefetches of `layer` for experts not in `keep` whose read has not started.
  void CancelSuperseded(uint32_t layer, std::span<const uint32_t> keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Fills that may start now: those that need no segment, then demand fills while segments are
  // free, then prefetches while more than the demand reserve is free. Counts them in flight.
  std::vector<Start> TakeStartable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void StartFills(std::vector<Start> starts);
  // The end of a started fill, successful or not.
  void FinishFill(const Fill& f, uint32_t segment, absl::Status status);
  // Delivers (committing its generations) or fails a grant whose fills all settled.
  void Complete(const std::shared_ptr<PendingAcquire>& w);
  void ReleaseSlots(const Grant& g);
  void RecordStall(absl::Duration stall) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Shows an access of (layer, experts) to the predictor and queues its prefetches.
  void StepPredictor(uint32_t layer, std::span<const uint32_t> experts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Stops the pipeline: fails queued fills (their acquires get Cancelled), cancels queued
  // reads and waits for every started fill to end. Called once, by ~Engine.
  void Shutdown();

 private:
  void StartFill(const Fill& f, uint32_t segment);
  void AfterRead(const Fill& f, uint32_t segment, absl::Status status);
  void CopyFromStaging(const Fill& f, uint32_t segment);
  // The direct path: one copy from the registered pack mappings, no read.
  void CopyDirect(const Fill& f);
  // True when every projection of `key` lies in a pack with a registered mapping.
  bool DirectOk(const BundleKey& key) const;
  // Settles the pool slot of a fill and collects the acquires it completes.
  void Settle(const Fill& f, const absl::Status& status,
              std::vector<std::shared_ptr<PendingAcquire>>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void ForgetPrefetch(const FillId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace expertd
