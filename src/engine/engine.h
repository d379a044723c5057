// Engine: the pipeline that turns acquires into granted slots. For each slot class of the
// catalog it owns a slot pool (the cache), one arena per projection and a fence table; it reads
// missing bundles with the reader pools into the staging ring and copies them into slots with
// the device.
//
//   acquire(layer, experts) -> pool: hits, joins, misses (leased)
//     misses -> fill queue (demand ahead of prefetch) -> staging segment -> read job
//            -> device copy (waits for the slot's last done generation, advances ready)
//            -> pool.FillDone -> the grant completes when all its slots are ready
//            -> pool.Commit (its generations now count as handed out) -> callback
//   predictor.Step(layer, experts) -> pool.Prefetch -> fill queue (prefetch)
//   client-side hits (engine/residency.h): resident slots published per class; a client pins
//     them itself and reports the hits afterwards (RecordClientHits)
//
// In place: when the device's arenas are host-writable (the host device) and the slot's done
// fence has already passed, a fill reads the pack straight into the slot and advances ready
// itself — no staging segment, no second copy of the bytes (EngineOptions::fill_in_place).
//
// Superseded prefetches: when the demand acquire of a layer arrives, or a newer prediction for
// the layer replaces an older one, prefetches of that layer whose read has not started are
// cancelled (counted in SlotPoolStats::prefetch_cancelled); a demand acquire that joins a
// prefetch still waiting for a staging segment moves it to the demand queue.
//
// Two requests for one bundle cause one read (the pool shares the in-flight slot). Nothing here
// blocks on I/O: AcquireAsync returns at once and calls back when the grant is ready; Acquire is
// the blocking convenience for tools and tests. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "catalog/catalog.h"
#include "device/device.h"
#include "engine/predictor.h"
#include "engine/slot_pool.h"
#include "engine/staging_ring.h"
#include "pack/reader_pool.h"

namespace expertd {

struct EngineOptions {
  // Slots per slot class: a fixed count, or (when 0) as many as `slot_budget_bytes` allows for
  // the class, split between classes in proportion to their layer counts.
  uint32_t slots_per_class = 0;
  uint64_t slot_budget_bytes = uint64_t{1} << 30;
  std::string policy = "cycle";
  std::string predictor = "none";
  PredictorOptions predictor_options;  // `layers` is filled from the catalog
  // Staging: must hold at least one bundle (the largest; Create fails otherwise). Raised to
  // staging_demand_reserve + 2 bundles when smaller, so prefetches always have a segment.
  uint64_t staging_bytes = uint64_t{64} << 20;
  uint32_t staging_demand_reserve = 2;  // segments prefetches may never take
  ReaderPoolOptions readers;
  // Read straight into slots when the device allows it (see above); false: always via staging.
  bool fill_in_place = true;
  // Direct copies: when the device can register host memory (cudaHostRegister) and a pack is
  // mapped (readers.method = mmap), the pack's mapping is registered at start, in bounded
  // chunks within the device's pinned budget, and bundles whose projections all lie in such
  // packs are copied from the mapping straight into their slots: no read, no staging segment
  // (the origin's direct DAX path); a projection across two registered chunks is read into
  // staging. A pack that cannot be registered uses staging;
  // Engine::CopyPaths() says which path each pack uses and why.
  bool direct_copies = true;
  // Cancel superseded prefetches (see above). The rule assumes the prefetches of a layer serve
  // the next visit of that layer by any session; turn it off when sessions sweep far apart.
  bool cancel_superseded_prefetches = true;
  // Client-side hits (engine/residency.h): publish a residency table per slot class that
  // clients pin resident bundles through, without asking. The tables are host shared memory:
  // arenas of the device when its arenas are host memory, else of `table_device` (a host
  // device, which must outlive the engine); with neither, no tables.
  bool client_hits = true;
  Device* table_device = nullptr;
};

// One granted bundle: where its projections are. Projection p of the bundle is at
// arena(class, p) + slot * expert_bytes(p).
struct GrantedSlot {
  uint32_t expert = 0;
  uint32_t slot_class = 0;
  SlotId slot = kNoSlot;
  uint64_t generation = 0;  // wait for ready[slot] >= generation (already true when granted)
  bool hit = false;
};

struct Grant {
  uint32_t layer = 0;
  std::vector<GrantedSlot> slots;  // in the order of the requested experts
  absl::Duration stall;            // from the request to the grant
};

struct EngineStats {
  SlotPoolStats pool;  // summed over slot classes
  uint64_t bytes_read = 0;
  uint64_t bytes_copied = 0;    // bundle bytes that landed in slots (copied or read in place)
  uint64_t bytes_in_place = 0;  // of bytes_copied: read straight into slots, no staging copy
  uint64_t bytes_direct = 0;    // of bytes_copied: copied from registered pack mappings (no read)
  uint64_t fills_failed = 0;
  uint64_t prefetch_promoted = 0;  // queued prefetches a demand acquire joined and moved ahead
  StagingStats staging;
  double stall_p50_us = 0;  // over the last kStallSamples acquires
  double stall_p99_us = 0;
  std::vector<std::pair<uint32_t, double>> layer_hit_rate;  // (block, hits / accesses)
};

// How the bytes of one pack reach the slots.
struct PackCopyPath {
  std::string pack;    // the pack's label
  bool direct = false;  // copied from its registered mapping; else read into staging
  std::string detail;  // why not direct, or how it was registered
};

class Engine {
 public:
  static constexpr size_t kStallSamples = 65536;

