// What device_test expects of the platform's shared memory (host_shared_memory_posix.cpp or
// host_shared_memory_win32.cpp): names, the calls errors name, and a probe of a mapping's
// protection (also engine_test's). Defined in shm_platform_posix.cpp or shm_platform_win32.cpp
// (tests/CMakeLists.txt picks one).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace expertd::testing {

// How every name the host device gives with `prefix` starts in this process:
// "/<prefix>-<pid>-" (POSIX), "Local\<prefix>-<pid>-" (Windows).
std::string ShmNamePrefix(std::string_view prefix);
// A well-formed name nobody created.
std::string MissingShmName();
// The call that opens a name, and the text its "no such object" error carries.
extern const char* const kOpenByNameCall;
extern const char* const kNoSuchObjectText;
// Whether a handle carries the object's identity (st_dev, st_ino), which a client checks.
extern const bool kHandlesCarryIdentity;
// Whether this process may write every page of [p, p + bytes) (/proc/self/maps, VirtualQuery).
bool MemoryWritable(const void* p, uint64_t bytes);

}  // namespace expertd::testing
