// expertctl health [--addr A] [--service MODEL] [--token-file F] [--timeout S]
// grpc.health.v1 Check against the daemon, with grpc_health_probe's exit codes so the same
// probes (systemd, Kubernetes exec, scripts) work: 0 serving, 1 invalid arguments, 2 connection
// failure, 3 RPC failure (NOT_FOUND for a service the daemon does not know included), 4 not
// serving. Prints one line.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "daemon_args.h"
#include "model_args.h"

namespace expertd::ctl {
namespace {

constexpr int kServing = 0;
constexpr int kInvalidArguments = 1;
constexpr int kConnectionFailure = 2;
constexpr int kRpcFailure = 3;
constexpr int kNotServing = 4;

struct HealthArgs {
  DaemonArgs daemon;
  std::string service;
};

int RunHealth(const HealthArgs& a) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = ConnectDaemon(a.daemon);
  if (!c.ok()) {
    PrintError("health", c.status());
    return c.status().code() == absl::StatusCode::kInvalidArgument ? kInvalidArguments
                                                                   : kConnectionFailure;
  }
  const absl::StatusOr<bool> serving = (*c)->Health(a.service);
  if (!serving.ok()) {
    PrintError("health", serving.status());
    return kRpcFailure;
  }
  std::printf("%s\n", *serving ? "serving" : "not serving");
  return *serving ? kServing : kNotServing;
}

}  // namespace

void AddHealthCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "health",
      "Ask the daemon whether it serves (grpc.health.v1): exit 0 serving, 1 invalid arguments, "
      "2 connection failure, 3 RPC failure (unknown service included), 4 not serving");
  auto a = std::make_shared<HealthArgs>();
  a->daemon.timeout_s = 1;
  AddDaemonOptions(cmd, &a->daemon);
  cmd->add_option("--service", a->service, "A served model's name (default: the whole daemon)");
  cmd->callback([a, exit_code] { *exit_code = RunHealth(*a); });
}

}  // namespace expertd::ctl
