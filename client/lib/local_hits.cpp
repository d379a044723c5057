// See local_hits.h.
#include "local_hits.h"

#include "absl/strings/str_cat.h"

namespace expertd::client::internal {

std::unique_ptr<LocalHits> LocalHits::Make(const v1::OpenSessionResponse& info,
                                           const std::vector<SlotClassView>& classes,
                                           std::span<uint64_t> pins, int cuda_device) {
  const bool cuda = info.device_kind() == "cuda";
  if ((!cuda && info.device_kind() != "host") || (cuda && cuda_device < 0) || pins.empty() ||
      classes.empty()) {
    return nullptr;
  }
  std::unique_ptr<LocalHits> hits(new LocalHits());
  hits->cuda_device_ = cuda ? cuda_device : -1;
  hits->max_experts_ = info.limits().max_experts_per_acquire();
  for (uint32_t c = 0; c < classes.size(); ++c) {
    const SlotClassView& v = classes[c];
    const uint32_t slots = info.slot_classes(static_cast<int>(c)).slots();
    if (v.residency == nullptr || v.pin_base + slots > pins.size()) return nullptr;
    Class k;
    k.view = &v;
    // The client only loads through the table; Table's words are mutable for the daemon's sake.
    k.table = residency::Table::At(const_cast<uint8_t*>(v.residency->data().data()), slots,
                                   static_cast<uint32_t>(v.layers.size()), v.n_expert);
    k.pins = pins.data() + v.pin_base;
    k.counts.assign(slots, 0);
    k.generations.assign(slots, 0);
    hits->classes_.push_back(std::move(k));
    for (uint32_t i = 0; i < v.layers.size(); ++i) hits->layer_class_[v.layers[i]] = {c, i};
  }
  return hits;
}

std::optional<Lease> LocalHits::TryLease(uint32_t layer, std::span<const uint32_t> experts) {
  const auto where = layer_class_.find(layer);
  if (where == layer_class_.end() || experts.empty() || experts.size() > max_experts_) {
    return std::nullopt;
  }
  const auto [cls, index] = where->second;
  Class& c = classes_[cls];
  Lease lease;
  lease.layer = layer;
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.empty()) Reap();
  for (uint32_t e : experts) {
    const residency::Pinned p =
        residency::TryPin(c.table, c.pins, index, e, residency::Key(layer, e),
                          [&](SlotId s, uint64_t) { return c.counts[s] > 0; });
    // A slot this process pins for an older occupant cannot hold this one: a miss.
    if (p.slot == kNoSlot || (c.counts[p.slot] > 0 && c.generations[p.slot] != p.generation)) {
      Undo(lease);
      return std::nullopt;
    }
    if (c.counts[p.slot]++ == 0) c.generations[p.slot] = p.generation;
    SlotView v;
    v.expert = e;
    v.slot_class = cls;
    v.slot = p.slot;
    v.generation = p.generation;
    v.hit = true;
    const absl::Status mapped = AddSlotProjections(*c.view, cuda_device_ >= 0, p.slot, &v);
    lease.slots.push_back(std::move(v));  // counted above, so Undo must see it
    if (!mapped.ok()) {
      Undo(lease);
      return std::nullopt;
    }
  }
  lease.id = kLeaseBit | next_++;
  live_.insert(lease.id);
  return lease;
}

void LocalHits::Undo(const Lease& partial) {
  for (const SlotView& v : partial.slots) {
    Class& c = classes_[v.slot_class];
    if (--c.counts[v.slot] == 0) residency::Unpin(c.pins, v.slot);
  }
}

absl::Status LocalHits::Release(const Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  // Each slot must hold at least the pins this lease counts on it (a lease may name one slot
  // twice): anything else is a lease released twice, or not served here.
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, uint32_t> wanted;
  for (const SlotView& v : lease.slots) ++wanted[{v.slot_class, v.slot}];
  for (const auto& [where, n] : wanted) {
    const auto [cls, slot] = where;
    if (!live_.contains(lease.id) || cls >= classes_.size() ||
        slot >= classes_[cls].counts.size() || classes_[cls].counts[slot] < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease ", lease.id, " is not pinned in this session (released twice?)"));
    }
  }
  live_.erase(lease.id);
  if (auto m = marks_.find(lease.id); m != marks_.end()) {
    // Its kernels may still be reading: the pins stay until the marks complete.
    pending_.push_back({lease, std::move(m->second)});
    marks_.erase(m);
  } else {
    Undo(lease);
  }
  if (!pending_.empty()) Reap();
  return absl::OkStatus();
}

absl::Status LocalHits::RecordDone(const Lease& lease, void* cuda_stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.contains(lease.id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease ", lease.id, " is not pinned in this session (released already?)"));
  }
  if (!pending_.empty()) Reap();
  absl::StatusOr<std::unique_ptr<CudaStreamMark>> mark = TakeMark();
  if (!mark.ok()) return mark.status();
  if (absl::Status st = (*mark)->Record(cuda_stream); !st.ok()) {
    spare_.push_back(*std::move(mark));
    return st;
  }
  marks_[lease.id].push_back(*std::move(mark));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaStreamMark>> LocalHits::TakeMark() {
  if (cuda_device_ < 0) return absl::FailedPreconditionError("not a CUDA session");
  if (spare_.empty()) return MakeCudaStreamMarkIfBuilt(cuda_device_);
  std::unique_ptr<CudaStreamMark> m = std::move(spare_.back());
  spare_.pop_back();
  return m;
}

void LocalHits::Reap() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    bool done = true;
    for (const std::unique_ptr<CudaStreamMark>& m : p.marks) {
      const absl::StatusOr<bool> d = m->Done();
      if (d.ok() && !*d) {
        done = false;
        break;
      }
    }
    if (done) {
      Undo(p.lease);
      for (std::unique_ptr<CudaStreamMark>& m : p.marks) spare_.push_back(std::move(m));
    } else if (kept != i) {
      pending_[kept++] = std::move(p);
    } else {
      ++kept;
    }
  }
  pending_.resize(kept);
}

size_t LocalHits::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Reap();
      if (pending_.empty() || absl::Now() >= deadline) return pending_.size();
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

}  // namespace expertd::client::internal