  // The catalog, packs (opened from catalog.packs() in the same order) and device must outlive
  // the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelCatalog& catalog,
                                                        const PackSet& packs, Device& device,
                                                        const EngineOptions& options);
  ~Engine();

  using GrantCallback = absl::AnyInvocable<void(absl::StatusOr<Grant>)>;
  // Leases a slot for each expert of `layer` and calls `done` (on an engine thread, or inline for
  // an all-hit acquire) when every slot is ready. Errors: NotFound for a layer without experts,
  // OutOfRange for an expert beyond the layer's count, ResourceExhausted when the pool can never
  // hold that many bundles, Unavailable when all slots are leased right now.
  void AcquireAsync(uint32_t layer, std::span<const uint32_t> experts, GrantCallback done);
  absl::StatusOr<Grant> Acquire(uint32_t layer, std::span<const uint32_t> experts);
  // Drops the grant's leases. The client must have signalled done for every slot it read.
  void Release(const Grant& grant);
  // Client prediction: stage these experts of `layer` at low priority.
  void Prefetch(uint32_t layer, std::span<const uint32_t> experts);

  // Client-side hits. The residency table of a slot class (nullptr when the engine publishes
  // none: EngineOptions::client_hits off, or a device whose arenas are not host memory and no
  // EngineOptions::table_device).
  const Arena* residency(uint32_t slot_class) const;
  // Pin words per session: one per slot of every class, classes in order (PinWords() in all).
  uint64_t PinWords() const;
  // Registers a session's pin row (PinWords() words the session writes; valid until
  // RemovePins with the same owner). Evictions skip what it pins from now on. An error, with
  // nothing registered, when the engine publishes no residency or the row is too short.
  absl::Status AddPins(uint64_t owner, std::span<uint64_t> row);
  void RemovePins(uint64_t owner);
  // A client's report of hits it made on its own: counted as accesses (recency, statistics)
  // and shown to the predictor, as an acquire of them would be. Unknown layers or experts
  // (the client's words are not trusted) are ignored.
  void RecordClientHits(uint32_t layer, std::span<const uint32_t> experts);

  // Replaces the eviction policy of every slot pool and the predictor while serving (the
  // daemon's SIGHUP). Resident bundles carry over, in their access order; leases, fills and
  // prefetches in flight are untouched. An unknown name is InvalidArgument and changes nothing.
  absl::Status Reconfigure(std::string_view policy, std::string_view predictor,
                           const PredictorOptions& predictor_options);

  // Slot geometry, for clients and verification.
  uint32_t slots(uint32_t slot_class) const;
  const Arena& arena(uint32_t slot_class, size_t projection) const;
  FenceTable& fences(uint32_t slot_class) const;
  EngineStats Stats() const;
  // One entry per pack, in PackSet order.
  std::vector<PackCopyPath> CopyPaths() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace expertd
