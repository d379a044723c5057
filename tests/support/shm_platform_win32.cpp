// shm_platform.h on Windows.
#include <windows.h>

#include "absl/strings/str_cat.h"
#include "support/shm_platform.h"

namespace expertd::testing {

std::string ShmNamePrefix(std::string_view prefix) {
  return absl::StrCat("Local\\", absl::string_view(prefix.data(), prefix.size()), "-",
                      GetCurrentProcessId(), "-");
}
std::string MissingShmName() { return "Local\\expertd-test-no-such-object"; }
const char* const kOpenByNameCall = "OpenFileMapping";
const char* const kNoSuchObjectText = "(Windows error 2)";
const bool kHandlesCarryIdentity = false;

bool MemoryWritable(const void* p, uint64_t bytes) {
  constexpr DWORD kWritable =
      PAGE_READWRITE | PAGE_WRITECOPY | PAGE_EXECUTE_READWRITE | PAGE_EXECUTE_WRITECOPY;
  auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = at + bytes;
  while (at < end) {
    MEMORY_BASIC_INFORMATION info{};
    if (VirtualQuery(reinterpret_cast<void*>(at), &info, sizeof info) == 0) return false;
    if (info.State != MEM_COMMIT || (info.Protect & kWritable) == 0) return false;
    at = reinterpret_cast<uintptr_t>(info.BaseAddress) + info.RegionSize;
  }
  return true;
}

}  // namespace expertd::testing
