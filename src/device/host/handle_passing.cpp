// The handle socket's exchange, both ends (handle_passing.h).
#include "device/host/handle_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "device/host/host_shared_memory.h"
#include "util/status.h"

namespace expertd {
namespace {

absl::Status Errno(std::string_view call, std::string_view object) {
  return absl::UnavailableError(absl::StrCat(AV(call), "(", AV(object), "): ", std::strerror(errno)));
}

// Waits until `fd` is readable or `deadline` passed.
bool WaitReadable(int fd, absl::Time deadline) {
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

}  // namespace

PassedDescriptors::~PassedDescriptors() {
  for (int fd : fds_) ::close(fd);
}

absl::StatusOr<PassedDescriptors> FetchDescriptors(const std::string& socket_path,
                                                   std::string_view session_id,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("handle socket path '", socket_path, "'"));
  }
  const host_device_internal::NativeHandle sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int fd = static_cast<int>(sock.get());
  if (fd < 0) return Errno("socket", socket_path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Errno("connect to the handle socket", socket_path);
  }
  const std::string request = absl::StrCat(AV(kHandleRequestPrefix), AV(session_id), "\n");
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return Errno("send to the handle socket", socket_path);
  }
  if (!WaitReadable(fd, deadline)) {
    return absl::UnavailableError(absl::StrCat("the handle socket ", socket_path,
                                               " did not answer within ",
                                               absl::FormatDuration(timeout)));
  }
  char text[512];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedDescriptors)];
  iovec iov{text, sizeof text - 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) {
    return n == 0 ? absl::UnavailableError(absl::StrCat("the handle socket ", socket_path,
                                                        " closed without an answer"))
                  : Errno("recvmsg from the handle socket", socket_path);
  }
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const auto* data = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < count; ++i) {
      int v;
      std::memcpy(&v, data + i, sizeof v);
      fds.push_back(v);
    }
  }
  PassedDescriptors received(std::move(fds));
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return absl::InternalError("the handle socket sent more descriptors than a message holds");
  }
  const absl::string_view answer(text, static_cast<size_t>(n));
  const absl::string_view line = answer.substr(0, answer.find('\n'));
  if (absl::StartsWith(line, "OK ")) {
    size_t expected = 0;
    if (!absl::SimpleAtoi(line.substr(3), &expected) || expected != received.size()) {
      return absl::InternalError(absl::StrCat("the handle socket announced '", line, "' but sent ",
                                              received.size(), " descriptors"));
    }
    return received;
  }
  if (absl::StartsWith(line, "ERR ")) {
    const absl::string_view rest = line.substr(4);
    const size_t space = rest.find(' ');
    int code = 0;
    if (!absl::SimpleAtoi(rest.substr(0, space), &code) || code <= 0 || code > 16) {
      code = static_cast<int>(absl::StatusCode::kUnknown);
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("handle socket: ", space == absl::string_view::npos
                                                            ? absl::string_view()
                                                            : rest.substr(space + 1)));
  }
  return absl::InternalError(absl::StrCat("the handle socket answered '", line, "'"));
}

absl::StatusOr<std::string> ReadHandleRequest(int socket, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string got;
  char buf[kMaxHandleRequestBytes];
  while (got.find('\n') == std::string::npos) {
    if (got.size() >= kMaxHandleRequestBytes) {
      return absl::InvalidArgumentError("handle request longer than its limit");
    }
    if (!WaitReadable(socket, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("no handle request within ",
                                                      absl::FormatDuration(timeout)));
    }
    const ssize_t n = ::recv(socket, buf, sizeof buf - got.size(), MSG_DONTWAIT);
    if (n == 0) return absl::InvalidArgumentError("the peer closed before a whole request");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("recv", "a handle request");
    }
    got.append(buf, static_cast<size_t>(n));
  }
  const std::string_view line = std::string_view(got).substr(0, got.find('\n'));
  if (!line.starts_with(kHandleRequestPrefix)) {
    return absl::InvalidArgumentError("not a handle request");
  }
  return std::string(line.substr(kHandleRequestPrefix.size()));
}

absl::Status SendDescriptors(int socket, std::span<const int> fds) {
  if (fds.size() > kMaxPassedDescriptors) {
    return absl::ResourceExhaustedError(absl::StrCat(fds.size(), " descriptors to pass; at most ",
                                                     kMaxPassedDescriptors));
  }
  std::string text = absl::StrCat("OK ", fds.size(), "\n");
  iovec iov{text.data(), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(socket, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    return Errno("sendmsg", "handle answer");
  }
  return absl::OkStatus();
}

absl::Status SendRefusal(int socket, const absl::Status& why) {
  std::string text = absl::StrCat("ERR ", static_cast<int>(why.code()), " ", why.message());
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  text.resize(std::min<size_t>(text.size(), 400));
  text += "\n";
  if (::send(socket, text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) {
    return Errno("send", "handle refusal");
  }
  return absl::OkStatus();
}

}  // namespace expertd
