// Handing shared objects to a session's client as descriptors (SCM_RIGHTS) over the daemon's
// handle socket, so that objects nobody else may open need no name: a memfd reaches exactly the
// process it is sent to. Both ends use this file; docs/protocol.md ("The handle socket")
// describes the exchange:
//
//   client: connect to OpenSessionResponse.handle_socket, send "EXPD-HANDLES 1 <session id>\n"
//   daemon: checks the peer (SO_PEERCRED: the process that opened the session), answers one
//           message "OK <n>\n" carrying n descriptors, or "ERR <code> <message>\n" without any
//
// SharedMemory.passed = i (1-based) in the OpenSessionResponse names the i-th descriptor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace expertd {

inline constexpr std::string_view kHandleRequestPrefix = "EXPD-HANDLES 1 ";
inline constexpr size_t kMaxHandleRequestBytes = 256;
// SCM_MAX_FD: the kernel's limit of descriptors in one message.
inline constexpr size_t kMaxPassedDescriptors = 253;

// Descriptors received from the daemon, closed on destruction (mappings made from them stay).
class PassedDescriptors {
 public:
  PassedDescriptors() = default;
  explicit PassedDescriptors(std::vector<int> fds) : fds_(std::move(fds)) {}
  PassedDescriptors(PassedDescriptors&& other) noexcept : fds_(std::move(other.fds_)) {
    other.fds_.clear();
  }
  PassedDescriptors& operator=(PassedDescriptors&& other) noexcept {
    std::swap(fds_, other.fds_);
    return *this;
  }
  PassedDescriptors(const PassedDescriptors&) = delete;
  PassedDescriptors& operator=(const PassedDescriptors&) = delete;
  ~PassedDescriptors();

  size_t size() const { return fds_.size(); }
  // The descriptor for SharedMemory.passed = `passed` (1-based), or -1 when there is none.
  int ForPassed(uint32_t passed) const {
    return passed >= 1 && passed <= fds_.size() ? fds_[passed - 1] : -1;
  }

 private:
  std::vector<int> fds_;
};

// Client: fetches a session's descriptors from the handle socket at `socket_path`. Unavailable
// when the socket cannot be reached or the daemon does not answer within `timeout`; a refusal
// carries the daemon's code and message.
absl::StatusOr<PassedDescriptors> FetchDescriptors(const std::string& socket_path,
                                                   std::string_view session_id,
                                                   absl::Duration timeout);

// Daemon: reads a request from a connected socket within `timeout` and returns its session id
// (InvalidArgument for anything that is not a request).
absl::StatusOr<std::string> ReadHandleRequest(int socket, absl::Duration timeout);
// Daemon: answers with `fds` (at most kMaxPassedDescriptors), or with the refusal `why`.
absl::Status SendDescriptors(int socket, std::span<const int> fds);
absl::Status SendRefusal(int socket, const absl::Status& why);

}  // namespace expertd
