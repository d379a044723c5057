// The host device's shared memory on Windows: each file mapping's DACL (who may open it for
// what), the write access nobody gets to arenas, Unlink, and the names' random part.
#include <windows.h>
// After windows.h:
#include <aclapi.h>
#include <gtest/gtest.h>
#include <sddl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/host/host_device.h"
#include "support/shm_platform.h"
#include "support/test_support.h"
#include "util/win32_text.h"

namespace expertd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr char kUsers[] = "S-1-5-32-545";  // BUILTIN\Users, a client group for the test
constexpr char kOwnerRights[] = "S-1-3-4";

template <typename T>
T Must(absl::StatusOr<T> v) {
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return std::move(*v);
}

std::string SidText(PSID sid) {
  char* text = nullptr;
  if (!ConvertSidToStringSidA(sid, &text)) return "?";
  std::string out(text);
  LocalFree(text);
  return out;
}

std::string UserSid() {
  HANDLE token = nullptr;
  EXPECT_TRUE(OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &token));
  alignas(8) char buf[256];
  DWORD n = 0;
  EXPECT_TRUE(GetTokenInformation(token, TokenUser, buf, sizeof buf, &n));
  CloseHandle(token);
  return SidText(reinterpret_cast<TOKEN_USER*>(buf)->User.Sid);
}

// The allowed entries of a named object's DACL: SID → access mask. Fails the test on a deny
// entry or an inherited one (the DACL is protected and says everything itself).
std::vector<std::pair<std::string, DWORD>> Dacl(const std::string& name) {
  std::vector<std::pair<std::string, DWORD>> out;
  HANDLE h = OpenFileMappingW(READ_CONTROL, FALSE, win32::Wide(name).c_str());
  EXPECT_NE(h, nullptr) << name << ": " << GetLastError();
  if (h == nullptr) return out;
  PACL dacl = nullptr;
  PSECURITY_DESCRIPTOR sd = nullptr;
  EXPECT_EQ(GetSecurityInfo(h, SE_KERNEL_OBJECT, DACL_SECURITY_INFORMATION, nullptr, nullptr, &dacl,
                            nullptr, &sd),
            static_cast<DWORD>(ERROR_SUCCESS));
  CloseHandle(h);
  for (DWORD i = 0; dacl != nullptr && i < dacl->AceCount; ++i) {
    void* ace = nullptr;
    if (!GetAce(dacl, i, &ace)) continue;
    auto* header = static_cast<ACE_HEADER*>(ace);
    EXPECT_EQ(header->AceType, ACCESS_ALLOWED_ACE_TYPE) << name;
    EXPECT_EQ(header->AceFlags & INHERITED_ACE, 0) << name;
    auto* allowed = static_cast<ACCESS_ALLOWED_ACE*>(ace);
    out.emplace_back(SidText(&allowed->SidStart), allowed->Mask);
  }
  if (sd != nullptr) LocalFree(sd);
  return out;
}

DWORD MaskFor(const std::vector<std::pair<std::string, DWORD>>& dacl, const std::string& sid) {
  DWORD mask = 0;
  for (const auto& [who, access] : dacl) {
    if (who == sid) mask |= access;
  }
  return mask;
}

constexpr DWORD kRead = SECTION_QUERY | SECTION_MAP_READ | READ_CONTROL;

