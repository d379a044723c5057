// The daemon object: owns, in this order, the device, the served models (catalog, packs,
// engine), the session registry, the gRPC server, the Unix listener and the metrics listener,
// and tears them down in reverse. Run() is the whole life of the process after flag parsing:
// start (listeners first, health NOT_SERVING; then models; then READY=1), serve until SIGTERM,
// drain, exit. docs/operations.md describes the lifecycle.
#pragma once

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "config.h"

namespace expertd {

struct DaemonFlags {
  std::string config_path;  // "" = defaults only
  bool demo = false;        // serve a synthesized demo model (demo.* keys)
  // Stays in the starting state this long after the listeners are up, before loading models:
  // lets tests observe health NOT_SERVING during start-up.
  absl::Duration hold_before_serving = absl::ZeroDuration();
  // Command-line overrides of the file (--socket, --log-level): applied again to the file
  // re-read at SIGHUP, so that a reload neither reports them as changed nor undoes them.
  std::string socket_override;  // "" = none
  std::optional<LoggingConfig::Level> log_level_override;
};

// Returns the process exit code: 0 after a clean stop (SIGTERM/SIGINT), 1 when start-up failed,
// 3 after a sticky device error (the service manager restarts the daemon).
int RunDaemon(DaemonConfig config, const DaemonFlags& flags, const Environment& env);

// The demo model: synthesizes `preset` into `cache_dir` unless a model made from the same preset
// is already there. Returns the GGUF path.
absl::StatusOr<std::string> PrepareDemoModel(const std::string& cache_dir,
                                             const std::string& preset);

}  // namespace expertd
