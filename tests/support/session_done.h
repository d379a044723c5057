// What a host session's client does to signal done, for the daemon's tests and fuzzer: map the
// session's own done words from the handles it was given and store done for granted slots.
#pragma once

#include "absl/status/status.h"
#include "device/host/host_device.h"
#include "served_model.h"
#include "sessions.h"
#include "util/status.h"

namespace expertd::testing {

inline absl::Status SignalDoneAsClient(const Session& session, uint32_t slot_class, SlotId slot,
                                       uint64_t generation) {
  const std::vector<v1::SlotClassHandles> handles = session.Handles();
  if (slot_class >= handles.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no slot class ", slot_class));
  }
  ASSIGN_OR_RETURN(MappedFences fences, MapFences(FromFenceHandle(handles[slot_class].fences())));
  return fences.SignalDone(slot, generation);
}

inline absl::Status SignalDoneAsClient(const Session& session, const v1::Grant& grant) {
  for (const v1::GrantedSlot& s : grant.slots()) {
    RETURN_IF_ERROR(SignalDoneAsClient(session, s.slot_class(), s.slot(), s.generation()));
  }
  return absl::OkStatus();
}

}  // namespace expertd::testing
