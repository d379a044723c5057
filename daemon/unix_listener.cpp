#include "unix_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status.h"

namespace expertd {
namespace {

absl::Status Errno(std::string_view what, const std::string& path) {
  const int err = errno;
  return absl::Status(err == EACCES || err == EPERM ? absl::StatusCode::kPermissionDenied
                                                    : absl::StatusCode::kFailedPrecondition,
                      absl::StrCat(AV(what), " ", path, ": ", std::strerror(err)));
}

}  // namespace

std::vector<uint32_t> PeerGroups(int fd, uint32_t primary) {
  std::vector<uint32_t> groups{primary};
  std::vector<gid_t> got(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t len = static_cast<socklen_t>(got.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, got.data(), &len) == 0) {
      groups.insert(groups.end(), got.begin(), got.begin() + len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    got.resize(len / sizeof(gid_t) + 1);  // the kernel said how many there are
  }
  return groups;
}

absl::Status CheckSocketDirectory(const std::string& dir, uid_t daemon_uid) {
  struct stat st{};
  if (lstat(dir.c_str(), &st) != 0) return Errno("stat", dir);
  const auto refuse = [&](std::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket directory ", dir, " ", AV(why), " (owner uid ", st.st_uid, ", mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        "): whoever can write there could replace the daemon's socket; use a directory of the "
        "daemon's own user (listen.unix_socket)"));
  };
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory (or is a symlink)");
  if (st.st_uid != daemon_uid && st.st_uid != 0) return refuse("belongs to another user");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return refuse("can be written by other users");
  }
  return absl::OkStatus();
}

bool PeerAllowed(uint32_t uid, const std::vector<uint32_t>& groups, uint32_t daemon_uid,
                 uint32_t daemon_gid, const UnixListenerOptions& options) {
  if (uid == daemon_uid) return true;
  // Members of the daemon's group (expertd under the unit) pass the socket's 0660 already.
  if (std::find(groups.begin(), groups.end(), daemon_gid) != groups.end()) return true;
  if (std::find(options.allowed_uids.begin(), options.allowed_uids.end(), uid) !=
      options.allowed_uids.end()) {
    return true;
  }
  for (uint32_t g : groups) {
    if (std::find(options.allowed_gids.begin(), options.allowed_gids.end(), g) !=
        options.allowed_gids.end()) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(UnixListenerOptions options,
                                                                 PeerTable* peers) {
  const std::string& path = options.path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen.unix_socket: '", path, "' must be a path of 1..", sizeof addr.sun_path - 1,
        " bytes"));
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir.parent_path(), ec);
    if (mkdir(dir.c_str(), options.directory_mode) != 0 && errno != EEXIST) {
      return Errno("cannot create the socket directory", dir.string());
    }
    // mkdir's mode passes through the umask; set it exactly.
    if (chmod(dir.c_str(), options.directory_mode) != 0) return Errno("chmod", dir.string());
  }
  if (!dir.empty()) {
    absl::Status safe = CheckSocketDirectory(dir.string(), geteuid());
    if (!safe.ok()) return safe;
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    // A daemon answering there still owns it; an unanswered socket file is stale.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      close(fd);
      return absl::AlreadyExistsError(
          absl::StrCat(path, ": another expertd is serving on this socket"));
    }
    unlink(path.c_str());
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    absl::Status err = Errno("bind", path);
    close(fd);
    return err;
  }
  // Not through a symlink put in the socket's place: that is refused (EOPNOTSUPP).
  if (fchmodat(AT_FDCWD, path.c_str(), options.socket_mode, AT_SYMLINK_NOFOLLOW) != 0 ||
      listen(fd, 128) != 0) {
    absl::Status err = Errno("chmod/listen", path);
    close(fd);
    unlink(path.c_str());
    return err;
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    absl::Status err = Errno("eventfd for", path);
    close(fd);
    unlink(path.c_str());
    return err;
  }
  return std::unique_ptr<UnixListener>(new UnixListener(std::move(options), peers, fd, wake));
}

UnixListener::UnixListener(UnixListenerOptions options, PeerTable* peers, int fd, int wake_fd)
    : options_(std::move(options)), peers_(peers), fd_(fd), wake_fd_(wake_fd) {}

UnixListener::~UnixListener() {
  Stop();
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  unlink(options_.path.c_str());
}

void UnixListener::Start(grpc::Server* server) {
  Start([this, server](int conn, const Peer& peer) {
    if (peers_ != nullptr) peers_->Put(conn, peer);
    spdlog::debug("unix listener: connection from pid {} uid {} (fd {})", peer.pid, peer.uid,
                  conn);
    grpc::AddInsecureChannelFromFd(server, conn);
  });
}

void UnixListener::Start(std::function<void(int fd, const Peer& peer)> serve) {
  thread_ = std::thread([this, serve = std::move(serve)] { AcceptLoop(serve); });
}

void UnixListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
}

void UnixListener::AcceptLoop(const std::function<void(int fd, const Peer& peer)>& serve) {
  const uint32_t daemon_uid = getuid();
  const uint32_t daemon_gid = getgid();
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("unix listener {}: poll: {}", options_.path, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      spdlog::warn("unix listener {}: accept: {}", options_.path, std::strerror(errno));
      // EMFILE and friends: back off instead of spinning.
      poll(nullptr, 0, 100);
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("unix listener: SO_PEERCRED: {}; connection refused", std::strerror(errno));
      close(conn);
      refused_.fetch_add(1);
      continue;
    }
    const std::vector<uint32_t> groups = PeerGroups(conn, cred.gid);
    if (!PeerAllowed(cred.uid, groups, daemon_uid, daemon_gid, options_)) {
      spdlog::warn(
          "unix listener: refused pid {} uid {} gid {}: not the daemon's uid or group and not "
          "in listen.allowed_uids / listen.allowed_gids",
          cred.pid, cred.uid, cred.gid);
      close(conn);
      refused_.fetch_add(1);
      continue;
    }
    Peer peer;
    peer.unix_socket = true;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    peer.pid = cred.pid;
    serve(conn, peer);
  }
}

}  // namespace expertd
