// Generation bookkeeping for CUDA IPC events (see event_generations.h).
#include "device/cuda/event_generations.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace expertd::cuda {
namespace {

absl::Status BadSlot(uint32_t slot, size_t n) {
  return InvalidError(ErrorKind::kOutOfBounds,
                      absl::StrCat("slot ", slot, " outside a fence table of ", n, " slots"));
}

}  // namespace

template <typename Pred>
uint32_t EventGenerations::EraseDeclared(Slot& s, Pred drop) {
  uint32_t erased = 0;
  for (auto it = s.declared.begin(); it != s.declared.end();) {
    if (!drop(*it)) {
      ++it;
      continue;
    }
    auto c = counts_.find(it->source);
    if (c != counts_.end() && --c->second == 0) counts_.erase(c);
    it = s.declared.erase(it);
    ++erased;
  }
  return erased;
}

uint64_t EventGenerations::ready(uint32_t slot) const {
  return slot < slots_.size() ? slots_[slot].ready : 0;
}

uint64_t EventGenerations::done(uint32_t slot) const {
  return slot < slots_.size() ? std::max(slots_[slot].done_event, slots_[slot].done_forced) : 0;
}

bool EventGenerations::ready_recorded(uint32_t slot) const {
  return slot < slots_.size() && slots_[slot].recorded;
}

absl::Status EventGenerations::BeginReadyRecord(uint32_t slot, uint64_t generation) {
  if (slot >= slots_.size()) return BadSlot(slot, slots_.size());
  Slot& s = slots_[slot];
  if (generation < s.ready) {
    return absl::FailedPreconditionError(
        absl::StrCat("ready[", slot, "] = ", generation, " would lower it from ", s.ready));
  }
  if (generation > s.ready) {
    // This copy waited (earlier on its stream) on every declaration of the previous occupants;
    // a later copy into the slot waits only for readers of this generation and newer.
    EraseDeclared(s, [generation](const Declared& d) { return d.generation < generation; });
  }
  s.ready = generation;
  s.recorded = true;
  return absl::OkStatus();
}

absl::Status EventGenerations::AdvanceReady(uint32_t slot, uint64_t generation) {
  if (slot >= slots_.size()) return BadSlot(slot, slots_.size());
  Slot& s = slots_[slot];
  if (generation < s.ready) {
    return absl::FailedPreconditionError(
        absl::StrCat("ready[", slot, "] = ", generation, " would lower it from ", s.ready));
  }
  s.ready = generation;
  return absl::OkStatus();
}

absl::Status EventGenerations::CheckDeclaration(uint32_t slot, uint64_t generation) const {
  if (slot >= slots_.size()) return BadSlot(slot, slots_.size());
  if (generation == 0) {
    return InvalidError(ErrorKind::kBadValue, absl::StrCat("done[", slot, "] = 0 declared"));
  }
  if (generation > slots_[slot].ready) {
    return absl::FailedPreconditionError(absl::StrCat(
        "done[", slot, "] = ", generation, " declared but ready is only at ", slots_[slot].ready));
  }
  return absl::OkStatus();
}

absl::Status EventGenerations::DeclareDoneRecorded(uint32_t slot, uint64_t generation,
                                                   uint64_t source, int64_t now) {
  RETURN_IF_ERROR(CheckDeclaration(slot, generation));
  Slot& s = slots_[slot];
  s.done_event = std::max(s.done_event, generation);
  auto it = std::lower_bound(s.declared.begin(), s.declared.end(), source,
                             [](const Declared& d, uint64_t v) { return d.source < v; });
  if (it != s.declared.end() && it->source == source) {
    if (generation > it->generation) {
      it->generation = generation;
      it->declared_at = now;  // a newer record is what the copy waits for now
    }
  } else {
    s.declared.insert(it, Declared{source, generation, now});
    ++counts_[source];
  }
  return absl::OkStatus();
}

absl::Status EventGenerations::DeclareDoneForced(uint32_t slot, uint64_t generation,
                                                 uint64_t source) {
  RETURN_IF_ERROR(CheckDeclaration(slot, generation));
  Slot& s = slots_[slot];
  s.done_forced = std::max(s.done_forced, generation);
  // Its record (if any) may belong to a killed context and never complete: do not wait on it.
  EraseDeclared(s, [source](const Declared& d) { return d.source == source; });
  return absl::OkStatus();
}

uint32_t EventGenerations::DropSource(uint64_t source) {
  uint32_t dropped = 0;
  if (!counts_.contains(source)) return 0;
  for (Slot& s : slots_) {
    dropped += EraseDeclared(s, [source](const Declared& d) { return d.source == source; });
  }
  return dropped;
}

std::vector<uint64_t> EventGenerations::WaitSources(uint32_t slot) const {
  std::vector<uint64_t> out;
  if (slot >= slots_.size()) return out;
  for (const Declared& d : slots_[slot].declared) out.push_back(d.source);
  return out;
}

std::vector<EventGenerations::SourceWait> EventGenerations::WaitDeclarations(
    uint32_t slot) const {
  std::vector<SourceWait> out;
  if (slot >= slots_.size()) return out;
  for (const Declared& d : slots_[slot].declared) out.push_back({d.source, d.declared_at});
  return out;
}

uint32_t EventGenerations::DeclarationsOf(uint64_t source) const {
  auto it = counts_.find(source);
  return it == counts_.end() ? 0 : it->second;
}

WaitAction EventGenerations::ForWait(uint32_t slot, uint64_t generation) const {
  if (generation == 0) return WaitAction::kNone;
  if (slot >= slots_.size()) return WaitAction::kNotDeclared;
  const Slot& s = slots_[slot];
  // Nobody has declared the generation yet: the slot is released only after every reader
  // declared (the daemon declares before it gives the lease back), so this is a copy that came
  // too early; hold it on the CPU rather than trust an event whose latest record is older.
  if (std::max(s.done_event, s.done_forced) < generation) return WaitAction::kNotDeclared;
  // Forced declarations dropped their sources: a client that is gone reads nothing, and its
  // last record may never complete (a killed context), so it is not waited on.
  return s.declared.empty() ? WaitAction::kNone : WaitAction::kWaitDoneEvent;
}

absl::Status ClientGenerations::OnWaitReady(uint32_t slot, uint64_t generation) {
  if (slot >= waited_.size()) return BadSlot(slot, waited_.size());
  if (generation == 0) {
    return InvalidError(ErrorKind::kBadValue,
                        absl::StrCat("wait for ready[", slot, "] = 0: grants start at 1"));
  }
  waited_[slot] = std::max(waited_[slot], generation);
  return absl::OkStatus();
}

absl::Status ClientGenerations::OnRecordDone(uint32_t slot, uint64_t generation) const {
  if (slot >= waited_.size()) return BadSlot(slot, waited_.size());
  if (generation == 0 || generation > waited_[slot]) {
    return absl::FailedPreconditionError(absl::StrCat("done[", slot, "] = ", generation,
                                                      " recorded, but this process waited for "
                                                      "ready only up to generation ",
                                                      waited_[slot]));
  }
  return absl::OkStatus();
}

}  // namespace expertd::cuda
