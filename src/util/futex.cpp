#include "util/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <ctime>
#include <thread>

namespace expertd {

void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts = absl::ToTimespec(timeout);
  const bool infinite = timeout == absl::InfiniteDuration();
  if (::syscall(SYS_futex, word, FUTEX_WAIT, expected, infinite ? nullptr : &ts, nullptr, 0) != 0 &&
      errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // no futex: degrade to polling
  }
}

void FutexWakeAll(uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace expertd
