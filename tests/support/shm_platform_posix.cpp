// shm_platform.h on POSIX.
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "support/shm_platform.h"

namespace expertd::testing {

std::string ShmNamePrefix(std::string_view prefix) {
  return absl::StrCat("/", absl::string_view(prefix.data(), prefix.size()), "-", ::getpid(), "-");
}
std::string MissingShmName() { return "/expertd-test-no-such-object"; }
const char* const kOpenByNameCall = "shm_open";
const char* const kNoSuchObjectText = "No such file";
const bool kHandlesCarryIdentity = true;

bool MemoryWritable(const void* p, uint64_t bytes) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  auto covered = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = covered + bytes;
  while (covered < end && std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered || lo > covered) continue;
    if (perms[1] != 'w') return false;
    covered = hi;
  }
  return covered >= end;
}

}  // namespace expertd::testing
