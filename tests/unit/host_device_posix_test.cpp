// The host device's shared memory on POSIX: the modes of named objects, the other users who may
// open them, and the names' random part.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "device/host/host_device.h"

namespace expertd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

template <typename T>
T Must(absl::StatusOr<T> v) {
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return std::move(*v);
}

std::unique_ptr<Device> NewDevice(HostDeviceOptions options) {
  return Must(MakeHostDevice(std::move(options)));
}

// With group access (shm_mode 0660) an arena still gives the group only read access: clients
// never write slots. Fence tables keep the mode (clients store their done words there). Names
// end in random bits: nobody can create one first to keep the daemon from starting.
TEST(HostDeviceTest, ArenasAreReadOnlyForOtherUsersAndNamesUnpredictable) {
  HostDeviceOptions o;
  o.shm_prefix = "expertd-test";
  o.shm_mode = 0660;
  auto device = NewDevice(o);
  auto a = Must(device->AllocateArena(kMiB, "a"));
  auto b = Must(device->AllocateArena(kMiB, "b"));
  auto fences = Must(device->CreateFences(8));
  auto session = Must(device->CreateSessionFences(*fences));
  const std::string an = Must(a->Export()).handle.shm_name;
  const std::string bn = Must(b->Export()).handle.shm_name;
  const std::string fn = Must(fences->Export()).handle.shm_name;
  const FenceExport session_export = Must(session->Export());
  ASSERT_TRUE(session_export.session_done.has_value());
  EXPECT_EQ(session_export.handle.shm_name, fn);
  // A session's done words have no name: only a descriptor reaches them.
  EXPECT_TRUE(session_export.session_done->shm_name.empty());
  const std::string dn = absl::StrCat("/proc/", getpid(), "/fd/", session_export.session_done->fd);
  const auto mode = [](const std::string& name) {
    struct stat st {};
    EXPECT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0) << name;
    return st.st_mode & 0777;
  };
  EXPECT_EQ(mode(an), 0640u);
  EXPECT_EQ(mode(fn), 0640u);  // the table: only the daemon writes it
  // "/expertd-test-<pid>-<n>-<16 hex digits>", and two names share no random part.
  const std::string prefix = absl::StrCat("/expertd-test-", getpid(), "-");
  ASSERT_EQ(an.rfind(prefix, 0), 0u) << an;
  const std::string tail = an.substr(an.rfind('-') + 1);
  EXPECT_EQ(tail.size(), 16u) << an;
  EXPECT_EQ(tail.find_first_not_of("0123456789abcdef"), std::string::npos) << an;
  EXPECT_NE(tail, bn.substr(bn.rfind('-') + 1));
  if (geteuid() != 0) return;  // the rest needs a second user
  // Another user in the object's group: may read the arena, may not write it.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct stat st {};
    if (stat(("/dev/shm" + an).c_str(), &st) != 0) _exit(10);
    const gid_t g = st.st_gid;
    if (setgroups(1, &g) != 0 || setgid(g) != 0 || setuid(65534) != 0) _exit(11);
    const int ro = shm_open(an.c_str(), O_RDONLY, 0);
    if (ro < 0) _exit(12);
    close(ro);
    const int rw = shm_open(an.c_str(), O_RDWR, 0);
    if (rw >= 0 || errno != EACCES) _exit(13);
    const int frw = shm_open(fn.c_str(), O_RDWR, 0);  // the table: read-only for clients
    if (frw >= 0 || errno != EACCES) _exit(14);
    const int fro = shm_open(fn.c_str(), O_RDONLY, 0);
    if (fro < 0) _exit(15);
    close(fro);
    // Another user cannot reach a session's done words through the daemon's descriptor.
    const int drw = open(dn.c_str(), O_RDWR);
    if (drw >= 0 || errno != EACCES) _exit(16);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10 stat, 11 change user, 12 read refused, 13 write allowed, 14 table writable, "
         "15 table unreadable, 16 another session's done words reachable";
}

}  // namespace
}  // namespace expertd
