// Cross-process wait and wake on a 32-bit word in shared memory, and the spin-loop hint. Used by
// the host device's fence words and the session lanes. Linux (futex.cpp): a shared futex — not
// FUTEX_PRIVATE — so a waiter and a waker in different processes that map the same page meet.
// Windows (futex_win32.cpp): WaitOnAddress, in slices of 1 ms for wakers in other processes.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace expertd {

// Sleeps while *word == expected, up to `timeout` (InfiniteDuration: no limit). Returns early on
// a wake, a signal, or when the word already differs. Without futex support it sleeps ~50 µs, so
// callers that loop on their condition degrade to polling.
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout);
// Wakes every waiter on `word`.
void FutexWakeAll(uint32_t* word);
// One spin-loop pause (x86 pause, arm yield).
void CpuRelax();

}  // namespace expertd
