// util/process.h on POSIX: getpid, kill(pid, 0), a Linux pidfd for the watch (none where the
// kernel lacks pidfd_open), posix_spawn and waitpid for children.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/process.h"
#include "util/status.h"

extern char** environ;

namespace expertd {

int64_t CurrentProcessId() { return ::getpid(); }

bool ProcessExists(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

ProcessWatch ProcessWatch::Open(int64_t pid) {
#ifdef SYS_pidfd_open
  if (pid <= 0) return ProcessWatch();
  const long fd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  return fd < 0 ? ProcessWatch() : ProcessWatch(static_cast<intptr_t>(fd));
#else
  (void)pid;
  return ProcessWatch();
#endif
}

ProcessWatch::ProcessWatch(ProcessWatch&& other) noexcept
    : handle_(std::exchange(other.handle_, kNone)) {}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

ProcessWatch::~ProcessWatch() {
  if (valid()) ::close(static_cast<int>(handle_));
}

// A pidfd polls readable once its process has exited.
bool ProcessWatch::Exited() const {
  if (!valid()) return false;
  pollfd p{static_cast<int>(handle_), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("ChildProcess::Start: no program");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, args.data(), environ);
  if (err != 0) {
    return ErrnoError(ErrorKind::kIo, absl::StrCat("cannot start ", argv[0]), err);
  }
  return ChildProcess(pid, -1);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), handle_(other.handle_), waited_(std::exchange(other.waited_, true)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(handle_, other.handle_);
  std::swap(waited_, other.waited_);
  return *this;
}

ChildProcess::~ChildProcess() {
  if (waited_) return;
  Kill();
  (void)Wait();
}

absl::StatusOr<int> ChildProcess::Wait() {
  if (waited_) return absl::FailedPreconditionError(absl::StrCat("process ", pid_, " was reaped"));
  int status = 0;
  pid_t got;
  do {
    got = ::waitpid(static_cast<pid_t>(pid_), &status, 0);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return ErrnoError(ErrorKind::kIo, absl::StrCat("waitpid ", pid_), errno);
  waited_ = true;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

void ChildProcess::Kill() {
  if (!waited_) ::kill(static_cast<pid_t>(pid_), SIGKILL);
}

}  // namespace expertd
