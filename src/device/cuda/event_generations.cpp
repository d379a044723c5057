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

absl::Status EventGenerations::DeclareDoneRecorded(uint32_t slot, uint64_t generation) {
  RETURN_IF_ERROR(CheckDeclaration(slot, generation));
  Slot& s = slots_[slot];
  s.done_event = std::max(s.done_event, generation);
  return absl::OkStatus();
}

absl::Status EventGenerations::DeclareDoneForced(uint32_t slot, uint64_t generation) {
  RETURN_IF_ERROR(CheckDeclaration(slot, generation));
  Slot& s = slots_[slot];
  s.done_forced = std::max(s.done_forced, generation);
  return absl::OkStatus();
}

WaitAction EventGenerations::ForWait(uint32_t slot, uint64_t generation) const {
  if (generation == 0) return WaitAction::kNone;
  if (slot >= slots_.size()) return WaitAction::kNotDeclared;
  const Slot& s = slots_[slot];
  // A client that is gone reads nothing; its last record may never complete (a killed
  // context), so waiting on it could stall the copy stream for good.
  if (s.done_forced >= generation) return WaitAction::kNone;
  if (s.done_event >= generation) return WaitAction::kWaitDoneEvent;
  return WaitAction::kNotDeclared;
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
