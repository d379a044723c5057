// expertd: flags → config → RunDaemon. `--version` prints the build; `--check-config` parses and
// validates the config and exits. docs/operations.md and configs/expertd.toml describe the rest.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "config.h"
#include "daemon.h"
#include "device/device_probe.h"
#include "lifecycle.h"

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and signals reach sigwait.
  expertd::BlockServiceSignals();

  CLI::App app{"expertd: streams Mixture-of-Experts weights to GPUs and host memory", "expertd"};
  std::string config_path;
  std::string socket;
  std::string log_level;
  std::string hold;
  bool demo = false;
  bool version = false;
  bool check = false;
  app.add_option("--config", config_path, "TOML config file (configs/expertd.toml documents it)");
  app.add_flag("--demo", demo, "serve a synthesized demo model (cached under demo.cache_dir)");
  app.add_option("--socket", socket, "override listen.unix_socket");
  app.add_option("--log-level", log_level, "override logging.level");
  app.add_option("--hold-before-serving", hold,
                 "stay in the starting state this long (e.g. 2s) before loading models (tests)");
  app.add_flag("--check-config", check, "validate the config and exit");
  app.add_flag("--version", version, "print the version and build features");
  CLI11_PARSE(app, argc, argv);

  const expertd::BuildFeatures features = expertd::GetBuildFeatures();
  if (version) {
    std::printf("expertd %s (cuda backend: %s, cuda runtime: %s)\n", EXPERTD_VERSION,
                features.cuda_backend ? "built" : "not built",
                features.cuda_runtime_version.c_str());
    return 0;
  }

  absl::StatusOr<expertd::DaemonConfig> config =
      config_path.empty() ? absl::StatusOr<expertd::DaemonConfig>(expertd::DefaultConfig())
                          : expertd::LoadConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "expertd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (!socket.empty()) config->listen.unix_socket = socket;
  if (!log_level.empty()) {
    // Parsed through the config grammar, so the flag accepts exactly the key's values.
    absl::StatusOr<expertd::DaemonConfig> lv = expertd::ParseConfig(
        "[logging]\nlevel = \"" + log_level + "\"\n", "--log-level");
    if (!lv.ok()) {
      std::fprintf(stderr, "expertd: %s\n", std::string(lv.status().message()).c_str());
      return 2;
    }
    config->logging.level = lv->logging.level;
  }
  expertd::DaemonFlags flags;
  flags.config_path = config_path;
  flags.demo = demo;
  flags.socket_override = socket;
  if (!log_level.empty()) flags.log_level_override = config->logging.level;
  if (!hold.empty()) {
    absl::StatusOr<std::chrono::milliseconds> d = expertd::ParseDurationText(hold);
    if (!d.ok()) {
      std::fprintf(stderr, "expertd: --hold-before-serving: %s\n",
                   std::string(d.status().message()).c_str());
      return 2;
    }
    flags.hold_before_serving = absl::FromChrono(*d);
  }
  absl::Status valid = expertd::ValidateConfig(*config);
  if (valid.ok() && !demo) valid = expertd::RequireModels(*config);
  if (!valid.ok()) {
    std::fprintf(stderr, "expertd: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  if (check) {
    std::printf("%s: ok\n%s\n", config_path.empty() ? "defaults" : config_path.c_str(),
                expertd::DescribeConfig(*config).c_str());
    return 0;
  }
  expertd::SetUpLogging(config->logging);
  spdlog::info("expertd {} (cuda backend: {}, cuda runtime: {})", EXPERTD_VERSION,
               features.cuda_backend ? "built" : "not built", features.cuda_runtime_version);
  return expertd::RunDaemon(*std::move(config), flags, expertd::Environment::FromProcess());
}
