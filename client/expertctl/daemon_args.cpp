#include "daemon_args.h"

#include <sys/stat.h>

#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config.h"
#include "util/status.h"

namespace expertd::ctl {
namespace {

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The socket path of a "unix:" address, or "" for TCP.
std::string UnixPath(const std::string& target) {
  if (target.rfind("unix://", 0) == 0) return target.substr(7);
  if (target.rfind("unix:", 0) == 0) return target.substr(5);
  return {};
}

}  // namespace

void AddDaemonOptions(CLI::App* cmd, DaemonArgs* args) {
  cmd->add_option("--addr", args->addr,
                  "Daemon address: unix:///PATH or HOST:PORT (default: the daemon's default "
                  "socket, see docs/tools.md)");
  cmd->add_option("--token-file", args->token_file,
                  "File whose first line is the bearer token (TCP listener)");
  cmd->add_option("--timeout", args->timeout_s, "Connect timeout in seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

std::string DefaultDaemonAddress() {
  // The daemon's own search order (daemon/config.h), from the environment captured once here.
  const std::vector<std::string> candidates = SocketPathCandidates(Environment::FromProcess());
  for (const std::string& c : candidates) {
    if (Exists(c)) return "unix://" + c;
  }
  return "unix://" + candidates.front();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": cannot read it"));
  }
  std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, ": first line is empty"));
  }
  return token;
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectDaemon(const DaemonArgs& args) {
  client::ConnectOptions o;
  o.address = args.addr.empty() ? DefaultDaemonAddress() : args.addr;
  if (!args.token_file.empty()) {
    ASSIGN_OR_RETURN(o.token, ReadTokenFile(args.token_file));
  }
  o.connect_timeout = absl::Seconds(args.timeout_s);
  const std::string path = UnixPath(client::ChannelTarget(o.address));
  if (!path.empty() && !Exists(path)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", o.address, ": no socket at ",
                                               path, " (is expertd running?)"));
  }
  return client::Client::Connect(o);
}

}  // namespace expertd::ctl
