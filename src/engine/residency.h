// Client-side hits: a client reads a resident bundle without a round trip to the daemon.
//
// The daemon publishes, per slot class, a residency table that clients map read-only (an arena
// of its own, exported like the projection arenas). Each session has a row of pin words in its
// request lane, one per slot, which only that session writes. An acquire whose bundles are all
// resident pins them in the client and never reaches the daemon; the client reports the hits
// afterwards (a lane record that does not wake the daemon) so eviction recency, statistics and
// prediction still see every access. docs/protocol.md ("Client-side hits") is the contract.
//
// Table layout (little-endian, one slot class, `slots` slots, `layers` layers of `n_expert`):
//   [0, 16 * slots)        per slot: u64 tag (the resident occupant's generation; 0: none, or
//                          being evicted), u64 key (layer << 32 | expert, valid while tag is)
//   [16 * slots, + 4 * layers * n_expert)   per bundle (layer index in the class's layer list
//                          × n_expert + expert): u32 slot + 1 where it is resident, 0 otherwise
//                          (a hint: the tag and key decide)
//
// The protocol (hazard pointers; every access below is atomic):
//   client pin:   s = hint; t = tag[s] (acquire); key[s] == wanted; pin[s] = t (seq_cst);
//                 tag[s] == t again (seq_cst) — else clear the pin: a miss, ask the daemon.
//   daemon evict: tag[s] = 0 (seq_cst); any session's pin[s] == tag's old value → restore the
//                 tag and pick another victim; else the slot may be refilled.
// Either the client's re-read sees the tag cleared, or the daemon's scan sees the pin: a pinned
// occupant is never overwritten. The daemon writes a key only while its tag is 0, and
// generations never repeat, so a matching re-read also means the key belonged to that tag.
//
// Only where the client reads slots with the CPU and gives them back when its reads returned
// (the host device): a pin is cleared by the client's release, with no done fence to wait for.
//
// Trust: pin words are the client's to scribble on. A hostile client can only keep slots from
// being evicted (as holding leases does); it cannot make the daemon read or write out of bounds.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "engine/bundle.h"

namespace expertd {

namespace residency {

inline uint64_t TableBytes(uint32_t slots, uint32_t layers, uint32_t n_expert) {
  return uint64_t{16} * slots + uint64_t{4} * layers * n_expert;
}
inline uint64_t Key(uint32_t layer, uint32_t expert) { return (uint64_t{layer} << 32) | expert; }

// A view of one class's table in this process (the daemon's writable mapping, or the client's
// read-only one; the client only loads).
struct Table {
  uint64_t* words = nullptr;  // 2 per slot
  uint32_t* hints = nullptr;  // layers * n_expert
  uint32_t slots = 0;
  uint32_t layers = 0;
  uint32_t n_expert = 0;

  static Table At(uint8_t* base, uint32_t slots, uint32_t layers, uint32_t n_expert) {
    return Table{reinterpret_cast<uint64_t*>(base),
                 reinterpret_cast<uint32_t*>(base + uint64_t{16} * slots), slots, layers,
                 n_expert};
  }
  std::atomic_ref<uint64_t> tag(uint32_t slot) const { return std::atomic_ref(words[2 * slot]); }
  std::atomic_ref<uint64_t> key(uint32_t slot) const {
    return std::atomic_ref(words[2 * slot + 1]);
  }
  std::atomic_ref<uint32_t> hint(uint32_t layer_index, uint32_t expert) const {
    return std::atomic_ref(hints[uint64_t{layer_index} * n_expert + expert]);
  }
};

// The client's pin of (layer_index, expert) whose key is `key`, through its pin word array
// `pins` (this class's part of the session's row). Returns {slot, generation} on a hit with the
// pin set; {kNoSlot, 0} on a miss with nothing left pinned. `already` says the caller holds a
// pin on the slot it finds (its own count): the word is not written again then.
struct Pinned {
  SlotId slot = kNoSlot;
  uint64_t generation = 0;
};
template <typename HeldFn>
Pinned TryPin(const Table& t, uint64_t* pins, uint32_t layer_index, uint32_t expert, uint64_t key,
              HeldFn held) {
  if (layer_index >= t.layers || expert >= t.n_expert) return {};
  const uint32_t h = t.hint(layer_index, expert).load(std::memory_order_acquire);
  if (h == 0 || h > t.slots) return {};
  const SlotId s = h - 1;
  const uint64_t tag = t.tag(s).load(std::memory_order_acquire);
  if (tag == 0 || t.key(s).load(std::memory_order_acquire) != key) return {};
  const bool mine = held(s, tag);
  if (!mine) std::atomic_ref(pins[s]).store(tag, std::memory_order_seq_cst);
  if (t.tag(s).load(std::memory_order_seq_cst) != tag) {
    if (!mine) std::atomic_ref(pins[s]).store(0, std::memory_order_release);
    return {};
  }
  return {s, tag};
}

inline void Unpin(uint64_t* pins, SlotId slot) {
  std::atomic_ref(pins[slot]).store(0, std::memory_order_release);
}

}  // namespace residency

// The daemon's side of one slot class's table and of every session's pin row for that class.
// The slot pool calls it under its own lock; it takes only its own (rows), never the pool's.
// Thread-safe.
class ResidencyBoard {
 public:
  // `table` must hold residency::TableBytes(slots, layers.size(), n_expert) zeroed bytes and
  // outlive the board. `layers` is the class's layer list (blocks), in the order clients index.
  ResidencyBoard(uint8_t* table, uint32_t slots, std::vector<uint32_t> layers, uint32_t n_expert);

  // The slot became resident with `key` at `generation` (its bytes are ready).
  void Publish(SlotId slot, const BundleKey& key, uint64_t generation);
  // Before evicting the slot's resident occupant: clears its tag unless a session pins it.
  // False: pinned — the tag is restored and the slot must not be evicted now.
  bool TryRetire(SlotId slot);
  // The occupant left (after a TryRetire that succeeded, or a failed fill): its hint goes.
  void Unpublish(SlotId slot, const BundleKey& key);

  // A session's pin words for this class (`slots` of them, in memory the session can write,
  // valid until RemovePins). Owners are the caller's ids.
  void AddPins(uint64_t owner, uint64_t* words);
  void RemovePins(uint64_t owner);

  uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  uint32_t slots() const { return table_.slots; }

 private:
  uint32_t LayerIndex(uint32_t layer) const;

  residency::Table table_;
  std::vector<uint32_t> index_of_;  // by block number: its index in the class's layer list
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t*>> rows_;  // guarded by mu_
  std::atomic<uint64_t> refusals_{0};  // evictions refused because a client pinned the victim
};

}  // namespace expertd
