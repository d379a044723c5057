// The platform seam for processes (the files' seam is os_file.h): this process's id, whether a
// process exists, a watch that sees a process exit, and child processes for tests and tools.
// POSIX in process_posix.cpp (pidfd on Linux), Win32 in process_win32.cpp; src/CMakeLists.txt
// picks one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace expertd {

// The calling process's id (getpid, GetCurrentProcessId).
int64_t CurrentProcessId();

// False only when no process has `pid` now; a process of another user, which this one may not
// signal or open, exists. (A pid can be reused: see ProcessWatch for a process's own exit.)
bool ProcessExists(int64_t pid);

// Watches one process for its exit through a handle on that process (a Linux pidfd, a Windows
// process handle), so a pid reused later is never mistaken for it. Move-only.
class ProcessWatch {
 public:
  ProcessWatch() = default;
  // A watch on `pid`; invalid (Exited() is always false) when the process cannot be opened: it
  // has already exited, `pid` <= 0, or the system has no such handles.
  static ProcessWatch Open(int64_t pid);
  ProcessWatch(ProcessWatch&& other) noexcept;
  ProcessWatch& operator=(ProcessWatch&& other) noexcept;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  ~ProcessWatch();

  bool valid() const { return handle_ != kNone; }
  // True once the watched process has exited (without waiting).
  bool Exited() const;

 private:
  static constexpr intptr_t kNone = -1;
  explicit ProcessWatch(intptr_t handle) : handle_(handle) {}
  intptr_t handle_ = kNone;  // a descriptor (POSIX) or a HANDLE (Win32)
};

// A child process started from argv (argv[0] is the program's path; no shell, no PATH search).
// Destroying a child that still runs kills it and waits for it. Move-only.
class ChildProcess {
 public:
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  int64_t pid() const { return pid_; }
  // Waits for the exit and returns the exit code (128 + the signal for a POSIX child killed by
  // one). Once waited for, the pid may be reused.
  absl::StatusOr<int> Wait();
  // Ends the child at once (SIGKILL, TerminateProcess); Wait() still reaps it.
  void Kill();

 private:
  ChildProcess(int64_t pid, intptr_t handle) : pid_(pid), handle_(handle), waited_(false) {}
  int64_t pid_ = 0;
  intptr_t handle_ = -1;  // the process HANDLE on Win32; unused on POSIX
  bool waited_ = true;    // nothing left to reap (also after a move)
};

}  // namespace expertd
