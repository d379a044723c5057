// The Unix-socket listener. gRPC C++ does not expose a connection's peer credentials, so the
// daemon accepts connections itself: it reads SO_PEERCRED, refuses peers whose uid and groups
// the config does not allow, and hands accepted descriptors to the gRPC server
// (grpc::AddInsecureChannelFromFd). The credentials are kept in a PeerTable under the
// descriptor number, which is also the call's peer string ("fd:N").
//
// The socket file is created with `socket_mode` inside a directory created with
// `directory_mode`. An existing directory (e.g. systemd's RuntimeDirectory) is used as it is
// when the daemon's user or root owns it and nobody else can write to it (a sticky one like
// /tmp excepted); otherwise Bind refuses, since whoever can write there could replace the
// socket. The mode is set without following symlinks. A stale socket file is replaced; a live
// one (another daemon answers) is an error. A peer's groups come from the connection itself
// (SO_PEERGROUPS), never from /proc by pid.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "service.h"

namespace grpc {
class Server;
}

namespace expertd {

struct UnixListenerOptions {
  std::string path;
  uint32_t socket_mode = 0660;
  uint32_t directory_mode = 0750;
  // Who may connect besides the daemon's own uid: uids, and gids (primary or supplementary).
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
};

// Whether a peer may connect (pure logic, unit-tested): its uid is the daemon's or listed, or
// one of its groups (primary or supplementary) is the daemon's primary group or listed.
bool PeerAllowed(uint32_t uid, const std::vector<uint32_t>& groups, uint32_t daemon_uid,
                 uint32_t daemon_gid, const UnixListenerOptions& options);

// The groups of the process at the other end of a connected Unix socket (SO_PEERGROUPS),
// `primary` first; {primary} when the kernel cannot say.
std::vector<uint32_t> PeerGroups(int fd, uint32_t primary);

// Whether an existing socket directory is safe to use (see the file comment): OK, or
// FailedPrecondition naming the directory, its owner and its mode.
absl::Status CheckSocketDirectory(const std::string& dir, uid_t daemon_uid);

class UnixListener {
 public:
  // Creates the directory and the socket and listens; accepting starts with Start(). `peers`
  // records the credentials of connections handed to gRPC (may be null for Start(serve)).
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(UnixListenerOptions options,
                                                            PeerTable* peers);
  ~UnixListener();  // stops accepting and removes the socket file

  // Accepts on a thread of its own, handing allowed connections to `server` (already started).
  void Start(grpc::Server* server);
  // The same, handing each allowed connection to `serve` (which owns and closes it) on the
  // accept thread: for short exchanges such as the handle socket's.
  void Start(std::function<void(int fd, const Peer& peer)> serve);
  void Stop();
  const std::string& path() const { return options_.path; }
  uint64_t refused() const { return refused_.load(); }

 private:
  UnixListener(UnixListenerOptions options, PeerTable* peers, int fd, int wake_fd);
  void AcceptLoop(const std::function<void(int fd, const Peer& peer)>& serve);

  const UnixListenerOptions options_;
  PeerTable* const peers_;
  int fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() wakes the accept loop
  std::thread thread_;
  std::atomic<uint64_t> refused_{0};
};

}  // namespace expertd
