#include "shm_reclaim.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "util/process.h"

namespace expertd {
namespace {

// True unless no process has `pid` (ours or another user's). A pid reused by another process
// keeps its names: it may be a program using the host device library (tests do), whose names
// must not go.
bool Alive(int64_t pid) { return ProcessExists(pid); }

}  // namespace

int64_t ShmOwnerPid(const std::string& name) {
  std::string_view rest = name;
  for (std::string_view prefix : {"expertd-lane-", "expertd-"}) {
    if (rest.substr(0, prefix.size()) == prefix) {
      rest.remove_prefix(prefix.size());
      const size_t dash = rest.find('-');
      if (dash == std::string_view::npos || dash == 0) return 0;
      int64_t pid = 0;
      if (!absl::SimpleAtoi(absl::string_view(rest.data(), dash), &pid) || pid <= 0) return 0;
      return pid;
    }
  }
  return 0;
}

ReclaimedShm ReclaimStaleSharedMemory(const std::string& dir, int64_t self) {
  ReclaimedShm out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t pid = ShmOwnerPid(name);
    if (pid == 0 || pid == self || Alive(pid)) continue;
    std::error_code size_ec;
    const uintmax_t bytes = std::filesystem::file_size(entry.path(), size_ec);
    if (::shm_unlink(("/" + name).c_str()) != 0 &&
        !std::filesystem::remove(entry.path(), size_ec)) {
      continue;  // another user's name we may not remove
    }
    out.names.push_back(name);
    out.bytes += size_ec ? 0 : bytes;
    if (std::find(out.pids.begin(), out.pids.end(), pid) == out.pids.end()) out.pids.push_back(pid);
  }
  return out;
}

}  // namespace expertd
