// Generation bookkeeping that makes CUDA IPC events safe to rely on (pure logic, no CUDA header;
// unit-tested without a GPU).
//
// An IPC event only says "the most recent record completed", and an event that was never
// recorded counts as complete: cudaStreamWaitEvent on it returns at once. So the daemon must not
// let a copy that overwrites slot s wait on s's *done* event for generation g unless the client
// has said (Release) that it recorded done after reading generation g — before that, the event's
// latest record belongs to an older grant, or to nothing, and the wait would pass while the
// client still reads. This class holds per slot:
//   ready         the generation the daemon's latest ready record (or a re-grant) stands for;
//   done_event    the highest generation the client declared it recorded done for;
//   done_forced   the highest generation declared done without an event (the client is gone);
// and decides what a copy must do for a FenceWait. Generations only grow; stale declarations are
// ignored. Not thread-safe: the owner (CudaFenceTable) holds a mutex around it.
//
// ClientGenerations is the client process's side: it refuses to record done for a generation it
// never waited for.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace expertd::cuda {

enum class WaitAction {
  kNone,           // nothing to wait for: generation 0, or the client is gone
  kWaitDoneEvent,  // cudaStreamWaitEvent on the slot's done event (its latest record covers g)
  kNotDeclared,    // the client has not declared done for g yet: hold the copy on the CPU
};

class EventGenerations {
 public:
  explicit EventGenerations(uint32_t n_slots) : slots_(n_slots) {}
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }

  // The counters FenceTable::ready()/done() report (done = max of both declarations). 0 for a
  // slot outside the table.
  uint64_t ready(uint32_t slot) const;
  uint64_t done(uint32_t slot) const;
  // True once a copy recorded the slot's ready event (a record exists at all).
  bool ready_recorded(uint32_t slot) const;

  // A copy is about to record the slot's ready event for `generation`: OK when generation is at
  // least ready (equal records again, harmless), then ready = generation; FailedPrecondition
  // when it is lower (nothing changes: the record must not be made).
  absl::Status BeginReadyRecord(uint32_t slot, uint64_t generation);
  // A re-grant of a resident bundle: ready = generation without a record (its bytes landed
  // before — the engine grants a resident bundle only after its fill completed). Lower is
  // FailedPrecondition, equal a no-op.
  absl::Status AdvanceReady(uint32_t slot, uint64_t generation);

  // The client declared (on Release) that it recorded the slot's done event after its kernels
  // read `generation`. A declaration at or below the current one is ignored (OK); one above
  // ready is FailedPrecondition (nobody can have read what was not granted). Generation 0 is
  // InvalidArgument.
  absl::Status DeclareDoneRecorded(uint32_t slot, uint64_t generation);
  // The client is gone (its session ended, possibly without recording): generations up to
  // `generation` need no wait. Same checks as DeclareDoneRecorded.
  absl::Status DeclareDoneForced(uint32_t slot, uint64_t generation);

  // What a copy must do before overwriting `slot` whose previous occupant was last granted as
  // `generation` (FenceWait::generation).
  WaitAction ForWait(uint32_t slot, uint64_t generation) const;

 private:
  struct Slot {
    uint64_t ready = 0;
    bool recorded = false;
    uint64_t done_event = 0;
    uint64_t done_forced = 0;
  };
  absl::Status CheckDeclaration(uint32_t slot, uint64_t generation) const;
  std::vector<Slot> slots_;
};

class ClientGenerations {
 public:
  explicit ClientGenerations(uint32_t n_slots) : waited_(n_slots, 0) {}
  uint32_t size() const { return static_cast<uint32_t>(waited_.size()); }
  // Before a stream waits on the slot's ready event for a grant of `generation`: InvalidArgument
  // for generation 0 or a slot outside the table.
  absl::Status OnWaitReady(uint32_t slot, uint64_t generation);
  // Before recording done for `generation`: FailedPrecondition when this process never waited
  // for that generation of the slot (it cannot have read it). Lower generations than one already
  // recorded are allowed: another lease of the same slot may finish later.
  absl::Status OnRecordDone(uint32_t slot, uint64_t generation) const;

 private:
  std::vector<uint64_t> waited_;  // highest generation waited for, per slot
};

}  // namespace expertd::cuda
