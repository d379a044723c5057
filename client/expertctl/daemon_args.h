// Shared by the service tools (health, stats, bench): which daemon to talk to, and connecting.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client.h"

namespace expertd::ctl {

struct DaemonArgs {
  std::string addr;        // empty: DefaultDaemonAddress()
  std::string token_file;  // TCP bearer token: the file's first line
  double timeout_s = 5;    // connect timeout
};

// Adds --addr, --token-file and --timeout (connect timeout, default `timeout_s`) to `cmd`.
void AddDaemonOptions(CLI::App* cmd, DaemonArgs* args);

// The socket a daemon started with the same environment listens on by default, as a
// "unix://PATH" address: the first of $RUNTIME_DIRECTORY/expertd.sock (systemd's
// RuntimeDirectory=; first entry), $XDG_RUNTIME_DIR/expertd/expertd.sock and
// /run/expertd/expertd.sock that exists; when none exists, the first candidate the environment
// defines (the daemon's own choice, daemon/config.h DefaultSocketPath).
std::string DefaultDaemonAddress();

// Reads the token (first line, surrounding whitespace removed); InvalidArgument when the file
// cannot be read or its first line is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Connects to args.addr (or the default). Errors: InvalidArgument for a bad token file,
// Unavailable when the daemon cannot be reached (a Unix socket path that does not exist fails at
// once instead of waiting out the timeout).
absl::StatusOr<std::unique_ptr<client::Client>> ConnectDaemon(const DaemonArgs& args);

}  // namespace expertd::ctl