// shm_mode 0660 with a client group: as the mode on POSIX, the daemon's user may read and write,
// the group may write only what clients write (a shared segment such as a session lane), never
// arenas or tables.
TEST(HostDeviceWin32Test, EveryObjectsDaclSaysWhoMayMapItForWhat) {
  HostDeviceOptions o;
  o.shm_prefix = "expertd-test";
  o.shm_mode = 0660;
  o.client_sid = kUsers;
  auto device = Must(MakeHostDevice(o));
  auto arena = Must(device->AllocateArena(kMiB, "a"));
  auto fences = Must(device->CreateFences(8));
  auto segment = Must(CreateSharedSegment(o, "lane", 65536));
  const std::string user = UserSid();
  const std::string an = Must(arena->Export()).handle.shm_name;
  const std::string fn = Must(fences->Export()).handle.shm_name;
  const std::string sn = segment->handle().shm_name;
  for (const std::string& name : {an, fn}) {
    const auto dacl = Dacl(name);
    EXPECT_EQ(MaskFor(dacl, user), kRead | SECTION_MAP_WRITE) << name;
    EXPECT_EQ(MaskFor(dacl, kUsers), kRead) << name;
    EXPECT_EQ(MaskFor(dacl, kOwnerRights), static_cast<DWORD>(READ_CONTROL)) << name;
    EXPECT_EQ(dacl.size(), 3u) << name;
  }
  const auto lane = Dacl(sn);
  EXPECT_EQ(MaskFor(lane, user), kRead | SECTION_MAP_WRITE);
  EXPECT_EQ(MaskFor(lane, kUsers), kRead | SECTION_MAP_WRITE);

  // The default mode (0600) names the daemon's user alone; 0400 gives it read access only.
  HostDeviceOptions plain;
  plain.shm_prefix = "expertd-test";
  auto plain_device = Must(MakeHostDevice(plain));
  auto plain_arena = Must(plain_device->AllocateArena(kMiB, "p"));
  const auto only = Dacl(Must(plain_arena->Export()).handle.shm_name);
  EXPECT_EQ(MaskFor(only, user), kRead | SECTION_MAP_WRITE);
  EXPECT_EQ(MaskFor(only, kUsers), 0u);
  EXPECT_EQ(only.size(), 2u);
  plain.shm_mode = 0400;
  auto read_device = Must(MakeHostDevice(plain));
  auto read_arena = Must(read_device->AllocateArena(kMiB, "r"));
  EXPECT_EQ(MaskFor(Dacl(Must(read_arena->Export()).handle.shm_name), user), kRead);

  EXPECT_EQ(MakeHostDevice({.client_sid = "S-1-5-32-545)(A;;GA;;;WD"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Under mode 0400 nobody opens a named arena or table for writing, the daemon's own user
// included; an anonymous one cannot be duplicated writable out of the daemon (its exported
// handle has read access only), whatever the mode. Reading works either way; the daemon's own
// mapping writes.
TEST(HostDeviceWin32Test, ArenasAndTablesRefuseWriteOpens) {
  for (const auto backing :
       {HostDeviceOptions::Backing::kShmOpen, HostDeviceOptions::Backing::kMemfd}) {
    HostDeviceOptions o;
    o.shm_prefix = "expertd-test";
    o.backing = backing;
    o.shm_mode = backing == HostDeviceOptions::Backing::kShmOpen ? 0400 : 0600;
    auto device = Must(MakeHostDevice(o));
    auto arena = Must(device->AllocateArena(kMiB, "a"));
    auto fences = Must(device->CreateFences(4));
    const ArenaExport ae = Must(arena->Export());
    const FenceExport fe = Must(fences->Export());
    if (backing == HostDeviceOptions::Backing::kShmOpen) {
      for (const std::string& name : {ae.handle.shm_name, fe.handle.shm_name}) {
        EXPECT_EQ(OpenFileMappingW(FILE_MAP_WRITE, FALSE, win32::Wide(name).c_str()), nullptr)
            << name;
        EXPECT_EQ(GetLastError(), static_cast<DWORD>(ERROR_ACCESS_DENIED)) << name;
        HANDLE r = OpenFileMappingW(FILE_MAP_READ, FALSE, win32::Wide(name).c_str());
        EXPECT_NE(r, nullptr) << name;
        if (r != nullptr) CloseHandle(r);
      }
    } else {
      EXPECT_TRUE(ae.handle.shm_name.empty());
    }
    const auto write_arena = MapSharedSegment(ae.handle, ae.reserved_bytes);
    EXPECT_EQ(write_arena.status().code(), absl::StatusCode::kPermissionDenied)
        << write_arena.status();
    EXPECT_FALSE(MapSharedSegment(fe.handle, fe.segment_bytes).ok());
    const MappedArena mapped = Must(MapArena(ae));
    uint8_t* own = arena->host_write_data();
    own[5] = 9;
    EXPECT_EQ(mapped.data()[5], 9);
  }
}

// Unlink empties the DACL: no later open succeeds, and clients are told the object is gone
// (NotFound), while mappings made before stay valid both ways.
TEST(HostDeviceWin32Test, UnlinkRefusesLaterOpensButKeepsMappings) {
  HostDeviceOptions o;
  o.shm_prefix = "expertd-test";
  auto segment = Must(CreateSharedSegment(o, "lane", 65536));
  ShmMapping mine = Must(MapSharedSegment(segment->handle(), 65536));
  const SharedHandle before = segment->handle();
  segment->Unlink();
  EXPECT_TRUE(segment->handle().shm_name.empty());
  EXPECT_TRUE(testing::IsError(MapSharedSegment(before, 65536).status(),
                               absl::StatusCode::kNotFound, ErrorKind::kMissingFile,
                               {"removed by its owner"}));
  mine.data()[100] = 7;
  EXPECT_EQ(segment->data()[100], 7);
}

// "Local\expertd-test-<pid>-<n>-<16 hex digits>", and two names share no random part.
TEST(HostDeviceWin32Test, NamesAreUnpredictable) {
  HostDeviceOptions o;
  o.shm_prefix = "expertd-test";
  auto device = Must(MakeHostDevice(o));
  auto a = Must(device->AllocateArena(kMiB, "a"));
  auto b = Must(device->AllocateArena(kMiB, "b"));
  const std::string an = Must(a->Export()).handle.shm_name;
  const std::string bn = Must(b->Export()).handle.shm_name;
  ASSERT_EQ(an.rfind(testing::ShmNamePrefix("expertd-test"), 0), 0u) << an;
  const std::string tail = an.substr(an.rfind('-') + 1);
  EXPECT_EQ(tail.size(), 16u) << an;
  EXPECT_EQ(tail.find_first_not_of("0123456789abcdef"), std::string::npos) << an;
  EXPECT_NE(tail, bn.substr(bn.rfind('-') + 1));
}

}  // namespace
}  // namespace expertd
