#include "engine/residency.h"

#include <algorithm>

namespace expertd {

ResidencyBoard::ResidencyBoard(uint8_t* table, uint32_t slots, std::vector<uint32_t> layers,
                               uint32_t n_expert)
    : table_(residency::Table::At(table, slots, static_cast<uint32_t>(layers.size()), n_expert)),
      index_of_(layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end()) + 1,
                table_.layers) {
  for (uint32_t i = 0; i < layers.size(); ++i) index_of_[layers[i]] = i;
}

uint32_t ResidencyBoard::LayerIndex(uint32_t layer) const {
  return layer < index_of_.size() ? index_of_[layer] : table_.layers;  // layers: not here
}

void ResidencyBoard::Publish(SlotId slot, const BundleKey& key, uint64_t generation) {
  const uint32_t index = LayerIndex(key.layer);
  if (slot >= table_.slots || index >= table_.layers || key.expert >= table_.n_expert) return;
  table_.key(slot).store(residency::Key(key.layer, key.expert), std::memory_order_relaxed);
  table_.tag(slot).store(generation, std::memory_order_release);
  table_.hint(index, key.expert).store(slot + 1, std::memory_order_release);
}

bool ResidencyBoard::TryRetire(SlotId slot) {
  if (slot >= table_.slots) return true;
  const uint64_t tag = table_.tag(slot).load(std::memory_order_relaxed);
  if (tag == 0) return true;  // never published (a prefetch or fill that is not resident)
  table_.tag(slot).store(0, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [owner, words] : rows_) {
    if (std::atomic_ref(words[slot]).load(std::memory_order_seq_cst) == tag) {
      table_.tag(slot).store(tag, std::memory_order_release);
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

void ResidencyBoard::Unpublish(SlotId slot, const BundleKey& key) {
  if (slot >= table_.slots) return;
  table_.tag(slot).store(0, std::memory_order_seq_cst);
  const uint32_t index = LayerIndex(key.layer);
  if (index >= table_.layers || key.expert >= table_.n_expert) return;
  std::atomic_ref<uint32_t> hint = table_.hint(index, key.expert);
  uint32_t expected = slot + 1;
  hint.compare_exchange_strong(expected, 0, std::memory_order_release);
}

void ResidencyBoard::AddPins(uint64_t owner, uint64_t* words) {
  std::lock_guard<std::mutex> lock(mu_);
  rows_.emplace_back(owner, words);
}

void ResidencyBoard::RemovePins(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(rows_, [&](const auto& r) { return r.first == owner; });
}

}  // namespace expertd
