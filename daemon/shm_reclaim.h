// Shared-memory names that dead daemons left behind. The host device's arenas and fence tables
// ("/expertd-<pid>-<pid>-<n>-<random>") and the session lanes
// ("/expertd-lane-<pid>-<n>-<random>") are POSIX shm names that the daemon removes when it ends normally; a daemon that was killed (SIGKILL, OOM,
// abort) cannot, and its slot arenas are most of the machine's memory it used. At start the
// daemon removes every such name whose owner process no longer exists. Names whose pid is alive
// are left alone, even when the pid was reused by another program (a rare leak, never a name
// of a live process removed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace expertd {

struct ReclaimedShm {
  std::vector<std::string> names;  // removed, without the leading '/'
  std::vector<int64_t> pids;       // their owners, once each
  uint64_t bytes = 0;              // their sizes
};

// Scans `dir` (/dev/shm) for names of processes that no longer exist and unlinks them. `self` is never
// treated as dead. Errors (an unreadable folder) leave the result empty.
ReclaimedShm ReclaimStaleSharedMemory(const std::string& dir = "/dev/shm", int64_t self = 0);

// The owner pid a name encodes ("expertd-<pid>-..." or "expertd-lane-<pid>-..."), or 0 when the
// name is not one of the daemon's.
int64_t ShmOwnerPid(const std::string& name);

}  // namespace expertd
