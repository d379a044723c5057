// util/futex.h on Windows. WaitOnAddress wakes waiters of the same process only, so a wait is
// cut into slices of at most kCrossProcessSlice: a waker in another process (which maps the
// word too) is seen within one slice, a waker in this process at once. Named kernel events per
// fence table would wake across processes without the slices (docs/windows.md).
#include <windows.h>

#include <algorithm>

#include "util/futex.h"

namespace expertd {
namespace {

constexpr DWORD kCrossProcessSlice = 1;  // ms

}  // namespace

void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  DWORD ms = kCrossProcessSlice;
  if (timeout != absl::InfiniteDuration()) {
    ms = static_cast<DWORD>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, kCrossProcessSlice));
  }
  WaitOnAddress(word, &expected, sizeof expected, ms);
}

void FutexWakeAll(uint32_t* word) { WakeByAddressAll(word); }

void CpuRelax() { YieldProcessor(); }

}  // namespace expertd
