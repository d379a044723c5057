// util/process.h on Windows: process ids and HANDLEs (OpenProcess with SYNCHRONIZE for the
// watch, WaitForSingleObject without waiting to see an exit), CreateProcessW for children.
#include <windows.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "util/process.h"
#include "util/status.h"
#include "util/win32_text.h"

namespace expertd {
namespace {

HANDLE H(intptr_t h) { return reinterpret_cast<HANDLE>(h); }
intptr_t I(HANDLE h) { return reinterpret_cast<intptr_t>(h); }

// One argument as CommandLineToArgvW and the C runtime split it back: quoted when it has a
// space, a tab or a quote (or is empty); backslashes doubled only before a quote.
void AppendQuoted(std::wstring& line, const std::wstring& arg) {
  if (!arg.empty() && arg.find_first_of(L" \t\"") == std::wstring::npos) {
    line += arg;
    return;
  }
  line += L'"';
  size_t backslashes = 0;
  for (const wchar_t c : arg) {
    if (c == L'\\') {
      ++backslashes;
      continue;
    }
    if (c == L'"') backslashes = backslashes * 2 + 1;
    line.append(backslashes, L'\\');
    backslashes = 0;
    line += c;
  }
  line.append(backslashes * 2, L'\\');
  line += L'"';
}

}  // namespace

int64_t CurrentProcessId() { return static_cast<int64_t>(GetCurrentProcessId()); }

bool ProcessExists(int64_t pid) {
  if (pid <= 0) return false;
  const HANDLE h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (h == nullptr) return GetLastError() != ERROR_INVALID_PARAMETER;  // no such process
  DWORD code = 0;
  const bool running = GetExitCodeProcess(h, &code) == 0 || code == STILL_ACTIVE;
  CloseHandle(h);
  return running;
}

ProcessWatch ProcessWatch::Open(int64_t pid) {
  if (pid <= 0) return ProcessWatch();
  const HANDLE h = OpenProcess(SYNCHRONIZE, FALSE, static_cast<DWORD>(pid));
  return h == nullptr ? ProcessWatch() : ProcessWatch(I(h));
}

ProcessWatch::ProcessWatch(ProcessWatch&& other) noexcept
    : handle_(std::exchange(other.handle_, kNone)) {}

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

ProcessWatch::~ProcessWatch() {
  if (valid()) CloseHandle(H(handle_));
}

bool ProcessWatch::Exited() const {
  return valid() && WaitForSingleObject(H(handle_), 0) == WAIT_OBJECT_0;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("ChildProcess::Start: no program");
  std::wstring line;
  for (const std::string& a : argv) {
    if (!line.empty()) line += L' ';
    AppendQuoted(line, win32::Wide(a));
  }
  STARTUPINFOW startup{};
  startup.cb = sizeof startup;
  PROCESS_INFORMATION info{};
  if (!CreateProcessW(win32::Wide(argv[0]).c_str(), line.data(), nullptr, nullptr, FALSE, 0,
                      nullptr, nullptr, &startup, &info)) {
    const DWORD code = GetLastError();
    return MakeError(absl::StatusCode::kUnavailable, ErrorKind::kIo,
                     absl::StrCat("cannot start ", argv[0], " (Windows error ", code, ")"));
  }
  CloseHandle(info.hThread);
  return ChildProcess(static_cast<int64_t>(info.dwProcessId), I(info.hProcess));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      handle_(std::exchange(other.handle_, -1)),
      waited_(std::exchange(other.waited_, true)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(handle_, other.handle_);
  std::swap(waited_, other.waited_);
  return *this;
}

ChildProcess::~ChildProcess() {
  if (!waited_) {
    Kill();
    (void)Wait();
  }
  if (handle_ != -1) CloseHandle(H(handle_));
}

absl::StatusOr<int> ChildProcess::Wait() {
  if (waited_) return absl::FailedPreconditionError(absl::StrCat("process ", pid_, " was reaped"));
  if (WaitForSingleObject(H(handle_), INFINITE) != WAIT_OBJECT_0) {
    return MakeError(absl::StatusCode::kInternal, ErrorKind::kIo,
                     absl::StrCat("waiting for process ", pid_, " (Windows error ",
                                  GetLastError(), ")"));
  }
  DWORD code = 0;
  GetExitCodeProcess(H(handle_), &code);
  waited_ = true;
  return static_cast<int>(code);
}

void ChildProcess::Kill() {
  if (!waited_) TerminateProcess(H(handle_), 137);
}

}  // namespace expertd
