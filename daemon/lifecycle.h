// Process glue: the log (spdlog, text or JSON lines), the service manager (sd_notify: READY,
// STATUS, STOPPING, WATCHDOG) and signals (SIGTERM/SIGINT stop, SIGHUP reload) taken
// synchronously with sigwait so no handler runs inside library code.
#pragma once

#include <signal.h>

#include <atomic>
#include <string>
#include <string_view>
#include <thread>

#include "absl/time/time.h"
#include "config.h"

namespace expertd {

// Installs the process-wide logger (stderr) with the config's level and format.
void SetUpLogging(const LoggingConfig& logging);
void SetLogLevel(LoggingConfig::Level level);

// sd_notify wrapper: a no-op when the daemon was not started by systemd ($NOTIFY_SOCKET unset).
class ServiceManager {
 public:
  ServiceManager();
  ~ServiceManager();  // stops the watchdog thread
  void Status(std::string_view text);
  void Ready(std::string_view status);
  void Stopping(std::string_view status);
  void Reloading();
  void ReloadDone();
  // Starts pinging WATCHDOG=1 at half of WatchdogSec= when the unit sets it; `healthy` is
  // checked before every ping, so a wedged or failed daemon stops pinging and is restarted.
  void StartWatchdog(std::atomic<bool>* healthy);
  bool watchdog_enabled() const { return watchdog_interval_ > absl::ZeroDuration(); }

 private:
  void Notify(const std::string& message);
  absl::Duration watchdog_interval_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts later;
// call first thing in main.
void BlockServiceSignals();
// Waits up to `timeout` for one of them; 0 when none arrived.
int WaitForSignal(absl::Duration timeout);

}  // namespace expertd
