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
// Sources: several sessions may read one slot, and two processes must never record the same
// event (a later record would hide an earlier one still pending). So each session has its own
// done events — a *source* (a number; 0 is the table's own done events). Per slot the table keeps
// one declaration per source (the latest: a source's records are chained, so its latest record
// covers its earlier ones); a copy that overwrites the slot waits on every source's event, and
// the ready record of the new occupant clears the declarations it covered.
//
// ClientGenerations is the client process's side: it refuses to record done for a generation it
// never waited for.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"

namespace expertd::cuda {

enum class WaitAction {
  kNone,           // nothing to wait for: generation 0, or the client is gone
  kWaitDoneEvent,  // cudaStreamWaitEvent on each declared source's done event (WaitSources)
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

  // The client of `source` declared (on Release) that it recorded the slot's done event after
  // its kernels read `generation`. A declaration at or below the source's current one is ignored
  // (OK); one above ready is FailedPrecondition (nobody can have read what was not granted).
  // Generation 0 is InvalidArgument. `now` (any clock the caller keeps) is when it was declared:
  // a record still pending long after that is the caller's to give up on (WaitDeclarations).
  absl::Status DeclareDoneRecorded(uint32_t slot, uint64_t generation, uint64_t source = 0,
                                   int64_t now = 0);
  // The client of `source` is gone (its session ended, possibly without recording, or its lease
  // was reclaimed): generations up to `generation` need no wait for it, and its declaration for
  // the slot is dropped (its last record may never complete). Same checks as above.
  absl::Status DeclareDoneForced(uint32_t slot, uint64_t generation, uint64_t source = 0);
  // The process behind `source` exited: none of its records needs waiting for, on any slot.
  // Returns how many declarations were dropped.
  uint32_t DropSource(uint64_t source);

  // What a copy must do before overwriting `slot` whose previous occupant was last granted as
  // `generation` (FenceWait::generation).
  WaitAction ForWait(uint32_t slot, uint64_t generation) const;
  // With kWaitDoneEvent: the sources whose done events the copy waits on (ascending).
  std::vector<uint64_t> WaitSources(uint32_t slot) const;
  // The same, each with the `now` of its latest declaration for the slot.
  struct SourceWait {
    uint64_t source = 0;
    int64_t declared_at = 0;
  };
  std::vector<SourceWait> WaitDeclarations(uint32_t slot) const;
  // Declarations held for `source` over all slots (for tests and bookkeeping).
  uint32_t DeclarationsOf(uint64_t source) const;

 private:
  struct Declared {
    uint64_t source = 0;
    uint64_t generation = 0;
    int64_t declared_at = 0;  // when `generation` was declared
  };
  struct Slot {
    uint64_t ready = 0;
    bool recorded = false;
    uint64_t done_event = 0;   // highest generation declared recorded, by any source
    uint64_t done_forced = 0;  // highest generation declared without an event
    std::vector<Declared> declared;  // one per source, ascending by source
  };
  absl::Status CheckDeclaration(uint32_t slot, uint64_t generation) const;
  // Erases the slot's declarations `drop` selects, keeping counts_ in step; returns how many.
  template <typename Pred>
  uint32_t EraseDeclared(Slot& s, Pred drop);
  std::vector<Slot> slots_;
  std::map<uint64_t, uint32_t> counts_;  // declarations held per source (none: no entry)
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
