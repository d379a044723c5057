// Vocabulary shared by the engine: bundles are keyed (layer, expert), slots are indexes into a
// slot class's arenas.
#pragma once

#include <cstdint>
#include <functional>

namespace expertd {

// One expert bundle: all projections of expert `expert` of MoE layer `layer` (the block number N
// of blk.N). The cache unit.
struct BundleKey {
  uint32_t layer = 0;
  uint32_t expert = 0;
  friend bool operator==(const BundleKey&, const BundleKey&) = default;
  friend auto operator<=>(const BundleKey&, const BundleKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BundleKey& k) {
    return H::combine(std::move(h), k.layer, k.expert);
  }
};

// An index into one slot pool (one slot class): slot i holds a bundle at arena offset
// i * slot_stride for every projection arena of the class.
using SlotId = uint32_t;
inline constexpr SlotId kNoSlot = ~SlotId{0};

}  // namespace expertd
